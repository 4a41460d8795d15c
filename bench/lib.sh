# Shared by the bench scripts that need storage and ARM: source it after setting `root` and
# `out`. Defines TOOLS/AZURITE/PY, the cleanup trap, and:
#   start_azurite          sets BLOB (a fresh in-memory Azurite on a free port)
#   start_emulator BIN     sets ARM (BIN's own emulator on a free port)
#   make_gallery NAME      PUT gallery NAME into subscription $SUB, resource group bench-rg
TOOLS="${STEMCELL_GALLERY_TOOLS:-$root/.tools}"
AZURITE="$TOOLS/node_modules/.bin/azurite-blob"
PY="$TOOLS/venv/bin/python"
[ -x "$AZURITE" ] && [ -x "$PY" ] || { echo "bench needs Azurite and the Python SDKs in $TOOLS: run bash scripts/test.sh once" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "bench needs /usr/bin/time (GNU time)" >&2; exit 1; }
SUB=00000000-0000-0000-0000-000000000000

pids=()
bench_cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$out/tmp"; }
trap bench_cleanup EXIT

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --skipApiVersionCheck: the Azure SDK for Rust 1.x sends x-ms-version 2026-04-06, newer than
# Azurite 3.35 knows (README Troubleshooting).
start_azurite() {
  local port log="$out/azurite.log"
  port="$(free_port)"
  "$AZURITE" --inMemoryPersistence --blobHost 127.0.0.1 --blobPort "$port" --loose \
    --disableTelemetry --skipApiVersionCheck > "$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do grep -q "successfully listens" "$log" && break; sleep 0.1; done
  grep -q "successfully listens" "$log" || { cat "$log" >&2; exit 1; }
  BLOB="http://127.0.0.1:$port/devstoreaccount1"
}

start_emulator() {
  local ready="$out/emulator.json"
  : > "$ready"
  "$1" -q emulator --listen 127.0.0.1:0 > "$ready" &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$ready" ] && break; sleep 0.1; done
  ARM="$("$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["arm"])' "$ready")"
}

make_gallery() {
  curl -fsS -X PUT -H 'Authorization: Bearer bench' -H 'Content-Type: application/json' \
    -d '{"location":"westeurope"}' \
    "$ARM/subscriptions/$SUB/resourceGroups/bench-rg/providers/Microsoft.Compute/galleries/$1?api-version=2023-07-03" > /dev/null
}
