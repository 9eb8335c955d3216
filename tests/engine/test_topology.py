from collections.abc import Callable

import pytest

from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.errors import TopologyError
from millstream.engine.keys import MAX_KEY_INTERVALS
from millstream.engine.records import Deletion, Record
from millstream.engine.topology import (
    DEFAULT_KEY_INTERVALS,
    ComputationOptions,
    Topology,
    record_key,
)

pytestmark = pytest.mark.unit

NOOP = Computation()


def by_value(record: Record) -> str:
    return record.value.decode()


def test_a_topology_declares_streams_extractors_and_outputs() -> None:
    topology = Topology("zeitgeist", streams=["searches"])
    counter = topology.add_computation(
        "counter", NOOP, inputs={"searches": by_value}, outputs=["counts"]
    )
    detector = topology.add_computation(
        "detector", NOOP, inputs=["counts", "searches"], outputs=["anomalies"]
    )
    topology.validate()

    assert counter.key_extractor("searches") is by_value
    assert detector.key_extractor("searches") is record_key
    assert counter.dead_letter_stream == "counter.dead-letters"
    assert topology.streams() == {
        "searches",
        "counts",
        "anomalies",
        "counter.dead-letters",
        "detector.dead-letters",
    }
    assert [c.name for c in topology.consumers("searches")] == ["counter", "detector"]
    assert [c.name for c in topology.producers("counts")] == ["counter"]
    assert counter.writes("counts")
    assert not counter.writes("counter.dead-letters")
    with pytest.raises(TopologyError, match="does not read"):
        counter.key_extractor("anomalies")


def test_cycles_and_self_loops_are_allowed() -> None:
    topology = Topology(streams=["in"])
    topology.add_computation("a", NOOP, inputs=["in", "b-out"], outputs=["a-out"])
    topology.add_computation("b", NOOP, inputs=["a-out", "b-out"], outputs=["b-out"])
    topology.validate()


def test_reading_a_stream_nothing_feeds_is_reported() -> None:
    topology = Topology()
    topology.add_computation("a", NOOP, inputs=["nowhere"])
    with pytest.raises(TopologyError, match="'a' reads unknown stream 'nowhere'"):
        topology.validate()


def test_removing_a_producer_leaves_its_consumers_dangling() -> None:
    topology = Topology(streams=["in"])
    topology.add_computation("up", NOOP, inputs=["in"], outputs=["mid"])
    topology.add_computation("down", NOOP, inputs=["mid"])
    topology.validate()
    assert topology.remove_computation("up").name == "up"
    with pytest.raises(TopologyError, match="unknown stream 'mid'"):
        topology.validate()
    topology.add_stream("mid")
    topology.validate()
    with pytest.raises(TopologyError, match="no computation"):
        topology.remove_computation("up")


@pytest.mark.parametrize(
    ("name", "inputs", "outputs"),
    [
        ("has space", ["in"], []),
        ("", ["in"], []),
        ("ok", ["bad/name"], []),
        ("ok", ["in", "in"], []),
        ("ok", ["in"], ["out", "out"]),
        ("ok", "in", []),
        ("ok", ["in"], ["ok.dead-letters"]),
    ],
)
def test_bad_declarations_are_refused(name: str, inputs: list[str], outputs: list[str]) -> None:
    with pytest.raises(TopologyError):
        Topology(streams=["in"]).add_computation(name, NOOP, inputs=inputs, outputs=outputs)


def test_duplicate_names_and_non_computations_are_refused() -> None:
    topology = Topology(streams=["in"])
    topology.add_computation("a", NOOP, inputs=["in"])
    with pytest.raises(TopologyError, match="already"):
        topology.add_computation("a", NOOP, inputs=["in"])
    with pytest.raises(TopologyError, match="Computation instance"):
        topology.add_computation("b", object(), inputs=["in"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        {"key_intervals": 0},
        {"retry_window": 0},
        {"late_injector_slack": -1},
        {"weak_production_delay": -1.0},
        {"max_timer_firings_per_key": 0},
        {"dead_letter_stream": "bad name"},
        {"tombstones": "ignore"},
    ],
)
def test_options_are_validated(options: dict[str, object]) -> None:
    with pytest.raises(TopologyError):
        ComputationOptions(**options)  # type: ignore[arg-type]


def test_key_intervals_default_to_one_per_core_of_the_job() -> None:
    default = ComputationOptions()
    assert default.key_intervals is None
    assert default.starting_intervals(2) == 2
    assert default.starting_intervals(12) == 12
    assert default.starting_intervals(MAX_KEY_INTERVALS + 1) == MAX_KEY_INTERVALS
    # No job says how many cores it has (the test harness, tools).
    assert default.starting_intervals() == DEFAULT_KEY_INTERVALS
    # A number the options name is kept whatever the cores.
    assert ComputationOptions(key_intervals=8).starting_intervals(2) == 8
    assert ComputationOptions(key_intervals=8).starting_intervals() == 8


def test_dedup_ttl_is_the_retry_window_plus_the_slack() -> None:
    assert ComputationOptions(retry_window=10, late_injector_slack=5).dedup_ttl == 15


def test_a_named_dead_letter_stream_is_used() -> None:
    topology = Topology(streams=["in"])
    spec = topology.add_computation(
        "a", NOOP, inputs=["in"], options=ComputationOptions(dead_letter_stream="errors")
    )
    assert spec.dead_letter_stream == "errors"


def test_the_bloom_options_are_deprecated() -> None:
    with pytest.warns(DeprecationWarning, match="ignored"):
        ComputationOptions(bloom_expected_ids=10)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (lambda: ComputationOptions(watermark_percentile=100.0), r"in \(0, 100\)"),
        (lambda: ComputationOptions(watermark_percentile=0.0), r"in \(0, 100\)"),
        (lambda: ComputationOptions(process_late=False), "name a late_stream"),
        (lambda: ComputationOptions(late_stream="bad name"), "late stream"),
    ],
)
def test_percentile_and_late_options_are_checked(
    options: Callable[[], ComputationOptions], error: str
) -> None:
    with pytest.raises(TopologyError, match=error):
        options()


def test_a_late_stream_is_written_like_an_output_and_cannot_be_another_stream() -> None:
    topology = Topology("t", streams=["in"])
    late = ComputationOptions(late_stream="in.late")
    spec = topology.add_computation("c", NOOP, inputs=["in"], outputs=["out"], options=late)
    assert spec.produced_streams == ("out", "c.dead-letters", "in.late")
    assert "in.late" in topology.streams()
    # Its consumers wait for the computation's report, as for an output.
    assert topology.producers("in.late") == [spec]
    for clash in ("out", "in"):
        with pytest.raises(TopologyError, match="late stream"):
            topology.add_computation(
                "d",
                NOOP,
                inputs=["in"],
                outputs=["out"],
                options=ComputationOptions(late_stream=clash),
            )


def test_taking_tombstones_needs_a_process_deletion() -> None:
    topology = Topology(streams=["in"])
    deliver = ComputationOptions(tombstones="deliver")
    with pytest.raises(TopologyError, match="does not override process_deletion"):
        topology.add_computation("a", NOOP, inputs=["in"], options=deliver)

    class Deleting(Computation):
        def process_deletion(self, ctx: Context, deletion: Deletion) -> None:
            ctx.clear_state()

    spec = topology.add_computation("a", Deleting(), inputs=["in"], options=deliver)
    assert spec.options.tombstones == "deliver"
    assert ComputationOptions().tombstones == "dead-letter"
