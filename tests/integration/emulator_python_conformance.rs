//! Microsoft's own Python SDKs (azure-mgmt-compute, azure-storage-blob) against the emulator:
//! runs tests/conformance/test_sdk.py with the pinned virtualenv in $STEMCELL_GALLERY_TOOLS
//! (fallback: <crate root>/.tools). Fails, never skips, when the tools are missing.

use std::path::PathBuf;

use stemcell_gallery::emulator::{self, Options};

fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tools = std::env::var_os("STEMCELL_GALLERY_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".tools"));
    let python = tools.join("venv/bin/python");
    assert!(
        python.exists(),
        "the Python conformance venv is missing at {}: run scripts/test.sh (or scripts/test-tools.sh) to install \
         azure-mgmt-compute and azure-storage-blob, or set STEMCELL_GALLERY_TOOLS",
        python.display()
    );
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microsofts_python_sdks_work_against_the_emulator() {
    let python = python();
    // Page size 2 so the SDK's pager must follow nextLink.
    let handle = emulator::start(Options {
        page_size: 2,
        ..Default::default()
    })
    .await
    .expect("the emulator starts");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/test_sdk.py");
    let output = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(&handle.arm)
        .arg(&handle.blob)
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "Python SDK conformance failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    assert!(stdout.contains("conformance: ok"), "{stdout}");
    // The SDKs really went through the emulator: LRO polls, paging and blob calls are in the log.
    let log = handle.state.requests();
    assert!(
        log.iter().any(|r| r.path.contains("/operations/")),
        "operation polls logged"
    );
    assert!(
        log.iter().any(|r| r.query.contains("skiptoken")),
        "a nextLink page was fetched"
    );
    assert!(log
        .iter()
        .any(|r| r.service == "blob" && r.query.contains("comp=pagelist")));
}
