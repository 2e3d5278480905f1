import pytest
from cart import Cart


def _cart() -> Cart:
    cart = Cart()
    cart.add("apple", 0.5, 4)
    cart.add("bread", 2.0)
    return cart


def test_total_without_discount() -> None:
    assert _cart().total() == pytest.approx(4.0)


def test_ten_percent_discount() -> None:
    assert _cart().total(0.1) == pytest.approx(3.6)


def test_quarter_discount() -> None:
    assert _cart().total(0.25) == pytest.approx(3.0)


def test_removing_last_unit_drops_the_item() -> None:
    cart = _cart()
    cart.remove("bread")
    assert "bread" not in cart.items


def test_removed_item_costs_nothing() -> None:
    cart = _cart()
    cart.remove("apple", 4)
    assert cart.total() == pytest.approx(2.0)
