"""aider (skeleton)."""

from __future__ import annotations

from typing import ClassVar

from polar_mq.harnesses.presets.base import Ecosystem, Package, Preset, PresetRun


class Aider(Preset):
    name: ClassVar[str] = "aider"
    api_family: ClassVar[str] = "chat"
    package: ClassVar[Package] = Package(Ecosystem.PYPI, "aider-chat", "0.86.2")

    def argv(self, run: PresetRun) -> list[str]:
        return [run.install.program("aider")]


PRESET = Aider()
