//! Unit tests of publish's decisions, over in-memory fakes of its ports: the gallery
//! ([`FakeGallery`]) and blob storage ([`FakeStore`]).

use std::sync::Arc;

use super::*;
use crate::gallery::blob_store::fake::FakeStore;
use crate::gallery::fake::FakeGallery;
use crate::gallery::lock::LocalLocks;
use crate::stemcell::manifest::Checksum;
use crate::stemcell::testgen::{Generated, StemcellSpec, VhdSpec};

#[test]
fn upload_lock_is_one_per_content_and_differs_from_the_service_version_lock() {
    let sha = Checksum::Sha256("AB".repeat(32));
    let upload = upload_lock_name(&sha);
    assert_eq!(upload, format!("uploads/sha256/{}.lock", "ab".repeat(32)));
    assert_eq!(upload, upload_lock_name(&Checksum::Sha256("ab".repeat(32))));
    assert_ne!(upload, upload_lock_name(&Checksum::Sha256("cd".repeat(32))));
    assert!(!upload.starts_with("locks/"));
    let sha1 = upload_lock_name(&Checksum::Sha1("ef".repeat(20)));
    assert_eq!(sha1, format!("uploads/sha1/{}.lock", "ef".repeat(20)));
}

const DEFINITION: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
const KEY: &str = "1.506.0";
const CONTAINER: &str = "stemcell";

/// Publish's context over the fakes.
struct Fakes {
    gallery: Arc<FakeGallery>,
    store: Arc<FakeStore>,
    ctx: Context,
}

impl Fakes {
    fn new() -> Fakes {
        let gallery = Arc::new(FakeGallery::default());
        let service = GalleryService::new(
            gallery.clone(),
            Arc::new(LocalLocks::default()),
            gallery.gallery().clone(),
            "westeurope",
        );
        let store = Arc::new(FakeStore::default());
        let mut ctx = Context::in_memory(
            service,
            Some(store.clone()),
            crate::app::Clock::Azure,
            Some(
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/fake"
                    .into(),
            ),
        )
        .expect("in-memory context");
        ctx.settings.tuning.lock_wait = Duration::from_secs(1);
        Fakes {
            gallery,
            store,
            ctx,
        }
    }

    /// The blobs of the stemcell container: name → (size, complete, bytes written).
    fn blobs(&self) -> BTreeMap<String, (u64, bool, u64)> {
        self.store
            .blobs()
            .into_iter()
            .filter(|((c, _), _)| c == CONTAINER)
            .map(|((_, n), b)| (n, (b.size, b.is_complete(), b.written)))
            .collect()
    }
}

/// A small stemcell 1.506 with data in half of its 4 MiB disk.
fn stemcell(dir: &std::path::Path, seed: u64) -> (Source, Generated) {
    stemcell_with(dir, seed, |_| {})
}

/// [`stemcell`], changed by `change` first.
fn stemcell_with(
    dir: &std::path::Path,
    seed: u64,
    change: impl FnOnce(&mut StemcellSpec),
) -> (Source, Generated) {
    let mut spec = StemcellSpec {
        vhd: VhdSpec {
            mib: 4,
            data_fraction: 0.5,
            block: 64 * 1024,
            seed,
            ..VhdSpec::default()
        },
        ..StemcellSpec::default()
    };
    change(&mut spec);
    let path = dir.join(format!("stemcell-{seed}.tgz"));
    let generated = spec.write_to(&path).expect("stemcell written");
    (Source::Stemcell(path), generated)
}

fn opts() -> PublishOptions {
    PublishOptions {
        progress: Progress::None,
        ..PublishOptions::default()
    }
}

