"""The rollout a log line is about, carried in a context variable.

Set where the work for one rollout happens (a stage run, a proxied call, an API request on a job
or rollout) and read by `ContextFilter`, which stamps the fields on every record, so a line logged
deep inside a library call still says which rollout it concerns. A context variable, not a thread
local: asyncio tasks (the proxy) and worker threads (Celery's thread pool) each see their own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from contextvars import ContextVar, Token
from types import MappingProxyType
from typing import Any

FIELDS = ("job_id", "rollout_id", "attempt", "stage")
"""The fields a line about a rollout carries (others may be bound too)."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})
"""Every value set is a new dict, never changed after: a copied context never sees a change."""
_context: ContextVar[Mapping[str, Any]] = ContextVar("polar_mq_log_context", default=_EMPTY)


def _clean(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields with a value (None is left out). Values stay as given (a UUID, an int): the
    JSON formatter and the text formatter render them; converting here would cost every proxied
    call a few microseconds."""
    return {key: value for key, value in fields.items() if value is not None}


def current() -> Mapping[str, Any]:
    """The fields bound in this context."""
    return _context.get()


def bind(**fields: Any) -> None:
    """Add fields to this context until the enclosing `log_context` (or task, or request) ends.

    On the proxy's request path: a new plain dict (never changed once set), no more."""
    merged = dict(_context.get())
    for key, value in fields.items():
        if value is not None:
            merged[key] = value
    _context.set(merged)


def push(**fields: Any) -> Token[Mapping[str, Any]]:
    """Bind fields until `pop(token)`: for a start and an end in two callbacks (Celery signals)."""
    return _context.set({**_context.get(), **_clean(fields)})


def pop(token: Token[Mapping[str, Any]]) -> None:
    """Undo the `push` that returned `token` (a token of another context is ignored)."""
    with suppress(ValueError):
        _context.reset(token)


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Bind fields for the duration of the block (and whatever `bind` adds inside it)."""
    token = push(**fields)
    try:
        yield
    finally:
        pop(token)


class ContextFilter(logging.Filter):
    """Copies the bound fields onto each record (a field given in `extra=` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True
