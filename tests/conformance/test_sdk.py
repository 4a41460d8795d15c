"""Conformance of the stemcell-gallery emulator with Microsoft's own Python SDKs.

Usage: python test_sdk.py ARM_URL BLOB_URL
Run by tests/emulator_python_conformance.rs against an emulator started with page size 2.
Exits non-zero with a clear message on the first mismatch.
"""

import sys
import time
import uuid

from azure.core.credentials import AccessToken
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute import models as m
from azure.storage.blob import BlobServiceClient

DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
SUB = "00000000-0000-0000-0000-000000000000"
RG = "conformance-rg"
LOC = "westeurope"


class StaticToken:
    """A TokenCredential with a fixed development token."""

    def get_token(self, *scopes, **kwargs):
        return AccessToken("conformance-token", int(time.time()) + 3600)


def check(cond, message):
    if not cond:
        print(f"MISMATCH: {message}", file=sys.stderr)
        sys.exit(1)


def expect_error(fn, status, code, what):
    try:
        fn()
    except HttpResponseError as e:
        check(e.status_code == status, f"{what}: status {e.status_code}, expected {status}: {e}")
        # ARM errors parse into e.error (an ODataV4 error); storage errors set e.error_code.
        got = getattr(e, "error_code", None) or (e.error.code if e.error else None)
        check(got == code, f"{what}: error code {got!r}, expected {code!r}: {e}")
        return e
    check(False, f"{what}: expected HTTP {status} {code}, got success")


def arm(arm_url):
    # azure-core's bearer policy refuses plain http unless told otherwise (enforce_https=False).
    client = ComputeManagementClient(StaticToken(), SUB, base_url=arm_url, polling_interval=0)
    kw = {"enforce_https": False}
    gallery_name = "conformance_" + uuid.uuid4().hex[:8]

    g = client.galleries.begin_create_or_update(
        RG, gallery_name, m.Gallery(location=LOC, description="conformance"), **kw
    ).result()
    check(g.provisioning_state == "Succeeded", f"gallery provisioning state {g.provisioning_state}")
    check(g.name == gallery_name, f"gallery name {g.name}")

    image = m.GalleryImage(
        location=LOC,
        os_type="Linux",
        os_state="Generalized",
        hyper_v_generation="V2",
        identifier=m.GalleryImageIdentifier(publisher="bosh", offer="ubuntu-jammy", sku="gen2"),
        features=[m.GalleryImageFeature(name="SecurityType", value="TrustedLaunchSupported")],
    )
    d = client.gallery_images.begin_create_or_update(RG, gallery_name, "ubuntu-jammy", image, **kw).result()
    check(d.provisioning_state == "Succeeded", f"definition provisioning state {d.provisioning_state}")
    check(d.identifier.sku == "gen2", "definition identifier")

    def version(uri):
        return m.GalleryImageVersion(
            location=LOC,
            tags={"image_sha256": "abc"},
            publishing_profile=m.GalleryImageVersionPublishingProfile(
                replica_count=1, target_regions=[m.TargetRegion(name=LOC, regional_replica_count=1)]
            ),
            storage_profile=m.GalleryImageVersionStorageProfile(
                os_disk_image=m.GalleryOSDiskImage(
                    source=m.GalleryDiskImageSource(
                        uri=uri,
                        storage_account_id=f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Storage/storageAccounts/acct",
                    )
                )
            ),
        )

    names = []
    for v in ["1.0.0", "1.1.0", "1.506.0"]:
        created = client.gallery_image_versions.begin_create_or_update(
            RG, gallery_name, "ubuntu-jammy", v, version(f"https://acct.blob.core.windows.net/stemcell/{v}.vhd"), **kw
        ).result()
        check(created.provisioning_state == "Succeeded", f"version {v} state {created.provisioning_state}")
        check(created.publishing_profile.published_date is not None, "publishedDate set")
        names.append(v)

    got = client.gallery_image_versions.get(
        RG, gallery_name, "ubuntu-jammy", "1.506.0", expand="ReplicationStatus", **kw
    )
    rs = got.replication_status
    check(rs is not None, "replicationStatus with $expand")
    check(rs.aggregated_state == "Completed", f"aggregatedState {rs.aggregated_state}")
    # Azure names regions by display name in its answers (REFERENCE.md "Regions").
    check(len(rs.summary) == 1 and rs.summary[0].region == "West Europe"
          and rs.summary[0].progress == 100,
          f"replication summary {[(s.region, s.progress) for s in rs.summary]}")
    check(got.storage_profile.os_disk_image.source.uri.endswith("/1.506.0.vhd"), "source uri kept")

    # Paging: the emulator runs with page size 2, so 3 versions need a nextLink.
    listed = [v.name for v in client.gallery_image_versions.list_by_gallery_image(RG, gallery_name, "ubuntu-jammy", **kw)]
    check(listed == names, f"paged version list {listed}, expected {names}")

    updated = client.gallery_image_versions.begin_update(
        RG, gallery_name, "ubuntu-jammy", "1.506.0",
        m.GalleryImageVersionUpdate(tags={"image_sha256": "abc", "stemcell_references": "bosh-stemcell-1"}), **kw
    ).result()
    check(updated.tags.get("stemcell_references") == "bosh-stemcell-1", f"tags after update {updated.tags}")

    e = expect_error(
        lambda: client.gallery_image_versions.begin_create_or_update(
            RG, gallery_name, "ubuntu-jammy", "1.506.0",
            version("https://acct.blob.core.windows.net/stemcell/other.vhd"), **kw
        ).result(),
        409, "PropertyChangeNotAllowed", "source change",
    )
    check(e.error.target == "galleryImageVersion.properties.storageProfile.osDiskImage.source.uri",
          f"error target {e.error.target}")

    expect_error(
        lambda: client.gallery_images.begin_delete(RG, gallery_name, "ubuntu-jammy", **kw).result(),
        409, "CannotDeleteResource", "deleting a definition with versions",
    )
    for v in names:
        client.gallery_image_versions.begin_delete(RG, gallery_name, "ubuntu-jammy", v, **kw).result()
    try:
        client.gallery_image_versions.get(RG, gallery_name, "ubuntu-jammy", "1.506.0", **kw)
        check(False, "a deleted version is gone")
    except ResourceNotFoundError:
        pass
    # Right after its children are deleted, Azure still refuses the parent's DELETE with 409
    # CannotDeleteResource for a while (azure-sdk-for-python #25506: 10 s; the emulator's
    # default window is 300 ms): retry as a client on Azure must.
    def delete_parent(begin):
        deadline = time.monotonic() + 30
        while True:
            try:
                return begin().result()
            except HttpResponseError as e:
                if e.status_code != 409 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    delete_parent(lambda: client.gallery_images.begin_delete(RG, gallery_name, "ubuntu-jammy", **kw))
    delete_parent(lambda: client.galleries.begin_delete(RG, gallery_name, **kw))
    remaining = [x.name for x in client.galleries.list_by_resource_group(RG, **kw)]
    check(gallery_name not in remaining, f"gallery deleted, still listed: {remaining}")


