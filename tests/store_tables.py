"""An interval table of the store made for one test (the ``store_table`` fixture)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StoreTable:
    """An interval table of the store made for one test; ``str()`` is its qualified name."""

    keyspace: str
    name: str

    def __str__(self) -> str:
        return f"{self.keyspace}.{self.name}"
