"""`PresetHarness`: a job's preset harness spec (`type: <preset>`, `version`, `options`, ...) as a
`Harness`.

The spec's shape is typed and checked by `HarnessSpec`; what needs the preset is validated here,
when built (so a bad spec is a 4xx at submission): the version string, the preset's options, the
user's env (the proxy variables stay reserved) and extra auxiliary-call rules. At run time it
points PATH at the node's install of that version and HOME inside the workspace.
"""

from __future__ import annotations

import os
import re
import shlex

from pydantic import ValidationError

from polar_mq.harnesses.auxiliary import parse_rules
from polar_mq.harnesses.base import AgentContext, Harness
from polar_mq.harnesses.env import check_user_env
from polar_mq.harnesses.presets.base import Install, Preset, PresetRun
from polar_mq.harnesses.presets.install import install_dir
from polar_mq.spec.model import HarnessSpec

_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")


class PresetHarness(Harness):
    """One preset at one version with one set of options."""

    def __init__(self, preset: Preset, spec: HarnessSpec) -> None:
        version = spec.version or preset.package.default_version
        if not _VERSION.fullmatch(version):
            raise ValueError(f"harness 'version' must be a version string, got {version!r}")
        try:
            self.options = preset.options_model.model_validate(spec.options or {})
        except ValidationError as exc:
            raise ValueError(f"bad {preset.name!r} options: {_first_error(exc)}") from exc
        preset.check_options(self.options)
        self.preset = preset
        self.version = version
        self.auto_install = spec.auto_install is True
        self.user_env = check_user_env(spec.env)
        self.answer = preset.answer
        self.artifacts = preset.artifacts
        try:
            extra = parse_rules(spec.auxiliary_calls)
        except ValidationError as exc:
            raise ValueError(f"bad 'auxiliary_calls': {_first_error(exc)}") from exc
        self.auxiliary_rules = (*preset.auxiliary, *extra)

    def install(self, ctx: AgentContext) -> Install:
        if ctx.harness_root is None:
            raise RuntimeError("the agent context has no harness_root")
        directory = install_dir(ctx.harness_root, self.preset.name, self.version)
        return Install.at(directory, self.preset.package.ecosystem)

    def run(self, ctx: AgentContext) -> PresetRun:
        return PresetRun(ctx, self.install(ctx), self.options, self.version)

    def command(self, ctx: AgentContext) -> str:
        run = self.run(ctx)
        return f"mkdir -p {shlex.quote(run.home)} && exec {self.preset.command(run)}"

    def files(self, ctx: AgentContext) -> dict[str, str]:
        return self.preset.files(self.run(ctx))

    def env(self, ctx: AgentContext) -> dict[str, str]:
        """User env, HOME and PATH, the preset's own variables, then the proxy wiring (wins)."""
        run = self.run(ctx)
        base = {
            "HOME": run.home,
            "PATH": f"{run.install.bin_dir}:{os.environ.get('PATH', os.defpath)}",
        }
        return {**self.user_env, **base, **self.preset.env(run), **super().env(ctx)}

    def __repr__(self) -> str:
        return f"PresetHarness({self.preset.name}@{self.version})"


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))
