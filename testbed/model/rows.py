"""A row of a run's printed summary: the text people read, carrying the numbers it shows as
numbers with their units. summary.json keeps the numbers beside the text, and a repeated run
(testbed.harness.repeat) gives each its median and spread over the runs."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Number:
    """A number a summary row shows, as a number: ``value`` in ``unit`` (None: nothing was
    measured)."""

    name: str
    value: float | int | None
    unit: str


class Row(tuple):
    """A row of the printed summary: the pair (what, text) people read, carrying the numbers
    the text shows as ``numbers`` (summary.json keeps them beside the text, and a repeated
    run gives each its median and spread). It is still the pair: ``what, text = row``."""

    numbers: tuple[Number, ...]

    def __new__(cls, what: str, text: str, *numbers: Number):
        row = super().__new__(cls, (what, text))
        row.numbers = numbers
        return row

    def __getnewargs__(self):
        return (*self, *self.numbers)

    def __repr__(self) -> str:
        return f"Row({self[0]!r}, {self[1]!r}, *{self.numbers!r})"
