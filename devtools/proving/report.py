"""What a proving-ground run reports: each fault's outcome, the unplanned exits, the checks,
rendered for people (:meth:`GroundReport.render`) and as JSON."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from millstream.devtools.proving.checks import CheckResult, NonVacuity
from millstream.devtools.proving.faults import Fault, Tier

__all__ = ["FaultOutcome", "GroundReport", "Unplanned"]

# Of an unplanned exit's traceback in the report (its log keeps the last 30 lines).
_TRACEBACK_LINES: Final = 24
_ERROR_LINE: Final = re.compile(r"^([\w.$]+\.)?\w*(Error|Exception)\b")


@dataclass
class FaultOutcome:
    """What applying a fault did: whom it hit, what it saw, and whether it took effect."""

    fault: Fault
    target: str = ""
    detail: str = ""
    applied: bool = False
    seconds: float = 0.0


@dataclass
class Unplanned:
    role: str
    code: int | None
    log: str

    @property
    def error(self) -> str:
        """The log's last line that names an error (a Python or Java one), else its last."""
        lines = [line.strip() for line in self.log.strip().splitlines()]
        named = [line for line in lines if _ERROR_LINE.match(line)]
        return (named or lines[-1:] or [""])[-1]

    @property
    def traceback(self) -> list[str]:
        """The log's last Python traceback, from its ``Traceback`` line on (at most
        :data:`_TRACEBACK_LINES` lines, the last): where the process failed, shown in the
        report because a CI machine keeps no run directory to read it in."""
        lines = self.log.rstrip().splitlines()
        starts = [n for n, line in enumerate(lines) if line.startswith("Traceback ")]
        return lines[starts[-1] :][-_TRACEBACK_LINES:] if starts else []


@dataclass
class GroundReport:
    """A run's result: faults, checks, non-vacuity counts and unplanned exits."""

    run: str
    seed: int
    tier: Tier
    directory: Path
    one_query: bool = False  # the topology ran as one streaming query
    outcomes: list[FaultOutcome] = field(default_factory=list)
    unplanned: list[Unplanned] = field(default_factory=list)
    checks: CheckResult = field(default_factory=CheckResult)
    provoked: NonVacuity = field(default_factory=NonVacuity)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        # An unplanned exit is a defect even when nothing was lost: a process gave up on
        # what it should have waited out (its supervisor restarted it).
        applied = all(o.applied for o in self.outcomes)
        return self.checks.passed and applied and not self.unplanned

    def render(self) -> str:
        lines = [
            f"proving ground run {self.run}: seed {self.seed}, {self.tier.records} records "
            f"over {self.tier.keys} keys, {len(self.outcomes)} faults, {self.seconds:.0f} s",
            "the topology in one query" if self.one_query else "a query per computation",
            "",
            f"{'#':>3}  {'fault':<18} {'target':<22} {'s':>5}  result",
        ]
        for number, outcome in enumerate(self.outcomes, 1):
            state = "applied" if outcome.applied else "NOT APPLIED"
            lines.append(
                f"{number:>3}  {outcome.fault.kind:<18} {outcome.target:<22} "
                f"{outcome.seconds:>5.1f}  {state}: {outcome.detail}"
            )
        lines += ["", f"{'check':<46} count"]
        for check, count in self.checks.counts.items():
            lines.append(f"{check:<46} {count:>5}  {'ok' if count == 0 else 'FAILED'}")
            lines.extend(f"      {example}" for example in self.checks.examples.get(check, []))
        lines += ["", f"{'provoked (non-vacuity)':<46} count"]
        lines.extend(f"{name:<46} {count:>5}" for name, count in self.provoked.rows())
        if not any(count for _, count in self.provoked.rows()):
            lines.append("the faults provoked none of these: the run proves little")
        lines += ["", "figures"]
        lines.extend(f"  {name}: {value}" for name, value in self.checks.figures.items())
        if self.unplanned:
            lines += ["", f"unplanned exits: {len(self.unplanned)}"]
            for exit in self.unplanned:
                lines.append(f"  {exit.role} exited with {exit.code}: {exit.error[:300]}")
                lines.extend(f"    {line[:300]}" for line in exit.traceback)
        if self.passed:
            lines += ["", "PASSED"]
        else:
            lines += ["", f"FAILED (its logs, topics and keyspace are kept: {self.directory})"]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "seed": self.seed,
            "one_query": self.one_query,
            "passed": self.passed,
            "seconds": self.seconds,
            "faults": [
                {
                    "kind": o.fault.kind,
                    "computation": o.fault.computation,
                    "target": o.target,
                    "applied": o.applied,
                    "detail": o.detail,
                    "seconds": o.seconds,
                }
                for o in self.outcomes
            ],
            "checks": self.checks.counts,
            "examples": self.checks.examples,
            "figures": self.checks.figures,
            "provoked": dict(self.provoked.rows()),
            "unplanned": [{"role": u.role, "code": u.code} for u in self.unplanned],
        }
