"""Low watermarks (paper 4.5, 7.2): what bounds the timestamps of a stream's future records.

A *source* is anything that writes to streams and promises something about the timestamps of
what it will still write: a computation (one per topology) or an injector process. It
publishes :class:`WatermarkReport` messages to the compacted watermark topic, keyed by its
name, so the topic keeps each source's latest report. A report says: *after the Kafka offsets
in* ``offsets`` *I will write no record to* ``streams`` *older than* ``watermark`` (whatever
I write older is late).

A consumer (:class:`InputWatermark`) applies a report only once it has consumed its input
topics up to the report's offsets, so a report never overtakes the records it speaks for:
everything the source wrote before the report has been delivered by then. Its input low
watermark is then::

    input(C) = max(previous input(C),
                   min over C's input streams S of min over the sources of S of applied(source, S))

where ``applied(source, S)`` is the highest watermark of the source's applied reports, for the
streams its latest applied report names. A stream that no source reported holds its consumers
at ``MIN_EVENT_TIME``, as does a source the topology expects (a producing computation) that
has not reported it yet. Watermarks never move backwards: per source and stream the applied
value only grows, and a consumer's input watermark is floored by the value it reported before
a restart.

A computation's own low watermark, which it reports for its output streams, is::

    watermark(C) = min(input(C), oldest pending work of any of C's key intervals)

where pending work is an event-time timer or a production not yet acknowledged by Kafka
(:class:`IntervalProgress`). Intervals that did not run in a batch hold their last value.

Cycles: a computation ignores its own reports on its input (a self-loop would otherwise pin
its watermark where it started); a longer cycle holds the watermark of its members.

Injectors run as several processes (paper 5.2). An :class:`ExpectedSet`, keyed by
:func:`injector_group` on the same topic, names the processes of one injector and its
streams: every expected process holds those streams until it reported (a silent one holds
them at its last report), and a retired process holds nothing and is ignored for good.

The package, one module per part: :mod:`~millstream.engine.watermarks.report` (the topic's
messages and their wire format), :mod:`~millstream.engine.watermarks.input` (a consumer's input
watermark), :mod:`~millstream.engine.watermarks.intervals` (its intervals' pending work) and
:mod:`~millstream.engine.watermarks.load` (their load),
:mod:`~millstream.engine.watermarks.computation` (a computation's bookkeeping, batch by
batch), and :mod:`~millstream.engine.watermarks.overview` (``millstream watermarks``). The
topic itself is :mod:`millstream.engine.watermark_topic`.
"""

from millstream.engine.watermarks.computation import (
    ComputationWatermarks,
    ReportReader,
    computation_watermark,
)
from millstream.engine.watermarks.input import Hold, InputWatermark, offsets_reached
from millstream.engine.watermarks.intervals import IntervalMap, IntervalProgress
from millstream.engine.watermarks.load import IntervalLoad
from millstream.engine.watermarks.overview import SourceState, SourceStatus, watermark_overview
from millstream.engine.watermarks.report import (
    BEHIND,
    REPORT_VERSION,
    ExpectedSet,
    Offsets,
    WatermarkMessage,
    WatermarkReport,
    computation_source,
    decode_watermark_message,
    injector_group,
    injector_source,
    latest_expected_set,
    parse_injector_source,
)

__all__ = [
    "BEHIND",
    "REPORT_VERSION",
    "ComputationWatermarks",
    "ExpectedSet",
    "Hold",
    "InputWatermark",
    "IntervalLoad",
    "IntervalMap",
    "IntervalProgress",
    "Offsets",
    "ReportReader",
    "SourceState",
    "SourceStatus",
    "WatermarkMessage",
    "WatermarkReport",
    "computation_source",
    "computation_watermark",
    "decode_watermark_message",
    "injector_group",
    "injector_source",
    "latest_expected_set",
    "offsets_reached",
    "parse_injector_source",
    "watermark_overview",
]
