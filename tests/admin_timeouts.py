"""Kafka's admin requests timing out just after a process provisioned, as they do while a
broker dies under a process a supervisor has just restarted: the process got through its
provisioning (which waits out outages) and meets the outage in what it does next.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["AdminTimeouts"]


class AdminTimeouts:
    """From the moment the ``provision`` that ``caller`` (a module's dotted name) imported
    returns, the next ``count`` Kafka admin requests (topic creations, every one of them
    through ``millstream.connectors.kafka.topics._result``) time out; :attr:`left` is how
    many are still to."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, caller: str, count: int = 2) -> None:
        from millstream.connectors.kafka import topics
        from millstream.connectors.provisioning import provision

        self.left = 0
        answer = topics._result

        def result(*args: Any, **kwargs: Any) -> None:
            if self.left:
                self.left -= 1
                raise topics._admin_timeout(30.0)
            answer(*args, **kwargs)

        def provisioned(*args: Any, **kwargs: Any) -> None:
            provision(*args, **kwargs)
            self.left = count  # provisioning went through: the broker goes away now

        monkeypatch.setattr(topics, "_result", result)
        monkeypatch.setattr(f"{caller}.provision", provisioned)
