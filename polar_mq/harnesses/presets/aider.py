"""aider (PyPI `aider-chat`): the `aider` CLI, one message, file edits from the model's reply.

How it is run: `aider --model openai/<model> --openai-api-base <proxy> --message <instruction>
--yes-always --no-git --no-auto-commits --no-dirty-commits --no-show-model-warnings
--no-check-update --analytics-disable --no-show-release-notes --no-pretty --no-fancy-input
--no-detect-urls --disable-playwright --model-metadata-file ... --chat-history-file ...
--input-history-file ... --llm-history-file ...` (stdin is /dev/null: the runtime's). The key is
`OPENAI_API_KEY` (the rollout token), read by litellm. `--message` makes aider answer one request
and exit; `--yes-always` accepts its confirmations (editing or creating files the model names; it
never runs shell commands the model suggests, which need an explicit yes). aider has no step
limit: a run is the reply plus at most 3 reflections (aider's own bound, after a malformed edit or
lint errors), so `options.max_turns` is not used. As in aider's chat, an instruction that starts
with `/` is an aider command (`/ask ...`, `/run ...`).

Git: `--no-git` by default: aider neither creates nor commits to a repository (so it makes no
commit-message calls), and a git workspace's changes still show in `workspace.diff`.
`options.git: true` lets aider use the workspace's repository for its repo map (still
`--no-auto-commits --no-dirty-commits --no-gitignore`; its repo-map cache
`.aider.tags.cache.v4/` is excluded through `.git/info/exclude`, so it stays out of the diff; in
a directory without a repository, aider would create one). `options.files` / `options.read` add
files to the chat (`--file` / `--read`); `options.edit_format` picks aider's edit format
(`diff`: SEARCH/REPLACE blocks, `whole`: whole files, ...; unset: aider's default for an unknown
model, `whole`).

History: aider appends its edit-format rules (the "system reminder") to the newest user message
of each call, so the next call sends that message without them: a rewritten history, every
call a new token-in segment. `options.reminder: none` (a `--model-settings-file` in
`.polar/aider/` naming the model) drops the reminder; the rules stay in the system prompt, and a
reflection (aider's retry after a reply it cannot parse) then extends the history it sent.
`sys` sends it as a trailing system message instead, which also moves at the next call.

Model metadata: aider looks up an unknown model's context window in litellm's price list, which
it downloads; a metadata file in `.polar/aider/` (`options.context_window`, zero prices) answers
instead, so no download is tried. aider asks for temperature 0 (its default for every model):
the proxy's sampling enforcement replaces it with the job's.

Answer: the last main-loop message (aider's reply; an `ANSWER: x` line in it for exact_match).
Artifacts: `chat_history` (`.polar/aider/chat.history.md`, what aider shows the user),
`llm_history` (`.polar/aider/llm.history.txt`, every message sent to and received from the model).
Side calls: chat-history summaries (system prompt "summarize this partial conversation", when the
history outgrows its budget) and commit messages ("one-line Git commit messages"; only with
auto-commits, which are off): both auxiliary.
"""

from __future__ import annotations

import json
from typing import ClassVar, Literal

from pydantic import Field

from polar_mq.harnesses.auxiliary import AuxiliaryRule
from polar_mq.harnesses.presets.base import (
    STATE_DIR,
    Ecosystem,
    Package,
    Preset,
    PresetOptions,
    PresetRun,
)

AIDER_DIR = f"{STATE_DIR}/aider"
CHAT_HISTORY = f"{AIDER_DIR}/chat.history.md"
LLM_HISTORY = f"{AIDER_DIR}/llm.history.txt"
INPUT_HISTORY = f"{AIDER_DIR}/input.history"
METADATA = f"{AIDER_DIR}/model-metadata.json"
SETTINGS = f"{AIDER_DIR}/model-settings.yml"

# git: true: aider keeps its repo-map cache (`.aider.tags.cache.v4/`) in the repository's root.
# Excluding `.aider*` locally (.git/info/exclude, outside the work tree) keeps it out of the
# workspace diff without touching the tracked .gitignore; then aider runs ("$@").
_GIT_EXCLUDE = """exclude=$(git rev-parse --git-path info/exclude 2>/dev/null) && {
  grep -qxF '.aider*' "$exclude" 2>/dev/null || {
    mkdir -p "$(dirname "$exclude")" && echo '.aider*' >> "$exclude"; }
}
exec "$@"
"""


