"""The proxy's hot path against its floor: CPU per call, calls/s, the ratio to a bare pass-through.

`python -m bench.proxy.hot [--duration S] [--repeats N] [--clients 64]`. One fresh database, the
fake engine (20 ms to the first token, 32 tokens), polar_mq's proxy exactly as in production
(logging every call to PostgreSQL) and a bare aiohttp pass-through (`bench.proxy.bare`), each
repeat interleaving, non-streamed then streamed: the pass-through and the proxy at `--clients`,
then the engine direct, the pass-through and the proxy at one client (added p50 = the side's p50
minus the direct p50 of the same repeat). `--variant NAME:KEY=VALUE,...` adds a proxy started
with those environment variables as another side, same database and engine; with
`PYTHONPATH=<an exported tree>` that side is another revision's proxy (run the bench from outside
the checkout, `PYTHONPATH=<checkout> python -m bench.proxy.hot`: `python -m` puts the working
directory first on the import path, before `PYTHONPATH`).
The table shows medians over repeats (issue 16's targets: <= 0.5 ms CPU per call and >= 0.7x bare
non-streamed, <= 1 ms streamed, <= 1 ms added p50 at one client).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.pipeline.cpu import tree_cpu
from bench.pipeline.infra import fresh_database
from bench.proxy import targets
from bench.proxy.run import DEFAULT_PG, _body, _upstream_body
from bench.proxy.workers import live_rollout
from bench.proxy.wrk import require_wrk, run_wrk
from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.stack.devstack import LocalStack

PATH = "/v1/chat/completions"


def _cpu(proc: ManagedProcess) -> float:
    return sum(tree_cpu(proc.pid).values())


def _start_bare(stack: LocalStack, upstream: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.proxy.bare", "--port", str(port), "--upstream", upstream]
    proc = ManagedProcess("bare", argv, dict(os.environ), stack.log_dir).start()
    stack.processes.append(proc)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):  # no health route: a first call answers once it serves
        with contextlib.suppress(Exception):
            run_wrk(url + PATH, _upstream_body(_body(False)), {}, 1, 0.2)
            break
        time.sleep(0.05)
    return proc, url


def _start_variant(
    stack: LocalStack, tmp: Path, name: str, env: dict[str, str]
) -> tuple[ManagedProcess, str]:
    """Another proxy (`env` on top of the stack's), with its own port and spill directory."""
    port = free_port()
    env = {
        **env,
        "POLAR_MQ_PROXY_PORT": str(port),
        "POLAR_MQ_PROXY_SPILL_DIR": str(tmp / f"spill-{name}"),
    }
    proc = stack._spawn(f"proxy-{name}", [sys.executable, "-m", "polar_mq.cli", "proxy"], env)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(f"{url}/healthz")
    return proc, url


def _variants(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """`--variant NAME:KEY=VALUE,...` as side name -> environment."""
    variants: dict[str, dict[str, str]] = {}
    for spec in args.variant:
        name, _, pairs = spec.partition(":")
        variants[name] = dict(pair.split("=", 1) for pair in pairs.split(",") if pair)
    return variants


def measure(args: argparse.Namespace, database_url: str, tmp: Path) -> dict[str, list[float]]:
    secret = "bench-" + uuid.uuid4().hex
    upstream_port = free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    settings = targets.polar_settings(database_url, upstream, tmp / "spill", secret)
    out: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        out.setdefault(key, []).append(value)

    with LocalStack(settings, tmp / "logs") as stack:
        stack.fake_upstream(upstream_port, ttft_ms=args.ttft_ms)
        proxy = stack.proxy()
        bare, bare_url = _start_bare(stack, upstream)
        token = issue_rollout_token(secret, live_rollout(database_url), 7200)
        auth = {"Authorization": f"Bearer {token}"}
        sides = [("bare", bare_url, {}, bare), ("polar", settings.proxy_base_url, auth, proxy)]
        for name, env in _variants(args).items():
            variant, variant_url = _start_variant(stack, tmp, name, env)
            sides.append((name, variant_url, auth, variant))
        for name, url, headers, _ in sides:  # warm-up
            for stream in (False, True):
                body = _upstream_body(_body(stream)) if name == "bare" else _body(stream)
                run_wrk(url + PATH, body, headers, args.clients, 2)
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats} ...", flush=True)
            for mode in ("json", "stream"):
                asked = _body(mode == "stream")
                upstream_body = _upstream_body(asked)  # the bare pass-through forwards as is
                for name, url, headers, proc in sides:
                    body = upstream_body if name == "bare" else asked
                    before = _cpu(proc)
                    result = run_wrk(url + PATH, body, headers, args.clients, args.duration)
                    cpu = _cpu(proc) - before
                    add(f"{name}/{mode}/rate", result.rate)
                    add(f"{name}/{mode}/cpu_ms", 1e3 * cpu / max(1, result.requests))
                    add(f"{name}/{mode}/errors", result.errors)
                direct = run_wrk(upstream + PATH, upstream_body, {}, 1, args.duration / 2)
                for name, url, headers, _ in sides:
                    body = upstream_body if name == "bare" else asked
                    result = run_wrk(url + PATH, body, headers, 1, args.duration / 2)
                    add(f"{name}/{mode}/added_p50_ms", result.p50_ms - direct.p50_ms)
            for name, *_ in sides[1:]:
                for mode in ("json", "stream"):
                    rate = out[f"{name}/{mode}/rate"][-1] / out[f"bare/{mode}/rate"][-1]
                    add(f"ratio/{name}/{mode}", rate)
    return out


def render(out: dict[str, list[float]]) -> str:
    med = {key: statistics.median(values) for key, values in out.items()}
    lines = [
        f"{'':8} {'side':7} {'CPU ms/call':>12} {'calls/s':>9} {'added p50 @1':>13} {'errors':>7}"
    ]
    sides = list(dict.fromkeys(key.split("/")[0] for key in out if not key.startswith("ratio/")))
    for mode in ("json", "stream"):
        for side in sides:
            k = f"{side}/{mode}"
            lines.append(
                f"{mode:8} {side:7} {med[k + '/cpu_ms']:12.3f} {med[k + '/rate']:9.0f} "
                f"{med[k + '/added_p50_ms']:13.2f} {med[k + '/errors']:7.0f}"
            )
        for side in sides[1:]:
            ratio = med[f"ratio/{side}/{mode}"]
            lines.append(f"{mode:8} ratio {side}/bare calls/s {ratio:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy.hot", description=__doc__)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per load run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--pg-admin-url", default=DEFAULT_PG)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="also a proxy started with these environment variables: NAME:KEY=VALUE,...",
    )
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args(argv)
    require_wrk()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-hot-")))
        database_url, _ = stack.enter_context(fresh_database(args.pg_admin_url, "polar_mq_bhot"))
        out = measure(args, database_url, tmp)
    print(render(out))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
