import pytest
from pagination import page_count, page_slice

ITEMS = list(range(1, 11))  # ten items


def test_first_page_starts_at_first_item() -> None:
    assert page_slice(ITEMS, 1, 3) == [1, 2, 3]


def test_last_page_is_partial() -> None:
    assert page_slice(ITEMS, 4, 3) == [10]


def test_page_count_with_remainder() -> None:
    assert page_count(10, 3) == 4


def test_page_count_exact() -> None:
    assert page_count(9, 3) == 3


def test_page_count_empty() -> None:
    assert page_count(0, 3) == 0


def test_invalid_page_is_refused() -> None:
    with pytest.raises(ValueError):
        page_slice(ITEMS, 0, 3)
