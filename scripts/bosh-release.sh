#!/usr/bin/env bash
# Build the stemcell-gallery BOSH release tarball from this checkout:
#
#   scripts/bosh-release.sh OUT_DIR [--version VERSION] [--azure-cpi-release DIR]
#
# 1. `cargo build --release --locked` (CARGO_TARGET_DIR is honoured);
# 2. checks the highest GLIBC_ symbol version the binary needs against the oldest stemcell it
#    targets (Ubuntu Jammy, glibc 2.35; Noble has 2.39) and refuses a binary that needs more;
# 3. copies deploy/bosh into a scratch directory (this checkout stays clean: no blobs/,
#    dev_releases/ or .dev_builds/ in it), adds the binary there as the blob
#    stemcell-gallery/stemcell-gallery-linux-amd64, and the source it was built from as the blob
#    stemcell-gallery/source.json: `git rev-parse HEAD` of this checkout, and whether the tree had
#    changes `git status --porcelain` shows (installed as /var/vcap/packages/stemcell-gallery/source.json);
# 4. with --azure-cpi-release DIR (a checkout of cloudfoundry/bosh-azure-cpi-release at the
#    version your bosh-deployment pins), generates the create-env job
#    stemcell_gallery_create_env_cpi (scripts/bosh-create-env-job.rb) and vendors the Azure CPI's
#    packages into the release with `bosh vendor-package` (a spec.lock naming each by
#    fingerprint; the package itself comes from the Azure CPI release's final builds, so this
#    step needs network access to its blobstore);
# 5. `bosh create-release --tarball OUT_DIR/stemcell-gallery-VERSION.tgz`, then writes
#    OUT_DIR/stemcell-gallery-release-vars.yml (version, file:// URL, sha1, and the commit) for
#    `bosh -l`.
#
# bosh-cli is $BOSH, else `bosh` on PATH. VERSION defaults to Cargo's version plus
# `+dev.<commit count>`. Exit status: 0 built, 1 a step failed, 2 bad usage or a missing tool.
set -euo pipefail

