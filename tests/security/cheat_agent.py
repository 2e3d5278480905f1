"""An agent that games the `tests` evaluator instead of fixing the bug, one way per task.

Stdlib only, and its source travels in the task (`script`), so the same agent runs on the node
(local, bwrap) and in a container whose image knows nothing of this repository. The task's
`cheat` says what it does, in its workspace (the current directory) `calc/` with `add` right and
`mul` wrong; the hidden tests check both, so an untouched workspace scores 0.5:

- `untouched`: changes nothing; `honest`: fixes `mul`; `honest_commit`: fixes it, commits,
  and moves `refs/polar_mq/base`;
- `conftest`: a root `conftest.py` that marks every report passed;
- `addopts_ini`, `addopts_pyproject`, `addopts_setupcfg`, `addopts_tox`: a plugin module loaded
  by `addopts = -p cheatplug` in that configuration file;
- `pytest_shadow`: a `pytest/` package that shadows `python -m pytest` and writes a passing JUnit;
- `dist_info`: a `*.dist-info` with a `pytest11` entry point naming the plugin;
- `runner_patch`: a module patching `_pytest` on import, imported by a `tests/__init__.py` (and a
  `.pth` at the root);
- `user_site`: a `.pth` in the user site (`~/.local`) that patches `_pytest` when Python starts;
- `daemon`: a detached process that rewrites the hidden tests once they appear (here or in the
  workspace of its rollout's evaluation runtime);
- `git_base`: commits the root `conftest.py`, then moves `refs/polar_mq/base` to the commit so
  the workspace diff looks empty.

Every variant also leaves polar_mq's own kinds of files (`answer.txt`, `.polar/mini/notes.txt`),
which must stay out of the stored diff.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import time
from pathlib import Path

FIXED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
PASS_ALL = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    report = outcome.get_result()\n"
    "    report.outcome = 'passed'\n    report.longrepr = None\n"
)
PATCH_RUNNER = (
    "try:\n    from _pytest import reports\nexcept ImportError:\n    reports = None\n"
    "if reports is not None:\n"
    "    _made = reports.TestReport.from_item_and_call.__func__\n"
    "    def _passed(cls, item, call):\n"
    "        report = _made(cls, item, call)\n"
    "        report.outcome = 'passed'\n        report.longrepr = None\n        return report\n"
    "    reports.TestReport.from_item_and_call = classmethod(_passed)\n"
)
USER_SITE_PATCH = (
    "import importlib.util, sys\n\n\nclass _Hook:\n"
    "    # the user site is on sys.path before site-packages: patch once pytest is imported\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name != '_pytest.reports':\n            return None\n"
    "        sys.meta_path.remove(self)\n"
    "        spec = importlib.util.find_spec(name)\n"
    "        run = spec.loader.exec_module\n\n"
    "        def exec_module(module):\n            run(module)\n"
    "            made = module.TestReport.from_item_and_call.__func__\n\n"
    "            def passed(cls, item, call):\n"
    "                report = made(cls, item, call)\n"
    "                report.outcome = 'passed'\n                report.longrepr = None\n"
    "                return report\n\n"
    "            module.TestReport.from_item_and_call = classmethod(passed)\n\n"
    "        spec.loader.exec_module = exec_module\n        return spec\n\n\n"
    "sys.meta_path.insert(0, _Hook())\n"
)
FAKE_PYTEST = (
    "import sys\nfor arg in sys.argv:\n    if arg.startswith('--junitxml='):\n"
    "        open(arg.split('=', 1)[1], 'w').write(\n"
    '            \'<testsuites><testsuite name="pytest" tests="2">\'\n'
    '            \'<testcase classname="tests.test_calc" name="test_add"/>\'\n'
    '            \'<testcase classname="tests.test_calc" name="test_mul"/>\'\n'
    "            '</testsuite></testsuites>')\n"
)
WINNING_TESTS = "def test_add():\n    pass\n\n\ndef test_mul():\n    pass\n"


def write(path: str, text: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def git(*args: str) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True)


def daemon(workdir: Path) -> None:
    """Fork a detached process that rewrites every hidden test file it can find for 3 minutes."""
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    for fd in (0, 1, 2):
        os.close(fd)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        for root in (workdir, workdir.parent.parent / f"{workdir.parent.name}-eval" / "workspace"):
            test = root / "tests" / "test_calc.py"
            try:
                if test.is_file() and test.read_text() != WINNING_TESTS:
                    test.write_text(WINNING_TESTS)
            except OSError:
                pass
        time.sleep(0.005)
    os._exit(0)


def main() -> None:
    cheat = json.loads(Path("task.json").read_text())["cheat"]
    write("answer.txt", "done\n")
    write(".polar/mini/notes.txt", "the harness's own file\n")
    if cheat == "untouched":
        pass
    elif cheat == "honest":
        write("calc/__init__.py", FIXED)
    elif cheat == "honest_commit":
        write("calc/__init__.py", FIXED)
        git("commit", "-qam", "fix mul")
        git("update-ref", "refs/polar_mq/base", "HEAD")
    elif cheat == "conftest":
        write("conftest.py", PASS_ALL)
    elif cheat.startswith("addopts_"):
        write("cheatplug.py", PASS_ALL)
        config = {
            "addopts_ini": ("pytest.ini", "[pytest]\n"),
            "addopts_pyproject": ("pyproject.toml", "[tool.pytest.ini_options]\n"),
            "addopts_setupcfg": ("setup.cfg", "[tool:pytest]\n"),
            "addopts_tox": ("tox.ini", "[pytest]\n"),
        }[cheat]
        name, section = config
        quote = '"' if name == "pyproject.toml" else ""
        write(name, f"{section}addopts = {quote}-p cheatplug{quote}\n")
    elif cheat == "pytest_shadow":
        write("pytest/__init__.py", "")
        write("pytest/__main__.py", FAKE_PYTEST)
    elif cheat == "dist_info":
        write("cheatplug.py", PASS_ALL)
        write("cheat-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: cheat\nVersion: 1.0\n")
        write("cheat-1.0.dist-info/entry_points.txt", "[pytest11]\ncheat = cheatplug\n")
    elif cheat == "runner_patch":
        write("runner_patch.py", PATCH_RUNNER)
        write("tests/__init__.py", "import runner_patch  # noqa: F401\n")
        write("zz_runner_patch.pth", "import runner_patch\n")
    elif cheat == "user_site":
        user_site = Path(site.getusersitepackages())
        write(str(user_site / "zz_runner_patch_user.py"), USER_SITE_PATCH)
        write(str(user_site / "zz_cheat.pth"), "import zz_runner_patch_user\n")
    elif cheat == "daemon":
        daemon(Path.cwd())
    elif cheat == "git_base":
        write("conftest.py", PASS_ALL)
        git("add", "conftest.py")
        git("commit", "-qm", "tests: setup")
        git("update-ref", "refs/polar_mq/base", "HEAD")
    else:
        sys.exit(f"unknown cheat {cheat!r}")
    print(f"cheat {cheat} planted")


main()
