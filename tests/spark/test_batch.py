"""The batch handler's spread of intervals over tasks (every task gets whole intervals, and
as many as the others), its fences, and its search for poison pills (with a stand-in for the
Spark job)."""

from __future__ import annotations

import itertools
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

from millstream.engine.clock import ManualClock
from millstream.engine.driver import BatchPlan
from millstream.engine.errors import FencedError, PoisonIsolationError, ServiceOutageError
from millstream.engine.outages import Outage
from millstream.spark.batch import (
    WORKER_POOL_VARIABLE,
    BatchHandler,
    _BatchRun,
    in_worker_pool,
    short_error,
    stopped_batch,
)
from millstream.spark.executor import IntervalSlots
from millstream.spark.isolation import MAX_ISOLATED, OffsetRange, Position
from millstream.spark.metrics import ResultRow
from millstream.spark.quarantine import QUARANTINE_DIRECTORY, Quarantine
from millstream.spark.runner import RunningTopology

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.mark.unit
def test_intervals_spread_evenly_over_tasks_or_where_an_assignment_says() -> None:
    even = IntervalSlots(2)
    assert sorted(Counter(even.task_of(i) for i in range(16)).values()) == [8, 8]
    chosen = IntervalSlots(3, {5: 2, 7: 2, 40: 0})
    assert {i: chosen.task_of(i) for i in [5, 7, 40, 1, 2, 3]} == {
        5: 2,
        7: 2,
        40: 0,
        1: 1,
        2: 2,
        3: 0,
    }


@pytest.mark.integration
def test_each_task_number_of_a_batch_is_one_spark_task(spark: SparkSession) -> None:
    # The handler's job runs on range(tasks) in as many partitions, and partition n works
    # the intervals of task n: each partition must run once, as one Spark task, and hold n.
    for tasks in (1, 2, 3, 8):
        numbers = spark.sparkContext.parallelize(range(tasks), tasks)
        placed = numbers.mapPartitionsWithIndex(
            lambda index, elements: [(index, list(elements))]
        ).collect()
        assert sorted(placed) == [(n, [n]) for n in range(tasks)]


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


class _FakeRuns:
    """Stands for the Spark job of a batch of topic ``t``: fails while it holds an
    unquarantined ``poison`` offset of partition 0 (every run when ``always``), with
    ``error``."""

    def __init__(self, poison: set[int], error: Exception, always: bool = False) -> None:
        self.poison = poison
        self.error = error
        self.always = always
        self.runs: list[tuple[list[OffsetRange] | None, set[Position]]] = []
        self.timer_watermarks: list[int] = []

    def __call__(
        self,
        run: object,
        plan: object,
        quarantine: Mapping[Position, str],
        records: Sequence[OffsetRange] | None = None,
    ) -> list[ResultRow]:
        self.runs.append((None if records is None else list(records), set(quarantine)))
        self.timer_watermarks.append(cast(Any, plan).timer_watermark)
        held = {
            offset
            for offset in self.poison
            if Position("t", 0, offset) not in quarantine
            and (records is None or any(Position("t", 0, offset) in r for r in records))
        }
        if self.always or held:
            raise self.error
        return []


def _handler(tmp_path: Path, runs: _FakeRuns, monkeypatch: pytest.MonkeyPatch) -> BatchHandler:
    """A handler with only what running and isolating a batch needs (no Spark)."""
    handler = BatchHandler.__new__(BatchHandler)
    handler.spec = cast(Any, SimpleNamespace(name="count"))
    handler.checkpoint = tmp_path
    handler.driver_id = None
    handler.attempts = 2
    handler.clock = ManualClock(1_700_000_000_000_000)
    handler.data_topics = ["t"]
    handler.quarantine = Quarantine(tmp_path)
    handler.stopping = threading.Event()
    handler.warmed = threading.Event()
    handler.warmed.set()
    monkeypatch.setattr(handler, "_run", runs)
    monkeypatch.setattr("millstream.spark.batch.time.sleep", lambda seconds: None)
    return handler


