from __future__ import annotations

from polar_mq.harnesses.presets.base import Ecosystem, Package, Preset, PresetRun


class OpencodePreset(Preset):
    name = "opencode"
    api_family = "chat"
    package = Package(Ecosystem.NPM, "opencode-ai", "1.18.33", also=("@ai-sdk/openai-compatible@3.0.92",))

    def argv(self, run: PresetRun) -> list[str]:
        return [run.install.program("opencode")]


PRESET = OpencodePreset()
