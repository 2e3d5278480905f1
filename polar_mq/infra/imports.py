"""Which `package.module:attr` import paths a job may name for its evaluator or builder.

A job spec comes from the network, and resolving an import path runs the named module's code in
the API (at submit, to validate it) and in the workers: `"os:system"` as an evaluator would be a
remote shell. So a path is imported only when it is allowed, checked *before* anything is imported:

- its module is under a prefix of `POLAR_MQ_IMPORT_ALLOWLIST` (default `polar_mq`: polar_mq's own
  evaluators and builders only), matched on whole dotted names (`polar_mq` allows
  `polar_mq.evaluators.match`, not `polar_mq_evil`); or
- it is the target of an entry point an installed package registered in the group
  `polar_mq.evaluators` / `polar_mq.builders` (installing a package is an operator's decision);
  such an entry point can also be named by its name alone.

The allow-list in force is the one of the process's settings (`get_settings()`), or, inside
`allowing(...)`, the one a process was built with: the API app sets it per request
(`AllowlistMiddleware`), the worker around each stage.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from importlib.metadata import entry_points

from starlette.types import ASGIApp, Receive, Scope, Send

EVALUATOR_GROUP = "polar_mq.evaluators"
BUILDER_GROUP = "polar_mq.builders"

_ALLOWED: ContextVar[tuple[str, ...] | None] = ContextVar("polar_mq_import_allowlist", default=None)


class ImportNotAllowed(ValueError):
    """The import path is outside the allow-list (a ValueError: a 4xx at submit)."""


def allowed_prefixes() -> tuple[str, ...]:
    """The module prefixes allowed here and now."""
    configured = _ALLOWED.get()
    if configured is not None:
        return configured
    from polar_mq.config import get_settings

    return tuple(get_settings().import_allowlist)


@contextmanager
def allowing(prefixes: Iterable[str]) -> Iterator[None]:
    """Resolve import paths under `prefixes` within this block (this thread or task only)."""
    token = _ALLOWED.set(tuple(prefixes))
    try:
        yield
    finally:
        _ALLOWED.reset(token)


@lru_cache(maxsize=8)
def registered(group: str) -> dict[str, str]:
    """Entry points of `group`: name -> `module:attr` (read once per process)."""
    return {ep.name: ep.value.replace(" ", "") for ep in entry_points(group=group)}


def entry_point_path(name: str, group: str) -> str | None:
    """The import path an entry point called `name` registered in `group`, if any."""
    return registered(group).get(name)


def check_import_path(path: str, group: str, what: str) -> None:
    """Raise `ImportNotAllowed` unless `path` may be imported (nothing is imported here)."""
    if path in registered(group).values():
        return
    module = path.split(":", 1)[0]
    prefixes = allowed_prefixes()
    if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
        return
    raise ImportNotAllowed(
        f"{what} import path {path!r} is not allowed: module {module!r} is not under "
        f"POLAR_MQ_IMPORT_ALLOWLIST ({', '.join(prefixes) or 'empty'}) and not a "
        f"{group!r} entry point"
    )


class AllowlistMiddleware:
    """Puts the app's allow-list in force for each request (request bodies are validated in the
    request's own task, so the job schema's validators see it)."""

    def __init__(self, app: ASGIApp, prefixes: Iterable[str]) -> None:
        self.app = app
        self.prefixes = tuple(prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with allowing(self.prefixes):
            await self.app(scope, receive, send)
