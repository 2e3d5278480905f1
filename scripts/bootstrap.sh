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
# The editable install must point at this checkout (a venv shared with a copy of it, e.g. a
# worktree's run, may have been re-pointed there): -P keeps the current directory off sys.path.
points_here() {
  [ "$(.venv/bin/python -P -c 'import pathlib, polar_mq; print(pathlib.Path(polar_mq.__file__).resolve().parent.parent)' 2>/dev/null)" = "$(pwd -P)" ]
}
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || ! points_here; then
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e '.[dev]'
  touch "$stamp"
fi
# The unprivileged user agents run as when a worker runs as root (POLAR_MQ_AGENT_USER's default;
# without it agents run as nobody). See docs/hardening.md.
if [ "$(id -u)" = 0 ] && ! id polar-agent >/dev/null 2>&1 && command -v useradd >/dev/null 2>&1; then
  group=()
  if getent group polar-agent >/dev/null 2>&1; then group=(-g polar-agent); fi  # left by a partial run
  useradd --system "${group[@]}" --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin polar-agent ||
    echo "[bootstrap] could not create the polar-agent user; agents will run as nobody"
fi
# One agent user per live `local` runtime (polar_mq/runtimes/agent_pool.py): polar-agent-1..N,
# so two rollouts of a node cannot read each other's workspaces. Size: the node's worker slots
# plus its warm pool.
if [ "$(id -u)" = 0 ] && getent group polar-agent >/dev/null 2>&1 && command -v useradd >/dev/null 2>&1; then
  for i in $(seq 1 "${POLAR_MQ_AGENT_POOL_SIZE:-32}"); do
    id "polar-agent-$i" >/dev/null 2>&1 && continue
    useradd --system -g polar-agent --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin "polar-agent-$i" ||
      { echo "[bootstrap] could not create agent pool users; agents of a node share one user"; break; }
  done
fi
