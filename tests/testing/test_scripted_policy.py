"""Scripted plans: turns count from the tagged task message, not from few-shot examples."""

from __future__ import annotations

import json
from pathlib import Path

from polar_mq.testing.scripted_policy import PlanDirectory, Script

PLAN = {"turns": [{"text": "first"}, {"text": "second"}], "after": "after"}


def test_turns_count_assistant_messages_after_the_tagged_message(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps(PLAN))
    plans = PlanDirectory(tmp_path)
    examples = [
        {"role": "system", "content": "You edit files."},
        {"role": "user", "content": "Example request"},
        {"role": "assistant", "content": "Example edit"},
        {"role": "user", "content": "I added calc.py"},
        {"role": "assistant", "content": "Ok."},
    ]
    task = {"role": "user", "content": "[[plan:p]] Fix calc.py"}
    assert plans.reply([*examples, task], None).text == "first"
    turn = [{"role": "assistant", "content": "first"}, {"role": "user", "content": "lint ok"}]
    assert plans.reply([*examples, task, *turn], None).text == "second"


def test_a_single_plan_counts_every_assistant_message() -> None:
    script = Script.model_validate(PLAN)
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "first"}]
    assert script.reply(messages, None).text == "second"
    assert script.reply(messages, None, start=1).text == "second"
    assert script.reply(messages, None, start=2).text == "first"
