"""The runtime janitor on what a runtime root holds besides runtimes, and on its keep list."""

from __future__ import annotations

from pathlib import Path

from polar_mq.runtimes import LocalRuntime
from polar_mq.runtimes.janitor import present_runtimes, sweep_orphans


def test_only_runtime_directories_count(tmp_path: Path) -> None:
    root = tmp_path / "runtimes"
    (root / "logs").mkdir(parents=True)  # run_agent's log directory lives under the root
    (root / "logs" / "agent.log").write_text("keep me")
    (root / ".hidden").mkdir()
    (root / "half-started" / "workspace").mkdir(parents=True)  # killed before its record
    LocalRuntime("rt-kept", root).start()
    LocalRuntime("rt-gone", root).start()

    found = present_runtimes(root)
    assert found == {"half-started": "local", "rt-kept": "local", "rt-gone": "local"}

    report = sweep_orphans(root, keep=lambda runtime_id: runtime_id == "rt-kept")
    assert report.removed == {"half-started": "local", "rt-gone": "local"}
    assert sorted(p.name for p in root.iterdir()) == [".hidden", "logs", "rt-kept"]
    assert (root / "logs" / "agent.log").read_text() == "keep me"
    LocalRuntime("rt-kept", root).stop()


def test_missing_root_is_empty(tmp_path: Path) -> None:
    assert present_runtimes(tmp_path / "nothing") == {}
    assert sweep_orphans(tmp_path / "nothing").removed == {}
