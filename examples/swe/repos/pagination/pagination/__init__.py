"""Split a list into numbered pages (page numbers start at 1)."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def page_slice(items: list[T], page: int, per_page: int) -> list[T]:
    """The items shown on `page` (1-based) when `per_page` items fit on a page."""
    if page < 1 or per_page < 1:
        raise ValueError("page and per_page must be at least 1")
    start = page * per_page
    return items[start : start + per_page]


def page_count(n_items: int, per_page: int) -> int:
    """How many pages `n_items` items fill."""
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    return n_items // per_page
