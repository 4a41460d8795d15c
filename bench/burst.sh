#!/usr/bin/env bash
# A burst of reference writers under Azure's shape (issue 33): N processes (default 8) run
# `seed --reference` of one stemcell whose version exists, at the same moment, against the
# emulator's `--timing azure --time-scale SCALE` (a tags-only version update 150 s / SCALE,
# Retry-After 60 s / SCALE); the same stemcell seeded by one process alone is "one write".
# Every run is reported, not a median:
#
#   bash bench/burst.sh                     # RUNS=5 N=8 SCALE=30; BIN defaults to the release build, else debug
#   BIN=/path/to/stemcell-gallery BEFORE=/path/to/an/older/stemcell-gallery bash bench/burst.sh
#
# Each run gets a gallery of its own: one `seed` (no reference) creates the version, then, in this
# order: the single writer with BEFORE (when given), the single writer, the burst with BEFORE
# (when given), the burst. A burst is timed from its first start to its last exit; "writes" are
# the version PATCHes/PUTs the emulator served during it; "recorded" counts the burst's
# references on the version afterwards. Goal (issue 33): every run records all N and its burst
# takes <= 1.5 x the single writer; the single writer no slower than BEFORE's.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
RUNS="${RUNS:-5}"
N="${N:-8}"
SCALE="${SCALE:-30}"
BIN="${BIN:-}"
if [ -z "$BIN" ]; then
  BIN="${CARGO_TARGET_DIR:-$root/target}/release/stemcell-gallery"
  [ -x "$BIN" ] || BIN="${CARGO_TARGET_DIR:-$root/target}/debug/stemcell-gallery"
fi
[ -x "$BIN" ] || { echo "build first: cargo build (or set BIN)" >&2; exit 1; }
BEFORE="${BEFORE:-}"
[ -z "$BEFORE" ] || [ -x "$BEFORE" ] || { echo "BEFORE=$BEFORE is not an executable" >&2; exit 1; }
command -v jq > /dev/null || { echo "bench needs jq" >&2; exit 1; }
out="$root/bench/out/burst"
rm -rf "$out"
mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

S=fixtures/stemcells/gen1-x86_64.tgz
DEFINITION=bosh-azure-hyperv-ubuntu-jammy-go_agent
VERSION=1.506.0
"$BIN" -q emulator --listen 127.0.0.1:0 --timing azure --time-scale "$SCALE" > "$out/emulator.json" &
pids+=($!)
for _ in $(seq 100); do [ -s "$out/emulator.json" ] && break; sleep 0.1; done
ARM="$(jq -r .arm "$out/emulator.json")"
BLOB="$(jq -r .blob "$out/emulator.json")"
SUB=00000000-0000-0000-0000-000000000000
owner=(-H 'Authorization: Bearer bench' -H 'Content-Type: application/json')
ms() { echo $(( $(date +%s%N) / 1000000 )); }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b - a) / 1000}'; }
tool() { # tool BIN GALLERY ARGS...
  local bin="$1" gallery="$2"; shift 2
  "$bin" --output json --arm-endpoint "$ARM" --blob-endpoint "$BLOB" --auth emulator \
    --subscription "$SUB" --resource-group bench-rg --location westeurope --gallery "$gallery" "$@"
}
version_url() {
  echo "$ARM/subscriptions/$SUB/resourceGroups/bench-rg/providers/Microsoft.Compute/galleries/$1/images/$DEFINITION/versions/$VERSION?api-version=2023-07-03"
}
references() { # references GALLERY: this tool's references on the version, one a line
  curl -fsS "${owner[@]}" "$(version_url "$1")" \
    | jq -r '.tags | to_entries[] | select(.key | startswith("sg_overflow_refs_")) | .value | split(",")[] | select(. != "")'
}
writes() { # writes GALLERY: version PUTs/PATCHes served so far
  curl -fsS "$ARM/_emulator/requests" | jq --arg g "/galleries/$1/" \
    '[.requests[] | select(.service == "arm" and (.method == "PUT" or .method == "PATCH") and (.path | contains($g)) and (.path | contains("/versions/")))] | length'
}
single() { # single BIN GALLERY REF: prints seconds
  local t0 t1
  t0=$(ms)
  tool "$1" "$2" seed "$S" --reference "$3" > "$out/$3.json" 2> "$out/$3.log" || { echo "single writer $3 failed: $(tail -3 "$out/$3.log")" >&2; exit 1; }
  t1=$(ms)
  secs "$t0" "$t1"
}
burst() { # burst BIN GALLERY PREFIX: prints "seconds writes recorded exit_ok"
  local bin="$1" gallery="$2" prefix="$3" t0 t1 before runs=() ok=0
  before=$(writes "$gallery")
  t0=$(ms)
  for i in $(seq "$N"); do
    tool "$bin" "$gallery" seed "$S" --reference "$prefix-$i" > "$out/$prefix-$i.json" 2> "$out/$prefix-$i.log" &
    runs+=($!)
  done
  for p in "${runs[@]}"; do if wait "$p"; then ok=$((ok + 1)); fi; done
  t1=$(ms)
  local have recorded=0
  have="$(references "$gallery")"
  for i in $(seq "$N"); do grep -qx "$prefix-$i" <<< "$have" && recorded=$((recorded + 1)); done
  echo "$(secs "$t0" "$t1") $(( $(writes "$gallery") - before )) $recorded $ok"
}

echo "binary: $BIN${BEFORE:+; before: $BEFORE}; N=$N SCALE=$SCALE (a tags-only update $(awk -v s="$SCALE" 'BEGIN {print 150 / s}') s); $(uptime)" >&2
met=0
printf '%-4s %9s %9s %9s %9s %7s %10s %6s %9s   %s\n' run single burst ratio writes "ok" recorded goal \
  "${BEFORE:+b.single}" "${BEFORE:+before: burst ratio writes recorded}"
for run in $(seq "$RUNS"); do
  g="burst_$run"
  curl -fsS -X PUT "${owner[@]}" -d '{"location":"westeurope"}' \
    "$ARM/subscriptions/$SUB/resourceGroups/bench-rg/providers/Microsoft.Compute/galleries/$g?api-version=2023-07-03" > /dev/null
  tool "$BIN" "$g" seed "$S" > "$out/create-$run.json" 2> "$out/create-$run.log"
  bs="" bline=""
  if [ -n "$BEFORE" ]; then bs=$(single "$BEFORE" "$g" "r$run-before-single"); fi
  s=$(single "$BIN" "$g" "r$run-single")
  if [ -n "$BEFORE" ]; then
    read -r bw bn bf bk <<< "$(burst "$BEFORE" "$g" "r$run-before")"
    bline="$bw s $(awk -v b="$bw" -v s="$bs" 'BEGIN {printf "%.2f", b / s}')x $bn writes $bf/$N"
  fi
  read -r w n f k <<< "$(burst "$BIN" "$g" "r$run-burst")"
  ratio=$(awk -v b="$w" -v s="$s" 'BEGIN {printf "%.2f", b / s}')
  goal=no
  if [ "$f" = "$N" ] && awk -v r="$ratio" 'BEGIN {exit !(r <= 1.5)}'; then goal=yes; met=$((met + 1)); fi
  printf '%-4s %8ss %8ss %8sx %9s %5s/%s %8s/%s %6s %9s   %s\n' "$run" "$s" "$w" "$ratio" "$n" "$k" "$N" "$f" "$N" "$goal" \
    "${bs:+${bs}s}" "$bline"
done
echo "goal (all $N recorded, burst <= 1.5 x single) met in $met of $RUNS runs; $(uptime)"
