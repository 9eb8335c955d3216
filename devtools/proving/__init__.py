"""The proving ground: crash every role of a running topology on the real stack and count
what was lost or duplicated (``millstream prove``); see :mod:`.ground`."""

from millstream.devtools.proving.ground import FAULTS, TIERS, GroundReport, Tier, prove

__all__ = ["FAULTS", "TIERS", "GroundReport", "Tier", "prove"]
