"""aider preset: command line, model metadata file, side-call rules."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from polar_mq.harnesses import get_harness
from polar_mq.harnesses.auxiliary import is_auxiliary
from polar_mq.harnesses.presets.aider import CHAT_HISTORY, LLM_HISTORY, METADATA, SETTINGS
from polar_mq.harnesses.presets.harness import PresetHarness
from tests.harnesses.preset_context import preset_ctx


def harness(options: dict[str, object] | None = None) -> PresetHarness:
    built = get_harness({"type": "aider", "options": options or {}})
    assert isinstance(built, PresetHarness)
    return built


def argv_of(built: PresetHarness, tmp_path: Path) -> list[str]:
    return shlex.split(built.command(preset_ctx(tmp_path)).split(" && exec ", 1)[1])


def test_command_line_is_non_interactive_and_offline(tmp_path: Path) -> None:
    ctx = preset_ctx(tmp_path)
    argv = argv_of(harness(), tmp_path)
    assert argv[0] == f"{tmp_path}/harnesses/aider/0.86.2/venv/bin/aider"
    assert argv[argv.index("--model") + 1] == "openai/smollm2"
    assert argv[argv.index("--openai-api-base") + 1] == "http://127.0.0.1:8010/v1"
    assert argv[argv.index("--message") + 1] == ctx.instruction
    for flag in (
        "--yes-always",
        "--no-git",
        "--no-auto-commits",
        "--no-show-model-warnings",
        "--no-check-update",
        "--analytics-disable",
        "--no-pretty",
        "--no-detect-urls",
    ):
        assert flag in argv
    assert "tok-abc" not in argv  # the key travels in OPENAI_API_KEY only
    assert argv[argv.index("--model-metadata-file") + 1] == f"{ctx.workdir}/{METADATA}"
    assert argv[argv.index("--chat-history-file") + 1] == f"{ctx.workdir}/{CHAT_HISTORY}"
    assert argv[argv.index("--llm-history-file") + 1] == f"{ctx.workdir}/{LLM_HISTORY}"
    assert "--edit-format" not in argv and "--git" not in argv


def test_options(tmp_path: Path) -> None:
    options = {
        "edit_format": "diff",
        "git": True,
        "files": ["a.py", "b.py"],
        "read": ["README.md"],
        "timeout": 30,
    }
    argv = argv_of(harness(options), tmp_path)
    assert argv[argv.index("--edit-format") + 1] == "diff"
    assert "--git" in argv and "--no-gitignore" in argv and "--no-git" not in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--file"] == ["a.py", "b.py"]
    assert argv[argv.index("--read") + 1] == "README.md"
    assert argv[argv.index("--timeout") + 1] == "30.0"


def test_model_metadata_names_the_model_so_aider_downloads_nothing(tmp_path: Path) -> None:
    files = harness({"context_window": 2048}).files(preset_ctx(tmp_path))
    metadata = json.loads(files[METADATA])
    assert metadata["openai/smollm2"]["max_input_tokens"] == 2048
    assert metadata["openai/smollm2"]["litellm_provider"] == "openai"


def test_reminder_option_writes_model_settings_aider_reads(tmp_path: Path) -> None:
    """`reminder: none` keeps aider's history an extension (docs/tito.md): a settings file."""
    ctx = preset_ctx(tmp_path)
    assert SETTINGS not in harness().files(ctx)
    assert "--model-settings-file" not in argv_of(harness(), tmp_path)
    built = harness({"reminder": "none"})
    argv = argv_of(built, tmp_path)
    assert argv[argv.index("--model-settings-file") + 1] == f"{ctx.workdir}/{SETTINGS}"
    settings = json.loads(built.files(ctx)[SETTINGS])  # JSON is YAML, which aider reads
    assert settings == [{"name": "openai/smollm2", "reminder": "none"}]


def test_environment(tmp_path: Path) -> None:
    ctx = preset_ctx(tmp_path)
    env = harness().env(ctx)
    assert env["HOME"].startswith(f"{ctx.workdir}/.polar/")
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["OPENAI_API_KEY"] == "tok-abc"


def test_summaries_and_commit_messages_are_auxiliary() -> None:
    rules = harness().auxiliary_rules
    summary = {
        "messages": [
            {"role": "system", "content": "*Briefly* summarize this partial conversation about x"},
            {"role": "user", "content": "# USER\nhi"},
        ]
    }
    commit = {
        "messages": [
            {"role": "system", "content": "You generate concise, one-line Git commit messages"},
            {"role": "user", "content": "diff"},
        ]
    }
    main = {
        "messages": [
            {"role": "system", "content": "Act as an expert software developer."},
            {"role": "user", "content": "Fix calc.py"},
        ]
    }
    assert is_auxiliary(summary, rules) and is_auxiliary(commit, rules)
    assert not is_auxiliary(main, rules)


def test_bad_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="edit_format"):
        get_harness({"type": "aider", "options": {"edit_format": "diff; rm -rf /"}})
    with pytest.raises(ValueError, match="takes no skills"):
        get_harness({"type": "aider", "options": {"skills": {"x": "y"}}})
    with pytest.raises(ValueError, match="reminder"):
        get_harness({"type": "aider", "options": {"reminder": "later"}})


def test_git_mode_excludes_aiders_cache_locally_then_runs_aider(tmp_path: Path) -> None:
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    argv = argv_of(harness({"git": True}), tmp_path)
    assert argv[:2] == ["/bin/sh", "-c"] and argv[4].endswith("/venv/bin/aider")
    wrapper = [*argv[:4], "sh", "-c", "echo ran > out.txt"]
    for _ in range(2):
        subprocess.run(wrapper, cwd=repo, check=True)
    assert (repo / "out.txt").read_text() == "ran\n"
    exclude = (repo / ".git" / "info" / "exclude").read_text().splitlines()
    assert exclude.count(".aider*") == 1
    (repo / ".aider.tags.cache.v4").mkdir()
    (repo / ".aider.tags.cache.v4" / "cache.db").write_text("x")
    status = subprocess.run(
        ["git", "status", "--porcelain", "-uall"], cwd=repo, capture_output=True, text=True
    )
    assert ".aider" not in status.stdout
    elsewhere = tmp_path / "plain"
    elsewhere.mkdir()  # not a repository: aider still runs
    subprocess.run([*argv[:4], "sh", "-c", "echo ran > out.txt"], cwd=elsewhere, check=True)
    assert (elsewhere / "out.txt").exists()
