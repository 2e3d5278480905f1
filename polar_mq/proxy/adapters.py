"""LoRA adapters on the backends: load the published one everywhere, unload the ones left behind.

A version published with a full checkpoint instead goes through the same functions: `load_on`
hands it to `polar_mq.proxy.checkpoints` (the engine reloads its weights from disk), and the rest
of the sequence, the rotation and the late joiners are the same.

The weight-update sequence is driven from outside (`polar_mq.policy.service`): pause new calls,
drain the ones in flight (or time out), then `POST /admin/adapter`, which lands here and loads the
adapter into every backend with vLLM's runtime LoRA API (`/v1/load_lora_adapter`), then resume.
After the load each backend's `adapter` is the new `lora_name`, which `send_call` writes into the
`model` of every call it dispatches there, whatever name the agent sent.

A backend that fails to load is taken out of rotation (`adapter_error`, see `Backend.usable`)
rather than left serving the old weights; the health loop retries it (`reconcile`), as it loads a
backend that joins later or comes back from a failed health check (a restarted engine lost its
adapters) before it serves again.

Every proxy process (and instance) loads into every backend it has: no leader to elect, and the
engine answers a name it already holds with an error that means success here. Unloading is only
safe once no process can still have a call on the old adapter, which only the caller of the
drain knows (every proxy reported drained): it asks for it with `unload_others`, and an adapter
left loaded by a drain that timed out goes at the next update that drains.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import httpx

from polar_mq.policy.weights import Adapter
from polar_mq.proxy.checkpoints import load_checkpoint

if TYPE_CHECKING:  # the backends' health loop imports this module: no import cycle at run time
    from polar_mq.proxy.backends.backend import Backend
    from polar_mq.proxy.backends.pool import BackendPool

log = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
LOAD_TIMEOUT_S = 300.0
"""Loading reads the adapter from disk into the engine: seconds on CPU, allow for slow disks."""
ALREADY_LOADED = "already been loaded"
"""vLLM's answer (HTTP 400) to a name it holds: another process or instance loaded it first."""


async def load_on(backend: Backend, adapter: Adapter) -> str | None:
    """Load `adapter` (or reload a full checkpoint) into `backend`; None when it carries it now,
    else why not (the backend is then out of rotation until a later load succeeds).

    A load of the same adapter already under way on this backend is awaited, not sent again:
    a publish, the database sync and the health loop's `reconcile` (which sees the backend
    without the pool's new adapter until its load ends) can meet, and an engine told twice
    reloads a full checkpoint twice, serving nothing meanwhile."""
    name = adapter.name
    pending = backend.loading.get(name)
    if pending is None:
        pending = asyncio.ensure_future(_load_once(backend, adapter))
        backend.loading[name] = pending

        def forget(done: asyncio.Future[str | None]) -> None:
            if backend.loading.get(name) is done:
                del backend.loading[name]

        pending.add_done_callback(forget)
    return await asyncio.shield(pending)


async def _load_once(backend: Backend, adapter: Adapter) -> str | None:
    try:
        if adapter.is_checkpoint:
            error = await load_checkpoint(backend, adapter)
        else:
            error = await _load_lora(backend, adapter)
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    if backend.removed:
        return error
    if error is None:
        backend.adapter = adapter.name
        if not adapter.is_checkpoint:  # a checkpoint is not unloaded: the next weights replace it
            backend.loaded.add(adapter.name)
        backend.adapter_error = None
    else:
        if backend.adapter_error is None:
            log.warning("backend %s failed to load adapter %s: %s", backend.name, adapter, error)
        backend.adapter_error = f"loading {adapter.name} failed: {error}"
    return error


async def _load_lora(backend: Backend, adapter: Adapter) -> str | None:
    body = {"lora_name": adapter.name, "lora_path": adapter.path}
    response = await backend.client.post(LOAD_PATH, json=body, timeout=LOAD_TIMEOUT_S)
    ok = response.status_code == 200 or (
        response.status_code == 400 and ALREADY_LOADED in response.text
    )
    return None if ok else f"HTTP {response.status_code}: {response.text[:300]}"


async def load_everywhere(pool: BackendPool, adapter: Adapter) -> dict[str, str | None]:
    """Make `adapter` the pool's current one and load it into every backend; name → error."""
    pool.adapter = adapter
    backends = list(pool.backends.values())
    errors = await asyncio.gather(*(load_on(b, adapter) for b in backends))
    loaded = sum(e is None for e in errors)
    log.info("adapter %s loaded on %d of %d backends", adapter.name, loaded, len(backends))
    return {b.name: e for b, e in zip(backends, errors, strict=True)}


async def unload_others(pool: BackendPool, keep: str) -> list[str]:
    """Unload every adapter this process loaded except `keep`; the (backend, name) pairs done.

    Any answer counts: 'not found' means another process unloaded it first."""

    async def one(backend: Backend, name: str) -> str:
        try:
            await backend.client.post(UNLOAD_PATH, json={"lora_name": name}, timeout=60.0)
        except httpx.HTTPError as exc:
            log.warning("backend %s: unloading %s failed: %r", backend.name, name, exc)
        backend.loaded.discard(name)
        return f"{backend.name}:{name}"

    jobs = [one(b, n) for b in pool.backends.values() for n in sorted(b.loaded - {keep})]
    return list(await asyncio.gather(*jobs))


async def reconcile(pool: BackendPool) -> None:
    """Load the current adapter into each backend that lacks it and passed its health check."""
    adapter = pool.adapter
    if adapter is None:
        return
    behind = [
        b
        for b in pool.backends.values()
        if not b.removed
        and (b.adapter != adapter.name or b.adapter_error is not None)
        and b.last_health == "ok"
    ]
    await asyncio.gather(*(load_on(b, adapter) for b in behind))


def merged_loads(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The answers of every process of a `--workers N` proxy as one: a backend carries the
    adapter only if every process loaded it; the unloads of all."""
    merged = dict(answers[0])
    backends: dict[str, str | None] = {}
    for answer in answers:
        for name, error in answer["backends"].items():
            backends[name] = backends.get(name) or error
    merged["backends"] = backends
    merged["loaded"] = all(e is None for e in backends.values())
    merged["unloaded"] = sorted({u for a in answers for u in a["unloaded"]})
    return merged
