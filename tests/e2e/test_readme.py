"""The README's quick start, word for word: `polar-mq up --fake`, then its Python snippet as the
README holds it (read from README.md between its markers), and the same snippet with the model
name misspelt, which submit refuses with a message naming the served model."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
POLAR_MQ = Path(sys.executable).parent / "polar-mq"
MODEL = "SmolLM2-135M-Instruct"


def readme_snippet() -> str:
    """The Python block between the README's `readme-snippet` markers."""
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- readme-snippet: begin -->")[1].split("<!-- readme-snippet: end -->")[0]
    match = re.search(r"```python\n(.*?)```", block, re.S)
    assert match is not None, "no ```python block between the README's snippet markers"
    return match.group(1)


@contextlib.contextmanager
def polar_mq_up(cwd: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`polar-mq up --fake` as the README says (a clean environment, in `cwd`): its API key and
    the process; stopped with Ctrl-C (SIGINT) after the block, which must leave no process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    up = subprocess.Popen(
        [str(POLAR_MQ), "up", "--fake"], cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    assert up.stdout is not None
    seen: list[str] = []
    key = None
    try:
        for line in up.stdout:
            seen.append(line)
            if line.strip().startswith("export POLAR_MQ_API_KEY="):
                key = line.strip().split("=", 1)[1]
            if "Ctrl-C stops" in line:
                break
        assert key, "".join(seen)
        children = psutil.Process(up.pid).children(recursive=True)
        yield key, up
    finally:
        up.send_signal(signal.SIGINT)
        try:
            rest, _ = up.communicate(timeout=90)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(up.pid, signal.SIGKILL)
    assert up.returncode == 0, "".join(seen) + rest
    assert "stopped" in rest
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.cmdline() for p in alive]


def run_snippet(code: str, key: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env={**env, "POLAR_MQ_API_KEY": key},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One `polar-mq up --fake` for the module: its key and the directory it runs in."""
    cwd = tmp_path_factory.mktemp("readme")
    with polar_mq_up(cwd) as (key, _):
        yield key, cwd


def test_readme_quick_start_word_for_word(up: tuple[str, Path]) -> None:
    key, cwd = up
    done = run_snippet(readme_snippet(), key, cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "What is 6*7? [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]" in done.stdout
    assert (cwd / "job.parquet").stat().st_size > 0


def test_a_misspelt_model_fails_at_submit_naming_the_served_one(up: tuple[str, Path]) -> None:
    key, cwd = up
    snippet = readme_snippet()
    assert MODEL in snippet  # the misspelling must change something
    misspelt = run_snippet(snippet.replace(MODEL, "SmolLM2-135M-Instruc"), key, cwd)
    assert misspelt.returncode != 0
    assert (
        "model 'SmolLM2-135M-Instruc' is not served by the engine, which serves "
        f"'{MODEL}'" in misspelt.stderr
    ), misspelt.stderr
    assert "What is 6*7?" not in misspelt.stdout  # refused before any rollout ran


def test_the_snippet_without_a_key_says_where_the_key_goes(up: tuple[str, Path]) -> None:
    _, cwd = up
    without_key = run_snippet(readme_snippet(), "", cwd)
    assert without_key.returncode != 0
    assert "401 unauthorized: missing API key" in without_key.stderr
    assert "set POLAR_MQ_API_KEY" in without_key.stderr


def polar_mq(key: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    if key is not None:
        env["POLAR_MQ_API_KEY"] = key
    return subprocess.run(
        [str(POLAR_MQ), *args], env={**env, "COLUMNS": "200"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_the_cli_on_up_tables_json_and_key_errors(up: tuple[str, Path]) -> None:
    key, _ = up
    url = "http://127.0.0.1:8000"
    done = polar_mq(key, "submit", str(REPO / "examples/arithmetic.json"), "--samples", "2",
                    "--wait", "--url", url)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = done.stdout.split()[1].rstrip(":")
    assert "│ What is 6 * 7?" in done.stdout and "│ 2 completed │" in done.stdout, done.stdout
    assert "│ state       │ completed" in done.stdout, done.stdout

    status = polar_mq(key, "status", job_id, "--url", url)
    assert "│ by status   │ 6 completed" in status.stdout, status.stdout
    as_json = json.loads(polar_mq(key, "status", job_id, "--json", "--url", url).stdout)
    assert (as_json["state"], as_json["by_status"], as_json["errors"]) == (
        "completed", {"completed": 6}, [],
    )  # fmt: skip
    listed = polar_mq(key, "status", "--url", url)
    assert job_id in listed.stdout and "completed" in listed.stdout

    results = polar_mq(key, "results", job_id, "--url", url)
    assert results.stdout.count("│ 1 1     │ 1    │ 2 completed │") == 3, results.stdout
    lines = polar_mq(key, "results", job_id, "--json", "--url", url).stdout.splitlines()
    assert sorted(json.loads(line)["mean_reward"] for line in lines) == [1.0, 1.0, 1.0]

    for given, told in ((None, "missing API key"), ("pmq_wrong", "invalid or revoked API key")):
        refused = polar_mq(given, "status", "--url", url)
        text = " ".join(refused.stdout.split())
        assert refused.returncode == 1
        assert f"error: 401 unauthorized: {told}" in text, text
        assert "--api-key" in text and "POLAR_MQ_API_KEY" in text, text
