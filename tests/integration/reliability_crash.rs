//! Crash points (issue #9): `seed` and `ensure` are SIGKILLed at every request of a clean run —
//! once while the request is held before the emulator serves it, once after it took effect but
//! before its response arrives — and the same command, re-run without faults, must converge: exit
//! 0, exactly one Succeeded version carrying every reference, a complete source blob, no partial
//! upload left. The killed process's lock leases are expired with the emulator's clock (the lock
//! design: a dead holder's lease expires by itself); nothing else is cleaned up between the runs.
//!
//! No hooks in the product: the request to stop at is found by ordinal in the clean run's request
//! log, and held with an emulator fault (`skip` the earlier matches, `delay_ms` + `drop` to hold it
//! unserved, or `hold_after` to serve it and hold the response). Run with `--nocapture` for counts.

use crate::support::reliability;

use std::process::Stdio;
use std::time::{Duration, Instant};

use reliability::*;
use serde_json::{json, Value};
use stemcell_gallery::emulator::{Handle, LoggedRequest};

const R1: &str = "bosh-stemcell-r1";
const R2: &str = "bosh-stemcell-r2";
/// Two CIDs of one pre-gallery stemcell (the director uploaded it twice) for `migrate`.
const M1: &str = "bosh-stemcell-1b6c2a70-5d1e-4c1f-9a53-0e8a4b2f6d01";
const M2: &str = "bosh-stemcell-2c7d3b81-6e2f-4d20-8b64-1f9b5c307e12";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    /// `seed --reference r1` into an empty gallery (upload, definition, version, replication).
    SeedFresh,
    /// `seed --reference r2` of a stemcell already published with r1 (tag update).
    SeedAddReference,
    /// `ensure --reference r1` into an empty gallery.
    EnsureFresh,
    /// `ensure --reference r2` of a version already referenced by r1 (tag update).
    EnsureAddReference,
    /// `migrate --apply` of a director list naming two CIDs of one pre-gallery stemcell, whose
    /// blobs the plain Azure CPI left (issue 47): one version made from a blob, both CIDs.
    MigrateFresh,
}

struct Fixture {
    stemcell: std::path::PathBuf,
    sha: String,
    /// `HOLDER=FILE`: the director list naming M1 and M2.
    list: String,
    _dir: tempfile::TempDir,
}

fn command(s: Scenario, f: &Fixture) -> (Vec<String>, Vec<&'static str>) {
    match s {
        Scenario::SeedFresh => (seed_args(&f.stemcell, R1), vec![R1]),
        Scenario::SeedAddReference => (seed_args(&f.stemcell, R2), vec![R1, R2]),
        Scenario::EnsureFresh => (ensure_args("1.506", &f.sha, "e1", R1), vec![R1]),
        Scenario::EnsureAddReference => (ensure_args("1.506", &f.sha, "e2", R2), vec![R1, R2]),
        Scenario::MigrateFresh => (
            ["migrate", "--director-stemcells", &f.list, "--apply"]
                .map(String::from)
                .to_vec(),
            vec![M1, M2],
        ),
    }
}

async fn setup(h: &Handle, s: Scenario, f: &Fixture) {
    let args = match s {
        Scenario::SeedFresh | Scenario::EnsureFresh => return,
        Scenario::MigrateFresh => {
            for cid in [M1, M2] {
                pre_gallery_blob(h, cid).await;
            }
            return;
        }
        Scenario::SeedAddReference => seed_args(&f.stemcell, R1),
        Scenario::EnsureAddReference => ensure_args("1.506", &f.sha, "e1", R1),
    };
    let r = run(h, &args, &[]).await;
    assert_eq!(r.code, 0, "setup: {}", r.stderr);
}