#[tokio::test]
async fn a_new_stemcell_is_uploaded_marked_complete_and_published_from_its_blob() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, generated) = stemcell(dir.path(), 1);

    let published = publish(&fakes.ctx, source, &opts())
        .await
        .expect("published");

    assert!(published.uploaded);
    assert!(published.bytes_sent > 0);
    let name = published.blob_name.clone().expect("a blob was made");
    let blobs = fakes.blobs();
    assert_eq!(blobs.len(), 1, "{blobs:?}");
    let (size, complete, written) = blobs[&name];
    assert_eq!(size, generated.vhd_file_size);
    assert!(complete, "marked complete");
    assert_eq!(written, published.bytes_sent);
    let version = fakes.gallery.version(DEFINITION, KEY).expect("created");
    assert_eq!(
        version.source_uri.as_deref(),
        Some(fakes.store.blob_url(CONTAINER, &name).as_str())
    );
    let calls = fakes.store.calls();
    let at = |prefix: &str| {
        calls
            .iter()
            .position(|c| c.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {calls:?}"))
    };
    assert!(at("lock ") < at("create "), "{calls:?}");
    assert!(at("create ") < at("write_pages "), "{calls:?}");
    assert!(at("write_pages ") < at("mark_complete "), "{calls:?}");
    // Issue 32: read once. Before the upload only the SHA-1 the manifest declares was known, so
    // only its lock was taken; the SHA-256 was computed on the way and recorded with it.
    let locks: Vec<&String> = calls.iter().filter(|c| c.starts_with("lock ")).collect();
    assert_eq!(
        locks,
        vec![&format!(
            "lock {CONTAINER}/uploads/sha1/{}.lock",
            generated.image_sha1
        )],
        "{calls:?}"
    );
    assert_eq!(published.image_sha256, generated.image_sha256);
    assert_eq!(published.bytes_read, generated.vhd_file_size);
    let metadata = &fakes.store.blobs()[&(CONTAINER.to_string(), name.clone())].metadata;
    assert_eq!(metadata["image_sha1"], generated.image_sha1);
    assert_eq!(metadata["image_sha256"], generated.image_sha256);
    assert_eq!(
        version.tags.get(tags::IMAGE_SHA256),
        Some(&generated.image_sha256)
    );
}

/// Issue 32: a manifest declaring the image's SHA-256 (`sha256:<hex>`) keys the upload by it.
#[tokio::test]
async fn a_manifest_declaring_a_sha256_uploads_under_that_digests_lock() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, generated) = stemcell_with(dir.path(), 11, |s| {
        s.sha = crate::stemcell::testgen::ShaField::Sha256Prefixed;
    });

    let published = publish(&fakes.ctx, source, &opts())
        .await
        .expect("published");

    assert!(published.uploaded);
    let locks: Vec<String> = fakes
        .store
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("lock "))
        .collect();
    assert_eq!(
        locks,
        vec![format!(
            "lock {CONTAINER}/uploads/sha256/{}.lock",
            generated.image_sha256
        )]
    );
    let name = published.blob_name.expect("a blob");
    let metadata = &fakes.store.blobs()[&(CONTAINER.to_string(), name)].metadata;
    assert_eq!(metadata["image_sha1"], generated.image_sha1);
    assert_eq!(metadata["image_sha256"], generated.image_sha256);
}

/// Issue 32: the manifest's checksum is checked while the image uploads; a wrong one fails the
/// pass, and the blob it wrote is deleted: nothing is left, no version.
#[tokio::test]
async fn a_wrong_declared_checksum_found_during_the_upload_removes_the_blob_and_creates_no_version()
{
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, _) = stemcell_with(dir.path(), 12, |s| {
        s.sha = crate::stemcell::testgen::ShaField::Literal(
            "0123456789abcdef0123456789abcdef01234567".into(),
        );
    });

    let err = publish(&fakes.ctx, source, &opts())
        .await
        .expect_err("the checksum is wrong");

    let message = format!("{err:#}");
    assert!(message.contains("sha1 is"), "{message}");
    assert!(
        message.contains("the blob was removed and no gallery version was created"),
        "{message}"
    );
    let calls = fakes.store.calls();
    assert!(
        calls.iter().any(|c| c.starts_with("create ")),
        "written first: {calls:?}"
    );
    assert!(fakes.blobs().is_empty(), "{:?}", fakes.blobs());
    assert!(fakes.gallery.version(DEFINITION, KEY).is_none());
    assert_eq!(fakes.gallery.calls("begin_create_version"), 0);
}

