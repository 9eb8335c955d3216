"""Pages of the live view, open while a benchmark row runs (bench/throughput.py's
``millstream-viewed``): each holds the view's event stream open and reads every snapshot, as an
open page does, and asks for what a page with a panel open asks for on its timers: the
computation's key intervals every 5 s (from Cassandra), and, on the last page, a live tail of a
stream every 2 s (from Kafka). A separate process, as a browser would be: nothing here shares the
driver's interpreter.

    python bench/view_pages.py URL --pages 3 --computation NAME [--tail STREAM] [--no-panels]

``--no-panels``: the pages only read the snapshots, as a page does once opened.

It runs until its standard input closes, then prints one JSON line: per page, the snapshots
received and the requests made, answered, refused (429: the view serves two reads at once) and
failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

INTERVALS_EVERY = 5.0  # the page's refresh of an open computation panel (ui/assets/app.js)
TAIL_EVERY = 2.0  # the page's live tail
# A browser's event stream has no read timeout; a page here waits longer than any pause of
# bench/view_cost.py's slices (the view and its pages frozen, a wall clock going on).
READ_TIMEOUT = 120.0


@dataclass
class PageCounts:
    snapshots: int = 0
    requests: int = 0
    answered: int = 0
    refused: int = 0
    failed: int = 0
    last_error: str = ""


class Page:
    """One open page: an event-stream reader and a timer of reads, on two threads."""

    def __init__(
        self,
        base: str,
        computation: str,
        tail: str | None,
        stop: threading.Event,
        offset: float = 0.0,
        panels: bool = True,
    ):
        self.base = base
        self.computation = computation
        self.tail = tail
        self.offset = offset  # seconds before its first read: pages opened at other times
        self.stop = stop
        self.counts = PageCounts()
        self._lock = threading.Lock()
        self.connected = threading.Event()
        self._threads = [threading.Thread(target=self._events, daemon=True)]
        if panels:
            self._threads.append(threading.Thread(target=self._reads, daemon=True))

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _events(self) -> None:
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(self.base + "events", timeout=READ_TIMEOUT) as stream:
                    for raw in stream:
                        if self.stop.is_set():
                            return
                        line = raw.decode()
                        if line.startswith("data:"):
                            json.loads(line[5:])  # as the page parses each snapshot
                            with self._lock:
                                self.counts.snapshots += 1
                            self.connected.set()
            except (OSError, ValueError) as exc:
                self._failed(f"events: {exc}")
                self.stop.wait(2.0)  # EventSource's retry, as the view asks for

    def _reads(self) -> None:
        positions: dict[str, Any] | None = None
        next_intervals = time.monotonic() + self.offset
        next_tail = time.monotonic() + self.offset
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_intervals:
                self._get("api/intervals", {"computation": self.computation})
                next_intervals = now + INTERVALS_EVERY
            if self.tail is not None and now >= next_tail:
                query = {"stream": self.tail, "limit": "50"}
                if positions:
                    query["after"] = ",".join(f"{p}:{o}" for p, o in positions.items())
                result = self._get("api/records", query)
                if result is not None:
                    positions = result.get("positions") or positions
                next_tail = time.monotonic() + TAIL_EVERY
            self.stop.wait(0.2)

    def _get(self, path: str, query: dict[str, str]) -> dict[str, Any] | None:
        with self._lock:
            self.counts.requests += 1
        url = f"{self.base}{path}?{urllib.parse.urlencode(query)}"
        try:
            with urllib.request.urlopen(url, timeout=READ_TIMEOUT) as response:
                body: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 429:
                with self._lock:
                    self.counts.refused += 1
            else:
                self._failed(f"{path}: HTTP {exc.code} {exc.read()[:200]!r}")
            return None
        except (OSError, ValueError) as exc:
            self._failed(f"{path}: {exc}")
            return None
        with self._lock:
            self.counts.answered += 1
        return body

    def _failed(self, error: str) -> None:
        with self._lock:
            self.counts.failed += 1
            self.counts.last_error = error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url", help="the view's address, e.g. http://127.0.0.1:8470/")
    parser.add_argument("--pages", type=int, default=3)
    parser.add_argument("--computation", required=True, help="whose key intervals to read")
    parser.add_argument("--tail", help="a stream the last page tails live")
    parser.add_argument(
        "--no-panels", action="store_true", help="no panel open: the pages read snapshots only"
    )
    args = parser.parse_args(argv)
    base = args.url if args.url.endswith("/") else args.url + "/"
    stop = threading.Event()
    # Their timers spread over the refresh period, as pages opened at different moments are
    # (all at once, they would ask together and the view would refuse the third: 429).
    pages = [
        Page(
            base,
            args.computation,
            args.tail if n == args.pages - 1 else None,
            stop,
            offset=n * INTERVALS_EVERY / args.pages,
            panels=not args.no_panels,
        )
        for n in range(args.pages)
    ]
    for page in pages:
        page.start()
    for page in pages:
        if not page.connected.wait(60):
            print(json.dumps({"error": "a page received no snapshot in 60 s"}), flush=True)
            return 1
    print(json.dumps({"connected": len(pages)}), flush=True)
    sys.stdin.read()  # until the benchmark closes it
    stop.set()
    print(json.dumps({"pages": [asdict(page.counts) for page in pages]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
