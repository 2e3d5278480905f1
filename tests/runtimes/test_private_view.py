"""`local`'s private view: an agent cannot read the checkout, the logs, other runtimes, or paths
the operator lists, while its own work (directories, interpreter) still runs.

Real processes on this node: a root worker (this test process), `local` runtimes on the node's
pool users in an open runtime root, world-readable files planted in the checkout polar_mq runs
from, in the log directory and in a listed directory. Each probe line is `NAME=read|refused`.
The control runs the same probe with the view turned off: the planted files are then read, so
the refusals are the view's doing.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from polar_mq.config import get_settings
from polar_mq.harnesses import parse_harness_spec
from polar_mq.harnesses.presets.setup import check_agent_reaches
from polar_mq.runtimes import LocalRuntime, private_view
from polar_mq.runtimes.identity import AgentIdentity
from polar_mq.runtimes.private_view import ViewPlan, checkout_root, plan_view, reachable_in_view

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or private_view.unavailable_reason() is not None,
    reason=f"no private view on this node: {private_view.unavailable_reason()}",
)

PROBE = """\
check() {{ if cat "$2" >/dev/null 2>&1; then echo "$1=read"; else echo "$1=refused"; fi; }}
check CHECKOUT {checkout}/pyproject.toml
check CHECKOUT_SECRET {checkout}/{secret}
check LOG {log}
check LISTED {listed}
check VICTIM {victim}
check ENVIRON /proc/{worker}/environ
if ls {root} >/dev/null 2>&1; then echo "LIST_ROOT=read"; else echo "LIST_ROOT=refused"; fi
echo mine > own.txt && echo home > "$HOME/h" && echo tmp > "$TMPDIR/t" && echo "OWN=$(cat own.txt)"
{python} -c 'import polar_mq, sys; print("PYTHON=" + sys.version.split()[0])'
"""


def traversable_by_others(path: Path) -> bool:
    """Whether an agent user (not the owner, not in the group) can walk down to `path`: CI may
    clone the checkout below a 0700 directory (`mktemp -d`), where no agent reads it, view or
    not."""
    return all(parent.stat().st_mode & 0o001 for parent in (path, *path.parents))


@dataclass
class Node:
    root: Path
    checkout: Path
    secret: str
    log: Path
    listed: Path


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    """An open runtime root, and world-readable secrets where an agent must not look."""
    checkout = checkout_root()
    if checkout is None:
        pytest.skip("polar_mq runs from an installed package here: there is no checkout")
    base = Path("/tmp") / f"pmq-view-{uuid.uuid4().hex[:8]}"
    for directory in (base, base / "logs", base / "listed"):
        directory.mkdir(mode=0o755)
        directory.chmod(0o755)
    log = base / "logs" / "worker.jsonl"
    log.write_text("a worker's log line\n")
    listed = base / "listed" / "key.txt"
    listed.write_text("an operator's secret\n")
    secret = f".pmq-planted-{uuid.uuid4().hex[:8]}.env"
    (checkout / secret).write_text("POLAR_MQ_SECRET_KEY=planted\n")
    for path in (log, listed, checkout / secret):
        path.chmod(0o644)
    monkeypatch.setenv("POLAR_MQ_LOG_DIR", str(base / "logs"))
    monkeypatch.setenv("POLAR_MQ_LOCAL_HIDDEN_PATHS", str(base / "listed"))
    get_settings.cache_clear()
    try:
        yield Node(base / "runtimes", checkout, secret, log, listed)
    finally:
        (checkout / secret).unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)
        get_settings.cache_clear()


def probe(rt: LocalRuntime, node: Node, victim: LocalRuntime) -> dict[str, str]:
    script = PROBE.format(
        checkout=node.checkout,
        secret=node.secret,
        log=node.log,
        listed=node.listed,
        victim=victim.workdir / "secret.txt",
        worker=os.getpid(),
        root=node.root,
        python=rt.python,
    )
    result = rt.exec(script, timeout=60)
    lines = dict(line.split("=", 1) for line in result.stdout_tail.splitlines() if "=" in line)
    assert "OWN" in lines, result
    return lines


def test_local_agent_sees_its_own_work_and_nothing_private(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = LocalRuntime(f"victim-{uuid.uuid4().hex[:6]}", node.root)
    rt = LocalRuntime(f"probe-{uuid.uuid4().hex[:6]}", node.root)
    victim.start()
    rt.start()
    try:
        victim.upload(b"another rollout's secret", "secret.txt")
        (victim.workdir / "secret.txt").chmod(0o644)
        assert rt.agent.switch and rt.agent != victim.agent
        lines = probe(rt, node, victim)
        hidden = ("CHECKOUT", "CHECKOUT_SECRET", "LOG", "LISTED", "VICTIM", "ENVIRON", "LIST_ROOT")
        assert {name: lines[name] for name in hidden} == dict.fromkeys(hidden, "refused"), lines
        # its own directories and the worker's interpreter (kept, though below root's 0700 home
        # on some nodes) still work
        assert lines["OWN"] == "mine" and lines["PYTHON"], lines
        assert (rt.path / "home" / "h").read_text() == "home\n"
        assert (rt.path / "tmp" / "t").read_text() == "tmp\n"

        # the control: without the view the planted files are world-readable to the agent
        monkeypatch.setattr(private_view, "unavailable_reason", lambda: "turned off by the test")
        shared = probe(rt, node, victim)
        planted = ["LOG", "LISTED"]
        if traversable_by_others(node.checkout):
            planted += ["CHECKOUT", "CHECKOUT_SECRET"]
        for name in planted:
            assert shared[name] == "read", (name, shared)
        assert shared["ENVIRON"] == "refused" and shared["VICTIM"] == "refused", shared
    finally:
        rt.stop()
        victim.stop()


def test_background_processes_keep_the_view_and_end_with_stop(node: Node) -> None:
    rt = LocalRuntime(f"bg-{uuid.uuid4().hex[:6]}", node.root)
    rt.start()
    try:
        started = rt.exec(
            f"setsid sh -c 'sleep 1; cat {node.checkout}/pyproject.toml > seen 2>&1; sleep 60' "
            "> /dev/null 2>&1 &",
            timeout=30,
        )
        assert started.ok, started
        assert rt.alive_processes()
        for _ in range(100):
            if (rt.workdir / "seen").exists() and (rt.workdir / "seen").stat().st_size:
                break
            time.sleep(0.05)
        assert "No such file" in (rt.workdir / "seen").read_text()
    finally:
        rt.stop()
    assert not rt.alive_processes()


def test_a_view_that_cannot_be_built_is_the_platforms_failure(node: Node) -> None:
    """The helper reports on its own pipe: never an exit status the agent could fake."""
    rt = LocalRuntime(f"fail-{uuid.uuid4().hex[:6]}", node.root)
    rt.start()
    try:
        faked = rt.exec("echo 'cannot start the command' >&2; exit 125")
        assert faked.exit_code == 125  # the agent's own exit: an ordinary result
        (rt.workdir / "closed").mkdir(mode=0o700)  # the worker's: the agent cannot enter it
        with pytest.raises(RuntimeError, match=r"private view.*Permission denied"):
            rt.exec("true", cwd="closed")
    finally:
        rt.stop()


def test_plan_keeps_what_the_agent_runs_and_hides_the_rest(node: Node) -> None:
    rt_path = node.root / "rt-plan"
    agent = AgentIdentity(65534, 65534, "nobody")
    plan = plan_view(get_settings(), node.root, rt_path, agent)
    assert isinstance(plan, ViewPlan)
    assert str(node.checkout) in plan.hide and str(node.listed.parent) in plan.hide
    assert str(node.log.parent) in plan.hide
    kept = dict(plan.keep)
    assert kept[os.path.realpath(rt_path)] is True  # its own directory, writable
    assert kept[os.path.realpath(node.checkout / "polar_mq")] is False  # the package, read-only
    assert "/" not in plan.hide and "/tmp" not in plan.hide


def test_production_refuses_local_without_the_view_unless_allowed(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(private_view, "unavailable_reason", lambda: "no CAP_SYS_ADMIN (test)")
    monkeypatch.setenv("POLAR_MQ_UNSAFE_ROOT_AGENTS", "0")
    monkeypatch.setenv("POLAR_MQ_ENVIRONMENT", "production")
    monkeypatch.setenv("POLAR_MQ_SECRET_KEY", "21b8b2f830206461779cda725c86dd3e64e1a9c3")
    monkeypatch.setenv("POLAR_MQ_PROXY_ADMIN_TOKEN", "iU_LUNGqfqq1_O7N3YdXxElIIXJwvmKg5d20864a")
    monkeypatch.setenv("POLAR_MQ_DATABASE_URL", "postgresql://postgres@127.0.0.1/none")
    get_settings.cache_clear()
    rt = LocalRuntime(f"prod-{uuid.uuid4().hex[:6]}", node.root)
    with pytest.raises(RuntimeError, match="LOCAL_ALLOW_SHARED_VIEW"):
        rt.start()
    rt.stop()
    monkeypatch.setenv("POLAR_MQ_LOCAL_ALLOW_SHARED_VIEW", "1")
    get_settings.cache_clear()
    allowed = LocalRuntime(f"prod-{uuid.uuid4().hex[:6]}", node.root)
    allowed.start()
    try:
        # what the operator accepted: a listed path is no longer hidden (the listed directory is
        # open to every user, unlike the checkout, which CI may clone below a 0700 directory)
        assert allowed.exec(f"cat {node.listed}").ok
    finally:
        allowed.stop()


def test_hidden_paths_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("relative/dir", "/"):
        monkeypatch.setenv("POLAR_MQ_LOCAL_HIDDEN_PATHS", bad)
        get_settings.cache_clear()
        with pytest.raises(ValueError, match="must be an absolute path below /"):
            get_settings()
    monkeypatch.setenv("POLAR_MQ_LOCAL_HIDDEN_PATHS", "/srv/a, /srv/b")
    get_settings.cache_clear()
    assert get_settings().local_hidden_paths == [Path("/srv/a"), Path("/srv/b")]
    get_settings.cache_clear()


def test_prepare_accepts_an_interpreter_the_view_makes_reachable(node: Node) -> None:
    """On a node whose Python lives below root's 0700 home, the reference agent's interpreter is
    unreachable by path but kept in the view: prepare lets the rollout run (and it does run)."""
    rt = LocalRuntime(f"reach-{uuid.uuid4().hex[:6]}", node.root)
    rt.start()
    try:
        interpreter = Path(rt.python).resolve().parent
        check_agent_reaches(
            rt, parse_harness_spec({"type": "reference"}), get_settings().harness_root
        )
        assert reachable_in_view(interpreter, rt.agent, get_settings())
        ran = rt.exec([rt.python, "-c", "import polar_mq.agents; print('ok')"], timeout=60)
        assert ran.ok and ran.stdout_tail.strip() == "ok", ran
        # a path outside the kept ones gains nothing from the view
        assert not reachable_in_view(
            node.listed.parent, AgentIdentity(4321, 4321, "x"), get_settings()
        )
    finally:
        rt.stop()
