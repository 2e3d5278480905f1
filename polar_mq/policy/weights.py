"""New weights published with a policy version: a LoRA adapter or a full checkpoint directory.

The weights are named after the version they were published with (`polar-v7` for a LoRA adapter,
`polar-ckpt-v7` for a full checkpoint), so every proxy process and instance derives the same
vLLM `lora_name` without talking to the others, and a repeated publish of the same version loads
the same name (vLLM's "already loaded" is success). The name also tells the kind, so the kind
needs no column of its own: `policy_state` keeps the name and the path.

A full checkpoint (a Hugging Face model directory: `config.json` and the weights) is for engines
that reload their weights from disk in place (`polar_mq.proxy.checkpoints`); the calls keep the
served model's name, since the engine serves the new weights under it.

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
CHECKPOINT_PREFIX = "polar-ckpt-v"
CONFIG_FILE = "adapter_config.json"
MODEL_CONFIG_FILE = "config.json"


@dataclass(frozen=True, slots=True)
class Adapter:
    name: str
    """The engines' `lora_name`: what the proxy writes into each call's `model`."""
    path: str
    """The adapter (or checkpoint) directory, as the engines read it."""

    @property
    def is_checkpoint(self) -> bool:
        """A full checkpoint the engines reload from disk, not a LoRA adapter."""
        return self.name.startswith(CHECKPOINT_PREFIX)


def adapter_for(version: int, path: str) -> Adapter:
    return Adapter(f"{NAME_PREFIX}{version}", path)


def checkpoint_for(version: int, path: str) -> Adapter:
    return Adapter(f"{CHECKPOINT_PREFIX}{version}", path)


def path_problem(path: str, field: str = "adapter_path") -> str | None:
    """Why `path` cannot be an adapter directory (`checkpoint_path`: a checkpoint's), or None."""
    if not path or len(path) > PATH_MAX:
        return f"{field} must have 1..{PATH_MAX} characters"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return f"{field} must not contain control characters"
    if not os.path.isabs(path):
        return f"{field} must be an absolute path (a directory the engines can read)"
    if os.path.exists(path):  # visible here too: check its layout
        if not os.path.isdir(path):
            return f"{field} {path!r} is not a directory"
        checkpoint = field == "checkpoint_path"
        wanted = MODEL_CONFIG_FILE if checkpoint else CONFIG_FILE
        if not os.path.isfile(os.path.join(path, wanted)):
            how = "a model's save_pretrained" if checkpoint else "peft"
            return f"{field} {path!r} holds no {wanted} (save it with {how})"
        if checkpoint and os.path.isfile(os.path.join(path, CONFIG_FILE)):
            return f"{field} {path!r} is a LoRA adapter (publish it as adapter_path)"
    return None
