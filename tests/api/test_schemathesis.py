"""schemathesis against a real `polar-mq api` process: every operation, with a key of all scopes.

The API runs as a child process on a database of its own (PostgreSQL, migrations applied) and
publishes to Redis under a queue prefix no worker reads. One finished job is seeded (rollouts
completed, an artifact, every group leased and acknowledged), and schemathesis is told its ids for
most draws (`dictionaries`), so it reaches past the 404s into the real handlers, streams included
(the job is done, so its event stream ends at once).

The run uses schemathesis's own engine (`st run`: examples, coverage, fuzzing and stateful phases)
and fails on any of: a 5xx, an undocumented status code, a content type or a header the schema does
not declare, a body that violates the response schema, an `Allow` header that disagrees with the
schema, a schema-violating request accepted, or auth ignored. Generation is deterministic and the
example database off, so a CI failure reproduces byte for byte.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from api_support import REDIS_URL, complete_rollout
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import create_db_engine, make_session_factory, unit_of_work
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.jobs import deliveries
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.models.artifact import RolloutArtifact
from polar_mq.tenants.keys import create_api_key
from polar_mq.tenants.quotas import Owner
from polar_mq.tenants.scopes import ALL_SCOPES
from tests.conftest import scratch_database

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

TENANT = "fuzz"
CONSUMER = "seed-trainer"
MAX_EXAMPLES = 20
"""Per operation and phase: the whole run stays near two minutes on 2 cores."""
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "allow_header_conformance",
    "negative_data_rejection",
    "unsupported_method",
    "missing_required_header",
    "ignored_auth",
)


@dataclass(frozen=True)
class Seeded:
    key: str
    job_id: uuid.UUID
    rollout_id: uuid.UUID


@pytest.fixture(scope="module")
def fuzz_db_url() -> Iterator[str]:
    with scratch_database("polar_mq_fuzz") as url:
        yield url


def _seed(factory: sessionmaker[Session]) -> Seeded:
    """A key of every scope and a finished job of its tenant whose groups are all acknowledged."""
    with unit_of_work(factory) as session:
        key = create_api_key(session, "schemathesis", tenant=TENANT, scopes=",".join(ALL_SCOPES))
        spec = JobCreate.model_validate(
            {"tasks": [{"instruction": "a"}, {"instruction": "b"}], "samples_per_task": 2}
        )
        job = create_job(session, spec, "fuzz", Owner(TENANT))
    for rollout_id in job.rollout_ids:
        complete_rollout(factory, rollout_id, reward=1.0)
    with unit_of_work(factory) as session:
        session.add(
            RolloutArtifact(
                rollout_id=job.rollout_ids[0], name="agent.log", size=5, content=b"hello"
            )
        )
    with unit_of_work(factory) as session:
        lease = deliveries.lease_groups(session, job.job_id, CONSUMER, 10, 600.0)
    ids = [group.delivery.delivery_id for group in lease.groups]
    assert len(ids) == 2, lease
    with unit_of_work(factory) as session:
        deliveries.ack_groups(session, job.job_id, CONSUMER, ids)
    return Seeded(key, job.job_id, job.rollout_ids[0])


@pytest.fixture(scope="module")
def seeded(fuzz_db_url: str) -> Iterator[Seeded]:
    engine = create_db_engine(fuzz_db_url)
    try:
        yield _seed(make_session_factory(engine))
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def api_base(
    fuzz_db_url: str, seeded: Seeded, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    port = free_port()
    prefix = f"fuzz{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    env.update(
        POLAR_MQ_IMPORT_ALLOWLIST=os.environ.get("POLAR_MQ_IMPORT_ALLOWLIST", "polar_mq"),
        POLAR_MQ_DATABASE_URL=fuzz_db_url,
        POLAR_MQ_BROKER_URL=f"{REDIS_URL}/0",
        POLAR_MQ_QUEUE_PREFIX=prefix,
        POLAR_MQ_API_PORT=str(port),
        POLAR_MQ_POOL="fuzz",
        # policy updates reach no proxy (nothing listens there): they answer at once
        POLAR_MQ_PROXY_ADMIN_URLS=f"http://127.0.0.1:{free_port()}",
        # bounded jobs: generated submissions stay small, and the 422 quota path is exercised
        POLAR_MQ_QUOTA_MAX_ROLLOUTS_PER_REQUEST="64",
    )
    log_dir = Path(tmp_path_factory.mktemp("schemathesis-api"))
    proc = ManagedProcess(
        "api", [sys.executable, "-m", "polar_mq.cli", "api"], env, log_dir, fork=True
    )
    proc.start()
    client = redis.Redis.from_url(f"{REDIS_URL}/0")
    try:
        base = f"http://127.0.0.1:{port}"
        proc.wait_http(f"{base}/healthz", timeout_s=60)
        yield base
    finally:
        proc.stop()
        names = list(client.scan_iter(match=f"*{prefix}*", count=1000))
        if names:
            client.delete(*names)
        client.close()


def _config(seeded: Seeded) -> str:
    """schemathesis.toml of the run: the checks, reproducible generation and the seeded ids."""
    checks = "\n".join(f"{name}.enabled = true" for name in CHECKS)
    return f"""
[generation]
deterministic = true
max-examples = {MAX_EXAMPLES}

[checks]
enabled = false
{checks}

[dictionaries.job_ids]
values = ["{seeded.job_id}"]

[dictionaries.rollout_ids]
values = ["{seeded.rollout_id}"]

[dictionaries.artifact_names]
values = ["agent.log"]

[parameters]
"path.job_id" = {{ dictionary = "job_ids", probability = 0.7 }}
"path.rollout_id" = {{ dictionary = "rollout_ids", probability = 0.7 }}
"path.name" = {{ dictionary = "artifact_names", probability = 0.5 }}

# Ids are the seeded ones or random, never the jobs the run itself submits: those stay queued
# (no worker), so their event stream and long-polls would rightly wait far past a request timeout.
[phases.examples.extra-data-sources]
responses = false
[phases.coverage.extra-data-sources]
responses = false
[phases.fuzzing.extra-data-sources]
responses = false

[[operations]]
include-path = "/v1/jobs/{{job_id}}/groups/stream"
phases.stateful.enabled = false

[[operations]]
include-path = "/v1/jobs/{{job_id}}/groups/lease"
phases.stateful.enabled = false
"""


def test_every_operation_conforms(api_base: str, seeded: Seeded, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(_config(seeded))
    argv = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
        f"{api_base}/openapi.json", "--header", f"Authorization: Bearer {seeded.key}",
        "--workers", "1", "--request-timeout", "20", "--no-color",
        "--report", "junit", "--report-dir", str(tmp_path / "report"),
    ]  # fmt: skip
    log = tmp_path / "schemathesis.log"
    started = time.monotonic()
    with log.open("w") as out:
        run = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=400, cwd=tmp_path)
    took = time.monotonic() - started
    output = log.read_text()
    print(output[-6000:])
    print(f"schemathesis run took {took:.1f} s")
    assert run.returncode == 0, output[-20000:]
    selected = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", output)
    assert selected is not None, output[-3000:]
    assert len(set(selected.groups())) == 1, f"not every operation was tested: {selected[0]}"
