#!/usr/bin/env bash
# The tool against the emulator's Azure timing profile (`emulator --timing azure --time-scale N`:
# REFERENCE.md's recorded durations / N, Retry-After, the delete lag, page blobs held to
# 60 MiB/s x N and 500 requests/s x N with 503 ServerBusy beyond), whole processes:
#
# (a) seed of a generated stemcell (VHD_MIB MiB VHD, FRACTION of it random data) against the
#     profile's floor: (data bytes at 60 MiB/s + the 7.5 min version create) / N. Goal <= 1.1x.
# (b) 8 concurrent `cpi` create_stemcell of one stemcell (a new version): wall time, outcomes.
# (c) the same 8 again (the version exists: 8 reuses): wall time, outcomes.
#
#   bash bench/azure_timing.sh                     # SCALE=30 VHD_MIB=512 FRACTION=0.5 N=8
#   SCALE=60 VHD_MIB=128 PROFILE=debug bash bench/azure_timing.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
SCALE="${SCALE:-30}"
VHD_MIB="${VHD_MIB:-512}"
FRACTION="${FRACTION:-0.5}"
N="${N:-8}"
PROFILE="${PROFILE:-release}"
if [ "$PROFILE" = release ]; then cargo_profile=(--release); else cargo_profile=(); fi
command -v jq > /dev/null || { echo "bench needs jq" >&2; exit 1; }
out="$root/bench/out/azure_timing"
mkdir -p "$out"
S="$root/bench/out/stemcell-${VHD_MIB}m-${FRACTION}.tgz"
if [ ! -s "$S" ]; then
  echo "== generating $S (once)" >&2
  cargo run "${cargo_profile[@]}" --quiet --example gen_stemcell -- --out "$S" --vhd-mib "$VHD_MIB" --data-fraction "$FRACTION" >&2
fi
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build "${cargo_profile[@]}" --quiet
# The build cargo made: under CARGO_TARGET_DIR when it is set, as bench/realistic.sh does.
BIN="${CARGO_TARGET_DIR:-$root/target}/$PROFILE/stemcell-gallery"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

"$BIN" -q emulator --listen 127.0.0.1:0 --timing azure --time-scale "$SCALE" > "$out/emulator.json" &
pids+=($!)
for _ in $(seq 100); do [ -s "$out/emulator.json" ] && break; sleep 0.1; done
ARM="$(jq -r .arm "$out/emulator.json")"
BLOB="$(jq -r .blob "$out/emulator.json")"
SUB=00000000-0000-0000-0000-000000000000
owner=(-H 'Authorization: Bearer bench' -H 'Content-Type: application/json')
for g in bench_seed bench_cpi; do
  curl -fsS -X PUT "${owner[@]}" -d '{"location":"westeurope"}' \
    "$ARM/subscriptions/$SUB/resourceGroups/bench-rg/providers/Microsoft.Compute/galleries/$g?api-version=2023-07-03" > /dev/null
done
curl -fsS -X PUT "${owner[@]}" "$BLOB/stemcell?restype=container" > /dev/null 2>&1 || true
tool=("$BIN" -q --output json --arm-endpoint "$ARM" --blob-endpoint "$BLOB" --auth emulator
  --subscription "$SUB" --resource-group bench-rg --location westeurope)
ms() { echo $(( $(date +%s%N) / 1000000 )); }
# Writes of the version itself (its create PUT and every tags write) in the emulator's request
# log since the last reset: what a burst costs Azure, beside its wall time.
reset_log() { curl -fsS -o /dev/null -X POST "$ARM/_emulator/reset"; }
version_writes() {
  curl -fsS "$ARM/_emulator/requests" | jq '[.requests[] | select((.method == "PUT" or .method == "PATCH") and (.route | endswith("/versions/{version}")))] | length'
}

echo "== (a) seed $S under --timing azure --time-scale $SCALE" >&2
t0=$(ms)
"${tool[@]}" --gallery bench_seed seed "$S" > "$out/seed.json"
t1=$(ms)
data=$(jq -r '.upload.bytes_sent // .bytes_sent // empty' "$out/seed.json")
[ -n "$data" ] || data=$("$BIN" -q --output json inspect "$S" | jq -r '.vhd.data_bytes // .data_bytes')
floor=$(awk -v d="$data" -v n="$SCALE" 'BEGIN {print (d / (60 * 1048576) + 450) / n}')
seed_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {print (b - a) / 1000}')
echo "seed: ${seed_s} s, outcome $(jq -r .outcome "$out/seed.json"), data ${data} bytes, floor ${floor} s, ratio $(awk -v s="$seed_s" -v f="$floor" 'BEGIN {printf "%.2f", s / f}')"

F=fixtures/stemcells/gen1-x86_64.tgz
tar -xzf "$F" -C "$out" image 2>/dev/null || tar -xzf "$F" -C "$out" ./image
IMAGE="$out/image"
CLOUD="$("$BIN" -q --output json inspect "$F" | jq -c .cloud_properties)"
round() { # round NAME: N create_stemcell at once; prints "wall_s ok failed"
  local name="$1" start end runs=() failed=0
  # Only this round's answers count (an earlier run with a larger N left more files).
  rm -f "$out/$name"-*.json "$out/$name"-*.log
  start=$(ms)
  for i in $(seq "$N"); do
    "${tool[@]}" --gallery bench_cpi cpi \
      <<< "{\"method\":\"create_stemcell\",\"arguments\":[\"$IMAGE\",$CLOUD,{\"tags\":{}}],\"context\":{\"director_uuid\":\"d-$name-$i\",\"request_id\":\"cpi-$name-$i\"},\"api_version\":2}" \
      > "$out/$name-$i.json" 2> "$out/$name-$i.log" &
    runs+=($!)
  done
  for p in "${runs[@]}"; do wait "$p" || failed=$((failed + 1)); done
  end=$(ms)
  local ok
  ok=$(cat "$out/$name"-*.json | jq -s '[.[] | select(.error == null and (.result | type) == "string")] | length')
  echo "$(awk -v a="$start" -v b="$end" 'BEGIN {print (b - a) / 1000}') $ok $failed"
}
echo "== (b) $N concurrent create_stemcell of one new stemcell" >&2
reset_log
read -r w ok failed <<< "$(round create)"
one=$(awk -v n="$SCALE" 'BEGIN {print 450 / n}')
echo "creates: ${w} s, ${ok}/${N} returned a CID, ${failed} exited non-zero; $(version_writes) version writes (1 create + tags writes); ratio to one version create (${one} s): $(awk -v w="$w" -v o="$one" 'BEGIN {printf "%.2f", w / o}')x"
echo "== (c) $N concurrent create_stemcell of the same stemcell again (reuse)" >&2
reset_log
read -r w ok failed <<< "$(round reuse)"
echo "reuses: ${w} s, ${ok}/${N} returned a CID, ${failed} exited non-zero; $(version_writes) version writes (one tags-only update: $(awk -v n="$SCALE" 'BEGIN {print 150 / n}') s)"
refs=$(curl -fsS "${owner[@]}" \
  "$ARM/subscriptions/$SUB/resourceGroups/bench-rg/providers/Microsoft.Compute/galleries/bench_cpi/images/bosh-azure-hyperv-ubuntu-jammy-go_agent/versions/1.506.0?api-version=2023-07-03" \
  | jq '[.tags | to_entries[] | select((.key | startswith("sg_overflow_refs_")) or .key == "stemcell_references") | .value | split(",")[] | select(. != "" and (startswith("sg-held-") | not))] | unique | length')
echo "references on the version: ${refs} (expected $((2 * N)))"
