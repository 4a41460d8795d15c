//! The credential kinds that read the process itself: the Azure CLI (a fake `az` on PATH)
//! and the default chain (its environment credential). Every integration test shares one
//! process, so this one changes no environment: it runs its body in a child process of this
//! test binary, started with the PATH and the service principal it needs.

use crate::support::token_server;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use stemcell_gallery::azure::auth::credential;
use stemcell_gallery::cli::GlobalArgs;
use stemcell_gallery::config::Settings;
use token_server::TokenServer;

const SCOPE: &str = "https://management.azure.com/.default";

fn global(auth: &str) -> GlobalArgs {
    GlobalArgs {
        subscription: Some("sub".into()),
        resource_group: Some("rg".into()),
        gallery: Some("g".into()),
        auth: Some(auth.into()),
        ..Default::default()
    }
}

/// Set (to the fake `az`'s directory) only in the child process the test below starts.
const CHILD: &str = "AUTH_PROCESS_ENV_CHILD_DIR";

#[tokio::test]
async fn azure_cli_and_default_chain_get_tokens() {
    // --- Azure CLI: a fake `az` that records its calls and answers like Azure CLI 2.54+.
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls");
    let expiry = dir.path().join("expires_on");
    let az = dir.path().join("az");
    std::fs::write(
        &az,
        format!(
            "#!/bin/sh\necho \"$@\" >> {calls}\nn=$(wc -l < {calls})\nexp=$(cat {expiry})\n\
             printf '{{\"accessToken\":\"cli-%s\",\"expiresOn\":\"2099-01-01 00:00:00.000000\",\"expires_on\":%s,\"subscription\":\"sub\",\"tenant\":\"t\",\"tokenType\":\"Bearer\"}}' \"$n\" \"$exp\"\n",
            calls = calls.display(),
            expiry = expiry.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&az, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );

    // --- The default chain: its first link reads the service principal from the environment.
    let server = TokenServer::standard().await;

    // This binary again, running only the body below, with that environment.
    let name = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, m)| m);
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &format!("{name}::in_its_own_process")])
        .args(["--include-ignored", "--test-threads=1", "--nocapture"])
        .env(CHILD, dir.path())
        .env("PATH", path)
        .env("AZURE_TENANT_ID", "tenant-1")
        .env("AZURE_CLIENT_ID", "client-1")
        .env("AZURE_CLIENT_SECRET", "s3cr3t-Value-never-printed")
        .env("AZURE_AUTHORITY_HOST", &server.authority)
        .env("STEMCELL_GALLERY_CA_CERT", &server.ca_cert)
        .output()
        .await
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "the child failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(server.requests()[0].proof, Some("secret"));
}

/// The body of the test above, in the child process it starts (a no-op anywhere else).
#[tokio::test]
#[ignore = "run by azure_cli_and_default_chain_get_tokens in a process of its own"]
async fn in_its_own_process() {
    let Some(dir) = std::env::var_os(CHILD) else {
        eprintln!("{CHILD} is not set: run azure_cli_and_default_chain_get_tokens instead");
        return;
    };
    let dir = Path::new(&dir);
    let calls = dir.join("calls");
    let expiry = dir.join("expires_on");
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    std::fs::write(&expiry, (now + 3600).to_string()).unwrap();

    let s = Settings::resolve_with_env(&global("azure-cli"), &|_| None).unwrap();
    let cred = credential(&s.credentials()).unwrap();
    let t1 = cred.get_token(&[SCOPE]).await.unwrap();
    let t2 = cred.get_token(&[SCOPE]).await.unwrap();
    assert_eq!(t1.token.secret(), "cli-1");
    assert_eq!(t2.token.secret(), "cli-1", "a fresh CLI token is cached");
    let recorded = std::fs::read_to_string(&calls).unwrap();
    assert_eq!(
        recorded.trim(),
        format!("account get-access-token -o json --scope {SCOPE}")
    );
    // The CLI's token has expired: az is asked again.
    std::fs::write(&expiry, (now - 10).to_string()).unwrap();
    cred.clear_cache().await.unwrap();
    assert_eq!(
        cred.get_token(&[SCOPE]).await.unwrap().token.secret(),
        "cli-2"
    );
    assert_eq!(
        cred.get_token(&[SCOPE]).await.unwrap().token.secret(),
        "cli-3"
    );

    // The default chain, with the service principal and authority host the parent set.
    let authority = std::env::var("AZURE_AUTHORITY_HOST").unwrap();
    let s = Settings::resolve(&global("default")).unwrap();
    assert_eq!(s.authority_host.as_str(), format!("{authority}/"));
    let t = credential(&s.credentials())
        .unwrap()
        .get_token(&[SCOPE])
        .await
        .unwrap();
    assert_eq!(t.token.secret(), "entra-1");
}
