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
CPU milliseconds per rollout. Medians per revision, then head / base.
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


def run_once(tree: Path, extra: Sequence[str]) -> dict[str, Any]:
    """One `bench.pipeline --repeats 1` run from `tree`; its summary."""
    results = tree / "bench" / "results"
    before = set(results.glob("pipeline-*.json")) if results.exists() else set()
    subprocess.run(
        [sys.executable, "-m", "bench.pipeline", "--repeats", "1", *extra],
        cwd=tree, check=True, env={**os.environ, "PYTHONPATH": str(tree)},
    )  # fmt: skip
    (written,) = set(results.glob("pipeline-*.json")) - before
    return dict(json.loads(written.read_text())["summary"])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the revision before (e.g. a commit)")
    p.add_argument("--head", default="HEAD", help="the revision after (default HEAD)")
    p.add_argument("--rounds", type=int, default=3, help="runs per revision")
    p.add_argument("extra", nargs="*", help="more flags for bench.pipeline (after --)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="polar-mq-compare-"))
    try:
        trees = {"base": work / "base", "head": work / "head"}
        commits = {name: export(getattr(args, name), tree) for name, tree in trees.items()}
        order = [("base", "head"), ("head", "base")]
        summaries: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
        for round_ in range(args.rounds):
            for name in order[round_ % 2]:
                print(f"--- round {round_ + 1}: {name} ({commits[name]})", flush=True)
                summaries[name].append(run_once(trees[name], args.extra))
        report(commits, summaries)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(commits: dict[str, str], summaries: dict[str, list[dict[str, Any]]]) -> None:
    print(f"\n{'figure':<36} {'base ' + commits['base']:>16} {'head ' + commits['head']:>16}"
          f" {'head/base':>9}  runs (base | head)")  # fmt: skip
    for key, label, higher in FIGURES:
        base = [float(s[key]) for s in summaries["base"] if key in s]
        head = [float(s[key]) for s in summaries["head"] if key in s]
        if not base or not head:
            continue
        b, h = statistics.median(base), statistics.median(head)
        ratio = h / b if b else float("nan")
        runs = f"{' '.join(f'{v:g}' for v in base)} | {' '.join(f'{v:g}' for v in head)}"
        better = "higher is better" if higher else "lower is better"
        print(f"{label:<36} {b:>16.2f} {h:>16.2f} {ratio:>9.3f}  {runs} ({better})")


if __name__ == "__main__":
    sys.exit(main())
