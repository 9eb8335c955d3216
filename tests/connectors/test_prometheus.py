"""The metrics endpoint: listen addresses, a registry served over HTTP and freed again.

``free_port``, ``scrape`` and ``Samples`` are shared with the other Prometheus tests.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from millstream.connectors.prometheus import listen_address, serve_metrics
from millstream.engine.errors import ConfigError

pytestmark = pytest.mark.unit


class Samples:
    """The samples of one scrape, looked up by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.help: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            self.help[family.name] = family.documentation
            for sample in family.samples:
                self.values[(sample.name, frozenset(sample.labels.items()))] = sample.value

    @classmethod
    def of(cls, registry: CollectorRegistry) -> Samples:
        return cls(generate_latest(registry).decode())

    def get(self, name: str, **labels: str) -> float | None:
        return self.values.get((name, frozenset(labels.items())))

    def __getitem__(self, key: tuple[str, dict[str, str]]) -> float:
        name, labels = key
        found = self.get(name, **labels)
        assert found is not None, f"no sample {name}{labels} in:\n{self.text}"
        return found

    def names(self) -> set[str]:
        return {name for name, _ in self.values}


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(url: str, timeout: float = 5.0) -> Samples:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return Samples(response.read().decode())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("9400", ("127.0.0.1", 9400)),
        ("0", ("127.0.0.1", 0)),
        ("0.0.0.0:9400", ("0.0.0.0", 9400)),
        ("[::1]:9400", ("::1", 9400)),
        (" localhost:80 ", ("localhost", 80)),
    ],
)
def test_a_listen_address_is_a_port_with_an_optional_address(
    text: str, expected: tuple[str, int]
) -> None:
    assert listen_address(text) == expected


@pytest.mark.parametrize("text", ["", "http", "99999", "-1", ":9400", "host:"])
def test_a_malformed_listen_address_is_refused_saying_how_to_write_it(text: str) -> None:
    with pytest.raises(ConfigError, match="ADDRESS:PORT"):
        listen_address(text)


def test_a_registry_is_served_on_loopback_until_closed() -> None:
    registry = CollectorRegistry()
    Counter("probe_events_total", "Events.", registry=registry).inc(3)
    with serve_metrics(registry, 0) as server:
        assert server.address == "127.0.0.1"
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        assert scrape(server.url)["probe_events_total", {}] == 3
        port = server.port
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    # The port is free again at once.
    with serve_metrics(registry, port) as again:
        assert scrape(again.url)["probe_events_total", {}] == 3


def test_a_port_taken_is_a_config_error() -> None:
    with serve_metrics(CollectorRegistry(), 0) as server, pytest.raises(ConfigError, match="port"):
        serve_metrics(CollectorRegistry(), server.port)
