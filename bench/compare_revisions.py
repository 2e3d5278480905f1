"""Two revisions of polar_mq through the same benchmark, interleaved, on one machine in one sitting.

    .venv/bin/python -m bench.compare_revisions --base 5917fe1 [--head HEAD] [--rounds 3] \
        [-- more flags for bench.pipeline]

A refactor's "no slower" claim needs the before and the after measured side by side: these
machines are noisy, and a figure from another day compares the day, not the code. Each revision
is exported (`git archive`, no worktree) to a temporary directory and run from there with this
venv's interpreter; rounds alternate base, head, head, base, … so a trend in the machine's load
falls on both. Each run is `python -m bench.pipeline --repeats 1` (its own database, broker and
workers); the figures compared are its summary's: rollouts per second of the no-op and
trivial-agent pipelines against the raw-Celery baseline measured in the same run, and polar_mq's
CPU milliseconds per rollout (and the proxy's share of an agent rollout's). Medians per side,
then each side / base.

`--variant NAME:KEY=VALUE,...` adds a side: the head revision run with those environment variables
(e.g. `tito-off:POLAR_MQ_PROXY_TITO=off`), so what a switchable feature costs is measured in the
same sitting as the revisions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIGURES = (
    ("noop_rollouts_per_s", "no-op rollouts/s", True),
    ("ratio", "no-op / raw Celery (same run)", True),
    ("agent_rollouts_per_s", "trivial-agent rollouts/s", True),
    ("agent_polar_mq_cpu_ms_per_rollout", "polar_mq CPU ms per agent rollout", False),
    ("noop_polar_mq_cpu_ms_per_rollout", "polar_mq CPU ms per no-op rollout", False),
    ("agent_proxy_cpu_ms_per_rollout", "proxy CPU ms per agent rollout", False),
)
"""(summary key, label, higher is better)."""


def export(revision: str, into: Path) -> str:
    """The tree of `revision` under `into`; returns the commit it resolved to."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", revision],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {commit} failed")
    return commit


def run_once(tree: Path, extra: Sequence[str], env: dict[str, str]) -> dict[str, Any]:
    """One `bench.pipeline --repeats 1` run from `tree` with `env` added; its summary."""
    results = tree / "bench" / "results"
    before = set(results.glob("pipeline-*.json")) if results.exists() else set()
    subprocess.run(
        [sys.executable, "-m", "bench.pipeline", "--repeats", "1", *extra],
        cwd=tree, check=True, env={**os.environ, **env, "PYTHONPATH": str(tree)},
    )  # fmt: skip
    (written,) = set(results.glob("pipeline-*.json")) - before
    figures = json.loads(written.read_text())
    summary = dict(figures["summary"])
    for run in figures["runs"].get("agent", [])[:1]:
        proxy_s = run["cpu_s"].get("proxy")
        if proxy_s is not None and run["n"]:
            summary["agent_proxy_cpu_ms_per_rollout"] = round(1e3 * proxy_s / run["n"], 2)
    return summary


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """`NAME:KEY=VALUE,...` as (name, environment)."""
    name, _, pairs = spec.partition(":")
    env = dict(pair.split("=", 1) for pair in pairs.split(",") if pair)
    if not name or name in ("base", "head") or not env:
        raise SystemExit(f"--variant {spec!r}: NAME:KEY=VALUE,... (NAME not base or head)")
    return name, env


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the revision before (e.g. a commit)")
    p.add_argument("--head", default="HEAD", help="the revision after (default HEAD)")
    p.add_argument("--rounds", type=int, default=3, help="runs per side")
    p.add_argument(
        "--variant", action="append", default=[],
        help="also the head revision with these environment variables: NAME:KEY=VALUE,...",
    )  # fmt: skip
    p.add_argument("extra", nargs="*", help="more flags for bench.pipeline (after --)")
    args = p.parse_args(argv)
    variants = dict(parse_variant(spec) for spec in args.variant)
    work = Path(tempfile.mkdtemp(prefix="polar-mq-compare-"))
    try:
        trees = {"base": work / "base", "head": work / "head"}
        commits = {name: export(getattr(args, name), tree) for name, tree in trees.items()}
        sides: dict[str, tuple[Path, dict[str, str]]] = {
            "base": (trees["base"], {}),
            "head": (trees["head"], {}),
            **{name: (trees["head"], env) for name, env in variants.items()},
        }
        labels = {**commits, **{name: commits["head"] for name in variants}}
        summaries: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for name in order:
                tree, env = sides[name]
                print(f"--- round {round_ + 1}: {name} ({labels[name]})", flush=True)
                summaries[name].append(run_once(tree, args.extra, env))
        report(labels, summaries)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(labels: dict[str, str], summaries: dict[str, list[dict[str, Any]]]) -> None:
    """Per figure: each side's median, its ratio to the base's, and every run's value."""
    for name, runs in summaries.items():
        print(f"{name}: {labels[name]}, {len(runs)} runs")
    print(f"\n{'figure':<36} {'side':<12} {'median':>9} {'/ base':>7}  runs")
    for key, label, higher in FIGURES:
        base = [float(s[key]) for s in summaries["base"] if key in s]
        if not base:
            continue
        b = statistics.median(base)
        better = "higher is better" if higher else "lower is better"
        print(f"{label} ({better})")
        for name, runs in summaries.items():
            values = [float(s[key]) for s in runs if key in s]
            if not values:
                continue
            m = statistics.median(values)
            ratio = m / b if b else float("nan")
            runs_text = " ".join(f"{v:g}" for v in values)
            print(f"{'':<36} {name:<12} {m:>9.2f} {ratio:>7.3f}  {runs_text}")


if __name__ == "__main__":
    sys.exit(main())
