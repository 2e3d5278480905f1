"""The Slurm templates: valid bash, and every `polar-mq` command line in them exists."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.cli_usage import command_tree, invocations, unknown_usage

SLURM = Path(__file__).parents[2] / "deploy" / "slurm"
TEMPLATES = sorted(SLURM.glob("*.sbatch"))
INHERITED = {"CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID"}
"""Set by Slurm, not by the user."""


def test_there_is_a_head_and_a_node_template() -> None:
    assert {p.name for p in TEMPLATES} >= {"head.sbatch", "node.sbatch"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_is_valid_bash(path: Path) -> None:
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_every_polar_mq_command_line_exists(path: Path) -> None:
    root = command_tree()
    found = list(invocations(path.read_text()))
    assert found, f"no polar-mq command in {path.name}"
    problems = [
        f"line {inv.line}: {problem}" for inv in found for problem in unknown_usage(inv.words, root)
    ]
    assert not problems, problems


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_variables_are_documented_at_the_top(path: Path) -> None:
    """Each variable a user may set (read with a default or required: `${NAME:-...}`,
    `${NAME:?...}`) is listed in the template's header comment."""
    text = path.read_text()
    header, _, body = text.partition("\nset -euo pipefail")
    settable = set(re.findall(r"\$\{([A-Z][A-Z0-9_]+):[-?]", body)) - INHERITED
    assert settable
    undocumented = {name for name in settable if not re.search(rf"\b{name}\b", header)}
    assert not undocumented, sorted(undocumented)


def test_the_checker_catches_a_wrong_subcommand_or_flag() -> None:
    """The check above is only worth something if it fails on a typo."""
    root = command_tree()
    script = (
        'polar-mq worker --node "$N" \\\n  --concurency run_agent=8 &\npolar-mq apii --port 1\n'
    )
    problems = [p for inv in invocations(script) for p in unknown_usage(inv.words, root)]
    assert problems == ["worker: unknown option --concurency", "unknown subcommand 'apii'"]
    assert unknown_usage(["db", "upgrade"], root) == []
    assert unknown_usage(["db", "upgrad"], root) == ["unknown subcommand 'upgrad'"]
