import sys
import threading

import pytest

from millstream.engine.cache import StateCache, _size
from millstream.engine.store import KeySnapshot
from millstream.engine.timers import Timer

pytestmark = pytest.mark.unit


def snapshot(size: int) -> KeySnapshot:
    return KeySnapshot(b"x" * size)


def test_entries_are_per_scope() -> None:
    cache = StateCache()
    first, second = cache.new_scope(), cache.new_scope()
    cache.put(first, "k", snapshot(1))
    assert cache.get(first, "k") == snapshot(1)
    assert cache.get(second, "k") is None
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)


def test_the_byte_budget_evicts_the_least_recently_used() -> None:
    cache = StateCache(max_bytes=3_000)
    scope = cache.new_scope()
    for key in "abcd":
        cache.put(scope, key, snapshot(500))
    assert cache.bytes <= 3_000
    assert len(cache) == 3  # each entry is 500 bytes of state plus overhead
    assert cache.get(scope, "a") is None  # the oldest went first
    cache.get(scope, "b")  # now the most recently used
    cache.put(scope, "e", snapshot(500))
    assert cache.get(scope, "b") is not None
    assert cache.get(scope, "c") is None
    assert cache.stats.evictions == 2


def test_replacing_an_entry_recounts_its_bytes() -> None:
    cache = StateCache(max_bytes=10_000)
    scope = cache.new_scope()
    cache.put(scope, "k", snapshot(5_000))
    big = cache.bytes
    cache.put(scope, "k", snapshot(10))
    assert cache.bytes == big - 4_990
    cache.put(scope, "k", KeySnapshot(None, {"t": Timer("k", "t", 1)}))
    assert cache.get(scope, "k") == KeySnapshot(None, {"t": Timer("k", "t", 1)})


def test_an_entry_over_the_budget_is_not_kept_and_zero_disables() -> None:
    cache = StateCache(max_bytes=1_000)
    scope = cache.new_scope()
    cache.put(scope, "k", snapshot(2_000))
    assert len(cache) == 0
    assert cache.bytes == 0
    off = StateCache(max_bytes=0)
    off.put(scope, "k", snapshot(0))
    assert off.get(scope, "k") is None
    with pytest.raises(ValueError, match="non-negative"):
        StateCache(max_bytes=-1)


def test_threads_sharing_the_cache_keep_its_byte_count_exact() -> None:
    cache = StateCache(max_bytes=20_000)
    snapshot = KeySnapshot(b"x" * 50, {})

    errors: list[BaseException] = []

    def churn(thread: int) -> None:
        try:
            for n in range(3_000):
                cache.put(1, f"t{thread}-{n % 300}", snapshot)
                cache.get(1, f"t{thread}-{(n * 7) % 300}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(t,)) for t in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, inside the read-modify-writes too
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert cache.bytes <= cache.max_bytes
    assert cache.bytes == sum(
        _size(key, cache.get(scope, key) or snapshot) for scope, key in list(cache._entries)
    )
