"""Builders by name, import path (`package.module:attr`) or entry point (`polar_mq.builders`).

Import paths are resolved only from the allow-list (`polar_mq.infra.imports`), checked before
anything is imported.
"""

from __future__ import annotations

import importlib
from typing import cast

from polar_mq.infra.imports import BUILDER_GROUP, check_import_path, entry_point_path
from polar_mq.trajectories.base import Builder
from polar_mq.trajectories.per_call import PerCallBuilder
from polar_mq.trajectories.prefix_merge import PrefixMergeBuilder

BUILTIN: dict[str, type] = {"per_call": PerCallBuilder, "prefix_merge": PrefixMergeBuilder}


def get_builder(name: str) -> Builder:
    if name in BUILTIN:
        return cast(Builder, BUILTIN[name]())
    name = entry_point_path(name, BUILDER_GROUP) or name
    if ":" in name:
        check_import_path(name, BUILDER_GROUP, "builder")
        module_name, _, attr = name.partition(":")
        try:
            target = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import builder {name!r}: {exc}") from exc
        builder = target() if isinstance(target, type) else target
        if not callable(getattr(builder, "build", None)):
            raise ValueError(f"{name!r} is not a builder: it has no build(calls) method")
        return cast(Builder, builder)
    raise ValueError(f"unknown builder {name!r}; known: {', '.join(BUILTIN)} or 'module:attr'")


def validate_builder_name(name: str) -> None:
    get_builder(name)
