"""Load from `wrk` (C, one thread): 64 connections cost the 2-core machine little CPU, so the
proxy and the fake upstream, not the load generator, decide the latency we measure.

A Lua script sets the POST body and headers and prints the run's latency percentiles as JSON.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_SCRIPT = """
wrk.method = "POST"
wrk.body = [==[{body}]==]
wrk.headers["Content-Type"] = "application/json"
{headers}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\n{{"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"requests":%d,"duration_us":%d,' ..
    '"errors":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}}\\n',
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean,
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


ERROR_KINDS = ("connect", "read", "write", "status", "timeout")


@dataclass
class LoadResult:
    """One wrk run: latency percentiles (ms), completed requests, their rate and failures."""

    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    requests: int
    rate: float
    errors: int
    error_kinds: dict[str, int]
    """wrk's own split: `connect`, `read` (the server closed a keep-alive connection), `write`,
    `status` (answers outside 2xx/3xx) and `timeout`."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def require_wrk() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("bench.proxy needs wrk on PATH (Debian/Ubuntu: apt-get install wrk)")
    return path


def run_wrk(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    connections: int,
    duration_s: float,
) -> LoadResult:
    """POST `body` to `url` from `connections` keep-alive connections for `duration_s`."""
    header_lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
    script = _SCRIPT.format(body=json.dumps(body), headers=header_lines)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "post.lua"
        path.write_text(script)
        argv = [
            require_wrk(), "-t1", f"-c{connections}", f"-d{duration_s:g}s", "--timeout", "30s",
            "-s", str(path), url,
        ]  # fmt: skip
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    data = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return LoadResult(
        p50_ms=data["p50_us"] / 1000,
        p90_ms=data["p90_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        mean_ms=data["mean_us"] / 1000,
        requests=data["requests"],
        rate=data["requests"] / (data["duration_us"] / 1e6),
        errors=data["errors"],
        error_kinds={kind: data[kind] for kind in ERROR_KINDS},
    )
