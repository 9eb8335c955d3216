"""The proving ground's workload: its source, and the outcome it is held against."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from millstream.devtools.proving.workload import ProvingSource, Workload, expected_outcome
from millstream.engine.keys import key_interval
from millstream.injectors.source import SourceRecord


@pytest.mark.unit
def test_the_source_is_a_pure_function_of_its_index_and_honours_its_gate(tmp_path: Path) -> None:
    workload = Workload(records=50, keys=3, seed=1, rate=10_000.0, malformed_every=5)
    gate = tmp_path / "gate"
    gate.write_text("20")
    source = ProvingSource(workload, "events", gate=gate)
    source.open(None)
    sent: list[SourceRecord] = []
    while len(sent) < 20:
        sent.extend(source.poll(0.0).records)
    assert len(sent) == 20
    assert not source.poll(0.0).records  # the gate holds
    gate.write_text("50")
    source.open({"next": 20})  # as after a restart from the checkpoint
    while not (poll := source.poll(0.0)).exhausted:
        sent.extend(poll.records)
    assert [r.offset for r in sent] == list(range(50))
    assert [r.value for r in sent] == [workload.value(i) for i in range(50)]
    expected = expected_outcome(workload)
    assert expected.malformed == {i for i in range(50) if workload.malformed(i)}
    assert 0 < len(expected.malformed) < 50
    assert sum(len(s) for s in expected.sequences.values()) == 50 - len(expected.malformed)


@pytest.mark.unit
def test_a_poisoned_record_is_no_part_of_the_expected_fold() -> None:
    workload = Workload(records=200, keys=5, seed=4, rate=100.0)
    whole = expected_outcome(workload)
    index = next(i for i in range(100, 200) if not workload.malformed(i))
    poisoned = expected_outcome(workload, [index], tombstones=3)
    assert poisoned.poisoned == {index}
    assert poisoned.tombstones == 3
    key, window = workload.key(index), workload.window_of(workload.timestamp(index))
    assert poisoned.sequences[key] == whole.sequences[key] - {workload.sequence(index)}
    assert poisoned.windows[key][window] == whole.windows[key][window] - 1
    assert poisoned.malformed == whole.malformed


@pytest.mark.unit
def test_a_skewed_workload_puts_its_share_on_one_hash_range_and_counts_each_key_on() -> None:
    workload = Workload(records=4_000, keys=20, seed=3, rate=100.0, hot_share=0.8)
    assert Workload.from_json(workload.to_json()) == workload
    keys = [workload.key(i) for i in range(workload.records)]
    hot = sum(key_interval(k, 4) == 0 for k in keys) / len(keys)
    assert 0.8 <= hot <= 0.9  # the hot share, plus the uniform rest's part of that range
    per_key: Counter[str] = Counter()
    for index, key in enumerate(keys):
        assert workload.sequence(index) == per_key[key]
        per_key[key] += 1
    assert len(per_key) == 20  # the cold keys still get records
    expected = expected_outcome(workload)
    assert sum(len(s) for s in expected.sequences.values()) == 4_000 - len(expected.malformed)
    assert keys == [Workload.from_json(workload.to_json()).key(i) for i in range(4_000)]
    with pytest.raises(ValueError, match="hot_share"):
        Workload(records=1, keys=1, seed=1, rate=1.0, hot_share=1.0)
