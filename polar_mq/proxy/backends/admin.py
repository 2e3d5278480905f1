"""Admin endpoints for the backends and for weight updates (admin token as for `/admin/flush`).

- `GET /admin/backends`: every backend's state (load, breaker, pause, policy version).
- `POST /admin/backends`: `{"action": "add", "url", "name"?, "weight"?, "policy_version"?,
  "tito"?}` (`tito`: the backend's own auto | on | off, over the proxy's `proxy_tito`) or
  `{"action": "remove" | "drain" | "undrain", "name"}` while the proxy runs.
- `POST /admin/pause` `{"backend"?}`: new calls wait (then 503 + Retry-After); in-flight calls
  finish. The answer says whether they have (`drained`); `?wait_drained=true[&timeout_s=N]` waits.
- `POST /admin/resume` `{"backend"?}`: waiting calls go ahead.
- `POST /admin/policy_version` `{"backend"?, "version"}`: stamped on every call served from now on.
- `POST /admin/adapter` `{"name", "path", "unload_others"?}`: load a LoRA adapter into every
  backend (those that fail leave the rotation) and serve every call with it from now on; with
  `unload_others`, unload the adapters loaded before (`polar_mq.proxy.adapters`).
Without `backend` these act on every backend; with `--workers N`, on every process (`fanout`).
An added backend starts unpaused, at the highest policy version in the pool unless given one, and
loads the current adapter before it serves; a removed one finishes its in-flight calls first.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polar_mq.policy.weights import PATH_MAX, Adapter
from polar_mq.proxy.adapters import load_everywhere, load_on, merged_loads, unload_others
from polar_mq.proxy.backends.backend import NAME_MAX, Backend
from polar_mq.proxy.backends.pool import BackendPool
from polar_mq.proxy.errors import bad_request, openai_error, unauthorized
from polar_mq.proxy.server.auth import admin_allowed
from polar_mq.proxy.server.fanout import fanned_out, first, paused, pool_snapshots

ADMIN_BODY_MAX = 64 * 1024
DRAIN_TIMEOUT_S = 600.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AddBackend(_Strict):
    action: Literal["add"]
    url: str = Field(min_length=1, max_length=2000)
    name: str | None = Field(None, min_length=1, max_length=NAME_MAX)
    weight: float = Field(1.0, gt=0)
    policy_version: int | None = Field(None, ge=0)
    tito: Literal["auto", "on", "off"] | None = None
    """Its own token-in/token-out setting over the proxy's (`polar_mq.proxy.tito`)."""


class ChangeBackend(_Strict):
    action: Literal["remove", "drain", "undrain"]
    name: str = Field(min_length=1, max_length=NAME_MAX)


class Target(_Strict):
    backend: str | None = Field(None, min_length=1, max_length=NAME_MAX)


class SetVersion(Target):
    version: int = Field(ge=0)


class LoadAdapter(_Strict):
    name: str = Field(min_length=1, max_length=200)
    path: str = Field(min_length=1, max_length=PATH_MAX)
    unload_others: bool = False


M = TypeVar("M", bound=BaseModel)
T = TypeVar("T", bound=Target)


class BackendChange(
    RootModel[Annotated[AddBackend | ChangeBackend, Field(discriminator="action")]]
):
    pass


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


def _not_found(message: str) -> Response:
    return openai_error(404, message, "invalid_request_error", "backend_not_found")


async def _body(request: Request) -> Any:
    raw = await request.body()
    if len(raw) > ADMIN_BODY_MAX:
        raise ValueError("admin request body too large")
    return orjson.loads(raw) if raw.strip() else {}


def _pool(request: Request) -> BackendPool | None:
    """The pool, or None when the caller lacks the admin token."""
    state = request.app.state.proxy
    if not admin_allowed(request, state.admin_token):
        return None
    pool: BackendPool = state.backends
    return pool


async def _read(request: Request, model: type[M]) -> M:
    """The validated body; raises ValueError (JSON, size) or ValidationError."""
    return model.model_validate(await _body(request))


def _invalid(exc: Exception) -> Response:
    if isinstance(exc, ValidationError):
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return bad_request(f"invalid admin request: {detail}")
    return bad_request(f"invalid admin request: {exc}")


