"""`bench.proxy.families` keeps running: every family translates the bench's answer and stream."""

from __future__ import annotations

from bench.proxy import families


def test_translation_bench_measures_every_family() -> None:
    figures = families.measure(calls=20, repeats=1)
    assert set(figures) == {"json", "stream"}
    for mode in figures.values():
        assert set(mode) == {"chat", "messages", "responses", "gemini"}
        assert all(us > 0 for us in mode.values())
    lines = families.render(figures)
    assert lines[0].startswith("(e)") and "messages" in lines[1] and "gemini" in lines[2]
