"""A topology query's checkpoint: its offset log and the computations it admits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from millstream.engine.errors import TopologyError
from millstream.spark.checkpoint import (
    MEMBERS_FILE,
    admit_members,
    initial_offsets,
    latest_batch,
)

pytestmark = pytest.mark.unit


def log_batch(checkpoint: Path, batch: int, offsets: dict[str, dict[str, int]]) -> None:
    """Write Spark's offset log entry of ``batch``: a version, metadata, one line a source."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text(f"v1\n{{}}\n{json.dumps(offsets)}\n")


def members(checkpoint: Path) -> list[str]:
    return list(json.loads((checkpoint / MEMBERS_FILE).read_text()))


def test_the_latest_batch_is_the_highest_entry_of_the_offset_log(tmp_path: Path) -> None:
    assert latest_batch(tmp_path) is None
    for batch in (2, 10, 9):
        log_batch(tmp_path, batch, {})
    (tmp_path / "offsets" / ".10.crc").write_text("")  # Spark's checksums are no batch
    assert latest_batch(tmp_path) == 10


def test_a_query_that_never_ran_admits_any_computation(tmp_path: Path) -> None:
    admit_members(tmp_path, {"count": ["searches"], "rank": ["counts"]})
    assert members(tmp_path) == ["count", "rank"]
    assert [p.name for p in tmp_path.iterdir()] == [MEMBERS_FILE]  # no temporary left


def test_a_computation_new_to_a_query_that_read_its_input_is_refused(tmp_path: Path) -> None:
    """Its offsets would be the query's: it would miss what the query read without it."""
    admit_members(tmp_path, {"count": ["searches"]})
    log_batch(tmp_path, 0, {"searches": {"0": 40, "1": 38}})
    with pytest.raises(TopologyError, match=r"'audit' cannot join .* already read searches"):
        admit_members(tmp_path, {"count": ["searches"], "audit": ["searches"]})
    assert members(tmp_path) == ["count"]  # nothing changed


def test_members_keep_their_place_new_topics_join_and_removed_ones_leave(
    tmp_path: Path,
) -> None:
    admit_members(tmp_path, {"count": ["searches"], "rank": ["counts"]})
    log_batch(tmp_path, 0, {"searches": {"0": 40}, "counts": {"0": 12}})
    # A computation of new topics starts them at their earliest offsets, as Spark does.
    admit_members(tmp_path, {"count": ["searches"], "clicks": ["clicks"]})
    assert members(tmp_path) == ["clicks", "count"]
    # Taken out, "rank" is new again: "counts" was read without it meanwhile.
    log_batch(tmp_path, 1, {"searches": {"0": 41}, "counts": {"0": 15}, "clicks": {"0": 3}})
    with pytest.raises(TopologyError, match="'rank' cannot join"):
        admit_members(tmp_path, {"count": ["searches"], "rank": ["counts"]})


def write_initial(checkpoint: Path, source: int, offsets: dict[str, dict[str, int]]) -> None:
    """Spark's Kafka source's initial offsets: a NUL byte, a version line, the JSON."""
    (checkpoint / "sources" / str(source)).mkdir(parents=True, exist_ok=True)
    (checkpoint / "sources" / str(source) / "0").write_text(f"\0v1\n{json.dumps(offsets)}")


def test_the_first_batch_starts_where_each_source_started_the_query(tmp_path: Path) -> None:
    assert initial_offsets(tmp_path) == {}  # Spark wrote none yet
    write_initial(tmp_path, 0, {"searches": {"0": 7, "1": 0}, "wake": {"0": 3}})
    write_initial(tmp_path, 1, {"clicks": {"0": 12}})
    (tmp_path / "sources" / "2").mkdir()  # a source with no file yet
    assert initial_offsets(tmp_path) == {
        "searches": {0: 7, 1: 0},
        "wake": {0: 3},
        "clicks": {0: 12},
    }


@pytest.mark.parametrize("text", ["\0{}", "\0v1\nnot json", "\0v1\n[1, 2]"])
def test_initial_offsets_spark_wrote_otherwise_are_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_text(text)
    with pytest.raises(TopologyError, match="cannot read Spark's initial offsets"):
        initial_offsets(tmp_path)
