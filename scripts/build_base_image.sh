#!/usr/bin/env bash
# Build the local base image `polar-mq-base:bookworm` (Debian bookworm + python3, venv, pip,
# ca-certificates) with debootstrap, for machines that cannot pull `python:3.11-slim` from a registry.
#
#   sudo bash scripts/build_base_image.sh          # builds once; later runs exit at once
#   FORCE=1 sudo bash scripts/build_base_image.sh  # rebuild even if the image exists
#
# Then build the application image on top of it:
#   bash docker/build.sh --base polar-mq-base:bookworm
# (or: docker build -f docker/Dockerfile --build-arg BASE_IMAGE=polar-mq-base:bookworm -t polar-mq:dev .)
#
# Needs: root (debootstrap chroots), debootstrap, a running Docker engine, and access to a Debian
# mirror. No container registry is contacted.
#
# Settings (environment variables):
#   IMAGE          image name                                  (default polar-mq-base:bookworm)
#   SUITE          Debian suite                                (default bookworm)
#   DEBIAN_MIRROR  Debian archive URL      (default: the one apt uses here, read from /etc/apt/sources*)
#   HOST_CA        auto | 1 | 0: copy this host's extra CA certificates (/usr/local/share/ca-certificates)
#                  into the image and point pip at the system bundle. `auto` (default) does it when
#                  that directory holds certificates, i.e. when the host itself trusts a TLS-inspecting
#                  proxy; without them pip in the image could not reach PyPI through such a proxy.
#   FORCE          1: rebuild even if the image exists
#   KEEP_ROOTFS    1: keep the debootstrap directory (printed) for inspection
set -Eeuo pipefail

IMAGE="${IMAGE:-polar-mq-base:bookworm}"
SUITE="${SUITE:-bookworm}"
HOST_CA="${HOST_CA:-auto}"
FORCE="${FORCE:-0}"
KEEP_ROOTFS="${KEEP_ROOTFS:-0}"
PACKAGES="python3,python3-venv,python3-pip,ca-certificates"

