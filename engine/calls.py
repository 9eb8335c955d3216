"""A key's calls into user code in one batch (step 4 of :mod:`millstream.engine.protocol`).

A :class:`KeyRun` runs one key's fresh records, then its due timers, each call with a
:class:`CallContext` of its own that writes into the key's change set of the batch. A call
that raises is undone and leaves a dead letter instead, so that one bad record cannot stop
the interval; a timer is deleted in the commit that holds its effects, even if its call
failed. The state's TTL timer is renewed by every call that sets or clears the state.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Final, TypeVar

from millstream.engine.clock import Clock
from millstream.engine.context import Context
from millstream.engine.deadletters import DeadLetter, Origin
from millstream.engine.errors import AbsurdTimestampError, UndeclaredStreamError
from millstream.engine.productions import CommitTag, Production
from millstream.engine.records import (
    MAX_EVENT_TIME,
    Deletion,
    Record,
    check_event_time,
    check_record_size,
    clamp_event_time,
    encode_record,
    production_record_id,
    unchecked_record,
)
from millstream.engine.slots import slot_constructor
from millstream.engine.state import UNCHANGED, KeyChanges, effective_timers
from millstream.engine.store import KeySnapshot
from millstream.engine.timers import (
    RESERVED_TAG_PREFIX,
    STATE_TTL_TAG,
    TimeDomain,
    Timer,
    due_timers,
)
from millstream.engine.topology import ComputationSpec

if TYPE_CHECKING:
    from millstream.engine.protocol import BatchResult, Delivery

__all__ = ["CallContext", "KeyRun"]

_make_production: Callable[[str, Record, bytes | None, CommitTag | None], Production] = (
    slot_constructor(Production)
)

_Cause = TypeVar("_Cause", Record, Deletion, Timer)  # what a call runs for


class _NoChange(enum.Enum):
    NO_CHANGE = "no change"


# A tag the batch had not changed before a call changed it (undone by dropping it).
_NO_CHANGE: Final = _NoChange.NO_CHANGE


def _check_tag(tag: str) -> None:
    if isinstance(tag, str) and tag.startswith(RESERVED_TAG_PREFIX):
        raise ValueError(
            f"timer tag {tag!r}: tags starting with {RESERVED_TAG_PREFIX!r} are the engine's"
        )


def _raw(item: Record | Deletion) -> bytes:
    """The bytes a dead letter keeps of an input: a record's envelope; a tombstone has none."""
    return encode_record(item) if isinstance(item, Record) else b""


