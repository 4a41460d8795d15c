#!/usr/bin/env bash
# The ledger simulator (issue 44 item 8; src/gallery/sim): seeds that each choose a run of
# commands, their interleaving, a plain Azure CPI's writes, outside changes and faults over the
# real gallery service and in-memory fakes, every step checked against the ledger's promises.
#
#   scripts/simulate.sh [--seeds N] [--seed S] [--without a,b]
#
#   --seeds N     run seeds 0..N (default 200)
#   --seed S      replay seed S and print its trace (same seed, same trace)
#   --without L   leave kinds of trouble out (comma list of: shared recreate failed intent tamper
#                 late cpi crash lease storm), to see what the rest finds
#
# Prints per command and per fault kind how often each ran, and ends with
# "N seeds, K violations"; exits 1 (with the first failing seed's trace) when K > 0.
# Builds in CARGO_TARGET_DIR when set (cargo's own default otherwise).
set -euo pipefail

seeds=200
seed=""
without=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) seeds="${2:?--seeds needs a number}"; shift 2 ;;
    --seed) seed="${2:?--seed needs a number}"; shift 2 ;;
    --without) without="${2:?--without needs a list}"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "simulate.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
export SIM_SEEDS="$seeds" SIM_WITHOUT="$without"
if [ -n "$seed" ]; then
  export SIM_SEED="$seed"
else
  unset SIM_SEED
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --lib gallery::sim::ledger_simulation -- --ignored --nocapture --test-threads 1 >"$log" 2>&1 || status=$?
# The simulator's own report, from its first line to "N seeds, K violations" (cargo's and the
# test harness's lines left out).
awk '/^without:|^ledger simulator:|^seed [0-9]+: [0-9]+ galler/ { p = 1 } p { print } / seeds, [0-9]+ violations$/ { exit }' "$log"
if ! grep -q 'seeds, [0-9]* violations$' "$log"; then
  # It did not get as far as its report: show why (a build error, a panic).
  tail -n 60 "$log" >&2
  exit 1
fi
if grep -q 'seeds, 0 violations$' "$log" && [ "$status" -eq 0 ]; then
  exit 0
fi
exit 1
