"""A scripted "model" for the fake engine: drives a real third-party harness through a fixed plan.

Real harnesses bring their own tools (Claude Code's `Bash`, Codex's `shell`, mini-swe-agent's
`bash`...), so the calculator policy cannot drive them. A script names, per main-loop turn, the
tool call to make or the text to say, and how to answer the harness's side calls:

    {"turns": [{"tool": "Bash", "arguments": {"command": "echo 42 > answer.txt"}},
               {"text": "The answer is 42."}],
     "side": [{"when": {"no_tools": true}, "text": "Arithmetic task"}],
     "after": "Done."}

The turn is the number of assistant messages already in the conversation, so every call of the
main loop moves the plan one step and a retried call gets the same step. With a tagged plan (see
below) only the assistant messages after the tagged message count: a harness that sends few-shot
example exchanges before the task (aider) starts at turn 0 all the same. A request that a `side`
rule matches (the same conditions as auxiliary-call rules) gets that rule's text. Past the last
turn the model says `after`. Serve it: `python -m polar_mq.testing.fake_vllm --script plan.json`.

`--script DIR` serves many plans from one engine (one shared test stack for every harness): a
conversation whose text holds `[[plan:NAME]]` (put it in the task's instruction) follows
`DIR/NAME.json`, read when first needed; other conversations get the calculator policy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from polar_mq.harnesses.auxiliary import AuxiliaryRule, is_auxiliary
from polar_mq.testing.fake_policy import Reply, ToolCall, chat_reply
from polar_mq.testing.fake_tokenizer import content_text, tool_call_markup

Policy = Callable[[Sequence[Mapping[str, Any]], Sequence[Any] | None], Reply]
PLAN_TAG = re.compile(r"\[\[plan:([A-Za-z0-9_.-]{1,64})\]\]")


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    text: str | None = None


class SideReply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    when: AuxiliaryRule
    text: str


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    turns: list[Turn]
    side: list[SideReply] = Field(default_factory=list)
    after: str = "Done."

    @classmethod
    def load(cls, path: str | Path) -> Script:
        return cls.model_validate_json(Path(path).read_bytes())

    def reply(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None, start: int = 0
    ) -> Reply:
        """`start`: the index of the message the turns count from (the task's)."""
        request = {"messages": list(messages), "tools": tools}
        for side in self.side:
            if is_auxiliary(request, [side.when]):
                return Reply(side.text)
        step = sum(1 for m in messages[start:] if m.get("role") == "assistant")
        if step >= len(self.turns):
            return Reply(self.after)
        turn = self.turns[step]
        if turn.tool is None:
            return Reply(turn.text or self.after)
        arguments = json.dumps(turn.arguments)
        return Reply(tool_call_markup(turn.tool, arguments), ToolCall(turn.tool, arguments))


class PlanDirectory:
    """Plans by name from a directory, chosen per conversation by its `[[plan:NAME]]` tag."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._loaded: dict[str, tuple[float, Script]] = {}

    def _plan(self, name: str) -> Script | None:
        path = self.directory / f"{name}.json"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        cached = self._loaded.get(name)
        if cached is None or cached[0] != mtime:
            cached = (mtime, Script.load(path))
            self._loaded[name] = cached
        return cached[1]

    def reply(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> Reply:
        for index, message in enumerate(messages):
            found = PLAN_TAG.search(content_text(message.get("content")))
            plan = self._plan(found.group(1)) if found else None
            if plan is not None:
                return plan.reply(messages, tools, start=index)
        return chat_reply(messages, tools)


def load_policy(path: str | Path) -> Policy:
    """`--script`: one plan file for every conversation, or a directory of tagged plans."""
    if Path(path).is_dir():
        return PlanDirectory(path).reply
    return Script.load(path).reply
