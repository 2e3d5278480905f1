"""Temperature conversions."""

from __future__ import annotations


def to_fahrenheit(celsius: float) -> float:
    """Degrees Celsius to degrees Fahrenheit."""
    return celsius * 9 / 5 + 32


def to_celsius(fahrenheit: float) -> float:
    """Degrees Fahrenheit to degrees Celsius."""
    return (fahrenheit + 32) * 5 / 9
