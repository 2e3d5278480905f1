"""Full-checkpoint weight sync: a policy version published with a model directory makes every
SGLang backend reload its weights from disk (`/update_weights_from_disk`), with the adapters'
sequence: pause, drain, load everywhere, resume; a backend that fails leaves the rotation; a
late joiner loads it before it serves; every call is stamped with the version whose weights
served it.

The engines are fake SGLang servers in their own processes (and in-thread where a test flips a
failure on), the proxy is real, on a socket, with `upstream_engine: sglang`. Each checkpoint a
fake loads moves every logprob of its answers by `CHECKPOINT_SHIFT`, so each call tells which
weights served it. The API, the client and the CLI drive the same through `checkpoint_path`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from backends_support import (
    ADMIN_TOKEN,
    CHAT,
    QUESTION,
    Stack,
    auth,
    proxy_stack,
    rollout_preferring,
    wait_until,
)
from proxy_support import FRESH_HTTP
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from polar_mq.cli import app as cli_app
from polar_mq.client import Client
from polar_mq.config import Settings
from polar_mq.policy.proxies import ProxyControl
from polar_mq.policy.service import PolicyService
from polar_mq.policy.weights import Adapter, path_problem
from polar_mq.proxy.adapters import load_everywhere, reconcile
from polar_mq.proxy.backends import BackendPool
from polar_mq.proxy.checkpoints import NO_ROUTE
from polar_mq.proxy.policy_sync import PolicySync
from polar_mq.testing.fake_sglang import CHECKPOINT_SHIFT, FakeSglang, create_fake_sglang_app
from polar_mq.testing.servers import free_port, serve_in_thread
from polar_mq.ui.app import create_app

CALLS = 32
LOADED_S = 120.0
"""How long the under-load test waits for its 32 calls to be in flight, held or stored: long,
for a CI machine whose cores are shared (the calls take seconds each, 200 ms a token)."""
BODY: dict[str, Any] = {"model": "whatever-the-agent-says", "messages": QUESTION, "logprobs": True}


class SglangProcess:
    """`python -m polar_mq.testing.fake_sglang` in its own process."""

    def __init__(self, token_delay_ms: float = 0.0) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "polar_mq.testing.fake_sglang"]
        argv += ["--port", self.url.rsplit(":", 1)[1], "--token-delay-ms", str(token_delay_ms)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._healthy, 30)

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, "fake SGLang exited"
        try:
            return FRESH_HTTP.get(f"{self.url}/health").status_code == 200
        except httpx.TransportError:
            return False

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@contextmanager
def sglang_stack(processes: int = 0, token_delay_ms: float = 0.0) -> Iterator[Stack]:
    """A proxy for SGLang in front of `processes` fake SGLang processes."""
    with ExitStack() as stack:
        engines = [SglangProcess(token_delay_ms) for _ in range(processes)]
        for engine in engines:
            stack.callback(engine.close)
        urls = tuple(e.url for e in engines)
        yield stack.enter_context(proxy_stack(n_fakes=0, extra_urls=urls, upstream_engine="sglang"))


def checkpoint_dir(tmp_path: Path, name: str = "checkpoint") -> str:
    """A directory shaped like `save_pretrained`'s output (the fake reads only the config)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    return str(folder)


def call(stack: Stack, rollout: uuid.UUID) -> httpx.Response:
    return stack.client.post(f"{stack.url}{CHAT}", json=BODY, headers=auth(rollout))


def first_logprob(response: httpx.Response) -> float:
    assert response.status_code == 200, response.text
    return float(response.json()["choices"][0]["logprobs"]["content"][0]["logprob"])


def service(factory: sessionmaker[Session], stack: Stack) -> PolicyService:
    return PolicyService(factory, ProxyControl([stack.url], ADMIN_TOKEN))


