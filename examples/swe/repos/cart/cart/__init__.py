"""A shopping cart with quantities and a fractional discount."""

from __future__ import annotations


class Cart:
    """Items by name with a unit price and a quantity."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[float, int]] = {}

    def add(self, name: str, price: float, quantity: int = 1) -> None:
        _, held = self.items.get(name, (price, 0))
        self.items[name] = (price, held + quantity)

    def remove(self, name: str, quantity: int = 1) -> None:
        """Take `quantity` of an item out; an item whose quantity reaches 0 leaves the cart."""
        price, held = self.items[name]
        self.items[name] = (price, held - quantity)

    def total(self, discount: float = 0.0) -> float:
        """The sum of price x quantity, less `discount` (0.1 = 10 % off)."""
        subtotal = sum(price * quantity for price, quantity in self.items.values())
        return round(subtotal * discount if discount else subtotal, 2)
