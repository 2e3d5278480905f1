"""Per-engine token capture. vLLM is implemented; SGLang and the generic (tokenize) fallback follow.

An engine module provides `rewrite_request`, `extract_response`, `strip`/`visible` and a
`StreamCapture`; the forwarding code in `polar_mq.proxy.capture` is engine-agnostic.
"""

from __future__ import annotations

SUPPORTED_ENGINES = ("vllm",)


def check_engine(name: str) -> None:
    """Refuse at boot an engine whose token capture does not exist yet (never capture nothing)."""
    if name not in SUPPORTED_ENGINES:
        raise ValueError(
            f"upstream_engine {name!r} is not supported yet (supported: {SUPPORTED_ENGINES})"
        )
