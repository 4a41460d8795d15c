#!/usr/bin/env bash
# inspect and seed on a stemcell that compresses like a real one, against the tar pipeline and
# against each other (issue 16 item 5).
#
#   bash bench/realistic.sh                      # RUNS=3 VHD_MIB=2048 FRACTION=0.5 CORPUS=/usr
#   BEFORE=/path/to/older/stemcell-gallery bash bench/realistic.sh   # also time an older build's seed
#   SKIP_BUILD=1 bash bench/realistic.sh
#
# The stemcell (generated once into bench/out/, gitignored): a 2 GiB fixed VHD whose data blocks
# (50%, 1 MiB each) are cut from the first 256 MiB of the machine's own files under $CORPUS, so the
# image deflates like a root file system (about 2.6:1 here) instead of not at all (random data).
# Timed in the same run, RUNS times each, medians reported:
#   peer:    tar -xzOf S image | tar -xzO root.vhd > /dev/null   (two inflates, nothing else)
#   inspect: stemcell-gallery inspect S                            (the same + hashes, zero scan, checks)
#   seed:    stemcell-gallery seed S into a fresh gallery each run (ARM and blobs: the tool's own
#            emulator in another process, so the sink is not the bottleneck)
# Goal: seed <= 1.3x inspect.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
RUNS="${RUNS:-3}"
VHD_MIB="${VHD_MIB:-2048}"
FRACTION="${FRACTION:-0.5}"
CORPUS="${CORPUS:-/usr}"
out="$root/bench/out"
mkdir -p "$out"
S="$out/stemcell-${VHD_MIB}m-usr-${FRACTION}.tgz"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  echo "== building release" >&2
  # Two builds: the example needs the library's test-support feature (through the
  # dev-dependency), which one shared build would also compile into the measured binary.
  cargo build --release --quiet --bin stemcell-gallery
  cargo build --release --quiet --example gen_stemcell
fi
target="${CARGO_TARGET_DIR:-$root/target}"
BIN="$target/release/stemcell-gallery"
if [ ! -s "$S" ]; then
  echo "== generating $S (${VHD_MIB} MiB VHD, ${FRACTION} data from $CORPUS; once)" >&2
  "$target/release/examples/gen_stemcell" --out "$S" --vhd-mib "$VHD_MIB" \
    --data-fraction "$FRACTION" --corpus-dir "$CORPUS" --corpus-mib 256 >&2
fi
[ -x /usr/bin/time ] || { echo "bench needs /usr/bin/time (GNU time)" >&2; exit 1; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
"$BIN" -q emulator --listen 127.0.0.1:0 > "$out/realistic-emulator.json" &
pids+=($!)
for _ in $(seq 100); do [ -s "$out/realistic-emulator.json" ] && break; sleep 0.1; done
read -r ARM BLOB < <(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(d["arm"], d["blob"])' "$out/realistic-emulator.json")
SUB=00000000-0000-0000-0000-000000000000

RG=bosh-rg   # the resource group the emulator's development account lives in
# new_gallery NAME: an empty gallery, so every seed run uploads.
new_gallery() {
  curl -fsS -X PUT -H 'Authorization: Bearer bench' -H 'Content-Type: application/json' \
    -d '{"location":"westeurope"}' \
    "$ARM/subscriptions/$SUB/resourceGroups/$RG/providers/Microsoft.Compute/galleries/$1?api-version=2023-07-03" > /dev/null
}
# seed_cmd BIN GALLERY: the seed command line, with a container of its own (no blob to reuse).
seed_cmd() {
  echo "$1" -q --output json --arm-endpoint "$ARM" --blob-endpoint "$BLOB" --auth emulator \
    --subscription "$SUB" --resource-group "$RG" --gallery "$2" --location westeurope seed "$S" \
    --container "${2//_/-}"
}

ls -l "$S" >&2
cat "$S" > /dev/null
# time_one CMD...: wall seconds of one run.
time_one() {
  local log; log="$(mktemp)"
  /usr/bin/time -f '%e' -o "$log" "$@" > "$out/realistic-last.json" \
    || { echo "failed: $* ($(cat "$out/realistic-last.json"))" >&2; echo FAIL; return; }
  tail -1 "$log"; rm -f "$log"
}
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

peer=(); insp=(); seed=(); before=()
for i in $(seq "$RUNS"); do
  echo "== run $i/$RUNS" >&2
  peer+=("$(time_one bash -c "tar -xzOf '$S' image | tar -xzO root.vhd > /dev/null")")
  insp+=("$(time_one "$BIN" -q inspect "$S")")
  new_gallery "bench_${i}_new"
  # shellcheck disable=SC2046
  seed+=("$(time_one $(seed_cmd "$BIN" "bench_${i}_new"))")
  grep -q '"uploaded":true' "$out/realistic-last.json" || { echo "seed did not upload" >&2; exit 1; }
  if [ -n "${BEFORE:-}" ]; then
    new_gallery "bench_${i}_before"
    # shellcheck disable=SC2046
    before+=("$(time_one $(seed_cmd "$BEFORE" "bench_${i}_before"))")
    grep -q '"uploaded":true' "$out/realistic-last.json" || { echo "BEFORE seed did not upload" >&2; exit 1; }
  fi
done
case " ${peer[*]} ${insp[*]} ${seed[*]} ${before[*]} " in *FAIL*) echo "a run failed (see above)" >&2; exit 1 ;; esac
p=$(median "${peer[@]}"); i=$(median "${insp[@]}"); s=$(median "${seed[@]}")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
echo
echo "stemcell:         $S ($(stat -c %s "$S") bytes)"
echo "peer (tar | tar): ${p} s   (runs: ${peer[*]})"
echo "inspect:          ${i} s   (runs: ${insp[*]})"
echo "seed:             ${s} s   (runs: ${seed[*]})"
if [ -n "${BEFORE:-}" ]; then
  b=$(median "${before[@]}")
  echo "seed (BEFORE):    ${b} s   (runs: ${before[*]}; $BEFORE)"
  echo "before/inspect:   $(ratio "$b" "$i")"
fi
echo "inspect/peer:     $(ratio "$i" "$p")"
echo "seed/peer:        $(ratio "$s" "$p")"
echo "seed/inspect:     $(ratio "$s" "$i") (goal <= 1.30)"
awk -v x="$(ratio "$s" "$i")" 'BEGIN {exit !(x <= 1.30)}' && echo "result:           goal met" || echo "result:           goal missed"
