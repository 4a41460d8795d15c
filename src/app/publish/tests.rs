//! Unit tests of publish's decisions, over in-memory fakes of its ports: the gallery
//! ([`FakeGallery`]) and blob storage ([`FakeStore`]).

use std::sync::Arc;

use super::*;
use crate::app::blob_store::fake::FakeStore;
use crate::gallery::fake::FakeGallery;
use crate::gallery::lock::LocalLocks;
use crate::stemcell::testgen::{Generated, StemcellSpec, VhdSpec};

#[test]
fn upload_lock_is_one_per_content_and_differs_from_the_service_version_lock() {
    let sha = "AB".repeat(32);
    let upload = upload_lock_name(&sha);
    assert_eq!(upload, format!("uploads/sha256/{}.lock", "ab".repeat(32)));
    assert_eq!(upload, upload_lock_name(&sha.to_ascii_lowercase()));
    assert_ne!(upload, upload_lock_name(&"cd".repeat(32)));
    assert!(!upload.starts_with("locks/"));
}

const DEFINITION: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
const KEY: &str = "1.506.0";
const CONTAINER: &str = "stemcell";

/// Publish's context over the fakes.
struct Fakes {
    gallery: Arc<FakeGallery>,
    service: GalleryService,
    store: FakeStore,
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
        Fakes {
            gallery,
            service,
            store: FakeStore::default(),
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

#[async_trait::async_trait]
impl PublishContext for Fakes {
    fn service(&self) -> &GalleryService {
        &self.service
    }
    fn blob_store(&self, _why: &str) -> anyhow::Result<&dyn BlobStore> {
        Ok(&self.store)
    }
    fn lock_wait(&self) -> Duration {
        Duration::from_secs(1)
    }
    async fn storage_account_id(&self) -> anyhow::Result<Option<String>> {
        Ok(Some(
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/fake"
                .into(),
        ))
    }
}

/// A small stemcell 1.506 with data in half of its 4 MiB disk.
fn stemcell(dir: &std::path::Path, seed: u64) -> (Source, Generated) {
    let spec = StemcellSpec {
        vhd: VhdSpec {
            mib: 4,
            data_fraction: 0.5,
            block: 64 * 1024,
            seed,
            ..VhdSpec::default()
        },
        ..StemcellSpec::default()
    };
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

    let published = publish_with(&fakes, source, &opts())
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
}

#[tokio::test]
async fn a_complete_blob_with_the_same_digest_is_reused_and_no_byte_is_sent() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, generated) = stemcell(dir.path(), 2);
    let earlier = "bosh-stemcell-earlier.vhd";
    fakes.store.put(
        CONTAINER,
        earlier,
        generated.vhd_file_size,
        &generated.image_sha256.to_ascii_uppercase(),
        true,
    );

    let published = publish_with(&fakes, source, &opts())
        .await
        .expect("published");

    assert!(!published.uploaded);
    assert_eq!(published.bytes_sent, 0);
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
        &generated.image_sha256,
        true,
    );

    let published = publish_with(&fakes, source, &opts())
        .await
        .expect("published");

    assert!(published.uploaded);
    assert_ne!(published.blob_name.as_deref(), Some(odd));
    assert!(fakes.blobs().contains_key(odd), "kept, not deleted");
}

#[tokio::test]
async fn partial_blob_of_the_same_digest_is_deleted_and_of_another_digest_kept() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, generated) = stemcell(dir.path(), 4);
    let ours = "bosh-stemcell-interrupted.vhd";
    let theirs = "bosh-stemcell-other-upload.vhd";
    fakes.store.put(
        CONTAINER,
        ours,
        generated.vhd_file_size,
        &generated.image_sha256,
        false,
    );
    fakes.store.put(
        CONTAINER,
        theirs,
        generated.vhd_file_size,
        &"0".repeat(64),
        false,
    );

    let published = publish_with(&fakes, source, &opts())
        .await
        .expect("published");

    let blobs = fakes.blobs();
    assert!(
        !blobs.contains_key(ours),
        "our leftover is deleted: {blobs:?}"
    );
    let (_, complete, _) = blobs[theirs];
    assert!(!complete, "another content's upload is left alone");
    let name = published.blob_name.expect("a new blob");
    assert!(blobs[&name].1, "the new blob is complete");
    assert_eq!(blobs.len(), 2, "{blobs:?}");
}

#[tokio::test]
async fn upload_failure_removes_the_partial_blob_and_creates_no_version() {
    let fakes = Fakes::new();
    let dir = tempfile::tempdir().unwrap();
    let (source, _) = stemcell(dir.path(), 5);
    fakes.store.fail_writes();

    let err = publish_with(&fakes, source, &opts())
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
    let first = publish_with(&fakes, source.clone(), &opts())
        .await
        .expect("published");
    let calls_before = fakes.store.calls();

    let again = publish_with(&fakes, source, &opts()).await.expect("reused");

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
    publish_with(&fakes, first, &opts())
        .await
        .expect("published");
    let calls_before = fakes.store.calls();
    let (other, generated) = stemcell(dir.path(), 8);

    let err = publish_with(&fakes, other, &opts())
        .await
        .expect_err("conflict");

    assert_eq!(
        crate::app::failure::exit_for(&err),
        crate::error::Exit::Conflict
    );
    assert!(format!("{err:#}").contains(&generated.image_sha256));
    assert_eq!(fakes.store.calls(), calls_before, "nothing uploaded");
    assert_eq!(fakes.blobs().len(), 1);
}
