#!/usr/bin/env bash
# Install the trainers the bridges are tested against (trl, verl) into the vLLM venv, for
# tests/bridges. Run after scripts/setup_vllm.sh (that venv has torch 2.13 cpu and transformers).
#
# Idempotent: a second run checks a marker file and exits in well under a second.
#   1. pins every package already in the venv (pip freeze as a constraints file), so nothing
#      vLLM needs can move; the install fails rather than change one;
#   2. installs trl (and with it datasets, pandas, pyarrow) and orjson (polar_mq's client, which
#      the bridges' rollout sources use in the trainer's process);
#   3. installs verl --no-deps (verl 0.9.1 asks for transformers<5.11, the venv has 5.19 for
#      vLLM) plus what its batch and agent-loop types import: tensordict 0.8.3 (0.9+ needs
#      packaging<26, the venv has 26), ray, hydra-core, omegaconf, codetiming;
#   4. checks that no package that was there before changed, imports the classes the contract
#      tests use, and writes $CACHE/bridges.ready.
# slime is not installed: it is not on PyPI (the `slime` there is another project); its bridge is
# tested against the shape of its Sample type (docs/bridges.md).
# Force a reinstall with: rm "$CACHE/bridges.ready"
set -Eeuo pipefail

CACHE="${POLAR_MQ_CACHE:-$HOME/.cache/polar_mq}"
VENV="$CACHE/vllm-venv"
PY="$VENV/bin/python"
VLLM_MARKER="$CACHE/vllm.ready"
MARKER="$CACHE/bridges.ready"

TRL_VERSION="1.16.0"
VERL_VERSION="0.9.1"
TENSORDICT_VERSION="0.8.3"
RAY_VERSION="2.60.0"
HYDRA_VERSION="1.3.8"
OMEGACONF_VERSION="2.3.1"
CODETIMING_VERSION="1.4.0"
ORJSON_VERSION="3.13.0"
SPEC="trl==$TRL_VERSION verl==$VERL_VERSION tensordict==$TENSORDICT_VERSION ray==$RAY_VERSION hydra-core==$HYDRA_VERSION omegaconf==$OMEGACONF_VERSION codetiming==$CODETIMING_VERSION orjson==$ORJSON_VERSION"

say() { printf '[setup_bridges] %s\n' "$*"; }
die() {
    printf '[setup_bridges] ERROR: %s\n' "$*" >&2
    exit 1
}

[[ -f "$VLLM_MARKER" && -x "$PY" ]] || die "no vLLM venv at $VENV: run scripts/setup_vllm.sh first"
# The vLLM venv's own install time: a venv set up again since has lost what was added here.
VLLM_AT="$(grep '^installed_at=' "$VLLM_MARKER" || true)"

current() {
    [[ -f "$MARKER" ]] && grep -qxF "spec=$SPEC" "$MARKER" && grep -qxF "vllm_$VLLM_AT" "$MARKER" \
        && compgen -G "$VENV/lib/python*/site-packages/trl-$TRL_VERSION.dist-info" >/dev/null \
        && compgen -G "$VENV/lib/python*/site-packages/verl-$VERL_VERSION.dist-info" >/dev/null
}

if current; then
    say "already set up (marker $MARKER); nothing to do"
    exit 0
fi

# One installer at a time in this venv (setup_vllm.sh takes the same lock).
exec 9>"$CACHE/setup_vllm.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
    if current; then
        say "set up by a concurrent run meanwhile; nothing to do"
        exit 0
    fi
fi
rm -f "$MARKER"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PIP=("$PY" -m pip --disable-pip-version-check -q)

say "pinning the $("$PY" -m pip freeze | wc -l) packages of $VENV"
"$PY" -m pip freeze --exclude-editable | grep -v ' @ ' >"$WORK/before.txt" || true
cp "$WORK/before.txt" "$WORK/constraints.txt"

say "installing trl==$TRL_VERSION and verl's type dependencies"
"${PIP[@]}" install -c "$WORK/constraints.txt" "trl==$TRL_VERSION" "orjson==$ORJSON_VERSION" \
    "tensordict==$TENSORDICT_VERSION" "ray==$RAY_VERSION" "hydra-core==$HYDRA_VERSION" \
    "omegaconf==$OMEGACONF_VERSION" "codetiming==$CODETIMING_VERSION" cachetools \
    || die "trl or verl's dependencies do not install without changing a package vLLM pins"
say "installing verl==$VERL_VERSION (--no-deps)"
"${PIP[@]}" install --no-deps "verl==$VERL_VERSION"

"$PY" -m pip freeze --exclude-editable | grep -v ' @ ' >"$WORK/after.txt" || true
changed="$(comm -23 <(sort "$WORK/before.txt") <(sort "$WORK/after.txt"))"
[[ -z "$changed" ]] || die "packages changed in the vLLM venv: $changed"

say "checking the trainers' classes import"
HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 "$PY" - <<'EOF' >/dev/null 2>"$WORK/import.log" \
    || { tail -n 20 "$WORK/import.log" >&2; die "the trainers' classes do not import"; }
import vllm  # noqa: F401  (still imports)
from trl import GRPOConfig, GRPOTrainer  # noqa: F401
from trl.experimental.async_grpo.async_grpo_trainer import DataCollatorForRollout  # noqa: F401
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample  # noqa: F401
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput  # noqa: F401
from verl.protocol import DataProto  # noqa: F401
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: F401
EOF

{
    printf 'spec=%s\n' "$SPEC"
    printf 'vllm_%s\n' "$VLLM_AT"
    printf 'installed_at=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$MARKER.tmp"
mv "$MARKER.tmp" "$MARKER"
say "ready: marker $MARKER"
