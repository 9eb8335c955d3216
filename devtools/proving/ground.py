"""The proving ground: run the workload on the local stack under a seeded fault schedule,
then check that nothing was lost or duplicated (``millstream prove``).

One run, step by step:

1. a run directory, streams and keyspace of its own, and a watermark topic of its own (so
   the checker reads every report of this run and nothing else);
2. the injector and the driver start as processes of their own
   (:mod:`~millstream.devtools.proving.processes`), each in its own process group;
3. the schedule, drawn from the seed, applies its faults one after the other, by pid, never
   by name. Input is let through in steps (the source's *gate*), one step per fault, so that
   every fault meets a pipeline with work in hand. A fault waits until the pipeline ran a
   batch again before the next one starts;
4. once every fault is applied, the rest of the input goes out; the driver exits by itself
   when every input watermark reached the end of time and everything was processed;
5. the checks (:mod:`~millstream.devtools.proving.checks`) run on what the services hold.

The faults (:data:`~millstream.devtools.proving.faults.FAULTS`, drawn by
:func:`~millstream.devtools.proving.faults.schedule`): the driver killed (``kill -9`` of its
process group: the Python driver, its JVM and the Spark Python workers) at three moments the
engine names as pause points (:mod:`millstream.engine.pause_points`), a Python worker killed
while it holds an interval's lease, the driver stopped (``SIGSTOP``) with a lease in hand
while a second driver takes over (the first is then continued, a zombie whose writes must be
fenced), the Kafka broker and the Cassandra node killed and restarted, and the injector
killed and restarted. And on the transactional path of strong productions
(``TRANSACTION_FAULTS``): the driver or the worker killed with productions in an open Kafka
transaction, the driver killed after one committed, before the pending rows are deleted.

A run's processes are started and killed as process groups
(:mod:`~millstream.devtools.proving.process_groups`); its result is a
:class:`~millstream.devtools.proving.report.GroundReport`.

A process that exits when no fault meant it to (a driver whose query failed while Kafka was
down, say) is restarted and reported as an *unplanned exit*.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from millstream.connectors import cassandra as cassandra_connector
from millstream.connectors import kafka as kafka_connector
from millstream.connectors.kafka.hanging import SWEEP_SECONDS
from millstream.connectors.kafka.stalls import stable_offsets
from millstream.connectors.provisioning import provision
from millstream.devtools.local.hanging_transactions import write_hanging_transaction
from millstream.devtools.local.process import log_tail
from millstream.devtools.proving.checks import (
    FENCED_WRITE,
    CheckResult,
    NonVacuity,
    check_run,
    injector_outage_waits,
)
from millstream.devtools.proving.faults import (
    CRASHES,
    FAULTS,
    INPUT_FAULTS,
    PAUSES,
    RESOURCE_FAULTS,
    SPLIT_HOT_SHARE,
    SPLITS,
    TIERS,
    TRANSACTION_FAULTS,
    WORKER_KILLS,
    Fault,
    Tier,
    pause_point,
    run_kinds,
    schedule,
)
from millstream.devtools.proving.process_groups import Role, dump_stacks, wait_pid_gone
from millstream.devtools.proving.processes import (
    GATE_FILE,
    HOLD_LAYOUT,
    RunDescription,
    read_batches,
)
from millstream.devtools.proving.report import FaultOutcome, GroundReport, Unplanned
from millstream.devtools.proving.workload import (
    ExpectedOutcome,
    Workload,
    expected_outcome,
    rebalance_policy,
)
from millstream.engine import fault_points
from millstream.engine.clock import SystemClock
from millstream.engine.config import MillstreamConfig
from millstream.engine.errors import MillstreamError
from millstream.engine.outages import Outage
from millstream.engine.pause_points import ENVIRONMENT_VARIABLE
from millstream.engine.rebalance import FINISHED_ELSEWHERE
from millstream.engine.records import injector_record_id
from millstream.engine.stores.cassandra import CassandraIntervalStore, execute_schema_change

__all__ = [
    "CHECKPOINT_DISK",
    "CRASHES",
    "FAULTS",
    "INPUT_FAULTS",
    "OUTAGE_SECONDS",
    "POISON_FILE",
    "RESOURCE_FAULTS",
    "SPLIT_HOT_SHARE",
    "STORE_PROBES_FILE",
    "TIERS",
    "TRANSACTION_FAULTS",
    "Fault",
    "FaultOutcome",
    "GroundReport",
    "Tier",
    "Unplanned",
    "discard",
    "dump_stacks",
    "prove",
    "query_mode",
    "read_store_probes",
    "recheck",
    "run_config",
    "run_kinds",
    "schedule",
]

# Tombstones the poison fault sends besides its poisoned record.
_TOMBSTONES: Final = 3
# What the poison fault sent, for the checks (the run directory's).
POISON_FILE: Final = "poison.json"
# The cassandra faults' durability probes, a JSON object per line (read_store_probes).
STORE_PROBES_FILE: Final = "store-probes.jsonl"
# The checkpoint disk of a run with the disk-full fault: small, so that filling it is quick.
CHECKPOINT_DISK: Final = "256m"

OUTAGE_SECONDS: Final = 60.0


# The Cassandra driver's default request timeout (Session.default_timeout), which the store
# keeps: after it, a request to a stopped node is an unknown outcome.
_CLIENT_TIMEOUT: Final = 10.0


class _StoreProbe:
    """LWTs on a row of the run's keyspace, counted as acknowledged, then read back after a
    crash of the node: every acknowledged one must have survived (``store_probes``)."""

    def __init__(self, config: MillstreamConfig, keyspace: str) -> None:
        self.config, self.keyspace = config, keyspace
        self.acknowledged = 0

    def acknowledge(self, seconds: float) -> None:
        cluster, session = cassandra_connector.connect(self.config, self.keyspace)
        try:
            execute_schema_change(
                session, "CREATE TABLE IF NOT EXISTS store_probe (name text PRIMARY KEY, value int)"
            )
            session.execute("INSERT INTO store_probe (name, value) VALUES ('writes', 0)")
            step = session.prepare(
                "UPDATE store_probe SET value = ? WHERE name = 'writes' IF value = ?"
            )
            step.consistency_level = ConsistencyLevel.QUORUM  # as the store commits
            deadline = time.monotonic() + seconds
            value = 0
            while time.monotonic() < deadline:
                if not session.execute(step, (value + 1, value)).one()[0]:
                    raise MillstreamError("the proving ground's probe row changed under it")
                value += 1
            self.acknowledged = value
        finally:
            cluster.shutdown()

    def verify(self, seconds: float = 60.0) -> int:
        """The probe's value now (the node is back)."""
        # A node just restarted answers on its port before it completes a session's
        # handshake in time (the driver's 5 s): in a CI run the first connection timed out
        # while the node was busy catching up. It gets as long as the read below.
        cluster, session = Outage("the store probe's read", timeout=seconds).retry(
            lambda: cassandra_connector.connect(self.config, self.keyspace)
        )
        try:
            read = SimpleStatement(
                "SELECT value FROM store_probe WHERE name = 'writes'",
                consistency_level=ConsistencyLevel.SERIAL,  # as the store reads its sequencer
            )
            row = session.execute(read, timeout=seconds).one()
            return 0 if row is None else int(row[0])
        finally:
            cluster.shutdown()


