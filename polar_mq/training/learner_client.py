"""The loop's handle on the learner process (`learner.py`, in the vLLM venv).

One request and one answer at a time over the child's stdin/stdout, as JSON lines; the child's
stderr (library logs, tracebacks) goes to a log file. The child runs in the vLLM virtualenv with
this repository on its PYTHONPATH, offline.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from polar_mq.inference import local_vllm

REPO_ROOT = Path(__file__).resolve().parents[2]


class LearnerError(RuntimeError):
    """The learner answered an error, or died."""


class Learner:
    def __init__(self, log_path: Path, python: Path | None = None) -> None:
        self.log_path = log_path
        self.python = python or local_vllm.vllm_python()
        self._log: IO[bytes] | None = None
        self._proc: subprocess.Popen[str] | None = None

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
        env.update(
            PYTHONPATH=str(REPO_ROOT),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TRANSFORMERS_VERBOSITY="error",
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
        )
        return env

    def start(self) -> Learner:
        if not self.python.is_file():
            raise LearnerError(f"no learner interpreter at {self.python}: {local_vllm.SETUP_HINT}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            [str(self.python), "-m", "polar_mq.training.learner"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=self.environment(),
            text=True,
        )
        return self

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise LearnerError("the learner was not started")
        try:
            proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            raise LearnerError(f"the learner died ({exc}); see {self.log_path}") from exc
        if not line:
            raise LearnerError(f"the learner exited ({proc.poll()}); see {self.log_path}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise LearnerError(f"learner {op}: {answer['error']} (log: {self.log_path})")
        return answer

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Learner:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