class KeyRun:
    """The calls for one key in one batch, accumulating into the key's change set."""

    def __init__(
        self,
        spec: ComputationSpec,
        clock: Clock,
        tag: CommitTag | None,
        committed: KeySnapshot,
        changes: KeyChanges,
        watermarks: tuple[int, int],
        now: int,
        result: BatchResult,
        weak_outbox: list[tuple[KeyChanges, Production]],
    ) -> None:
        self.spec = spec
        self.clock = clock
        self.key = changes.key
        self.changes = changes
        # Records run under the watermark before the batch, timers under the one after it.
        self.watermark, self.timer_watermark = watermarks
        self.now = now
        self.result = result
        self.weak_outbox = weak_outbox
        self.committed_state = committed.state
        self.committed_timers = committed.timers
        # The commit's tag (transactional productions), which every production carries.
        self.tag = tag

    def run(self, fresh: list[Delivery]) -> None:
        """Run the key's fresh (deduplicated) records, then its due timers."""
        for delivery in fresh:
            self._record(delivery)
        self._fire_timers()
        # The committed timers these changes replace or delete leave the store's index.
        self.changes.previous_timers.extend(
            timer for tag, timer in self.committed_timers.items() if tag in self.changes.timers
        )

    def _record(self, delivery: Delivery) -> None:
        record = delivery.record
        if self.spec.options.exactly_once:
            self.changes.dedup_ids.append(record.record_id)
        self.result.processed += 1
        try:
            check_event_time(record.timestamp)
        except AbsurdTimestampError as exc:
            self._record_failed(delivery, exc, self.watermark)
            return
        computation = self.spec.computation
        if isinstance(record, Deletion):
            # Late or not, a deletion runs: it has no envelope for the late stream, and
            # dropping it would keep what its producer deleted.
            if record.timestamp < self.watermark:
                self.result.late += 1
            failure = self._call(
                record.record_id,
                computation.process_deletion,
                record,
                record.timestamp,
                self.watermark,
            )
            if failure is not None:
                self._record_failed(delivery, failure, record.timestamp)
            return
        if record.timestamp < self.watermark:
            self.result.late += 1
            late_stream = self.spec.late_stream
            if late_stream is not None:
                # In the key's commit like any production: exactly once, as the record came.
                self.changes.productions.append(Production(late_stream, record))
                if not self.spec.options.process_late:
                    return
        failure = self._call(
            record.record_id, computation.process_record, record, record.timestamp, self.watermark
        )
        if failure is not None:
            self._record_failed(delivery, failure, record.timestamp)

    def _record_failed(self, delivery: Delivery, error: Exception, timestamp: int) -> None:
        """Keep a record or deletion as a dead letter (its origin made only then)."""
        record = delivery.record
        origin = replace(delivery.origin, record_id=record.record_id, key=self.key)
        self._dead_letter(origin, error, _raw(record), record.record_id, timestamp)

    def _fire_timers(self) -> None:
        computation = self.spec.computation
        for _ in range(self.spec.options.max_timer_firings_per_key):
            timers = effective_timers(self.committed_timers, self.changes).values()
            due = due_timers(timers, self.timer_watermark, self.now)
            if not due:
                return
            timer = due[0]
            # Deleted in the commit that holds its effects, even if the call fails.
            self.changes.timers[timer.tag] = None
            if timer.tag == STATE_TTL_TAG:
                # The input watermark passed the state's last update plus its TTL: the
                # state goes in this commit, and nothing of the key is left after it.
                self.changes.state = None
                self.result.expired += 1
                continue
            failure = self._call(
                timer.identity,
                computation.process_timer,
                timer,
                timer.timestamp,
                self.timer_watermark,
            )
            if failure is not None:
                origin = Origin(key=self.key, timer_tag=timer.tag, timer_timestamp=timer.timestamp)
                self._dead_letter(origin, failure, b"", timer.identity, timer.timestamp)
            self.result.fired_timers.append(timer)

    def _call(
        self,
        cause_id: bytes,
        hook: Callable[[Context, _Cause], None],
        cause: _Cause,
        timestamp: int,
        watermark: int,
    ) -> Exception | None:
        """Run ``hook(context, cause)`` into the key's changes; if it raises, undo what it
        changed and return the exception (the caller dead-letters the cause), so that one bad
        record cannot stop the interval."""
        context = CallContext(self, cause_id, watermark)
        try:
            hook(context, cause)
        except Exception as exc:
            context.undo()
            return exc
        if not self.spec.options.strong_productions:
            productions, before = self.changes.productions, context.productions_before
            made = len(productions) - before
            # The common call makes one production: no slice, no generator for it.
            if made == 1:
                self.weak_outbox.append((self.changes, productions.pop()))
            elif made:
                changes = self.changes
                self.weak_outbox.extend([(changes, p) for p in productions[before:]])
                del productions[before:]
        ttl = self.spec.options.state_ttl
        if ttl is not None and context.state_set:
            state = self.changes.state
            assert state is not UNCHANGED  # the call set or cleared it
            self._renew_ttl(state, timestamp + ttl)
        return None

    def _renew_ttl(self, state: bytes | None, expires: int) -> None:
        """Move the state's expiry to ``expires`` (never earlier: a late record's update does
        not shorten a newer one's), or drop it with the state."""
        current = effective_timers(self.committed_timers, self.changes).get(STATE_TTL_TAG)
        if state is None:
            if current is not None:
                self.changes.timers[STATE_TTL_TAG] = None
            return
        expires = min(max(expires, current.timestamp if current else expires), MAX_EVENT_TIME)
        if current is None or current.timestamp != expires:
            self.changes.timers[STATE_TTL_TAG] = Timer(
                self.key, STATE_TTL_TAG, expires, TimeDomain.EVENT_TIME, b"state-ttl"
            )

    def _dead_letter(
        self, origin: Origin, error: Exception, raw: bytes, cause_id: bytes, timestamp: int
    ) -> None:
        dead_letter = DeadLetter.from_error(self.spec.name, origin, error, raw)
        record = dead_letter.to_record(cause_id, clamp_event_time(timestamp))
        self.changes.productions.append(Production(self.spec.dead_letter_stream, record))
        self.result.dead_letters.append(dead_letter)


