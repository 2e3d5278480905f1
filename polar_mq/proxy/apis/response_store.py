"""The proxy's own record of OpenAI Responses, so `previous_response_id` works without a server.

Harnesses that let the server keep the conversation (`store` left true, then
`previous_response_id` on the next turn) expect the Responses API to remember it; the engine does
not, so the proxy does: per response id, the rollout it belongs to and the whole conversation as
Responses items (the history the call was given plus its output). A response is only served back
to the rollout that made it. The record is per proxy process and bounded (least recently used
first out): a harness whose next turn lands on another process, or comes after eviction, gets
OpenAI's `previous_response_not_found` 400 and can resend the history (as Codex always does).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from typing import Any

RESPONSES_MAX = 20_000


class ResponseStore:
    def __init__(self, max_responses: int = RESPONSES_MAX) -> None:
        self._items: OrderedDict[str, tuple[uuid.UUID, list[dict[str, Any]]]] = OrderedDict()
        self._max = max_responses

    def put(self, response_id: str, rollout_id: uuid.UUID, items: list[dict[str, Any]]) -> None:
        self._items[response_id] = (rollout_id, items)
        self._items.move_to_end(response_id)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def get(self, response_id: str, rollout_id: uuid.UUID) -> list[dict[str, Any]] | None:
        """The conversation up to and including `response_id`, if it is this rollout's."""
        entry = self._items.get(response_id)
        if entry is None or entry[0] != rollout_id:
            return None
        self._items.move_to_end(response_id)
        return entry[1]

    def __len__(self) -> int:
        return len(self._items)
