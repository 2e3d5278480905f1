#!/usr/bin/env bash
# Create the project virtualenv (.venv) and install polar_mq with its dev tools. Idempotent:
# a re-run only reinstalls when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.polar_mq-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e '.[dev]'
  touch "$stamp"
fi
