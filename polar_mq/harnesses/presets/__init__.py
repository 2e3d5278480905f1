"""Presets: real third-party agent harnesses, one module each, found by `registry.presets()`.

Each preset module defines `PRESET`, an instance of a `base.Preset` subclass. The framework
modules here (base, install, harness, registry, setup) define none.
"""
