"""The rollout page shows a TITO rollout's segments: how each call's prompt was built, why a
segment starts, and where each call's part of a sample begins.

The rollout is made through the real proxy (its app, in process, `proxy_tito=on`, in front of
the vLLM-shaped fake, writing its calls to PostgreSQL with the real writer); the build stage's
own code turns the stored calls into `prefix_merge` samples; the page is the dashboard's.
The agent keeps its history for two turns, then compacts it (a fallback, a new segment) and
keeps the new history for one more turn.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session, sessionmaker
from ui_support import sign_in, submit

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.config import Settings
from polar_mq.jobs.read_models import TrajectorySampleRecord
from polar_mq.lifecycle.transitions import Claimed
from polar_mq.models import LlmCall, Rollout
from polar_mq.proxy import create_proxy_app
from polar_mq.spec import JobSpec
from polar_mq.testing.fake_vllm import create_fake_vllm_app
from polar_mq.ui.trajectory_view import CallMark, segment_start
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.stages import build
from polar_mq.workers.stages.outcomes import SAMPLES
from tests.ui.conftest import Keys

SECRET = "segments-test-secret"
SYSTEM = {"role": "system", "content": "You compute."}


async def _agent(client: httpx.AsyncClient) -> None:
    """Two turns on one history, then a compacted history and one more turn on it."""

    async def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
        answer = await client.post(
            "/v1/chat/completions", json={"model": "a", "messages": messages}
        )
        assert answer.status_code == 200, answer.text
        message: dict[str, Any] = answer.json()["choices"][0]["message"]
        return {"role": "assistant", "content": message["content"]}

    history: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "What is 2+3?"}]
    for follow_up in ("Go on.", None):
        history.append(await ask(history))
        if follow_up:
            history.append({"role": "user", "content": follow_up})
    compacted = [SYSTEM, {"role": "user", "content": "Summary: 2+3 was asked. Now 4*5?"}]
    compacted.append(await ask(compacted))
    compacted.append({"role": "user", "content": "Thanks, and 6-1?"})
    await ask(compacted)


async def _run_through_proxy(settings: Settings, rollout_id: uuid.UUID) -> None:
    app = create_proxy_app(settings, upstream_transport=httpx.ASGITransport(create_fake_vllm_app()))
    token = issue_rollout_token(SECRET, rollout_id, 600, attempt=1, unbudgeted=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app),
            base_url="http://proxy",
            headers={"authorization": f"Bearer {token}"},
        ) as client,
    ):
        await _agent(client)
        await app.state.proxy.sink.flush()  # every call in PostgreSQL


def _build(engine: Engine, factory: sessionmaker[Session], rollout_id: uuid.UUID) -> None:
    """The build stage's own reading and building; its sample rows inserted as it would."""
    with factory() as session:
        rollout = session.get_one(Rollout, rollout_id)
        ctx = cast(WorkerContext, SimpleNamespace(autocommit_engine=engine))
        claimed = cast(
            Claimed, SimpleNamespace(rollout=rollout, spec=JobSpec(builder="prefix_merge"))
        )
        outcome = build.run(ctx, claimed)
        assert outcome.built.stats["tito_proven"] == 2 and outcome.built.stats["samples"] == 2
        session.execute(insert(SAMPLES), outcome.sample_rows())
        session.commit()


def _section(page: str, marker: str) -> str:
    return page.split(marker, 1)[1].split("</section>", 1)[0]


