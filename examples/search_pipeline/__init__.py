"""A two-stage pipeline keyed two ways (the paper's shuffle), for tests, benchmarks and users.

Stage 1 (``per_user_<suffix>``) reads search events from ``searches_<suffix>``, keys them by
the user named in their JSON value, counts searches per user and produces ``(query, 1)``
keyed by query to ``hits_<suffix>``; stage 2 (``per_query_<suffix>``) keys those by query,
counts them and remembers the ID of every record it counted, so a test can tell that each
was counted once. Run it with::

    SEARCH_PIPELINE_SUFFIX=demo millstream run search_pipeline:topology --available-now

from ``examples/`` (``millstream run`` imports modules from the working directory).
"""

from __future__ import annotations

import json
import os
from typing import Any

from millstream.engine import (
    Computation,
    ComputationOptions,
    Context,
    JsonCodec,
    Record,
    Topology,
)

__all__ = ["CountPerQuery", "CountPerUser", "names", "pipeline_topology", "topology", "user_of"]

JSON = JsonCodec()


def user_of(record: Record) -> str:
    """Stage 1's key extractor: the user named in the event's JSON value."""
    return str(json.loads(record.value)["user"])


class CountPerUser(Computation):
    """Counts searches per user; produces each search's query, keyed by the query.

    An event with ``"fail": true`` raises, to show that user errors become dead letters.
    """

    def __init__(self, output: str) -> None:
        self.output = output

    def process_record(self, ctx: Context, record: Record) -> None:
        event = json.loads(record.value)
        if event.get("fail"):
            raise ValueError(f"asked to fail on {record.record_id.hex()}")
        count = ctx.state(JSON)
        count.set(count.get(0) + 1)
        ctx.produce(self.output, b"1", record.timestamp, key=event["query"])


class CountPerQuery(Computation):
    """Counts per query and remembers the ID of every record counted."""

    def process_record(self, ctx: Context, record: Record) -> None:
        state = ctx.state(JSON)
        current: dict[str, Any] = state.get({"count": 0, "ids": []})
        current["count"] += int(record.value)
        current["ids"].append(record.record_id.hex())
        state.set(current)


def names(suffix: str) -> dict[str, str]:
    """The stream and computation names of the pipeline with ``suffix``."""
    return {
        "topology": f"pipeline_{suffix}",
        "searches": f"searches_{suffix}",
        "hits": f"hits_{suffix}",
        "per_user": f"per_user_{suffix}",
        "per_query": f"per_query_{suffix}",
    }


def pipeline_topology(suffix: str, options: ComputationOptions | None = None) -> Topology:
    """The pipeline named by ``suffix``; both stages share ``options``."""
    name = names(suffix)
    topology = Topology(name["topology"], streams=[name["searches"]])
    topology.add_computation(
        name["per_user"],
        CountPerUser(name["hits"]),
        inputs={name["searches"]: user_of},
        outputs=[name["hits"]],
        options=options,
    )
    topology.add_computation(
        name["per_query"], CountPerQuery(), inputs=[name["hits"]], options=options
    )
    return topology


def topology() -> Topology:
    """The pipeline for ``millstream run``: suffix and key intervals from the environment."""
    intervals = int(os.environ.get("SEARCH_PIPELINE_INTERVALS", "4"))
    return pipeline_topology(
        os.environ.get("SEARCH_PIPELINE_SUFFIX", "demo"),
        ComputationOptions(key_intervals=intervals),
    )
