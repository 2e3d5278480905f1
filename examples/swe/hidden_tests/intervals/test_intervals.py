from intervals import merge


def test_overlapping() -> None:
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]


def test_touching_intervals_merge() -> None:
    assert merge([(1, 2), (2, 4)]) == [(1, 4)]


def test_unsorted_input() -> None:
    assert merge([(8, 10), (1, 3), (2, 6)]) == [(1, 6), (8, 10)]


def test_unsorted_touching() -> None:
    assert merge([(5, 7), (1, 5)]) == [(1, 7)]


def test_empty() -> None:
    assert merge([]) == []


def test_nested() -> None:
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]
