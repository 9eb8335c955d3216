"""Backends of the interval store contract (:mod:`millstream.engine.store`), one folder each."""
