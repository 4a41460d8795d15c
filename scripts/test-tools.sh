#!/usr/bin/env bash
# Install the pinned tools the test suite needs into .tools/ (idempotent, no root):
#   - Azurite (Microsoft's storage emulator) from npm, for blob tests against a real peer;
#   - a Python virtualenv with Microsoft's SDKs, for the emulator conformance test.
# Prints nothing to stdout but the paths it exports when sourced.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"
AZURITE_VERSION=3.35.0
PY_PACKAGES=(azure-mgmt-compute==37.0.0 azure-storage-blob==12.26.0 azure-core==1.35.0 azure-identity==1.23.0)
mkdir -p "$tools"

if [ ! -x "$tools/node_modules/.bin/azurite-blob" ] || \
   ! grep -q "\"version\": \"$AZURITE_VERSION\"" "$tools/node_modules/azurite/package.json" 2>/dev/null; then
  echo "test-tools: installing azurite@$AZURITE_VERSION" >&2
  (cd "$tools" && npm install --no-audit --no-fund --silent --prefix "$tools" "azurite@$AZURITE_VERSION" >&2)
fi

stamp="$tools/venv/.installed-$(printf '%s ' "${PY_PACKAGES[@]}" | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "test-tools: creating the Python virtualenv" >&2
  python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}" >&2
  touch "$stamp"
fi
