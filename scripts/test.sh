#!/usr/bin/env bash
# The whole test suite: installs the pinned test tools (Azurite, the Python SDKs) into .tools/,
# then runs every Rust test (unit, integration against the emulator and Azurite, and the Python
# SDK conformance test, which the Rust suite drives).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/test-tools.sh"
export STEMCELL_GALLERY_TOOLS="$root/.tools"
cd "$root"
cargo test --all-targets "$@"
