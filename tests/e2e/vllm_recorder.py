"""A recording relay between the proxy and a real inference server, for "ids equal what vLLM sent".

The proxy stores a streamed call's token ids, not the engine's raw stream, so a test that wants to
compare them with what the engine really returned needs its own copy of the engine's answers:
`Recorder` is a pass-through HTTP relay (point the stack's `upstream_url` at `recorder.url`) that
forwards every request unchanged and keeps each exchange's request body and raw response bytes.
`engine_ids` reads vLLM's prompt and completion ids back out of a recorded answer (a JSON body or
an SSE stream), independently of the proxy's own parsing.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import httpx

HOP_BY_HOP = {"connection", "content-length", "transfer-encoding", "content-encoding", "keep-alive"}


@dataclass
class Exchange:
    method: str
    path: str
    request: bytes
    status: int
    response: bytes

    def request_json(self) -> Any:
        return json.loads(self.request) if self.request else None


class Recorder:
    """`with Recorder(upstream) as rec:` a relay on 127.0.0.1 recording into `rec.exchanges`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def _record(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        recorder = self

        class Relay(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the response ends when the connection closes

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                headers.pop("Host", None)
                received = bytearray()
                url = recorder.upstream + self.path
                with recorder._client.stream(self.command, url, content=body, headers=headers) as r:
                    self.send_response(r.status_code)
                    for key, value in r.headers.items():
                        if key.lower() not in HOP_BY_HOP:
                            self.send_header(key, value)
                    self.end_headers()
                    for chunk in r.iter_bytes():
                        received += chunk
                        self.wfile.write(chunk)
                        self.wfile.flush()
                recorder._record(
                    Exchange(self.command, self.path, body, r.status_code, bytes(received))
                )

            do_GET = do_POST = do_HEAD = _relay

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Relay


def engine_ids(exchange: Exchange) -> tuple[list[int] | None, list[int]]:
    """vLLM's prompt ids and choice-0 completion ids from a recorded chat answer (JSON or SSE)."""
    text = exchange.response.decode()
    if not text.lstrip().startswith("data:"):
        data = json.loads(text)
        return data.get("prompt_token_ids"), list(data["choices"][0].get("token_ids") or [])
    prompt: list[int] | None = None
    completion: list[int] = []
    for line in text.splitlines():
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        chunk = json.loads(line[5:])
        if prompt is None and chunk.get("prompt_token_ids") is not None:
            prompt = list(chunk["prompt_token_ids"])
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) == 0:
                completion += choice.get("token_ids") or []
    return prompt, completion
