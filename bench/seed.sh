#!/usr/bin/env bash
# seed end to end vs Microsoft's azure-storage-blob upload of the extracted VHD, and vs the floor
# (merely extracting root.vhd), on a 2 GiB VHD with 25% random data, blobs in Azurite.
#
#   bash bench/seed.sh               # generates bench/out/stemcell-2048m-0.25.tgz once, builds release
#   VHD_MIB=4096 SKIP_BUILD=1 bash bench/seed.sh
#   PROFILE=debug VHD_MIB=64 bash bench/seed.sh     # smoke test of the script itself
#
# (a) stemcell-gallery seed S      (verify pass + streaming sparse upload + gallery version), ARM on
#                                  the local emulator, blobs in Azurite
# (b) peer: tar -xzOf S image | tar -xz -C tmp root.vhd, then azure-storage-blob 12.26
#     BlobClient.upload_blob(f, blob_type="PageBlob") with its default settings (what
#     `az storage blob upload --type page` does)
# (c) floor: tar -xzOf S image | tar -xzO root.vhd > /dev/null
# Goals: a/b <= 0.5, a/c <= 1.5, seed's peak RSS <= 128 MiB.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
VHD_MIB="${VHD_MIB:-2048}"
FRACTION="${FRACTION:-0.25}"
PROFILE="${PROFILE:-release}"
if [ "$PROFILE" = release ]; then cargo_profile=(--release); else cargo_profile=(); fi
out="$root/bench/out"
mkdir -p "$out"
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
S="$out/stemcell-${VHD_MIB}m-${FRACTION}.tgz"

if [ ! -s "$S" ]; then
  echo "== generating $S (${VHD_MIB} MiB VHD, ${FRACTION} random data; once)" >&2
  cargo run "${cargo_profile[@]}" --quiet --example gen_stemcell -- --out "$S" --vhd-mib "$VHD_MIB" --data-fraction "$FRACTION" >&2
fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  echo "== building $PROFILE" >&2
  cargo build "${cargo_profile[@]}" --quiet
fi
BIN="$root/target/$PROFILE/stemcell-gallery"

echo "== starting Azurite" >&2
start_azurite
echo "== starting the emulator (ARM)" >&2
start_emulator "$BIN"
make_gallery bench_gallery

ls -l "$S" >&2
echo "== warm the page cache" >&2
cat "$S" > /dev/null

wall() { awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,t,":"); s=0; for(i=1;i<=n;i++) s=s*60+t[i]; print s}' "$1"; }
rss() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; }

echo "== (a) stemcell-gallery seed" >&2
/usr/bin/time -v -o "$out/a.time" "$BIN" -q --output json --arm-endpoint "$ARM" --blob-endpoint "$BLOB" \
  --auth emulator --subscription "$SUB" --resource-group bench-rg --gallery bench_gallery \
  --location westeurope seed "$S" > "$out/seed.json"

echo "== (b) peer: tar extraction + azure-storage-blob upload_blob(PageBlob)" >&2
cat > "$out/peer_upload.py" <<PYEOF
import sys
from azure.storage.blob import BlobServiceClient
conn = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
        "BlobEndpoint=$BLOB;")
svc = BlobServiceClient.from_connection_string(conn)
try:
    svc.create_container("peer")
except Exception:
    pass
with open(sys.argv[1], "rb") as f:
    svc.get_blob_client("peer", "root.vhd").upload_blob(f, blob_type="PageBlob")
PYEOF
/usr/bin/time -v -o "$out/b.time" bash -c \
  "rm -rf '$out/tmp' && mkdir -p '$out/tmp' && tar -xzOf '$S' image | tar -xz -C '$out/tmp' root.vhd && '$PY' '$out/peer_upload.py' '$out/tmp/root.vhd'"
rm -rf "$out/tmp"

echo "== (c) floor: tar -xzOf S image | tar -xzO root.vhd > /dev/null" >&2
/usr/bin/time -v -o "$out/c.time" bash -c "tar -xzOf '$S' image | tar -xzO root.vhd > /dev/null"

a=$(wall "$out/a.time"); b=$(wall "$out/b.time"); c=$(wall "$out/c.time")
rss_mib=$(awk -v k="$(rss "$out/a.time")" 'BEGIN {printf "%.1f", k / 1024}')
ab=$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", a / b}')
ac=$(awk -v a="$a" -v c="$c" 'BEGIN {printf "%.2f", a / c}')
echo
echo "stemcell:        $S ($(stat -c %s "$S") bytes)"
echo "(a) seed:        ${a} s   $(grep -o '"bytes_sent":[0-9]*' "$out/seed.json") $(grep -o '"mib_per_s":[0-9.]*' "$out/seed.json")"
echo "(b) peer:        ${b} s   (tar extraction + azure-storage-blob page-blob upload)"
echo "(c) floor:       ${c} s   (tar extraction to /dev/null)"
echo "a/b:             ${ab} (goal <= 0.5)"
echo "a/c:             ${ac} (goal <= 1.5)"
echo "seed peak RSS:   ${rss_mib} MiB (goal <= 128 MiB)"
awk -v x="$ab" -v y="$ac" -v m="$rss_mib" 'BEGIN {exit !(x <= 0.5 && y <= 1.5 && m <= 128)}' \
  && echo "result:          goals met" || echo "result:          goal missed"
