"""`/tokenize` and `/detokenize` via the proxy: authenticated like `/v1/models`, passed through."""

from __future__ import annotations

import pytest
from proxy_support import Harness

pytestmark = pytest.mark.anyio

PROMPT = "What is 2 + 2?"


async def test_tokenize_needs_a_rollout_token_and_forwards_nothing_without(
    harness: Harness,
) -> None:
    for path in ("/tokenize", "/v1/tokenize", "/v1/detokenize"):
        response = await harness.client.post(path, json={"prompt": PROMPT})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert harness.stats.paths["/tokenize"] == harness.stats.paths["/detokenize"] == 0


@pytest.mark.parametrize("path", ["/tokenize", "/v1/tokenize"])
async def test_tokenize_answers_what_the_engine_answers(harness: Harness, path: str) -> None:
    """The agent's model name is rewritten (the fake answers 404 to any other model)."""
    response = await harness.post(path, {"model": "my-policy", "prompt": PROMPT})
    direct = await harness.direct("/tokenize", {"model": "fake-model", "prompt": PROMPT})
    assert response.status_code == 200
    assert response.json() == direct and direct["count"] == len(PROMPT)


async def test_token_in_the_url_path_and_detokenize_round_trip(harness: Harness) -> None:
    base = f"/r/{harness.token}"
    tokens = (await harness.client.post(base + "/v1/tokenize", json={"prompt": PROMPT})).json()
    response = await harness.client.post(base + "/detokenize", json={"tokens": tokens["tokens"]})
    assert response.status_code == 200 and response.json() == {"prompt": PROMPT}


async def test_engine_errors_and_oversized_bodies(harness: Harness) -> None:
    refused = await harness.post("/v1/tokenize", {"model": "my-policy"})
    assert refused.status_code == 400 and "prompt" in refused.json()["error"]["message"]
    huge = await harness.post(
        "/v1/tokenize", {"prompt": "x" * (harness.settings.max_body_bytes + 1)}
    )
    assert huge.status_code == 413
    assert harness.stats.paths["/tokenize"] == 1  # only the first reached the engine
