//! The bad-input corpus (issue #9): every malformed input in `fixtures/bad_input/cases.toml` run
//! through the real binary against an in-process emulator whose gallery already holds a version.
//!
//! For every case: the exit code is the one the table expects (CPI requests answer with an error
//! response and exit 0, as bosh reads the response, not the status), the output names the problem,
//! nothing panicked, and the emulator saw no write (no request other than GET/HEAD, ARM or blob).
//!
//! Except the cases marked `writes_then_cleans`: what only the whole inflated VHD shows (its
//! footer) is found by the one pass that also uploads (issue 16 item 5). Those run into an empty
//! gallery, may write only to blob storage, and must leave no stemcell blob, no ARM write and so
//! no definition or version. And the cases marked `announces`: a stemcell of the gallery's
//! version that lacks the case's reference, whose image is refused only once it is read; the
//! writer announced itself next to the version's lock before reading it (issue 33), so the only
//! writes allowed are that arrival (and its lock container's create) and its removal.

use crate::support::emulated;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use emulated::{admin, binary_against, LOC, RG, SUB};
use serde::Deserialize;
use serde_json::Value;

const GALLERY: &str = "bad_input_gallery";
/// An empty gallery for the `writes_then_cleans` cases (no version to conflict with).
const EMPTY_GALLERY: &str = "bad_input_empty";
const NAME: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const BLOB_URI: &str = "https://bosh.blob.core.windows.net/stemcell/bosh-stemcell-1.vhd";
const ACCOUNT_ID: &str = "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/bosh-rg/providers/Microsoft.Storage/storageAccounts/bosh";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    case: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    category: String,
    /// The command and its flags; placeholders are expanded (see `expand`).
    args: Vec<String>,
    /// The expected exit code.
    exit: i32,
    /// A substring of stderr or stdout (for CPI cases: of `error.message`) naming the problem.
    expect: String,
    /// CPI cases: the expected `error.type` of the response on stdout.
    #[serde(default)]
    cpi_error: Option<String>,
    /// A file under fixtures/bad_input/ fed to stdin.
    #[serde(default)]
    stdin: Option<String>,
    /// Generated stdin: `huge` (a request over the 16 MiB limit).
    #[serde(default)]
    stdin_gen: Option<String>,
    /// Use this gallery name instead of the prepared one.
    #[serde(default)]
    gallery: Option<String>,
    /// `false`: run without the global flags pointing at the emulator (config file cases).
    #[serde(default = "yes")]
    global: bool,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Found by the upload pass: blob writes are allowed, but nothing may be left (see the
    /// module documentation).
    #[serde(default)]
    writes_then_cleans: bool,
    /// Refused only after the writer announced itself to the version's lock: that arrival and
    /// its removal are the only writes allowed (see the module documentation).
    #[serde(default)]
    announces: bool,
}

