"""Orchestration: one fresh database, the fake engine, both proxies, interleaved repeats, a report.

Each repeat runs, back to back on the same fake engine: the engine called directly (the baseline,
with the body polar_mq's proxy sends upstream, token ids and logprobs included), polar_mq's proxy,
and LiteLLM's proxy when installed; non-streaming then streaming. Added latency is the proxy's
percentile minus the direct percentile of the same repeat; the table shows medians over repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.pipeline.cpu import tree_cpu
from bench.pipeline.infra import fresh_database
from bench.proxy import families, report, targets, writer_rate
from bench.proxy.wrk import LoadResult, require_wrk, run_wrk
from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.stack.devstack import LocalStack

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
QUESTION = "What is 1 + 2 + 3 + 4 + 5 + 6 + 7?"
"""The fake engine answers `CALC: 1 + 2 + ... + 7`: exactly 32 completion tokens."""
LONG_PROMPT_CHARS = 1000
"""(d): ~1,000 prompt tokens per call (the fake's tokenizer is byte-level)."""


@dataclass
class Options:
    duration_s: float = 8.0
    repeats: int = 3
    clients: int = 64
    ttft_ms: float = 20.0
    token_delay_ms: float = 0.0
    writer_rows: int = 20_000
    litellm: bool = True
    pg_admin_url: str = DEFAULT_PG
    results_dir: Path = RESULTS_DIR


@dataclass
class Runs:
    """Every measurement of the run, by (target, workload); a list per repeat."""

    load: dict[str, list[LoadResult]] = field(default_factory=dict)
    cpu_us: dict[str, list[float]] = field(default_factory=dict)
    writer: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, result: LoadResult, cpu_s: float | None = None) -> None:
        self.load.setdefault(key, []).append(result)
        if cpu_s is not None and result.requests:
            self.cpu_us.setdefault(key, []).append(1e6 * cpu_s / result.requests)


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.proxy",
        description="Proxy added latency, CPU per request and call-log throughput (SPEC §9).",
    )
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per load run")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats")
    parser.add_argument("--clients", type=int, default=64, help="concurrent connections")
    parser.add_argument("--ttft-ms", type=float, default=20.0, help="fake engine first token")
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="between tokens")
    parser.add_argument("--writer-rows", type=int, default=20_000, help="(d) records per run")
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM even if found")
    parser.add_argument("--pg-admin-url", default=DEFAULT_PG)
    args = parser.parse_args(argv)
    return Options(
        duration_s=args.duration,
        repeats=args.repeats,
        clients=args.clients,
        ttft_ms=args.ttft_ms,
        token_delay_ms=args.token_delay_ms,
        writer_rows=args.writer_rows,
        litellm=not args.no_litellm,
        pg_admin_url=args.pg_admin_url,
    )


def _body(stream: bool, content: str = QUESTION) -> dict[str, Any]:
    return {"model": "agent", "stream": stream, "messages": [{"role": "user", "content": content}]}


def _messages_body(stream: bool) -> dict[str, Any]:
    """Anthropic Messages asking the same question (the proxy translates it to the same chat)."""
    return {**_body(stream), "model": "claude-sonnet-4-5", "max_tokens": 64}


def _responses_body(stream: bool) -> dict[str, Any]:
    """OpenAI Responses asking the same question, history sent whole (`store: false`, as Codex)."""
    return {"model": "gpt-5-codex", "stream": stream, "store": False, "input": QUESTION}


FAMILIES = {
    "polar_mq_messages": ("/v1/messages", _messages_body),
    "polar_mq_responses": ("/v1/responses", _responses_body),
}
"""API families measured through polar_mq's proxy next to chat: side -> (path, body)."""


def _upstream_body(body: dict[str, Any]) -> dict[str, Any]:
    """What polar_mq's proxy sends the engine for `body` (served model, token ids, logprobs)."""
    return {**body, "model": targets.MODEL, "return_token_ids": True, "logprobs": True}


def _cpu_s(proc: ManagedProcess | None) -> float:
    return sum(tree_cpu(proc.pid).values()) if proc is not None else 0.0


def _load(
    opts: Options,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    seconds: float,
    path: str = "/v1/chat/completions",
) -> LoadResult:
    return run_wrk(f"{url}{path}", body, headers, opts.clients, seconds)


def _flush_stats(url: str) -> dict[str, Any]:
    response = httpx.post(f"{url}/admin/flush", timeout=120)
    response.raise_for_status()
    stats: dict[str, Any] = response.json()
    return stats


