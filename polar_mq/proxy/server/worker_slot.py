"""Which of a `--workers N` proxy's processes this one is (`WorkerSlot`).

The supervisor hands a slot to each child it starts (`supervisor`), and the child's server, app,
call writer and admin fan-out read it (`server`, `app`, `writer`, `fanout`). It lives apart from
the supervisor, which imports the server to start its children, so that none of those modules
imports the supervisor back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polar_mq.config import Settings
from polar_mq.proxy.store.spill_layout import worker_spill_dir


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """Which of the proxy's processes this is, and where its siblings listen for admin calls."""

    index: int
    count: int
    run_dir: Path

    def control_socket(self, index: int) -> Path:
        return self.run_dir / f"worker-{index}.sock"

    @property
    def journal(self) -> Path:
        """The admin changes made so far, replayed by a restarted child (`fanout`)."""
        return self.run_dir / "admin.jsonl"

    def settings_for(self, settings: Settings) -> Settings:
        """This child's settings: its own spill subdirectory."""
        spill = settings.proxy_spill_path
        if spill is None:
            return settings
        return settings.model_copy(update={"proxy_spill_dir": worker_spill_dir(spill, self.index)})
