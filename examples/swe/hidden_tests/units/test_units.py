import pytest
from units import to_celsius, to_fahrenheit


def test_freezing_point() -> None:
    assert to_celsius(32) == pytest.approx(0)


def test_boiling_point() -> None:
    assert to_celsius(212) == pytest.approx(100)


def test_minus_forty_is_the_same() -> None:
    assert to_celsius(-40) == pytest.approx(-40)


def test_round_trip() -> None:
    assert to_celsius(to_fahrenheit(37.5)) == pytest.approx(37.5)


def test_to_fahrenheit() -> None:
    assert to_fahrenheit(100) == pytest.approx(212)