def measure(opts: Options, tmp: Path, database_url: str) -> tuple[Runs, dict[str, Any]]:
    secret = "bench-" + uuid.uuid4().hex
    upstream_port = free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    settings = targets.polar_settings(database_url, upstream, tmp / "spill", secret)
    runs = Runs()
    ctx: dict[str, Any] = {"litellm": None}
    with LocalStack(settings, tmp / "logs") as stack:
        stack.fake_upstream(upstream_port, ttft_ms=opts.ttft_ms, token_delay_ms=opts.token_delay_ms)
        proxy = stack.proxy()
        polar_url = settings.proxy_base_url
        polar_auth = {"Authorization": f"Bearer {issue_rollout_token(secret, uuid.uuid4(), 7200)}"}
        sides: list[tuple[str, str, dict[str, str], ManagedProcess | None]] = [
            ("polar_mq", polar_url, polar_auth, proxy)
        ]
        if opts.litellm and targets.litellm_bin() is not None:
            lite, lite_url = targets.start_litellm(stack, upstream, tmp)
            sides.append(
                ("litellm", lite_url, {"Authorization": f"Bearer {targets.LITELLM_KEY}"}, lite)
            )
            ctx["litellm"] = str(targets.litellm_bin())
        for _, url, auth, _ in sides:  # warm-up: connections, lazy imports
            _load(opts, url, _body(False), auth, 2)
            _load(opts, url, _body(True), auth, 1)
        for path, family_body in FAMILIES.values():
            _load(opts, polar_url, family_body(False), polar_auth, 1, path)
        for repeat in range(opts.repeats):
            print(f"repeat {repeat + 1}/{opts.repeats} ...", flush=True)
            for stream in (False, True):
                mode = "stream" if stream else "json"
                body = _body(stream)
                runs.add(
                    f"direct/{mode}",
                    _load(opts, upstream, _upstream_body(body), {}, opts.duration_s),
                )
                for name, url, auth, proc in sides:
                    before = _cpu_s(proc)
                    result = _load(opts, url, body, auth, opts.duration_s)
                    runs.add(f"{name}/{mode}", result, _cpu_s(proc) - before)
                for name, (path, family_body) in FAMILIES.items():
                    before = _cpu_s(proxy)
                    result = _load(
                        opts, polar_url, family_body(stream), polar_auth, opts.duration_s, path
                    )
                    runs.add(f"{name}/{mode}", result, _cpu_s(proxy) - before)
            long_body = _body(False, ("Tell me more. " * 80)[:LONG_PROMPT_CHARS] + QUESTION)
            runs.add(
                "direct/long", _load(opts, upstream, _upstream_body(long_body), {}, opts.duration_s)
            )
            written = _flush_stats(polar_url)["written"]
            started = time.perf_counter()
            result = _load(opts, polar_url, long_body, polar_auth, opts.duration_s)
            stats = _flush_stats(polar_url)
            runs.add("polar_mq/long", result)
            runs.writer.setdefault("proxy_logged", []).append(
                (stats["written"] - written) / (time.perf_counter() - started)
            )
        ctx["proxy_writer"] = _flush_stats(polar_url)
        ctx["dead_processes"] = [p.name for p in stack.processes if not p.alive()]
    rows = writer_rate.sample_rows(opts.writer_rows)
    for repeat in range(opts.repeats):
        print(f"writer throughput {repeat + 1}/{opts.repeats} ...", flush=True)
        runs.writer.setdefault("writer", []).append(writer_rate.writer_rate(database_url, rows))
        runs.writer.setdefault("copy", []).append(writer_rate.copy_rate(database_url, rows))
    return runs, ctx


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    require_wrk()
    started_at = datetime.now(UTC)
    load_before = _loadavg()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-proxy-")))
        database_url, _ = stack.enter_context(fresh_database(opts.pg_admin_url, "polar_mq_bproxy"))
        runs, ctx = measure(opts, tmp, database_url)
    ctx["load_before"] = load_before
    ctx["load_after"] = _loadavg()
    text, data = report.render(opts, runs, ctx)
    translation = families.measure()
    data["summary"]["translation_us"] = translation
    print(text + "\n\n" + "\n".join(families.render(translation)))
    path = report.write_json(opts.results_dir, started_at, data)
    print(f"\nfigures written to {path.relative_to(REPO_ROOT)}")
    return 0


def _loadavg() -> list[float]:
    with open("/proc/loadavg") as handle:
        return [float(x) for x in handle.read().split()[:3]]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
