"""What making answers durable costs the proxy's writer, per way of doing it, in one run.

    python -m bench.proxy.answer_modes [--callers 64] [--seconds 4] [--rounds 3]

The proxy's `DbCallWriter` in this process against a fresh database, fed by `--callers`
closed-loop callers, each submitting a call row (a small chat call: 300 prompt and 32 completion
tokens), waiting for `durable()` as the request path does, then pausing 20-60 ms (an agent's think
time) before the next. Four sides, alternated `--rounds` times (this machine is noisy: medians,
and ratios to the `commit` side measured in the same run):

- `commit`: each answer waits for its row's database commit (group commit), no journal;
- `journal`: each answer waits for its row's fdatasync to the answer journal; rows are committed
  in batches every `log_flush_interval_s` (the default with a spill directory);
- `write`: the journal written without an fdatasync (`POLAR_MQ_PROXY_JOURNAL_SYNC=write`);
- `off`: answers do not wait (`durable_answers=False`), rows committed in batches.

Per side: rows stored, CPU of this process per row (the serving loop and the writer thread: all
the proxy spends on storing a call), and the wait of `durable()` (p50, p90, p99 and mean: the
journal's waits have a tail while the writer thread commits, which p50 does not show). Figures:
docs/benchmarks.md ("The answer journal").
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.pipeline.infra import fresh_database
from bench.proxy.durable import DEFAULT_PG, _pct, _row
from polar_mq.proxy.store.writer import DbCallWriter

SIDES = ("commit", "journal", "write", "off")


@dataclass
class Side:
    rows: int
    rows_per_group: float
    cpu_per_row_us: float
    wait_p50_ms: float
    wait_p90_ms: float
    wait_p99_ms: float
    wait_mean_ms: float


def _writer(side: str, url: str, spill: Path) -> DbCallWriter:
    if side == "commit":
        return DbCallWriter(url, spill_dir=spill, answer_journal=False)
    if side == "write":
        return DbCallWriter(url, spill_dir=spill, journal_sync=False)
    if side == "journal":
        return DbCallWriter(url, spill_dir=spill)
    return DbCallWriter(url, spill_dir=spill, durable_answers=False)


async def _run(side: str, url: str, callers: int, seconds: float) -> Side:
    with tempfile.TemporaryDirectory(prefix="polar-answer-modes-") as tmp:
        writer = _writer(side, url, Path(tmp) / "spill")
        await writer.start()
        rollout = uuid.uuid4()
        waits: list[float] = []
        stop_at = 0.0

        async def caller(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                writer.submit(_row(rollout))
                await writer.durable()
                waits.append(time.perf_counter() - started)
                await asyncio.sleep(rng.uniform(0.02, 0.06))

        try:
            stop_at = time.monotonic() + 0.5  # warm-up: connections, caches
            await asyncio.gather(*(caller(i) for i in range(callers)))
            await writer.flush()
            waits.clear()
            cpu, written = time.process_time(), writer.written
            groups = writer.stats()["groups"]
            stop_at = time.monotonic() + seconds
            await asyncio.gather(*(caller(1000 + i) for i in range(callers)))
            await writer.flush()  # every row committed: its cost is counted
            rows = writer.written - written
            cpu_s = time.process_time() - cpu
            groups = writer.stats()["groups"] - groups
        finally:
            await writer.close()
    per_group = rows / max(1, groups)
    return Side(
        rows,
        per_group,
        cpu_s / max(1, rows) * 1e6,
        _pct(waits, 0.5),
        _pct(waits, 0.9),
        _pct(waits, 0.99),
        statistics.fmean(waits) * 1000 if waits else 0.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg-admin-url", default=DEFAULT_PG)
    args = parser.parse_args()
    results: dict[str, list[Side]] = {side: [] for side in SIDES}
    with fresh_database(args.pg_admin_url, "polar_mq_bench_answer_modes") as (url, _):
        for round_ in range(args.rounds):
            order = SIDES if round_ % 2 == 0 else tuple(reversed(SIDES))
            for side in order:
                measured = asyncio.run(_run(side, url, args.callers, args.seconds))
                results[side].append(measured)
                print(
                    f"round {round_ + 1} {side:8s} rows {measured.rows:6d} "
                    f"({measured.rows_per_group:5.1f} per group) | CPU per row "
                    f"{measured.cpu_per_row_us:6.1f} us | durable() p50 {measured.wait_p50_ms:6.2f}"
                    f" ms p90 {measured.wait_p90_ms:6.2f} ms p99 {measured.wait_p99_ms:6.2f} ms"
                    f" mean {measured.wait_mean_ms:6.2f} ms",
                    flush=True,
                )
    base = statistics.median(s.cpu_per_row_us for s in results["commit"])
    print(f"\nmedians of {args.rounds} ({args.callers} callers, {args.seconds:g} s each)")
    print(
        "side     | rows/s | rows per group | CPU per row | vs commit "
        "| durable() p50 / p90 / p99, mean"
    )
    for side in SIDES:
        runs = results[side]
        cpu = statistics.median(s.cpu_per_row_us for s in runs)
        rate = statistics.median(s.rows for s in runs) / args.seconds
        p50 = statistics.median(s.wait_p50_ms for s in runs)
        p90 = statistics.median(s.wait_p90_ms for s in runs)
        p99 = statistics.median(s.wait_p99_ms for s in runs)
        mean = statistics.median(s.wait_mean_ms for s in runs)
        group = statistics.median(s.rows_per_group for s in runs)
        print(
            f"{side:8s} | {rate:6.0f} | {group:14.1f} | {cpu:8.1f} us | {cpu / base:9.2f} | "
            f"{p50:.2f} / {p90:.2f} / {p99:.2f} ms, {mean:.2f} ms"
        )


if __name__ == "__main__":
    main()