/// The fault selector of one logged request: method, a glob of its path with the per-run parts
/// (blob names, operation ids) wildcarded, and the query's `comp=`/`restype=` part for blobs.
fn selector(r: &LoggedRequest) -> (String, String, Option<String>) {
    let path: Vec<String> = r
        .path
        .split('/')
        .map(|seg| {
            if seg.starts_with("bosh-stemcell-") {
                "bosh-stemcell-*".to_string()
            } else if seg.len() == 36 && seg.matches('-').count() == 4 {
                "*".to_string()
            } else {
                seg.to_string()
            }
        })
        .collect();
    // A leading `*` makes it a glob over the whole path (a plain string is a substring match).
    let glob = format!("*{}", path.join("/"));
    let query = if r.service == "blob" {
        r.query
            .split('&')
            .find(|p| p.starts_with("comp="))
            .or_else(|| r.query.split('&').find(|p| p.starts_with("restype=")))
            .map(str::to_string)
    } else {
        None
    };
    (r.method.clone(), glob, query)
}

/// The emulator's own fault path matching, case-insensitive as the emulator applies it.
fn glob_match(pattern: &str, text: &str) -> bool {
    stemcell_gallery::emulator::glob_match(&pattern.to_lowercase(), &text.to_lowercase())
}

fn matches(sel: &(String, String, Option<String>), r: &LoggedRequest) -> bool {
    sel.0.eq_ignore_ascii_case(&r.method)
        && glob_match(&sel.1, &r.path)
        && match &sel.2 {
            Some(q) => r.query.contains(q.as_str()),
            None => true,
        }
}

#[derive(Default)]
struct Tally {
    points: usize,
    reached: usize,
    not_reached: usize,
    failures: Vec<String>,
}

async fn clean_log(s: Scenario, f: &Fixture) -> Vec<LoggedRequest> {
    let h = start().await;
    setup(&h, s, f).await;
    h.state.reset_log();
    let (args, refs) = command(s, f);
    let r = run(&h, &args, &[]).await;
    assert_eq!(r.code, 0, "clean run: {}", r.stderr);
    let log = h.state.requests();
    converged(s, &h, &refs).await.unwrap();
    log
}

/// What the plain Azure CPI left for a pre-gallery stemcell: the page blob `<cid>.vhd` (a fixed
/// VHD of 2 MiB with one data sector), its cloud properties as metadata.
async fn pre_gallery_blob(h: &Handle, cid: &str) {
    use crate::support::blobsdk::{BlobExt, ContainerExt};
    let container = storage(h).container("stemcell");
    let _ = container.create().await;
    let size = (2u64 << 20) + 512;
    let blob = container.blob_client(format!("{cid}.vhd"));
    let meta = [
        ("name", DEFINITION),
        ("version", "1.506"),
        ("os_type", "linux"),
        ("architecture", "x86_64"),
    ];
    blob.put_page_blob(size, &meta).await.unwrap();
    blob.put_page(0, 511, vec![0x5a; 512]).await.unwrap();
    let footer = crate::support::stemcells::fixed_vhd_footer();
    blob.put_page(size - 512, size - 1, footer).await.unwrap();
}

/// The state a successful run converges to. `migrate`: one Succeeded version holding both
/// CIDs, made from one of their blobs, and both blobs still there (it never deletes one).
async fn converged(s: Scenario, h: &Handle, refs: &[&str]) -> Result<(), String> {
    if s != Scenario::MigrateFresh {
        return check_converged(h, "1.506.0", refs).await;
    }
    let all = versions(h, DEFINITION).await;
    let [v] = all.as_slice() else {
        return Err(format!("expected one version, found {}", all.len()));
    };
    if state_of(v) != "Succeeded" {
        return Err(format!("the version is {}", state_of(v)));
    }
    let have = references_of(v);
    if refs.iter().any(|r| !have.iter().any(|x| x == r)) || have.len() != refs.len() {
        return Err(format!("references {have:?}, expected {refs:?}"));
    }
    let blobs =
        stemcell_gallery::azure::blob::list_stemcell_blobs(&storage(h).container("stemcell"))
            .await
            .map_err(|e| e.to_string())?;
    for cid in refs {
        if !blobs.iter().any(|b| b.name == format!("{cid}.vhd")) {
            return Err(format!("the blob of {cid} was deleted"));
        }
    }
    Ok(())
}

