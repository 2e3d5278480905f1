"""Gemini CLI (skeleton)."""

from __future__ import annotations

from polar_mq.harnesses.presets.base import Ecosystem, Package, Preset, PresetRun


class GeminiCli(Preset):
    name = "gemini_cli"
    api_family = "gemini"
    package = Package(Ecosystem.NPM, "@google/gemini-cli", "0.61.0")

    def argv(self, run: PresetRun) -> list[str]:
        return [run.install.program("gemini"), "-p", run.ctx.instruction]


PRESET = GeminiCli()
