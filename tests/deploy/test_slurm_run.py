"""The Slurm templates run for real, without Slurm: head and node discover each other and a
rollout completes through the node's worker and engine, then both stop cleanly.

`#SBATCH` lines are comments to bash, so the templates run as plain scripts. The head gets this
machine's PostgreSQL and a private Redis (as a site would pass POLAR_MQ_DATABASE_URL and
POLAR_MQ_BROKER_URL); the node's `vllm` is a shim that starts the fake vLLM-shaped engine on the
port the template asks for. Everything else is the real thing: `polar-mq db upgrade`, api,
sweeper, flower, proxy and worker, the discovery file, the engine registration, the readiness
waits, and the SIGTERM handling (the node's worker drains; the head stops its children).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import Client
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import group_members
from polar_mq.models import LlmCall, Rollout
from polar_mq.stack.devstack import settings_env
from tests.e2e.stack import e2e_settings
from tests.reliability.private_redis import PrivateRedis
from tests.reliability.support import agent_command, wait_terminal, wait_until

SLURM = Path(__file__).parents[2] / "deploy" / "slurm"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not all(shutil.which(b) for b in ("curl", "redis-server")), reason="needs curl, redis"
    ),
]

VLLM_SHIM = """#!/usr/bin/env bash
# `vllm serve MODEL --host H --port P ...` -> the fake engine on H:P
set -euo pipefail
host=127.0.0.1 port=""
while [ $# -gt 0 ]; do
  case "$1" in
    --host) host=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) shift ;;
  esac
done
exec {python} -m polar_mq.testing.fake_vllm --host "$host" --port "$port"
"""


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def _script(path: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            ["bash", str(path)], env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _assert_group_ends(pgid: int, what: str) -> None:
    """Nothing of the script's process group outlives it (processes that were signalled may take
    a moment to be reaped by init once their parent, the script, has exited)."""
    try:
        wait_until(lambda: not _group_alive(pgid), 30, what, poll_s=0.2)
    except AssertionError:
        raise AssertionError(f"{what}: left {group_members(pgid)}") from None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Last resort at teardown: whatever the scripts left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if _group_alive(proc.pid):
            os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)


def test_head_and_node_discover_each_other_run_a_rollout_and_stop(
    broker: PrivateRedis, pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    settings = e2e_settings(pg_url, tmp_path, broker_url=broker.url)
    shared = tmp_path / "shared"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(VLLM_SHIM.format(python=sys.executable))
    (bin_dir / "vllm").chmod(0o755)
    secrets = tmp_path / "secrets"
    secrets.write_text(
        f"POLAR_MQ_SECRET_KEY={uuid.uuid4().hex * 2}\n"
        f"POLAR_MQ_PROXY_ADMIN_TOKEN={uuid.uuid4().hex * 2}\n"
    )
    call_log = tmp_path / "calls"
    call_log.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")},
        **settings_env(settings),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(SLURM.parents[1]),
        "POLAR_MQ_ENVIRONMENT": "development",
        "POLAR_MQ_SHARED_DIR": str(shared),
        "POLAR_MQ_SECRETS_FILE": str(secrets),
        "POLAR_MQ_VENV": sys.prefix,
        "HEAD_ADDR": "127.0.0.1",
        "HEAD_API_PORT": str(settings.api_port),
        "HEAD_PROXY_PORT": str(settings.proxy_port),
        "HEAD_FLOWER_PORT": str(free_port()),
        "HEAD_SWEEPER_METRICS_PORT": str(free_port()),
        "HEAD_PROXY_WORKERS": "1",
        "HEAD_POOL": settings.pool,
        "NODE_ADDR": "127.0.0.1",
        "NODE_NAME": settings.node_name,
        "NODE_POOL": settings.pool,
        "NODE_MODEL": "fake-model",
        "NODE_GPUS": "1",
        "NODE_VLLM_BASE_PORT": str(free_port()),
        "NODE_METRICS_PORT": str(free_port()),
        "NODE_CONCURRENCY": "run_agent=2",
        "NODE_DRAIN_TIMEOUT_S": "30",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # the node first, so it has to wait for the head's discovery file
    node = _script(SLURM / "node.sbatch", env, tmp_path / "node.out")
    head = _script(SLURM / "head.sbatch", env, tmp_path / "head.out")
    try:
        head_file = shared / "head.env"
        engines = shared / "engines" / f"{settings.node_name}.urls"
        wait_until(head_file.exists, 120, "the head's discovery file", poll_s=0.5)
        assert oct(head_file.stat().st_mode & 0o777) == "0o600"
        wait_until(engines.exists, 120, "the node to register its engine", poll_s=0.5)
        wait_until(lambda: "worker" in (tmp_path / "node.out").read_text(), 180,
                   "the node's worker to start", poll_s=0.5)  # fmt: skip

        client = Client(f"http://127.0.0.1:{settings.api_port}")
        submitted = client.submit(
            [{"instruction": "slurm", "calls": 2}], samples_per_task=1, evaluator="completed",
            timeouts={"agent_s": 60},
            harness={"type": "command", "command": agent_command(),
                     "env": {"REL_CALL_LOG": str(call_log)}},
        )  # fmt: skip
        ids = [str(r) for r in submitted.rollout_ids]
        wait_terminal(db_session_factory, ids, 180)
        with db_session_factory() as session:
            rollout = session.get(Rollout, uuid.UUID(ids[0]))
            assert rollout is not None
            assert (rollout.status, rollout.node) == ("completed", settings.node_name)
            calls = session.scalar(
                select(func.count()).select_from(LlmCall).where(LlmCall.rollout_id == rollout.id)
            )
        assert calls == 2, "both calls went through the head's proxy to the node's engine"

        node.send_signal(signal.SIGTERM)  # the batch shell only, as `scancel --batch` does
        assert node.wait(120) == 143
        assert not engines.exists(), "the node unregisters its engines"
        _assert_group_ends(node.pid, "the worker and the engine stop with the node")
        head.send_signal(signal.SIGTERM)
        assert head.wait(120) == 143
        assert not head_file.exists()
        _assert_group_ends(head.pid, "api, sweeper, flower, proxy stop with the head")
    except BaseException:
        for name in ("head.out", "node.out"):
            print(f"---- {name}\n{(tmp_path / name).read_text()[-4000:]}")
        raise
    finally:
        _stop(node)
        _stop(head)
