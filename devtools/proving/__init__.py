"""The proving ground: crash every role of a running topology on the real stack and count
what was lost or duplicated (``millstream prove``); see :mod:`.ground`. The faults and the
schedule are in :mod:`.faults`, the report in :mod:`.report`."""

from millstream.devtools.proving.faults import FAULTS, TIERS, Tier
from millstream.devtools.proving.ground import prove
from millstream.devtools.proving.report import GroundReport

__all__ = ["FAULTS", "TIERS", "GroundReport", "Tier", "prove"]
