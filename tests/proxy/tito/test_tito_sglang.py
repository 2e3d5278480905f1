"""Token-in/token-out on SGLang: the token prompt goes to its native `/generate` with `input_ids`.

Against the SGLang-shaped fake with `/generate` (`testing.fake_sglang_generate`, the fake vLLM's
byte tokenizer): every token-in prompt equals what SGLang's chat path would render, the agent
gets the same answer it gets on the chat path (streamed or not, in SGLang's default cumulative
stream and in its incremental one), the stored row holds the ids `/generate` saw and sampled,
and `prefix_merge` gives one proven sample. Then the same through a real proxy process.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest
from proxy_support import proxy_settings, start_harness
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from tito_support import captured, chat_prompt, run_agent

from polar_mq.infra.ports import free_port
from polar_mq.models import Event, LlmCall, Rollout
from polar_mq.proxy.engines.sglang_generate import GenerateAnswer, generate_body
from polar_mq.stack.devstack import LocalStack
from polar_mq.testing.fake_sglang_generate import create_fake_sglang_generate_app
from polar_mq.testing.fake_tokenizer import IM_END
from polar_mq.trajectories.prefix_merge import PrefixMergeBuilder
from tests.e2e.stack import client_of, e2e_settings

AGENT = f"{sys.executable} -m polar_mq.agents.tool_agent"


def sglang_settings(**overrides: Any) -> Any:
    return proxy_settings(upstream_engine="sglang", proxy_tito="on", **overrides)


@pytest.mark.anyio
@pytest.mark.parametrize(("stream", "incremental"), [(False, False), (True, False), (True, True)])
async def test_sglang_token_in_calls_go_to_generate(stream: bool, incremental: bool) -> None:
    fake = create_fake_sglang_generate_app(incremental=incremental)
    async for h in start_harness(sglang_settings(), fake, streaming=stream):
        turns = await run_agent(h, stream=stream)
        rows = await h.rows()
        sent = fake.state.generate.requests
        assert len(rows) == len(turns) == 6 and len(sent) == 5
        assert [r["prompt_source"] for r in rows] == ["chat"] + ["tito"] * 5
        for body, row in zip(sent, rows[1:], strict=True):
            assert set(body) <= {"input_ids", "sampling_params", "stream", "return_logprob",
                                 "return_text_in_logprobs", "top_logprobs_num", "rid"}  # fmt: skip
            assert body["input_ids"] == row["prompt_ids"]
            assert body["stream"] is stream and body["return_logprob"] is True
            assert row["completion_ids"][-1] == IM_END  # the sampled end of turn, kept
            assert row["logprobs"] is not None
            assert len(row["logprobs"]) == len(row["completion_ids"])
        for turn, row in zip(turns, rows, strict=True):
            assert row["prompt_ids"] == chat_prompt(turn["body"])  # what chat would have sent
            assert row["complete"] and row["status_code"] == 200
            direct = await h.direct(
                "/v1/chat/completions", {**turn["body"], "stream": False, "model": "fake-model"}
            )
            message = direct["choices"][0]["message"]
            assert (turn["message"]["content"] or None) == (message["content"] or None)
            got = [c["function"] for c in turn["message"].get("tool_calls") or ()]
            assert got == [c["function"] for c in message.get("tool_calls") or ()]
        for before, row in itertools.pairwise(rows):
            context = before["prompt_ids"] + before["completion_ids"]
            assert row["prompt_ids"][: len(context)] == context
        result = PrefixMergeBuilder().build(captured(rows))
        assert result.stats["samples"] == 1 and result.stats["tito_proven"] == 5


def test_generate_body_and_answer_shapes() -> None:
    completion = {
        "model": "m",
        "prompt": [1, 2, 3],
        "max_tokens": 8,
        "temperature": 0.5,
        "seed": 7,
        "include_stop_str_in_output": True,
        "stream": False,
        "logprobs": 2,
        "return_token_ids": True,
    }
    body = generate_body(completion)
    assert body["input_ids"] == [1, 2, 3] and body["top_logprobs_num"] == 2
    assert body["sampling_params"] == {
        "max_new_tokens": 8,
        "temperature": 0.5,
        "sampling_seed": 7,
        "no_stop_trim": True,
    }
    data: dict[str, Any] = {
        "text": "hi",
        "output_ids": [5, 6, 2],
        "meta_info": {
            "id": "abc",
            "finish_reason": {"type": "stop", "matched": 2},
            "prompt_tokens": 3,
            "completion_tokens": 3,
            "output_token_logprobs": [[-0.1, 5, "h"], [-0.2, 6, "i"], [-0.3, 2, None]],
        },
    }
    GenerateAnswer([1, 2, 3], "m").answer(data)
    choice = data["choices"][0]
    assert (choice["text"], choice["token_ids"], choice["prompt_token_ids"]) == (
        "hi",
        [5, 6, 2],
        [1, 2, 3],
    )
    assert choice["finish_reason"] == "stop" and choice["logprobs"]["token_logprobs"] == [
        -0.1,
        -0.2,
        -0.3,
    ]
    assert data["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


@pytest.mark.e2e
@pytest.mark.slow
def test_the_pipeline_sends_sglang_token_prompts(
    pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    """Real proxy process (engine `sglang`, TITO on), workers, PostgreSQL, the reference agent;
    the fake SGLang in its own process. The second call of each rollout goes to `/generate` and
    is stored as `tito`; `prefix_merge` proves the chain."""
    port = free_port()
    settings = e2e_settings(
        pg_url,
        tmp_path,
        upstream_url=f"http://127.0.0.1:{port}",
        served_model="fake-model",
        upstream_engine="sglang",
        proxy_tito="on",
    )
    argv = [sys.executable, "-m", "polar_mq.testing.fake_sglang_generate", "--port", str(port)]
    with LocalStack(settings, tmp_path / "logs") as stack:
        stack._ready(stack._spawn("fake-sglang", argv), f"http://127.0.0.1:{port}/health", False)
        stack.proxy(wait=False)
        stack.workers(one_supervisor=True)
        stack.api(wait=False)
        stack.wait_ready()
        client = client_of(stack)
        job = client.submit(
            [{"instruction": "What is 6*7?", "answer": "42"}],
            samples_per_task=2,
            harness={
                "type": "command",
                "command": f"{sys.executable} -m polar_mq.agents.tool_agent",
            },
            builder="prefix_merge",
            evaluator="exact_match",
            timeouts={"agent_s": 60},
        )
        status = client.wait(str(job.job_id), progress=False, timeout=180)
    assert status["by_status"] == {"completed": 2}, status
    with db_session_factory() as session:
        for rollout in session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)):
            assert rollout.reward == 1.0, rollout.error
            calls = session.scalars(
                select(LlmCall).where(LlmCall.rollout_id == rollout.id).order_by(LlmCall.seq)
            ).all()
            assert [(c.prompt_source, c.tito_fallback) for c in calls] == [
                ("chat", "first_call"),
                ("tito", None),
            ]
            first, second = calls
            context = [*(first.prompt_ids or []), *(first.completion_ids or [])]
            assert (second.prompt_ids or [])[: len(context)] == context
            assert second.logprobs and len(second.logprobs) == len(second.completion_ids or [])
            stats: dict[str, Any] = session.scalars(
                select(Event.detail).where(
                    Event.rollout_id == rollout.id, Event.stage == "build", Event.kind == "finished"
                )
            ).one()
            assert (stats["samples"], stats["tito_proven"], stats["tito_unproven"]) == (1, 1, 0)
