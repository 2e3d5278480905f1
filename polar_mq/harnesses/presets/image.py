"""The build context of a docker image with presets baked in (scripts/build_preset_image.sh).

Nothing is fetched inside the image build (`--network none`): on the host, npm presets are
installed with the node installer into `harnesses/<name>/<version>` (node_modules are plain files,
native parts built for linux-x64 like the host) and PyPI presets' wheels are downloaded into
`wheels/<name>`; `install_pypi.sh` then builds each venv inside the image with `pip --no-index`,
against the image's own Python. The image ends with the same layout as a node's cache, rooted at
`setup.IMAGE_HARNESS_ROOT`, so `prepare` finds `installed.json` there.

    python -m polar_mq.harnesses.presets.image CONTEXT_DIR claude_code mini_swe_agent@2.4.6
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import orjson

from polar_mq.harnesses.presets.base import Ecosystem
from polar_mq.harnesses.presets.install import MARKER, InstallError, install
from polar_mq.harnesses.presets.registry import get_preset, presets
from polar_mq.harnesses.presets.setup import IMAGE_HARNESS_ROOT


def _pypi_lines(name: str, spec: list[str], version: str) -> list[str]:
    target = IMAGE_HARNESS_ROOT / name / version
    marker = orjson.dumps({"name": name, "version": version, "image": True}).decode()
    pip = f"{target}/venv/bin/pip install -q --no-index --no-cache-dir --disable-pip-version-check"
    return [
        f"python3 -m venv {target}/venv",
        f"{pip} --find-links /tmp/wheels/{name} {' '.join(map(shlex.quote, spec))}",
        f"echo {shlex.quote(marker)} > {target}/{MARKER}",
    ]


def build_context(context: Path, labels: list[str]) -> bool:
    """Fill `context` for `labels` (NAME[@VERSION]); True when a node binary is needed."""
    script = ["set -eu"]
    needs_node = False
    (context / "harnesses").mkdir(parents=True, exist_ok=True)
    (context / "wheels").mkdir(exist_ok=True)
    for label in labels:
        name, _, version = label.partition("@")
        preset = get_preset(name)
        if preset is None:
            raise SystemExit(f"unknown preset {name!r}; known: {', '.join(presets())}")
        package = preset.package
        version = version or package.default_version
        if package.ecosystem is Ecosystem.NPM:
            install(context / "harnesses", name, package, version)
            needs_node = True
            continue
        spec = [f"{package.name}{package.extras}=={version}", *package.also]
        download = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                    "--only-binary=:all:", "-d", str(context / "wheels" / name), *spec]  # fmt: skip
        done = subprocess.run(download, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise InstallError(f"pip download {' '.join(spec)}: {done.stderr[-2000:]}")
        script += _pypi_lines(name, spec, version)
    (context / "install_pypi.sh").write_text("\n".join(script) + "\n")
    return needs_node


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        raise SystemExit("usage: python -m polar_mq.harnesses.presets.image CONTEXT NAME[@VER]...")
    print("node" if build_context(Path(args[0]), args[1:]) else "no-node")


if __name__ == "__main__":
    main()
