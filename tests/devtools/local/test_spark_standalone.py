"""The local Spark standalone cluster: a failed start shows why and leaves nothing running.

Its working start, use and stop are exercised by ``tests/cli/test_run.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from millstream.devtools.local.spark_standalone import StandaloneSparkCluster
from millstream.engine.errors import ServiceStartError

pytestmark = pytest.mark.integration


def test_a_worker_that_cannot_start_fails_the_start_and_stops_the_master(tmp_path: Path) -> None:
    cluster = StandaloneSparkCluster(tmp_path, print, memory="banana")
    with pytest.raises(
        ServiceStartError, match=r"(?s)spark worker exited with code 1.*Usage: Worker"
    ):
        cluster.start()
    assert cluster.master.running_pid() is None
    assert cluster.worker.running_pid() is None
    assert cluster.processes() == {}