def test_publishing_a_checkpoint_under_load_reloads_every_sglang_backend(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with sglang_stack(2, token_delay_ms=200) as stack, ThreadPoolExecutor(2 * CALLS + 1) as pool:
        base = first_logprob(call(stack, uuid.uuid4()))  # version 0, the weights it started with
        before = [pool.submit(call, stack, uuid.uuid4()) for _ in range(CALLS)]
        wait_until(
            lambda: sum(b["in_flight"] for b in stack.backends().values()) == CALLS, LOADED_S
        )
        path = checkpoint_dir(tmp_path)
        publish = pool.submit(service(db_session_factory, stack).update, 1, False, 30.0, None, path)
        wait_until(lambda: all(b["paused"] for b in stack.backends().values()), LOADED_S)
        after = [pool.submit(call, stack, uuid.uuid4()) for _ in range(CALLS)]
        wait_until(lambda: sum(b["waiting"] for b in stack.backends().values()) == CALLS, LOADED_S)
        update = publish.result(60)

        assert update.adapter == Adapter("polar-ckpt-v1", path) and update.adapter.is_checkpoint
        assert update.drained and update.drained_calls == CALLS and update.adapter_loaded
        assert [r.adapter_loads for r in update.adapter_loads] == [dict.fromkeys(stack.backends())]
        old = [first_logprob(f.result(60)) for f in before]
        new = [f.result(60) for f in after]
        assert set(old) == {base}  # in flight at the pause: finished on the old weights
        assert {first_logprob(r) for r in new} == {base + CHECKPOINT_SHIFT}  # after: reloaded
        assert {r.json()["metadata"]["weight_version"] for r in new} == {"polar-ckpt-v1"}
        wait_until(lambda: len(stack.sink.rows) == 1 + 2 * CALLS, LOADED_S)
        assert Counter(row["policy_version"] for row in stack.sink.rows) == {0: 1 + CALLS, 1: CALLS}
        for row in stack.sink.rows:  # each call stamped with the version whose weights served it
            reloaded = row["logprobs"][0] == base + CHECKPOINT_SHIFT
            assert reloaded == (row["policy_version"] == 1), row
        views = stack.backends().values()
        assert {(b["adapter"], b["adapter_error"]) for b in views} == {("polar-ckpt-v1", None)}
        reloaded_by = {row["backend"] for row in stack.sink.rows if row["policy_version"] == 1}
        assert reloaded_by == set(stack.backends())  # both served calls after the resume

        second = service(db_session_factory, stack).update(2, False, 5.0, None, path + "2")
        assert second.adapter_loaded is False  # no model there: every backend out of rotation
        (loads,) = [r.adapter_loads or {} for r in second.adapter_loads]
        assert all("not a model directory" in str(e) for e in loads.values()), loads
        assert call(stack, uuid.uuid4()).status_code == 503  # not served by the old weights


def test_a_backend_that_fails_to_reload_leaves_the_rotation_until_it_loads(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    good_app, bad_app = create_fake_sglang_app(), create_fake_sglang_app()
    with (
        serve_in_thread(good_app) as good,
        serve_in_thread(bad_app) as bad,
        proxy_stack(n_fakes=0, extra_urls=(good, bad), upstream_engine="sglang") as stack,
    ):
        fakes: dict[str, FakeSglang] = {good: good_app.state.fake, bad: bad_app.state.fake}
        fakes[bad].fail_loads = True
        path = checkpoint_dir(tmp_path)
        update = service(db_session_factory, stack).update(1, False, 5.0, None, path)
        assert update.adapter_loaded is False
        (loads,) = [r.adapter_loads for r in update.adapter_loads]
        assert loads is not None and loads[good] is None and "injected" in str(loads[bad])
        assert stack.backends()[bad]["adapter_error"] is not None
        for _ in range(8):  # every rollout goes to the backend that carries the new weights
            assert first_logprob(call(stack, rollout_preferring([bad], [good, bad]))) < 0
        assert fakes[bad].stats.requests == 0 and fakes[good].stats.requests == 8

        fakes[bad].fail_loads = False  # the health loop reloads it, then it serves again
        wait_until(lambda: stack.backends()[bad]["adapter_error"] is None)
        assert fakes[bad].model_path == path and fakes[bad].checkpoint_loads == 1
        assert call(stack, rollout_preferring([bad], [good, bad])).status_code == 200
        assert fakes[bad].stats.events == [("update_weights", path), ("serve", "fake-model")]


def test_a_backend_that_joins_later_reloads_the_checkpoint_before_it_serves(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with sglang_stack(1) as stack:
        (first,) = stack.backends()
        path = checkpoint_dir(tmp_path)
        assert service(db_session_factory, stack).update(3, False, 5.0, None, path).adapter_loaded
        late = SglangProcess()
        try:
            added = stack.admin("POST", "/admin/backends", {"action": "add", "url": late.url})
            assert added.status_code == 200, added.text
            view = stack.backends()[late.url]
            assert (view["adapter"], view["adapter_error"], view["policy_version"]) == (
                "polar-ckpt-v3",
                None,
                3,
            )
            answer = call(stack, rollout_preferring([late.url], [first, late.url]))
            assert answer.json()["metadata"]["weight_version"] == "polar-ckpt-v3"
            wait_until(lambda: len(stack.sink.rows) == 1)
            assert stack.sink.rows[0]["backend"] == late.url
        finally:
            late.close()


def test_an_engine_that_cannot_reload_from_disk_is_taken_out_with_the_reason(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    """The fake vLLM, like vLLM without `VLLM_SERVER_DEV_MODE`, has neither route (404s)."""
    with proxy_stack(n_fakes=1) as stack:
        path = checkpoint_dir(tmp_path)
        update = service(db_session_factory, stack).update(1, False, 5.0, None, path)
        assert update.adapter_loaded is False
        (loads,) = [r.adapter_loads for r in update.adapter_loads]
        assert list((loads or {}).values()) == [NO_ROUTE]
        assert "VLLM_SERVER_DEV_MODE" in NO_ROUTE
        assert call(stack, uuid.uuid4()).status_code == 503


def test_rest_client_and_cli_publish_a_checkpoint(
    pg_url: str, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with sglang_stack(1) as stack:
        settings = Settings.model_validate(
            {
                "database_url": pg_url,
                "broker_url": "redis://127.0.0.1:6379/0",
                "proxy_admin_urls": [stack.url],
                "proxy_admin_token": ADMIN_TOKEN,
            }
        )
        app = create_app(settings, session_factory=db_session_factory, publisher=lambda m: None)
        with serve_in_thread(app) as url, Client(url, timeout=30) as client:
            lora = tmp_path / "lora"
            lora.mkdir()
            (lora / "adapter_config.json").write_text("{}")
            (lora / "config.json").write_text("{}")
            one = checkpoint_dir(tmp_path, "one")
            for body, why in (
                ({"checkpoint_path": "relative"}, "checkpoint_path must be an absolute path"),
                ({"checkpoint_path": str(tmp_path)}, "holds no config.json"),
                ({"checkpoint_path": str(lora)}, "is a LoRA adapter"),
                ({"checkpoint_path": one, "adapter_path": str(lora)}, "not both"),
            ):
                refused = httpx.post(f"{url}/v1/policy", json={"version": 1, **body})
                assert refused.status_code == 422 and why in refused.text, refused.text

            answer = client.set_policy(1, checkpoint_path=one)
            assert answer["adapter"] == {"name": "polar-ckpt-v1", "path": one}
            assert answer["adapter_loaded"] is True and answer["paused"] is False
            assert client.policy()["adapter"] == {"name": "polar-ckpt-v1", "path": one}
            assert client.set_policy(1, checkpoint_path=one)["adapter_loaded"]  # a retry
            other = httpx.post(
                f"{url}/v1/policy", json={"version": 1, "adapter_path": str(lora)}
            )  # other weights under the same version: the engines would keep the first
            assert other.status_code == 409 and "as a new version" in other.text, other.text
            served = call(stack, uuid.uuid4())
            assert served.json()["metadata"]["weight_version"] == "polar-ckpt-v1"

            two = checkpoint_dir(tmp_path, "two")
            run = CliRunner().invoke(cli_app, ["policy", "2", "--checkpoint", two, "--url", url])
            assert run.exit_code == 0, run.output
            printed = json.loads(run.output)
            assert (printed["version"], printed["adapter_loaded"]) == (2, True)
            assert printed["adapter"] == {"name": "polar-ckpt-v2", "path": two}
            reloaded = call(stack, uuid.uuid4())
            assert reloaded.json()["metadata"]["weight_version"] == "polar-ckpt-v2"
            for argv, why in (
                (["policy", "--checkpoint", two], "needs the version"),
                (["policy", "3", "--checkpoint", two, "--adapter", str(lora)], "not both"),
            ):
                run = CliRunner().invoke(cli_app, [*argv, "--url", url])
                assert run.exit_code != 0 and why in run.output, run.output


def test_a_checkpoint_path_is_checked_for_its_layout(tmp_path: Path) -> None:
    field = "checkpoint_path"
    assert path_problem(checkpoint_dir(tmp_path), field) is None
    assert path_problem("/on/the/engines/disk/only", field) is None  # the proxies tell
    problem = path_problem(str(tmp_path), field)
    assert problem is not None and "config.json" in problem


@pytest.mark.parametrize("name", ["polar-ckpt-v7", "polar-v7"])
def test_the_kind_of_weights_is_in_their_name(name: str) -> None:
    assert Adapter(name, "/w").is_checkpoint == name.startswith("polar-ckpt-")


def test_policy_sync_reloads_the_recorded_checkpoint_before_it_lifts_the_pause(
    tmp_path: Path,
) -> None:
    """A proxy that starts, or missed the API's push, follows the database: the kind of weights
    is in their recorded name, so it reloads a recorded checkpoint before it serves."""

    async def scenario() -> None:
        app = create_fake_sglang_app()
        pool = BackendPool((CHAT,), transport=httpx.ASGITransport(app))
        backend = pool.add("http://engine:30000", name="engine")
        checkpoint = Adapter("polar-ckpt-v4", checkpoint_dir(tmp_path))
        sync = PolicySync(pool, lambda: (4, False, checkpoint), interval_s=60)
        await sync.sync_once()
        fake: FakeSglang = app.state.fake
        assert (fake.model_path, fake.weight_version) == (checkpoint.path, "polar-ckpt-v4")
        assert (backend.adapter, backend.adapter_error, backend.policy_version) == (
            "polar-ckpt-v4",
            None,
            4,
        )
        assert not backend.paused and backend.loaded == set()  # nothing to unload later
        await pool.aclose()

    asyncio.run(scenario())


def test_a_load_under_way_is_awaited_not_sent_again(tmp_path: Path) -> None:
    """A publish, the database sync and the health loop's reconcile (which sees the backend
    without the pool's new checkpoint until its load ends) met on one backend: the engine was
    told to reload twice, and a fake SGLang then served every call two checkpoints away from the
    base (seen under load in `test_publishing_a_checkpoint_under_load_...`). Each backend gets one
    load per checkpoint, whoever asks meanwhile."""
    checkpoint = Adapter("polar-ckpt-v2", checkpoint_dir(tmp_path))
    loads: list[str] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def engine(request: httpx.Request) -> httpx.Response:
            loads.append(request.url.path)
            await release.wait()
            return httpx.Response(200, json={"success": True, "message": "ok"})

        pool = BackendPool((CHAT,), transport=httpx.MockTransport(engine))
        backend = pool.add("http://engine:30000", name="engine")
        backend.last_health = "ok"
        publish = asyncio.create_task(load_everywhere(pool, checkpoint))
        while not loads:
            await asyncio.sleep(0.01)
        synced = asyncio.create_task(load_everywhere(pool, checkpoint))  # the database sync
        # the health loop: `backend.adapter` is not the new one yet
        reconciled = asyncio.create_task(reconcile(pool))
        await asyncio.sleep(0.05)
        assert loads == ["/update_weights_from_disk"] and not publish.done()
        release.set()
        assert await publish == await synced == {"engine": None}
        await reconciled
        assert backend.adapter == checkpoint.name and not backend.loading
        await reconcile(pool)  # carries it now: nothing to do
        await load_everywhere(pool, Adapter("polar-ckpt-v3", checkpoint.path))  # a new version
        assert loads == ["/update_weights_from_disk"] * 2
        await pool.aclose()

    asyncio.run(scenario())