async def backends(request: Request) -> Response:
    pool = _pool(request)
    if pool is None:
        return unauthorized("admin token required")
    if request.method == "GET":
        return _json(pool.snapshot())
    try:
        change = (await _read(request, BackendChange)).root
    except (ValueError, ValidationError) as exc:
        return _invalid(exc)
    tito = request.app.state.proxy.tito
    if isinstance(change, AddBackend) and change.tito is not None:
        if tito is None:
            return bad_request(
                "invalid admin request: tito: this proxy runs without token-in/token-out "
                "(start it with proxy_tito or proxy_tito_backends)"
            )
        try:
            tito.check_mode(change.tito)
        except ValueError as exc:
            return bad_request(f"invalid admin request: {exc}")
    try:
        if isinstance(change, AddBackend):
            version = change.policy_version
            if version is None:  # join at the version the others serve
                version = max((b.policy_version for b in pool.backends.values()), default=0)
            added = pool.add(change.url, change.name, change.weight, version)
            if tito is not None:
                tito.set_backend(added.name, change.tito)
            if pool.adapter is not None:  # carries the current weights before it serves
                await load_on(added, pool.adapter)
        elif change.action == "remove":
            pool.remove(change.name)
            if tito is not None:
                tito.set_backend(change.name, None)
        else:
            pool.get(change.name).draining = change.action == "drain"
    except KeyError as exc:
        return _not_found(str(exc.args[0]))
    except ValueError as exc:
        return openai_error(409, str(exc), "invalid_request_error", "conflict")
    return _json(pool.snapshot())


async def _targets(
    request: Request, model: type[T]
) -> tuple[BackendPool, list[Backend], T] | Response:
    """(pool, the backends named by the body or all of them, the body) or the error response."""
    pool = _pool(request)
    if pool is None:
        return unauthorized("admin token required")
    try:
        body = await _read(request, model)
        selected = pool.select(body.backend)
    except KeyError as exc:
        return _not_found(str(exc.args[0]))
    except (ValueError, ValidationError) as exc:
        return _invalid(exc)
    return pool, selected, body


async def pause(request: Request) -> Response:
    """Hold new calls; report (or with `wait_drained=true`, await) the drain of in-flight ones."""
    query = request.query_params
    wait = query.get("wait_drained", "false").lower()
    if wait not in ("true", "false", "1", "0"):
        return bad_request("wait_drained must be true or false")
    try:
        timeout_s = float(query.get("timeout_s", DRAIN_TIMEOUT_S))
    except ValueError:
        return bad_request("timeout_s must be a number")
    if not 0 <= timeout_s <= 3600:
        return bad_request("timeout_s must be between 0 and 3600")
    found = await _targets(request, Target)
    if isinstance(found, Response):
        return found
    pool, selected, _ = found
    for backend in selected:
        backend.pause()
    drained = all(b.in_flight == 0 for b in selected)
    if not drained and wait in ("true", "1"):
        drained = await pool.wait_drained(selected, timeout_s)
    return _json(
        {
            "paused": [b.name for b in selected],
            "in_flight": sum(b.in_flight for b in selected),
            "drained": drained,
        }
    )


async def resume(request: Request) -> Response:
    found = await _targets(request, Target)
    if isinstance(found, Response):
        return found
    _, selected, _ = found
    for backend in selected:
        backend.resume()
    return _json({"resumed": [b.name for b in selected]})


async def policy_version(request: Request) -> Response:
    found = await _targets(request, SetVersion)
    if isinstance(found, Response):
        return found
    _, selected, body = found
    for backend in selected:
        backend.policy_version = body.version
    return _json({b.name: b.policy_version for b in selected})


async def adapter(request: Request) -> Response:
    """Load an adapter into every backend; per backend None (loaded) or the error."""
    pool = _pool(request)
    if pool is None:
        return unauthorized("admin token required")
    try:
        body = await _read(request, LoadAdapter)
    except (ValueError, ValidationError) as exc:
        return _invalid(exc)
    loads = await load_everywhere(pool, Adapter(body.name, body.path))
    unloaded = await unload_others(pool, body.name) if body.unload_others else []
    return _json(
        {
            "adapter": body.name,
            "backends": loads,
            "loaded": all(e is None for e in loads.values()),
            "unloaded": unloaded,
        }
    )


CHANGES = {
    "/admin/backends": backends,
    "/admin/pause": pause,
    "/admin/resume": resume,
    "/admin/policy_version": policy_version,
}
"""The admin calls that change state (replayed, in order, by a restarted `--workers` child)."""


def admin_routes() -> list[Route]:
    """The routes; with `--workers N` each applies to all N processes (`fanout`)."""
    return [
        Route(
            "/admin/backends",
            fanned_out(backends, pool_snapshots, journal=True),
            methods=["GET", "POST"],
        ),
        Route("/admin/pause", fanned_out(pause, paused, journal=True), methods=["POST"]),
        Route("/admin/resume", fanned_out(resume, first, journal=True), methods=["POST"]),
        Route(
            "/admin/policy_version",
            fanned_out(policy_version, first, journal=True),
            methods=["POST"],
        ),
        # Not journaled: a restarted worker loads the adapter recorded in the database before it
        # serves (`policy_sync`), instead of replaying every adapter ever published.
        Route("/admin/adapter", fanned_out(adapter, merged_loads, journal=False), methods=["POST"]),
    ]