usage() {
  echo "usage: $0 OUT_DIR [--version VERSION] [--azure-cpi-release DIR]" >&2
  exit 2
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out=""
version=""
azure_cpi_release=""
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || usage; version="$2"; shift 2 ;;
    --azure-cpi-release) [ $# -ge 2 ] || usage; azure_cpi_release="$2"; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) [ -z "$out" ] || usage; out="$1"; shift ;;
  esac
done
[ -n "$out" ] || usage

bosh="${BOSH:-}"
if [ -z "$bosh" ]; then
  bosh="$(command -v bosh || true)"
fi
if [ -z "$bosh" ] || [ ! -x "$bosh" ]; then
  echo "bosh-cli not found: set BOSH=/path/to/bosh or put bosh on PATH (https://github.com/cloudfoundry/bosh-cli/releases)" >&2
  exit 2
fi
for tool in cargo objdump sha1sum; do
  command -v "$tool" >/dev/null || { echo "$tool not found: it is needed to build the release" >&2; exit 2; }
done
if [ -n "$azure_cpi_release" ]; then
  command -v ruby >/dev/null || { echo "ruby not found: --azure-cpi-release generates the create-env job with it" >&2; exit 2; }
  [ -f "$azure_cpi_release/jobs/azure_cpi/spec" ] || {
    echo "$azure_cpi_release is not a checkout of bosh-azure-cpi-release (no jobs/azure_cpi/spec)" >&2; exit 2; }
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"

if [ -z "$version" ]; then
  base="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)"
  count="$(git -C "$root" rev-list --count HEAD 2>/dev/null || echo 0)"
  version="${base}+dev.${count}"
fi

# The source: the commit checked out, and whether the tree differs from it (a dirty build says so
# wherever the commit is shown). Outside a git checkout both are "unknown".
if commit="$(git -C "$root" rev-parse --verify HEAD 2>/dev/null)"; then
  if [ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ]; then dirty=true; else dirty=false; fi
else
  commit=unknown
  dirty=unknown
fi
echo "== source: commit $commit, uncommitted changes: $dirty"

echo "== cargo build --release --locked"
(cd "$root" && cargo build --release --locked --bin stemcell-gallery)
target_dir="${CARGO_TARGET_DIR:-$root/target}"
binary="$target_dir/release/stemcell-gallery"
[ -x "$binary" ] || { echo "cargo built no $binary" >&2; exit 1; }

# The newest glibc symbol version the binary links against; it runs on any glibc at least that
# new. Jammy stemcells ship 2.35 and Noble 2.39, so the bound is 2.35.
glibc_max=2.35
needed="$(objdump -T "$binary" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)"
if [ -z "$needed" ]; then
  echo "== glibc: the binary names no GLIBC_ symbol version (statically linked?)"
elif [ "$(printf '%s\n%s\n' "$needed" "$glibc_max" | sort -V | tail -n1)" != "$glibc_max" ]; then
  echo "the binary needs glibc $needed, newer than Jammy's $glibc_max: build it on an older distribution (Debian bookworm, Ubuntu Jammy) or for x86_64-unknown-linux-musl" >&2
  exit 1
else
  echo "== glibc: the binary needs GLIBC_$needed (Jammy has 2.35, Noble 2.39: both run it)"
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cp -R "$root/deploy/bosh/config" "$root/deploy/bosh/jobs" "$root/deploy/bosh/packages" "$root/deploy/bosh/src" "$scratch/"
# A scratch blobstore for this build only (final.yml's local path is for hand-made finals).
cat > "$scratch/config/private.yml" <<YAML
blobstore:
  options:
    blobstore_path: $scratch/.blobstore
YAML
mkdir -p "$scratch/.blobstore"

echo "== bosh add-blob"
"$bosh" add-blob --dir "$scratch" "$binary" stemcell-gallery/stemcell-gallery-linux-amd64
printf '{"commit": "%s", "dirty": %s, "release_version": "%s", "glibc": "%s"}\n' \
  "$commit" "$([ "$dirty" = unknown ] && echo null || echo "$dirty")" "$version" "${needed:-none}" \
  > "$scratch/.source.json"
"$bosh" add-blob --dir "$scratch" "$scratch/.source.json" stemcell-gallery/source.json

if [ -n "$azure_cpi_release" ]; then
  echo "== the create-env job from $azure_cpi_release"
  ruby "$root/scripts/bosh-create-env-job.rb" "$azure_cpi_release" "$scratch"
  for pkg in $(ruby -ryaml -e 'puts YAML.safe_load(File.read(ARGV[0]))["packages"]' "$azure_cpi_release/jobs/azure_cpi/spec"); do
    echo "== bosh vendor-package $pkg"
    "$bosh" vendor-package --dir "$scratch" "$pkg" "$azure_cpi_release"
  done
fi

tarball="$out/stemcell-gallery-$version.tgz"
echo "== bosh create-release --tarball $tarball"
"$bosh" create-release --dir "$scratch" --name stemcell-gallery --version "$version" --tarball "$tarball" --force

sha1="$(sha1sum "$tarball" | cut -d' ' -f1)"
cat > "$out/stemcell-gallery-release-vars.yml" <<YAML
# Written by scripts/bosh-release.sh: pass with -l to bosh create-env / bosh deploy.
stemcell_gallery_release_version: "$version"
stemcell_gallery_release_url: file://$tarball
stemcell_gallery_release_sha1: $sha1
# The source it was built from (also in the release: stemcell-gallery/source.json).
stemcell_gallery_release_commit: "$commit"
stemcell_gallery_release_dirty: $([ "$dirty" = unknown ] && echo null || echo "$dirty")
YAML
"$bosh" inspect-local-release "$tarball"
echo "== built $tarball"
echo "   version $version, sha1 $sha1, glibc ${needed:-none}"
echo "   built from commit $commit (uncommitted changes: $dirty)"
echo "   variables for the ops files: $out/stemcell-gallery-release-vars.yml"
