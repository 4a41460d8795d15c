//! Secrets never reach stdout or stderr: the bearer token, the storage key (and the Shared Key
//! signatures made with it) and SAS signatures, at the highest verbosity with every crate tracing,
//! whether the command succeeds, Azure fails it, or the role refuses it. (Client secrets and the
//! tokens an identity provider issues are covered by auth_secret_leak.rs.)

use crate::support::emulated;

use emulated::{admin, binary_against, least_privilege, LOC, RG, SUB};
use serde_json::json;
use stemcell_gallery::config::{DEV_ACCOUNT_KEY, EMULATOR_TOKEN};
use stemcell_gallery::emulator::{Handle, Options};

const GALLERY: &str = "bosh_stemcells";
const SIG: &str = "c2VjcmV0LXNhcy1zaWduYXR1cmUtZG8tbm90LXByaW50";

fn fixture(name: &str) -> String {
    format!("{}/fixtures/stemcells/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Everything the binary printed, run at -vvv with RUST_LOG=trace (every crate's traces too).
/// A leading `--output human` replaces binary_against's `--output json`.
async fn printed(h: &Handle, args: &[&str]) -> (Option<i32>, String) {
    let json = binary_against(h, GALLERY);
    let (args, format) = match args {
        ["--output", f, rest @ ..] => (rest, *f),
        _ => (args, "json"),
    };
    let mut cmd = std::process::Command::new(json.get_program());
    let mut previous = None;
    for a in json.get_args() {
        let a = a.to_str().unwrap();
        cmd.arg(if previous == Some("--output") {
            format
        } else {
            a
        });
        previous = Some(a);
    }
    for (k, v) in json.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.arg("-vvv")
        .args(args)
        .env("RUST_LOG", "trace")
        .env("STEMCELL_GALLERY_ARM_RETRIES", "1");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    (
        out.status.code(),
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn assert_no_secret(what: &str, text: &str) {
    assert!(!text.is_empty(), "{what}: printed something");
    for (name, secret) in [
        ("the bearer token", EMULATOR_TOKEN),
        ("the storage account key", DEV_ACCOUNT_KEY),
        ("a Shared Key signature", "SharedKey devstoreaccount1:"),
        ("a SAS signature", SIG),
    ] {
        assert!(
            !text.contains(secret),
            "{what}: {name} was printed:\n{text}"
        );
    }
    assert!(!text.contains("panicked"), "{what}: {text}");
}

async fn emulator(role: bool) -> Handle {
    let h = emulated::start(Options {
        role: role.then(least_privilege),
        ..Options::default()
    })
    .await;
    h.state.ensure_gallery(SUB, RG, GALLERY, LOC).unwrap();
    h
}

#[tokio::test(flavor = "multi_thread")]
async fn a_successful_seed_and_cleanup_at_trace_verbosity_print_no_secret() {
    let h = emulator(true).await;
    let (code, text) = printed(
        &h,
        &["seed", &fixture("gen1-x86_64.tgz"), "--reference", "r1"],
    )
    .await;
    assert_eq!(code, Some(0), "{text}");
    assert_no_secret("seed", &text);
    let (code, text) = printed(&h, &["list"]).await;
    assert_eq!(code, Some(0), "{text}");
    assert_no_secret("list", &text);
    let (code, text) = printed(&h, &["cleanup", "--min-age", "0s"]).await;
    assert_eq!(code, Some(0), "{text}");
    assert_no_secret("cleanup plan", &text);
}

#[tokio::test(flavor = "multi_thread")]
async fn azure_errors_and_refusals_print_no_secret() {
    // ARM and blob storage both fail the requests past any retry budget.
    let h = emulator(true).await;
    for path in ["/providers/", "/devstoreaccount1/"] {
        let r = admin(
            &h,
            "POST",
            "/_emulator/faults",
            Some(json!({"path": path, "status": 500, "count": 50})),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.text);
        let (code, text) = printed(&h, &["seed", &fixture("gen1-x86_64.tgz")]).await;
        assert_ne!(code, Some(0), "{text}");
        assert_no_secret(&format!("seed with {path} failing"), &text);
        admin(&h, "DELETE", "/_emulator/faults", None).await;
    }

    // The role refuses a write: 403 with the action named, and still no secret.
    let mut role = least_privilege();
    role = role.without("Microsoft.Compute/galleries/images/versions/write");
    let h = emulated::start(Options {
        role: Some(role),
        ..Options::default()
    })
    .await;
    h.state.ensure_gallery(SUB, RG, GALLERY, LOC).unwrap();
    let (code, text) = printed(&h, &["seed", &fixture("gen1-x86_64.tgz")]).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("AuthorizationFailed"), "{text}");
    assert_no_secret("seed refused by the role", &text);
}

#[tokio::test(flavor = "multi_thread")]
async fn sas_urls_are_refused_without_echoing_the_signature() {
    let h = emulator(false).await;
    let sas = format!("sv=2022-11-02&sr=b&sp=r&se=2030-01-01&sig={SIG}");
    let cases: Vec<(String, Vec<String>)> = vec![
        (
            "ensure --blob-uri with a SAS".into(),
            vec![
                "ensure".into(),
                "--blob-uri".into(),
                format!("https://bosh.blob.core.windows.net/stemcell/x.vhd?{sas}"),
                "--name".into(),
                "bosh-azure-hyperv-ubuntu-jammy-go_agent".into(),
                "--version".into(),
                "1.506".into(),
                "--sha256".into(),
                "0".repeat(64),
            ],
        ),
        (
            "ensure --blob-uri that is not a URL but carries a SAS".into(),
            vec![
                "ensure".into(),
                "--blob-uri".into(),
                format!("bosh blob/x.vhd?{sas}"),
                "--name".into(),
                "bosh-azure-hyperv-ubuntu-jammy-go_agent".into(),
                "--version".into(),
                "1.506".into(),
                "--sha256".into(),
                "0".repeat(64),
            ],
        ),
    ];
    for (what, args) in cases {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, text) = printed(&h, &refs).await;
        assert_ne!(code, Some(0), "{what}: {text}");
        assert_no_secret(&what, &text);
    }
    // A SAS on the blob endpoint (global flag) is refused too.
    let mut cmd = binary_against(&h, GALLERY);
    let endpoint = format!("{}?{sas}", h.blob);
    // The later --blob-endpoint wins over binary_against's.
    cmd.args([
        "-vvv",
        "--blob-endpoint",
        &endpoint,
        "seed",
        &fixture("gen1-x86_64.tgz"),
    ])
    .env("RUST_LOG", "trace");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert_no_secret("seed with a SAS on --blob-endpoint", &text);
}

/// The CPI front sets up its own logging (stderr for the operator, the response log for bosh):
/// the same rule holds there.
#[tokio::test(flavor = "multi_thread")]
async fn the_cpi_front_at_trace_verbosity_prints_no_secret() {
    let h = emulator(true).await;
    let mut cmd = binary_against(&h, GALLERY);
    cmd.args(["-vvv", "cpi"])
        .env("RUST_LOG", "trace")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let request = json!({"method": "delete_stemcell", "arguments": ["bosh-stemcell-unknown"],
                         "context": {"director_uuid": "d"}});
    let out = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = cmd.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(request.to_string().as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("StemcellNotFound") || text.contains("result"),
        "{text}"
    );
    assert!(
        admin(&h, "GET", "/_emulator/requests", None).await.body["total"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "the CPI reached ARM"
    );
    assert_no_secret("cpi delete_stemcell", &text);
}

/// Issue 14 item 10: another pipeline made version 1.506.0 from a blob URL carrying a SAS token.
/// `lookup` (human and json), `list` (human and json), the exit-4 conflict message of `ensure`
/// and `delete` show where the version comes from, never the token.
#[tokio::test(flavor = "multi_thread")]
async fn a_sas_in_an_existing_versions_source_uri_is_never_printed() {
    let h = emulator(false).await;
    let raw = emulated::Raw::new(&h.arm);
    let name = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
    emulated::gallery_and_definition_in(&raw, GALLERY, name).await;
    let sas = format!("sv=2022-11-02&sr=b&sp=r&se=2030-01-01&sig={SIG}");
    let uri = format!("https://bosh.blob.core.windows.net/stemcell/other-pipeline.vhd?{sas}");
    let path = format!(
        "{}/images/{name}/versions/1.506.0",
        emulated::gallery_path(GALLERY)
    );
    // Made from the same image as the fixture stemcell, so `seed` reuses it.
    let inspect = std::process::Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"))
        .args(["--output", "json", "inspect", &fixture("gen1-x86_64.tgz")])
        .output()
        .unwrap();
    let inspected: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let mut body = emulated::version_body(&uri);
    body["tags"]["image_sha256"] = inspected["image_sha256"].clone();
    body["tags"]["source_blob"] = serde_json::Value::String(uri.clone());
    let original_tags = body["tags"].clone();
    let r = raw.put(&path, body).await;
    assert!(r.status < 300, "{}", r.text);
    for _ in 0..50 {
        if raw.get(&path).await.body["properties"]["provisioningState"] == "Succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let select = ["--name", name, "--version", "1.506"];
    let mut runs: Vec<(&str, Vec<&str>, Option<i32>)> = vec![
        ("lookup json", vec!["lookup"], Some(0)),
        ("lookup human", vec!["--output", "human", "lookup"], Some(0)),
        ("list json", vec!["list"], Some(0)),
        ("list human", vec!["--output", "human", "list"], Some(0)),
    ];
    let sha = "b".repeat(64);
    runs.push((
        "ensure conflict",
        vec![
            "ensure",
            "--blob-uri",
            "https://bosh.blob.core.windows.net/stemcell/mine.vhd",
            "--storage-account-id",
            "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/bosh-rg/providers/Microsoft.Storage/storageAccounts/bosh",
            "--sha256",
            &sha,
        ],
        Some(4),
    ));
    let stemcell = fixture("gen1-x86_64.tgz");
    runs.push(("seed reusing it", vec!["seed", &stemcell], Some(0)));
    runs.push((
        "seed human reusing it",
        vec!["--output", "human", "seed", &stemcell],
        Some(0),
    ));
    runs.push(("delete human", vec!["--output", "human", "delete"], Some(0)));
    for (what, args, expected) in runs {
        let mut all: Vec<&str> = args.clone();
        if !matches!(what, "list json" | "list human") && !what.starts_with("seed") {
            all.extend(select);
        }
        if what.starts_with("delete") {
            // `seed` recorded its CID; drop it again so `delete` deletes the version.
            let r = raw
                .patch(&path, serde_json::json!({"tags": original_tags}))
                .await;
            assert!(r.status < 300, "{}", r.text);
            for _ in 0..50 {
                if raw.get(&path).await.body["properties"]["provisioningState"] == "Succeeded" {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        let (code, text) = printed(&h, &all).await;
        assert_eq!(code, expected, "{what}: {text}");
        // The table of `list` has no source column; everything else names the source.
        if what != "list human" {
            assert!(
                text.contains("other-pipeline.vhd"),
                "{what}: the source is still named: {text}"
            );
        }
        assert_no_secret(what, &text);
    }
}
