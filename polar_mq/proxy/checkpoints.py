"""Full checkpoints on the backends: an engine's weights reloaded from disk in place.

A policy version may be published with a full checkpoint directory instead of a LoRA adapter
(`polar_mq.policy.weights`). The sequence around the load is the adapters' (pause, drain, load
everywhere, resume; a backend that fails leaves the rotation; a late or restarted one loads it
before it serves: `polar_mq.proxy.adapters`); only the engine call differs:

- SGLang: `POST /update_weights_from_disk {"model_path", "weight_version"}`, answered 200
  `{"success": true, "message", "num_paused_requests"}` or 400 with `"success": false`. SGLang
  flushes its prefix cache itself after the load (`flush_cache` defaults to true), and reports
  `weight_version` in each answer's `metadata`.
- vLLM (0.32) has no public route: with `VLLM_SERVER_DEV_MODE=1` its dev routes reload in place,
  `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path"}}` on every
  worker, then `POST /reset_prefix_cache` so that no key or value computed by the old weights is
  reused. Without dev mode both answer 404, and the load fails with that said.

The engine is told apart by its answer, not by configuration: the SGLang route first, vLLM's on
a 404, so a fleet of either (or mixed) needs no setting. The calls keep the model name the
engine serves (no `lora_name` to write into them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from polar_mq.policy.weights import Adapter

if TYPE_CHECKING:  # imported by `adapters`, which the backends' health loop imports
    from polar_mq.proxy.backends.backend import Backend

SGLANG_PATH = "/update_weights_from_disk"
VLLM_RPC_PATH = "/collective_rpc"
VLLM_RESET_CACHE_PATH = "/reset_prefix_cache"
LOAD_TIMEOUT_S = 300.0
"""As an adapter's (`adapters.LOAD_TIMEOUT_S`, which the API's and the client's waits allow for)."""
NO_ROUTE = (
    "the engine cannot reload weights from disk (no SGLang /update_weights_from_disk; vLLM "
    "offers /collective_rpc reload_weights only with VLLM_SERVER_DEV_MODE=1)"
)


def _failed(response: httpx.Response) -> str:
    return f"HTTP {response.status_code}: {response.text[:300]}"


async def load_checkpoint(backend: Backend, checkpoint: Adapter) -> str | None:
    """Reload `backend`'s weights from `checkpoint.path`; None when it did, else why not.

    Raises `httpx.HTTPError` when the engine cannot be reached (the caller reports it)."""
    body = {"model_path": checkpoint.path, "weight_version": checkpoint.name}
    response = await backend.client.post(SGLANG_PATH, json=body, timeout=LOAD_TIMEOUT_S)
    if response.status_code != 404:
        ok = response.status_code == 200 and _success(response)
        return None if ok else _failed(response)
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": checkpoint.path}}
    response = await backend.client.post(VLLM_RPC_PATH, json=rpc, timeout=LOAD_TIMEOUT_S)
    if response.status_code == 404:
        return NO_ROUTE
    if response.status_code != 200:
        return _failed(response)
    response = await backend.client.post(VLLM_RESET_CACHE_PATH, timeout=60.0)
    if response.status_code != 200:  # the old weights' cached prefixes would still be served
        return f"weights reloaded, but the prefix cache was not reset: {_failed(response)}"
    return None


def _success(response: httpx.Response) -> bool:
    """SGLang's answer says `success` (a 200 without it, from another engine, is not one)."""
    try:
        answer = response.json()
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("success") is True
