"""ExecRequest: one checked value per command, built by `Runtime.exec` and handed to each kind."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime_backends import KINDS, Backend, backend_for

from polar_mq.runtimes.base import ExecRequest, ExecResult, Runtime
from polar_mq.runtimes.bwrap import BwrapRuntime
from polar_mq.runtimes.docker import DockerRuntime
from polar_mq.runtimes.local import LocalRuntime

BAD = [0, -1, -0.5]


@pytest.mark.parametrize(
    ("field", "value"), itertools.product(["timeout", "inactivity_timeout"], BAD)
)
def test_a_request_refuses_non_positive_timeouts(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{field} must be positive"):
        ExecRequest("true", **{field: value})  # type: ignore[arg-type]


def test_a_request_is_a_frozen_copy_of_what_was_asked() -> None:
    command = ["echo", "hi"]
    env = {"A": "1"}
    request = ExecRequest(command, env=env, timeout=5)  # type: ignore[arg-type]
    command.append("changed")
    env["B"] = "2"
    assert request.command == ("echo", "hi") and request.argv == ["echo", "hi"]
    assert dict(request.env) == {"A": "1"}
    with pytest.raises(TypeError):
        request.env["C"] = "3"  # type: ignore[index]
    with pytest.raises(AttributeError):
        request.timeout = 1  # type: ignore[misc]
    assert ExecRequest("echo $X").argv == ["/bin/sh", "-c", "echo $X"]


class _Recorder(Runtime):
    """A runtime that only records what reaches its hook (the base class's part under test)."""

    kind = "recorder"

    def __init__(self) -> None:
        super().__init__("recorder")
        self.requests: list[ExecRequest] = []

    @property
    def workdir(self) -> Path:
        return Path("/nonexistent")

    def start(self) -> None:
        return None

    def _run(self, request: ExecRequest) -> ExecResult:
        self.requests.append(request)
        return ExecResult(0, "", "", False, False, 0.0)

    def upload(self, data: bytes, dest: str) -> None:
        raise NotImplementedError

    def download(self, path: str) -> bytes:
        raise NotImplementedError

    def reset(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def alive_processes(self) -> list[int]:
        return []


def test_exec_builds_one_request_and_refuses_bad_timeouts_before_the_hook() -> None:
    rt = _Recorder()
    with pytest.raises(ValueError, match="inactivity_timeout must be positive"):
        rt.exec("true", timeout=1, inactivity_timeout=0)
    assert rt.requests == []

    def activity() -> float:
        return 0.0

    log = Path("/tmp/never-written")
    rt.exec(["prog", "arg"], env={"K": "v"}, cwd="sub", timeout=3, activity=activity)
    rt.exec("echo", inactivity_timeout=2, stdout_path=log)
    first, second = rt.requests
    assert first == ExecRequest(
        ("prog", "arg"), env={"K": "v"}, cwd="sub", timeout=3, activity=activity
    )
    assert second == ExecRequest("echo", inactivity_timeout=2, stdout_path=log)


def test_the_kinds_are_siblings() -> None:
    kinds = (LocalRuntime, BwrapRuntime, DockerRuntime)
    for one, other in itertools.permutations(kinds, 2):
        assert not issubclass(one, other), (one, other)
    assert all(Runtime in kind.__bases__ for kind in kinds)


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with backend_for(request.param, tmp_path / "runtimes") as made:
        yield made


def test_the_request_reaches_each_runtime(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = backend.make("rt-request")
    rt.start()
    rt.upload(b"", "sub/.keep")
    seen: list[ExecRequest] = []
    hook = rt._run

    def spy(request: ExecRequest) -> ExecResult:
        seen.append(request)
        return hook(request)

    monkeypatch.setattr(rt, "_run", spy)
    with pytest.raises(ValueError, match="timeout must be positive"):
        rt.exec("touch never", timeout=-1)
    assert seen == [] and not (rt.workdir / "never").exists()

    log = tmp_path / "out.log"
    result = rt.exec(
        'echo "$WHO in $(pwd)"; echo err >&2',
        env={"WHO": "request"},
        cwd="sub",
        timeout=60,
        inactivity_timeout=30,
        stdout_path=log,
    )
    assert result.ok, result
    assert result.stdout_tail == f"request in {rt.workdir / 'sub'}\n"
    assert sorted(log.read_text().split("\n")) == sorted(
        ["", "err", f"request in {rt.workdir / 'sub'}"]
    )
    [request] = seen
    assert (request.cwd, dict(request.env), request.timeout) == ("sub", {"WHO": "request"}, 60)
