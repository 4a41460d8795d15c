#!/usr/bin/env bash
# Build the container image of a binary already built, and smoke-run it, with podman and nothing
# pulled from a registry:
#
#   scripts/container-image.sh BINARY TAG
#
# 1. stages the build context in $CONTAINER_IMAGE_WORK (default target/container-image/): the
#    binary (debug info stripped) at /usr/local/bin/stemcell-gallery, every shared library `ldd`
#    names and the dynamic loader, /etc/ssl/certs/ca-certificates.crt, /etc/nsswitch.conf,
#    /etc/passwd and /etc/group with the user nonroot (65532), /home/nonroot and /tmp;
# 2. builds deploy/container/Containerfile.local (FROM scratch) into a podman store of its own
#    under the same directory (--pull=never);
# 3. checks the image holds exactly the staged files, and that .dockerignore keeps the
#    Dockerfile's build context small (what `podman build .` would send, without target/ or
#    .tools/);
# 4. runs the image as the Kubernetes CronJob does (user 65532, read-only root, no capabilities;
#    host network): `--version`, then `doctor` against an emulator started from BINARY on
#    loopback, which must pass every check.
#
# It installs podman, runc, ca-certificates and curl with apt-get when they are missing (as root).
# CI runs it after the tests with the debug binary they built (.ci/run). Exit status: 0 built and
# ran, 1 a step failed, 2 bad usage or a missing tool.
set -euo pipefail

