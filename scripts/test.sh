#!/usr/bin/env bash
# The whole test suite: installs the pinned test tools (Azurite, the Python SDKs) into .tools/,
# then runs every Rust test (unit, integration against the emulator and Azurite, and the Python
# SDK conformance test, which the Rust suite drives). Then the gallery, CPI (create_stemcell and
# delete_stemcell) and cleanup scenario suites run once more under the emulator's Azure timing
# profile (recorded durations, Retry-After, the delete lag, page-blob throttling) divided by
# STEMCELL_GALLERY_TIMED_SCALE (default 150: a version create takes 3 s; about 4 minutes on 2
# cores): the second run filters the one integration binary (tests/integration) to those four
# modules (of the gallery scenarios, the emulator half; its scenarios of the service's own rules
# stay at the instant timing: gallery_scenarios/mod.rs, shared_scenarios!). Extra arguments go to
# the first run only.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export STEMCELL_GALLERY_TOOLS="${STEMCELL_GALLERY_TOOLS:-$root/.tools}"
bash "$root/scripts/test-tools.sh"
cd "$root"
cargo test --all-targets "$@"
scale="${STEMCELL_GALLERY_TIMED_SCALE:-150}"
echo "== the gallery, CPI and cleanup scenarios under --timing azure / $scale"
STEMCELL_GALLERY_TEST_TIMING="azure:$scale" \
  cargo test --test integration -- gallery_scenarios::emulator:: cpi_create:: cpi_delete:: cleanup_emulator::
