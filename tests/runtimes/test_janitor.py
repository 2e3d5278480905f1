"""The runtime janitor on what a runtime root holds besides runtimes, and on its keep list."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from polar_mq.runtimes import LocalRuntime, kill_group
from polar_mq.runtimes.janitor import present_runtimes, sweep_orphans
from tests.conftest import runtime_id


def test_only_runtime_directories_count(tmp_path: Path) -> None:
    root = tmp_path / "runtimes"
    (root / "logs").mkdir(parents=True)  # run_agent's log directory lives under the root
    (root / "logs" / "agent.log").write_text("keep me")
    (root / ".hidden").mkdir()
    (root / "half-started" / "workspace").mkdir(parents=True)  # killed before its record
    kept, gone = runtime_id("rt-kept"), runtime_id("rt-gone")
    LocalRuntime(kept, root).start()
    LocalRuntime(gone, root).start()

    found = present_runtimes(root)
    assert found == {"half-started": "local", kept: "local", gone: "local"}

    report = sweep_orphans(root, keep=lambda name: name == kept)
    assert report.removed == {"half-started": "local", gone: "local"}
    assert sorted(p.name for p in root.iterdir()) == [".hidden", "logs", kept]
    assert (root / "logs" / "agent.log").read_text() == "keep me"
    LocalRuntime(kept, root).stop()


def test_missing_root_is_empty(tmp_path: Path) -> None:
    assert present_runtimes(tmp_path / "nothing") == {}
    assert sweep_orphans(tmp_path / "nothing").removed == {}


def test_a_local_kill_group_left_without_its_directory_is_swept(tmp_path: Path) -> None:
    """A worker killed -9 whose directory went away: its kill group still names the runtime,
    and the sweep kills what is in it and removes it."""
    if kill_group.base_dir() is None:
        pytest.skip("no writable cgroup v2 hierarchy on this node")
    root = tmp_path / "runtimes"
    orphan = runtime_id("rt-orphan-group")
    rt = LocalRuntime(orphan, root)
    rt.start()
    assert rt.exec("(env -i sleep 60 </dev/null >/dev/null 2>&1 &); true").ok
    group = kill_group.group_for(orphan, root)
    assert group is not None and kill_group.members(group)
    shutil.rmtree(rt.path)
    assert present_runtimes(root) == {orphan: "local"}
    assert sweep_orphans(root).removed == {orphan: "local"}
    assert not group.exists()


def test_saved_diffs_of_runtimes_no_rollout_uses_are_swept(tmp_path: Path) -> None:
    """The grader's saved diff outlives a worker killed between saving it and releasing the
    runtime; the sweep removes it (and a half-written one) but keeps a live rollout's."""
    from polar_mq.swe import grading
    from polar_mq.swe.grading import AgentDiff

    root = tmp_path / "runtimes"
    live, dead = runtime_id("rt-live") + "-eval", runtime_id("rt-dead") + "-eval"
    for key in (live, dead):
        grading.save(root, key, AgentDiff("0" * 40, b"diff --git a/x b/x\n", ["x"]))
    (root / grading.GRADING_DIR / ".tmp-abandoned").write_bytes(b"half")

    report = sweep_orphans(root, keep=lambda name: name == live)

    assert sorted(p.name for p in (root / grading.GRADING_DIR).iterdir()) == [
        f"{live}.files",
        f"{live}.patch",
    ]
    assert set(report.removed) == {f"{dead}.files", f"{dead}.patch", ".tmp-abandoned"}
    assert grading.load_saved(root, live, "0" * 40) is not None
