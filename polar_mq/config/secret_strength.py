"""Is a production secret guessable? Length, and a cheap check of how random its characters are.

A length floor alone lets `aaaa...` or `abcabc...` through: long, and guessed at once. Real
secrets come from a generator (`openssl rand -hex 32`, `python -c "import secrets;
print(secrets.token_urlsafe(32))"`), so two cheap tests separate them from typed ones without
refusing any generated value: the Shannon entropy of its characters (a random hex string of 24
characters has about 3.3 bits per character, `abcabc...` 1.6, `aaaa...` 0) and whether the value
is one shorter string repeated (`0123456789abcdef` twice has 4 bits per character but no more
secret than its half).
"""

from __future__ import annotations

import math
from collections import Counter

MIN_BITS_PER_CHAR = 2.5
"""Random hex (the poorest alphabet a generator uses) stays above 2.5 even at 24 characters; typed
and patterned values fall below it."""
HINT = "e.g. openssl rand -hex 32"
PLACEHOLDERS = ("change-me", "changeme")
"""Marks of the example values (`docker/env.example`, the development default): random-looking
enough to pass the entropy test, and published."""


def bits_per_char(value: str) -> float:
    """The Shannon entropy of `value`'s character frequencies, in bits per character."""
    if not value:
        return 0.0
    n = len(value)
    return max(0.0, -sum(c / n * math.log2(c / n) for c in Counter(value).values()))


def is_repetition(value: str) -> bool:
    """`value` is a shorter string repeated (`abab`, `xyzxyz`): it occurs inside itself doubled
    anywhere but at the ends."""
    return len(value) > 1 and value in (value + value)[1:-1]


def weakness(value: str, min_chars: int) -> str | None:
    """Why `value` is too weak for a production secret of at least `min_chars`, or None."""
    if len(value) < min_chars:
        return f"must be at least {min_chars} characters (got {len(value)}; {HINT})"
    if any(mark in value.lower() for mark in PLACEHOLDERS):
        return f"is a placeholder from an example ({HINT})"
    bits = bits_per_char(value)
    if bits < MIN_BITS_PER_CHAR:
        return (
            f"is too predictable: {bits:.1f} bits of entropy per character, at least "
            f"{MIN_BITS_PER_CHAR:g} needed (a few characters repeated; {HINT})"
        )
    if is_repetition(value):
        return f"is too predictable: one shorter string repeated ({HINT})"
    return None
