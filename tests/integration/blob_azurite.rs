//! The storage layer against Azurite (Microsoft's storage emulator): sparse page-blob upload,
//! resumability markers, metadata, and the cross-host lease lock.

use crate::support::azurite;
use crate::support::stemcells::{download_sha256, nonzero_ranges, page_ranges, sha256_hex};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, RngExt, SeedableRng};
use stemcell_gallery::azure::blob::{
    self, delete_blob_if_exists, ensure_container, find_complete_stemcell_blob,
    find_partial_stemcell_blobs, mark_complete, new_stemcell_blob_name, stemcell_blob_metadata,
    upload_page_blob, Blob, Container, PageRun, Progress, StorageAuth, StorageTarget,
    UploadOptions, UploadStats, STEMCELL_CONTAINER,
};
use stemcell_gallery::azure::lock::{holder, this_holder, LeaseLock, LockError};
use stemcell_gallery::error::Classified;
use stemcell_gallery::gallery::blob_store::{page_runs_sink, SinkError};
use stemcell_gallery::gallery::lock::legacy_version_lock_name as version_lock_name;
use tokio::sync::mpsc;

const MIB: usize = 1024 * 1024;

fn target(az: &azurite::Azurite) -> StorageTarget {
    StorageTarget::new(&az.blob_endpoint(), StorageAuth::DevelopmentKey).expect("Azurite endpoint")
}

async fn stemcell_container(t: &StorageTarget) -> Container {
    let c = t.container(STEMCELL_CONTAINER);
    ensure_container(&c).await.expect("create container");
    ensure_container(&c)
        .await
        .expect("creating it twice is fine");
    c
}

/// A VHD-shaped buffer: mostly zeros, scattered random regions (some longer than 4 MiB, some
/// touching each other, one at the very start), and a non-zero 512-byte footer at the end.
fn sparse_vhd(size: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut buf = vec![0u8; size];
    let sectors = size / 512;
    let mut regions: Vec<(usize, usize)> =
        vec![(0, 8), (sectors / 2, (6 * MIB / 512).min(sectors / 2 - 1))];
    for _ in 0..60 {
        let start = rng.random_range(0..sectors - 1);
        let len = rng.random_range(1..=256usize).min(sectors - 1 - start);
        regions.push((start, len));
    }
    for (start, len) in regions {
        let bytes = &mut buf[start * 512..(start + len) * 512];
        rng.fill_bytes(bytes);
        // Random bytes could leave a sector all zero only with negligible probability; make sure.
        for sector in bytes.chunks_mut(512) {
            sector[0] |= 1;
        }
    }
    let footer = size - 512;
    buf[footer..footer + 8].copy_from_slice(b"conectix");
    buf
}

/// Feed `vhd` through the producer sink from a blocking thread, in `chunk`-byte pieces, the way
/// the archive reader will; stop after `stop_after` bytes if given.
fn produce(
    vhd: Arc<Vec<u8>>,
    chunk: usize,
    stop_after: Option<usize>,
    tx: mpsc::Sender<PageRun>,
) -> tokio::task::JoinHandle<Result<(), SinkError>> {
    tokio::task::spawn_blocking(move || {
        let mut sink = page_runs_sink(tx);
        let end = stop_after.unwrap_or(vhd.len());
        let mut at = 0;
        while at < end {
            let n = chunk.min(end - at);
            sink(at as u64, &vhd[at..at + n])?;
            at += n;
        }
        Ok(())
    })
}

async fn upload(blob: &Blob, vhd: Arc<Vec<u8>>, concurrency: usize) -> UploadStats {
    let (tx, rx) = mpsc::channel(4);
    let producer = produce(vhd.clone(), MIB, None, tx);
    let opts = UploadOptions {
        concurrency,
        progress: Progress::None,
        ..UploadOptions::default()
    };
    let stats = upload_page_blob(blob, vhd.len() as u64, rx, &opts)
        .await
        .expect("upload");
    producer.await.expect("join").expect("producer");
    stats
}