def _batch_run() -> _BatchRun:
    return _BatchRun(
        3,
        cast(Any, BatchPlan(watermark=10, timer_watermark=20, ticks=[], layout=cast(Any, None))),
        True,
        Outage("test", 1.0, sleep=lambda seconds: None, monotonic=itertools.count(0, 0.4).__next__),
        {"t": {0: 164, 1: 64}},
        {"t": {0: 100, 1: 0}},
    )


@pytest.mark.unit
def test_a_poison_record_is_isolated_quarantined_and_the_batch_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _FakeRuns({140}, RuntimeError("PythonException: InjectedFault: boom"))
    handler = _handler(tmp_path, runs, monkeypatch)
    run = _batch_run()
    rows, failures = handler._attempt(run)
    assert rows == []
    assert len(failures) == 2  # the batch's own attempts; the sub-runs are counted apart
    assert run.isolated == 1
    assert run.sub_runs == len(runs.runs) - 3 <= 2 * 7 + 3  # 128 offsets
    assert runs.runs[2] == ([], set())  # the control: no records
    assert runs.runs[-1] == (None, {Position("t", 0, 140)})  # the whole batch, quarantined
    # Only whole runs of the batch fire the timers its input made due: a sub-run firing one
    # would close a window before the records of the halves after it (found by the proving
    # ground: windows fired twice).
    assert runs.timer_watermarks[:2] == [20, 20]
    assert set(runs.timer_watermarks[2:-1]) == {10}
    assert runs.timer_watermarks[-1] == 20
    (entry,) = Quarantine(tmp_path).load().values()
    assert (entry.topic, entry.partition, entry.offset, entry.batch_id) == ("t", 0, 140, 3)
    assert "InjectedFault: boom" in entry.error
    # A later handler on the checkpoint skips the record at once.
    again = _FakeRuns({140}, RuntimeError("PythonException: InjectedFault: boom"))
    later = _handler(tmp_path, again, monkeypatch)
    later.quarantine.load()
    assert later._attempt(_batch_run()) == ([], [])
    assert again.runs == [(None, {Position("t", 0, 140)})]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (FencedError("another worker took interval 3"), FencedError),
        (RuntimeError("PythonException: millstream.engine.errors.FencedError: x"), RuntimeError),
        (
            RuntimeError("PythonException: cassandra.cluster.NoHostAvailable: down"),
            ServiceOutageError,
        ),
    ],
)
def test_fences_and_outages_are_not_searched_for_poison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, raised: type[Exception]
) -> None:
    runs = _FakeRuns({140}, error)
    handler = _handler(tmp_path, runs, monkeypatch)
    monkeypatch.setattr(handler, "attempts", 1)
    with pytest.raises(raised):
        handler._attempt(_batch_run())
    assert all(records is None for records, _ in runs.runs)
    assert not (tmp_path / QUARANTINE_DIRECTORY).exists()


@pytest.mark.unit
def test_a_batch_failing_as_its_query_stops_is_neither_retried_nor_searched_for_poison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = RuntimeError("Py4JJavaError: : java.lang.InterruptedException")
    runs = _FakeRuns(set(), error, always=True)
    handler = _handler(tmp_path, runs, monkeypatch)
    handler.stopping.set()
    with pytest.raises(RuntimeError) as failed:
        handler._attempt(_batch_run())
    assert failed.value is error
    assert [records for records, _ in runs.runs] == [None]  # one attempt, no control run


@pytest.mark.unit
def test_a_batch_waits_for_the_job_warming_its_python_workers_before_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _FakeRuns(set(), RuntimeError("unused"))
    handler = _handler(tmp_path, runs, monkeypatch)
    handler.warmed.clear()  # as the runner does while the warming job runs
    attempt = threading.Thread(target=handler._attempt, args=(_batch_run(),), daemon=True)
    attempt.start()
    attempt.join(0.3)
    assert attempt.is_alive()
    assert runs.runs == []  # no job yet: its tasks would queue behind the warming ones
    handler.warmed.set()
    attempt.join(10)
    assert not attempt.is_alive()
    assert runs.runs == [(None, set())]


