#!/usr/bin/env bash
# Wall time of `stemcell-gallery cpi` answering `info` (process start to exit), N runs.
# Uses the release binary when present, else the debug one (says which). No Azure is contacted:
# info builds no client and resolves no credential.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-20}
BIN=target/release/stemcell-gallery
[ -x "$BIN" ] || BIN=target/debug/stemcell-gallery
[ -x "$BIN" ] || { echo "build first: cargo build" >&2; exit 1; }
REQ='{"method":"info","arguments":[],"context":{"director_uuid":"d"},"api_version":2}'
echo "binary: $BIN"
"$BIN" cpi <<<"$REQ" >/dev/null   # warm the page cache
times=()
for _ in $(seq "$RUNS"); do
  s=$(date +%s%N)
  "$BIN" cpi <<<"$REQ" >/dev/null 2>&1
  e=$(date +%s%N)
  times+=($(( (e - s) / 1000 )))
done
printf '%s\n' "${times[@]}" | sort -n | awk -v runs="$RUNS" '
  { t[NR] = $1 }
  END { printf "runs %d  min %.2f ms  median %.2f ms  max %.2f ms\n", runs, t[1]/1000, t[int((NR+1)/2)]/1000, t[NR]/1000 }'
