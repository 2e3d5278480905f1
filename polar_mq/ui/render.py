"""The dashboard's Jinja2 environment: autoescaping always on, a few formatting filters.

Trajectory text, agent logs, task instructions, error messages and job metadata are all
agent- or user-controlled, so every template is autoescaped (whatever its file name) and no
template marks anything `|safe`.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.templating import Jinja2Templates

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"


def fmt_num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}" if abs(value) < 1e6 else f"{value:.3e}"
    return str(value)


def fmt_time(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s" if value < 120 else f"{value / 60:.1f} min"


def fmt_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=fmt_num, time=fmt_time, secs=fmt_s, json=fmt_json)
    return env


def templates() -> Jinja2Templates:
    return Jinja2Templates(env=environment())
