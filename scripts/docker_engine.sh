#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine, for the `docker` runtime and its tests.
#
#   bash scripts/docker_engine.sh     # installs docker.io if missing, starts dockerd if not running
#
# Our CI machines have no registry and no bridge networking: dockerd is started with
# `--bridge=none --iptables=false` (containers use network "none" or "host"), in the background,
# logging to $DOCKERD_LOG. An engine that already answers is left alone, whatever its flags.
#
# Settings (environment variables):
#   DOCKER_HOST_SOCKET  socket the engine listens on   (default /var/run/docker.sock)
#   DOCKERD_LOG         log file of a started engine   (default /tmp/dockerd.log)
#   DOCKER_WAIT_S       seconds to wait for the engine (default 60)
set -Eeuo pipefail

SOCKET="${DOCKER_HOST_SOCKET:-/var/run/docker.sock}"
LOG="${DOCKERD_LOG:-/tmp/dockerd.log}"
WAIT_S="${DOCKER_WAIT_S:-60}"
say() { printf '[docker_engine] %s\n' "$*"; }
die() { printf '[docker_engine] error: %s\n' "$*" >&2; exit 1; }
engine_up() { docker -H "unix://$SOCKET" info >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && engine_up; then
  say "engine already running ($SOCKET)"
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  [[ "$(id -u)" == 0 ]] || die "dockerd is not installed and installing it needs root"
  say "installing docker.io"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q docker.io >/dev/null 2>&1 || {
    apt-get update -q >/dev/null 2>&1
    apt-get install -y -q docker.io >/dev/null || die "apt-get install docker.io failed"
  }
fi
command -v docker >/dev/null 2>&1 || die "docker CLI not found after installing docker.io"
# Compose validates docker/compose.yaml in tests/deploy: the v2 plugin is not packaged in this
# Debian, its `docker-compose` (1.29, Compose Specification files and profiles) is.
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
  if [[ "$(id -u)" == 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null 2>&1 ||
      say "docker-compose not installed; the compose config test will skip"
  fi
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
  [[ "$(id -u)" == 0 ]] || die "starting dockerd needs root"
  say "starting dockerd (log: $LOG)"
  # setsid + nohup: the engine must outlive this script and the shell that ran it
  setsid nohup dockerd --host="unix://$SOCKET" --bridge=none --iptables=false \
    --ip-forward=false --ip-masq=false >"$LOG" 2>&1 </dev/null &
fi

for _ in $(seq 1 $((WAIT_S * 4))); do
  if engine_up; then
    say "engine ready: $(docker -H "unix://$SOCKET" version -f '{{.Server.Version}}' 2>/dev/null)"
    exit 0
  fi
  sleep 0.25
done
die "the Docker engine did not answer within ${WAIT_S}s; see $LOG"
