"""Per-engine token capture: `vllm`, `sglang` (exact ids) and `generic` (re-tokenized).

Each engine is a module satisfying `base.Engine` (`rewrite_request`, `extract_response`,
`strip`/`visible`, `stream_capture`); the forwarding code in `polar_mq.proxy.capture` is
engine-agnostic and gets the module from `get_engine(settings.upstream_engine)`.
"""

from __future__ import annotations

from polar_mq.proxy.engines import generic, sglang, vllm
from polar_mq.proxy.engines.base import Engine

_ENGINES: dict[str, Engine] = {"vllm": vllm, "sglang": sglang, "generic": generic}
SUPPORTED_ENGINES = tuple(_ENGINES)


def check_engine(name: str) -> None:
    """Refuse at boot an engine whose token capture does not exist (never capture nothing)."""
    if name not in _ENGINES:
        raise ValueError(
            f"upstream_engine {name!r} is not supported (supported: {SUPPORTED_ENGINES})"
        )


def get_engine(name: str) -> Engine:
    """The engine module named `name` (see `check_engine` for the error on an unknown name)."""
    check_engine(name)
    return _ENGINES[name]
