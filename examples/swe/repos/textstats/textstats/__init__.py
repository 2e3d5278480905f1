"""Word statistics over plain text."""

from __future__ import annotations

from collections import Counter


def words(text: str) -> list[str]:
    """The words of `text`, lower-cased."""
    return [word.lower() for word in text.split(" ")]


def word_count(text: str) -> int:
    """How many words `text` holds."""
    return len(words(text))


def most_common_word(text: str) -> str | None:
    """The most frequent word (the first one seen on a tie), None for a text without words."""
    counts = Counter(words(text))
    if not counts:
        return None
    return counts.most_common(1)[0][0]
