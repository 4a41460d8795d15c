#!/usr/bin/env bash
# Hosts upgraded one at a time (issue 44): builds the previous release's binary from git history
# (default: the last commit before the gallery's identity keyed the locks and records; REV=...
# to choose another) into .tools/previous/, then runs tests/integration/mixed_release.rs, which
# drives that binary and this checkout's side by side against one emulator.
#   bash scripts/mixed-release.sh [REV]
# The previous release builds in a worktree with its own target directory (a full build the first
# time, about 10 minutes on 2 cores; later runs reuse it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rev="${1:-${REV:-09c2c3c}}"
tools="${STEMCELL_GALLERY_TOOLS:-$root/.tools}"
tree="$tools/previous/tree"
export STEMCELL_GALLERY_TOOLS="$tools"
bash "$root/scripts/test-tools.sh"
mkdir -p "$tools/previous"
if [ -d "$tree" ]; then
  git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"
fi
git -C "$root" worktree prune
git -C "$root" worktree add --detach "$tree" "$rev" >/dev/null
echo "== building the previous release ($rev)"
(cd "$tree" && CARGO_TARGET_DIR="$tools/previous/target" cargo build --locked --bin stemcell-gallery)
bin="$tools/previous/target/debug/stemcell-gallery"
git -C "$root" worktree remove --force "$tree"
echo "== this release against $("$bin" --version)"
cd "$root"
STEMCELL_GALLERY_PREVIOUS_BIN="$bin" cargo test --test integration -- --ignored mixed_release::
