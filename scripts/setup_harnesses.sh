#!/usr/bin/env bash
# Install every harness preset into this node's cache (POLAR_MQ_HARNESS_ROOT, default
# ~/.cache/polar_mq/harnesses) before the tests, outside any per-test timeout: a cold install
# (openhands-sdk: ~5 min) would not fit one. Reruns find them cached (seconds). Three at a time;
# a preset that cannot be installed here is reported and its tests skip with the reason.
#   bash scripts/setup_harnesses.sh            # every preset
#   bash scripts/setup_harnesses.sh codex aider
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
if [[ $# -gt 0 ]]; then
  PRESETS=("$@")
else
  mapfile -t PRESETS < <("$PY" -c 'from polar_mq.harnesses.presets.registry import presets; print("\n".join(presets()))')
fi
started=$(date +%s)
printf '%s\n' "${PRESETS[@]}" |
  COLUMNS=250 xargs -P 3 -I{} sh -c '"$0" -m polar_mq.cli harness install {} 2>&1 | tail -n 1 | sed "s/^/[setup_harnesses] /"' "$PY"
echo "[setup_harnesses] ${#PRESETS[@]} presets checked in $(( $(date +%s) - started ))s"
exit 0
