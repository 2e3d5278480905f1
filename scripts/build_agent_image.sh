#!/usr/bin/env bash
# Build the image the docker end-to-end tests run the reference agent in: `polar-mq-agent:test`, on
# top of the runtime test image, with the OpenAI SDK and polar_mq's reference agent
# (`python3 -m polar_mq.agents.tool_agent`) in a venv at /opt/polar-agent that is first on PATH.
#
#   bash scripts/build_agent_image.sh          # cached: skipped when the image has these inputs
#   FORCE=1 bash scripts/build_agent_image.sh  # rebuild anyway
#
# No registry and no network inside the build: the wheels (the openai version of this checkout's
# .venv and its dependencies, binary only) are fetched on the host with the host's pip settings into
# a temporary build context, and the Dockerfile installs them with `pip install --no-index`. Only
# the agent's own sources (polar_mq/__init__.py, polar_mq/agents/) go into the image, so editing the
# rest of polar_mq does not invalidate it. The inputs' digest is the image label
# org.polar-mq.inputs; a build is skipped when the existing image carries the same digest.
# Cold: ~15 s (after the runtime test image exists). Warm: well under a second.
#
# Settings: IMAGE (default polar-mq-agent:test), RUNTIME_IMAGE (default polar-mq-runtime:test),
# PYTHON (default .venv/bin/python: whose openai version is installed).
set -Eeuo pipefail
SELF="$(realpath "$0")"
cd "$(dirname "$SELF")/.."

IMAGE="${IMAGE:-polar-mq-agent:test}"
RUNTIME_IMAGE="${RUNTIME_IMAGE:-polar-mq-runtime:test}"
PYTHON="${PYTHON:-.venv/bin/python}"
FORCE="${FORCE:-0}"
say() { printf '[build_agent_image] %s\n' "$*"; }
die() { printf '[build_agent_image] error: %s\n' "$*" >&2; exit 1; }

[[ -x "$PYTHON" ]] || die "$PYTHON not found; run scripts/bootstrap.sh first"
bash scripts/docker_engine.sh >/dev/null
bash scripts/build_test_image.sh >/dev/null
OPENAI_VERSION="$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("openai"))')"
BASE_ID="$(docker image inspect -f '{{.Id}}' "$RUNTIME_IMAGE")"
DIGEST="$( {
  echo "$BASE_ID openai==$OPENAI_VERSION"
  cat "$SELF" polar_mq/__init__.py
  find polar_mq/agents -name '*.py' | LC_ALL=C sort | xargs cat
} | sha256sum | cut -c1-16)"

if [[ "$FORCE" != 1 ]] &&
  [[ "$(docker image inspect -f '{{ index .Config.Labels "org.polar-mq.inputs" }}' "$IMAGE" 2>/dev/null)" == "$DIGEST" ]]; then
  say "$IMAGE is up to date (inputs $DIGEST); nothing to do (FORCE=1 rebuilds)"
  exit 0
fi

CTX="$(mktemp -d /tmp/polar-mq-agent-ctx.XXXXXX)"
trap 'rm -rf "$CTX"' EXIT
say "fetching openai==$OPENAI_VERSION and its dependencies as wheels on the host"
# The versions already in this checkout's venv win, so the image runs what the tests run.
"$PYTHON" -m pip freeze --exclude-editable >"$CTX/constraints.txt"
"$PYTHON" -m pip download -q --disable-pip-version-check --only-binary=:all: \
  -c "$CTX/constraints.txt" -d "$CTX/wheels" "openai==$OPENAI_VERSION" >"$CTX/pip.log" 2>&1 ||
  die "pip download failed: $(tail -n 20 "$CTX/pip.log")"
mkdir -p "$CTX/src/polar_mq"
cp polar_mq/__init__.py "$CTX/src/polar_mq/"
cp -r polar_mq/agents "$CTX/src/polar_mq/agents"
find "$CTX/src" -name __pycache__ -prune -exec rm -rf {} +

cat >"$CTX/Dockerfile" <<'DOCKERFILE'
ARG RUNTIME_IMAGE
FROM ${RUNTIME_IMAGE}
ARG INPUTS
LABEL org.polar-mq.role="runtime" org.polar-mq.inputs="${INPUTS}"
COPY wheels /tmp/wheels
COPY src/polar_mq /tmp/src/polar_mq
# The venv's site-packages gets the agent package itself; PATH makes its python3 the default.
RUN python3 -m venv /opt/polar-agent \
 && /opt/polar-agent/bin/pip install -q --no-index --no-cache-dir --disable-pip-version-check \
      --find-links /tmp/wheels openai \
 && cp -r /tmp/src/polar_mq "$(/opt/polar-agent/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/" \
 && rm -rf /tmp/wheels /tmp/src \
 && /opt/polar-agent/bin/python3 -c "import openai, polar_mq.agents.tool_agent"
ENV PATH=/opt/polar-agent/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /workspace
CMD ["sleep", "infinity"]
DOCKERFILE

say "building $IMAGE from $RUNTIME_IMAGE (inputs $DIGEST)"
docker build --network none -q -t "$IMAGE" --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" \
  --build-arg INPUTS="$DIGEST" "$CTX" >"$CTX/build.log" 2>&1 ||
  die "docker build failed: $(tail -n 30 "$CTX/build.log")"
say "built $IMAGE: $(docker run --rm --network none "$IMAGE" python3 -c \
  'import openai, sys; print(f"python {sys.version.split()[0]}, openai {openai.__version__}")')"
