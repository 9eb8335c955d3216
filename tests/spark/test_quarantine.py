"""The quarantine store, the router's rejection of quarantined messages, and fault points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from millstream.connectors.stream_reader import InputMessage
from millstream.engine import fault_points
from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.deadletters import MAX_ERROR_MESSAGE_CHARS, Origin
from millstream.engine.errors import PoisonRecordError
from millstream.engine.layout import IntervalLayout
from millstream.engine.protocol import Rejected
from millstream.engine.records import Record, encode_record
from millstream.engine.routing import rejected_interval
from millstream.engine.topology import ComputationOptions, ComputationSpec, Topology
from millstream.spark.executor import message_router
from millstream.spark.isolation import OffsetRange, Position
from millstream.spark.quarantine import (
    MAX_TRACEBACK_CHARS,
    QUARANTINE_DIRECTORY,
    Quarantine,
    QuarantinedRecord,
    python_traceback,
)

pytestmark = pytest.mark.unit

SPARK_ERROR = """An exception was thrown from the Python worker.
Traceback (most recent call last):
  File "/x/worker.py", line 1, in main
    process()
  File "/x/executor.py", line 9, in _run_interval
    raise InjectedFault("boom")
millstream.engine.fault_points.InjectedFault: boom

\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:612)
\tat org.apache.spark.sql.execution.python.PythonArrowOutput.read(PythonArrowOutput.scala:118)
"""


def entry(offset: int, traceback: str = "Traceback ...\nInjectedFault: boom") -> QuarantinedRecord:
    return QuarantinedRecord(
        topic="searches",
        partition=1,
        offset=offset,
        computation="count",
        batch_id=4,
        quarantined_at=1_700_000_000_000_000,
        error="PythonException: InjectedFault: boom",
        traceback=traceback,
    )


def test_entries_are_one_file_each_and_survive_a_new_reader(tmp_path: Path) -> None:
    quarantine = Quarantine(tmp_path)
    assert quarantine.load() == {}
    quarantine.add(entry(17))
    quarantine.add(entry(18))
    files = sorted(p.name for p in (tmp_path / QUARANTINE_DIRECTORY).iterdir())
    assert files == ["searches@1@17.json", "searches@1@18.json"]  # no temporary file left
    assert json.loads((tmp_path / QUARANTINE_DIRECTORY / files[0]).read_text())["offset"] == 17
    again = Quarantine(tmp_path).load()
    assert again == {Position("searches", 1, 17): entry(17), Position("searches", 1, 18): entry(18)}


def test_a_corrupt_entry_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / QUARANTINE_DIRECTORY).mkdir()
    (tmp_path / QUARANTINE_DIRECTORY / "x.json").write_text("{not json")
    with pytest.raises(Exception, match=r"cannot read the quarantine entry .*remove it"):
        Quarantine(tmp_path).load()


def test_within_keeps_the_entries_of_a_batch_with_their_messages(tmp_path: Path) -> None:
    quarantine = Quarantine(tmp_path)
    quarantine.add(entry(17))
    quarantine.add(entry(40))
    within = quarantine.within([OffsetRange("searches", 1, 10, 40), OffsetRange("b", 1, 0, 99)])
    assert list(within) == [Position("searches", 1, 17)]
    message = within[Position("searches", 1, 17)]
    assert "searches/1@17" in message
    assert "InjectedFault: boom" in message


def test_the_message_fits_a_dead_letter_and_keeps_the_end_of_the_traceback() -> None:
    long = "Traceback (most recent call last)\n" + "frame\n" * 2_000 + "InjectedFault: boom"
    message = entry(1, traceback=long).message()
    # The dead letter keeps MAX_ERROR_MESSAGE_CHARS of it: all of it, the end included.
    assert len(message) <= MAX_ERROR_MESSAGE_CHARS
    assert len(message) > MAX_ERROR_MESSAGE_CHARS - 100  # the traceback fills the room
    assert message.endswith("InjectedFault: boom")
    assert message.startswith("message searches/1@1 made the engine")


def test_python_traceback_is_cut_out_of_the_jvm_text() -> None:
    found = python_traceback(SPARK_ERROR)
    assert found.startswith("Traceback (most recent call last):")
    assert found.endswith("millstream.engine.fault_points.InjectedFault: boom")
    assert "org.apache" not in found
    assert len(python_traceback("x" * 10_000)) == MAX_TRACEBACK_CHARS


class Count(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        raise AssertionError("not run here")


def spec() -> ComputationSpec:
    topology = Topology("t", streams=["in"])
    topology.add_computation(
        "count", Count(), inputs=["in"], options=ComputationOptions(key_intervals=4)
    )
    return topology.computations["count"]


def test_the_router_rejects_a_quarantined_message_without_decoding_it() -> None:
    good = encode_record(Record("k", b"v", 5, b"i" * 16))
    messages = [
        InputMessage("in", 0, 6, 1, None, good),
        InputMessage("in", 0, 7, 2, None, b"crashes the decoder"),
        InputMessage("in", 1, 7, 3, None, good),
    ]
    quarantine = {Position("in", 0, 7): "the engine failed: InjectedFault"}
    computation = spec()
    route = message_router(computation, quarantine=quarantine)
    routed = [route(message) for message in messages]
    assert [isinstance(item, Rejected) for _, item in routed] == [False, True, False]
    interval, rejected = routed[1]
    assert isinstance(rejected, Rejected)
    assert interval == rejected_interval(computation, IntervalLayout.initial(4))
    assert rejected.raw == b"crashes the decoder"
    assert isinstance(rejected.error, PoisonRecordError)
    assert str(rejected.error) == "the engine failed: InjectedFault"
    assert rejected.origin == Origin("in", 0, 7)
    assert rejected.timestamp == 2  # the Kafka timestamp: nothing was decoded


@pytest.fixture
def armed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The directory the module read from its environment at import, as a process started
    # with MILLSTREAM_FAULT_POINTS=tmp_path has it. Never importlib.reload the module: the
    # modules that imported its functions would keep the old ones, and cloudpickle ships
    # a function its module no longer holds by value, with this process's unset directory,
    # so that no fault armed for Spark's Python workers would fire (tests/spark/test_poison.py
    # failed so whenever this file ran before it in the same process).
    monkeypatch.setattr(fault_points, "_DIRECTORY", str(tmp_path))
    return tmp_path


def test_a_fault_point_fails_only_where_armed(armed: Path) -> None:
    fault_points.fault_point("executor.task", "count")  # nothing armed
    record_file = fault_points.arm_fault(armed, "executor.record", "count", "ab12")
    assert fault_points.armed_faults("executor.record", "count") == {"ab12"}
    assert fault_points.armed_faults("executor.record", "other") == frozenset()
    with pytest.raises(fault_points.InjectedFault, match=r"executor\.record .*ab12"):
        fault_points.fault_point("executor.record", "count", "ab12")
    fault_points.arm_fault(armed, "executor.task", "count")
    with pytest.raises(fault_points.InjectedFault):
        fault_points.fault_point("executor.task", "count")
    record_file.unlink()
    fault_points.fault_point("executor.record", "count", "ab12")
    with pytest.raises(ValueError, match="unknown fault place"):
        fault_points.arm_fault(armed, "nowhere", "count")


def test_unset_fault_points_cost_nothing() -> None:
    assert fault_points.armed_faults("executor.record", "count") == frozenset()
    fault_points.fault_point("executor.task", "count")