class CallContext(Context):
    """The context of one call. It writes into the key's changes of the batch (reads see them
    over the committed state), remembering what it replaced, so that a call that fails is
    undone (:meth:`undo`) without every call making a change set of its own to merge."""

    def __init__(self, run: KeyRun, cause_id: bytes, watermark: int) -> None:
        self._run = run
        self._changes = changes = run.changes
        self._cause_id = cause_id
        self._watermark = watermark
        self._next_index = 0
        self.productions_before = len(changes.productions)
        self._state_before = changes.state
        self.state_set = False
        # The key's timers as they were before this call, for each tag it set or deleted
        # (_NO_CHANGE: the batch had not changed that tag).
        self._timers_before: dict[str, Timer | _NoChange | None] | None = None

    def undo(self) -> None:
        changes = self._changes
        changes.state = self._state_before
        del changes.productions[self.productions_before :]
        for tag, timer in (self._timers_before or {}).items():
            if timer is _NO_CHANGE:
                changes.timers.pop(tag, None)
            else:
                changes.timers[tag] = timer

    @property
    def key(self) -> str:
        return self._run.key

    @property
    def input_low_watermark(self) -> int:
        return self._watermark

    @property
    def clock(self) -> Clock:
        return self._run.clock

    def get_state(self) -> bytes | None:
        state = self._changes.state
        return self._run.committed_state if state is UNCHANGED else state

    def set_state(self, value: bytes) -> None:
        if not isinstance(value, bytes):
            raise TypeError(
                f"state must be bytes, got {type(value).__name__}; use ctx.state(codec) "
                "for typed state"
            )
        self._changes.state = value
        self.state_set = True

    def clear_state(self) -> None:
        self._changes.state = None
        self.state_set = True

    def timer(self, tag: str) -> Timer | None:
        timers = self._changes.timers
        if tag in timers:
            return timers[tag]
        return self._run.committed_timers.get(tag)

    def set_timer(
        self, tag: str, timestamp: int, domain: TimeDomain = TimeDomain.EVENT_TIME
    ) -> None:
        _check_tag(tag)
        self._set_timer(tag, Timer(self.key, tag, timestamp, domain, self._cause_id))

    def delete_timer(self, tag: str) -> None:
        _check_tag(tag)
        self._set_timer(tag, None)

    def _set_timer(self, tag: str, timer: Timer | None) -> None:
        timers = self._changes.timers
        if self._timers_before is None:
            self._timers_before = {}
        if tag not in self._timers_before:
            self._timers_before[tag] = timers.get(tag, _NO_CHANGE)
        timers[tag] = timer

    def produce(self, stream: str, value: bytes, timestamp: int, key: str | None = None) -> Record:
        spec = self._run.spec
        if not spec.writes(stream):
            raise UndeclaredStreamError(
                f"computation {spec.name!r} produced to {stream!r}, which is not among its "
                f"declared outputs {list(spec.outputs)}; declare it in the topology"
            )
        check_event_time(timestamp)
        key = self._run.key if key is None else key
        record_id = production_record_id(spec.name, self._cause_id, self._next_index)
        if type(key) is str and type(value) is bytes and type(timestamp) is int:
            record = unchecked_record(key, value, timestamp, record_id)
        else:  # Record's checks say what is wrong (or take a subclass)
            record = Record(key, value, timestamp, record_id)
        encoded = encode_record(record)
        check_record_size(encoded)
        self._next_index += 1
        self._changes.productions.append(_make_production(stream, record, encoded, self._run.tag))
        return record
