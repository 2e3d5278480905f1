#!/usr/bin/env bash
# Build the image the `docker` runtime tests run rollouts in: `polar-mq-runtime:test`, on top of the
# debootstrap base image (no registry needed). Both steps are skipped when their image exists.
#
#   bash scripts/build_test_image.sh          # engine + base image + test image, cached
#   FORCE=1 bash scripts/build_test_image.sh  # rebuild the test image (not the base)
#
# Cold (no images): ~3 min, almost all of it debootstrap. Warm: well under a second.
# Needs root (debootstrap) and a Debian mirror the first time; see scripts/build_base_image.sh.
#
# Settings: IMAGE (default polar-mq-runtime:test), BASE_IMAGE (default polar-mq-base:bookworm).
set -Eeuo pipefail
cd "$(dirname "$0")/.."

IMAGE="${IMAGE:-polar-mq-runtime:test}"
BASE_IMAGE="${BASE_IMAGE:-polar-mq-base:bookworm}"
FORCE="${FORCE:-0}"
say() { printf '[build_test_image] %s\n' "$*"; }

bash scripts/docker_engine.sh
if [[ "$FORCE" != 1 ]] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "$IMAGE already exists; nothing to do (FORCE=1 rebuilds)"
  exit 0
fi
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && ! command -v debootstrap >/dev/null 2>&1; then
  [[ "$(id -u)" == 0 ]] || { echo "[build_test_image] error: debootstrap missing (needs root to install)" >&2; exit 1; }
  say "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null 2>&1 || {
    apt-get update -q >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
  }
fi
IMAGE="$BASE_IMAGE" FORCE=0 bash scripts/build_base_image.sh

say "building $IMAGE from $BASE_IMAGE"
# No build context: everything the image needs is already in the base. The label lets people (and
# `docker image prune --filter`) tell runtime images from application images.
LOG="$(mktemp /tmp/build_test_image.XXXXXX.log)"
trap 'printf "[build_test_image] error: docker build failed:\n" >&2; cat "$LOG" >&2' ERR
docker build --network none -q -t "$IMAGE" --build-arg BASE_IMAGE="$BASE_IMAGE" - >"$LOG" 2>&1 <<'DOCKERFILE'
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
LABEL org.polar-mq.role="runtime"
RUN mkdir -p /workspace && python3 -c "import json, socket, subprocess"
WORKDIR /workspace
CMD ["sleep", "infinity"]
DOCKERFILE
rm -f "$LOG"
say "built $IMAGE: $(docker run --rm --network none "$IMAGE" python3 --version 2>&1)"