class _Run:
    def __init__(
        self,
        config: MillstreamConfig,
        description: RunDescription,
        directory: Path,
        services: Any,
        progress: Callable[[str], None],
        environment: Mapping[str, str],
    ) -> None:
        self.config = config
        self.description = description
        self.directory = directory
        self.services = services
        self.progress = progress
        self.pauses = directory / "pauses"
        self.pauses.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **environment}
        env["MILLSTREAM_KAFKA_WATERMARK_TOPIC"] = config.kafka_watermark_topic
        env[ENVIRONMENT_VARIABLE] = str(self.pauses)
        self.faults = directory / "faults"
        env[fault_points.ENVIRONMENT_VARIABLE] = str(self.faults)
        # Temporary files in the run's directory, gone with it: a process killed -9 leaves its
        # own (Spark's block manager and files, the JVM's unpacked native libraries), and a
        # run kills dozens.
        scratch = directory / "tmp"
        scratch.mkdir(exist_ok=True)
        env["TMPDIR"] = env["SPARK_LOCAL_DIRS"] = str(scratch)
        tool_options = env.get("JAVA_TOOL_OPTIONS", "")
        env["JAVA_TOOL_OPTIONS"] = f"{tool_options} -Djava.io.tmpdir={scratch}".strip()
        self.poisoned: list[int] = []
        self.tombstones = 0
        self.driver = Role("driver", directory, env)
        self.injector = Role("injector", directory, env)
        self.zombies: list[Role] = []
        self.unplanned: list[Unplanned] = []
        self.rng = random.Random(description.workload.seed)
        self.gate = directory / GATE_FILE
        self.step = 1

    # -- the gate: how much input may go out ----------------------------------------------

    def let_through(self, records: int) -> None:
        written = self.gate.with_suffix(".tmp")
        written.write_text(str(records))
        written.replace(self.gate)

    @property
    def cap(self) -> int:
        """How much input may go out before the last fault: all but the last step, so that
        the injector never finishes (and ends the run) while faults remain."""
        return max(1, self.description.workload.records - self.step)

    def nudge(self, into_last_step: bool = False) -> bool:
        """Let a quarter step more through (up to :attr:`cap`, or ``into_last_step`` up to
        all but a quarter of the last step); whether there was room."""
        quarter = max(1, self.step // 4)
        cap = self.description.workload.records - quarter if into_last_step else self.cap
        injected = self.injected()
        if injected >= cap:
            return False
        self.let_through(min(cap, injected + quarter))
        return True

    def feed(self) -> None:
        """A quarter step more input; once the faults before used up the share before the last
        step, from the last step."""
        if not self.nudge():
            self.nudge(into_last_step=True)

    def fed(
        self, condition: Callable[[], bool], feed: Callable[[], None] | None = None
    ) -> Callable[[], bool]:
        """``condition``, for :meth:`wait`, with input kept coming meanwhile: ``feed`` (default
        :meth:`feed`) every 5 s. A pipeline that drained the input let through runs no batch
        and reaches no pause point, however well it works."""
        feed = feed or self.feed
        fed = [time.monotonic()]

        def check() -> bool:
            if condition():
                return True
            if time.monotonic() - fed[0] >= 5.0:
                feed()
                fed[0] = time.monotonic()
            return False

        return check

    def trickle(self) -> None:
        """Let a few records more through (fewer than ``tally``'s merge threshold, up to all
        but the last record, which keeps the injector running): a batch on which every
        interval is cold."""
        few = rebalance_policy(self.description.workload).merge_records
        injected = self.injected()
        last = self.description.workload.records - 1
        if injected < last:
            self.let_through(min(last, injected + few))

    def injected(self) -> int:
        try:
            return int(self.gate.with_suffix(".position").read_text())
        except (FileNotFoundError, ValueError):
            return 0

    # -- supervision ------------------------------------------------------------------------

    def supervise(self) -> None:
        """Restart a process that exited though no fault meant it to."""
        for role in (self.driver, self.injector):
            code = role.exited()
            if code is None or role.finished or role.held:
                continue
            if code == 0:
                role.finished = True
                self.progress(f"{role.role} finished")
                continue
            log = log_tail(role.logs[-1], 30)
            self.unplanned.append(Unplanned(role.role, code, log))
            error = Unplanned(role.role, code, log).error
            self.progress(f"{role.role} exited with {code} unplanned ({error}); restarting it")
            with contextlib.suppress(MillstreamError):
                role.kill_all(30)  # what is left of it: its Spark workers
            role.start()

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> bool:
        """Supervise until ``condition`` holds or ``timeout`` passed (then say so, if ``what``
        names what was awaited)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.supervise()
            if condition():
                return True
            time.sleep(0.2)
        if what:
            self.progress(f"gave up waiting {timeout:.0f} s for {what}")
        return False

    def batches(self) -> list[dict[str, Any]]:
        return read_batches(self.directory)

    def ran_batch(
        self,
        since: float,
        computation: str | None = None,
        processed: bool = False,
        on: Collection[int] = (),
    ) -> Callable[[], bool]:
        """Whether the current driver ran a batch (of ``computation``; with ``processed``,
        one whose records were not all duplicates; with ``on``, one that processed records
        on one of those key intervals) since ``since``."""

        def check() -> bool:
            return any(
                b["at"] >= since
                and b["pid"] == self.driver.pid
                and computation in (None, b["computation"])
                and (not processed or b["processed"] > 0)
                and (not on or not set(on).isdisjoint(b.get("processed_intervals", ())))
                for b in self.batches()
            )

        return check

    # -- faults ------------------------------------------------------------------------------

    def apply(self, fault: Fault) -> FaultOutcome:
        outcome = FaultOutcome(fault)
        started = time.monotonic()
        time.sleep(fault.delay)
        kind = fault.kind
        if kind in PAUSES:
            self._paused_fault(fault, outcome)
        elif kind in ("kafka", "cassandra"):
            self._service_fault(fault, outcome)
        elif kind in ("kafka-outage", "cassandra-outage"):
            self._outage_fault(fault, outcome)
        elif kind == "disk-full":
            self._disk_full_fault(outcome)
        elif kind == "poison":
            self._poison_fault(outcome)
        elif kind == "hanging":
            self._hanging_fault(outcome)
        elif kind == "injector":
            self._injector_fault(outcome)
        else:
            raise MillstreamError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}")
        outcome.seconds = time.monotonic() - started
        # The next fault meets a pipeline that works again: input for a batch to run on (a
        # replicated stack may have consumed all it had while the node was down).
        recovered = time.time()
        if self.nudge() and not self.wait(
            self.ran_batch(recovered), 300, "a batch after the fault"
        ):
            outcome.detail += "; no batch ran within 300 s after it"
        return outcome

    def _park(self, fault: Fault) -> int | None:
        """Arm the fault's pause point and wait for a process to park there: its pid."""
        return self._park_at(
            f"{pause_point(fault)}.{fault.computation}", split=fault.kind in SPLITS
        )

    def _park_at(self, point: str, split: bool = False) -> int | None:
        """Arm pause point ``point`` and wait for a process to park there, input let through
        meanwhile (for a ``split``, in pulses that change the load): its pid."""
        at = self.pauses / f"at.{point}"
        release = self.pauses / f"release.{point}"
        for stale in (at, release):
            stale.unlink(missing_ok=True)
        (self.pauses / f"arm.{point}").write_text("")
        # A split or merge follows a change of load: pulses of input, even at the end.
        pulses = [0]

        def nudge() -> None:
            pulses[0] += 1
            # A split needs a batch that overloads an interval, which a full layout (at
            # max_intervals, its cold pairs merged already) cannot give: every other pulse
            # of a split fault is a trickle, a batch whose intervals are all cold, which
            # merges a pair (a change the fault may hit too) and makes room for a split.
            if split and pulses[0] % 2 == 0:
                self.trickle()
                return
            # Input, so that a batch with work reaches the point; once the faults before used
            # up the share before the last step, from the last step (rollup gets work only
            # from windows that input moving event time on closes: no input, no batch).
            if not self.nudge(split):
                self.nudge(into_last_step=True)

        nudge()
        # Keep input coming while waiting: a window closes (and rollup gets work) only once
        # enough event time went by.
        if not self.wait(self.fed(at.exists, nudge), 120, f"a process at {point}"):
            (self.pauses / f"arm.{point}").unlink(missing_ok=True)
            return None
        return int(at.read_text())

    def _release(self, fault: Fault) -> None:
        self._release_at(f"{pause_point(fault)}.{fault.computation}")

    def _release_at(self, point: str) -> None:
        (self.pauses / f"release.{point}").write_text("")

    def _paused_fault(self, fault: Fault, outcome: FaultOutcome) -> None:
        parked = self._park(fault)
        point = f"{pause_point(fault)}.{fault.computation}"
        if parked is None:
            outcome.detail = f"no process reached {point} within 120 s"
            return
        if fault.kind in WORKER_KILLS:
            outcome.target = f"worker pid {parked}"
            with contextlib.suppress(ProcessLookupError):
                os.kill(parked, signal.SIGKILL)
            self._release(fault)
            outcome.applied = True
            outcome.detail = f"killed at {point}; the driver retries the batch"
            return
        if fault.kind == "zombie":
            self._zombie(fault, parked, outcome)
            return
        if fault.kind == "split-zombie":
            self._split_zombie(fault, parked, outcome)
            return
        outcome.target = f"driver group {self.driver.pid}"
        self.driver.kill_all()
        self._release(fault)
        self.driver.start()
        outcome.applied = True
        outcome.detail = f"killed at {point} (pid {parked} parked); driver restarted"

    def _stop_driver(self, outcome: FaultOutcome) -> Role:
        """SIGSTOP of the driver's group, a zombie-to-be: its handle; the role's next start
        is a new driver."""
        old = self.driver.detach()
        outcome.target = f"driver group {old.pid}"
        old.signal_all(signal.SIGSTOP)
        self.zombies.append(old)
        return old

    def _zombie(self, fault: Fault, parked: int, outcome: FaultOutcome) -> None:
        old = self._stop_driver(outcome)
        since = time.time()
        self.driver.start()
        took_over = self.wait(self.ran_batch(since, fault.computation), 300, "the new driver")
        cluster, session = cassandra_connector.connect(self.config)
        try:
            store = CassandraIntervalStore(session, self.description.names.keyspace, SystemClock())

            def refused() -> int:
                return sum(store.fenced(fault.computation).values())

            before = refused()
            self._release(fault)
            # The parked worker wakes alone, and the rest of the zombie once the store has
            # refused its commit. Woken together, a read that another of the zombie's tasks
            # had in flight when it was stopped timed out as it woke (its request timer ran
            # out meanwhile), failed the zombie's job, and Spark killed the parked task before
            # its commit: the zombie was then stopped by its checkpoint's fence, and the
            # store's fence, which this fault is for, went unexercised.
            with contextlib.suppress(ProcessLookupError):
                os.kill(parked, signal.SIGCONT)
            self.wait(lambda: refused() > before, 60, "the store to refuse the parked commit")
        finally:
            cluster.shutdown()
        old.signal_all(signal.SIGCONT)
        log = old.logs[-1]

        def fenced() -> bool:
            # The parked commit refused by the store, as the checks count it. The zombie's
            # other queries may log the driver's own fence first; killing the zombie then
            # could cut its worker's fence out of the log.
            lines = log.read_text(errors="replace").splitlines()
            return any(FENCED_WRITE.match(line) for line in lines)

        was_fenced = self.wait(fenced, 180, "the zombie's write to be fenced")
        old.kill_all()
        outcome.applied = took_over and was_fenced
        outcome.detail = (
            f"parked pid {parked} at {pause_point(fault)}.{fault.computation}; new driver "
            f"{'took over' if took_over else 'did NOT take over'}; zombie "
            f"{'fenced' if was_fenced else 'NOT seen fenced'}, then killed"
        )

    def _split_zombie(self, fault: Fault, parked: int, outcome: FaultOutcome) -> None:
        """The driver stopped with a change's sources exported: a new driver finishes the
        change and processes records on the new intervals; the old one, continued, must not
        copy the sources' old rows over them (the checks count what that would lose).

        The new driver plans no change of its own (:data:`HOLD_LAYOUT`): one that split a
        target again would retire it, and the zombie's copy would then be refused by the
        retired sequencer, whatever the copy checks. Once the zombie is gone, a driver that
        rebalances again takes its place."""
        old = self._stop_driver(outcome)
        targets = self._keyed_targets(fault.computation)
        since = time.time()
        environment = self.driver.env
        self.driver.env = {**environment, HOLD_LAYOUT: "1"}
        self.driver.start()
        # A batch that processed records after the change: the targets' keys moved on past
        # the copy. (Its first batch replays the zombie's, whose records it drops as
        # duplicates: a stale copy then would write what is there.) Records on the targets
        # themselves are what the copy would overwrite: waited for a while, and said, but
        # a target's few keys may get no record from the input left.
        ran_on_targets = bool(targets) and self.wait(
            self.fed(self.ran_batch(since, fault.computation, processed=True, on=targets)),
            _TARGETS_WAIT,
            "",
        )
        ran_on = self.ran_batch(since, fault.computation, processed=True)
        took_over = self.wait(self.fed(ran_on), 300, "the new driver's batch with input")
        self._release(fault)
        old.signal_all(signal.SIGCONT)
        log = old.logs[-1]

        def refused() -> bool:
            return FINISHED_ELSEWHERE in log.read_text(errors="replace")

        was_refused = self.wait(refused, 180, "the zombie's copy to be refused")
        old.kill_all()
        self.driver.kill_all()
        self.driver.env = environment
        self.driver.start()
        outcome.applied = took_over and was_refused
        on_targets = _on_targets(targets, ran_on_targets)
        outcome.detail = (
            f"stopped pid {parked} at {pause_point(fault)}.{fault.computation}; new driver "
            f"{'ran on' if took_over else 'did NOT run on'} ({on_targets}); the zombie's copy "
            f"{'refused' if was_refused else 'NOT seen refused'}, then killed; the new driver "
            "restarted to rebalance again"
        )

    def _keyed_targets(self, computation: str) -> tuple[int, ...]:
        """The target intervals of the change ``computation``'s layout journals that own
        keys of the workload (none if it journals no change)."""
        cluster, session = cassandra_connector.connect(self.config)
        try:
            store = CassandraIntervalStore(session, self.description.names.keyspace, SystemClock())
            layout = store.read_layout(computation)
        finally:
            cluster.shutdown()
        if layout is None or layout.change is None:
            return ()
        workload = self.description.workload
        finished = layout.finish()
        owning = {finished.interval_of(workload.key(index)) for index in range(workload.records)}
        return tuple(interval for interval, _, _ in layout.change.targets if interval in owning)

    def _running_service(self, backend: str, outcome: FaultOutcome) -> tuple[Any, int] | None:
        """One running node of ``backend`` (``kafka``, ``cassandra``; on a replicated stack
        one of its nodes, drawn from the seed) and its pid, made the outcome's target."""
        nodes = [s for s in self.services if s.name == backend or s.name.startswith(f"{backend}-")]
        running = [(s, pid) for s in nodes if (pid := s.process.running_pid()) is not None]
        if not running:
            outcome.detail = f"no {backend} node was running"
            return None
        service, pid = self.rng.choice(running)
        outcome.target = f"{service.name} pid {pid}"
        self.nudge()
        return service, pid

    @property
    def replicated(self) -> bool:
        names = [str(s.name) for s in self.services]
        return sum(name.startswith("cassandra") for name in names) > 1

    def _service_fault(self, fault: Fault, outcome: FaultOutcome) -> None:
        kind = fault.kind
        found = self._running_service(kind, outcome)
        if found is None:
            return
        service, pid = found
        in_flight = ""
        probe = None
        if kind == "cassandra":
            # LWTs in flight when the node dies: a worker about to commit is let go against a
            # stopped node, so its commit (and the read that would resolve it) time out on
            # the client, unknown outcomes, before the kill.
            parked = self._park(replace(fault, kind="worker"))
            probe = _StoreProbe(self.config, self.description.names.keyspace)
            probe.acknowledge(seconds=0.5)
            os.kill(pid, signal.SIGSTOP)  # at once: the last acknowledged LWT is moments old
            if parked is not None:
                self._release(replace(fault, kind="worker"))
                self.wait(lambda: False, _CLIENT_TIMEOUT + 2.0, "")
                in_flight = f"; a commit of pid {parked} in flight against the stopped node"
        os.kill(pid, signal.SIGKILL)
        wait_pid_gone(pid, 60)
        down, since = time.monotonic(), time.time()
        went_on = self._restart_injector()
        if self.replicated:
            # Two of three nodes left: the pipeline must go on committing meanwhile, on input
            # that keeps coming (it may have drained what it had while the node was stopped).
            if not self.wait(self.fed(self.ran_batch(since)), 120, "a batch with a node down"):
                # Where the driver waits, while it still does: the run's logs keep it.
                stacks = dump_stacks(self.driver.members(), self.directory / "stacks.txt")
                outcome.detail = (
                    f"no batch committed within 120 s with {service.name} down ({stacks})"
                )
                service.up()
                return
            went_on += "; batches committed meanwhile"
        else:
            time.sleep(self.rng.uniform(1.0, 5.0))
        service.up()
        if probe is not None:
            survived = probe.verify()
            with (self.directory / STORE_PROBES_FILE).open("a") as probes:
                entry = {"acknowledged": probe.acknowledged, "found": survived}
                probes.write(json.dumps(entry) + "\n")
            in_flight += f"; {survived} of {probe.acknowledged} acknowledged probe LWTs survived"
        outcome.applied = True
        outcome.detail = f"killed, back after {time.monotonic() - down:.0f} s{in_flight}{went_on}"

    def _restart_injector(self) -> str:
        """Kill the injector and start it again while a service is down, as a supervisor
        restarts a process whose service restarts too: it must start once the service is
        back (an exit would be unplanned, a failed check)."""
        injector = self.injector
        if injector.finished or injector.exited() is not None:
            return ""
        injector.kill_all()
        injector.start()
        return "; the injector restarted while it was down"

    def _outage_fault(self, fault: Fault, outcome: FaultOutcome) -> None:
        found = self._running_service(fault.kind.removesuffix("-outage"), outcome)
        if found is None:
            return
        _, pid = found
        injector = self.injector
        if injector.finished or injector.exited() is not None:
            outcome.detail = "the injector was not running"
            return
        injector_pid, log = injector.pid, injector.logs[-1]
        # The injector parks with input read and not sent yet (a pause point), and the service
        # freezes under it: it must send (Kafka) and checkpoint (Cassandra) into the outage,
        # which it has to wait out, as the driver does: no exit, no lost input. (Freezing an
        # idle injector could catch it in a heartbeat, waiting on the service before it read
        # anything, which would prove less.)
        point = f"injector.send.{self.description.names.injector}"
        if self._park_at(point) is None:
            outcome.detail = f"the injector did not reach {point} within 120 s"
            return
        parked_at = self.injected()
        waits = injector_outage_waits([log])
        os.kill(pid, signal.SIGSTOP)
        try:
            self._release_at(point)
            # More input meanwhile: read once the injector is through the outage.
            self.feed()
            self.wait(lambda: False, OUTAGE_SECONDS, "")
            read = self.injected() - parked_at
            rode_out = injector.pid == injector_pid and injector.exited() is None
        finally:
            os.kill(pid, signal.SIGCONT)
        waits = injector_outage_waits([log]) - waits
        outcome.applied = rode_out and waits > 0
        outcome.detail = (
            f"the injector parked with input read and not sent (read up to {parked_at}); "
            f"stopped for {OUTAGE_SECONDS:.0f} s, then continued; the injector read {read} "
            f"records more during it, logged {waits} outage waits and "
            f"{'rode it out' if rode_out else 'did NOT ride it out (it exited)'}"
        )

    def _disk_full_fault(self, outcome: FaultOutcome) -> None:
        checkpoints = self.directory / "checkpoints"
        filler = checkpoints / "filler"
        outcome.target = f"tmpfs {checkpoints}"
        self.nudge()
        self.driver.held = True
        try:
            with filler.open("wb") as out:
                block = bytes(1 << 20)
                with contextlib.suppress(OSError):  # ENOSPC: the disk is full, as meant
                    while True:
                        out.write(block)
                        out.flush()
            stopped = self.wait(lambda: self.driver.exited() is not None, 180, "the driver to stop")
            said = [
                line
                for line in log_tail(self.driver.logs[-1], 60).splitlines()
                if "CheckpointStorageError" in line
            ]
        finally:
            filler.unlink(missing_ok=True)
            self.driver.held = False
        if not stopped:
            outcome.detail = "the driver went on with its checkpoint disk full"
            return
        self.driver.start()
        outcome.applied = bool(said)
        outcome.detail = (
            f"driver stopped: {said[-1].strip()[:160]}; space freed, driver restarted"
            if said
            else "the driver stopped without saying that the checkpoint disk was full"
        )

    def _injector_fault(self, outcome: FaultOutcome) -> None:
        if self.injector.finished:
            outcome.detail = "the injector had finished"
            return
        self.nudge()
        before = self.injected()
        self.wait(lambda: self.injected() > before, 30, "the injector to send")
        outcome.target = f"injector pid {self.injector.pid}"
        self.injector.kill_all()
        self.injector.start()
        outcome.applied = True
        outcome.detail = f"killed after {self.injected()} records read; restarted"

    def _hanging_fault(self, outcome: FaultOutcome) -> None:
        """Leave a transaction no coordinator counts open on a partition of ``windows``: it
        pins the partition for ``rollup``'s read_committed reads until the driver's sweep
        aborts it (connectors.kafka.hanging); nothing may be lost."""
        topic = kafka_connector.stream_topic(self.description.names.windows)
        admin = kafka_connector.admin_client(self.config)
        partitions = sorted(admin.list_topics(topic, timeout=30).topics[topic].partitions)
        partition = self.rng.choice(partitions)
        _, offset = write_hanging_transaction(self.config, topic, partition)
        outcome.target = f"{topic}-{partition} from offset {offset}"
        started = time.monotonic()
        self.nudge()

        def aborted() -> bool:
            stable, _ = stable_offsets(admin, [topic])[(topic, partition)]
            return stable > offset

        limit = 3 * SWEEP_SECONDS + 60
        outcome.applied = self.wait(aborted, limit, "the driver to abort the transaction")
        outcome.detail = (
            f"aborted by the driver after {time.monotonic() - started:.0f} s"
            if outcome.applied
            else f"NOT aborted within {limit:.0f} s"
        )

    def _poison_fault(self, outcome: FaultOutcome) -> None:
        """Arm an engine fault on a well-formed record the injector has not sent yet and
        send tombstones; the record must be isolated and both dead-lettered."""
        workload = self.description.workload
        names = self.description.names
        first = self.injected()
        last = min(self.cap, first + max(1, self.step // 4))
        candidates = [
            i for i in range(first, last) if not workload.malformed(i) and i not in self.poisoned
        ]
        if not candidates:
            outcome.detail = f"no record left to poison among {first}..{last}"
            return
        index = self.rng.choice(candidates)
        record_id = injector_record_id(names.injector, "proving", index)
        fault_points.arm_fault(self.faults, "executor.record", "tally", record_id.hex())
        self.poisoned.append(index)
        producer = kafka_connector.producer(self.config)
        for number in range(_TOMBSTONES):
            key = f"tombstone-{self.tombstones + number}".encode()
            producer.produce(kafka_connector.stream_topic(names.events), key=key, value=None)
        if producer.flush(30) != 0:
            raise MillstreamError("the poison fault's tombstones were not sent within 30 s")
        self.tombstones += _TOMBSTONES
        sent = {"poisoned": self.poisoned, "tombstones": self.tombstones}
        (self.directory / POISON_FILE).write_text(json.dumps(sent))
        outcome.target = f"record {index} of tally's input, {_TOMBSTONES} tombstones"
        since = time.time()
        self.nudge()

        def isolated() -> bool:
            if self.injected() <= index:
                self.nudge()
            return any(
                b["at"] >= since and b["computation"] == "tally" and b.get("isolated", 0) > 0
                for b in self.batches()
            )

        outcome.applied = self.wait(isolated, 300, "the poisoned record to be isolated")
        outcome.detail = (
            "isolated and dead-lettered" if outcome.applied else "NOT seen isolated within 300 s"
        )

    def stop_everything(self) -> None:
        for role in (self.driver, self.injector, *self.zombies):
            if role.proc is not None and role.exited() is None:
                with contextlib.suppress(MillstreamError):
                    role.kill_all(30)


def _mount_checkpoint_disk(directory: Path) -> Path:
    """A small tmpfs under the run's checkpoints, for the disk-full fault to fill."""
    checkpoints = directory / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={CHECKPOINT_DISK}", "tmpfs", str(checkpoints)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        raise MillstreamError(
            f"the disk-full fault mounts a {CHECKPOINT_DISK} tmpfs under {checkpoints} and "
            f"could not ({mounted.stderr.strip() or mounted.returncode}); run as root, or "
            "leave the fault out with --faults"
        )
    return checkpoints


def run_config(config: MillstreamConfig, run: str) -> MillstreamConfig:
    """``config`` as the processes of run ``run`` see it: with the run's own watermark topic."""
    return replace(config, kafka_watermark_topic=f"proving_{run}.watermarks")


def discard(config: MillstreamConfig, directory: Path) -> None:
    """Remove a run's topics (its watermark, wake and marker topics too), keyspace, marker
    groups and directory."""
    run = RunDescription.read(directory)
    config = run_config(config, run.run)
    names = run.names
    kafka_connector.delete_wake_topics(config)
    topics = [kafka_connector.stream_topic(s) for s in names.streams()]
    markers = kafka_connector.transaction_marker_topic(config)
    kafka_connector.delete_topics(config, [*topics, config.kafka_watermark_topic, markers])
    cluster, session = cassandra_connector.connect(config)
    try:
        cassandra_connector.drop_keyspace(session, names.keyspace)
    finally:
        cluster.shutdown()
    kafka_connector.delete_transaction_markers(config, names.keyspace)
    shutil.rmtree(directory, ignore_errors=True)


def read_store_probes(directory: Path) -> list[dict[str, int]]:
    """The cassandra faults' durability probes of a run (see :class:`_StoreProbe`)."""
    path = directory / STORE_PROBES_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def recheck(
    config: MillstreamConfig,
    directory: Path,
    expected: ExpectedOutcome | None = None,
    *,
    plain_exactly_once: bool = True,
) -> tuple[CheckResult, NonVacuity]:
    """Run the checks again on a kept run (``expected``: what to hold it against, by default
    the fold of its workload; ``plain_exactly_once``: see
    :func:`~millstream.devtools.proving.checks.check_run`)."""
    run = RunDescription.read(directory)
    poison = directory / POISON_FILE
    sent = json.loads(poison.read_text()) if poison.exists() else {}
    return check_run(
        run_config(config, run.run),
        run.names,
        run.workload,
        expected
        or expected_outcome(run.workload, sent.get("poisoned", ()), sent.get("tombstones", 0)),
        run.key_intervals,
        read_batches(directory),
        sorted(directory.glob("driver-*.log")),
        sorted(directory.glob("injector-*.log")),
        plain_exactly_once=plain_exactly_once,
        store_probes=read_store_probes(directory),
    )


def query_mode(
    config: MillstreamConfig, environment: Mapping[str, str], one_query: bool | None
) -> tuple[dict[str, str], bool]:
    """The environment of a run's processes with ``one_query`` in it (the driver reads its
    run settings from its environment, :func:`~millstream.engine.config.load_config`), and
    whether the topology runs as one query: ``one_query``, or ``config``'s if ``None``."""
    if one_query is None:
        return dict(environment), config.run.one_query
    return {**environment, "MILLSTREAM_RUN_ONE_QUERY": "true" if one_query else "false"}, one_query


def prove(
    config: MillstreamConfig,
    tier: Tier,
    seed: int,
    *,
    services: Any,
    home: Path | None = None,
    kinds: tuple[str, ...] | None = None,
    keep: bool = False,
    progress: Callable[[str], None] = lambda _: None,
    environment: Mapping[str, str] | None = None,
    plain_exactly_once: bool = True,
    one_query: bool | None = None,
) -> GroundReport:
    """One run of the proving ground; see the module docstring. ``services`` are the local
    stack's (:attr:`~millstream.devtools.local.stack.LocalStack.services`): the Kafka and
    Cassandra faults kill and restart them by pid (on a replicated stack, one node each time,
    and the pipeline must commit while it is down). ``environment`` goes to the driver and
    injector processes besides this one's (the ``MILLSTREAM_*`` endpoints of ``config``, when
    they differ from what the environment says). ``keep`` leaves the run's topics, keyspace
    and directory for inspection. ``plain_exactly_once`` fails a run whose output streams a
    plain read_committed Kafka consumer reads a message of twice (their counts are reported
    either way; off for a topology whose productions are not transactional). ``one_query``
    runs the topology as one streaming query, or a query per computation (``None``: as
    ``config.run.one_query`` says); the report names which."""
    environment, one_query = query_mode(config, environment or {}, one_query)
    unknown = set(kinds or ()) - FAULTS.keys()
    if unknown:
        raise MillstreamError(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    kinds = run_kinds(tier, kinds)
    run_name = f"s{seed}_{uuid.uuid4().hex[:8]}"
    directory = (home or config.home / "proving") / run_name
    directory.mkdir(parents=True)
    base_config, config = config, run_config(config, run_name)
    faults = schedule(seed, tier, kinds)
    # tally's intervals split and merge in a run that kills the driver amid a change, on
    # skewed input: most records on the keys of one hash range, as a hot spot makes them.
    rebalance = any(fault.kind in SPLITS for fault in faults)
    workload = Workload(
        records=tier.records,
        keys=tier.keys,
        seed=seed,
        rate=tier.rate,
        hot_share=SPLIT_HOT_SHARE if rebalance else 0.0,
    )
    description = RunDescription(run_name, workload, tier.key_intervals, 20_000, rebalance)
    description.write(directory)
    report = GroundReport(run_name, seed, tier, directory, one_query=one_query)
    started = time.monotonic()
    run = _Run(config, description, directory, services, progress, environment)
    steps = len(faults) + 1
    run.step = max(1, tier.records // steps)
    # What the run's processes need, before either starts (each provisions it too).
    provision(config, replace(config.run, keyspace=description.names.keyspace))
    checkpoint_disk = (
        _mount_checkpoint_disk(directory) if "disk-full" in {f.kind for f in faults} else None
    )
    try:
        try:
            run.let_through(tier.records // steps)
            run.injector.start()
            run.driver.start()
            if not run.wait(run.ran_batch(0), 300, "the driver's first batch"):
                raise MillstreamError(
                    f"the driver ran no batch within 300 s; see {run.driver.logs[-1]}"
                )
            for number, fault in enumerate(faults, 1):
                progress(f"fault {number}/{len(faults)}: {fault.kind} ({fault.computation})")
                outcome = run.apply(fault)
                progress(f"  {outcome.detail} ({outcome.seconds:.1f} s)")
                report.outcomes.append(outcome)
                run.let_through(
                    min(run.cap, max(run.injected(), tier.records * (number + 1) // steps))
                )
            run.let_through(tier.records)
            if not run.wait(
                lambda: run.driver.finished and run.injector.finished,
                max(600.0, tier.records / tier.rate * 3),
                "the run to finish",
            ):
                raise MillstreamError(f"the run did not finish; see the logs in {directory}")
            report.unplanned = run.unplanned
            report.checks, report.provoked = recheck(
                base_config, directory, plain_exactly_once=plain_exactly_once
            )
            # Only the fault sees these (the driver's sweep is in no batch's metrics).
            report.provoked.hanging_aborted = sum(
                o.applied for o in report.outcomes if o.fault.kind == "hanging"
            )
        finally:
            run.stop_everything()
            if checkpoint_disk is not None:
                subprocess.run(["umount", str(checkpoint_disk)], check=False)
            report.seconds = time.monotonic() - started
            (directory / "report.json").write_text(json.dumps(report.to_json(), indent=2))
    except BaseException:
        keep = True  # a run that could not finish keeps what tells why, as a failed one does
        raise
    finally:
        # A run that failed keeps its logs, topics and keyspace: they are what tells why.
        if not keep and report.passed:
            discard(base_config, directory)
    return report


_TARGETS_WAIT: Final = 60.0
"""Seconds split-zombie waits for the new driver to process records on the change's targets
(before it settles for records anywhere)."""


def _on_targets(targets: tuple[int, ...], ran_on: bool) -> str:
    """What split-zombie's detail says of the records on the change's targets."""
    if not targets:
        return "the change's targets hold none of the workload's keys"
    named = ", ".join(map(str, targets))
    if ran_on:
        return f"records on the change's targets {named}"
    return f"NO record on the change's targets {named} within {_TARGETS_WAIT:.0f} s"