[ $# -eq 2 ] || { echo "usage: $0 BINARY TAG" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
binary="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tag="$2"
[ -x "$binary" ] || { echo "$1 is not an executable file (build it first: cargo build)" >&2; exit 2; }
work="${CONTAINER_IMAGE_WORK:-${CARGO_TARGET_DIR:-$root/target}/container-image}"
start=$SECONDS

# --- tools -------------------------------------------------------------------------------------
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v curl >/dev/null || missing+=(curl)
[ -f /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
for tool in ldd objcopy python3; do
  command -v "$tool" >/dev/null || { echo "$tool not found: it is needed to stage the image" >&2; exit 2; }
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "missing: ${missing[*]}; install them (Debian: apt-get install ${missing[*]})" >&2
    exit 2
  fi
  echo "== installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "== $(podman --version), $(runc --version | head -n1)"

# A store of its own (vfs: no overlay mounts needed). The OCI runtime is runc with cgroupfs: crun,
# podman's default on Debian, refuses this kind of machine's cgroup layout ("cgroups in hybrid
# mode not supported, drop all controllers from cgroupv2"). The explicit limits replace podman's
# defaults (nofile 1048576, nproc above the machine's), which the runtime may not raise here
# ("error setting rlimit type 7: operation not permitted").
pm() {
  podman --root "$work/storage" --runroot "$work/run" --storage-driver vfs \
    --runtime runc --cgroup-manager cgroupfs --events-backend file "$@"
}
run_opts=(--rm --network host --ulimit nofile=4096:4096 --ulimit nproc=4096:4096
  --user 65532:65532 --read-only --cap-drop ALL --security-opt no-new-privileges)

# --- 1. stage ------------------------------------------------------------------------------------
if [ -d "$work/storage" ]; then pm rmi --all --force >/dev/null 2>&1 || true; fi
rm -rf "$work"
ctx="$work/context"
rootfs="$ctx/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$ctx/home/nonroot"
install -d -m 1777 "$rootfs/tmp"
chmod 0700 "$ctx/home/nonroot"
objcopy --strip-debug "$binary" "$rootfs/usr/local/bin/stemcell-gallery"
chmod 0755 "$rootfs/usr/local/bin/stemcell-gallery"
# `ldd` lines: "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and the loader
# "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
libs="$(ldd "$binary" | sed -n -e 's/^.*=> \(\/[^ ]*\) .*$/\1/p' -e 's/^[[:space:]]*\(\/[^ ]*\) (0x.*$/\1/p')"
if [ -z "$libs" ]; then
  echo "ldd names no shared library of $binary (statically linked?): nothing to add" >&2
fi
for lib in $libs; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$rootfs/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$rootfs/etc/nsswitch.conf"
cp "$root/deploy/container/Containerfile.local" "$ctx/Containerfile"
{ (cd "$rootfs" && find . -mindepth 1 | sed 's|^\.||'); (cd "$ctx" && find home | sed 's|^|/|'); } | sort > "$work/staged.txt"
echo "== staged $(wc -l < "$work/staged.txt") paths; libraries: $(for lib in $libs; do basename "$lib"; done | paste -sd ' ')"

# --- 2. build ------------------------------------------------------------------------------------
echo "== podman build $tag (FROM scratch, --pull=never)"
pm build --quiet --pull=never --network none -f "$ctx/Containerfile" -t "$tag" "$ctx" >/dev/null
size="$(pm image inspect --format '{{.Size}}' "$tag")"
echo "== built $tag: $((size / 1024 / 1024)) MiB ($size bytes)"

# --- 3. inspect ----------------------------------------------------------------------------------
mnt="$(pm image mount "$tag")"
(cd "$mnt" && find . -mindepth 1 | sed 's|^\.||' | sort) > "$work/image.txt"
if ! diff -u "$work/staged.txt" "$work/image.txt"; then
  echo "the image holds other files than the staged ones (diff above: - staged, + image)" >&2
  exit 1
fi
[ "$(stat -c '%a %u' "$mnt/tmp")" = "1777 0" ] || { echo "/tmp in the image: $(stat -c '%a %u' "$mnt/tmp"), not 1777 root" >&2; exit 1; }
[ "$(stat -c '%u:%g' "$mnt/home/nonroot")" = "65532:65532" ] || { echo "/home/nonroot is not owned by nonroot" >&2; exit 1; }
pm image unmount "$tag" >/dev/null

# The Dockerfile's context: a FROM scratch build that copies the whole checkout, filtered by
# .dockerignore as every build from the repository root is.
probe="$work/context-probe"
mkdir -p "$probe"
printf 'FROM scratch\nCOPY . /context/\n' > "$probe/Containerfile"
pm build --quiet --pull=never --network none -f "$probe/Containerfile" -t localhost/stemcell-gallery-context:probe "$root" >/dev/null
mnt="$(pm image mount localhost/stemcell-gallery-context:probe)"
for keep in Cargo.toml Cargo.lock src/main.rs examples bench/blob_upload.rs deploy/azure/role-definition.json; do
  [ -e "$mnt/context/$keep" ] || { echo ".dockerignore drops $keep, which deploy/container/Dockerfile copies" >&2; exit 1; }
done
for drop in target .tools .git fuzz/target bench/out; do
  [ ! -e "$mnt/context/$drop" ] || { echo ".dockerignore keeps $drop in the build context" >&2; exit 1; }
done
context_kib="$(du -sk "$mnt/context" | cut -f1)"
pm image unmount localhost/stemcell-gallery-context:probe >/dev/null
pm rmi --force localhost/stemcell-gallery-context:probe >/dev/null
echo "== .dockerignore: the Dockerfile's build context is $((context_kib / 1024)) MiB (no target/, .tools/, .git)"

# --- 4. run ----------------------------------------------------------------------------------------
want="$("$binary" --version)"
got="$(pm run "${run_opts[@]}" "$tag" --version)"
[ "$got" = "$want" ] || { echo "the image prints '$got' for --version, the binary '$want'" >&2; exit 1; }
echo "== podman run $tag --version: $got"

emulator_out="$work/emulator.json"
"$binary" emulator --listen 127.0.0.1:0 --world "$root/fixtures/worlds/consumers.json" \
  > "$emulator_out" 2> "$work/emulator.log" &
emulator_pid=$!
trap 'kill "$emulator_pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  [ -s "$emulator_out" ] && break
  kill -0 "$emulator_pid" 2>/dev/null || { cat "$work/emulator.log" >&2; echo "the emulator exited" >&2; exit 1; }
  sleep 0.1
done
arm="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["arm"])' "$emulator_out")"
blob="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["blob"])' "$emulator_out")"
# The blob container the world file does not hold (docs/commands.md "A sample session").
curl -sS -f -o /dev/null -X PUT -H "Authorization: Bearer stemcell-gallery-emulator-dev-token" \
  "$blob/stemcell?restype=container"

set +e
pm run "${run_opts[@]}" "$tag" --auth emulator --arm-endpoint "$arm" --blob-endpoint "$blob" \
  --subscription 00000000-0000-0000-0000-000000000000 --resource-group bosh-rg \
  --gallery bosh_stemcells --output json doctor > "$work/doctor.json" 2> "$work/doctor.log"
rc=$?
set -e
if [ "$rc" != 0 ]; then
  echo "doctor in the image exited $rc:" >&2
  cat "$work/doctor.json" "$work/doctor.log" >&2
  exit 1
fi
python3 - "$work/doctor.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
checks = doc["checks"]
bad = [c for c in checks if c["status"] != "pass"]
assert len(checks) >= 5 and not bad, f"doctor checks not all passing: {bad or checks}"
print(f"== podman run {len(checks)} doctor checks against the emulator: all pass "
      f"({', '.join(c['name'] for c in checks)})")
PY
kill "$emulator_pid" 2>/dev/null || true
wait "$emulator_pid" 2>/dev/null || true
trap - EXIT
echo "== container image $tag built and smoke-run in $((SECONDS - start)) s"
