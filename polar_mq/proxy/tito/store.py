"""Each rollout attempt's last turn (`Turn` + the ids the engine saw and sampled), kept where the
agent's next call finds it.

Rollouts stick to a backend, not to a proxy process: with `--workers N` the next call may land on
any process (SO_REUSEPORT), so a multi-process proxy keeps turns in Redis (the Redis of its shared
call counter), one key per attempt with a TTL; a single process keeps a bounded LRU map.
"""

from __future__ import annotations

import uuid
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from polar_mq.proxy.redis_client import async_redis
from polar_mq.proxy.tito.history import Turn

KEY_PREFIX = "polar:tito:"
MAX_LOCAL = 50_000


@dataclass(frozen=True, slots=True)
class LastTurn:
    turn: Turn
    context: list[int]
    """prompt_ids + completion_ids of the last call: what the next prompt starts with."""


class TurnStore(Protocol):
    async def load(self, rollout_id: uuid.UUID, attempt: int) -> LastTurn | None: ...

    async def save(self, rollout_id: uuid.UUID, attempt: int, last: LastTurn) -> None: ...

    async def aclose(self) -> None: ...


class LocalTurns:
    """This process's turns (a single-process proxy), least recently used dropped first."""

    def __init__(self, max_rollouts: int = MAX_LOCAL) -> None:
        self._turns: OrderedDict[tuple[uuid.UUID, int], LastTurn] = OrderedDict()
        self._max = max_rollouts

    async def load(self, rollout_id: uuid.UUID, attempt: int) -> LastTurn | None:
        return self._turns.get((rollout_id, attempt))

    async def save(self, rollout_id: uuid.UUID, attempt: int, last: LastTurn) -> None:
        key = (rollout_id, attempt)
        self._turns[key] = last
        self._turns.move_to_end(key)
        while len(self._turns) > self._max:
            self._turns.popitem(last=False)

    async def aclose(self) -> None:
        self._turns.clear()


def encode(last: LastTurn) -> bytes:
    turn = last.turn
    head = orjson.dumps(
        {
            "n": turn.n_messages,
            "m": turn.messages_digest.hex(),
            "t": turn.tools_digest.hex(),
            "r": turn.reply,
        }
    )
    return len(head).to_bytes(4, "little") + head + array("i", last.context).tobytes()


def decode(raw: bytes) -> LastTurn:
    size = int.from_bytes(raw[:4], "little")
    head: dict[str, Any] = orjson.loads(raw[4 : 4 + size])
    ids = array("i")
    ids.frombytes(raw[4 + size :])
    turn = Turn(head["n"], bytes.fromhex(head["m"]), bytes.fromhex(head["t"]), head["r"])
    return LastTurn(turn, ids.tolist())


class RedisTurns:
    """Turns shared by every process of a proxy (a key per attempt, expiring with its token)."""

    def __init__(self, url: str, ttl_s: float) -> None:
        self._redis = async_redis(url)
        self._ttl_ms = int(ttl_s * 1000)

    @staticmethod
    def _key(rollout_id: uuid.UUID, attempt: int) -> str:
        return f"{KEY_PREFIX}{rollout_id}:{attempt}"

    async def load(self, rollout_id: uuid.UUID, attempt: int) -> LastTurn | None:
        raw = await self._redis.get(self._key(rollout_id, attempt))
        if raw is None:
            return None
        return decode(raw.encode() if isinstance(raw, str) else raw)

    async def save(self, rollout_id: uuid.UUID, attempt: int, last: LastTurn) -> None:
        await self._redis.set(self._key(rollout_id, attempt), encode(last), px=self._ttl_ms)

    async def aclose(self) -> None:
        await self._redis.aclose()