def blob(blob_url):
    conn = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={DEV_KEY};BlobEndpoint={blob_url};"
    )
    svc = BlobServiceClient.from_connection_string(conn)
    container = svc.create_container("conformance-" + uuid.uuid4().hex[:8])
    b = container.get_blob_client("bosh-stemcell-1.vhd")
    size = 1024 * 1024 * 1024
    b.create_page_blob(size, metadata={"image_sha256": "abc"})
    b.upload_page(b"\x01" * 4096, offset=0, length=4096)
    b.upload_page(b"\x02" * 512, offset=size - 512, length=512)
    b.clear_page(offset=1024, length=1024)
    ranges, _cleared = b.get_page_ranges()
    got = [(r["start"], r["end"]) for r in ranges]
    check(got == [(0, 1023), (2048, 4095), (size - 512, size - 1)], f"page ranges {got}")
    data = b.download_blob(offset=512, length=1024).readall()
    check(data == b"\x01" * 512 + b"\x00" * 512, "ranged download of written + cleared pages")
    props = b.get_blob_properties()
    check(props.size == size, f"size {props.size}")
    check(props.metadata.get("image_sha256") == "abc", f"metadata {props.metadata}")
    check(props.blob_type == "PageBlob", f"blob type {props.blob_type}")

    lease = b.acquire_lease(lease_duration=15)
    check(b.get_blob_properties().lease.state == "leased", "lease state leased")
    expect_error(lambda: b.acquire_lease(lease_duration=15), 409, "LeaseAlreadyPresent", "second acquire")
    expect_error(lambda: b.upload_page(b"\x03" * 512, offset=0, length=512), 412, "LeaseIdMissing",
                 "write without the lease")
    b.upload_page(b"\x03" * 512, offset=0, length=512, lease=lease)
    lease.renew()
    lease.release()
    check(b.get_blob_properties().lease.state == "available", "lease released")
    names = [x.name for x in container.list_blobs(include=["metadata"])]
    check(names == ["bosh-stemcell-1.vhd"], f"blob list {names}")
    b.delete_blob()
    container.delete_container()


def main():
    if len(sys.argv) != 3:
        print("usage: test_sdk.py ARM_URL BLOB_URL", file=sys.stderr)
        sys.exit(2)
    arm(sys.argv[1])
    blob(sys.argv[2])
    print("conformance: ok")


if __name__ == "__main__":
    main()