@pytest.mark.unit
def test_a_job_of_the_default_python_workers_is_never_wrapped_in_another_pools() -> None:
    # Another thread's job of pool 1 is being wrapped (its variable set) as a job of pool 0
    # is: the second waits for the first, and runs in Spark's default set.
    held, release = threading.Event(), threading.Event()

    class Held(_TaskNumbers):
        @property
        def _jrdd(self) -> None:
            self.wrapped_in.append(dict(self.context.environment))
            held.set()
            release.wait(10)

    first, second = Held(), _TaskNumbers()
    second.context = first.context  # one SparkContext
    pool_one = threading.Thread(target=in_worker_pool, args=(first, 1), daemon=True)
    pool_one.start()
    assert held.wait(10)
    default = threading.Thread(target=in_worker_pool, args=(second, 0), daemon=True)
    default.start()
    default.join(0.2)
    assert default.is_alive()  # waits for the lock
    release.set()
    for thread in (pool_one, default):
        thread.join(10)
        assert not thread.is_alive()
    assert first.wrapped_in == [{WORKER_POOL_VARIABLE: "1"}]
    assert second.wrapped_in == [{}]
    assert first.context.environment == {}


# Spark's StreamExecution.PROXY_ERROR: how it tells a Python function's error for the Py4J
# error of a call its query's stop interrupted.
_SPARK_PROXY_ERROR = re.compile(
    r"py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)"
    r"(java.lang.InterruptedException|java.io.InterruptedIOException|"
    r"java.nio.channels.ClosedByInterruptException)"
)


@pytest.mark.unit
def test_a_batch_its_query_stopped_tells_spark_what_stopped_it_without_the_jvm_stack() -> None:
    py4j_error = type("Py4JJavaError", (Exception,), {"__module__": "py4j.protocol"})
    interrupted = py4j_error(
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe"
        ".\n: java.lang.InterruptedException\n"
        + "\tat java.base/java.lang.Object.wait(Native Method)\n"
        * 2_000
    )
    error = stopped_batch("count", 7, interrupted)
    assert str(error) == (
        "batch 7 of 'count' was cut short by the stop of its query: py4j.protocol."
        "Py4JJavaError: An error occurred while calling z:org.apache.spark.api.python.PythonRDD"
        ".collectAndServe.\n: java.lang.InterruptedException"
    )
    assert _SPARK_PROXY_ERROR.search(str(error)) is not None
    # A cancelled job's error keeps the line naming the query's run, which Spark looks for.
    cancelled = stopped_batch(
        "count",
        7,
        py4j_error(
            "An error occurred while calling o1.collect.\n: org.apache.spark.SparkException: "
            "[SPARK_JOB_CANCELLED] Job 0 cancelled Query q [id = a, runId = b] was stopped\n"
            "\tat org.apache.spark.scheduler.DAGScheduler.run(DAGScheduler.scala:1)"
        ),
    )
    assert str(cancelled).endswith(
        ": org.apache.spark.SparkException: [SPARK_JOB_CANCELLED] Job 0 cancelled Query q "
        "[id = a, runId = b] was stopped"
    )
    # Whatever the error, Spark's expression recurses over at most a few hundred characters.
    assert len(str(stopped_batch("count", 7, RuntimeError("x" * 10_000)))) < 600


@pytest.mark.unit
def test_a_batch_that_fails_without_its_records_fails_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = RuntimeError("PythonException: InjectedFault: every task")
    runs = _FakeRuns(set(), error, always=True)
    run = _batch_run()
    with pytest.raises(RuntimeError) as failed:
        _handler(tmp_path, runs, monkeypatch)._attempt(run)
    assert failed.value is error
    assert [records for records, _ in runs.runs] == [None, None, [], []]  # 2 tries, 2 controls
    assert not (tmp_path / QUARANTINE_DIRECTORY).exists()


@pytest.mark.unit
def test_more_records_failing_alone_than_a_batch_isolates_is_no_poison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _FakeRuns(set(range(100, 100 + MAX_ISOLATED + 1)), RuntimeError("KeyError: x"))
    with pytest.raises(PoisonIsolationError, match=f"more than {MAX_ISOLATED} of its 128"):
        _handler(tmp_path, runs, monkeypatch)._attempt(_batch_run())
    assert not (tmp_path / QUARANTINE_DIRECTORY).exists()


