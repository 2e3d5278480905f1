"""Which backend a new rollout goes to: rendezvous (highest-random-weight) hashing.

Every proxy process and every proxy instance, behind any load balancer, computes the same order
of backends for a rollout id from nothing but the id and the backend names (and weights), so a
rollout's calls reach the same backend (its KV prefix cache) wherever they land, with no shared
state. The score of a backend is `weight / -ln(u)` with `u` uniform in (0, 1) from a keyed hash of
(rollout id, backend name): each backend wins a share of the rollouts proportional to its weight,
and adding or removing one backend moves only the rollouts it wins or loses.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Iterable, Mapping
from typing import Protocol, TypeVar

_SCALE = float(1 << 64)


class Ranked(Protocol):
    name: str
    weight: float
    hash_key: bytes


B = TypeVar("B", bound=Ranked)


def hash_key(name: str) -> bytes:
    """A backend's hash key, from its name alone (the same in every process)."""
    return hashlib.blake2b(name.encode(), digest_size=32).digest()


def score(rollout_id: uuid.UUID, key: bytes, weight: float) -> float:
    """A backend's weighted rendezvous score for this rollout (higher wins)."""
    digest = hashlib.blake2b(rollout_id.bytes, digest_size=8, key=key).digest()
    u = (int.from_bytes(digest, "big") + 0.5) / _SCALE  # in (0, 1), never 0 or 1
    return weight / -math.log(u)


def ranked(rollout_id: uuid.UUID, backends: Iterable[B]) -> list[B]:
    """`backends` from the rollout's first choice to its last (ties: by name, deterministic)."""
    return sorted(backends, key=lambda b: (-score(rollout_id, b.hash_key, b.weight), b.name))


def order_of(rollout_id: uuid.UUID, weights: Mapping[str, float]) -> list[str]:
    """The rendezvous order of backends given by name and weight (operators, tests)."""
    scores = {name: score(rollout_id, hash_key(name), w) for name, w in weights.items()}
    return sorted(scores, key=lambda name: (-scores[name], name))
