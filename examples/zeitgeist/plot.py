"""One PNG per query: traffic, the model's expectation, labelled windows and detections."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zeitgeist.evaluation import Collected, JobInput

__all__ = ["plot_queries"]


def _when(micros: int) -> float:
    """Matplotlib's date number of ``micros`` µs since the epoch (days since 1970)."""
    from matplotlib.dates import date2num

    return float(date2num(datetime.fromtimestamp(micros / 1_000_000, UTC)))  # type: ignore[no-untyped-call]


def plot_queries(job: JobInput, collected: Collected, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for one in job.series:
        figure, axis = plt.subplots(figsize=(14, 4.5))
        axis.xaxis_date()
        buckets = sorted(one.counts)
        axis.plot(
            [_when(b) for b in buckets],
            [one.counts[b] for b in buckets],
            color="0.55",
            linewidth=0.6,
            label="searches per 5 min",
        )
        predictions = collected.predictions.get(one.query, [])
        axis.plot(
            [_when(int(p["bucket"])) for p in predictions],
            [float(p["expected"]) for p in predictions],
            color="tab:green",
            linewidth=0.9,
            label="model (expected)",
        )
        for number, (start, end) in enumerate(one.windows):
            axis.axvspan(
                _when(start),
                _when(end),
                color="gold",
                alpha=0.3,
                label="labelled window" if number == 0 else None,
            )
        for kind, colour, marker in (("spike", "tab:red", "^"), ("dip", "tab:blue", "v")):
            found = [
                a for a in collected.anomalies if a["query"] == one.query and a["kind"] == kind
            ]
            if found:
                axis.scatter(
                    [_when(int(a["bucket"])) for a in found],
                    [a["observed"] for a in found],
                    color=colour,
                    marker=marker,
                    s=60,
                    zorder=5,
                    label=f"{kind} detected",
                )
        axis.set_title(f"Zeitgeist: {one.query} ({job.name})")
        axis.set_ylabel(f"searches per {job.bucket // 60_000_000} minutes")
        axis.legend(loc="upper left", fontsize="small")
        figure.autofmt_xdate()
        figure.tight_layout()
        path = directory / f"{job.name}-{one.query}.png"
        figure.savefig(path, dpi=90)
        plt.close(figure)
        written.append(path)
    return written
