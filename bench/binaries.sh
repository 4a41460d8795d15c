#!/usr/bin/env bash
# Two builds of stemcell-gallery side by side: `inspect` and `seed` (verify + sparse upload to
# Azurite + gallery version on the emulator), interleaved in one run, RUNS times each, medians and
# the ratio NEW/OLD. Made for the SDK-line move (issue 18: the 0.21 crates against the 1.x line),
# useful for any change that should leave the hot paths as they were.
#
#   bash bench/binaries.sh OLD_BIN NEW_BIN     # RUNS=3 VHD_MIB=2048 FRACTION=0.25 by default
#
# Each seed goes to a gallery and a container of its own, so no run reuses another's blob or
# version. Needs Azurite and the Python SDKs in .tools (bash scripts/test.sh installs them) and
# GNU time; the stemcell is generated once into bench/out/ as bench/seed.sh does.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
OLD="${1:?usage: bench/binaries.sh OLD_BIN NEW_BIN}"
NEW="${2:?usage: bench/binaries.sh OLD_BIN NEW_BIN}"
RUNS="${RUNS:-3}"
VHD_MIB="${VHD_MIB:-2048}"
FRACTION="${FRACTION:-0.25}"
out="$root/bench/out"
mkdir -p "$out"
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
S="$out/stemcell-${VHD_MIB}m-${FRACTION}.tgz"
if [ ! -s "$S" ]; then
  echo "== generating $S (${VHD_MIB} MiB VHD, ${FRACTION} random data; once)" >&2
  cargo run --release --quiet --example gen_stemcell -- --out "$S" --vhd-mib "$VHD_MIB" --data-fraction "$FRACTION" >&2
fi

start_azurite
# One emulator (the new build's) serves ARM for both: the thing measured is the client.
start_emulator "$NEW"

cat "$S" > /dev/null # warm the page cache
timed() { # LABEL CMD...: appends "LABEL SECONDS RSS_KIB" to $out/binaries.tsv
  local label="$1"; shift
  /usr/bin/time -f "$label %e %M" -a -o "$out/binaries.tsv" "$@" > /dev/null
}
: > "$out/binaries.tsv"
for i in $(seq "$RUNS"); do
  for side in old new; do
    bin="$OLD"; [ "$side" = new ] && bin="$NEW"
    timed "inspect-$side" "$bin" -q inspect "$S"
    g="bench_${side}_$i"
    make_gallery "$g"
    timed "seed-$side" "$bin" -q --output json --arm-endpoint "$ARM" --blob-endpoint "$BLOB" \
      --auth emulator --subscription "$SUB" --resource-group bench-rg --gallery "$g" \
      --location westeurope seed "$S" --container "run-$side-$i"
  done
done

"$PY" - "$out/binaries.tsv" "$OLD" "$NEW" "$S" <<'PYEOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
med = lambda k, i: statistics.median(float(r[i]) for r in rows if r[0] == k)
print(f"stemcell: {sys.argv[4]}")
print(f"old: {sys.argv[2]}\nnew: {sys.argv[3]}")
print(f"{'':10}{'old s':>9}{'new s':>9}{'new/old':>9}{'old MiB':>9}{'new MiB':>9}")
for what in ("inspect", "seed"):
    o, n = med(f"{what}-old", 1), med(f"{what}-new", 1)
    ro, rn = med(f"{what}-old", 2) / 1024, med(f"{what}-new", 2) / 1024
    print(f"{what:10}{o:9.2f}{n:9.2f}{n / o:9.2f}{ro:9.1f}{rn:9.1f}")
PYEOF
