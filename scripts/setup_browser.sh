#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the dashboard's browser tests (tests/ui), from Debian's
# packages: no browser download, no CDN. Idempotent (nothing to do once both are on PATH). When
# they cannot be installed (no root, no apt, no network) the browser tests skip with the reason.
set -uo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "[browser] chromium/chromedriver missing and not installable here (needs root + apt);" \
    "browser tests will skip"
  exit 0
fi
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; then
  apt-get update -q >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 ||
    echo "[browser] apt-get could not install chromium chromium-driver; browser tests will skip"
fi
exit 0