/// Issue 32: bad input the upload pass finds before root.vhd's first page (here the image holds
/// no root.vhd) writes nothing at all: no container, no lock, no blob.
#[tokio::test]
async fn an_image_without_root_vhd_is_refused_before_any_write() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, _) = stemcell_with(dir.path(), 13, |s| {
        s.vhd_name = "disk.vhd".into();
    });

    let err = publish(&fakes.ctx, source, &opts())
        .await
        .expect_err("no root.vhd");

    assert!(format!("{err:#}").contains("root.vhd"), "{err:#}");
    assert_eq!(fakes.store.calls(), Vec::<String>::new());
    assert!(fakes.gallery.version(DEFINITION, KEY).is_none());
}

/// Two publishes of one stemcell at once upload it once: the second waits for the first's
/// upload lock, then finds its blob or its version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_publishes_of_one_stemcell_at_once_upload_it_once() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, generated) = stemcell(dir.path(), 14);

    let options = opts();
    let (a, b) = tokio::join!(
        publish(&fakes.ctx, source.clone(), &options),
        publish(&fakes.ctx, source, &options)
    );
    let (a, b) = (a.expect("a published"), b.expect("b published"));

    assert_eq!(
        [a.uploaded, b.uploaded].iter().filter(|u| **u).count(),
        1,
        "exactly one uploaded"
    );
    assert_eq!(fakes.blobs().len(), 1, "{:?}", fakes.blobs());
    assert_eq!(a.image_sha256, generated.image_sha256);
    assert_eq!(b.image_sha256, generated.image_sha256);
    assert_eq!(a.ensured.version.id, b.ensured.version.id);
}

/// A complete blob written before blobs recorded the image's SHA-1 (its `image_sha256` alone):
/// it may hold this image, so the digest pass decides, and it is reused.
#[tokio::test]
async fn a_complete_blob_with_the_same_digest_is_reused_and_no_byte_is_sent() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, generated) = stemcell(dir.path(), 2);
    let earlier = "bosh-stemcell-earlier.vhd";
    let upper = generated.image_sha256.to_ascii_uppercase();
    fakes.store.put(
        CONTAINER,
        earlier,
        generated.vhd_file_size,
        true,
        &[("image_sha256", &upper)],
    );

    let published = publish(&fakes.ctx, source, &opts())
        .await
        .expect("published");

    assert!(!published.uploaded);
    assert_eq!(published.bytes_sent, 0);
    assert_eq!(published.bytes_read, 0);
    assert_eq!(published.blob_name.as_deref(), Some(earlier));
    assert_eq!(fakes.blobs().len(), 1, "no second blob");
    let calls = fakes.store.calls();
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("create ") || c.starts_with("write_pages ")),
        "{calls:?}"
    );
    let version = fakes.gallery.version(DEFINITION, KEY).expect("created");
    assert_eq!(
        version.source_uri,
        Some(fakes.store.blob_url(CONTAINER, earlier))
    );
}

/// Issue 32: a complete blob of this build records the image's SHA-1: recognised by the SHA-1
/// the manifest declares, confirmed by the SHA-256, reused.
#[tokio::test]
async fn a_complete_blob_recording_the_same_sha1_is_reused_after_the_digest_pass() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, generated) = stemcell(dir.path(), 15);
    let earlier = "bosh-stemcell-earlier.vhd";
    fakes.store.put(
        CONTAINER,
        earlier,
        generated.vhd_file_size,
        true,
        &[
            ("image_sha1", &generated.image_sha1),
            ("image_sha256", &generated.image_sha256),
            ("version", "1.506"),
        ],
    );

    let published = publish(&fakes.ctx, source, &opts())
        .await
        .expect("published");

    assert!(!published.uploaded);
    assert_eq!(published.blob_name.as_deref(), Some(earlier));
    let locks: Vec<String> = fakes
        .store
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("lock "))
        .collect();
    let sha1_lock = format!(
        "lock {CONTAINER}/uploads/sha1/{}.lock",
        generated.image_sha1
    );
    let sha256_lock = format!(
        "lock {CONTAINER}/uploads/sha256/{}.lock",
        generated.image_sha256
    );
    assert_eq!(
        locks,
        vec![sha1_lock.clone(), sha1_lock, sha256_lock],
        "the pass stopped under the SHA-1's lock; decided again under both"
    );
}

