#!/usr/bin/env bash
# migrate against its only peer, uploading every stemcell again (issue 47 item 3).
#
#   bash bench/migrate.sh                         # N=8 VHD_MIB=256 FRACTION=0.25 PARALLEL=4
#   PROFILE=debug SKIP_BUILD=1 bash bench/migrate.sh
#
# A director that ran before the gallery holds N stemcells, each the page blob
# stemcell/<cid>.vhd the plain Azure CPI left (the stemcell's root.vhd, cloud properties as
# metadata). Timed in one run, against the tool's own emulator in another process:
#   peer:    N x `seed S` (each stemcell uploaded again, PARALLEL at once): what an operator does
#            without migrate, under new CIDs
#   migrate: `migrate --director-stemcells H=LIST --apply --parallel PARALLEL`: versions made from
#            the blobs already there, the CIDs kept
# and the requests each made, per stemcell, from the emulator's request log (ARM and blob).
# Stemcells are generated once into bench/out/migrate/ (gitignored) with examples/gen_stemcell.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
N="${N:-8}"
VHD_MIB="${VHD_MIB:-256}"
FRACTION="${FRACTION:-0.25}"
PARALLEL="${PARALLEL:-4}"
PROFILE="${PROFILE:-release}"
out="$root/bench/out/migrate"
mkdir -p "$out"
target="${CARGO_TARGET_DIR:-$root/target}"
flag=(); [ "$PROFILE" = release ] && flag=(--release)
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  echo "== building ($PROFILE)" >&2
  cargo build "${flag[@]}" --quiet --bin stemcell-gallery
  cargo build "${flag[@]}" --quiet --example gen_stemcell
fi
BIN="$target/$PROFILE/stemcell-gallery"
GEN="$target/$PROFILE/examples/gen_stemcell"
[ -x /usr/bin/time ] || { echo "bench needs /usr/bin/time (GNU time)" >&2; exit 1; }
for i in $(seq "$N"); do
  s="$out/s$i-${VHD_MIB}m-$FRACTION.tgz"
  [ -s "$s" ] || "$GEN" --out "$s" --vhd-mib "$VHD_MIB" --data-fraction "$FRACTION" --version "'1.$((600 + i))'" --seed "$i" > /dev/null
