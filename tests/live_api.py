"""The API served over a real socket (uvicorn in a thread), for client-side tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import uvicorn
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.infra.ports import free_port
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.ui.app import create_app


@contextmanager
def serve_api(
    pg_url: str, factory: sessionmaker[Session], published: list[StageMessage]
) -> Iterator[str]:
    """Base URL of the API on the test database; stage messages are recorded in `published`."""
    settings = Settings.model_validate(
        {"database_url": pg_url, "broker_url": "redis://127.0.0.1:6379/0", "max_body_bytes": 65536}
    )

    def publish(messages: Sequence[StageMessage]) -> None:
        published.extend(messages)

    app = create_app(settings, session_factory=factory, publisher=publish)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
