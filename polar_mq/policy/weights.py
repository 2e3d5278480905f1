"""New weights published with a policy version: a LoRA adapter directory on the engines' disk.

The adapter is named after the version it was published with (`polar-v7`), so every proxy
process and instance derives the same vLLM `lora_name` without talking to the others, and a
repeated publish of the same version loads the same name (vLLM's "already loaded" is success).

The API may not share the engines' disk, so the path is checked for its shape only (absolute, no
control characters); when it does exist where the API runs it must be a directory holding
`adapter_config.json` (peft's layout). A path the engines cannot read is reported by the proxies
as a failed load, and the backends that failed are taken out of rotation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PATH_MAX = 4096
NAME_PREFIX = "polar-v"
CONFIG_FILE = "adapter_config.json"


@dataclass(frozen=True, slots=True)
class Adapter:
    name: str
    """The engines' `lora_name`: what the proxy writes into each call's `model`."""
    path: str
    """The adapter directory, as the engines read it."""


def adapter_for(version: int, path: str) -> Adapter:
    return Adapter(f"{NAME_PREFIX}{version}", path)


def path_problem(path: str) -> str | None:
    """Why `path` cannot be an adapter directory, or None."""
    if not path or len(path) > PATH_MAX:
        return f"adapter_path must have 1..{PATH_MAX} characters"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "adapter_path must not contain control characters"
    if not os.path.isabs(path):
        return "adapter_path must be an absolute path (a directory the engines can read)"
    if os.path.exists(path):  # visible here too: check it is a peft adapter directory
        if not os.path.isdir(path):
            return f"adapter_path {path!r} is not a directory"
        if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
            return f"adapter_path {path!r} holds no {CONFIG_FILE} (save it with peft)"
    return None
