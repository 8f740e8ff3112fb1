"""One verdict shape for every experiment: a list of checks and whether the emulator kept up.

A check states one claim with the number that decides it: ``measured`` against ``expected``
within ``tolerance`` (both in ``unit``), and whether it ``passed``. A claim that could not be
judged (the run it needs was not made, nothing was measured) has ``passed`` None: it is shown
as such and never counted as a pass. ``statement`` says it in plain language.

The emulator's trust is a list of checks of the same shape (CPU headroom, packet
conservation, delivery, and any an experiment adds); ``emulator_trusted`` is True only when
every one passed, and ``reasons`` say why not.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

PASS, FAIL, NOT_JUDGED = "PASS", "FAIL", "n/a"


@dataclass(frozen=True)
class Check:
    """One claim judged from a measurement."""

    name: str
    measured: float | int | bool | str | None
    expected: float | int | bool | str | None
    tolerance: float | int | str | None
    unit: str
    passed: bool | None
    statement: str = ""
    setup: str | None = None  # the fabric it was measured on, when an experiment has several

    @property
    def outcome(self) -> str:
        return NOT_JUDGED if self.passed is None else PASS if self.passed else FAIL

    def to_dict(self) -> dict:
        return {**asdict(self), "outcome": self.outcome}

    @classmethod
    def from_dict(cls, data: dict) -> Check:
        return cls(**{k: v for k, v in data.items() if k != "outcome"})


def at_least(name: str, measured, minimum, unit: str, statement: str = "",
             setup: str | None = None) -> Check:
    """Passes when ``measured >= minimum``; not judged when nothing was measured."""
    passed = None if measured is None else bool(measured >= minimum)
    return Check(name, measured, f">= {minimum:g}" if isinstance(minimum, (int, float))
                 else f">= {minimum}", None, unit, passed, statement, setup)


def at_most(name: str, measured, maximum, unit: str, statement: str = "",
            setup: str | None = None) -> Check:
    """Passes when ``measured <= maximum``; not judged when nothing was measured."""
    passed = None if measured is None else bool(measured <= maximum)
    return Check(name, measured, f"<= {maximum:g}" if isinstance(maximum, (int, float))
                 else f"<= {maximum}", None, unit, passed, statement, setup)


def near(name: str, measured, expected, tolerance, unit: str, statement: str = "",
         setup: str | None = None) -> Check:
    """Passes when ``|measured - expected| <= tolerance``."""
    passed = None if measured is None or expected is None else \
        bool(abs(measured - expected) <= tolerance)
    return Check(name, measured, expected, tolerance, unit, passed, statement, setup)


def holds(name: str, value: bool | None, statement: str = "", setup: str | None = None,
          measured=None, expected=True) -> Check:
    """A yes/no claim (``value`` None: not judged); ``measured`` may give the number behind it."""
    return Check(name, value if measured is None else measured, expected, None, "",
                 None if value is None else bool(value), statement, setup)


@dataclass
class Verdict:
    """Every check of a run, and whether the emulator kept up while it measured."""

    checks: list[Check] = field(default_factory=list)
    trust: list[Check] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)

    @property
    def emulator_trusted(self) -> bool:
        return bool(self.trust) and all(c.passed for c in self.trust)

    @property
    def reasons(self) -> list[str]:
        """Why the emulator is not trusted (empty when it is)."""
        if not self.trust:
            return ["nothing measured whether the emulator kept up"]
        return [f"{c.name}: {_show(c.measured)} {c.unit} (expected {_show(c.expected)})"
                + ("" if c.passed is False else ", not judged") for c in self.trust
                if not c.passed]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    @property
    def passed(self) -> bool:
        """Every judged check passed (not-judged ones do not count either way)."""
        return not self.failed

    def counts(self) -> dict[str, int]:
        outcomes = [c.outcome for c in self.checks]
        return {o: outcomes.count(o) for o in (PASS, FAIL, NOT_JUDGED)}

    def to_dict(self) -> dict:
        return {"checks": [c.to_dict() for c in self.checks],
                "emulator_trusted": self.emulator_trusted, "reasons": self.reasons,
                "trust": [c.to_dict() for c in self.trust], "statements": self.statements,
                "counts": self.counts()}

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        return cls([Check.from_dict(c) for c in data.get("checks", [])],
                   [Check.from_dict(c) for c in data.get("trust", [])],
                   list(data.get("statements", [])))


def _show(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trust_checks(fidelity_by_setup: Iterable[tuple[str, dict]]) -> list[Check]:
    """The emulator-trust checks of every setup's fidelity verdict
    (testbed.measure.fidelity.Verdict.to_dict()), one check per signal and setup."""
    checks = []
    for setup, fidelity in fidelity_by_setup:
        checks.extend(Check.from_dict(c) for c in fidelity.get("checks", []))
        if not fidelity.get("checks"):
            checks.append(holds("emulator kept up", fidelity.get("trustworthy"),
                                "; ".join(fidelity.get("reasons", [])), setup))
    return checks
