"""Zeitgeist: spikes and dips in search traffic (MillWheel paper section 2), millstream's main job.

Run it from ``examples/`` with ``python -m zeitgeist`` (``./scripts/main`` does).
"""
