"""Nothing an agent sends is lost: awkward bytes are stored exactly, refused rows are kept.

Scenario 1: real agents send a prompt holding NUL and every other control character, a tool
result holding every byte 0-255 (as a latin-1 string) and a 10 MB tool result, through the real
proxy to the fake engine. PostgreSQL's `jsonb` refuses U+0000, which before lost the call (or
stored U+FFFD); now each call comes back byte-identical from the calls API, from the trajectory
(messages) and from `polar-mq export` (token ids, which the byte tokenizer turns back into the
exact text).

Scenario 2: a trigger makes PostgreSQL refuse one agent's call row. The row is kept in the
proxy's spill directory (`refused/`), counted on `/metrics`, logged with its rollout id, and the
rows of later agents are stored as usual.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import LlmCall
from polar_mq.proxy.store.spill import REFUSED_DIR, REFUSED_FILE
from polar_mq.proxy.store.spill_records import read_segment
from polar_mq.testing.fake_tokenizer import decode
from tests.reliability.payload_agent import POISON, messages_for
from tests.reliability.support import RelStack, check_invariants, rel_stack, wait_terminal

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]

AGENT = Path(__file__).with_name("payload_agent.py")
PAYLOADS = ("nul", "binary", "big")
TRIGGER = f"""
CREATE OR REPLACE FUNCTION polar_test_poison() RETURNS trigger AS $$
BEGIN
  IF NEW.request::text LIKE '%{POISON}%' THEN
    RAISE EXCEPTION 'poisoned call row (test trigger)';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER polar_test_poison BEFORE INSERT ON llm_calls
  FOR EACH ROW EXECUTE FUNCTION polar_test_poison();
"""


@pytest.fixture()
def big_rel(pg_url: str, tmp_path: Path) -> Iterator[RelStack]:
    """The suite's stack, with a spill directory of its own and a fake engine whose context
    holds the 10 MB prompt (its byte tokenizer makes one token per byte)."""
    fake = {"max_model_len": 16_000_000}
    with rel_stack(pg_url, tmp_path, fake=fake, proxy_spill_dir=tmp_path / "spill") as stack:
        yield stack


def submit(rel: RelStack, tasks: list[dict[str, Any]], **job: Any) -> tuple[str, list[str]]:
    harness = {
        "type": "command",
        "command": f"{sys.executable} {AGENT}",
        "env": {"REL_CALL_LOG": str(rel.call_log)},
    }
    tasks = [{"instruction": f"task {i}", **t} for i, t in enumerate(tasks)]
    submitted = rel.client.submit(
        tasks, evaluator="completed", harness=harness, timeouts={"agent_s": 300}, **job
    )
    return str(submitted.job_id), [str(r) for r in submitted.rollout_ids]


def export(rel: RelStack, job_id: str, out: Path) -> list[dict[str, Any]]:
    """`polar-mq export` as a user runs it, against the stack's API."""
    url = f"http://{rel.settings.api_host}:{rel.settings.api_port}"
    subprocess.run(
        [sys.executable, "-m", "polar_mq.cli", "export", job_id, "--out", str(out), "--url", url],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return [orjson.loads(line) for line in out.read_bytes().splitlines()]


@pytest.mark.timeout(900)  # ~2 min alone; a 10 MB prompt is 10 M tokens through every layer
def test_nul_binary_and_10mb_calls_come_back_byte_identical(
    big_rel: RelStack, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    rel = big_rel
    job_id, ids = submit(rel, [{"payload": p} for p in PAYLOADS])
    wait_terminal(db_session_factory, ids, 300)
    rollouts = check_invariants(rel, db_session_factory, ids, {i: "completed" for i in ids})
    rows = {row["rollout_id"]: row for row in export(rel, job_id, tmp_path / "out.jsonl")}
    for payload, rid in zip(PAYLOADS, ids, strict=True):
        sent = messages_for(payload)
        (call,) = [c for c in rel.client.calls(rid) if c["attempt"] == rollouts[rid].attempt]
        assert call["status_code"] == 200 and call["request"]["messages"] == sent, payload
        (sample,) = rel.client.trajectory(rid)["samples"]
        assert sample["messages"][: len(sent)] == sent, payload
        assert sample["messages"][-1] == call["response"]["choices"][0]["message"]
        row = rows[rid]
        assert row["prompt_ids"] == call["prompt_ids"] == sample["prompt_ids"], payload
        prompt = decode(row["prompt_ids"])
        assert all(m["content"] in prompt for m in sent), payload  # the tokens carry the bytes
    with db_session_factory() as session:
        stored = session.scalars(
            select(LlmCall).where(
                LlmCall.rollout_id == uuid.UUID(ids[1]), LlmCall.attempt == rollouts[ids[1]].attempt
            )
        ).one()
    tool_output = stored.request["messages"][-1]["content"]
    assert tool_output.encode("latin-1") == bytes(range(256))


def refused_total(rel: RelStack) -> float:
    body = httpx.get(f"{rel.settings.proxy_base_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "polar_proxy_rows_refused_total":
                return float(sample.value)
    raise AssertionError("polar_proxy_rows_refused_total is not exported")


@pytest.mark.timeout(600)
def test_a_row_the_database_refuses_is_kept_counted_and_logged(
    big_rel: RelStack, db_session_factory: sessionmaker[Session], pg_engine: Engine
) -> None:
    rel = big_rel
    with pg_engine.begin() as conn:
        conn.execute(text(TRIGGER))
    try:
        assert refused_total(rel) == 0
        _, poisoned = submit(
            rel,
            [{"payload": "poison"}],
            retries={"max_attempts": 1},
        )
        wait_terminal(db_session_factory, poisoned, 120)
        _, later = submit(rel, [{"payload": "nul"}, {"payload": "binary"}])
        wait_terminal(db_session_factory, later, 120)
    finally:
        with pg_engine.begin() as conn:
            conn.execute(text("DROP TRIGGER polar_test_poison ON llm_calls"))
    check_invariants(rel, db_session_factory, later, {i: "completed" for i in later})
    assert refused_total(rel) == 1
    with db_session_factory() as session:
        stored = {str(r) for r in session.scalars(select(LlmCall.rollout_id))}
    assert poisoned[0] not in stored and set(later) <= stored
    kept, _, corrupt = read_segment(rel.settings.proxy_spill_dir / REFUSED_DIR / REFUSED_FILE)
    assert not corrupt and [str(r["rollout_id"]) for r in kept] == poisoned
    assert kept[0]["request"]["messages"] == messages_for("poison")  # NUL included
    log = (rel.stack.log_dir / "proxy.log").read_text(errors="replace")
    assert f"rollout {poisoned[0]}" in log and "refused by the database" in log