def test_rollout_page_shows_tito_segments_and_fallbacks(
    client: TestClient,
    keys: Keys,
    pg_url: str,
    pg_engine: Engine,
    db_session_factory: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    _, (rollout_id,) = submit(client, keys.alice_write, [{"instruction": "compute"}], 1)
    settings = Settings(
        secret_key=SECRET,
        served_model="fake-model",
        upstream_url="http://upstream.test",
        database_url=pg_url,
        proxy_spill_dir=tmp_path / "spill",
        proxy_tito="on",
    )
    asyncio.run(_run_through_proxy(settings, rollout_id))
    with db_session_factory() as session:
        stored = session.execute(
            select(LlmCall.seq, LlmCall.prompt_source, LlmCall.tito_fallback)
            .where(LlmCall.rollout_id == rollout_id)
            .order_by(LlmCall.seq)
        ).all()
    seqs = [row.seq for row in stored]
    assert [(r.prompt_source, r.tito_fallback) for r in stored] == [
        ("chat", "first_call"),
        ("tito", None),
        ("chat", "history_rewritten"),
        ("tito", None),
    ]
    _build(pg_engine, db_session_factory, rollout_id)

    api_calls = client.get(
        f"/v1/rollouts/{rollout_id}/calls", headers={"authorization": f"Bearer {keys.alice_read}"}
    )
    assert [(c["prompt_source"], c["tito_fallback"]) for c in api_calls.json()["calls"]] == [
        (r.prompt_source, r.tito_fallback) for r in stored
    ]  # the REST API tells the same

    sign_in(client, keys.alice_read)
    page = client.get(f"/ui/rollouts/{rollout_id}")
    assert page.status_code == 200
    text = page.text

    calls = text.split('id="calls"', 1)[1].split("</table>", 1)[0]
    cells = re.findall(r'<td class="prompt-source">(.*?)</td>', calls)
    shown = [re.sub(r"<[^>]+>", "", cell).split() for cell in cells]
    assert shown == [["chat", "first_call"], ["tito"], ["chat", "history_rewritten"], ["tito"]]

    first, second = _section(text, 'id="sample-0"'), _section(text, 'id="sample-1"')
    assert "New segment:" in first and "the attempt&#39;s first call" in first
    assert "TITO fell back (history_rewritten)" in second
    assert "the agent rewrote its earlier messages" in second
    assert 'id="sample-2"' not in text  # two segments: the compaction split the rollout once
    labels = [
        f"call {seqs[0]} · chat (first_call)",
        f"call {seqs[1]} · tito",
        f"call {seqs[2]} · chat (history_rewritten)",
        f"call {seqs[3]} · tito",
    ]
    for section, own in ((first, labels[:2]), (second, labels[2:])):
        listed = section.split("segment-calls", 1)[1].split("</p>", 1)[0]
        assert re.findall(r"call \d+ · [^<]+", listed) == own
        # inside the response: a mark where each call's part begins, the first one at the start
        trajectory = section.split('class="text trajectory">', 1)[1].split("</pre>", 1)[0]
        marks = re.findall(r'class="tag call-mark[^"]*"[^>]*>([^<]+)<', trajectory)
        assert marks == own
        assert trajectory.startswith('<span class="tag call-mark')
        between = trajectory.split(own[1], 1)[0].split(own[0], 1)[1]
        assert 'class="tok tr"' in between  # the first call's trained completion comes first


def _sample(index: int, builder: str = "prefix_merge", **meta: object) -> TrajectorySampleRecord:
    return TrajectorySampleRecord(index, builder, [1, 2], [3], [1], None, None, dict(meta))


def test_each_way_a_segment_can_start_is_told_apart() -> None:
    chat, tito = CallMark(3, "chat", None), CallMark(3, "tito", None)
    option = CallMark(3, "chat", "response_format")
    cases = [
        (_sample(0), CallMark(1, "chat", "first_call"), "start", "the attempt's first call"),
        (_sample(1), option, "fallback", "the option response_format is honoured only on the"),
        (_sample(1, prefix_break=True), chat, "break", "prefix break"),
        (_sample(1), tito, "break", "does not extend the chain before it (a bug)"),
        (_sample(0), chat, "start", "the attempt's first call"),  # TITO off
        (_sample(1), chat, "start", "a new conversation"),  # a sub-agent's, say
        (_sample(1, builder="per_call"), chat, "start", "one sample per call (per_call)"),
        (_sample(1), None, "", ""),  # its calls are no longer stored
    ]
    for sample, first, kind, words in cases:
        said, told = segment_start(sample, first)
        assert told == kind and words in said, (sample, first, said)
