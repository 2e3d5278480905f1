"""The printed table and the JSON record of a run."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.pipeline import cpu
from bench.pipeline.measure import (
    AGENT_CALLS,
    AGENT_OWN,
    AGENT_PHASES,
    POSTGRES,
    REDIS,
    SPAWNED,
    Measurement,
)
from polar_mq.lifecycle.stages import Stage

if TYPE_CHECKING:
    from bench.pipeline.run import Options

TARGET_RATIO = 2 / 3
TARGET_CPU_MS = 10.0
TARGET_ATTRIBUTED = 90.0
"""Issue 16: ≥ 90 % of the machine's busy time attributed to named processes."""
POLAR_CPU_MS = (20.0, 25.0)  # seed project Polar, measured on this kind of machine (SPEC §9)
POLAR_RATE = (20.0, 23.0)
SPEC_CHAIN_RATE = (110.0, 140.0)
STAGES = [s.value for s in Stage]
POLAR_PROCESSES = [*(f"worker-{s}" for s in STAGES), "proxy", "api"]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _runs(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    return " / ".join(fmt.format(v) for v in values)


def _verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def polar_cpu_ms(m: Measurement) -> float:
    return m.cpu_ms_per_item(POLAR_PROCESSES)


def render(
    opts: Options, runs: dict[str, list[Measurement]], ctx: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    base, noop, agent = runs["baseline"], runs["noop"], runs["agent"]
    base_rate = _median([m.rate for m in base])
    noop_rate = _median([m.rate for m in noop])
    agent_rate = _median([m.rate for m in agent])
    ratios = [n.rate / b.rate for b, n in zip(base, noop, strict=True)]
    ratio = noop_rate / base_rate
    agent_cpu = [polar_cpu_ms(m) for m in agent]
    agent_cpu_ms = _median(agent_cpu)
    cores = ctx["cpu_count"] or 1
    conc = opts.concurrency
    conc_text = ", ".join(
        f"{stage.value}/step{i}={conc[stage]}" for i, stage in enumerate(Stage, start=1)
    )
    load = "/".join(f"{x:.1f}" for x in ctx["load_before"])
    other = _median([_share(m, cpu.OTHERS, cores) for ms in runs.values() for m in ms])
    busy_note = (
        f"; CPU used by other jobs during the timed windows: median {other:.0f}% of the cores"
    )
    if other > 15:
        busy_note += " (loaded: absolute figures are pessimistic)"
    lines = [
        f"polar_mq pipeline benchmark — {opts.repeats} interleaved run(s) of (1)(2)(3); "
        "medians, then each run",
        f"machine: {cores} cores, load average before {load}{busy_note}",
        f"broker: {ctx['redis_url']} (queue prefix {ctx['queue_prefix']}); database "
        f"{ctx['database']} (fresh, migrated, dropped at exit)",
        f"workers: one Celery worker process per queue (4 for (1), 4 for (2)/(3)), "
        f"-P {opts.pool_impl}, acks_late, prefetch 1; threads per queue: {conc_text}",
        "",
        f"{'':4}{'measurement':<52}{'median':>18}   {'runs':<24} target / reference",
    ]

    def row(tag: str, label: str, value: str, each: str, note: str) -> None:
        lines.append(f"{tag:<4}{label:<52}{value:>18}   {each:<24} {note}")

    row(
        "(1)", f"raw Celery chain, 4 no-op tasks ({opts.chains} chains)",
        f"{base_rate:.1f} chains/s", _runs([m.rate for m in base]),
        f"SPEC: ~{SPEC_CHAIN_RATE[0]:.0f}-{SPEC_CHAIN_RATE[1]:.0f} chains/s on 2 idle cores",
    )  # fmt: skip
    row(
        "(2)", f"polar_mq 4 stages, no-op agent ({opts.rollouts} rollouts)",
        f"{noop_rate:.1f} rollouts/s", _runs([m.rate for m in noop]), "",
    )  # fmt: skip
    row(
        "", "ratio (2)/(1)", f"{ratio:.2f}", _runs(ratios, "{:.2f}"),
        f"target ≥ {TARGET_RATIO:.2f} → {_verdict(ratio >= TARGET_RATIO)}",
    )  # fmt: skip
    row(
        "(3)", f"polar_mq + trivial agent, {AGENT_CALLS} calls ({opts.agent_rollouts} rollouts)",
        f"{agent_rate:.1f} rollouts/s", _runs([m.rate for m in agent]),
        f"target ≥ 2x Polar = {2 * POLAR_RATE[0]:.0f}-{2 * POLAR_RATE[1]:.0f}/s → "
        f"{_verdict(agent_rate >= 2 * POLAR_RATE[0])}; reference (seed Polar): "
        f"≈{POLAR_RATE[0]:.0f}-{POLAR_RATE[1]:.0f} sessions/s",
    )  # fmt: skip
    row(
        "", "polar_mq CPU per rollout (proxy + 4 stage workers)",
        f"{agent_cpu_ms:.1f} ms/rollout", _runs(agent_cpu),
        f"target ≤ {TARGET_CPU_MS:.0f} ms → {_verdict(agent_cpu_ms <= TARGET_CPU_MS)}; "
        f"reference (seed Polar): {POLAR_CPU_MS[0]:.0f}-{POLAR_CPU_MS[1]:.0f} ms/session",
    )  # fmt: skip

    attributed = [_attributed(m) for m in agent]
    attributed_ok = _median(attributed) >= TARGET_ATTRIBUTED
    row(
        "", "machine busy time attributed to named processes",
        f"{_median(attributed):.1f} %", _runs(attributed),
        f"target ≥ {TARGET_ATTRIBUTED:.0f} % → {_verdict(attributed_ok)}",
    )  # fmt: skip
    floors = {mode: runs[mode] for mode in FLOOR_LABELS if runs.get(mode)}
    if floors:
        lines += ["", *_floor_rows(base, noop, floors)]
    lines += ["", *_breakdown(base, noop, agent, cores)]
    warnings = [w for ms in runs.values() for m in ms for w in m.warnings]
    if ctx["dead_processes"]:
        warnings.append(f"processes died during the run: {ctx['dead_processes']}")
    lines.append("")
    if warnings:
        lines += [f"WARNING: {w}" for w in warnings]
    else:
        lines.append(
            f"checks: all {sum(m.n for m in noop + agent)} rollouts of (2) and (3) ended "
            f"completed; every (3) rollout stored {AGENT_CALLS} LLM calls"
        )
    data = {
        "summary": {
            "baseline_chains_per_s": round(base_rate, 2),
            "noop_rollouts_per_s": round(noop_rate, 2),
            "ratio": round(ratio, 3),
            "ratio_target": round(TARGET_RATIO, 3),
            "ratio_per_run": [round(r, 3) for r in ratios],
            "agent_rollouts_per_s": round(agent_rate, 2),
            "agent_polar_mq_cpu_ms_per_rollout": round(agent_cpu_ms, 2),
            "noop_polar_mq_cpu_ms_per_rollout": round(_median([polar_cpu_ms(m) for m in noop]), 2),
            "baseline_worker_cpu_ms_per_chain": round(
                _median(
                    [m.cpu_ms_per_item([f"baseline-step{i}" for i in range(1, 5)]) for m in base]
                ),
                2,
            ),
            "cpu_target_ms": TARGET_CPU_MS,
            "reference_polar_cpu_ms_per_session": list(POLAR_CPU_MS),
            "reference_polar_sessions_per_s": list(POLAR_RATE),
            "warnings": warnings,
        },
        "options": {
            "rollouts": opts.rollouts,
            "chains": opts.chains,
            "agent_rollouts": opts.agent_rollouts,
            "repeats": opts.repeats,
            "warmup": opts.warmup,
        },
        "runs": {kind: [m.as_json() for m in ms] for kind, ms in runs.items()},
    }
    return "\n".join(lines), data


FLOOR_LABELS = {
    "durable": "(1) + a claim and a finish in PostgreSQL per step",
    "runtime": "durable + workspace dirs, a spawned `true`",
}
FLOOR_COSTS = {
    "workers": [f"baseline-step{i}" for i in range(1, 5)],
    "postgres": [POSTGRES],
    "spawned": [SPAWNED],
    "redis": [REDIS],
}


def _floor_rows(
    base: list[Measurement], noop: list[Measurement], floors: dict[str, list[Measurement]]
) -> list[str]:
    """The floors (`bench.pipeline.floor`): each one's rate, its ratio to the raw chain of the
    same repeat, polar_mq's no-op rate against it, and its CPU per chain by process."""
    lines = [
        "floors: the raw chain plus only what a durable staged design must do (--floors)",
        f"{'':4}{'measurement':<52}{'median':>18}   {'ratio to (1)':<16}{'(2) / floor':<14}"
        "CPU ms per chain: " + ", ".join(FLOOR_COSTS),
    ]
    for mode, ms in floors.items():
        rate = _median([m.rate for m in ms])
        to_raw = _median([f.rate / b.rate for f, b in zip(ms, base, strict=True)])
        noop_to = _median([n.rate / f.rate for f, n in zip(ms, noop, strict=True)])
        costs = ", ".join(
            f"{_median([m.cpu_ms_per_item(names) for m in ms]):.2f}"
            for names in FLOOR_COSTS.values()
        )
        lines.append(
            f"{'':4}{mode + ': ' + FLOOR_LABELS[mode]:<52}{f'{rate:.1f} chains/s':>18}   "
            f"{to_raw:<16.2f}{noop_to:<14.2f}{costs}"
        )
    raw_costs = ", ".join(
        f"{_median([m.cpu_ms_per_item(names) for m in base]):.2f}" for names in FLOOR_COSTS.values()
    )
    lines.append(f"{'':4}{'(1) for comparison':<52}{'':>18}   {'':<16}{'':<14}{raw_costs}")
    return lines


def _breakdown(
    base: list[Measurement], noop: list[Measurement], agent: list[Measurement], cores: int
) -> list[str]:
    head = f"{'CPU by process, median ms per item':<58}{'(1)/chain':>12}{'(2)/rollout':>13}"
    lines = [head + f"{'(3)/rollout':>13}"]

    def cell(ms: list[Measurement], fn: Callable[[Measurement], float | None]) -> str:
        values = [v for v in (fn(m) for m in ms) if v is not None]
        return f"{_median(values):.2f}" if values else "-"

    def per_item(name: str) -> Callable[[Measurement], float | None]:
        return lambda m: m.cpu_ms_per_item([name]) if name in m.cpu_s else None

    for i, stage in enumerate(STAGES, start=1):
        lines.append(
            f"  {f'stage {i}: worker-{stage} / baseline-step{i}':<56}"
            f"{cell(base, per_item(f'baseline-step{i}')):>12}"
            f"{cell(noop, per_item(f'worker-{stage}')):>13}"
            f"{cell(agent, per_item(f'worker-{stage}')):>13}"
        )
    lines.append(f"  {'proxy':<56}{'-':>12}{cell(noop, per_item('proxy')):>13}"
                 f"{cell(agent, per_item('proxy')):>13}")  # fmt: skip
    lines += _thread_rows(base, noop, agent)
    baseline_names = [f"baseline-step{i}" for i in range(1, 5)]
    lines.append(
        f"  {'= counted (workers + proxy)':<56}"
        f"{cell(base, lambda m: m.cpu_ms_per_item(baseline_names)):>12}"
        f"{cell(noop, polar_cpu_ms):>13}{cell(agent, polar_cpu_ms):>13}"
    )
    submit = "submit in the bench process (apply_async / enqueue_job)"
    lines.append(
        f"  {submit:<56}{cell(base, lambda m: 1000 * m.submit_cpu_s / m.n):>12}"
        f"{cell(noop, lambda m: 1000 * m.submit_cpu_s / m.n):>13}"
        f"{cell(agent, lambda m: 1000 * m.submit_cpu_s / m.n):>13}"
    )
    info = sorted(
        {k for m in base + noop + agent for k in m.cpu_s}
        - set(POLAR_PROCESSES) - set(baseline_names)
    )  # fmt: skip
    for name in info:
        lines.append(
            f"  {'not counted: ' + name:<56}{cell(base, per_item(name)):>12}"
            f"{cell(noop, per_item(name)):>13}{cell(agent, per_item(name)):>13}"
        )

    def busy(m: Measurement) -> float:
        return 100.0 * m.machine_busy_s / (m.elapsed_s * cores)

    def unaccounted(m: Measurement) -> float:
        return _unaccounted(m, cores)

    lines.append(
        f"  {'machine busy not listed above (% of all cores)¹':<56}"
        f"{cell(base, unaccounted):>12}{cell(noop, unaccounted):>13}{cell(agent, unaccounted):>13}"
    )
    lines.append(
        f"  {'machine busy during the window (% of all cores)':<56}"
        f"{cell(base, busy):>12}{cell(noop, busy):>13}{cell(agent, busy):>13}"
    )
    lines.append(
        "  ¹ what no named process accounts for (processes that started and ended inside the "
        "window without a parent reaping them here, scan misses)"
    )
    lines += ["", f"{'in-stage time (events duration_s), median ms':<70}{'(2)':>13}{'(3)':>13}"]
    for stage in STAGES:
        in_stage = _stage_ms(stage)
        lines.append(f"  {stage:<68}{cell(noop, in_stage):>13}{cell(agent, in_stage):>13}")
        if stage == "run_agent":
            own = _stage_ms(AGENT_OWN)
            lines.append(f"  {AGENT_OWN:<68}{cell(noop, own):>13}{cell(agent, own):>13}")
            for key in AGENT_PHASES:
                phase = _stage_ms(f"    {key}")
                label = f"  stage's own: {key}"
                lines.append(f"  {label:<68}{cell(noop, phase):>13}{cell(agent, phase):>13}")
    return lines


def _thread_rows(
    base: list[Measurement], noop: list[Measurement], agent: list[Measurement]
) -> list[str]:
    """Each process's CPU per item split as main thread + other threads (`cpu.thread_split`):
    in a worker, Celery's consumer against its pool threads (the stage bodies)."""

    def cell(ms: list[Measurement], name: str) -> str:
        pairs = [(m.threads_s[name], m.n) for m in ms if name in m.threads_s]
        if not pairs:
            return "-"
        main = _median([1000.0 * p[0] / n for p, n in pairs])
        other = _median([1000.0 * p[1] / n for p, n in pairs])
        return f"{main:.2f}+{other:.2f}"

    lines = ["  by thread, main + others (a worker: Celery's consumer + its pool threads)"]
    for i, stage in enumerate(STAGES, start=1):
        worker = f"worker-{stage}"
        lines.append(
            f"    {f'stage {i}':<54}{cell(base, f'baseline-step{i}'):>12}"
            f"{cell(noop, worker):>13}{cell(agent, worker):>13}"
        )
    lines.append(f"    {'proxy':<54}{'-':>12}{cell(noop, 'proxy'):>13}{cell(agent, 'proxy'):>13}")
    return lines


def _unaccounted(m: Measurement, cores: int) -> float:
    """Machine busy time (% of all cores) not spent by any named process (the bench process's
    group includes its submit)."""
    return 100.0 * (m.machine_busy_s - sum(m.cpu_s.values())) / (m.elapsed_s * cores)


def _share(m: Measurement, name: str, cores: int) -> float:
    return 100.0 * m.cpu_s.get(name, 0.0) / (m.elapsed_s * cores)


def _attributed(m: Measurement) -> float:
    """% of the machine's busy time that named processes account for (capped at 100: a process
    that ended inside the window is billed to its parent for its whole life)."""
    if m.machine_busy_s <= 0:
        return 100.0
    return min(100.0, 100.0 * sum(m.cpu_s.values()) / m.machine_busy_s)


def _stage_ms(stage: str) -> Callable[[Measurement], float | None]:
    return lambda m: m.stage_ms.get(stage)


def write_json(directory: Path, started_at: datetime, data: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"pipeline-{started_at.strftime('%Y%m%dT%H%M%SZ')}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path