done

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
"$BIN" -q emulator --listen 127.0.0.1:0 --world fixtures/worlds/consumers.json > "$out/emulator.json" &
pids+=($!)
for _ in $(seq 100); do [ -s "$out/emulator.json" ] && break; sleep 0.1; done
read -r ARM BLOB < <(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(d["arm"], d["blob"])' "$out/emulator.json")
SUB=00000000-0000-0000-0000-000000000000
RG=bosh-rg
AUTH='Authorization: Bearer stemcell-gallery-emulator-dev-token'
curl -fsS -X PUT -H "$AUTH" -H 'Content-Type: application/json' -d '{"location":"westeurope"}' \
  "$ARM/subscriptions/$SUB/resourceGroups/$RG/providers/Microsoft.Compute/galleries/peer?api-version=2023-07-03" > /dev/null
g=(-q --output json --arm-endpoint "$ARM" --blob-endpoint "$BLOB" --auth emulator --subscription "$SUB" --resource-group "$RG")

# The director's blobs, as the plain CPI left them (uploaded sparse here: not timed).
curl -fsS -o /dev/null -X PUT -H "$AUTH" "$BLOB/stemcell?restype=container"
python3 - "$BLOB" "$out" "$N" "$VHD_MIB" "$FRACTION" <<'PY'
import io, json, sys, tarfile, urllib.request
blob, out, n, mib, fraction = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
auth = {"Authorization": "Bearer stemcell-gallery-emulator-dev-token"}
def put(url, data=b"", headers=None):
    req = urllib.request.Request(url, data=data, method="PUT", headers={**auth, **(headers or {})})
    urllib.request.urlopen(req).read()
rows = []
for i in range(1, n + 1):
    with tarfile.open(f"{out}/s{i}-{mib}m-{fraction}.tgz") as outer:
        manifest = outer.extractfile("stemcell.MF").read().decode()
        image = outer.extractfile("image").read()
    with tarfile.open(fileobj=io.BytesIO(image)) as inner:
        vhd = inner.extractfile("root.vhd").read()
    version = f"1.{600 + i}"
    cid = f"bosh-stemcell-{i:08d}-0000-4000-8000-000000000000"
    url = f"{blob}/stemcell/{cid}.vhd"
    meta = {"x-ms-meta-name": "bosh-azure-hyperv-ubuntu-jammy-go_agent", "x-ms-meta-version": version,
            "x-ms-meta-os_type": "linux", "x-ms-meta-hypervisor": "hyperv", "x-ms-meta-architecture": "x86_64"}
    put(url, headers={"x-ms-blob-type": "PageBlob", "x-ms-blob-content-length": str(len(vhd)), **meta})
    step = 4 << 20
    for off in range(0, len(vhd), step):
        chunk = vhd[off:off + step]
        if chunk.count(0) != len(chunk):
            put(url + "?comp=page", chunk, {"x-ms-page-write": "update", "x-ms-range": f"bytes={off}-{off + len(chunk) - 1}",
                                             "Content-Type": "application/octet-stream"})
    rows.append({"name": "bosh-azure-hyperv-ubuntu-jammy-go_agent", "version": version, "os": "ubuntu-jammy", "cpi": "", "cid": cid})
doc = {"Tables": [{"Content": "stemcells", "Header": {"name": "Name", "version": "Version", "os": "OS", "cpi": "CPI", "cid": "CID"},
       "Rows": rows, "Notes": []}], "Blocks": None, "Lines": []}
open(f"{out}/director.json", "w").write(json.dumps(doc))
PY

reset() { curl -fsS -o /dev/null -X POST "$ARM/_emulator/reset"; }
requests() { curl -fsS "$ARM/_emulator/requests" | python3 -c 'import json,sys; r=json.load(sys.stdin)["requests"]; print(sum(x["service"]=="arm" for x in r), sum(x["service"]=="blob" for x in r))'; }
secs() { /usr/bin/time -f '%e' -o "$out/time" "$@" > "$out/last.json" || { cat "$out/last.json" >&2; exit 1; }; cat "$out/time"; }

echo "== peer: $N x seed (PARALLEL=$PARALLEL)" >&2
reset
peer_s=$(secs bash -c "ls $out/s*-${VHD_MIB}m-$FRACTION.tgz | head -$N | xargs -P $PARALLEL -I{} $BIN ${g[*]} --gallery peer seed {} --container peer > $out/seeds.json")
read -r peer_arm peer_blob < <(requests)
peer_bytes=$(curl -fsS "$ARM/_emulator/requests" | python3 -c 'import json,sys; print(sum(1 for x in json.load(sys.stdin)["requests"] if x["query"].startswith("comp=page")))')

echo "== migrate dry run, then --apply" >&2
H=6a7f1c52-3b8e-4d09-9e61-5f2a7b3c8d94
reset
dry_s=$(secs "$BIN" "${g[@]}" --gallery bosh_stemcells migrate --director-stemcells "$H=$out/director.json" --parallel "$PARALLEL")
read -r dry_arm dry_blob < <(requests)
reset
mig_s=$(secs "$BIN" "${g[@]}" --gallery bosh_stemcells migrate --director-stemcells "$H=$out/director.json" --apply --parallel "$PARALLEL")
read -r mig_arm mig_blob < <(requests)
created=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sum(s["result"]=="created" for s in d["stemcells"]))' "$out/last.json")
[ "$created" = "$N" ] || { echo "migrate created $created of $N" >&2; cat "$out/last.json" >&2; exit 1; }

per() { python3 -c "print(f'{$1/$N:.1f}')"; }
echo
echo "N=$N stemcells, ${VHD_MIB} MiB VHD, ${FRACTION} data, PARALLEL=$PARALLEL, $PROFILE build"
printf '%-26s %8s %14s %14s %10s\n' "" seconds "ARM req/cell" "blob req/cell" "Put Page"
printf '%-26s %8s %14s %14s %10s\n' "peer: seed each again" "$peer_s" "$(per "$peer_arm")" "$(per "$peer_blob")" "$peer_bytes"
printf '%-26s %8s %14s %14s %10s\n' "migrate (dry run)" "$dry_s" "$(per "$dry_arm")" "$(per "$dry_blob")" 0
printf '%-26s %8s %14s %14s %10s\n' "migrate --apply" "$mig_s" "$(per "$mig_arm")" "$(per "$mig_blob")" 0
python3 -c "print(f'migrate --apply / peer: {$mig_s/$peer_s:.2f}x the time, 0 bytes uploaded')"
