"""Every process's `/metrics` during and after a real job, checked against the database; the
JSON-lines logs of the same run gathered by `polar-mq logs`; the Grafana dashboard's metric names.

One stack: fake vLLM-shaped upstream, proxy, API, sweeper and one worker node (`polar-mq
worker`: a Celery process per stage, each with two prefork children, behind one metrics port),
PostgreSQL and Redis.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.ports import free_port
from polar_mq.infra.tls import client_ssl_context
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Event, EventKind, LlmCall, Rollout
from polar_mq.stack.devstack import LocalStack
from tests.conftest import module_database
from tests.e2e.stack import client_of, e2e_settings
from tests.observability.scrape import Samples, scrape, value

pytestmark = pytest.mark.e2e

DASHBOARD = Path(__file__).parents[2] / "docker" / "grafana" / "polar_mq.json"
TASKS = [
    {"instruction": "What is 6*7?", "answer": "42"},
    {"instruction": "Compute 12+30.", "answer": "42"},
]


@dataclass
class Run:
    stack: LocalStack
    urls: dict[str, str]
    log_dir: Path
    job_id: str
    rollout_ids: list[str]
    during: dict[str, Samples]
    after: dict[str, Samples] = field(default_factory=dict)


def _wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=5, verify=client_ssl_context()).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} never answered")
        time.sleep(0.5)


def _wait_for_a_stage(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while value(scrape(url), "polar_stage_duration_seconds_count", outcome="done") < 1:
        assert time.monotonic() < deadline, "no stage finished"
        time.sleep(0.2)


pg_url, pg_engine = module_database("polar_mq_metrics_e2e")  # it counts every row


@pytest.fixture(scope="module")
def run(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("observability")
    upstream = free_port()
    settings = e2e_settings(
        pg_url, tmp, upstream_url=f"http://127.0.0.1:{upstream}", served_model="fake-model",
        worker_metrics_port=free_port(), sweeper_metrics_port=free_port(),
        log_dir=tmp / "jsonl", metrics_cache_s=0, sweep_interval_s=1,
    )  # fmt: skip
    s = settings
    urls = {
        "api": f"http://{s.api_host}:{s.api_port}/metrics",
        "proxy": f"{s.proxy_base_url}/metrics",
        "node": f"http://{s.metrics_host}:{s.worker_metrics_port}/metrics",
        "sweeper": f"http://{s.metrics_host}:{s.sweeper_metrics_port}/metrics",
    }
    with LocalStack(settings, tmp / "logs") as stack:
        stack.fake_upstream(upstream, ttft_ms=300)
        stack.proxy()
        stack.node(s.node_name, {st: 2 for st in Stage}, pool_impl="prefork", janitor=False)
        stack.sweeper(interval_s=1)
        stack.api()
        for url in urls.values():
            _wait_http(url)
        client = client_of(stack)
        job = client.submit(
            TASKS, samples_per_task=2, harness={"type": "reference"}, evaluator="exact_match"
        )
        _wait_for_a_stage(urls["node"])
        during = {name: scrape(url) for name, url in urls.items()}  # while it runs
        status = client.wait(str(job.job_id), progress=False, timeout=240)
        assert status["state"] == "completed", status
        httpx.post(f"{s.proxy_base_url}/admin/flush", timeout=30).raise_for_status()
        result = Run(
            stack, urls, s.log_dir or tmp, str(job.job_id), [str(r) for r in job.rollout_ids],
            during,
        )  # fmt: skip
        result.after = {name: scrape(url) for name, url in urls.items()}
        yield result


def test_every_process_serves_metrics_during_the_job(run: Run) -> None:
    assert value(run.during["node"], "polar_stage_duration_seconds_count", outcome="done") >= 1
    assert value(run.during["api"], "polar_api_requests_total", route="/v1/jobs") >= 1
    assert "polar_queue_depth" in run.during["node"]
    assert value(run.during["api"], "polar_rollouts") == len(run.rollout_ids)
    assert "polar_proxy_tokens_total" in run.during["proxy"]
    assert value(run.during["sweeper"], "polar_sweeper_sweeps_total") >= 1


def test_counts_match_the_database(run: Run, db_session_factory: sessionmaker[Session]) -> None:
    api, node, proxy = run.after["api"], run.after["node"], run.after["proxy"]
    with db_session_factory() as session:
        by_status = dict(
            session.execute(select(Rollout.status, func.count()).group_by(Rollout.status)).all()
        )
        finished = dict(
            session.execute(
                select(Event.stage, func.count())
                .where(Event.kind == EventKind.FINISHED)
                .group_by(Event.stage)
            ).all()
        )
        calls = session.scalars(select(LlmCall)).all()
    assert by_status == {"completed": len(run.rollout_ids)}
    for status in ("completed", "queued", "running", "failed"):
        assert value(api, "polar_rollouts", status=status) == by_status.get(status, 0), status
    assert value(api, "polar_jobs", state="completed") == 1
    assert value(api, "polar_jobs", state="running") == 0
    assert value(api, "polar_api_db_up") == 1

    for stage in Stage:
        done = value(node, "polar_stage_duration_seconds_count", stage=stage.value, outcome="done")
        assert done == finished[stage.value] == len(run.rollout_ids), stage
        runs = value(node, "polar_stage_duration_seconds_count", stage=stage.value)
        assert value(node, "polar_stage_queue_wait_seconds_count", stage=stage.value) == runs
    assert value(node, "polar_stage_leases_lost_total") == 0
    assert value(node, "polar_stage_retries_total") == 0
    assert value(node, "polar_queue_depth") == 0
    assert value(node, "polar_node_broker_up") == 1
    assert "polar_warm_pool_runtimes" in node

    assert len(calls) >= len(run.rollout_ids)
    assert value(proxy, "polar_proxy_requests_total", status="200") == len(calls)
    prompt = sum(len(c.prompt_ids or ()) for c in calls)
    completion = sum(len(c.completion_ids or ()) for c in calls)
    assert value(proxy, "polar_proxy_tokens_total", direction="in") == prompt
    assert value(proxy, "polar_proxy_tokens_total", direction="out") == completion
    assert value(run.after["sweeper"], "polar_sweeper_rollouts_total", action="requeued") == 0


def _logs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polar_mq.cli", "logs", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_logs_gathers_a_rollouts_lines_from_worker_and_proxy(run: Run) -> None:
    rollout = run.rollout_ids[0]
    done = _logs(rollout, "--dir", str(run.log_dir), "--json")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert {r["rollout_id"] for r in records} == {rollout}
    assert {"worker", "proxy"} <= {r["process"] for r in records}
    worker = [r for r in records if r["process"] == "worker"]
    assert {r["stage"] for r in worker} == {s.value for s in Stage}
    assert {r["job_id"] for r in worker} == {run.job_id}
    assert all(r["attempt"] == 1 for r in records)
    stamps = [r["timestamp"] for r in records]
    assert stamps == sorted(stamps, key=lambda t: t.replace("Z", "+00:00"))
    text = _logs(rollout, "--dir", str(run.log_dir))
    assert text.returncode == 0 and "prepare done" in text.stdout, text.stderr


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stdout + done.stderr).split())  # the console wraps long lines


def test_logs_refuses_bad_input_with_a_message(run: Run, tmp_path: Path) -> None:
    malformed = _logs("not-a-uuid", "--dir", str(run.log_dir))
    assert malformed.returncode == 2 and "not a rollout id" in _said(malformed)
    unknown = _logs("00000000-0000-0000-0000-000000000000", "--dir", str(run.log_dir))
    assert unknown.returncode == 1 and "no log lines" in _said(unknown)
    missing = _logs(run.rollout_ids[0], "--dir", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in _said(missing)
    for done in (malformed, unknown, missing):
        assert "Traceback" not in done.stdout + done.stderr


NAME = re.compile(r"\bpolar_[a-z0-9_]+")


def test_dashboard_names_only_metrics_that_exist(run: Run) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    assert len(exprs) >= 10
    served = {name for samples in run.after.values() for name in samples}
    named = {name for expr in exprs for name in NAME.findall(expr)}
    assert named and named <= served, sorted(named - served)
