"""Weight sync from the trainer's side: the REST API, the Python client and the CLI publish an
adapter with a version; the API drives a real proxy (on a socket) through pause, drain, load and
resume, and refuses an adapter path of the wrong shape with a clear 422."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from backends_support import ADMIN_TOKEN, CHAT, QUESTION, Stack, auth, proxy_stack
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from polar_mq.cli import app as cli_app
from polar_mq.client import Client
from polar_mq.config import Settings
from polar_mq.testing.fake_vllm import FakeVllm
from polar_mq.testing.servers import serve_in_thread
from polar_mq.ui.app import create_app


def adapter_dir(tmp_path: Path, name: str) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 4, "peft_type": "LORA"}')
    return str(folder)


@contextmanager
def api_and_proxy(pg_url: str, factory: sessionmaker[Session]) -> Iterator[tuple[str, Stack]]:
    """The API (its proxy list: one proxy in front of one fake engine) on a socket."""
    with proxy_stack(n_fakes=1) as stack:
        settings = Settings.model_validate(
            {
                "database_url": pg_url,
                "broker_url": "redis://127.0.0.1:6379/0",
                "proxy_admin_urls": [stack.url],
                "proxy_admin_token": ADMIN_TOKEN,
            }
        )
        app = create_app(settings, session_factory=factory, publisher=lambda messages: None)
        with serve_in_thread(app) as url:
            yield url, stack


def test_rest_client_and_cli_publish_an_adapter_that_serves_the_next_calls(
    pg_url: str, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with api_and_proxy(pg_url, db_session_factory) as (url, stack), Client(url, timeout=30) as c:
        (fake_app,) = stack.fakes.values()
        fake: FakeVllm = fake_app.state.fake
        for bad, why in (
            ("relative/dir", "absolute path"),
            (str(tmp_path), "adapter_config.json"),
            ("/x\n", "control characters"),
        ):
            refused = httpx.post(f"{url}/v1/policy", json={"version": 1, "adapter_path": bad})
            assert refused.status_code == 422 and why in refused.text, refused.text
        assert c.policy()["version"] == 0 and fake.adapters == {}

        one = adapter_dir(tmp_path, "one")
        answer = c.set_policy(1, adapter_path=one)
        assert answer["adapter"] == {"name": "polar-v1", "path": one}
        assert answer["adapter_loaded"] is True and answer["paused"] is False
        assert c.policy()["adapter"] == {"name": "polar-v1", "path": one}
        assert c.set_policy(1, adapter_path=one)["adapter_loaded"] is True  # a retry: a no-op
        other = httpx.post(
            f"{url}/v1/policy", json={"version": 1, "adapter_path": adapter_dir(tmp_path, "x")}
        )  # new weights under the same version: the engines would keep the old ones
        assert other.status_code == 409 and "as a new version" in other.text, other.text
        body = {"model": "gpt-4o", "messages": QUESTION}
        served = stack.client.post(f"{stack.url}{CHAT}", json=body, headers=auth(uuid.uuid4()))
        assert served.status_code == 200, served.text
        assert fake.stats.models["polar-v1"] == 1

        two = adapter_dir(tmp_path, "two")
        run = CliRunner().invoke(cli_app, ["policy", "2", "--adapter", two, "--url", url])
        assert run.exit_code == 0, run.output
        printed = json.loads(run.output)
        assert (printed["version"], printed["adapter_loaded"]) == (2, True)
        assert list(fake.adapters) == ["polar-v2"]  # v1: no call could use it any more
        run = CliRunner().invoke(cli_app, ["policy", "--adapter", two, "--url", url])
        assert run.exit_code != 0 and "needs the version" in run.output
