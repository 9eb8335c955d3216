"""The batch handler's shuffle: every task gets whole intervals, and as many as the others."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from millstream.spark.batch import short_error
from millstream.spark.executor import (
    IntervalSlots,
    partition_representatives,
    spark_int_hash,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.mark.unit
@pytest.mark.parametrize("partitions", [1, 2, 3, 8, 64])
def test_each_partition_has_a_representative(partitions: int) -> None:
    found = partition_representatives(partitions)
    assert [spark_int_hash(v) % partitions for v in found] == list(range(partitions))


@pytest.mark.integration
def test_the_hash_is_sparks_and_intervals_spread_evenly(spark: SparkSession) -> None:
    from pyspark.sql import functions as F  # noqa: N812  (pyspark's convention)

    values = spark.range(-500, 500).select(F.col("id").cast("int").alias("v"))
    hashes = {r["v"]: r["h"] for r in values.select("v", F.hash("v").alias("h")).collect()}
    assert hashes == {v: spark_int_hash(v) for v in range(-500, 500)}

    # 16 intervals over 2 tasks, as the handler partitions them: 8 and 8, whole.
    even = IntervalSlots(2)
    placed = _placed(spark, 2, [(i % 16, even.slot(i % 16)) for i in range(160)])
    assert len(placed) == 16  # every interval in one task
    assert sorted(Counter(placed.values()).values()) == [8, 8]
    assert placed == {i: even.task_of(i) for i in range(16)}

    # An assignment by load (rebalancing): the named intervals go where it says.
    chosen = IntervalSlots(3, {5: 2, 7: 2, 40: 0})
    intervals = [5, 7, 40, 1, 2, 3]
    placed = _placed(spark, 3, [(i, chosen.slot(i)) for i in intervals for _ in range(5)])
    assert placed == {5: 2, 7: 2, 40: 0, 1: 1, 2: 2, 3: 0}


def _placed(spark: SparkSession, tasks: int, rows: list[tuple[int, int]]) -> dict[int, int]:
    """Each interval's task once ``rows`` (interval, slot) are repartitioned by the slot."""
    from pyspark.sql import functions as F  # noqa: N812  (pyspark's convention)

    found = (
        spark.createDataFrame(rows, "interval int, slot int")
        .repartition(tasks, "slot")
        .select("interval", F.spark_partition_id().alias("task"))
        .distinct()
        .collect()
    )
    placed: dict[int, int] = {}
    for row in found:
        assert row["interval"] not in placed, "an interval was split over tasks"
        placed[row["interval"]] = row["task"]
    return placed


@pytest.mark.unit
def test_a_failed_attempt_is_described_by_its_python_error_not_a_stack_frame() -> None:
    wrapped = Exception(
        "An error occurred while calling o123.collect.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure\n"
        "\tat org.apache.spark.sql.execution.QueryExecution$.withInternalError(QE.scala:903)\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/worker.py", line 1, in main\n'
        "millstream.engine.errors.FencedError: interval 3 was acquired by another worker\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PR.scala:1)\n"
    )
    assert short_error(wrapped) == (
        "Exception: millstream.engine.errors.FencedError: interval 3 was acquired by another worker"
    )
    internal = Exception(
        ": org.apache.spark.SparkException: [INTERNAL_ERROR] broken\n"
        "\tat org.apache.spark.sql.execution.QueryExecution$.withInternalError(QE.scala:903)"
    )
    assert "[INTERNAL_ERROR] broken" in short_error(internal)


@pytest.mark.unit
def test_a_driver_whose_checkpoint_another_driver_ran_past_is_fenced(tmp_path: Path) -> None:
    """Found by the proving ground: a driver continued after a long SIGSTOP retried its batch
    (taking the intervals' sequencers back from its successor) and published a stale
    watermark report, which on the compacted topic can outlive the newer one."""
    from millstream.engine.errors import FencedError
    from millstream.spark.checkpoint import fence_checkpoint

    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch in (33, 34):
        (tmp_path / "offsets" / str(batch)).write_text("v1\n{}\n{}\n")
    (tmp_path / "commits" / "33").write_text("v1\n{}\n")
    fence_checkpoint(tmp_path, 34, "tally")  # running the latest batch: its own
    (tmp_path / "commits" / "34").write_text("v1\n{}\n")  # the successor committed it
    with pytest.raises(FencedError, match="moved past batch 34"):
        fence_checkpoint(tmp_path, 34, "tally")
    (tmp_path / "commits" / "34").unlink()
    (tmp_path / "offsets" / "35").write_text("v1\n{}\n{}\n")  # ... or planned the next
    with pytest.raises(FencedError, match="zombie"):
        fence_checkpoint(tmp_path, 34, "tally")


@pytest.mark.unit
def test_a_driver_whose_checkpoint_another_driver_claimed_is_fenced_at_its_next_batch(
    tmp_path: Path,
) -> None:
    from millstream.engine.errors import FencedError
    from millstream.spark.checkpoint import (
        checkpoint_holder,
        claim_checkpoint,
        fence_checkpoint,
    )

    checkpoint = tmp_path / "tally"
    assert checkpoint_holder(checkpoint) is None
    claim_checkpoint(checkpoint, "host:1:old")
    fence_checkpoint(checkpoint, 0, "tally", "host:1:old")  # its own
    claim_checkpoint(checkpoint, "host:2:new")  # a successor started the query
    assert checkpoint_holder(checkpoint) == "host:2:new"
    assert [p.name for p in checkpoint.iterdir()] == ["millstream-driver"]  # no temporary left
    with pytest.raises(FencedError, match=r"driver host:2:new took over computation 'tally'"):
        fence_checkpoint(checkpoint, 0, "tally", "host:1:old")
    fence_checkpoint(checkpoint, 0, "tally", "host:2:new")


@pytest.mark.unit
def test_a_lost_checkpoint_race_is_told_from_other_query_failures() -> None:
    from millstream.spark.checkpoint import lost_checkpoint_race

    spark = (
        "[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. Multiple streaming jobs "
        "detected for 9."
    )
    assert lost_checkpoint_race(spark)
    assert lost_checkpoint_race(
        "millstream.engine.errors.FencedError: another driver runs computation 'c': its "
        "checkpoint /x has moved past batch 8, which this driver was running"
    )
    assert lost_checkpoint_race("FencedError: driver h:1:a took over computation 'c' (its")
    assert not lost_checkpoint_race("FencedError: a newer sequencer holds interval 3")
    assert not lost_checkpoint_race("java.io.IOException: No space left on device")
