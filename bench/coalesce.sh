#!/usr/bin/env bash
# N directors (default 8) run `stemcell-gallery cpi` create_stemcell of one stemcell at once,
# against the emulator with slow gallery version writes (each PUT/PATCH operation lasts
# WRITE_S seconds, default 10; Azure's tags-only PATCH took 2.5 min), side by side in one run:
#
# (off) STEMCELL_GALLERY_COALESCE=0: every director takes the version's lock and writes its own
#       reference (the behaviour before issue 15 item 5);
# (on)  the default: directors that find the lock taken hand their reference to its holder.
#
#   bash bench/coalesce.sh                 # the release binary if built, else the debug one
#   N=8 WRITE_S=10 ORDER="off on" bash bench/coalesce.sh
#
# Each side gets its own gallery in the same emulator. Reports wall time (first start to last
# exit), version writes (PUT/PATCH in the emulator's request log), both in units of WRITE_S, and
# the ratio on/off. Goal: on finishes in about 1-2 writes (<= 3 x WRITE_S), all N references kept.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${N:-8}"
WRITE_S="${WRITE_S:-10}"
ORDER="${ORDER:-off on}"
BIN=target/release/stemcell-gallery
[ -x "$BIN" ] || BIN=target/debug/stemcell-gallery
[ -x "$BIN" ] || { echo "build first: cargo build" >&2; exit 1; }
command -v jq > /dev/null || { echo "bench needs jq" >&2; exit 1; }
out="bench/out/coalesce"
rm -rf "$out"
mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# What bosh hands the CPI: the extracted image and stemcell.MF's cloud_properties (as the
# tool's own inspect reads them).
S=fixtures/stemcells/gen1-x86_64.tgz
tar -xzf "$S" -C "$out" image 2>/dev/null || tar -xzf "$S" -C "$out" ./image
IMAGE="$(pwd)/$out/image"
CLOUD="$("$BIN" -q --output json inspect "$S" | jq -c .cloud_properties)"

echo "binary: $BIN" >&2
"$BIN" -q emulator --listen 127.0.0.1:0 > "$out/emulator.json" &
pids+=($!)
for _ in $(seq 100); do [ -s "$out/emulator.json" ] && break; sleep 0.1; done
ARM="$(jq -r .arm "$out/emulator.json")"
BLOB="$(jq -r .blob "$out/emulator.json")"
SUB=00000000-0000-0000-0000-000000000000
curl -fsS -X PUT -H 'Content-Type: application/json' -d "{\"version_write_ms\": $((WRITE_S * 1000))}" \
  "$ARM/_emulator/timing" > /dev/null

side() { # side NAME ENV...: N create_stemcell at once in gallery bench_NAME; prints "wall writes refs"
  local name="$1"; shift
  local gallery="bench_$name"
  curl -fsS -X PUT -H 'Authorization: Bearer bench' -H 'Content-Type: application/json' \
    -d '{"location":"westeurope"}' \
    "$ARM/subscriptions/$SUB/resourceGroups/bench-rg/providers/Microsoft.Compute/galleries/$gallery?api-version=2023-07-03" > /dev/null
  local start end
  start=$(date +%s%N)
  local runs=()
  for i in $(seq "$N"); do
    env "$@" "$BIN" -q --arm-endpoint "$ARM" --blob-endpoint "$BLOB" --auth emulator \
      --subscription "$SUB" --resource-group bench-rg --gallery "$gallery" --location westeurope cpi \
      <<< "{\"method\":\"create_stemcell\",\"arguments\":[\"$IMAGE\",$CLOUD,{\"tags\":{}}],\"context\":{\"director_uuid\":\"d-$i\",\"request_id\":\"cpi-$name-$i\"},\"api_version\":2}" \
      > "$out/$name-$i.json" 2> "$out/$name-$i.log" &
    runs+=($!)
  done
  local failed=0
  for p in "${runs[@]}"; do wait "$p" || failed=$((failed + 1)); done
  end=$(date +%s%N)
  local ok
  ok=$(cat "$out/$name"-*.json | jq -s '[.[] | select(.error == null and (.result | type) == "string")] | length')
  local writes
  writes=$(curl -fsS "$ARM/_emulator/requests" | jq --arg g "/galleries/$gallery/" \
    '[.requests[] | select(.service == "arm" and (.method == "PUT" or .method == "PATCH") and (.path | contains($g)) and (.path | contains("/versions/")))] | length')
  local refs
  refs=$(curl -fsS -H 'Authorization: Bearer bench' \
    "$ARM/subscriptions/$SUB/resourceGroups/bench-rg/providers/Microsoft.Compute/galleries/$gallery/images/bosh-azure-hyperv-ubuntu-jammy-go_agent/versions/1.506.0?api-version=2023-07-03" \
    | jq '[.tags | to_entries[] | select(.key | startswith("sg_refs_")) | .value | split(",")[] | select(. != "")] | unique | length')
  echo "$(( (end - start) / 1000000 )) $writes $refs $ok $failed"
}

declare -A wall writes refs ok
for s in $ORDER; do
  echo "== $s: $N x create_stemcell, version writes of $WRITE_S s" >&2
  if [ "$s" = off ]; then r=$(side off STEMCELL_GALLERY_COALESCE=0); else r=$(side on STEMCELL_GALLERY_COALESCE=1); fi
  read -r w n f k _ <<< "$r"
  wall[$s]=$w; writes[$s]=$n; refs[$s]=$f; ok[$s]=$k
done
echo
printf '%-5s %10s %12s %14s %12s\n' side wall "x WRITE_S" "version writes" "references"
for s in $ORDER; do
  printf '%-5s %9.1fs %12.2f %14d %9d/%d   (%d/%d exit ok)\n' "$s" "$(awk -v w="${wall[$s]}" 'BEGIN {print w / 1000}')" \
    "$(awk -v w="${wall[$s]}" -v d="$WRITE_S" 'BEGIN {print w / 1000 / d}')" "${writes[$s]}" "${refs[$s]}" "$N" "${ok[$s]}" "$N"
done
if [ -n "${wall[on]:-}" ] && [ -n "${wall[off]:-}" ]; then
  awk -v on="${wall[on]}" -v off="${wall[off]}" 'BEGIN {printf "ratio on/off: %.2f (wall), speed-up %.1fx\n", on / off, off / on}'
fi