class _Computation:
    """A stand-in for a computation's batch handler in a topology's query."""

    def __init__(self, name: str, meet: threading.Barrier, error: Exception | None) -> None:
        self.spec = SimpleNamespace(name=name)
        self.spark = None  # the session whose job properties a thread takes
        self.meet = meet
        self.error = error
        self.ran: list[int] = []
        self.shared_job: Any = None  # the batch's job, which it leaves as a handler does

    def leave_shared_job(self) -> None:
        BatchHandler.leave_shared_job(cast("BatchHandler", self))

    def __call__(self, batch: object, batch_id: int) -> None:
        self.meet.wait()  # passes only if every handler runs at once
        self.ran.append(batch_id)
        if self.error is not None:
            raise self.error


@pytest.mark.unit
def test_a_topology_batch_runs_every_computation_at_once_and_fails_with_the_first_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import pyspark

    from millstream.spark.batch import TopologyBatch

    # Without a Spark job to cancel, the threads need no job properties of the batch's.
    monkeypatch.setattr(pyspark, "inheritable_thread_target", lambda session: lambda target: target)
    meet = threading.Barrier(3, timeout=10)
    first = ValueError("count failed")
    handlers = [
        _Computation("count", meet, first),
        _Computation("rank", meet, None),
        _Computation("alert", meet, KeyError("alert failed")),
    ]
    batch = TopologyBatch(cast("list[BatchHandler]", handlers))
    with pytest.raises(ValueError, match="count failed") as failed:
        batch(cast("Any", None), 7)
    assert failed.value is first  # the first computation's, once every one had finished
    assert [handler.ran for handler in handlers] == [[7], [7], [7]]
    assert "computation 'alert' batch 7 failed too: KeyError" in caplog.text
    ok = [_Computation("count", threading.Barrier(1), None)]
    TopologyBatch(cast("list[BatchHandler]", ok))(cast("Any", None), 8)
    assert ok[0].ran == [8]


class _Task:
    """A stand-in for a computation's :class:`~millstream.spark.executor.BatchTask`: a
    computation that reads and writes no stream, on a batch of no offsets."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.spec = SimpleNamespace(inputs=(), produced_streams=())
        self.batch = SimpleNamespace(ranges=())

    def start(self, index: int, upstream: Set[str] = frozenset()) -> Any:
        assert not upstream  # it writes nothing
        return lambda: list(self.run(index))


class _TaskNumbers:
    """A stand-in for the RDD of a job's task numbers: runs each partition in turn."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.jobs: list[int] = []  # each job's width
        self.fail = fail
        self.context = SimpleNamespace(environment={})
        self.wrapped_in: list[dict[str, str]] = []  # the environment each wrap saw

    @property
    def _jrdd(self) -> None:
        self.wrapped_in.append(dict(self.context.environment))

    def __call__(self, width: int) -> _TaskNumbers:
        self.width = width
        return self

    def mapPartitionsWithIndex(self, function: Any) -> _TaskNumbers:  # noqa: N802  (Spark's)
        self.function = function
        return self

    def collect(self) -> list[Any]:
        self.jobs.append(self.width)
        if self.fail is not None:
            raise self.fail
        return [row for n in range(self.width) for row in self.function(n, iter([n]))]


def _parts_of(
    job: Any, parts: Mapping[str, tuple[int, Any]]
) -> tuple[dict[str, Any], list[threading.Thread]]:
    """Submit each of ``parts`` (name: tasks, function) to ``job`` on a thread of its own
    and run the job: what each submission returned or raised."""
    outcomes: dict[str, Any] = {}

    def submit(name: str, tasks: int, function: Any) -> None:
        try:
            outcomes[name] = job.submit(name, tasks, function)
        except Exception as exc:
            outcomes[name] = exc

    threads = [
        threading.Thread(target=submit, args=(name, tasks, function))
        for name, (tasks, function) in parts.items()
    ]
    for thread in threads:
        thread.start()
    return outcomes, threads


