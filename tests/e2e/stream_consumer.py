"""A trainer process for the streaming end-to-end test (run as a script, killed by the test).

Consumes a job with `AsyncClient.stream_groups` (auto-ack) and appends one JSON line per batch to
an output file, fsynced before the next batch is asked for, so the test knows exactly what this
process received even when it is SIGKILLed. With `--hold-after N` it stops asking after its N-th
batch (so that batch is never acknowledged) and waits to be killed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import orjson

from polar_mq.client import AsyncClient


async def consume(args: argparse.Namespace) -> None:
    out = Path(args.out)
    batches = 0
    async with AsyncClient(args.url) as client:
        stream = client.stream_groups(
            args.job, batch_size=args.batch_size, consumer=args.consumer, lease_s=args.lease_s,
            wait_s=2.0,
        )  # fmt: skip
        async for batch in stream:
            line = {
                "consumer": args.consumer,
                "groups": [
                    {
                        "task_index": g["task_index"],
                        "n_samples": g["n_samples"],
                        "complete": g["complete"],
                        "delivery": g["delivery"],
                    }
                    for g in batch
                ],
            }
            with out.open("ab") as f:
                f.write(orjson.dumps(line) + b"\n")
                f.flush()
                os.fsync(f.fileno())
            batches += 1
            if args.hold_after and batches >= args.hold_after:
                await asyncio.sleep(3600)  # holding an unacked batch until SIGKILL


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--consumer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--lease-s", type=float, default=2.0)
    parser.add_argument("--hold-after", type=int, default=0)
    asyncio.run(consume(parser.parse_args()))


if __name__ == "__main__":
    main()
