"""The log-file source on real files, driven by the injector process over memory endpoints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from millstream.engine.clock import ManualClock
from millstream.engine.records import MAX_EVENT_TIME
from millstream.injectors import InjectorOptions, LogFileSource, LogLine
from millstream.injectors.testing import InjectorHarness, injector_harness

pytestmark = pytest.mark.unit

SECOND = 1_000_000


def parse(line: str) -> LogLine:
    """``<seconds> <key> <value>``."""
    seconds, key, value = line.split(" ", 2)
    return LogLine(int(seconds) * SECOND, key, value.encode())


def write(path: Path, *lines: str, end: str = "\n") -> None:
    with path.open("a") as handle:
        handle.write("\n".join(lines) + end)


def touch_later(path: Path, seconds: int) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + seconds * 1_000_000_000))


def logs(harness: InjectorHarness) -> list[str]:
    return [r.value.decode() for r in harness.records("lines")]


def harness_for(directory: Path, **options: object) -> InjectorHarness:
    source = LogFileSource(directory, parse, "lines", **options)  # type: ignore[arg-type]
    harness = injector_harness("logs", source)
    harness.process.start()
    return harness


def test_lines_become_records_and_a_partial_line_waits_for_its_end(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, "1 a one", "2 b two", "3 a thr", end="")
    harness = harness_for(tmp_path)
    harness.process.step()
    assert logs(harness) == ["one", "two"]
    write(log, "ee")
    harness.process.step()
    assert logs(harness) == ["one", "two", "three"]
    assert [r.key for r in harness.records("lines")] == ["a", "b", "a"]
    assert [r.timestamp for r in harness.records("lines")] == [SECOND, 2 * SECOND, 3 * SECOND]


def test_a_restart_resumes_at_the_checkpointed_offset(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, "1 a one", "2 a two")
    harness = harness_for(tmp_path)
    harness.process.step()
    write(log, "3 a three")
    harness.restart(LogFileSource(tmp_path, parse, "lines"))
    harness.process.step()
    assert logs(harness) == ["one", "two", "three"]
    assert len(harness.sink.sent) == 3  # nothing read twice


def test_rotation_keeps_reading_the_renamed_file_and_picks_up_the_new_one(
    tmp_path: Path,
) -> None:
    log = tmp_path / "app.log"
    write(log, "1 a one")
    harness = harness_for(tmp_path)
    harness.process.step()
    write(log, "2 a two")  # written just before rotation, not read yet
    log.rename(tmp_path / "app.log.1")
    write(log, "3 a three")
    touch_later(log, 5)
    harness.process.step()
    assert logs(harness) == ["one", "two", "three"]
    # A restart after rotation reads nothing twice either.
    harness.restart(LogFileSource(tmp_path, parse, "lines"))
    harness.process.step()
    assert len(harness.sink.sent) == 3


def test_bad_lines_are_dead_letters_with_file_and_offset(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    log.write_bytes(b"1 a one\nnot a number\n\xff\xfe\n2 a two\n")
    harness = harness_for(tmp_path)
    harness.process.step()
    assert logs(harness) == ["one", "two"]
    letters = harness.dead_letters()
    assert [(d.origin.offset, d.error_type) for d in letters] == [
        (8, "ValueError"),
        (21, "UnicodeDecodeError"),
    ]
    assert letters[0].raw == b"not a number"
    # The origin names the file by identity: its inode, then a digest of its first line.
    assert str(letters[0].origin.stream).startswith(f"{log.stat().st_ino}-")


def test_the_watermark_is_the_oldest_first_event_of_unfinished_files(tmp_path: Path) -> None:
    old = tmp_path / "a.log"
    write(old, "100 a x", "150 a y")
    harness = harness_for(tmp_path)
    harness.process.step()
    assert harness.process.watermark == 100 * SECOND  # the active file's first event
    new = tmp_path / "b.log"
    write(new, "200 a z", "260 a w")
    touch_later(new, 5)
    harness.process.step()
    # a.log is read to its end and older than b.log: finished; b.log holds at its first.
    assert harness.process.watermark == 200 * SECOND


def test_bounded_out_of_orderness_follows_the_highest_event(tmp_path: Path) -> None:
    write(tmp_path / "a.log", "100 a x", "150 a y", "120 a late")
    harness = harness_for(tmp_path, out_of_order=10 * SECOND)
    harness.process.step()
    assert harness.process.watermark == 140 * SECOND


def test_an_idle_directory_moves_the_watermark_with_the_clock(tmp_path: Path) -> None:
    write(tmp_path / "a.log", "100 a x")
    clock = ManualClock(1_000 * SECOND)
    source = LogFileSource(
        tmp_path, parse, "lines", out_of_order=SECOND, idle_after=5 * SECOND, clock=clock
    )
    harness = injector_harness("logs", source, clock=clock)
    harness.process.start()
    harness.process.step()
    assert harness.process.watermark == 99 * SECOND
    clock.advance(5 * SECOND)
    harness.process.step()
    assert harness.process.watermark == 1_004 * SECOND


def test_a_replay_is_exhausted_once_every_file_is_read(tmp_path: Path) -> None:
    write(tmp_path / "a.log", "1 a one", "2 a two")
    write(tmp_path / "b.log", "3 a three", "4 a four", end="")  # unterminated last line
    source = LogFileSource(tmp_path, parse, "lines", follow=False, max_bytes_per_poll=10)
    harness = injector_harness("logs", source, InjectorOptions(poll_timeout=0))
    stats = harness.process.run(until_exhausted=True)
    assert sorted(logs(harness)) == ["four", "one", "three", "two"]
    assert stats.polls == 2  # the byte budget left b.log for a second poll
    assert harness.process.watermark == MAX_EVENT_TIME


def test_a_truncated_file_is_new_content_with_new_ids(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, "1 a one", "2 a two")
    harness = harness_for(tmp_path)
    harness.process.step()
    first_ids = {r.record_id for r in harness.records("lines")}
    log.write_text("1 a one\n")  # copytruncate, then the same first line again
    touch_later(log, 5)
    harness.process.step()
    assert logs(harness) == ["one", "two", "one"]
    assert harness.records("lines")[2].record_id not in first_ids
