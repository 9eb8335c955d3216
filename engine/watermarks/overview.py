"""The watermark topic at a glance, for ``millstream watermarks``: every source's latest
report, and the expected injector processes that never reported."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from millstream.engine.records import MAX_EVENT_TIME, MIN_EVENT_TIME
from millstream.engine.watermarks.report import ExpectedSet, WatermarkMessage, WatermarkReport

__all__ = ["SourceState", "SourceStatus", "watermark_overview"]


SourceState = Literal["reporting", "complete", "no report yet"]
"""Where a source stands (:class:`SourceStatus`): it reported a time; it reported
``MAX_EVENT_TIME``, the end of time (its input ended: it will write nothing more); or it has
reported no time yet (an expected injector process that is silent, or a report still at
``MIN_EVENT_TIME``, such as an injector's first or a computation's whose inputs have none)."""


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """One source as the watermark topic shows it (``millstream watermarks``).

    ``watermark`` is the time the source reported, ``None`` while it has reported none
    (``state`` "no report yet": it holds its streams at the beginning of time); ``lag`` is wall
    time minus the watermark (µs), never below 0 (a watermark ahead of the clock has no lag),
    and ``None`` unless ``state`` is "reporting": a complete source lags behind nothing.
    """

    source: str
    watermark: int | None
    lag: int | None
    held_by: str
    streams: tuple[str, ...]
    input_watermark: int | None = None
    percentiles: Mapping[float, int] = field(default_factory=dict)
    timer_watermark: int | None = None
    hot: tuple[tuple[int, int], ...] = ()
    state: SourceState = "reporting"


def watermark_overview(
    messages: Iterable[tuple[str, WatermarkMessage | None]], now: int
) -> list[SourceStatus]:
    """Every source's latest report, and the expected injector processes that are silent,
    from the watermark topic's messages in topic order; lowest watermark first."""
    reports: dict[str, WatermarkReport] = {}
    expected: dict[str, ExpectedSet] = {}
    for key, message in messages:
        if message is None:
            reports.pop(key, None)
            expected.pop(key, None)
        elif isinstance(message, ExpectedSet):
            expected[message.key] = message
        elif message.sequence >= getattr(reports.get(message.source), "sequence", -1):
            reports[message.source] = message
    retired = {s for declared in expected.values() for s in declared.retired_sources}
    rows = []
    for source, report in reports.items():
        if source in retired:
            continue
        state = _source_state(report.watermark)
        rows.append(
            SourceStatus(
                source,
                None if state == "no report yet" else report.watermark,
                max(0, now - report.watermark) if state == "reporting" else None,
                report.held_by or "reported",
                report.streams,
                report.input_watermark,
                report.percentiles,
                report.timer_watermark,
                report.hot,
                state,
            )
        )
    for declared in expected.values():
        for source in sorted(declared.sources - reports.keys()):
            rows.append(
                SourceStatus(
                    source,
                    None,
                    None,
                    "expected, never reported: holds",
                    declared.streams,
                    state="no report yet",
                )
            )
    return sorted(rows, key=lambda row: (row.watermark is not None, row.watermark or 0, row.source))


def _source_state(watermark: int) -> SourceState:
    if watermark >= MAX_EVENT_TIME:
        return "complete"
    if watermark <= MIN_EVENT_TIME:
        return "no report yet"
    return "reporting"