@pytest.mark.unit
def test_a_topology_job_runs_every_part_in_one_job_and_a_raising_part_fails_alone() -> None:
    from millstream.spark.batch import TopologyJob, TopologyPartError

    def rows(name: str) -> Any:
        return _Task(lambda n: [{"computation": name, "task": n}])

    def breaks(n: int) -> Any:
        if n == 1:
            raise ValueError("alert broke in task 1")
        return [{"computation": "alert", "task": n}]

    job = TopologyJob(["count", "rank", "alert", "idle"])
    outcomes, threads = _parts_of(
        job, {"count": (2, rows("count")), "rank": (1, rows("rank")), "alert": (2, _Task(breaks))}
    )
    job.leave("idle")  # nothing to run in this batch
    numbers = _TaskNumbers()
    job.run(cast(Any, numbers))
    for thread in threads:
        thread.join(timeout=10)
    assert numbers.jobs == [2]  # one job, as wide as the widest part
    assert numbers.wrapped_in == [{}]  # in Spark's default Python workers
    assert outcomes["count"] == [{"computation": "count", "task": n} for n in (0, 1)]
    assert outcomes["rank"] == [{"computation": "rank", "task": 0}]
    failed = outcomes["alert"]
    assert isinstance(failed, TopologyPartError)
    assert "'alert'" in str(failed)
    assert "task 1" in str(failed)
    assert short_error(failed) == "TopologyPartError: ValueError: alert broke in task 1"
    with pytest.raises(RuntimeError, match="no party to this job"):
        job.submit("idle", 1, rows("idle"))


@pytest.mark.unit
def test_a_topology_job_failing_whole_fails_every_part_and_waits_for_every_computation() -> None:
    from millstream.spark.batch import TopologyJob

    job = TopologyJob(["count", "rank"])
    outcomes, threads = _parts_of(job, {"count": (2, _Task(lambda n: []))})
    lost = RuntimeError("Python worker exited unexpectedly (crashed)")
    numbers = _TaskNumbers(fail=lost)
    runner = threading.Thread(target=job.run, args=(numbers,))
    runner.start()
    runner.join(timeout=0.5)
    assert runner.is_alive()  # 'rank' has neither submitted nor left
    assert numbers.jobs == []
    job.leave("rank")
    runner.join(timeout=10)
    for thread in threads:
        thread.join(timeout=10)
    assert numbers.jobs == [2]
    assert outcomes["count"] is lost
    nobody = TopologyJob(["count"])
    nobody.leave("count")
    nobody.run(cast(Any, numbers))  # no part: no job
    assert numbers.jobs == [2]


class CancelledOnce:
    """A warm-up's thread whose job is submitted only after the first cancel of its group
    (the stop came between the thread's start and the submission): it ends when a cancel
    finds the job, or else after the whole job, ``seconds`` later."""

    def __init__(self, seconds: float) -> None:
        self.cancels = 0
        self.cancelled = threading.Event()
        self.thread = threading.Thread(target=lambda: self.cancelled.wait(seconds))

    def cancelJobGroup(self, group: str) -> None:  # noqa: N802  (SparkContext's name)
        self.cancels += 1
        if self.cancels > 1:  # the job is running by now
            self.cancelled.set()


@pytest.mark.unit
def test_a_stop_cancels_a_warm_up_until_it_has_ended() -> None:
    warm = CancelledOnce(seconds=20)
    warm.thread.start()
    stopped: list[bool] = []
    topology = SimpleNamespace(
        _lock=threading.Lock(),
        _stopping={"c": threading.Event()},
        _warming={"c": (warm.thread, "millstream-warm-x")},
        spark=SimpleNamespace(sparkContext=warm),
    )
    query = SimpleNamespace(stop=lambda: stopped.append(True))
    RunningTopology._stop_query(cast(Any, topology), "c", cast(Any, query))
    assert not warm.thread.is_alive()
    assert warm.cancelled.is_set()  # ended by a cancel, not after its whole job
    assert stopped == [True]