T0=$EPOCHREALTIME
say() { printf '[build_base_image] %s\n' "$*"; }
die() { printf '[build_base_image] error: %s\n' "$*" >&2; exit 1; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# The Debian archive apt uses on this machine: the first enabled `deb` source whose suites include
# $SUITE, from one-line (*.list) or deb822 (*.sources) files.
detect_mirror() {
  local files=()
  [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
  local f
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] && files+=("$f")
  done
  ((${#files[@]})) || return 1
  local file
  for file in "${files[@]}"; do
    if [[ "$file" == *.sources ]]; then
      awk -v suite="$SUITE" '
        function flush() {
          if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && enabled != "no" && uris != "") {
            split(uris, u, " "); print u[1]; found = 1; exit
          }
          types = ""; uris = ""; suites = ""; enabled = ""
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        {
          key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
          if (key == "types") types = $0
          else if (key == "uris") uris = $0
          else if (key == "suites") suites = $0
          else if (key == "enabled") enabled = tolower($0)
        }
        END { if (!found) flush() }
      ' "$file"
    else
      awk -v suite="$SUITE" '
        /^[ \t]*deb[ \t]/ {
          i = 2
          if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
          if ($(i + 1) == suite) { print $i; exit }
        }
      ' "$file"
    fi
  done | head -n1
}

# --- preconditions ---------------------------------------------------------------------------
command -v docker >/dev/null 2>&1 || die "docker CLI not found (Debian: apt-get install -y docker.io)"
if ! docker info >/dev/null 2>&1; then
  die "cannot reach the Docker engine; start it, e.g.
  dockerd --host=unix:///var/run/docker.sock --bridge=none --iptables=false --ip-forward=false --ip-masq=false > /tmp/dockerd.log 2>&1 &"
fi

OLD_ID=""
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  OLD_ID="$(docker image inspect -f '{{.Id}}' "$IMAGE")"
  if [[ "$FORCE" != 1 ]]; then
    say "$IMAGE already exists (${OLD_ID:0:19}); nothing to do (FORCE=1 rebuilds)"
    exit 0
  fi
fi

[[ "$(id -u)" == 0 ]] || die "debootstrap needs root; run as root (sudo bash $0)"
command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found (Debian: apt-get install -y debootstrap)"

MIRROR="${DEBIAN_MIRROR:-$(detect_mirror || true)}"
[[ -n "$MIRROR" ]] || die "no Debian mirror for '$SUITE' found in /etc/apt/sources.list*; set DEBIAN_MIRROR=http://deb.debian.org/debian"
MIRROR="${MIRROR%/}"

case "$HOST_CA" in
  auto) compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null && HOST_CA=1 || HOST_CA=0 ;;
  0 | 1) ;;
  *) die "HOST_CA must be auto, 1 or 0 (got '$HOST_CA')" ;;
esac

ROOTFS="$(mktemp -d /tmp/polar-mq-rootfs.XXXXXX)"
cleanup() {
  if [[ "$KEEP_ROOTFS" == 1 ]]; then
    say "kept root filesystem at $ROOTFS"
  else
    rm -rf --one-file-system "$ROOTFS"
  fi
}
trap cleanup EXIT
trap 'die "failed at line $LINENO (log: $ROOTFS.log)"' ERR

# --- debootstrap -----------------------------------------------------------------------------
say "debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR into $ROOTFS (1-3 minutes)"
T1=$EPOCHREALTIME
if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" \
  >"$ROOTFS.log" 2>&1; then
  tail -n 20 "$ROOTFS.log" >&2
  die "debootstrap failed (full log: $ROOTFS.log)"
fi
say "debootstrap done in $(elapsed "$T1") s"

if [[ "$HOST_CA" == 1 ]]; then
  CAS=(/usr/local/share/ca-certificates/*.crt)
  say "adding this host's extra CA certificates: ${CAS[*]##*/}"
  cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
  chroot "$ROOTFS" update-ca-certificates >"$ROOTFS.ca.log" 2>&1 ||
    die "update-ca-certificates failed: $(cat "$ROOTFS.ca.log")"
  rm -f "$ROOTFS.ca.log"
fi

# --- slim down -------------------------------------------------------------------------------
chroot "$ROOTFS" apt-get clean
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin \
  "$ROOTFS"/var/cache/debconf/*-old "$ROOTFS"/var/lib/dpkg/*-old \
  "$ROOTFS"/var/log/*.log "$ROOTFS"/var/log/apt/* "$ROOTFS"/tmp/* \
  "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
  "$ROOTFS"/usr/share/locale/*
# Keep the container's resolver and host name to what Docker injects at run time.
: >"$ROOTFS/etc/resolv.conf"
: >"$ROOTFS/etc/hostname"
# apt inside the image points at the public archive, not at this machine's mirror.
cat >"$ROOTFS/etc/apt/sources.list" <<EOF
deb http://deb.debian.org/debian $SUITE main
deb http://deb.debian.org/debian-security $SUITE-security main
EOF

# --- import ----------------------------------------------------------------------------------
CHANGES=(
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  --change 'ENV LANG=C.UTF-8'
  --change 'CMD ["python3"]'
)
if [[ "$HOST_CA" == 1 ]]; then
  # pip uses its own certifi bundle unless told otherwise; the system bundle has the host's CAs.
  CHANGES+=(--change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt')
fi
say "importing into Docker as $IMAGE"
T2=$EPOCHREALTIME
tar --numeric-owner -C "$ROOTFS" -c . | docker import "${CHANGES[@]}" \
  --message "debootstrap $SUITE minbase + $PACKAGES (scripts/build_base_image.sh)" - "$IMAGE" >/dev/null
say "import done in $(elapsed "$T2") s"

PYVER="$(docker run --rm --network none "$IMAGE" python3 --version 2>&1)" ||
  die "the new image does not run python3: $PYVER"
SIZE="$(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
rm -f "$ROOTFS.log"
say "built $IMAGE ($PYVER, $SIZE) in $(elapsed "$T0") s"
if [[ -n "$OLD_ID" ]]; then
  say "the previous $IMAGE (${OLD_ID:0:19}) is now untagged; rebuild images FROM it, then 'docker image prune'"
fi
