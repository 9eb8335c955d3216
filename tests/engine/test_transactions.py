"""Transactional productions: a plain ``read_committed`` reader sees each production once.

The core protocol over the memory store and :class:`TestingTransactions` (an in-memory
transaction log with producer fencing); the Kafka mechanics are tested against a real broker
in ``tests/connectors/test_kafka_transactions.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

import pytest

from millstream.engine.computation import Computation
from millstream.engine.context import Context
from millstream.engine.errors import FencedError
from millstream.engine.layout import IntervalLayout
from millstream.engine.productions import CommitTag, Production, delivered_by
from millstream.engine.protocol import Delivery, IntervalWorker
from millstream.engine.rebalance import begin, finish_change
from millstream.engine.records import Record
from millstream.engine.sequencer import Lease
from millstream.engine.stores.memory.store import FaultPoint, InjectedCrash
from millstream.engine.testing import TestingTransactions, TransactionFault
from millstream.engine.topology import ComputationOptions, ComputationSpec

if TYPE_CHECKING:
    from tests.engine.conftest import RecordFactory, Workers

pytestmark = pytest.mark.unit

WM = 0


class Echo(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("out", record.value, record.timestamp)


def deliver(*records: Record) -> list[Delivery]:
    return [Delivery(r.key, r) for r in records]


def duplicates(productions: list[Production]) -> int:
    counts = Counter(p.record_id for p in productions)
    return sum(n - 1 for n in counts.values())


def values(transactions: TestingTransactions) -> list[bytes]:
    return sorted(p.record.value for p in transactions.read_committed("out"))


@pytest.fixture
def transactions() -> TestingTransactions:
    return TestingTransactions()


def worker(
    workers: Workers, spec: ComputationSpec, transactions: TestingTransactions
) -> IntervalWorker:
    return IntervalWorker(
        spec,
        0,
        store=workers.store,
        sink=workers.sink,
        clock=workers.clock,
        transactions=transactions,
    )


def split_interval_0(
    workers: Workers,
    spec: ComputationSpec,
    delivered: Callable[[str, int], CommitTag | None],
) -> IntervalLayout:
    """Split the computation's one interval, the driver's way; the layout after it."""
    store = workers.store
    layout = store.layout("comp", 1)
    begun = layout.begin_split(0)
    begin(store, "comp", layout, begun)
    return finish_change(
        store, "comp", begun, dedup_ttl=spec.options.dedup_ttl, delivered=delivered
    )


def opening(transactions: TestingTransactions) -> Callable[[str, int], CommitTag | None]:
    """A split's ``delivered``: opens the source's producer as a new client (the driver)."""
    return lambda computation, interval: transactions.open(computation, interval, 30.0)


def test_a_commits_productions_go_in_one_transaction_whose_marker_names_the_commit(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    result = worker(workers, spec, transactions).process(
        deliver(make_record("a", b"1"), make_record("b", b"2")), WM
    )

    assert values(transactions) == [b"1", b"2"]
    assert workers.sink.sent == []  # nothing goes around the transaction
    assert (result.transactions, result.acknowledged, result.pending) == (1, 2, 0)
    marker = transactions.marker("comp", 0)
    assert marker == CommitTag(result.lease.token, 1)
    # Their row stays until the next commit deletes it; whoever finds it first learns from
    # the marker that they were delivered.
    rows = workers.store.productions("comp")
    assert [p.record.value for p in rows] == [b"1", b"2"]
    assert all(delivered_by(p.tag, marker) for p in rows)


def test_the_next_commit_deletes_the_delivered_rows_in_its_own_write(
    workers: Workers,
    transactions: TestingTransactions,
    make_record: RecordFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = workers.spec(Echo())
    owner = worker(workers, spec, transactions)
    owner.process(deliver(make_record("a", b"1")), WM)
    deletes: list[list[bytes]] = []
    delete = workers.store.delete_productions

    def counted(lease: Lease, record_ids: Collection[bytes]) -> None:
        deletes.append(list(record_ids))
        delete(lease, record_ids)

    monkeypatch.setattr(workers.store, "delete_productions", counted)
    owner.process(deliver(make_record("b", b"2")), WM)
    assert [p.record.value for p in workers.store.productions("comp")] == [b"2"]
    assert deletes == []  # the first batch's row went with the second's commit

    result = owner.process([], WM)  # nothing to commit: its own delete, a batch late
    assert (result.committed_keys, len(deletes)) == (0, 1)
    assert workers.store.productions("comp") == []
    assert values(transactions) == [b"1", b"2"]


def test_a_worker_keeps_its_producer_open_while_it_keeps_the_interval(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    owner = worker(workers, spec, transactions)
    leases = {
        owner.process(deliver(make_record("a", value)), WM).lease for value in (b"1", b"2", b"3")
    }

    # One lease, kept: its commits' tags are numbered, and the marker names the last.
    [lease] = leases
    assert transactions.marker("comp", 0) == CommitTag(lease.token, 3)
    assert transactions.opens == 1
    # Begun in the background as the first batch began, before its commit; not again.
    assert transactions.prepares == 1
    assert values(transactions) == [b"1", b"2", b"3"]


def test_a_kept_producer_stages_the_transaction_as_the_commit_runs_and_commits_it_after(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    owner = worker(workers, spec, transactions)
    owner.process(deliver(make_record("a", b"0")), WM)  # opens after its commit: no staging
    assert transactions.staged == 0

    during: list[tuple[int, list[bytes]]] = []
    workers.store.inject(
        FaultPoint.BEFORE_COMMIT, lambda: during.append((transactions.staged, values(transactions)))
    )
    result = owner.process(deliver(make_record("a", b"1")), WM)

    # Staged before the store commit, visible only once it landed.
    assert during == [(1, [b"0"])]
    assert values(transactions) == [b"0", b"1"]
    assert (result.transactions, result.acknowledged, result.pending) == (1, 1, 0)
    assert transactions.marker("comp", 0) == CommitTag(result.lease.token, 2)
    assert (transactions.aborted, transactions.opens) == (0, 1)


def test_a_staged_transaction_whose_store_commit_is_fenced_is_aborted(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    zombie = worker(workers, spec, transactions)
    zombie.process(deliver(make_record("a", b"0")), WM)
    successor = worker(workers, spec, transactions.client())

    # The successor takes the interval over while the zombie's transaction is staged.
    workers.store.inject(
        FaultPoint.BEFORE_COMMIT,
        lambda: successor.process(deliver(make_record("b", b"2")), WM),
    )
    with pytest.raises(FencedError):
        zombie.process(deliver(make_record("a", b"1")), WM)

    # The zombie's, aborted, and the successor's (its resend of b=0 opened the producer
    # before its commit: the marker said b=0 was delivered), committed.
    assert (transactions.staged, transactions.aborted) == (2, 1)
    # b=1 was neither committed nor delivered: its input comes again, to the successor.
    assert values(transactions) == [b"0", b"2"]
    successor.process(deliver(make_record("a", b"1")), WM)
    assert values(transactions) == [b"0", b"1", b"2"]
    assert duplicates(transactions.read_committed()) == 0


def test_a_takeover_whose_prepared_open_finished_opens_before_its_commit_and_stages(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    transactions.prepared_ready = True  # the background open finished before the commit
    owner = worker(workers, workers.spec(Echo()), transactions)
    during: list[tuple[int, int, list[bytes]]] = []
    workers.store.inject(
        FaultPoint.BEFORE_COMMIT,
        lambda: during.append((transactions.opens, transactions.staged, values(transactions))),
    )
    result = owner.process(deliver(make_record("a", b"1")), WM)

    # Opened and staged before the commit (which is the lease check after the open), and
    # committed after it; no write of its own checks the lease.
    assert during == [(1, 1, [])]
    assert values(transactions) == [b"1"]
    assert (result.transactions, result.acknowledged, result.pending) == (1, 1, 0)
    assert transactions.marker("comp", 0) == CommitTag(result.lease.token, 1)


def test_a_takeover_superseded_before_its_early_open_is_fenced_by_its_commit(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    zombie_producers = transactions.client()
    zombie_producers.prepared_ready = True
    zombie = worker(workers, spec, zombie_producers)
    successor = worker(workers, spec, transactions)

    # The successor takes the interval over (and delivers) while the zombie reads; the
    # zombie then opens, fencing the successor's producer, and stages.
    workers.store.inject(
        FaultPoint.BEFORE_READ, lambda: successor.process(deliver(make_record("b", b"2")), WM)
    )
    with pytest.raises(FencedError):
        zombie.process(deliver(make_record("a", b"1")), WM)
    assert (zombie_producers.staged, zombie_producers.aborted) == (1, 1)
    assert values(transactions) == [b"2"]

    # The successor finds its producer fenced, opens again, and delivers what comes next;
    # the zombie's input comes again to it.
    successor.process(deliver(make_record("a", b"1")), WM)
    successor.process([], WM)
    assert values(transactions) == [b"1", b"2"]
    assert duplicates(transactions.read_committed()) == 0


def test_a_batch_without_input_begins_no_open(
    workers: Workers, transactions: TestingTransactions
) -> None:
    worker(workers, workers.spec(Echo()), transactions).process([], WM)
    assert (transactions.prepares, transactions.opens) == (0, 0)


def test_an_interval_without_output_never_opens_a_producer(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    class Silent(Computation):
        def process_record(self, ctx: Context, record: Record) -> None:
            pass

    worker(workers, workers.spec(Silent()), transactions).process(
        deliver(make_record("a", b"1")), WM
    )
    assert transactions.opens == 0
    assert transactions.read_committed() == []
    # Its input began one in the background (a producer kept until idle), never taken.
    assert transactions.prepares == 1


def test_killed_after_the_kafka_commit_the_new_owner_drops_what_the_marker_covers(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    transactions.fail_next(TransactionFault.CRASH_AFTER_COMMIT)
    with pytest.raises(InjectedCrash):
        worker(workers, spec, transactions).process(deliver(make_record("a", b"1")), WM)
    assert len(workers.store.productions("comp")) == 1  # committed to Kafka, still pending

    successor = worker(workers, spec, transactions.client())
    result = successor.process([], WM)

    assert values(transactions) == [b"1"]
    assert (result.marker_resolved, result.resent, result.transactions) == (1, 0, 0)
    assert result.aborted_commits == 0
    assert workers.store.productions("comp") == []


class EchoOrFail(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"bad":
            raise ValueError("bad record")
        ctx.produce("out", record.value, record.timestamp)


def test_a_dead_letter_is_tagged_like_the_calls_productions_so_the_marker_covers_it(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    # Productions are made with their commit's tag; a dead letter is made by the engine,
    # and tagged as it commits: untagged, a successor would take it for undelivered and
    # send it again.
    spec = workers.spec(EchoOrFail())
    transactions.fail_next(TransactionFault.CRASH_AFTER_COMMIT)
    with pytest.raises(InjectedCrash):
        worker(workers, spec, transactions).process(
            deliver(make_record("a", b"1"), make_record("b", b"bad")), WM
        )
    rows = workers.store.productions("comp")
    assert sorted(p.stream for p in rows) == sorted(["out", spec.dead_letter_stream])
    assert len({p.tag for p in rows}) == 1

    result = worker(workers, spec, transactions.client()).process([], WM)

    assert (result.marker_resolved, result.resent, result.transactions) == (2, 0, 0)
    assert duplicates(transactions.read_committed()) == 0
    assert len(transactions.read_committed(spec.dead_letter_stream)) == 1


def test_killed_with_the_transaction_open_the_new_owner_sends_it_again_once(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    transactions.fail_next(TransactionFault.CRASH_BEFORE_COMMIT)
    with pytest.raises(InjectedCrash):
        worker(workers, spec, transactions).process(deliver(make_record("a", b"1")), WM)
    assert values(transactions) == []

    result = worker(workers, spec, transactions.client()).process([], WM)

    assert values(transactions) == [b"1"]
    assert (result.marker_resolved, result.resent, result.transactions) == (0, 1, 1)
    assert result.aborted_commits == 1


def test_killed_between_the_store_commit_and_the_transaction_nothing_is_lost(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    workers.store.inject(FaultPoint.AFTER_COMMIT)
    with pytest.raises(InjectedCrash):
        worker(workers, spec, transactions).process(deliver(make_record("a", b"1")), WM)

    worker(workers, spec, transactions.client()).process([], WM)
    assert values(transactions) == [b"1"]


@pytest.mark.parametrize(
    ("fault", "resolved"),
    [(TransactionFault.COMMITTED_UNACKNOWLEDGED, 1), (TransactionFault.ABORTED, 0)],
)
def test_an_unknown_transaction_outcome_is_resolved_by_the_marker_in_the_same_batch(
    workers: Workers,
    transactions: TestingTransactions,
    make_record: RecordFactory,
    fault: TransactionFault,
    resolved: int,
) -> None:
    spec = workers.spec(Echo())
    owner = worker(workers, spec, transactions)
    owner.process(deliver(make_record("a", b"0")), WM)
    transactions.fail_next(fault)
    result = owner.process(deliver(make_record("a", b"1")), WM)

    assert values(transactions) == [b"0", b"1"]
    assert result.transaction_failures == 1
    assert result.marker_resolved == resolved
    assert result.transactions == 1 - resolved
    assert result.pending == 0
    # Resolved by the reopen's marker, the row went with the write that follows an open;
    # delivered again, it stays for the next commit, its delivery named by the marker.
    marker = transactions.marker("comp", 0)
    left = [] if resolved else [(b"1", True)]
    assert [
        (p.record.value, delivered_by(p.tag, marker)) for p in workers.store.productions("comp")
    ] == left
    assert transactions.opens == 2  # the reopen that resolved it


def test_two_unknown_outcomes_in_a_row_leave_the_productions_for_the_next_batch(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    owner = worker(workers, spec, transactions)
    transactions.fail_next(TransactionFault.ABORTED, TransactionFault.ABORTED)
    result = owner.process(deliver(make_record("a", b"1")), WM)
    assert (result.pending, result.transaction_failures) == (1, 2)
    assert values(transactions) == []

    after = owner.process([], WM)
    assert (after.pending, after.transactions) == (0, 1)
    assert values(transactions) == [b"1"]


def test_a_commit_answered_then_undone_keeps_its_productions_pending_and_sends_them_again(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    # Kafka answered the commit, then skipped its markers and the sweep aborted it: the
    # marker read back does not cover it, so nothing is taken for delivered.
    spec = workers.spec(Echo())
    owner = worker(workers, spec, transactions)
    owner.process(deliver(make_record("a", b"0")), WM)
    transactions.fail_next(TransactionFault.COMMIT_UNDONE)
    one = make_record("a", b"1")
    result = owner.process(deliver(one), WM)
    assert (result.unsettled_commits, result.transaction_failures) == (1, 1)
    assert (result.transactions, result.pending) == (0, 1)
    assert result.progress.oldest_work == one.timestamp  # it holds the watermark back
    assert values(transactions) == [b"0"]

    # The next batch's commit keeps its row; its delivery opens, resolves by the marker and
    # sends it again with the batch's own.
    after = owner.process(deliver(make_record("b", b"2")), WM)
    assert (after.resent, after.marker_resolved, after.pending) == (1, 0, 0)
    assert values(transactions) == [b"0", b"1", b"2"]
    assert duplicates(transactions.read_committed()) == 0
    assert transactions.opens == 2


def test_a_commit_whose_marker_reads_back_late_is_resolved_by_it_not_sent_twice(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    owner = worker(workers, spec, transactions)
    transactions.fail_next(TransactionFault.UNSETTLED)
    result = owner.process(deliver(make_record("a", b"1")), WM)
    assert (result.unsettled_commits, result.pending) == (1, 1)

    after = owner.process([], WM)
    assert (after.marker_resolved, after.resent, after.pending) == (1, 0, 0)
    assert values(transactions) == [b"1"]
    assert workers.store.productions("comp") == []


def test_every_answered_commit_is_settled_by_reading_its_marker_back(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    owner = worker(workers, spec, transactions)
    for value in (b"1", b"2"):
        assert owner.process(deliver(make_record("a", value)), WM).unsettled_commits == 0
    owner.process([], WM)  # nothing delivered: nothing to settle
    assert transactions.settles == 2


def test_an_unreachable_coordinator_leaves_productions_pending_and_the_batch_commits(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    owner = worker(workers, spec, transactions)
    transactions.unavailable = True
    result = owner.process(deliver(make_record("a", b"1")), WM)
    assert (result.pending, result.transaction_failures, result.processed) == (1, 1, 1)

    transactions.unavailable = False
    owner.process([], WM)
    assert values(transactions) == [b"1"]


def test_a_zombies_transaction_is_fenced_by_the_new_owners_open(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    zombie = worker(workers, spec, transactions)
    zombie.process(deliver(make_record("a", b"0")), WM)  # its producer is open now
    successor = worker(workers, spec, transactions.client())

    # The successor takes over while the zombie is between its commit and its transaction.
    workers.store.inject(
        FaultPoint.AFTER_COMMIT, lambda: successor.process(deliver(make_record("b", b"2")), WM)
    )
    result = zombie.process(deliver(make_record("a", b"1")), WM)
    assert (result.fenced_producers, result.transactions, result.pending) == (1, 0, 1)

    # The zombie's commit landed before the takeover; the successor's next batch sends it.
    successor.process([], WM)
    assert values(transactions) == [b"0", b"1", b"2"]
    assert duplicates(transactions.read_committed()) == 0


def test_a_zombie_that_opens_after_the_successor_delivered_sends_nothing_again(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    """The zombie read the pending productions before the successor delivered them; it opens
    (fencing the successor) after: the marker covers them, so it drops them."""
    spec = workers.spec(Echo())
    transactions.fail_next(TransactionFault.CRASH_BEFORE_COMMIT)
    with pytest.raises(InjectedCrash):
        worker(workers, spec, transactions).process(deliver(make_record("a", b"1")), WM)
    zombie_producers = transactions.client()
    zombie = worker(workers, spec, zombie_producers)
    successor = worker(workers, spec, transactions.client())
    zombie_producers.before_next_open(lambda: successor.process([], WM))
    with pytest.raises(FencedError):  # its delete of the dropped rows is fenced
        zombie.process([], WM)
    assert transactions.opens == 3  # the crashed owner's, the successor's, the zombie's

    assert values(transactions) == [b"1"]
    assert duplicates(transactions.read_committed()) == 0


def test_a_zombie_whose_stale_view_holds_the_successors_commit_is_fenced_before_delivering(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    """A zombie that read the successor's committed productions as its own pending ones
    checks its lease after opening the producer, so it delivers none of them (were it to
    deliver them, its marker would be the highest tag it sends, so that the successor
    would still not take them for undelivered)."""
    spec = workers.spec(Echo())
    zombie_producers, successor_producers = transactions.client(), transactions.client()
    zombie = worker(workers, spec, zombie_producers)
    successor = worker(workers, spec, successor_producers)
    successor_producers.unavailable = True  # it commits b=2 but cannot deliver it yet

    workers.store.inject(
        FaultPoint.BEFORE_SCAN, lambda: successor.process(deliver(make_record("b", b"2")), WM)
    )
    with pytest.raises(FencedError):
        zombie.process([], WM)  # it reads b=2 as pending, opens, and is fenced
    assert transactions.read_committed() == []
    assert transactions.marker("comp", 0) is None

    successor_producers.unavailable = False
    result = successor.process([], WM)
    assert (result.transactions, result.marker_resolved) == (1, 0)

    assert values(transactions) == [b"2"]
    assert duplicates(transactions.read_committed()) == 0


@pytest.mark.parametrize(
    "options",
    [
        ComputationOptions(key_intervals=1, transactional_productions=False),
        ComputationOptions(key_intervals=1, strong_productions=False),
        ComputationOptions(key_intervals=1, exactly_once=False),
    ],
    ids=["off", "weak", "at-least-once"],
)
def test_productions_are_transactional_only_with_exactly_once_and_strong_productions(
    workers: Workers,
    transactions: TestingTransactions,
    make_record: RecordFactory,
    options: ComputationOptions,
) -> None:
    spec = workers.spec(Echo(), options=options)
    worker(workers, spec, transactions).process(deliver(make_record("a", b"1")), WM)
    assert transactions.read_committed() == []
    assert [p.record.value for p in workers.sink.delivered()] == [b"1"]


def test_a_split_tags_copied_productions_as_a_commit_of_their_target(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    """A tag names a commit of its source interval, whose marker the targets do not share:
    the copy carries the copying lease's tag instead, below every commit of the target."""
    spec = workers.spec(Echo())
    transactions.unavailable = True
    worker(workers, spec, transactions).process(deliver(make_record("a", b"1")), WM)
    [pending] = workers.store.productions("comp")
    assert pending.tag is not None

    store = workers.store
    split_interval_0(workers, spec, lambda computation, interval: None)
    [copied] = store.productions("comp")
    assert copied.record.value == b"1"
    assert copied.tag is not None
    assert copied.tag.number == 0
    assert copied.tag != pending.tag


