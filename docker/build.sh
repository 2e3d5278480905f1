#!/usr/bin/env bash
# Build the polar_mq application image from docker/Dockerfile, with this host's pip index settings.
#
#   bash docker/build.sh                                  # FROM python:3.11-slim (needs a registry)
#   bash docker/build.sh --base polar-mq-base:bookworm    # FROM the local base image
#                                                         #   (scripts/build_base_image.sh)
#   bash docker/build.sh --tag polar-mq:1.2 -- --no-cache # extra arguments go to `docker build`
#
# What it does beyond a plain `docker build -f docker/Dockerfile .`:
#   * runs from the repository root whatever the current directory;
#   * uses BuildKit when this Docker CLI has it (buildx plugin, or the CLI's built-in BuildKit before
#     Docker 23), so docker/Dockerfile.dockerignore keeps .venv/.git out of the context; otherwise the
#     classic builder (same image, the whole directory is sent as context);
#   * builds with --network host, so RUN steps reach the package index exactly as this host does,
#     also on engines without a bridge network (dockerd --bridge=none);
#   * passes this host's pip index settings (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_TRUSTED_HOST
#     from the environment, else from `pip config list`) as build arguments, so no mirror host name
#     is written into the Dockerfile. Local (file://, path) indexes are skipped: the build cannot
#     see this host's file system.
# Settings: DOCKER (docker CLI to use), BASE_IMAGE, IMAGE (tag), PIP_* as above.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${IMAGE:-polar-mq:dev}"
BASE_IMAGE="${BASE_IMAGE:-python:3.11-slim}"
EXTRA=()
while (($#)); do
  case "$1" in
    --base) BASE_IMAGE="$2"; shift 2 ;;
    --tag | -t) IMAGE="$2"; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--base IMAGE] [--tag IMAGE] [-- docker build args...]" >&2; exit 2 ;;
  esac
done
say() { printf '[docker/build] %s\n' "$*"; }

# --- which docker CLI, which builder ---------------------------------------------------------
cli_has_buildkit() {  # $1 = docker CLI; prints "buildx" or "builtin" or nothing
  if "$1" buildx version >/dev/null 2>&1; then
    echo buildx
    return
  fi
  local v
  v="$("$1" version --format '{{.Client.Version}}' 2>/dev/null || true)"
  [[ "${v%%.*}" =~ ^[0-9]+$ ]] && ((${v%%.*} < 23)) && echo builtin
  return 0
}
if [[ -n "${DOCKER:-}" ]]; then
  CANDIDATES=("$DOCKER")
else
  mapfile -t CANDIDATES < <(type -ap docker | awk '!seen[$0]++')
fi
((${#CANDIDATES[@]})) || { echo "docker CLI not found" >&2; exit 1; }
DOCKER_CLI="${CANDIDATES[0]}"
BUILDER=classic
for cli in "${CANDIDATES[@]}"; do
  kind="$(cli_has_buildkit "$cli")"
  if [[ -n "$kind" ]]; then
    DOCKER_CLI="$cli"
    BUILDER="buildkit ($kind)"
    break
  fi
done
"$DOCKER_CLI" info >/dev/null 2>&1 || { echo "cannot reach the Docker engine with $DOCKER_CLI" >&2; exit 1; }

# --- pip index settings of this host ---------------------------------------------------------
pip_config() {  # $1 = option name (index-url, ...): the last value pip's config list shows
  local pip
  for pip in "python3 -m pip" pip3 pip; do
    if $pip --version >/dev/null 2>&1; then
      $pip config list 2>/dev/null |
        awk -v k="$1" -F= '{ split($1, a, "."); if (a[length(a)] == k) { v = substr($0, index($0, "=") + 1) } }
                            END { gsub(/^'\''|'\''$/, "", v); print v }'
      return
    fi
  done
}
remote_only() {  # keep http(s) URLs, drop file:// and paths
  local out=() u
  for u in $1; do
    case "$u" in
      http://* | https://*) out+=("$u") ;;
      *) say "not forwarding local pip index $u (not visible inside the build)" >&2 ;;
    esac
  done
  echo "${out[*]:-}"
}
INDEX_URL="$(remote_only "${PIP_INDEX_URL:-$(pip_config index-url)}")"
EXTRA_INDEX_URL="$(remote_only "${PIP_EXTRA_INDEX_URL:-$(pip_config extra-index-url)}")"
TRUSTED_HOST="${PIP_TRUSTED_HOST:-$(pip_config trusted-host)}"

ARGS=(build --network host -f "$ROOT/docker/Dockerfile" -t "$IMAGE" --build-arg "BASE_IMAGE=$BASE_IMAGE")
[[ -n "$INDEX_URL" ]] && ARGS+=(--build-arg "PIP_INDEX_URL=$INDEX_URL")
[[ -n "$EXTRA_INDEX_URL" ]] && ARGS+=(--build-arg "PIP_EXTRA_INDEX_URL=$EXTRA_INDEX_URL")
[[ -n "$TRUSTED_HOST" ]] && ARGS+=(--build-arg "PIP_TRUSTED_HOST=$TRUSTED_HOST")

say "image $IMAGE from $BASE_IMAGE; builder: $BUILDER via $DOCKER_CLI"
say "pip index: ${INDEX_URL:-pip default (PyPI)}${EXTRA_INDEX_URL:+, extra: $EXTRA_INDEX_URL}"
if [[ "$BASE_IMAGE" != polar-mq-base:* ]] && [[ -n "$(pip_config cert)${PIP_CERT:-}" ]]; then
  say "note: pip here trusts a custom CA bundle; if the build cannot reach the index over TLS, use"
  say "      the local base image (scripts/build_base_image.sh copies this host's CAs into it)"
fi
T0=$EPOCHREALTIME
if [[ "$BUILDER" == "buildkit (builtin)" ]]; then
  export DOCKER_BUILDKIT=1
elif [[ "$BUILDER" == classic ]]; then
  export DOCKER_BUILDKIT=0
  say "no BuildKit here: classic builder; docker/Dockerfile.dockerignore is ignored, so the whole"
  say "repository (including .venv) is sent as build context. The image is the same."
fi
cd "$ROOT"
"$DOCKER_CLI" "${ARGS[@]}" "${EXTRA[@]}" .
SIZE="$("$DOCKER_CLI" image inspect -f '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
say "built $IMAGE ($SIZE) in $(awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s"
