"""Shared helpers for the API-family tests: golden comparisons, SSE parsing, rows as builder
input, the fake engine as a process and the proxy over sockets.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from proxy_support import FRESH_HTTP, proxy_settings

from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.testing.servers import free_port, serve_in_thread
from polar_mq.trajectories.base import BuildResult, CapturedCall
from polar_mq.trajectories.prefix_merge import PrefixMergeBuilder
from tests.trajectories.trajectory_support import assert_merge_invariants

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CALCULATOR_DESCRIPTION = "Evaluate an arithmetic expression."
"""The calculator tool the fake engine's scripted policy calls, described in each family's form."""


def calculator_parameters(**expression: Any) -> dict[str, Any]:
    """The calculator tool's JSON schema (`expression`: more keys for its one argument's schema)."""
    return {
        "type": "object",
        "properties": {"expression": {"type": "string", **expression}},
        "required": ["expression"],
    }


def golden(family: str, name: str) -> Any:
    text = (FIXTURES / family / name).read_text(encoding="utf-8")
    return json.loads(text) if name.endswith(".json") else text


def assert_same_shape(actual: Any, expected: Any, path: str = "$") -> None:
    """`actual` has every key of `expected` (recursively) with a value of the same JSON type.

    Keys starting with `_` in the golden file are notes, not fields. Lists are compared item by
    item for their common length (the golden shows one example of each element kind).
    """
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected an object, got {actual!r}"
        for key, value in expected.items():
            if key.startswith("_"):
                continue
            assert key in actual, f"{path}: missing field {key!r} (has {sorted(actual)})"
            assert_same_shape(actual[key], value, f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list), f"{path}: expected a list, got {actual!r}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=False)):
            assert_same_shape(a, e, f"{path}[{i}]")
    elif expected is None:
        pass  # null in the example: the field may hold a value in other answers
    elif isinstance(expected, bool):
        assert isinstance(actual, bool), f"{path}: expected a boolean, got {actual!r}"
    elif isinstance(expected, int | float):
        ok = isinstance(actual, int | float) and not isinstance(actual, bool)
        assert ok, f"{path}: expected a number, got {actual!r}"
    else:
        assert isinstance(actual, type(expected)), f"{path}: expected {type(expected).__name__}"


def assert_like(
    actual: Any, expected: Any, volatile: Collection[str] = frozenset(), path: str = "$"
) -> None:
    """`actual` is `expected` but for the `volatile` keys' values, which only keep their type.

    Same keys at every level, lists of the same length, same JSON types, equal values; a volatile
    key holding an object or a list is compared like any other.
    """
    assert type(actual) is type(expected), f"{path}: {actual!r} is not a {type(expected)}"
    if isinstance(expected, dict):
        keys = set(actual) ^ set(expected)
        assert not keys, f"{path}: keys differ {sorted(keys)} ({sorted(actual)})"
        for key, value in expected.items():
            if key in volatile and not isinstance(value, dict | list):
                assert type(actual[key]) is type(value), f"{path}.{key}: {actual[key]!r}"
            else:
                assert_like(actual[key], value, volatile, f"{path}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{path}: {len(actual)} items != {len(expected)}"
        for i, (got, want) in enumerate(zip(actual, expected, strict=True)):
            assert_like(got, want, volatile, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def parse_sse(body: str | bytes) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) of every event in a server-sent-event body.

    Every event is an optional `event: <name>` line and one `data: <json>` line (LF or CRLF
    framing, as Google or we send it) holding strict JSON (orjson's: no NaN, no lone surrogate);
    a named event's data has that name as its `type`.
    """
    text = body.decode() if isinstance(body, bytes) else body
    events: list[tuple[str | None, Any]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        *head, line = block.split("\n")
        assert len(head) <= 1 and line.startswith("data: "), f"not one event: {block!r}"
        assert not head or head[0].startswith("event: "), f"not one event: {block!r}"
        name = head[0].removeprefix("event: ") if head else None
        payload = line.removeprefix("data: ")
        data = payload if payload == "[DONE]" else orjson.loads(payload)
        if name is not None:
            assert isinstance(data, dict) and data.get("type") == name, f"{name}: {payload}"
        events.append((name, data))
    return events


def captured_calls(rows: list[dict[str, Any]]) -> list[CapturedCall]:
    """Logged rows as the build stage reads them (a family call: its engine's chat request)."""
    return [
        CapturedCall(
            seq=row["seq"],
            call_id=str(row["id"]),
            prompt_ids=row["prompt_ids"],
            completion_ids=row["completion_ids"],
            logprobs=row["logprobs"],
            finish_reason=row["finish_reason"],
            policy_version=row["policy_version"],
            status_code=row["status_code"],
            request=row["engine_request"] or row["request"],
            response=row["response"],
        )
        for row in sorted(rows, key=lambda r: r["seq"])
    ]


def assert_one_merged_sample(rows: list[dict[str, Any]]) -> BuildResult:
    """`prefix_merge` makes one sample of the rows: every call merged, each one's tokens trained."""
    ordered = sorted(rows, key=lambda r: r["seq"])
    calls = captured_calls(ordered)
    result = PrefixMergeBuilder().build(calls)
    assert_merge_invariants(calls, result)
    (sample,) = result.samples
    assert result.stats["merged"] == len(rows) - 1 and result.stats["broken"] == 0
    assert sample.meta["call_ids"] == [str(r["id"]) for r in ordered]
    last = ordered[-1]
    assert sample.prompt_ids + sample.response_ids == last["prompt_ids"] + last["completion_ids"]
    trained = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
    assert trained == [t for r in ordered for t in r["completion_ids"]]
    return result


def wait_until(
    check: Callable[[], bool], timeout_s: float = 5.0, what: Callable[[], str] | str = "timed out"
) -> None:
    """Polls `check` until it holds; fails with `what` (or what it returns) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.01)


@contextmanager
def fake_engine_process(ttft_ms: int = 2) -> Iterator[str]:
    """`python -m polar_mq.testing.fake_vllm` on a free port; yields its URL.

    Its stderr goes to a file (a pipe nobody reads could fill and stall it) and is the message
    if it exits early.
    """
    port = free_port()
    argv = [sys.executable, "-m", "polar_mq.testing.fake_vllm", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [*argv, "--ttft-ms", str(ttft_ms)], stdout=subprocess.DEVNULL, stderr=stderr
        )

        def healthy() -> bool:
            if proc.poll() is not None:
                stderr.seek(0)
                raise AssertionError(f"the fake engine exited: {stderr.read().decode()}")
            try:
                return FRESH_HTTP.get(f"{url}/health").status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_until(healthy, 20, "the fake engine did not start")
            yield url
        finally:
            proc.terminate()
            proc.wait(10)


@contextmanager
def proxy_served(engine_url: str) -> Iterator[tuple[str, MemoryCallSink]]:
    """The proxy under its own server in front of `engine_url`, logging to memory: (its URL, the
    sink)."""
    sink = MemoryCallSink()
    app = create_proxy_app(proxy_settings(upstream_url=engine_url), sink=sink)
    with serve_in_thread(app, server="lean") as url:
        yield url, sink


def _fake_engine() -> Iterator[str]:
    with fake_engine_process() as url:
        yield url


def _served(fake_engine: str) -> Iterator[tuple[str, MemoryCallSink]]:
    with proxy_served(fake_engine) as served:
        yield served


def socket_fixtures() -> tuple[Any, Any]:
    """A test module's `fake_engine` and `served` fixtures (assign them to those names).

    `fake_engine`: one fake engine process (its CLI) for the module, its URL; `served`: a fresh
    proxy under its own server in front of it for each test, (its URL, its sink).
    """
    fake_engine = pytest.fixture(_fake_engine, scope="module", name="fake_engine")
    served = pytest.fixture(_served, name="served")
    return fake_engine, served


def wait_for_rows(sink: Any, n: int, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The sink's rows once it holds at least `n`."""
    wait_until(lambda: len(sink.rows) >= n, timeout_s, lambda: f"{len(sink.rows)} of {n} logged")
    rows: list[dict[str, Any]] = sink.rows
    return rows


def rows_of(
    sink: Any, rollout_id: uuid.UUID, n: int, timeout_s: float = 5.0
) -> list[dict[str, Any]]:
    """The sink's rows of one rollout, once it holds at least `n` of them."""

    def mine() -> list[dict[str, Any]]:
        return [row for row in sink.rows if row["rollout_id"] == rollout_id]

    wait_until(lambda: len(mine()) >= n, timeout_s, lambda: f"{len(mine())} of {n} logged")
    return mine()
