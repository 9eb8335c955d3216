"""The log-file source on real files, driven by the injector process over memory endpoints."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from millstream.engine.clock import ManualClock
from millstream.engine.deadletters import MAX_RAW_BYTES
from millstream.engine.records import MAX_EVENT_TIME
from millstream.injectors import InjectorOptions, LineParser, LogFileSource, LogLine, logfile
from millstream.injectors.logfile import DEFAULT_MAX_LINE_BYTES
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


# -- bad input: one dead letter per bad line, with its file and byte offset; nothing good lost


def origins(harness: InjectorHarness) -> list[tuple[str | None, int | None, str]]:
    return [(d.origin.stream, d.origin.offset, d.error_type) for d in harness.dead_letters()]


def identity_of(path: Path) -> str:
    """The origin a dead letter names a file by: the identity its records' IDs derive from."""
    return str(path.stat().st_ino)


def test_invalid_utf8_and_binary_junk_are_one_dead_letter_per_line(tmp_path: Path) -> None:
    junk = random.Random(7).randbytes(300).replace(b"\n", b"") + b"\r\x00\x00\r"
    lines = [b"1 a one", b"\xff\xfe invalid utf-8", b"\x00" * 64, junk, b"2 a two"]
    (tmp_path / "app.log").write_bytes(b"\n".join(lines) + b"\n")
    harness = harness_for(tmp_path)
    harness.process.step()
    assert logs(harness) == ["one", "two"]
    starts = [sum(len(line) + 1 for line in lines[:n]) for n in range(len(lines))]
    assert [(offset, error) for _, offset, error in origins(harness)] == [
        (starts[1], "UnicodeDecodeError"),
        (starts[2], "ValueError"),  # NULs are valid UTF-8: parse rejects them
        (starts[3], "UnicodeDecodeError"),  # one line, \r and all
    ]
    assert harness.dead_letters()[2].raw == junk.removesuffix(b"\r")
    # The origin names the file by identity, the one its good records' IDs derive from;
    # the message by its path.
    (stream,) = {stream for stream, _, _ in origins(harness)}
    assert str(stream).startswith(identity_of(tmp_path / "app.log") + "-")
    message = harness.dead_letters()[0].error_message
    assert message.startswith(f"{tmp_path / 'app.log'} at byte {starts[1]}: 'utf-8' codec")


def test_a_carriage_return_ends_a_line_only_before_its_newline(tmp_path: Path) -> None:
    (tmp_path / "app.log").write_bytes(b"1 a crlf\r\n2 a in\rside\n")
    harness = harness_for(tmp_path)
    harness.process.step()
    assert logs(harness) == ["crlf", "in\rside"]
    assert harness.dead_letters() == []


# The three polls of the test below, in a process of its own: tracemalloc counts every
# thread's allocations, and a test process's other threads (a session's Kafka and Cassandra
# clients) allocate meanwhile. Prints the peak of traced memory, in bytes.
PEAK_OF_A_HUGE_LINE = """
import sys
import tracemalloc
from pathlib import Path

from tests.injectors.test_logfile import harness_for

harness = harness_for(Path(sys.argv[1]))
tracemalloc.start()
for _ in range(3):
    harness.process.step()
print(tracemalloc.get_traced_memory()[1])
"""