fn cloud_properties() -> serde_json::Map<String, serde_json::Value> {
    serde_json::json!({
        "name": "bosh-azure-hyperv-ubuntu-jammy-go_agent",
        "version": "1.506",
        "infrastructure": "azure",
        "hypervisor": "hyperv",
        "disk": 5120,
        "os_type": "linux",
        "architecture": "x86_64",
        "root_device_name": "/dev/sda1"
    })
    .as_object()
    .expect("object")
    .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_upload_writes_exactly_the_nonzero_ranges_and_the_bytes_match() {
    let az = azurite::Azurite::start();
    let t = target(&az);
    let container = stemcell_container(&t).await;
    let vhd = Arc::new(sparse_vhd(64 * MIB + 512, 1));
    let source_sha = sha256_hex(&vhd);
    let (_, name) = new_stemcell_blob_name();
    let blob = container.blob_client(&name);

    let stats = upload(&blob, vhd.clone(), 8).await;

    let expected = nonzero_ranges(&vhd);
    let sent: u64 = expected.iter().map(|(s, e)| e - s + 1).sum();
    assert_eq!(stats.bytes_sent, sent, "only non-zero sectors are sent");
    assert!(stats.bytes_sent < vhd.len() as u64 / 4);
    assert!(stats.requests >= expected.len() as u64);
    assert_eq!(page_ranges(&blob).await, expected);
    assert_eq!(download_sha256(&blob).await, (source_sha, vhd.len() as u64));
    assert_eq!(
        t.blob_url(STEMCELL_CONTAINER, &name),
        format!(
            "http://127.0.0.1:{}/devstoreaccount1/stemcell/{name}",
            az.port
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_at_a_time_and_eight_in_flight_give_the_same_blob() {
    let az = azurite::Azurite::start();
    let t = target(&az);
    let container = stemcell_container(&t).await;
    let vhd = Arc::new(sparse_vhd(24 * MIB + 512, 2));
    let serial = container.blob_client(new_stemcell_blob_name().1);
    let parallel = container.blob_client(new_stemcell_blob_name().1);

    let s1 = upload(&serial, vhd.clone(), 1).await;
    let s8 = upload(&parallel, vhd.clone(), 8).await;

    assert_eq!(s1.bytes_sent, s8.bytes_sent);
    assert_eq!(page_ranges(&serial).await, page_ranges(&parallel).await);
    assert_eq!(
        download_sha256(&serial).await,
        download_sha256(&parallel).await
    );
    assert_eq!(download_sha256(&serial).await.0, sha256_hex(&vhd));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_upload_is_not_complete_and_a_rerun_replaces_it_and_converges() {
    let az = azurite::Azurite::start();
    let t = target(&az);
    let container = stemcell_container(&t).await;
    let vhd = Arc::new(sparse_vhd(32 * MIB + 512, 3));
    let image_sha = "4f3c".repeat(16);
    let metadata = stemcell_blob_metadata(
        &cloud_properties(),
        &image_sha,
        "gal",
        "bosh-azure-hyperv-ubuntu-jammy-go_agent",
    );

    // Run 1: the producer dies half-way (the uploader sees the channel close) — never marked.
    let (_, first) = new_stemcell_blob_name();
    let first_blob = container.blob_client(&first);
    let (tx, rx) = mpsc::channel(4);
    let producer = produce(vhd.clone(), MIB, Some(vhd.len() / 2), tx);
    upload_page_blob(
        &first_blob,
        vhd.len() as u64,
        rx,
        &UploadOptions {
            progress: Progress::None,
            ..UploadOptions::default()
        },
    )
    .await
    .expect("a short stream is not the uploader's error");
    producer.await.expect("join").expect("producer");

    // Run 2: the upload task itself is killed mid-flight.
    let (_, second) = new_stemcell_blob_name();
    let second_blob = container.blob_client(&second);
    let (tx, rx) = mpsc::channel(1);
    let size = vhd.len() as u64;
    let task_blob = second_blob.clone();
    let task = tokio::spawn(async move {
        let opts = UploadOptions {
            concurrency: 1,
            progress: Progress::None,
            ..UploadOptions::default()
        };
        upload_page_blob(&task_blob, size, rx, &opts).await
    });
    let producer = produce(vhd.clone(), MIB, None, tx);
    // Abort once the blob exists and some pages are in.
    for _ in 0..200 {
        if blob::blob_properties(&second_blob)
            .await
            .expect("props")
            .is_some()
            && !page_ranges(&second_blob).await.is_empty()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
    let _ = task.await;
    let producer_result = producer.await.expect("join");
    assert!(
        matches!(producer_result, Err(SinkError::UploaderGone) | Ok(())),
        "{producer_result:?}"
    );

    // A re-run finds nothing complete, finds both partial blobs, replaces them, and converges.
    assert_eq!(
        find_complete_stemcell_blob(&container, &image_sha)
            .await
            .expect("list"),
        None
    );
    let mut partial: Vec<String> = find_partial_stemcell_blobs(&container)
        .await
        .expect("list")
        .into_iter()
        .map(|b| b.name)
        .collect();
    partial.sort();
    let mut both = vec![first.clone(), second.clone()];
    both.sort();
    assert_eq!(partial, both);
    for name in &partial {
        assert!(delete_blob_if_exists(&container.blob_client(name))
            .await
            .expect("delete"));
        assert!(!delete_blob_if_exists(&container.blob_client(name))
            .await
            .expect("delete twice"));
    }

    let (_, third) = new_stemcell_blob_name();
    let third_blob = container.blob_client(&third);
    upload(&third_blob, vhd.clone(), 8).await;
    mark_complete(&third_blob, &metadata).await.expect("mark");

    assert_eq!(
        find_complete_stemcell_blob(&container, &image_sha)
            .await
            .expect("list"),
        Some((third.clone(), vhd.len() as u64))
    );
    assert!(find_partial_stemcell_blobs(&container)
        .await
        .expect("list")
        .is_empty());
    assert_eq!(download_sha256(&third_blob).await.0, sha256_hex(&vhd));

    // Writing into a complete blob again is refused rather than silently un-completing it.
    let (_tx, rx) = mpsc::channel(1);
    drop(_tx);
    let err = upload_page_blob(&third_blob, vhd.len() as u64, rx, &UploadOptions::default())
        .await
        .expect_err("complete blobs are not rewritten");
    assert!(err.to_string().contains(&third), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpi_metadata_round_trips_and_only_the_matching_digest_is_found() {
    let az = azurite::Azurite::start();
    let t = target(&az);
    let container = stemcell_container(&t).await;
    let vhd = Arc::new(sparse_vhd(2 * MIB + 512, 4));
    let (cid, name) = new_stemcell_blob_name();
    let blob = container.blob_client(&name);
    upload(&blob, vhd.clone(), 4).await;

    let sha = "ab".repeat(32);
    let metadata = stemcell_blob_metadata(
        &cloud_properties(),
        &sha,
        "gal",
        "bosh-azure-hyperv-ubuntu-jammy-go_agent",
    );
    mark_complete(&blob, &metadata).await.expect("mark");

    let (size, stored, _) = blob::blob_properties(&blob)
        .await
        .expect("props")
        .expect("exists");
    assert_eq!(size, vhd.len() as u64);
    let mut expected: BTreeMap<String, String> = metadata.clone();
    expected.insert("upload_state".into(), "complete".into());
    let stored: BTreeMap<String, String> = stored.into_iter().collect();
    assert_eq!(stored, expected);
    assert_eq!(stored["image_sha256"], sha);
    assert_eq!(stored["compute_gallery_name"], "gal");
    assert!(cid.starts_with("bosh-stemcell-") && name == format!("{cid}.vhd"));

    assert_eq!(
        find_complete_stemcell_blob(&container, &sha)
            .await
            .expect("list"),
        Some((name, vhd.len() as u64))
    );
    assert_eq!(
        find_complete_stemcell_blob(&container, &"cd".repeat(32))
            .await
            .expect("list"),
        None
    );
    let missing = t.container("no-such-container");
    assert_eq!(
        find_complete_stemcell_blob(&missing, &sha)
            .await
            .expect("absent container"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_errors_name_the_blob_and_bad_sizes_are_refused() {
    let az = azurite::Azurite::start();
    let t = target(&az);
    let container = t.container("does-not-exist");
    let blob = container.blob_client("bosh-stemcell-x.vhd");
    let (tx, rx) = mpsc::channel(1);
    drop(tx);
    let err = upload_page_blob(&blob, 1000, rx, &UploadOptions::default())
        .await
        .expect_err("size not a multiple of 512");
    assert!(
        err.to_string()
            .contains("does-not-exist/bosh-stemcell-x.vhd"),
        "{err}"
    );

    let (tx, rx) = mpsc::channel(1);
    drop(tx);
    let err = upload_page_blob(&blob, 1024, rx, &UploadOptions::default())
        .await
        .expect_err("container missing");
    let text = err.to_string();
    assert!(text.contains("does-not-exist"), "{text}");
    assert!(text.contains("create it"), "{text}");
    assert!(!err.class().retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_host_waits_for_the_lock_and_gets_it_after_release() {
    let az = azurite::Azurite::start();
    let t = target(&az);
    // The lock container does not exist yet: the first acquire creates it and the lock blob.
    let container = t.container("locks-test");
    let name = version_lock_name("gal", "bosh-azure-hyperv-ubuntu-jammy-go_agent", "1.506.0");

    let first = LeaseLock::acquire(&container, &name, Duration::from_secs(5))
        .await
        .expect("first host locks");
    let released = Arc::new(AtomicBool::new(false));
    let waiter = {
        let container = container.clone();
        let name = name.clone();
        let released = released.clone();
        tokio::spawn(async move {
            let guard = LeaseLock::acquire(&container, &name, Duration::from_secs(30))
                .await
                .expect("second host eventually locks");
            let after_release = released.load(Ordering::SeqCst);
            guard.release().await.expect("release");
            after_release
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !waiter.is_finished(),
        "the second host must wait while the first holds the lock"
    );
    first.check().expect("still held");
    released.store(true, Ordering::SeqCst);
    first.release().await.expect("release");
    assert!(
        waiter.await.expect("join"),
        "acquired only after the release"
    );
}

/// An operator whose command stands still waiting for a lock is told which host and process hold
/// it, and for how long; Azurite, like Azure, refuses a metadata write on a leased blob without
/// the lease id, so the name can only come from the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_told_which_host_and_process_hold_the_lock_and_for_how_long() {
    let az = azurite::Azurite::start();
    let t = target(&az);
    let container = t.container(STEMCELL_CONTAINER);
    let name = version_lock_name("gal", "def", "3.0.0");
    assert_eq!(
        holder(&container, &name).await.expect("read"),
        None,
        "no lock blob yet"
    );

    let guard = LeaseLock::acquire(&container, &name, Duration::from_secs(5))
        .await
        .expect("lock");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let seen = holder(&container, &name)
        .await
        .expect("read")
        .expect("held");
    assert_eq!(seen.who, this_holder());
    assert!(
        seen.who
            .contains(&format!("process {}", std::process::id())),
        "{seen:?}"
    );
    let held = seen.held_for.expect("storage's clock says how long");
    assert!(
        (1..=30).contains(&held.as_secs()),
        "held about 2 s by storage's clock: {seen:?}"
    );
    // Nobody but the holder can write that name.
    let lock_blob = container.blob_client(&name);
    let forged = lock_blob
        .client()
        .set_metadata(
            &std::collections::HashMap::from([("holder".to_string(), "forged".to_string())]),
            None,
        )
        .await;
    assert!(
        forged.is_err(),
        "a metadata write without the lease id is refused"
    );

    guard.release().await.expect("release");
    assert_eq!(
        holder(&container, &name).await.expect("read"),
        None,
        "a released lock has no holder, whatever its metadata still says"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_too_long_names_the_lock_blob() {
    let az = azurite::Azurite::start();
    let t = target(&az);
    let container = t.container(STEMCELL_CONTAINER);
    let name = version_lock_name("gal", "def", "2.0.0");
    let holder = LeaseLock::acquire(&container, &name, Duration::from_secs(5))
        .await
        .expect("lock");
    let err = LeaseLock::acquire(&container, &name, Duration::from_secs(2))
        .await
        .expect_err("held elsewhere");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&format!("stemcell/{name}")), "{text}");
    assert!(err.class().retryable());
    holder.release().await.expect("release");
    // Released: a new holder gets it at once; dropping a guard releases it too (best effort).
    let again = LeaseLock::acquire(&container, &name, Duration::from_secs(2))
        .await
        .expect("free");
    drop(again);
    let mut ok = false;
    for _ in 0..50 {
        if let Ok(g) = LeaseLock::acquire(&container, &name, Duration::ZERO).await {
            g.release().await.expect("release");
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "a dropped guard's lease is released");
}

/// Uses the 15 s minimum lease: holding longer than one lease proves renewal; a crash (no renew,
/// no release) frees the lock by expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_lock_outlives_its_lease_and_a_crashed_holder_frees_it_by_expiry() {
    let az = azurite::Azurite::start();
    let t = target(&az);
    let container = t.container(STEMCELL_CONTAINER);
    let name = version_lock_name("gal", "def", "3.0.0");
    let lease = Duration::from_secs(15);
    let holder = LeaseLock::acquire_with_lease(&container, &name, Duration::from_secs(5), lease)
        .await
        .expect("lock");
    tokio::time::sleep(Duration::from_secs(18)).await;
    let err = LeaseLock::acquire_with_lease(&container, &name, Duration::from_secs(1), lease)
        .await
        .expect_err("renewed past its first 15 s");
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    holder.check().expect("renewals succeeded");

    holder.abandon(); // crash: no more renewals, no release
    let next = LeaseLock::acquire_with_lease(&container, &name, Duration::from_secs(40), lease)
        .await
        .expect("the lease expires and the next host gets the lock");
    next.release().await.expect("release");

    // The operator's escape hatch: breaking a held lock frees it at once.
    let stuck = LeaseLock::acquire(&container, &name, Duration::from_secs(2))
        .await
        .expect("lock");
    LeaseLock::break_lock(&container, &name)
        .await
        .expect("break");
    let after = LeaseLock::acquire(&container, &name, Duration::from_secs(2))
        .await
        .expect("free after break");
    stuck.abandon();
    after.release().await.expect("release");
}