#[tokio::test]
async fn a_complete_blob_of_the_same_digest_but_another_size_is_not_reused() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, generated) = stemcell(dir.path(), 3);
    let odd = "bosh-stemcell-odd.vhd";
    fakes.store.put(
        CONTAINER,
        odd,
        generated.vhd_file_size + 512,
        true,
        &[
            ("image_sha1", &generated.image_sha1),
            ("image_sha256", &generated.image_sha256),
        ],
    );

    let published = publish(&fakes.ctx, source, &opts())
        .await
        .expect("published");

    assert!(published.uploaded);
    assert_ne!(published.blob_name.as_deref(), Some(odd));
    assert!(fakes.blobs().contains_key(odd), "kept, not deleted");
}

/// Partial blobs: this image's (recording its SHA-1, the lock held) are deleted before the
/// upload; an earlier build's recording only its SHA-256 once the upload computed it, under that
/// digest's lock; another image's are left alone.
#[tokio::test]
async fn partial_blob_of_the_same_digest_is_deleted_and_of_another_digest_kept() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, generated) = stemcell(dir.path(), 4);
    let ours = "bosh-stemcell-interrupted.vhd";
    let earlier = "bosh-stemcell-interrupted-earlier-build.vhd";
    let theirs = "bosh-stemcell-other-upload.vhd";
    let theirs_earlier = "bosh-stemcell-other-upload-earlier-build.vhd";
    let size = generated.vhd_file_size;
    fakes.store.put(
        CONTAINER,
        ours,
        size,
        false,
        &[("image_sha1", &generated.image_sha1)],
    );
    fakes.store.put(
        CONTAINER,
        earlier,
        size,
        false,
        &[("image_sha256", &generated.image_sha256)],
    );
    let (zero_sha1, zero_sha256) = ("0".repeat(40), "0".repeat(64));
    fakes.store.put(
        CONTAINER,
        theirs,
        size,
        false,
        &[("image_sha1", &zero_sha1)],
    );
    fakes.store.put(
        CONTAINER,
        theirs_earlier,
        size,
        false,
        &[("image_sha256", &zero_sha256)],
    );

    let published = publish(&fakes.ctx, source, &opts())
        .await
        .expect("published");

    let blobs = fakes.blobs();
    assert!(
        !blobs.contains_key(ours),
        "our leftover is deleted: {blobs:?}"
    );
    assert!(
        !blobs.contains_key(earlier),
        "the earlier build's leftover of this image is deleted: {blobs:?}"
    );
    for other in [theirs, theirs_earlier] {
        let (_, complete, _) = blobs[other];
        assert!(!complete, "another content's upload is left alone");
    }
    let name = published.blob_name.expect("a new blob");
    assert!(blobs[&name].1, "the new blob is complete");
    assert_eq!(blobs.len(), 3, "{blobs:?}");
}

/// An earlier build's upload of this image (its blob recording only the SHA-256) was partial when
/// the container was listed, then finished while this upload ran: its blob is complete now (and
/// a version may be being created from it), so it is left alone, not deleted as a leftover.
#[tokio::test]
async fn a_partial_blob_finished_meanwhile_by_its_writer_is_not_deleted() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, generated) = stemcell(dir.path(), 16);
    let earlier = "bosh-stemcell-earlier-build-in-flight.vhd";
    fakes.store.put(
        CONTAINER,
        earlier,
        generated.vhd_file_size,
        false,
        &[("image_sha256", &generated.image_sha256)],
    );
    let key = (CONTAINER.to_string(), earlier.to_string());
    fakes.store.when_writing(move |blobs| {
        let blob = blobs.get_mut(&key).expect("the earlier build's blob");
        blob.metadata
            .insert("upload_state".to_string(), "complete".to_string());
    });

    let published = publish(&fakes.ctx, source, &opts())
        .await
        .expect("published");

    assert!(published.uploaded);
    let blobs = fakes.blobs();
    assert!(
        blobs.get(earlier).is_some_and(|b| b.1),
        "the finished blob is kept: {blobs:?}"
    );
    assert!(
        !fakes
            .store
            .calls()
            .contains(&format!("delete {CONTAINER}/{earlier}")),
        "{:?}",
        fakes.store.calls()
    );
}

