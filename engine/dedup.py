"""Duplicate detection for exactly-once delivery (paper 6.1.1).

A computation records the ID of every record it processed in the same atomic commit as the
record's effects (a *dedup ID*, kept until its TTL: the retry window plus the slack for late
injectors), so a redelivered record is recognised and dropped. Per batch and key:

1. a record repeated within the batch counts once, at its first delivery;
2. the rest are looked up in the store, all keys of the batch in one bulk read of point
   lookups (:meth:`~millstream.engine.store.IntervalStore.seen`).

There is no Bloom filter in front of the lookup. A filter only proves an ID fresh if it holds
every unexpired ID of the interval, which takes reading them all back whenever a worker takes
an interval over, and on Spark that is most batches (a batch's interval lands on whichever
Python worker is free). Point lookups cost in proportion to the batch, never to the interval.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from typing import TypeVar

__all__ = ["first_occurrences", "unseen"]

T = TypeVar("T")


def first_occurrences(
    items: Mapping[str, Iterable[T]], identity: Callable[[T], bytes]
) -> dict[str, dict[bytes, T]]:
    """Per key, each distinct ID's first item, in delivery order."""
    firsts: dict[str, dict[bytes, T]] = {}
    for key, key_items in items.items():
        by_id = firsts.setdefault(key, {})
        for item in key_items:
            by_id.setdefault(identity(item), item)
    return firsts


def unseen(
    firsts: Mapping[str, Mapping[bytes, T]], seen: Set[tuple[str, bytes]]
) -> dict[str, list[T]]:
    """Per key, the items whose ``(key, ID)`` is not among ``seen``."""
    return {
        key: [item for record_id, item in by_id.items() if (key, record_id) not in seen]
        for key, by_id in firsts.items()
    }