/// Kill the command at request `k` of the clean run (before or after it is served), re-run it,
/// check convergence.
async fn kill_point(
    s: Scenario,
    f: &Fixture,
    log: &[LoggedRequest],
    k: usize,
    after: bool,
    tally: &mut Tally,
) {
    let h = start().await;
    setup(&h, s, f).await;
    let sel = selector(&log[k]);
    let skip = log[..k].iter().filter(|r| matches(&sel, r)).count();
    let mut fault =
        json!({"method": sel.0, "path": sel.1, "skip": skip, "delay_ms": 60_000, "drop": true});
    if let Some(q) = &sel.2 {
        fault["query"] = json!(q);
    }
    if after {
        fault["hold_after"] = json!(true);
    }
    add_fault(&h, fault).await;
    let (args, refs) = command(s, f);
    let mut cmd = binary(&h);
    cmd.args(&args).stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = cmd.spawn().expect("the binary starts");
    let phase = if after { "served" } else { "arrived" };
    let started = Instant::now();
    let mut reached = false;
    while started.elapsed() < Duration::from_secs(20) {
        if fired(&h).await.iter().any(|f| f.2 == phase) {
            reached = true;
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    tally.points += 1;
    let label = format!(
        "{s:?} request #{k} {} {} ({})",
        log[k].method,
        log[k].route,
        if after {
            "after serving"
        } else {
            "before serving"
        }
    );
    if reached {
        tally.reached += 1;
    } else {
        // The run went another way (e.g. parallel page writes in another order) and ended.
        tally.not_reached += 1;
        println!("not reached: {label}");
    }
    clear_faults(&h).await;
    expire_leases(&h).await;
    let again = run(&h, &args, &[]).await;
    if again.code != 0 {
        tally.failures.push(format!(
            "{label}: the re-run exited {}: {}",
            again.code, again.stderr
        ));
    } else if let Err(e) = converged(s, &h, &refs).await {
        tally.failures.push(format!("{label}: not converged: {e}"));
    }
}

async fn crash_suite(scenarios: &[Scenario]) {
    let dir = tempfile::tempdir().unwrap();
    let (stemcell, sha) = reliability::stemcell(dir.path(), "1.506", 11, 4);
    let list = director_list(dir.path());
    let f = Fixture {
        stemcell,
        sha,
        list,
        _dir: dir,
    };
    let mut failures = Vec::new();
    for &s in scenarios {
        let log = clean_log(s, &f).await;
        let mut routes: std::collections::BTreeMap<&str, usize> = Default::default();
        for r in &log {
            *routes.entry(r.route.as_str()).or_default() += 1;
        }
        println!("{s:?} clean run: {routes:?}");
        let mut tally = Tally::default();
        for k in 0..log.len() {
            for after in [false, true] {
                kill_point(s, &f, &log, k, after, &mut tally).await;
            }
        }
        println!(
            "{s:?}: {} requests in the clean run, {} kill points ({} reached, {} not reached), {} failed",
            log.len(),
            tally.points,
            tally.reached,
            tally.not_reached,
            tally.failures.len()
        );
        assert!(
            tally.reached * 10 >= tally.points * 9,
            "{s:?}: too few kill points reached ({} of {})",
            tally.reached,
            tally.points
        );
        failures.extend(tally.failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_killed_at_every_request_converges_on_rerun() {
    crash_suite(&[Scenario::SeedFresh, Scenario::SeedAddReference]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensure_killed_at_every_request_converges_on_rerun() {
    crash_suite(&[Scenario::EnsureFresh, Scenario::EnsureAddReference]).await;
}

/// `migrate --apply` (issue 47 item 2): killed at any request, its re-run converges to one
/// version holding both CIDs, and no blob is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_killed_at_every_request_converges_on_rerun() {
    crash_suite(&[Scenario::MigrateFresh]).await;
}

/// A director's list naming M1 and M2 (`bosh stemcells --json`), as `HOLDER=FILE`.
fn director_list(dir: &std::path::Path) -> String {
    let rows: Vec<Value> = [M1, M2]
        .iter()
        .map(|c| json!({"name": DEFINITION, "version": "1.506", "os": "ubuntu-jammy", "cpi": "", "cid": c}))
        .collect();
    let doc = json!({"Tables": [{"Content": "stemcells",
        "Header": {"name": "Name", "version": "Version", "os": "OS", "cpi": "CPI", "cid": "CID"},
        "Rows": rows, "Notes": []}], "Blocks": null, "Lines": []});
    let path = dir.join("director.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    format!("6a7f1c52-3b8e-4d09-9e61-5f2a7b3c8d94={}", path.display())
}

/// The lock a killed holder leaves is not broken early: a second run waits for the lease to
/// expire (here: moves the emulator's clock) rather than going ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_lease_is_waited_for_not_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (_, sha) = reliability::stemcell(dir.path(), "1.506", 12, 2);
    let h = start().await;
    // Kill the process right after its lease on the version lock was granted (the first acquire
    // meets a missing lock blob, 404, and creates it; the second one takes the lease).
    add_fault(
        &h,
        json!({"method": "PUT", "path": "*/galleries/*", "query": "comp=lease", "skip": 1, "hold_after": true, "delay_ms": 60_000, "drop": true}),
    )
    .await;
    let args = ensure_args("1.506", &sha, "k1", R1);
    let mut cmd = binary(&h);
    cmd.args(&args).stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || async {
            fired(&h).await.iter().any(|f| f.2 == "served")
        })
        .await
    );
    let _ = child.kill();
    let _ = child.wait();
    clear_faults(&h).await;
    // Without expiry the next run waits on the lease; give it a short lock budget to show it.
    let second = ensure_args("1.506", &sha, "k2", R2);
    let blocked = tokio::time::timeout(Duration::from_secs(3), run(&h, &second, &[])).await;
    assert!(
        blocked.is_err(),
        "a run went ahead while a dead holder's lease was still valid: {:?}",
        blocked.map(|r| r.code)
    );
    expire_leases(&h).await;
    let r = run(&h, &ensure_args("1.506", &sha, "k2", R2), &[]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: Vec<Value> = versions(&h, DEFINITION).await;
    assert_eq!(v.len(), 1);
}

/// Issue 14 item 5: `ensure` replaces a Failed version of the same content carrying R1: it
/// deletes the Failed version, and is SIGKILLed while its create (PUT) is held unserved. The
/// references it carried were recorded durably before the delete (the lock's note), so the re-run
/// records R1 on the new version as well as its own R2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_of_a_replaced_failed_version_survive_a_sigkill_between_the_delete_and_the_create(
) {
    let dir = tempfile::tempdir().unwrap();
    let (_, sha) = reliability::stemcell(dir.path(), "1.506", 11, 4);
    let h = start().await;
    // A create that ends Failed, whose clean-up delete is refused: a Failed version with R1.
    add_fault(
        &h,
        json!({"method": "PUT", "path": "*/versions/1.506.0", "operation": "failed"}),
    )
    .await;
    add_fault(
        &h,
        json!({"method": "DELETE", "path": "*/versions/1.506.0", "status": 400, "count": 5}),
    )
    .await;
    let setup = run(&h, &ensure_args("1.506", &sha, "setup", R1), &[]).await;
    assert_eq!(setup.code, 1, "setup: {}", setup.stderr);
    clear_faults(&h).await;
    expire_leases(&h).await;
    assert_eq!(state_of(&versions(&h, DEFINITION).await[0]), "Failed");

    let puts_arrived = |f: Vec<(String, String, String)>| {
        f.iter()
            .filter(|f| f.0 == "PUT" && f.2 == "arrived")
            .count()
    };
    let before = puts_arrived(fired(&h).await);
    add_fault(
        &h,
        json!({"method": "PUT", "path": "*/versions/1.506.0", "delay_ms": 60_000, "drop": true}),
    )
    .await;
    let args = ensure_args("1.506", &sha, "e1", R2);
    let mut cmd = binary(&h);
    cmd.args(&args).stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = cmd.spawn().expect("the binary starts");
    let reached = wait_until(Duration::from_secs(20), || async {
        puts_arrived(fired(&h).await) > before
    })
    .await;
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    assert!(reached, "the create was reached");
    let left = versions(&h, DEFINITION).await;
    assert!(
        left.is_empty(),
        "killed between the delete and the create: {left:?}"
    );
    clear_faults(&h).await;
    expire_leases(&h).await;
    let again = run(&h, &args, &[]).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    check_converged(&h, "1.506.0", &[R1, R2]).await.unwrap();
}

/// A Failed version of the stemcell `sha` carrying R1, replaced by `ensure --reference R2`
/// whose create (PUT) is held while the process is SIGKILLed: the Failed version is gone, and
/// its references live only beside its lock. Returns the re-run's arguments.
async fn failed_version_replaced_then_killed(h: &Handle, version: &str, sha: &str) -> Vec<String> {
    let path = format!("*/versions/{version}.0");
    add_fault(
        h,
        json!({"method": "PUT", "path": path, "operation": "failed"}),
    )
    .await;
    add_fault(
        h,
        json!({"method": "DELETE", "path": path, "status": 400, "count": 5}),
    )
    .await;
    let setup = run(h, &ensure_args(version, sha, "setup", R1), &[]).await;
    assert_eq!(setup.code, 1, "setup: {}", setup.stderr);
    clear_faults(h).await;
    expire_leases(h).await;
    let puts = |f: Vec<(String, String, String)>| {
        f.iter()
            .filter(|f| f.0 == "PUT" && f.2 == "arrived")
            .count()
    };
    let before = puts(fired(h).await);
    add_fault(
        h,
        json!({"method": "PUT", "path": path, "delay_ms": 60_000, "drop": true}),
    )
    .await;
    let args = ensure_args(version, sha, &format!("e-{version}"), R2);
    let mut cmd = binary(h);
    cmd.args(&args).stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = cmd.spawn().expect("the binary starts");
    let reached = wait_until(Duration::from_secs(20), || async {
        puts(fired(h).await) > before
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(reached, "the create was reached");
    clear_faults(h).await;
    expire_leases(h).await;
    let left: Vec<Value> = versions(h, DEFINITION)
        .await
        .into_iter()
        .filter(|v| v["name"] == format!("{version}.0"))
        .collect();
    assert!(
        left.is_empty(),
        "killed between delete and create: {left:?}"
    );
    args
}

/// The blobs kept beside a version's lock (what holds references carried across a Failed
/// version's replacement), in name order: this release's two record copies, or an earlier
/// release's `.carried` note.
async fn beside_lock(h: &Handle, version: &str) -> Vec<String> {
    use crate::support::blobsdk::ContainerExt;
    let lock = stemcell_gallery::gallery::lock::version_lock_name(
        &stemcell_gallery::gallery::GalleryRef {
            subscription: crate::support::SUB.into(),
            resource_group: crate::support::RG.into(),
            gallery: GALLERY.into(),
        },
        DEFINITION,
        &format!("{version}.0"),
    );
    let mut names: Vec<String> = storage(h)
        .container("stemcell")
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .filter(|n| n.starts_with(&format!("{lock}.")) && !n.contains(".pending/"))
        .collect();
    names.sort();
    names
}

async fn put_blob(h: &Handle, name: &str, body: &[u8]) {
    use crate::support::blobsdk::BlobExt;
    let blob = storage(h).container("stemcell").blob_client(name);
    blob.put_block_blob(body.to_vec(), false, None, &[])
        .await
        .unwrap();
}

async fn get_blob(h: &Handle, name: &str) -> Vec<u8> {
    use crate::support::blobsdk::BlobExt;
    let blob = storage(h).container("stemcell").blob_client(name);
    blob.read(None).await.unwrap()
}

async fn delete_blob(h: &Handle, name: &str) {
    use crate::support::blobsdk::BlobExt;
    let blob = storage(h).container("stemcell").blob_client(name);
    blob.delete().await.unwrap();
}

/// Issue 28 item 4: the references carried across a Failed version's replacement are kept as
/// durably as the references themselves. The first blob beside the lock (the record; an earlier
/// release's `.carried` note, its only copy) is deleted, emptied to `[]`, or overwritten with
/// another version's — and the re-run still records R1 (from the record's second copy), never
/// the other version's reference. Before: R1 lost (deleted, emptied), or the other version's
/// CID adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn carried_references_survive_a_deleted_emptied_or_foreign_note() {
    let dir = tempfile::tempdir().unwrap();
    let (_, sha) = reliability::stemcell(dir.path(), "1.506", 11, 4);
    for damage in ["deleted", "emptied", "another version's"] {
        let h = start().await;
        let args = failed_version_replaced_then_killed(&h, "1.506", &sha).await;
        let ours = beside_lock(&h, "1.506").await;
        assert!(!ours.is_empty(), "something beside the lock carries R1");
        let victim = &ours[0];
        match damage {
            "deleted" => delete_blob(&h, victim).await,
            "emptied" => put_blob(&h, victim, b"[]").await,
            _ => {
                // Version 1.507 through the same replacement: its own carried note.
                failed_version_replaced_then_killed(&h, "1.507", &sha).await;
                let theirs = beside_lock(&h, "1.507").await;
                let body = get_blob(&h, &theirs[0]).await;
                let body = String::from_utf8(body)
                    .unwrap()
                    .replace(R1, "bosh-stemcell-of-1.507")
                    .replace(R2, "bosh-stemcell-of-1.507");
                put_blob(&h, victim, body.as_bytes()).await;
            }
        }
        let again = run(&h, &args, &[]).await;
        assert_eq!(again.code, 0, "{damage}: {}", again.stderr);
        let v: Vec<Value> = versions(&h, DEFINITION)
            .await
            .into_iter()
            .filter(|v| v["name"] == "1.506.0")
            .collect();
        assert_eq!(
            references_of(&v[0]),
            vec![R1.to_string(), R2.to_string()],
            "{damage}: R1 carried, nothing else"
        );
    }
}

/// Issue 28 item 4: with every copy unusable (both record copies overwritten with another
/// version's), nothing is decided on a guess: the re-run refuses, naming the record and the
/// remedy, and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn carried_references_with_no_usable_copy_are_refused_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (_, sha) = reliability::stemcell(dir.path(), "1.506", 11, 4);
    let h = start().await;
    let args = failed_version_replaced_then_killed(&h, "1.506", &sha).await;
    failed_version_replaced_then_killed(&h, "1.507", &sha).await;
    let ours = beside_lock(&h, "1.506").await;
    let theirs = beside_lock(&h, "1.507").await;
    assert_eq!(ours.len(), 2, "two copies: {ours:?}");
    for (victim, source) in ours.iter().zip(&theirs) {
        let body = get_blob(&h, source).await;
        put_blob(&h, victim, &body).await;
    }
    let again = run(&h, &args, &[]).await;
    assert_eq!(again.code, 1, "{}", again.stderr);
    let m = again.error();
    assert!(
        m.contains("reference record") && m.contains("1.507.0") && m.contains(&ours[0]),
        "{m}"
    );
    assert!(
        !versions(&h, DEFINITION)
            .await
            .iter()
            .any(|v| v["name"] == "1.506.0"),
        "nothing created on a guess"
    );
}

/// Issue 28 item 4: `delete_stemcell` of a CID that only the record of a Failed version being
/// replaced carries answers success and removes it there; the re-create does not bring it back
/// (before: `StemcellNotFound`, and the next ensure recorded a reference no director holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_stemcell_of_a_cid_only_the_carried_references_hold_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_, sha) = reliability::stemcell(dir.path(), "1.506", 11, 4);
    let h = start().await;
    let args = failed_version_replaced_then_killed(&h, "1.506", &sha).await;
    let request = json!({"method": "delete_stemcell", "arguments": [R1], "context": {"director_uuid": "d"}, "api_version": 2});
    let (code, response) = crate::support::emulated::run_cpi(
        &h.arm,
        &h.blob,
        GALLERY,
        &[],
        &[],
        request.to_string(),
        &[],
    )
    .await;
    assert_eq!(code, Some(0));
    assert!(response["error"].is_null(), "{response}");
    let again = run(&h, &args, &[]).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    let v = versions(&h, DEFINITION).await;
    assert_eq!(references_of(&v[0]), vec![R2.to_string()]);
}
