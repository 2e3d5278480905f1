"""Deliberately broken plug-ins for the fault-injection suite (imported by worker processes)."""

from __future__ import annotations

from polar_mq.trajectories.base import BuildResult, CapturedCall


class AlwaysRaises:
    """A builder with a bug: every build raises, so the stage must give up after its retries."""

    name = "always_raises"

    def build(self, calls: list[CapturedCall]) -> BuildResult:
        raise RuntimeError(f"builder bug on {len(calls)} calls")


class SlowBuilder:
    """A correct per-call builder that takes its time: a window to cancel a rollout in build."""

    name = "slow"

    def build(self, calls: list[CapturedCall]) -> BuildResult:
        import time

        from polar_mq.trajectories.per_call import PerCallBuilder

        time.sleep(8)
        return PerCallBuilder().build(calls)
