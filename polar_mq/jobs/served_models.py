"""Submit-time check of a job's `model` against what the engine serves.

The agent is told `spec.model`, else the operator's `served_model`, else `default`
(`workers.stages.run_agent`). With `POLAR_MQ_SERVED_MODEL` set the proxy sends that name upstream
whatever the agent asked for, so any name works (a harness may need a name of its own: Codex
offers its patch tool only to models of its catalog) and nothing is checked here. Without it the
proxy passes the agent's name on, and a stack started by hand answered every call of the README's
job with the engine's 404 ("The model `default` does not exist"), each rollout retried three
times before the job failed minutes later.

So when no served model is configured the API reads the engine's `/v1/models` at submit:

- a job naming no model (or the alias `default`) gets the engine's model, stored with the job,
  when it serves exactly one base model (LoRA adapters, listed with a `parent`, are not
  candidates); several base models: refused, naming them;
- a job naming a model the engine does not list is refused (422 `unknown_model`), naming the
  served ones;
- an engine that cannot be asked (down, not an OpenAI-compatible listing) changes nothing: the
  job is accepted as before, and its calls will say what is wrong.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx

log = logging.getLogger(__name__)

UNKNOWN_MODEL = "unknown_model"
"""The error type of a job refused for its model."""
ALIASES = frozenset({"default"})
"""Names that mean "whatever the engine serves" (the agent's name when nothing is set)."""
LOOKUP_TIMEOUT_S = 2.0
"""How long a submit waits for the engine's listing before accepting the job unchecked."""


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """The model to store with the job (None: leave it unset) or why the job is refused."""

    model: str | None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class ServedModels:
    """An engine's listing: every model id, and those that are base models (not adapters)."""

    ids: tuple[str, ...]
    bases: tuple[str, ...]


def choose_model(asked: str | None, served: ServedModels | None) -> ModelChoice:
    """What a job asking for `asked` runs on an engine listing `served` (None: unknown)."""
    if served is None or not served.ids:
        return ModelChoice(asked)
    listed = ", ".join(repr(name) for name in served.ids)
    if asked is None or asked in ALIASES:
        if len(served.bases) == 1:
            return ModelChoice(served.bases[0])
        return ModelChoice(
            asked, f"the engine serves several models ({listed}): name one as the job's model"
        )
    if asked in served.ids:
        return ModelChoice(asked)
    return ModelChoice(
        asked,
        f"model {asked!r} is not served by the engine, which serves {listed}; leave the job's "
        "model unset to use it (or set POLAR_MQ_SERVED_MODEL to map every name to one model)",
    )


def engine_models(base_url: str, timeout_s: float = LOOKUP_TIMEOUT_S) -> ServedModels | None:
    """What the engine at `base_url` lists on `/v1/models`, or None if it cannot say."""
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/v1/models", timeout=timeout_s)
        response.raise_for_status()
        cards = [(str(card["id"]), card.get("parent")) for card in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.info("model of the job not checked: %s/v1/models: %s", base_url, exc)
        return None
    if not cards:
        return None
    ids = tuple(name for name, _ in cards)
    return ServedModels(ids, tuple(name for name, parent in cards if parent is None))
