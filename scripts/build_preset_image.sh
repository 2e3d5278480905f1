#!/usr/bin/env bash
# Build a docker image with preset harnesses baked in, for jobs with `runtime.kind: docker`:
#   bash scripts/build_preset_image.sh qwen_code mini_swe_agent@2.4.6    # -> polar-mq-presets:test
#   IMAGE=my-presets:1 bash scripts/build_preset_image.sh --all
# On top of the runtime test image (RUNTIME_IMAGE, default polar-mq-runtime:test). No network in
# the build: npm presets are installed on the host into the build context and copied in with the
# host's node binary; PyPI presets' wheels are downloaded on the host and installed in the image
# with pip --no-index (see polar_mq/harnesses/presets/image.py). Presets end up under
# /opt/polar_mq/harnesses/<name>/<version>, where prepare looks for them. Skipped when the image
# already carries the same inputs (label org.polar-mq.inputs); FORCE=1 rebuilds.
set -Eeuo pipefail
SELF="$(realpath "$0")"
cd "$(dirname "$SELF")/.."

IMAGE="${IMAGE:-polar-mq-presets:test}"
RUNTIME_IMAGE="${RUNTIME_IMAGE:-polar-mq-runtime:test}"
PYTHON="${PYTHON:-.venv/bin/python}"
FORCE="${FORCE:-0}"
say() { printf '[build_preset_image] %s\n' "$*"; }
die() { printf '[build_preset_image] error: %s\n' "$*" >&2; exit 1; }

[[ $# -gt 0 ]] || die "name the presets (NAME[@VERSION]...) or --all"
[[ -x "$PYTHON" ]] || die "$PYTHON not found; run scripts/bootstrap.sh first"
if [[ "$1" == "--all" ]]; then
  mapfile -t LABELS < <("$PYTHON" -c 'from polar_mq.harnesses.presets.registry import presets; print("\n".join(presets()))')
else
  LABELS=("$@")
fi
bash scripts/docker_engine.sh >/dev/null
bash scripts/build_test_image.sh >/dev/null
BASE_ID="$(docker image inspect -f '{{.Id}}' "$RUNTIME_IMAGE")"
DIGEST="$( {
  echo "$BASE_ID ${LABELS[*]}"
  cat "$SELF" polar_mq/harnesses/presets/*.py
} | sha256sum | cut -c1-16)"
if [[ "$FORCE" != 1 ]] &&
  [[ "$(docker image inspect -f '{{ index .Config.Labels "org.polar-mq.inputs" }}' "$IMAGE" 2>/dev/null)" == "$DIGEST" ]]; then
  say "$IMAGE is up to date (inputs $DIGEST); nothing to do (FORCE=1 rebuilds)"
  exit 0
fi

CTX="$(mktemp -d /tmp/polar-mq-presets-ctx.XXXXXX)"
trap 'rm -rf "$CTX"' EXIT
say "preparing ${LABELS[*]} on the host"
NODE="$("$PYTHON" -m polar_mq.harnesses.presets.image "$CTX" "${LABELS[@]}")" ||
  die "preparing the build context failed"
COPY_NODE=""
if [[ "$NODE" == node ]]; then  # the host's node (same Debian, libstdc++ is in the image)
  cp "$(command -v node)" "$CTX/node"
  COPY_NODE="COPY node /usr/local/bin/node"
fi
cat >"$CTX/Dockerfile" <<DOCKERFILE
ARG RUNTIME_IMAGE
FROM \${RUNTIME_IMAGE}
ARG INPUTS
LABEL org.polar-mq.role="runtime" org.polar-mq.inputs="\${INPUTS}"
${COPY_NODE}
COPY harnesses /opt/polar_mq/harnesses
COPY wheels /tmp/wheels
COPY install_pypi.sh /tmp/install_pypi.sh
RUN sh /tmp/install_pypi.sh && rm -rf /tmp/wheels /tmp/install_pypi.sh \
 && find /opt/polar_mq/harnesses -name '.*.lock' -delete
WORKDIR /workspace
CMD ["sleep", "infinity"]
DOCKERFILE
say "building $IMAGE from $RUNTIME_IMAGE (inputs $DIGEST)"
docker build --network none -q -t "$IMAGE" --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" \
  --build-arg INPUTS="$DIGEST" "$CTX" >"$CTX/build.log" 2>&1 ||
  die "docker build failed: $(tail -n 30 "$CTX/build.log")"
say "built $IMAGE: $(docker run --rm --network none "$IMAGE" sh -c 'ls /opt/polar_mq/harnesses | tr "\n" " "')"
