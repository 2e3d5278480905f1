"""Dynamic sampling (as DAPO does it): a step leases more groups in place of those without signal.

A group whose samples all got one reward has no GRPO advantage, hence no gradient. Once the policy
narrows, most groups are such flat groups (every sample the same sentence), and a step of two
groups trains on none or one of them (docs/training.md). With `resample_flat` extra groups a step
keeps leasing batches from the group stream while fewer than `groups_per_step` of its groups have
signal, up to that many more groups; every group leased is acknowledged with the step. The
learner trains on the groups with signal, and gets flat groups only to make up `groups_per_step`
(`flat_fill`): their samples carry the entropy bonus, which is wanted exactly where the policy
narrowed, and keep every step's learner work that of `groups_per_step` groups. (Sending none let
a step whose leased groups were all flat train nothing at all, bonus included.)

The job is sized and throttled for it (`loop.submit_training_job`): its staleness batch is
`groups_per_step + resample_flat` groups, so the engine may generate the extra groups while the
learner steps (on this CPU they run on separate cores); those a step does not need grow stale and
are withheld, which uses the job up as much as training does, so it holds twice
`steps x (groups_per_step + resample_flat)` groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from polar_mq.training.grpo import has_signal


def step_groups(
    batches: Iterator[list[dict[str, Any]]], wanted: int, extra: int
) -> list[dict[str, Any]] | None:
    """The groups of one step: a batch, then more batches while fewer than `wanted` groups have
    signal and fewer than `extra` more groups were leased. None once the stream has ended."""
    first = next(batches, None)
    if first is None:
        return None
    taken = list(first)
    signal = sum(map(has_signal, taken))
    more_allowed = extra
    while more_allowed > 0 and signal < wanted:
        batch = next(batches, None)
        if batch is None:
            break
        taken.extend(batch)
        signal += sum(map(has_signal, batch))
        more_allowed -= len(batch)
    return taken


def flat_fill(groups: list[dict[str, Any]], wanted: int, extra: int) -> int | None:
    """How many flat groups of a step go to the learner: all without resampling (`extra` 0:
    None), else those that make up `wanted` with the groups that have signal."""
    if not extra:
        return None
    return max(0, wanted - sum(has_signal(g) for g in groups))
