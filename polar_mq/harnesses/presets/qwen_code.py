from __future__ import annotations

from polar_mq.harnesses.presets.base import Ecosystem, Package, Preset, PresetRun


class QwenCodePreset(Preset):
    name = "qwen_code"
    api_family = "chat"
    package = Package(Ecosystem.NPM, "@qwen-code/qwen-code", "0.24.4")

    def argv(self, run: PresetRun) -> list[str]:
        return [run.install.program("qwen")]


PRESET = QwenCodePreset()
