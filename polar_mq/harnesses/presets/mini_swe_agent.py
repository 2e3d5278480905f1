"""mini-swe-agent (PyPI `mini-swe-agent`): the `mini` CLI, one bash tool, chat completions.

How it is run: `mini -m openai/<model> -t <instruction> -y --exit-immediately -c <base config>
-c .polar/mini/polar.yaml -c agent.step_limit=<max_turns> -o .polar/mini/trajectory.json`,
stdin from /dev/null. `-y` (yolo) runs every command without confirmation, `--exit-immediately`
ends the run when the agent submits instead of asking for a new task. The model goes through
litellm's `openai/` provider, which reads `OPENAI_BASE_URL` / `OPENAI_API_KEY` (the proxy and the
rollout token; `OPENAI_API_BASE` is set to the same URL for older litellm versions). The base
config is one of mini's own (`options.config`, default `mini.yaml`: the bash *tool-calling*
agent of mini 2.x; `mini_textbased.yaml` asks for fenced bash blocks instead); polar.yaml on top
sets no cost limit, cost tracking off for the unknown model, the workspace as cwd, and
`options.system_template` / `instance_template` / `model_kwargs` / `command_timeout` when given
(a short template fits a small context window).

Environment: `MSWEA_CONFIGURED=true` (skips the first-run wizard, which otherwise exits 1),
`MSWEA_GLOBAL_CONFIG_DIR` inside the workspace (`.polar/mini/config`),
`LITELLM_LOCAL_MODEL_COST_MAP=True` (no download of the cost map), `MSWEA_COST_TRACKING=
ignore_errors`, `MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT` (`options.model_attempts`, default 2, so a
failing proxy ends the run in seconds rather than minutes of back-off).

Answer: the agent submits by running `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` followed by its
answer (e.g. `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt`); the text after that
first line is mini's `submission`. After `mini` exits, the wrapper copies a non-empty submission
from the trajectory to `.polar/mini/submission.txt`, the answer file; without one the answer is the
last main-loop message.

MCP servers and skills: mini has neither; options naming them are refused at submission.

Artifacts: `trajectory` (mini's own trajectory JSON: every message, exit status, submission).
Side calls: none (every call is a main-loop step with the bash tool).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import Field

from polar_mq.harnesses.base import AnswerSource
from polar_mq.harnesses.presets.base import (
    STATE_DIR,
    Ecosystem,
    Package,
    Preset,
    PresetOptions,
    PresetRun,
)

MINI_DIR = f"{STATE_DIR}/mini"
CONFIG_FILE = f"{MINI_DIR}/polar.yaml"
TRAJECTORY = f"{MINI_DIR}/trajectory.json"
SUBMISSION = f"{MINI_DIR}/submission.txt"

# Runs mini with its own arguments ("$@"), then keeps its submission as the answer file.
# $1: the install's python, $2: the trajectory, $3: the answer file.
_WRAPPER = """py=$1 traj=$2 out=$3
shift 3
"$@" </dev/null
status=$?
"$py" - "$traj" "$out" <<'EOF'
import json, sys
try:
    info = json.load(open(sys.argv[1])).get("info") or {}
except (OSError, ValueError):
    sys.exit(0)
submission = info.get("submission") or ""
if info.get("exit_status") == "Submitted" and submission.strip():
    open(sys.argv[2], "w").write(submission)
EOF
exit $status
"""


class MiniSweAgentOptions(PresetOptions):
    config: str = Field(
        "mini.yaml", description="mini's base config: a builtin name (mini.yaml, ...) or a path"
    )
    system_template: str | None = Field(None, description="replaces agent.system_template")
    instance_template: str | None = Field(
        None, description="replaces agent.instance_template (Jinja; {{task}} is the instruction)"
    )
    model_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="merged into model.model_kwargs (litellm arguments)"
    )
    command_timeout: int = Field(60, ge=1, description="seconds per bash command")
    model_attempts: int = Field(2, ge=1, le=20, description="tries per model call (litellm)")


class MiniSweAgent(Preset):
    name: ClassVar[str] = "mini_swe_agent"
    api_family: ClassVar[str] = "chat"
    package: ClassVar[Package] = Package(Ecosystem.PYPI, "mini-swe-agent", "2.4.6")
    options_model: ClassVar[type[PresetOptions]] = MiniSweAgentOptions
    takes_mcp: ClassVar[bool] = False
    takes_skills: ClassVar[bool] = False
    answer: ClassVar[AnswerSource] = AnswerSource(
        SUBMISSION,
        "the submission (output after `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`), "
        "else the last main-loop message",
    )
    artifacts: ClassVar[dict[str, str]] = {"trajectory": TRAJECTORY}
    notes: ClassVar[str] = (
        "mini 2.x calls a `bash` tool; submit with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`"
    )

    def argv(self, run: PresetRun) -> list[str]:
        options = run.options
        assert isinstance(options, MiniSweAgentOptions)
        workdir = run.ctx.workdir
        mini = [
            run.install.program("mini"),
            "-m",
            f"openai/{run.ctx.model}",
            "-t",
            run.ctx.instruction,
            "-y",
            "--exit-immediately",
            "-c",
            options.config,
            "-c",
            f"{workdir}/{CONFIG_FILE}",
            "-c",
            f"agent.step_limit={options.max_turns}",
            "-o",
            f"{workdir}/{TRAJECTORY}",
        ]
        wrapper = [run.install.python, f"{workdir}/{TRAJECTORY}", f"{workdir}/{SUBMISSION}"]
        return ["/bin/sh", "-c", _WRAPPER, "mini-swe-agent", *wrapper, *mini]

    def files(self, run: PresetRun) -> dict[str, str]:
        options = run.options
        assert isinstance(options, MiniSweAgentOptions)
        agent: dict[str, Any] = {"cost_limit": 0, "mode": "yolo", "confirm_exit": False}
        if options.system_template is not None:
            agent["system_template"] = options.system_template
        if options.instance_template is not None:
            agent["instance_template"] = options.instance_template
        model: dict[str, Any] = {"cost_tracking": "ignore_errors"}
        if options.model_kwargs:
            model["model_kwargs"] = options.model_kwargs
        config = {
            "agent": agent,
            "model": model,
            "environment": {"cwd": run.ctx.workdir, "timeout": options.command_timeout},
        }
        # JSON is YAML: no YAML library needed, and every string is quoted safely.
        return {CONFIG_FILE: json.dumps(config, indent=2) + "\n"}

    def env(self, run: PresetRun) -> dict[str, str]:
        options = run.options
        assert isinstance(options, MiniSweAgentOptions)
        return {
            "MSWEA_CONFIGURED": "true",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{run.ctx.workdir}/{MINI_DIR}/config",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(options.model_attempts),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENAI_API_BASE": run.ctx.proxy_base_url.rstrip("/"),
            "PAGER": "cat",
        }


PRESET = MiniSweAgent()