class AiderOptions(PresetOptions):
    edit_format: str | None = Field(
        None, pattern=r"^[a-z-]{1,40}$", description="aider's --edit-format (diff, whole, ...)"
    )
    git: bool = Field(False, description="let aider use the workspace's git repo (repo map)")
    files: list[str] = Field(default_factory=list, description="workspace files added to chat")
    read: list[str] = Field(default_factory=list, description="read-only files added to chat")
    context_window: int = Field(32_768, ge=256, description="the model's context (metadata)")
    max_output_tokens: int = Field(4096, ge=1, description="the model's output limit (metadata)")
    timeout: float | None = Field(None, gt=0, description="seconds per API call (--timeout)")
    reminder: Literal["user", "sys", "none"] | None = Field(
        None, description="where aider repeats its edit-format rules (model settings `reminder`)"
    )


class Aider(Preset):
    name: ClassVar[str] = "aider"
    api_family: ClassVar[str] = "chat"
    package: ClassVar[Package] = Package(Ecosystem.PYPI, "aider-chat", "0.86.2")
    options_model: ClassVar[type[PresetOptions]] = AiderOptions
    takes_mcp: ClassVar[bool] = False
    takes_skills: ClassVar[bool] = False
    auxiliary: ClassVar[tuple[AuxiliaryRule, ...]] = (
        AuxiliaryRule(system_contains="summarize this partial conversation", no_tools=True),
        AuxiliaryRule(system_contains="one-line Git commit messages", no_tools=True),
    )
    artifacts: ClassVar[dict[str, str]] = {
        "chat_history": CHAT_HISTORY,
        "llm_history": LLM_HISTORY,
    }
    notes: ClassVar[str] = "one --message per run; edits come as blocks in its reply; no max_turns"

    def argv(self, run: PresetRun) -> list[str]:
        options = run.options
        assert isinstance(options, AiderOptions)
        workdir = run.ctx.workdir
        argv = [
            run.install.program("aider"),
            "--model",
            f"openai/{run.ctx.model}",
            "--openai-api-base",
            run.ctx.proxy_base_url.rstrip("/"),
            "--message",
            run.ctx.instruction,
            "--yes-always",
            *(["--git", "--no-gitignore"] if options.git else ["--no-git"]),
            "--no-auto-commits",
            "--no-dirty-commits",
            "--no-show-model-warnings",
            "--no-check-update",
            "--analytics-disable",
            "--no-show-release-notes",
            "--no-pretty",
            "--no-fancy-input",
            "--no-detect-urls",
            "--disable-playwright",
            "--encoding",
            "utf-8",
            "--model-metadata-file",
            f"{workdir}/{METADATA}",
            "--chat-history-file",
            f"{workdir}/{CHAT_HISTORY}",
            "--input-history-file",
            f"{workdir}/{INPUT_HISTORY}",
            "--llm-history-file",
            f"{workdir}/{LLM_HISTORY}",
        ]
        if options.edit_format is not None:
            argv += ["--edit-format", options.edit_format]
        if options.timeout is not None:
            argv += ["--timeout", str(options.timeout)]
        if options.reminder is not None:
            argv += ["--model-settings-file", f"{workdir}/{SETTINGS}"]
        for path in options.files:
            argv += ["--file", path]
        for path in options.read:
            argv += ["--read", path]
        if options.git:
            return ["/bin/sh", "-c", _GIT_EXCLUDE, "aider", *argv]
        return argv

    def files(self, run: PresetRun) -> dict[str, str]:
        options = run.options
        assert isinstance(options, AiderOptions)
        metadata = {
            f"openai/{run.ctx.model}": {
                "max_tokens": options.max_output_tokens,
                "max_input_tokens": options.context_window,
                "max_output_tokens": options.max_output_tokens,
                "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0,
                "litellm_provider": "openai",
                "mode": "chat",
            }
        }
        files = {METADATA: json.dumps(metadata, indent=2) + "\n"}
        if options.reminder is not None:  # JSON is YAML: aider reads this file with yaml
            settings = [{"name": f"openai/{run.ctx.model}", "reminder": options.reminder}]
            files[SETTINGS] = json.dumps(settings, indent=2) + "\n"
        return files

    def env(self, run: PresetRun) -> dict[str, str]:
        return {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "AIDER_ANALYTICS": "false",
            "AIDER_CHECK_UPDATE": "false",
        }


PRESET = Aider()