fn yes() -> bool {
    true
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn expand(arg: &str, handle: &stemcell_gallery::emulator::Handle) -> String {
    let r = root();
    arg.replace("{arm}", &handle.arm)
        .replace("{blob}", &handle.blob)
        .replace("{bad}", &r.join("fixtures/bad_input").display().to_string())
        .replace(
            "{stemcells}",
            &r.join("fixtures/stemcells").display().to_string(),
        )
        .replace(
            "{cleanup}",
            &r.join("fixtures/cleanup").display().to_string(),
        )
        .replace("{name}", NAME)
        .replace("{sha}", SHA)
        .replace("{blob_uri}", BLOB_URI)
        .replace("{account_id}", ACCOUNT_ID)
}

fn load_cases() -> Vec<Case> {
    let path = root().join("fixtures/bad_input/cases.toml");
    let text = std::fs::read_to_string(&path).expect("cases.toml is readable");
    let table: Table = toml::from_str(&text).expect("cases.toml parses");
    table.case
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(handle: &stemcell_gallery::emulator::Handle, case: &Case) -> Ran {
    let mut cmd = if case.global {
        binary_against(handle, case.gallery.as_deref().unwrap_or(GALLERY))
    } else {
        std::process::Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"))
    };
    for var in [
        "STEMCELL_GALLERY_CONFIG",
        "STEMCELL_GALLERY_ARM_ENDPOINT",
        "STEMCELL_GALLERY_BLOB_ENDPOINT",
        "STEMCELL_GALLERY_AUTH",
        "STEMCELL_GALLERY_STORAGE_ACCOUNT",
        "AZURE_SUBSCRIPTION_ID",
        "AZURE_TENANT_ID",
        "AZURE_CLIENT_ID",
        "AZURE_CLIENT_SECRET",
        "AZURE_FEDERATED_TOKEN_FILE",
        "BOSH_PACKAGES_DIR",
        "BOSH_JOBS_DIR",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(&case.env);
    cmd.args(case.args.iter().map(|a| expand(a, handle)));
    let stdin: Option<Vec<u8>> = match (&case.stdin, case.stdin_gen.as_deref()) {
        (Some(file), _) => {
            let bytes = std::fs::read(root().join("fixtures/bad_input").join(file))
                .unwrap_or_else(|e| panic!("{}: stdin file {file}: {e}", case.name));
            // Text requests may name fixture paths through the placeholders; other bytes as is.
            Some(match String::from_utf8(bytes) {
                Ok(text) => expand(&text, handle).into_bytes(),
                Err(e) => e.into_bytes(),
            })
        }
        (None, Some("huge")) => {
            // A syntactically valid request padded past MAX_REQUEST_BYTES (16 MiB).
            let mut v = br#"{"method":"info","arguments":[],"context":{"pad":""#.to_vec();
            v.resize(v.len() + 17 * 1024 * 1024, b'x');
            v.extend_from_slice(br#""}}"#);
            Some(v)
        }
        (None, Some(other)) => panic!("{}: unknown stdin_gen {other:?}", case.name),
        (None, None) => None,
    };
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("the binary starts");
    let writer = stdin.map(|bytes| {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        // The binary may stop reading early (a limit): a broken pipe is fine.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        })
    });
    let out = child.wait_with_output().expect("the binary runs");
    if let Some(w) = writer {
        let _ = w.join();
    }
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// What is wrong with one case's outcome (empty: nothing).
fn check(case: &Case, expect: &str, ran: &Ran, writes: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    if ran.code != Some(case.exit) {
        problems.push(format!("exit code {:?}, expected {}", ran.code, case.exit));
    }
    if case.cpi_error.is_none() && case.exit == 0 {
        problems.push("a bad-input case must not expect success".into());
    }
    for (stream, text) in [("stderr", &ran.stderr), ("stdout", &ran.stdout)] {
        if text.contains("panicked") {
            problems.push(format!("{stream} shows a panic"));
        }
    }
    match &case.cpi_error {
        Some(kind) => {
            let last = ran.stdout.lines().last().unwrap_or("");
            match serde_json::from_str::<Value>(last) {
                Ok(resp) => {
                    if resp["error"]["type"] != kind.as_str() {
                        problems.push(format!(
                            "error.type {}, expected {kind}",
                            resp["error"]["type"]
                        ));
                    }
                    let message = resp["error"]["message"].as_str().unwrap_or("");
                    if !message.contains(expect) {
                        problems.push(format!(
                            "error.message {message:?} does not contain {expect:?}"
                        ));
                    }
                    if !resp["result"].is_null() {
                        problems.push(format!("result {} is not null", resp["result"]));
                    }
                }
                Err(e) => problems.push(format!("stdout is not a CPI response ({e})")),
            }
        }
        None => {
            if !ran.stderr.contains(expect) && !ran.stdout.contains(expect) {
                problems.push(format!("output does not contain {expect:?}"));
            }
        }
    }
    if case.writes_then_cleans {
        if case.gallery.as_deref() != Some(EMPTY_GALLERY) {
            problems.push(format!(
                "writes_then_cleans cases run in gallery {EMPTY_GALLERY}"
            ));
        }
        let arm: Vec<&String> = writes
            .iter()
            .filter(|w| w.contains("/subscriptions/"))
            .collect();
        if !arm.is_empty() {
            problems.push(format!("ARM writes: {arm:?}"));
        }
    } else if !writes.is_empty() {
        problems.push(format!("the emulator saw writes: {}", writes.join(", ")));
    }
    problems
}

/// Stemcell blobs (`bosh-stemcell-*`) in the emulator's `stemcell` container.
async fn stemcell_blob_names(handle: &stemcell_gallery::emulator::Handle) -> Vec<String> {
    let storage = stemcell_gallery::azure::blob::StorageTarget::new(
        &url::Url::parse(&handle.blob).expect("blob endpoint parses"),
        stemcell_gallery::azure::blob::StorageAuth::DevelopmentKey,
    )
    .expect("storage target");
    match stemcell_gallery::azure::blob::list_stemcell_blobs(&storage.container("stemcell")).await {
        Ok(blobs) => blobs.into_iter().map(|b| b.name).collect(),
        // No container: nothing was ever written there.
        Err(_) => Vec::new(),
    }
}

/// Requests other than GET/HEAD in the emulator's log since the last reset.
async fn writes(handle: &stemcell_gallery::emulator::Handle) -> Vec<String> {
    let log = admin(handle, "GET", "/_emulator/requests", None).await;
    assert_eq!(log.status, 200, "{}", log.text);
    log.body["requests"]
        .as_array()
        .expect("a request list")
        .iter()
        .filter(|r| !matches!(r["method"].as_str(), Some("GET" | "HEAD")))
        .map(|r| format!("{} {} -> {}", r["method"], r["path"], r["status"]))
        .collect()
}

/// Split `writes` into an `announces` case's arrival (the lock container's create, the arrival
/// blob under `galleries/…/<version>.lock.pending/` and its DELETE) and everything else.
fn arrival_writes(writes: Vec<String>) -> (Vec<String>, Vec<String>) {
    writes.into_iter().partition(|w| {
        w.starts_with("\"PUT\" \"/devstoreaccount1/stemcell\" ")
            || (w.contains("/devstoreaccount1/stemcell/galleries/") && w.contains(".lock.pending/"))
    })
}

/// An arrival was written and removed again, and nothing else under the lock.
fn arrival_problems(announced: &[String]) -> Vec<String> {
    let blobs = |method: &str| -> Vec<String> {
        announced
            .iter()
            .filter(|w| w.starts_with(&format!("\"{method}\"")) && w.contains(".lock.pending/"))
            .map(|w| w.split_whitespace().nth(1).unwrap_or("").to_string())
            .collect()
    };
    let (put, deleted) = (blobs("PUT"), blobs("DELETE"));
    let mut problems = Vec::new();
    if put.is_empty() {
        problems.push("marked announces but announced nothing: unmark it".into());
    }
    if put != deleted || put.len() > 1 {
        problems.push(format!(
            "one arrival, removed again: put {put:?}, deleted {deleted:?}"
        ));
    }
    problems
}

/// The gallery holds a definition and version 1.506.0 (with a reference) before any case runs,
/// so a case that wrongly went ahead would have something to change or delete.
async fn prepare(handle: &stemcell_gallery::emulator::Handle) {
    handle
        .state
        .ensure_gallery(SUB, RG, GALLERY, LOC)
        .expect("the gallery is created");
    handle
        .state
        .ensure_gallery(SUB, RG, EMPTY_GALLERY, LOC)
        .expect("the empty gallery is created");
    let mut cmd = binary_against(handle, GALLERY);
    cmd.args([
        "ensure",
        "--blob-uri",
        BLOB_URI,
        "--storage-account-id",
        ACCOUNT_ID,
        "--name",
        NAME,
        "--version",
        "1.506",
        "--sha256",
        SHA,
        "--reference",
        "bosh-stemcell-prepared",
    ]);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("the binary runs"))
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "preparing the gallery: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_is_refused_by_name_without_a_panic_or_a_write() {
    let cases = load_cases();
    let handle = emulated::start_default().await;
    prepare(&handle).await;

    let mut names = std::collections::BTreeSet::new();
    let mut per_category: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for case in &cases {
        assert!(
            names.insert(case.name.clone()),
            "duplicate case {}",
            case.name
        );
        *per_category.entry(case.category.clone()).or_default() += 1;
        let reset = admin(&handle, "POST", "/_emulator/reset", None).await;
        assert!(reset.status < 300, "reset: {}", reset.text);
        // The binary talks to the emulator served by this runtime: block outside its workers.
        let ran = tokio::task::block_in_place(|| run(&handle, case));
        let mut seen = writes(&handle).await;
        let mut announced = Vec::new();
        if case.announces {
            (announced, seen) = arrival_writes(seen);
        }
        let mut problems = check(case, &expand(&case.expect, &handle), &ran, &seen);
        if case.announces {
            problems.extend(arrival_problems(&announced));
        }
        let left = stemcell_blob_names(&handle).await;
        if !left.is_empty() {
            problems.push(format!("stemcell blobs left: {left:?}"));
        }
        if case.writes_then_cleans && seen.is_empty() {
            problems.push("marked writes_then_cleans but wrote nothing: unmark it".into());
        }
        if std::env::var_os("BAD_INPUT_VERBOSE").is_some() {
            // Review aid: what each case printed (the CPI response, or the error line).
            let said = if case.cpi_error.is_some() {
                ran.stdout.trim().to_string()
            } else {
                ran.stderr.trim().lines().next().unwrap_or("").to_string()
            };
            println!("{} exit {:?}: {said}", case.name, ran.code);
        }
        if !problems.is_empty() {
            failures.push(format!(
                "[{}] {}: {}\n    stderr: {}\n    stdout: {}",
                case.category,
                case.name,
                problems.join("; "),
                ran.stderr.trim().lines().last().unwrap_or(""),
                ran.stdout.trim().chars().take(400).collect::<String>(),
            ));
        }
    }
    println!("bad_input: {} cases", cases.len());
    for (category, n) in &per_category {
        println!("  {category}: {n}");
    }
    assert!(
        cases.len() >= 40,
        "the corpus must hold at least 40 cases, has {}",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} bad-input cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // The prepared version is untouched.
    let v = emulated::Raw::new(&handle.arm)
        .get(&format!(
            "{}/images/{NAME}/versions/1.506.0",
            emulated::gallery_path(GALLERY)
        ))
        .await;
    assert_eq!(v.status, 200, "{}", v.text);
    let tags: std::collections::BTreeMap<String, String> =
        serde_json::from_value(v.body["tags"].clone()).unwrap();
    assert_eq!(
        stemcell_gallery::gallery::tags::references(&tags),
        vec!["bosh-stemcell-prepared"]
    );
}
