"""`command`: run a test command inside the rollout's runtime, where the agent left its work.

The reward is the exit status (0 → 1.0) or, with `reward_file`, a float the command wrote. A
missing or unreadable reward file scores 0.0 rather than None: the tests ran, the work failed them.
A reward file that is a symlink is never followed (`UnsafePath`: the evaluate stage scores 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from polar_mq.evaluators.base import EvalContext, EvalResult, Evaluator
from polar_mq.runtimes.safe_files import UnsafePath


class CommandEvaluator(Evaluator):
    """Run `command` (shell string or argv) in the runtime with a wall-clock `timeout`."""

    name = "command"
    needs_runtime = True
    needs_final_text = False

    def __init__(
        self,
        command: str | list[str],
        timeout: float = 600.0,
        reward_file: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> None:
        if isinstance(command, list):
            if not command or not all(isinstance(part, str) for part in command):
                raise ValueError("command: 'command' list must be non-empty strings")
        elif not isinstance(command, str) or not command.strip():
            raise ValueError("command: 'command' must be a non-empty string or list of strings")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError("command: 'timeout' must be a positive number of seconds")
        if reward_file is not None and (not isinstance(reward_file, str) or not reward_file):
            raise ValueError("command: 'reward_file' must be a non-empty path string")
        if env is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in dict(env).items()
        ):
            raise ValueError("command: 'env' must map str to str")
        self.command = command
        self.timeout = float(timeout)
        self.reward_file = reward_file
        self.env = dict(env or {})
        self.cwd = cwd

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        if ctx.runtime is None:
            return EvalResult(None, {"error": "the command evaluator needs the rollout's runtime"})
        env = {**self.env, "POLAR_ROLLOUT_ID": ctx.rollout_id}
        result = ctx.runtime.exec(self.command, env=env, cwd=self.cwd, timeout=self.timeout)
        detail: dict[str, object] = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "duration_s": round(result.duration_s, 3),
            "stdout_tail": result.stdout_tail,
            "stderr_tail": result.stderr_tail,
        }
        if self.reward_file is None:
            return EvalResult(1.0 if result.ok else 0.0, detail)
        if result.timed_out:  # a half-run test suite earns nothing, whatever it wrote
            return EvalResult(0.0, detail)
        reward, error = self._read_reward(ctx)
        if error:
            detail["reward_file_error"] = error
        return EvalResult(reward, detail)

    def _read_reward(self, ctx: EvalContext) -> tuple[float, str | None]:
        assert ctx.runtime is not None and self.reward_file is not None
        try:
            raw = ctx.runtime.download(self.reward_file).decode("utf-8", errors="replace")
            reward = float(raw.strip())
        except UnsafePath:
            raise
        except (OSError, ValueError) as exc:
            return 0.0, f"{type(exc).__name__}: {exc}"
        if not math.isfinite(reward):
            return 0.0, f"reward is not finite: {raw.strip()!r}"
        return reward, None
