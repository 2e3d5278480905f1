"""The processes under test: the fake engine, polar_mq's proxy and (when installed) LiteLLM's.

polar_mq's side runs exactly as in production (`polar-mq proxy` through `polar_mq.stack.devstack`,
logging every call to PostgreSQL through its writer). LiteLLM runs from its own virtualenv, never
the project's (`LITELLM_VENV`, default ~/.cache/polar_mq/litellm-venv; create it with
`python3 -m venv DIR && DIR/bin/pip install 'litellm[proxy]'`), with one worker, no database and
no callbacks: its lightest configuration.
"""

from __future__ import annotations

import os
from pathlib import Path

from polar_mq.config import Settings
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.stack.devstack import LocalStack

MODEL = "fake-model"
LITELLM_KEY = "sk-bench-proxy"
DEFAULT_LITELLM_VENV = Path.home() / ".cache" / "polar_mq" / "litellm-venv"

_LITELLM_CONFIG = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream}/v1
      api_key: none
litellm_settings:
  telemetry: false
  drop_params: true
general_settings:
  master_key: {key}
"""


def litellm_bin() -> Path | None:
    venv = Path(os.environ.get("LITELLM_VENV", DEFAULT_LITELLM_VENV))
    path = venv / "bin" / "litellm"
    return path if path.exists() else None


def start_upstream(stack: LocalStack, ttft_ms: float, token_delay_ms: float) -> str:
    port = free_port()
    stack.fake_upstream(port, ttft_ms=ttft_ms, token_delay_ms=token_delay_ms)
    return f"http://127.0.0.1:{port}"


def polar_settings(database_url: str, upstream: str, spill_dir: Path, secret: str) -> Settings:
    return Settings(
        database_url=database_url,
        upstream_url=upstream,
        served_model=MODEL,
        proxy_port=free_port(),
        secret_key=secret,
        proxy_spill_dir=spill_dir,
    )


def start_litellm(stack: LocalStack, upstream: str, tmp: Path) -> tuple[ManagedProcess, str]:
    binary = litellm_bin()
    assert binary is not None
    port = free_port()
    config = tmp / "litellm.yaml"
    config.write_text(_LITELLM_CONFIG.format(model=MODEL, upstream=upstream, key=LITELLM_KEY))
    env = {**os.environ, "LITELLM_TELEMETRY": "False", "LITELLM_LOG": "ERROR"}
    env.pop("DATABASE_URL", None)
    argv = [
        str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
        "--num_workers", "1",
    ]  # fmt: skip
    proc = ManagedProcess("litellm", argv, env, stack.log_dir).start()
    stack.processes.append(proc)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(f"{url}/health/liveliness", timeout_s=180)
    return proc, url
