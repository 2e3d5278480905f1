"""aider, installed from PyPI and run unmodified through the real pipeline and proxy.

The workspace is a git repository with a buggy calc.py. The scripted fake engine answers aider's
one message with a SEARCH/REPLACE block (aider's `diff` edit format) and an ANSWER line: aider
applies the edit (its "tool"), the workspace diff shows it, and the reply is graded. aider asks
for temperature 0; the job's sampling (0.7) is what the engine gets.
"""

from __future__ import annotations

import shutil

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.e2e.preset_support import (
    PresetStack,
    assert_captured,
    explain,
    install_preset,
    run_preset,
)

pytestmark = pytest.mark.e2e

GIT_INIT = (
    "git init -q && git add calc.py && git -c user.name=polar -c user.email=polar@example.com "
    "commit -q -m init"
)
EDIT = """I'll fix the constant.

calc.py
```python
<<<<<<< SEARCH
    return 41
=======
    return 6 * 7
>>>>>>> REPLACE
```

ANSWER: 42
"""

# An earlier session's chat, as aider writes it (`#### ` starts a user message): restored with
# `--restore-chat-history`, it is over the test's history budget from the start.
EARLIER_CHAT = (
    "\n# aider chat started at 2026-01-01 00:00:00\n\n#### What does calc.py do?\n\n"
    + "calc.py defines answer(), which returns a constant. " * 30
    + "\n"
)


@pytest.mark.parametrize(
    ("git", "kind"),
    [(False, "local"), (True, "local"), (False, "bwrap"), (False, "bwrap-proxy_only")],
    ids=["no-git", "git", "bwrap", "bwrap-proxy_only"],
)  # fmt: skip
def test_aider_edits_a_file_from_its_reply_and_job_sampling_wins(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session], git: bool, kind: str
) -> None:
    """With `git: true` aider sees the repository (repo map) but commits nothing: the diff against
    the checked-out commit still holds its edit. Also in a bwrap sandbox (install read-only)."""
    network = "proxy_only" if kind == "bwrap-proxy_only" else "host"  # proxy_only: that alone
    kind = kind.removesuffix("-proxy_only")
    if kind == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed")
    install_preset("aider")
    tag = preset_stack.plan(
        "aider",
        {
            "turns": [{"text": EDIT}],
            "side": [{"when": {"system_contains": "summarize this partial"}, "text": "ANSWER: 0"}],
            "after": "ANSWER: 41",
        },
    )
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "aider", "options": {"edit_format": "diff", "files": ["calc.py"], "git": git}},
        [{"instruction": f"{tag} Make answer() in calc.py return 6*7.", "answer": "42"}],
        evaluator="exact_match",
        sampling={"temperature": 0.7, "max_tokens": 512},
        runtime={
            "kind": kind,
            "network": network,
            "prepare": {
                "files": {"calc.py": "def answer():\n    return 41\n"},
                "commands": [GIT_INIT],
            },
        },
        timeouts={"agent_s": 120},
    )
    assert_captured(run, min_calls=1)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    main = [c for c in calls if c.purpose == "agent"]
    print(f"aider (git={git}, {kind}): {len(calls)} calls ({len(main)} main), {run.seconds:.1f}s")
    assert len(main) == 1, explain(run)
    for call in main:
        assert call.request["temperature"] == 0  # what aider asked for
        assert call.engine_request is not None
        assert call.engine_request["temperature"] == 0.7  # what the engine got: the job's
    assert rollout.reward == 1.0, explain(run)

    artifacts = run.artifacts[rollout.id]
    assert {"agent.log", "chat_history", "llm_history", "workspace.diff"} <= set(artifacts)
    diff = artifacts["workspace.diff"].decode()
    assert "-    return 41" in diff and "+    return 6 * 7" in diff, diff
    assert ".polar" not in diff and ".aider" not in diff, diff
    assert b"SEARCH" in artifacts["chat_history"]
    assert b"Make answer() in calc.py return 6*7." in artifacts["llm_history"]


def test_aider_history_summary_is_auxiliary_and_not_graded(
    preset_stack: PresetStack, db_session_factory: sessionmaker[Session]
) -> None:
    """A restored chat history over aider's budget (`--max-chat-history-tokens`, small here)
    makes aider summarise it with a side call, which aider waits for before it sends the message;
    the preset's rule marks it auxiliary, and the rollout is graded on the main loop's reply (the
    summary says "ANSWER: 0"). The history also outgrows the budget again after the reply: that
    second summary runs in a thread that races aider's exit (it is made, or fails with "cannot
    schedule new futures after shutdown", as in a failed run that relied on it); made or not, it
    is auxiliary too."""
    install_preset("aider")
    long_reply = "Some reasoning about the constant. " * 40 + "\n\n" + EDIT
    tag = preset_stack.plan(
        "aider_summary",
        {
            "turns": [{"text": long_reply}],
            "side": [
                {
                    "when": {"system_contains": "summarize this partial conversation"},
                    "text": "I asked you to fix calc.py. ANSWER: 0",
                }
            ],
            "after": "ANSWER: 41",
        },
    )
    options = {
        "edit_format": "diff",
        "files": ["calc.py"],
        "extra_args": ["--max-chat-history-tokens", "100", "--restore-chat-history"],
    }
    run = run_preset(
        preset_stack,
        db_session_factory,
        {"type": "aider", "options": options},
        [{"instruction": f"{tag} Make answer() in calc.py return 6*7.", "answer": "42"}],
        evaluator="exact_match",
        runtime={
            "prepare": {
                "files": {
                    "calc.py": "def answer():\n    return 41\n",
                    ".polar/aider/chat.history.md": EARLIER_CHAT,
                },
                "commands": [GIT_INIT],
            }
        },
        timeouts={"agent_s": 120},
    )
    assert_captured(run, min_calls=2)
    rollout = run.rollouts[0]
    calls = run.calls[rollout.id]
    purposes = [c.purpose for c in calls]
    print(f"aider (summary): {purposes}, {run.seconds:.1f}s")
    assert purposes[:2] == ["auxiliary", "agent"], explain(run)
    assert purposes[2:] in ([], ["auxiliary"]), explain(run)
    assert rollout.reward == 1.0, explain(run)  # the reply's ANSWER: 42, not the summary's
    assert "+    return 6 * 7" in run.artifacts[rollout.id]["workspace.diff"].decode()