def test_a_10_mb_line_is_one_dead_letter_with_its_prefix_and_never_held_whole(
    tmp_path: Path,
) -> None:
    huge = b"2 a " + b"z" * (10 * 1024 * 1024)
    (tmp_path / "app.log").write_bytes(b"1 a one\n" + huge + b"\n3 a three\n")
    harness = harness_for(tmp_path)
    harness.process.step()
    harness.process.step()
    harness.process.step()
    assert logs(harness) == ["one", "three"]
    assert origins(harness) == [(origins(harness)[0][0], 8, "OversizedRecordError")]
    letter = harness.dead_letters()[0]
    assert letter.raw == huge[: min(DEFAULT_MAX_LINE_BYTES, MAX_RAW_BYTES)]
    assert "max_line_bytes" in letter.error_message
    # The line is read a bounded piece at a time: a few times the line limit at most.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(tmp_path / "app.log", fresh / "app.log")
    measured = subprocess.run(
        [sys.executable, "-c", PEAK_OF_A_HUGE_LINE, str(fresh)],
        cwd=Path(__file__).resolve().parents[2],  # where `tests` imports from
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert measured.returncode == 0, measured.stderr[-3000:]
    peak = int(measured.stdout.split()[-1])
    assert peak < 4 * DEFAULT_MAX_LINE_BYTES, f"peak {peak} bytes"


def test_an_oversized_line_still_being_written_is_skipped_across_polls_and_restarts(
    tmp_path: Path,
) -> None:
    log = tmp_path / "app.log"
    log.write_bytes(b"1 a one\n" + b"x" * 250)
    source = LogFileSource(tmp_path, parse, "lines", max_line_bytes=100)
    harness = injector_harness("logs", source)
    harness.process.start()
    harness.process.step()
    with log.open("ab") as handle:
        handle.write(b"y" * 300)
    harness.process.step()
    harness.restart(LogFileSource(tmp_path, parse, "lines", max_line_bytes=100))
    harness.process.step()
    with log.open("ab") as handle:
        handle.write(b"z" * 30 + b"\n2 a two\n")
    harness.process.step()
    assert logs(harness) == ["one", "two"]
    assert [(offset, error) for _, offset, error in origins(harness)] == [
        (8, "OversizedRecordError")
    ]
    assert harness.dead_letters()[0].raw == b"x" * 100


def test_what_parse_returns_is_checked_before_it_moves_the_watermark(tmp_path: Path) -> None:
    def typed(line: str) -> object:
        kind, seconds = line.split(" ")
        at = int(seconds) * SECOND
        return {
            "ok": LogLine(at, "k", b"ok"),
            "ns": LogLine(at * 1_000_000_000, "k", b"ns"),  # a unit mistake: out of range
            "float": LogLine(float(at), "k", b""),  # type: ignore[arg-type]
            "key": LogLine(at, None, b""),  # type: ignore[arg-type]
            "value": LogLine(at, "k", "text"),  # type: ignore[arg-type]
            "dict": {"at": at},
        }[kind]

    (tmp_path / "app.log").write_text(
        "ok 100\nns 9999999999\nfloat 500\nkey 600\nvalue 700\ndict 800\nok 110\n"
    )
    parse_anything: LineParser = typed  # type: ignore[assignment]
    source = LogFileSource(tmp_path, parse_anything, "lines", out_of_order=10 * SECOND)
    harness = injector_harness("logs", source)
    harness.process.start()
    harness.process.step()
    assert [r.value for r in harness.records("lines")] == [b"ok", b"ok"]
    assert [error for _, _, error in origins(harness)] == [
        "AbsurdTimestampError",
        "TypeError",
        "TypeError",
        "TypeError",
        "TypeError",
    ]
    assert harness.process.watermark == 100 * SECOND  # the highest good event, minus 10 s


def test_copytruncate_reads_the_copy_s_unread_rest_once_and_the_live_file_from_0(
    tmp_path: Path,
) -> None:
    log = tmp_path / "app.log"
    write(log, "1 a one", "2 a two")
    harness = harness_for(tmp_path)
    harness.process.step()
    write(log, "3 a three")  # written just before the rotation, not read yet
    shutil.copyfile(log, tmp_path / "app.log.1")  # logrotate's copytruncate: copy, then
    with log.open("r+") as handle:  # truncate in place; the writer goes on at 0
        handle.truncate(0)
    write(log, "4 a four")
    touch_later(log, 5)
    harness.process.step()
    harness.process.step()
    assert logs(harness) == ["one", "two", "three", "four"]
    assert len({r.record_id for r in harness.records("lines")}) == 4
    assert len(harness.sink.sent) == 4  # nothing sent twice either
    # A restart reads nothing again.
    harness.restart(LogFileSource(tmp_path, parse, "lines"))
    harness.process.step()
    assert len(harness.sink.sent) == 4


def test_a_copy_seen_before_its_original_is_truncated_is_read_once(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, "1 a one", "2 a two")
    harness = harness_for(tmp_path)
    harness.process.step()
    write(log, "3 a three")
    copy = tmp_path / "app.log.1"
    shutil.copyfile(log, copy)
    touch_later(copy, 5)  # the copy is newer than the file it copies
    harness.process.step()  # the copy exists, the original is not truncated yet
    with log.open("r+") as handle:
        handle.truncate(0)
    write(log, "4 a four")
    touch_later(log, 10)
    harness.process.step()
    harness.process.step()
    assert logs(harness) == ["one", "two", "three", "four"]
    assert len(harness.sink.sent) == 4


def test_a_file_truncated_and_refilled_past_its_offset_is_read_from_0(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, "1 a one", "2 a two")
    harness = harness_for(tmp_path)
    harness.process.step()
    log.write_text("1 a one\n3 a new-three\n4 a new-four\n")  # same first line, longer
    harness.process.step()
    harness.process.step()
    harness.process.step()
    assert logs(harness) == ["one", "two", "one", "new-three", "new-four"]
    assert len({r.record_id for r in harness.records("lines")}) == 5
    assert len(harness.sink.sent) == 5  # the new content is not read again either


def test_rotation_in_the_middle_of_a_file_drains_it_then_reads_the_new_one(
    tmp_path: Path,
) -> None:
    log = tmp_path / "app.log"
    write(log, *(f"{n} a old-{n}" for n in range(1, 41)))
    source = LogFileSource(tmp_path, parse, "lines", max_bytes_per_poll=50)
    harness = injector_harness("logs", source)
    harness.process.start()
    harness.process.step()  # part of the file read
    log.rename(tmp_path / "app.log.1")
    write(log, "50 a new-50")
    touch_later(log, 5)
    for _ in range(30):
        harness.process.step()
    assert logs(harness) == [f"old-{n}" for n in range(1, 41)] + ["new-50"]
    assert len(harness.sink.sent) == 41


def test_a_file_deleted_while_read_costs_only_its_unread_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    doomed = tmp_path / "a.log"
    write(doomed, *(f"{n} a a-{n}" for n in range(1, 21)))
    source = LogFileSource(tmp_path, parse, "lines", max_bytes_per_poll=30)
    harness = injector_harness("logs", source)
    harness.process.start()
    harness.process.step()
    read_before = len(logs(harness))
    doomed.unlink()
    write(tmp_path / "b.log", "30 b b-30")
    harness.process.step()
    harness.process.step()
    assert logs(harness) == [f"a-{n}" for n in range(1, read_before + 1)] + ["b-30"]
    assert "vanished before it was read to its end" in caplog.text
    assert harness.dead_letters() == []


def test_a_rotated_file_written_again_is_read_again(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, "1 a one")
    harness = harness_for(tmp_path)
    harness.process.step()
    log.rename(tmp_path / "app.log.1")
    write(log, "5 a new")
    touch_later(log, 5)
    harness.process.step()  # app.log.1 read to its end, older than app.log: finished
    write(tmp_path / "app.log.1", "2 a straggler")  # the writer had not reopened yet
    touch_later(log, 10)
    harness.process.step()
    assert sorted(logs(harness)) == ["new", "one", "straggler"]


def test_a_file_rotated_between_the_scan_and_the_read_is_not_read_as_the_old_one(
    tmp_path: Path,
) -> None:
    log = tmp_path / "app.log"
    write(log, "1 a one", "2 a two")

    class RotatedAfterScan(LogFileSource):
        """Rotates ``app.log`` right after its next scan found it, as logrotate might."""

        rotate = False

        def _scan(self) -> Any:
            found = super()._scan()
            if self.rotate:
                self.rotate = False
                write(log, "3 a three")
                log.rename(tmp_path / "app.log.1")
                write(log, "10 b ten", "11 b eleven", "12 b twelve")
                touch_later(log, 5)
            return found

    source = RotatedAfterScan(tmp_path, parse, "lines")
    harness = injector_harness("logs", source)
    harness.process.start()
    harness.process.step()
    source.rotate = True
    for _ in range(3):
        harness.process.step()
    assert logs(harness) == ["one", "two", "three", "ten", "eleven", "twelve"]
    assert harness.dead_letters() == []


def copytruncate(log: Path, copy: Path, *new_lines: str) -> None:
    shutil.copyfile(log, copy)
    with log.open("r+") as handle:
        handle.truncate(0)
    write(log, *new_lines)
    touch_later(log, 5)


def test_a_file_truncated_while_a_scan_looks_at_it_is_read_once_from_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "app.log"
    write(log, "1 a one", "2 a two")
    harness = harness_for(tmp_path)
    harness.process.step()
    write(log, "3 a three")
    look = logfile._look
    armed = [True]

    def look_then_rotate(path: Path, *, complete: bool) -> Any:
        seen = look(path, complete=complete)
        if armed[0] and path == log:
            armed[0] = False  # its first line is the old one; what follows is not
            copytruncate(log, tmp_path / "app.log.1", "10 b ten", "11 b eleven")
        return seen

    monkeypatch.setattr(logfile, "_look", look_then_rotate)
    for _ in range(3):
        harness.process.step()
    assert logs(harness) == ["one", "two", "three", "ten", "eleven"]
    assert len(harness.sink.sent) == 5


def test_a_file_renamed_while_a_scan_lists_the_directory_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "app.log"
    write(log, "1 a one", "2 a two")
    harness = harness_for(tmp_path)
    harness.process.step()
    look = logfile._look
    armed = [True]

    def rotate_then_look(path: Path, *, complete: bool) -> Any:
        if armed[0] and path == log:
            armed[0] = False  # listed as app.log, gone by the time it is opened
            log.rename(tmp_path / "app.log.1")
        return look(path, complete=complete)

    monkeypatch.setattr(logfile, "_look", rotate_then_look)
    harness.process.step()  # finds neither name
    write(log, "10 b ten")
    touch_later(log, 5)
    harness.process.step()
    harness.process.step()
    assert logs(harness) == ["one", "two", "ten"]
    assert len(harness.sink.sent) == 3


def test_a_copy_whose_original_is_truncated_while_a_scan_compares_them_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, copy = tmp_path / "app.log", tmp_path / "app.log.1"
    write(log, "1 a one", "2 a two")
    harness = harness_for(tmp_path)
    harness.process.step()
    write(log, "3 a three")
    shutil.copyfile(log, copy)  # the first half of a copytruncate
    look = logfile._look
    armed = [True]

    def look_then_truncate(path: Path, *, complete: bool) -> Any:
        seen = look(path, complete=complete)
        if armed[0] and path == copy:
            armed[0] = False  # the second half, before the scan compares the two
            with log.open("r+") as handle:
                handle.truncate(0)
            write(log, "10 b ten", "11 b eleven", "12 b twelve")  # longer than the copy
            touch_later(log, 5)
        return seen

    monkeypatch.setattr(logfile, "_look", look_then_truncate)
    for _ in range(3):
        harness.process.step()
    assert logs(harness) == ["one", "two", "three", "ten", "eleven", "twelve"]
    assert len(harness.sink.sent) == 6


def test_a_file_truncated_while_it_is_read_is_carried_on_by_its_copy(tmp_path: Path) -> None:
    log, copy = tmp_path / "app.log", tmp_path / "app.log.1"
    write(log, "1 a one", "2 a two")

    class TruncatedWhileRead(LogFileSource):
        """Rotates ``app.log`` by copytruncate right after it read line 3."""

        def _take(self, *args: Any) -> None:
            super()._take(*args)
            if args[1].startswith(b"3 "):
                copytruncate(log, copy, "10 b ten")

    harness = injector_harness("logs", TruncatedWhileRead(tmp_path, parse, "lines"))
    harness.process.start()
    harness.process.step()
    write(log, "3 a three", "4 a four")
    for _ in range(3):
        harness.process.step()
    assert logs(harness) == ["one", "two", "three", "four", "ten"]
    assert len(harness.sink.sent) == 5
