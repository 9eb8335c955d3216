"""A log-file injector process for ``test_injectors_stack.py`` to kill -9 and restart.

    python logfile_app.py NAME DIRECTORY STREAM KEYSPACE

Replays ``DIRECTORY`` (lines ``<µs> <key> <value>``) into ``STREAM`` a few lines per poll
(so a kill lands mid-run), prints ``started`` once it holds its checkpoint, and exits 0 once
the replay is complete. Services come from the environment, as for ``millstream``.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from millstream.engine.config import load_config
from millstream.injectors import InjectorOptions, LogFileSource, LogLine
from millstream.injectors.connect import connect_injector


def parse(line: str) -> LogLine:
    micros, key, value = line.split(" ", 2)
    return LogLine(int(micros), key, value.encode())


def main(name: str, directory: str, stream: str, keyspace: str) -> int:
    source = LogFileSource(directory, parse, stream, follow=False, max_bytes_per_poll=2_000)
    options = InjectorOptions(poll_timeout=0)
    config = load_config()
    settings = replace(config.run, keyspace=keyspace)
    with connect_injector(config, name, source, options, settings) as injector:
        injector.start()
        print("started", flush=True)
        while not injector.exhausted:
            injector.step()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