def test_a_copy_delivered_by_the_target_is_not_sent_again_after_a_crash(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    """The target's owner delivers the copy and dies before deleting it: its successor finds
    the copy's tag under the target's marker and drops it."""
    spec = workers.spec(Echo())
    transactions.unavailable = True
    worker(workers, spec, transactions).process(deliver(make_record("a", b"1")), WM)
    transactions.unavailable = False
    store = workers.store
    split = split_interval_0(workers, spec, opening(transactions.client()))
    target = split.interval_of("a")

    def target_worker(producers: TestingTransactions) -> IntervalWorker:
        return IntervalWorker(
            spec, target, store=store, sink=workers.sink, clock=workers.clock,
            layout=split, transactions=producers,
        )  # fmt: skip

    transactions.fail_next(TransactionFault.CRASH_AFTER_COMMIT)
    with pytest.raises(InjectedCrash):
        target_worker(transactions).process([], WM)
    result = target_worker(transactions.client()).process([], WM)

    assert (result.marker_resolved, result.resent) == (1, 0)
    assert values(transactions) == [b"1"]
    assert store.productions("comp") == []


def test_a_split_leaves_out_what_the_sources_marker_says_was_delivered(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    spec = workers.spec(Echo())
    owner = worker(workers, spec, transactions)
    transactions.unavailable = True
    owner.process(deliver(make_record("a", b"1")), WM)
    owner.process(deliver(make_record("a", b"2")), WM)
    first, second = sorted(workers.store.productions("comp"), key=lambda p: p.record.value)
    assert first.tag is not None
    assert second.tag is not None
    assert first.tag < second.tag

    asked: list[tuple[str, int]] = []

    def delivered(computation: str, interval: int) -> CommitTag | None:
        asked.append((computation, interval))
        return first.tag  # the first commit's transaction committed, its rows not deleted

    store = workers.store
    split_interval_0(workers, spec, delivered)
    assert asked == [("comp", 0)]
    assert [p.record.value for p in store.productions("comp")] == [b"2"]


def test_a_zombie_of_a_split_source_that_opens_after_the_split_delivers_nothing(
    workers: Workers, transactions: TestingTransactions, make_record: RecordFactory
) -> None:
    """The split read the source's marker and copied its pending productions to the targets;
    the zombie opens the source's producer after that (its own first transaction): the
    marker says nothing of the copy, so only its lease, checked after the open, stops it."""
    spec = workers.spec(Echo())
    store = workers.store
    driver_producers = transactions.client()

    def split() -> None:
        split_interval_0(workers, spec, opening(driver_producers))

    zombie = worker(workers, spec, transactions.client())
    store.inject(FaultPoint.AFTER_COMMIT, split)  # between its commit and its transaction
    with pytest.raises(FencedError):
        zombie.process(deliver(make_record("a", b"1")), WM)

    assert values(transactions) == []  # the targets deliver the copy, once
    assert [p.record.value for p in store.productions("comp")] == [b"1"]
