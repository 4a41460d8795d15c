#!/usr/bin/env bash
# inspect vs the shell pipeline that merely extracts root.vhd, on a 2 GiB VHD with 25% random data.
#
#   bash bench/inspect.sh            # generates bench/out/stemcell-2g.tgz once, builds release, runs
#   RUNS=5 VHD_MIB=4096 bash bench/inspect.sh
#
# Peer: tar -xzOf S image | tar -xzO root.vhd > /dev/null (two inflates, no hashing, no zero scan).
# Goal: inspect <= 1.1x the peer's wall time, and inspect's peak RSS < 64 MiB.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
RUNS="${RUNS:-3}"
VHD_MIB="${VHD_MIB:-2048}"
FRACTION="${FRACTION:-0.25}"
out="$root/bench/out"
mkdir -p "$out"
S="$out/stemcell-${VHD_MIB}m-${FRACTION}.tgz"

if [ ! -s "$S" ]; then
  echo "== generating $S (${VHD_MIB} MiB VHD, ${FRACTION} random data; once)" >&2
  cargo run --release --quiet --example gen_stemcell -- --out "$S" --vhd-mib "$VHD_MIB" --data-fraction "$FRACTION" >&2
fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  echo "== building release" >&2
  cargo build --release --quiet
fi
BIN="$root/target/release/stemcell-gallery"
[ -x /usr/bin/time ] || { echo "bench needs /usr/bin/time (GNU time)" >&2; exit 1; }

ls -l "$S" >&2
echo "== warm the page cache" >&2
cat "$S" > /dev/null

# Runs "$@" RUNS times under GNU time; prints the median wall seconds and the max peak RSS (KiB).
measure() {
  local walls=() rss_max=0 log
  log="$(mktemp)"
  for _ in $(seq "$RUNS"); do
    /usr/bin/time -f '%e %M' -o "$log" "$@" > /dev/null
    read -r wall rss < "$log"
    walls+=("$wall")
    [ "$rss" -gt "$rss_max" ] && rss_max="$rss"
  done
  rm -f "$log"
  printf '%s\n' "${walls[@]}" | sort -n | awk -v rss="$rss_max" '{a[NR]=$1} END {printf "%s %s\n", a[int((NR+1)/2)], rss}'
}

if command -v hyperfine >/dev/null; then
  hyperfine --warmup 1 --runs "$RUNS" \
    "tar -xzOf '$S' image | tar -xzO root.vhd > /dev/null" \
    "'$BIN' inspect '$S' > /dev/null"
fi

echo "== peer: tar -xzOf S image | tar -xzO root.vhd > /dev/null ($RUNS runs)" >&2
read -r peer_s peer_rss < <(measure bash -c "tar -xzOf '$S' image | tar -xzO root.vhd > /dev/null")
echo "== inspect ($RUNS runs)" >&2
read -r ours_s ours_rss < <(measure "$BIN" -q inspect "$S")
"$BIN" -q --output json inspect "$S" > "$out/inspect.json"

ratio=$(awk -v a="$ours_s" -v b="$peer_s" 'BEGIN {printf "%.2f", a / b}')
rss_mib=$(awk -v k="$ours_rss" 'BEGIN {printf "%.1f", k / 1024}')
echo
echo "stemcell:          $S ($(stat -c %s "$S") bytes)"
echo "peer pipeline:     ${peer_s} s (median of $RUNS)"
echo "inspect:           ${ours_s} s (median of $RUNS; hashes SHA-1 + SHA-256 and scans for zeros too)"
echo "ratio:             ${ratio}x (goal <= 1.10x)"
echo "inspect peak RSS:  ${rss_mib} MiB (goal < 64 MiB)"
echo "inspect says:      $(grep -o '"mib_per_s":[0-9.]*' "$out/inspect.json")"
awk -v r="$ratio" -v m="$rss_mib" 'BEGIN {exit !(r <= 1.10 && m < 64)}' \
  && echo "result:            goals met" || { echo "result:            goal missed"; exit 1; }
