"""The proving ground's faults: a seed's schedule, and where each fault parks a process."""

from __future__ import annotations

import pytest

from millstream.devtools.proving.faults import (
    CRASHES,
    FAULTS,
    PAUSES,
    TIERS,
    TRANSACTION_FAULTS,
    WORKER_KILLS,
    Fault,
    Tier,
    pause_point,
    run_kinds,
    schedule,
)
from millstream.engine.pause_points import PLACES


@pytest.mark.unit
def test_a_seed_gives_one_schedule_with_every_kind_the_tier_asks_for() -> None:
    tier = Tier(records=100, keys=2, rate=10.0, faults=3)
    first = schedule(7, tier)
    assert first == schedule(7, tier)
    assert first != schedule(8, tier)
    assert sorted(f.kind for f in first) == sorted(list(FAULTS) * 3)
    ci = tuple(k for k in CRASHES if k != "driver-send")  # driver-transaction covers it there
    assert sorted(f.kind for f in schedule(7, TIERS["ci"])) == sorted(ci)
    # Every tier crashes on the transactional path too.
    for name, each in TIERS.items():
        assert set(TRANSACTION_FAULTS) <= set(each.kinds), name
    assert run_kinds(TIERS["ci"], None) == ci
    assert run_kinds(TIERS["ci"], ("zombie",)) == ("zombie",)
    assert {f.computation for f in first if f.kind in TRANSACTION_FAULTS} == {"tally"}


@pytest.mark.unit
def test_the_transaction_faults_park_at_the_engines_transaction_pause_points() -> None:
    places = {
        k: pause_point(f) for k, f in ((k, Fault(k, "tally", 0.0)) for k in TRANSACTION_FAULTS)
    }
    assert places == {
        "driver-transaction": "executor.transaction",
        "worker-transaction": "executor.transaction",
        "driver-delivered": "executor.delivered",
    }
    assert set(PAUSES.values()) <= PLACES.keys()
    assert "worker-transaction" in WORKER_KILLS
    assert not {"driver-transaction", "driver-delivered"} & set(WORKER_KILLS)
