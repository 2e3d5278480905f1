"""Finds the presets: every module of this package that defines `PRESET` is one.

Discovery instead of a hand-kept list, so adding a harness is adding one module.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from polar_mq.harnesses.presets.base import Preset


@cache
def presets() -> dict[str, Preset]:
    """Name -> preset, for every preset module in `polar_mq.harnesses.presets`."""
    package = importlib.import_module("polar_mq.harnesses.presets")
    found: dict[str, Preset] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        preset = getattr(module, "PRESET", None)
        if isinstance(preset, Preset):
            found[preset.name] = preset
    return dict(sorted(found.items()))


def get_preset(name: str) -> Preset | None:
    return presets().get(name)


def harness_trusted(harness_type: str) -> bool:
    """The `command` harness and the reference agent are the user's or our own code; a preset
    is third-party code and trusted only when it says so (its default network follows)."""
    preset = get_preset(harness_type)
    return preset is None or preset.trusted
