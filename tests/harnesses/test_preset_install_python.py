"""A PyPI preset that needs a newer Python than the worker's gets its venv from that interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from polar_mq.harnesses.presets import install as install_module
from polar_mq.harnesses.presets.base import Ecosystem, Package
from polar_mq.harnesses.presets.install import (
    InstallError,
    _pypi_steps,
    find_python,
    python_candidates,
)

OWN = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _fake_pyenv(root: Path, version: str, real: str) -> Path:
    """A pyenv-style build directory whose `pythonX.Y` is a link to a real interpreter."""
    bin_dir = root / "versions" / f"{version}.9" / "bin"
    bin_dir.mkdir(parents=True)
    program = bin_dir / f"python{version}"
    program.symlink_to(real)
    return program


def test_pyenv_build_is_a_candidate_and_a_working_one_is_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = _fake_pyenv(tmp_path, OWN, sys.executable)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setattr(install_module.shutil, "which", lambda _name: None)
    candidates = python_candidates(OWN)
    assert candidates[-1] == str(program)  # after PATH and the usual prefixes
    found = find_python(OWN, "some-harness")
    assert found in candidates


def test_an_interpreter_of_another_version_is_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_pyenv(tmp_path, "3.99", sys.executable)  # claims 3.99, runs this Python
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setattr(install_module.shutil, "which", lambda _name: None)
    with pytest.raises(InstallError, match=r"openhands-sdk needs Python 3\.99.*tried: .*3\.99"):
        find_python("3.99", "openhands-sdk")


def test_venv_step_uses_the_package_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install_module, "find_python", lambda version, _pkg: f"/opt/py{version}")
    package = Package(Ecosystem.PYPI, "h", "1.0", also=("x==2",), python="3.12")
    steps = _pypi_steps(tmp_path, package, "1.0")
    assert steps[0] == ["/opt/py3.12", "-m", "venv", str(tmp_path / "venv")]
    assert steps[1][-2:] == ["h==1.0", "x==2"]
    plain = _pypi_steps(tmp_path, Package(Ecosystem.PYPI, "h", "1.0"), "1.0")
    assert plain[0][0] == install_module._base_python()
