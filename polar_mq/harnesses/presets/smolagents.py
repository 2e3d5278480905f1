"""smolagents (skeleton)."""

from __future__ import annotations

from typing import ClassVar

from polar_mq.harnesses.presets.base import Ecosystem, Package, Preset, PresetRun


class Smolagents(Preset):
    name: ClassVar[str] = "smolagents"
    api_family: ClassVar[str] = "chat"
    package: ClassVar[Package] = Package(Ecosystem.PYPI, "smolagents", "1.26.0", "[openai]")

    def argv(self, run: PresetRun) -> list[str]:
        return [run.install.python]


PRESET = Smolagents()