/// An earlier build's upload of this image still in flight (it holds the SHA-256's upload lock)
/// keeps its partial blob: only a writer that is gone leaves a leftover.
#[tokio::test]
async fn a_partial_blob_whose_writer_holds_its_lock_is_not_deleted() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, generated) = stemcell(dir.path(), 17);
    let earlier = "bosh-stemcell-earlier-build-running.vhd";
    fakes.store.put(
        CONTAINER,
        earlier,
        generated.vhd_file_size,
        false,
        &[("image_sha256", &generated.image_sha256)],
    );
    let held = fakes
        .store
        .lock(
            CONTAINER,
            &upload_lock_name(&Checksum::Sha256(generated.image_sha256.clone())),
            Duration::ZERO,
            UPLOAD_LEASE,
        )
        .await
        .expect("the earlier build's lock");

    let published = publish(&fakes.ctx, source, &opts())
        .await
        .expect("published");

    assert!(published.uploaded);
    let blobs = fakes.blobs();
    assert!(
        blobs.get(earlier).is_some_and(|b| !b.1),
        "the running upload's blob is kept: {blobs:?}"
    );
    held.release().await.unwrap();
}

#[tokio::test]
async fn upload_failure_removes_the_partial_blob_and_creates_no_version() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, _) = stemcell(dir.path(), 5);
    fakes.store.fail_writes();

    let err = publish(&fakes.ctx, source, &opts())
        .await
        .expect_err("the upload fails");

    let message = format!("{err:#}");
    assert!(
        message.contains("the blob was removed and no gallery version was created"),
        "{message}"
    );
    assert!(
        message.contains("refused"),
        "the store's cause is kept: {message}"
    );
    assert!(fakes.blobs().is_empty(), "{:?}", fakes.blobs());
    assert!(fakes.gallery.version(DEFINITION, KEY).is_none());
    assert_eq!(fakes.gallery.calls("begin_create_version"), 0);
}

#[tokio::test]
async fn an_existing_version_with_the_same_digest_is_reused_without_touching_storage() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, _) = stemcell(dir.path(), 6);
    let first = publish(&fakes.ctx, source.clone(), &opts())
        .await
        .expect("published");
    let calls_before = fakes.store.calls();

    let again = publish(&fakes.ctx, source, &opts()).await.expect("reused");

    assert_eq!(
        again.ensured.outcome,
        crate::gallery::service::Outcome::Reused
    );
    assert!(!again.uploaded);
    assert_eq!(again.blob_name, None);
    assert_eq!(again.blob_uri, first.blob_uri);
    assert_eq!(fakes.store.calls(), calls_before, "no storage request");
    assert_eq!(fakes.blobs().len(), 1);
}

#[tokio::test]
async fn an_existing_version_with_another_digest_is_a_conflict_and_nothing_is_uploaded() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = stemcell(dir.path(), 7);
    publish(&fakes.ctx, first, &opts())
        .await
        .expect("published");
    let calls_before = fakes.store.calls();
    let (other, generated) = stemcell(dir.path(), 8);

    let err = publish(&fakes.ctx, other, &opts())
        .await
        .expect_err("conflict");

    assert_eq!(
        crate::wiring::failure::exit_for(&err),
        crate::error::Exit::Conflict
    );
    assert!(format!("{err:#}").contains(&generated.image_sha256));
    assert_eq!(fakes.store.calls(), calls_before, "nothing uploaded");
    assert_eq!(fakes.blobs().len(), 1);
}
