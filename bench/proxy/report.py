"""The printed table and the JSON record of a `bench.proxy` run."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.proxy.wrk import LoadResult

if TYPE_CHECKING:
    from bench.proxy.run import Options, Runs

TARGET_P50_MS = 1.0
TARGET_P99_MS = 5.0
TARGET_CPU_US = 250.0
TARGET_RECORDS_S = 5000.0
MODES = {"json": "non-streaming", "stream": "streaming"}


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _runs(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    return " / ".join(fmt.format(v) for v in values)


def _verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def added(runs: Runs, side: str, mode: str, pct: str) -> list[float]:
    """Per repeat: the side's percentile minus the direct call's (same repeat)."""
    direct = runs.load.get(f"direct/{mode}", [])
    proxied = runs.load.get(f"{side}/{mode}", [])
    return [getattr(p, pct) - getattr(d, pct) for d, p in zip(direct, proxied, strict=False)]


FAMILY_SIDES = ("polar_mq_messages", "polar_mq_responses")
"""Anthropic Messages and OpenAI Responses through polar_mq's proxy (translated to chat)."""


def render(opts: Options, runs: Runs, ctx: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    families = [side for side in FAMILY_SIDES if f"{side}/json" in runs.load]
    sides = ["polar_mq", *families] + (["litellm"] if ctx["litellm"] else [])
    load = "/".join(f"{x:.1f}" for x in ctx["load_before"])
    lines = [
        f"polar_mq proxy benchmark — {opts.repeats} interleaved repeat(s), medians (then each run)",
        f"machine: {os.cpu_count()} cores, load average before {load}, after "
        + "/".join(f"{x:.1f}" for x in ctx["load_after"])
        + (" (loaded: absolute figures are pessimistic)" if ctx["load_before"][0] > 1.5 else ""),
        f"load: wrk, {opts.clients} keep-alive connections, {opts.duration_s:g} s per run; fake "
        f"engine (own process) {opts.ttft_ms:g} ms to first token, then 32 tokens "
        f"({opts.token_delay_ms:g} ms apart); chat completions; polar_mq logs every call to "
        "PostgreSQL",
        "",
        f"{'(a) latency (ms)':<36}{'p50':>8}{'p99':>9}{'req/s':>9}{'added p50':>11}"
        f"{'added p99':>11}   added p50 / p99 per run",
    ]
    summary: dict[str, Any] = {}
    for mode, label in MODES.items():
        for side in ["direct", *sides]:
            results: list[LoadResult] = runs.load.get(f"{side}/{mode}", [])
            if not results:
                continue
            p50 = _median([r.p50_ms for r in results])
            p99 = _median([r.p99_ms for r in results])
            rate = _median([r.rate for r in results])
            row = f"  {side + ' / ' + label:<34}{p50:>8.2f}{p99:>9.2f}{rate:>9.0f}"
            entry: dict[str, Any] = {"p50_ms": p50, "p99_ms": p99, "rate": rate}
            if side != "direct":
                a50, a99 = added(runs, side, mode, "p50_ms"), added(runs, side, mode, "p99_ms")
                entry |= {"added_p50_ms": _median(a50), "added_p99_ms": _median(a99)}
                row += f"{_median(a50):>+11.2f}{_median(a99):>+11.2f}   {_runs(a50)} | {_runs(a99)}"
            errors = sum(r.errors for r in results)
            if errors:
                row += f"   ({errors} failed requests)"
            entry["errors"] = errors
            lines.append(row)
            summary[f"{side}/{mode}"] = entry
    for mode, label in MODES.items():
        ours = summary.get(f"polar_mq/{mode}")
        if ours:
            ok = ours["added_p50_ms"] <= TARGET_P50_MS and ours["added_p99_ms"] <= TARGET_P99_MS
            lines.append(
                f"  target, {label}: added p50 ≤ {TARGET_P50_MS:g} ms and p99 ≤ "
                f"{TARGET_P99_MS:g} ms → {_verdict(ok)}"
            )
    lines += ["", "(b) proxy CPU per request (µs, user+system of the proxy process tree)"]
    for mode, label in MODES.items():
        cells = []
        for side in sides:
            values = runs.cpu_us.get(f"{side}/{mode}", [])
            cells.append(f"{side} {_median(values):.0f} ({_runs(values, '{:.0f}')})")
            summary.setdefault(f"{side}/{mode}", {})["cpu_us_per_request"] = _median(values)
        lines.append(f"  {label:<16}" + ";  ".join(cells))
    ours_cpu = summary["polar_mq/json"]["cpu_us_per_request"]
    lines.append(
        f"  target ≤ {TARGET_CPU_US:g} µs per non-streaming request → "
        f"{_verdict(ours_cpu <= TARGET_CPU_US)}"
    )
    for family in families:
        for mode, label in MODES.items():
            chat = summary[f"polar_mq/{mode}"]["cpu_us_per_request"]
            theirs = summary[f"{family}/{mode}"]["cpu_us_per_request"]
            lines.append(
                f"  {family.removeprefix('polar_mq_')} vs chat, {label}: CPU {theirs:.0f} vs "
                f"{chat:.0f} µs/request ({theirs / chat:.2f}x), added p50 "
                f"{summary[f'{family}/{mode}']['added_p50_ms']:.2f} vs "
                f"{summary[f'polar_mq/{mode}']['added_p50_ms']:.2f} ms"
            )
    lines += ["", "(c) LiteLLM side by side"]
    if ctx["litellm"]:
        for mode, label in MODES.items():
            ours, theirs = summary[f"polar_mq/{mode}"], summary[f"litellm/{mode}"]
            cpu_ours, cpu_theirs = ours["cpu_us_per_request"], theirs["cpu_us_per_request"]
            lines.append(
                f"  {label:<16}polar_mq vs LiteLLM: added p50 {ours['added_p50_ms']:.2f} vs "
                f"{theirs['added_p50_ms']:.2f} ms, p99 {ours['added_p99_ms']:.2f} vs "
                f"{theirs['added_p99_ms']:.2f} ms, CPU {cpu_ours:.0f} vs {cpu_theirs:.0f} "
                f"µs/request (LiteLLM uses {cpu_theirs / cpu_ours:.1f}x the CPU)"
            )
        lines.append(f"  LiteLLM: {ctx['litellm']} (one worker, no database, no callbacks)")
    else:
        lines.append(
            "  not measured: no LiteLLM virtualenv (LITELLM_VENV, default "
            "~/.cache/polar_mq/litellm-venv) or --no-litellm"
        )
    writer = _median(runs.writer.get("writer", []))
    copy = _median(runs.writer.get("copy", []))
    logged = _median(runs.writer.get("proxy_logged", []))
    a50, a99 = added(runs, "polar_mq", "long", "p50_ms"), added(runs, "polar_mq", "long", "p99_ms")
    lines += [
        "",
        "(d) call log into PostgreSQL, 1,024 tokens per record",
        f"  proxy's DbCallWriter (unnest INSERT)  {writer:>8.0f} records/s   "
        f"({_runs(runs.writer.get('writer', []), '{:.0f}')})   target ≥ {TARGET_RECORDS_S:.0f} → "
        f"{_verdict(writer >= TARGET_RECORDS_S)}",
        f"  COPY to temp table + INSERT           {copy:>8.0f} records/s   "
        f"({_runs(runs.writer.get('copy', []), '{:.0f}')})",
        f"  proxy with ~1k-token prompts: added p50 {_median(a50):+.2f} ms, p99 {_median(a99):+.2f}"
        f" ms (short prompts: {summary['polar_mq/json']['added_p50_ms']:+.2f} / "
        f"{summary['polar_mq/json']['added_p99_ms']:+.2f}); its writer logged {logged:.0f} calls/s",
        "",
        f"proxy writer at the end: {ctx['proxy_writer']}",
    ]
    if ctx["dead_processes"]:
        lines.append(f"WARNING: processes died during the run: {ctx['dead_processes']}")
    summary |= {
        "writer_records_per_s": writer,
        "copy_records_per_s": copy,
        "proxy_long_added_p50_ms": _median(a50),
        "proxy_long_added_p99_ms": _median(a99),
        "proxy_long_logged_per_s": logged,
    }
    data = {
        "summary": summary,
        "options": {k: str(v) for k, v in vars(opts).items()},
        "context": ctx,
        "runs": {k: [r.as_json() for r in v] for k, v in runs.load.items()},
        "cpu_us": runs.cpu_us,
        "writer": runs.writer,
    }
    return "\n".join(lines), data


def write_json(directory: Path, started_at: datetime, data: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"proxy-{started_at.strftime('%Y%m%dT%H%M%SZ')}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path
