"""Retention ages as an operator types them: `30d`, `12h`, `2w`, `90m` (a number and a unit)."""

from __future__ import annotations

import re
from datetime import timedelta

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class BadAge(ValueError):
    """Not an age: the message says what is expected."""


def parse_age(value: str) -> timedelta:
    """`30d` -> 30 days; refuses anything else with a message naming the accepted forms."""
    match = _AGE.match(value)
    if match is None:
        raise BadAge(
            f"not an age: {value!r}; expected a number and a unit: s, m, h, d or w (e.g. 30d, 12h)"
        )
    age = timedelta(**{_UNITS[match.group(2).lower()]: float(match.group(1))})
    if age <= timedelta(0):
        raise BadAge(f"the age must be more than zero: {value!r}")
    return age
