//! Each credential kind gets its token over HTTP from a local identity server, and a token
//! that has expired is fetched again.

use crate::support::tls_front;
use crate::support::token_server;

use std::collections::HashMap;

use stemcell_gallery::azure::auth::{arm_scope, credential};
use stemcell_gallery::cli::GlobalArgs;
use stemcell_gallery::config::Settings;
use token_server::TokenServer;

const SCOPE: &str = "https://management.azure.com/.default";

fn settings(env: &[(&str, &str)], auth: &str) -> Settings {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let global = GlobalArgs {
        subscription: Some("sub".into()),
        resource_group: Some("rg".into()),
        gallery: Some("g".into()),
        auth: Some(auth.into()),
        ..Default::default()
    };
    Settings::resolve_with_env(&global, &|k| env.get(k).cloned()).expect("settings resolve")
}

#[tokio::test]
async fn service_principal_secret_gets_a_token_and_refreshes_it_after_expiry() {
    let server = TokenServer::standard().await;
    let s = settings(
        &[
            ("AZURE_AUTHORITY_HOST", server.authority.as_str()),
            ("STEMCELL_GALLERY_CA_CERT", server.ca_cert.as_str()),
            ("AZURE_TENANT_ID", "tenant-1"),
            ("AZURE_CLIENT_ID", "client-1"),
            ("AZURE_CLIENT_SECRET", "s3cr3t-Value-never-printed"),
        ],
        "secret",
    );
    assert_eq!(arm_scope(&s.credentials()), SCOPE);
    let cred = credential(&s.credentials()).unwrap();

    // A long-lived token is cached: the second call does not reach the server.
    let t1 = cred.get_token(&[SCOPE]).await.unwrap();
    let t2 = cred.get_token(&[SCOPE]).await.unwrap();
    assert_eq!(t1.token.secret(), "entra-1");
    assert_eq!(t2.token.secret(), "entra-1");
    assert_eq!(server.count(), 1);
    let r = &server.requests()[0];
    assert_eq!(r.tenant.as_deref(), Some("tenant-1"));
    assert_eq!(r.client_id.as_deref(), Some("client-1"));
    assert_eq!(r.proof, Some("secret"));
    assert_eq!(r.scope.as_deref(), Some(SCOPE));

    // An expired token is fetched again.
    cred.clear_cache().await.unwrap();
    server.set_expires_in(1);
    let t3 = cred.get_token(&[SCOPE]).await.unwrap();
    let t4 = cred.get_token(&[SCOPE]).await.unwrap();
    assert_eq!(t3.token.secret(), "entra-2");
    assert_eq!(
        t4.token.secret(),
        "entra-3",
        "an expiring token must be refreshed"
    );
    assert_eq!(server.count(), 3);
}

#[tokio::test]
async fn wrong_client_secret_fails_without_showing_the_secret() {
    let server = TokenServer::standard().await;
    let s = settings(
        &[
            ("AZURE_AUTHORITY_HOST", server.authority.as_str()),
            ("STEMCELL_GALLERY_CA_CERT", server.ca_cert.as_str()),
            ("AZURE_TENANT_ID", "tenant-1"),
            ("AZURE_CLIENT_ID", "client-1"),
            ("AZURE_CLIENT_SECRET", "wrong-secret-XYZZY"),
        ],
        "secret",
    );
    let err = credential(&s.credentials())
        .unwrap()
        .get_token(&[SCOPE])
        .await
        .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(!text.contains("wrong-secret-XYZZY"), "{text}");
    assert_eq!(server.count(), 1);
}

#[tokio::test]
async fn workload_identity_exchanges_the_federated_token_file() {
    let server = TokenServer::standard().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "federated-jwt-from-kubelet\n").unwrap();
    let s = settings(
        &[
            ("AZURE_AUTHORITY_HOST", server.authority.as_str()),
            ("STEMCELL_GALLERY_CA_CERT", server.ca_cert.as_str()),
            ("AZURE_TENANT_ID", "tenant-1"),
            ("AZURE_CLIENT_ID", "client-1"),
            ("AZURE_FEDERATED_TOKEN_FILE", token_file.to_str().unwrap()),
        ],
        "workload-identity",
    );
    server.set_expires_in(1);
    let cred = credential(&s.credentials()).unwrap();
    let t1 = cred.get_token(&[SCOPE]).await.unwrap();
    let t2 = cred.get_token(&[SCOPE]).await.unwrap();
    assert_eq!(t1.token.secret(), "entra-1");
    assert_eq!(
        t2.token.secret(),
        "entra-2",
        "an expiring token must be refreshed"
    );
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs.iter().all(|r| r.proof == Some("assertion")));
    assert_eq!(reqs[0].grant_type.as_deref(), Some("client_credentials"));

    assert_eq!(
        reqs[0].assertion.as_deref(),
        Some("federated-jwt-from-kubelet")
    );

    // Kubernetes rotates the projected token: the next refresh presents the new one.
    std::fs::write(&token_file, "federated-jwt-from-kubelet-rotated").unwrap();
    let t3 = cred.get_token(&[SCOPE]).await.unwrap();
    assert_eq!(t3.token.secret(), "entra-3");
    assert_eq!(
        server.requests()[2].assertion.as_deref(),
        Some("federated-jwt-from-kubelet-rotated")
    );

    // Now tokens live an hour: cached.
    server.set_expires_in(3600);
    cred.clear_cache().await.unwrap();
    cred.get_token(&[SCOPE]).await.unwrap();
    cred.get_token(&[SCOPE]).await.unwrap();
    assert_eq!(server.count(), 4);
}

#[tokio::test]
async fn system_assigned_managed_identity_over_imds_refreshes_before_expiry() {
    let server = TokenServer::standard().await;
    let s = settings(
        &[(
            "STEMCELL_GALLERY_IMDS_ENDPOINT",
            &format!("{}/metadata/identity/oauth2/token", server.url),
        )],
        "managed-identity",
    );
    let cred = credential(&s.credentials()).unwrap();
    let t1 = cred.get_token(&[SCOPE]).await.unwrap();
    let t2 = cred.get_token(&[SCOPE]).await.unwrap();
    assert_eq!(t1.token.secret(), "imds-1");
    assert_eq!(t2.token.secret(), "imds-1", "a fresh token is cached");
    let r = &server.requests()[0];
    assert_eq!(r.resource.as_deref(), Some("https://management.azure.com"));
    assert_eq!((r.client_id.as_ref(), r.msi_res_id.as_ref()), (None, None));

    // A token that expires within the refresh window is fetched again.
    server.set_expires_in(60);
    cred.clear_cache().await.unwrap();
    let t3 = cred.get_token(&[SCOPE]).await.unwrap();
    let t4 = cred.get_token(&[SCOPE]).await.unwrap();
    assert_eq!(t3.token.secret(), "imds-2");
    assert_eq!(t4.token.secret(), "imds-3");
    assert_eq!(server.count(), 3);
}

#[tokio::test]
async fn user_assigned_managed_identity_by_client_id_and_by_resource_id() {
    let server = TokenServer::standard().await;
    // AZURE_POD_IDENTITY_AUTHORITY_HOST is a base URL; the IMDS path is appended.
    let base = [("AZURE_POD_IDENTITY_AUTHORITY_HOST", server.url.as_str())];

    let dir = tempfile::tempdir().unwrap();
    let by_client = dir.path().join("client.toml");
    std::fs::write(
        &by_client,
        "managed_identity_client_id = \"uami-client-id\"\n",
    )
    .unwrap();
    let mut global = GlobalArgs {
        subscription: Some("sub".into()),
        resource_group: Some("rg".into()),
        gallery: Some("g".into()),
        config: Some(by_client),
        ..Default::default()
    };
    let env: HashMap<String, String> = base
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let s = Settings::resolve_with_env(&global, &|k| env.get(k).cloned()).unwrap();
    // The identity id alone selects managed identity.
    assert_eq!(s.auth, stemcell_gallery::config::AuthKind::ManagedIdentity);
    let t = credential(&s.credentials())
        .unwrap()
        .get_token(&[SCOPE])
        .await
        .unwrap();
    assert_eq!(t.token.secret(), "imds-1");
    assert_eq!(
        server.requests()[0].client_id.as_deref(),
        Some("uami-client-id")
    );

    let res_id = "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/uami";
    let by_res = dir.path().join("res.toml");
    std::fs::write(
        &by_res,
        format!("managed_identity_resource_id = \"{res_id}\"\n"),
    )
    .unwrap();
    global.config = Some(by_res);
    let s = Settings::resolve_with_env(&global, &|k| env.get(k).cloned()).unwrap();
    let t = credential(&s.credentials())
        .unwrap()
        .get_token(&[SCOPE])
        .await
        .unwrap();
    assert_eq!(t.token.secret(), "imds-2");
    assert_eq!(server.requests()[1].msi_res_id.as_deref(), Some(res_id));

    // An identity the VM does not have: a clear error naming it.
    let unknown = dir.path().join("unknown.toml");
    std::fs::write(&unknown, "managed_identity_client_id = \"not-assigned\"\n").unwrap();
    global.config = Some(unknown);
    let s = Settings::resolve_with_env(&global, &|k| env.get(k).cloned()).unwrap();
    let err = credential(&s.credentials())
        .unwrap()
        .get_token(&[SCOPE])
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("client id not-assigned") && text.contains("Identity not found"),
        "{text}"
    );
}

#[tokio::test]
async fn sovereign_cloud_asks_for_its_own_audience() {
    let server = TokenServer::standard().await;
    let imds = format!("{}/metadata/identity/oauth2/token", server.url);
    let env: HashMap<String, String> =
        [("STEMCELL_GALLERY_IMDS_ENDPOINT".to_string(), imds)].into();
    for (cloud, resource) in [
        ("AzureChinaCloud", "https://management.chinacloudapi.cn"),
        ("AzureUSGovernment", "https://management.usgovcloudapi.net"),
    ] {
        let global = GlobalArgs {
            subscription: Some("sub".into()),
            resource_group: Some("rg".into()),
            gallery: Some("g".into()),
            auth: Some("managed-identity".into()),
            cloud: Some(cloud.into()),
            ..Default::default()
        };
        let s = Settings::resolve_with_env(&global, &|k| env.get(k).cloned()).unwrap();
        let cred = credential(&s.credentials()).unwrap();
        cred.get_token(&[arm_scope(&s.credentials())])
            .await
            .unwrap();
        let last = server.requests().pop().unwrap();
        assert_eq!(last.resource.as_deref(), Some(resource), "{cloud}");
    }
}

/// A system-assigned IMDS credential against a local token server, its first retry after
/// `backoff_ms`.
async fn imds_on_a_token_server(
    backoff_ms: u64,
) -> (TokenServer, stemcell_gallery::azure::imds::ImdsCredential) {
    use stemcell_gallery::azure::imds::ImdsCredential;
    use stemcell_gallery::config::ManagedIdentity;
    let server = TokenServer::standard().await;
    let endpoint: url::Url = format!("{}/metadata/identity/oauth2/token", server.url)
        .parse()
        .unwrap();
    let cred = ImdsCredential::new(endpoint, ManagedIdentity::SystemAssigned)
        .unwrap()
        .with_retry_backoff(std::time::Duration::from_millis(backoff_ms));
    (server, cred)
}

#[tokio::test]
async fn imds_server_errors_are_retried_then_reported() {
    use azure_core::credentials::TokenCredential;
    use stemcell_gallery::azure::imds::RETRIES;
    let (server, cred) = imds_on_a_token_server(1).await;

    // Two 500s, then a token: the caller sees only the token.
    server.fail_next(2);
    let t = cred.get_token(&[SCOPE], None).await.unwrap();
    assert_eq!(t.token.secret(), "imds-1");
    assert_eq!(server.count(), 3);

    // More failures than retries: the error names the status (the IMDS client keeps no
    // tokens; `Credential::cached` does, in the tool).
    server.fail_next(100);
    let err = cred
        .get_token(&[SCOPE], None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("500"), "{err}");
    assert_eq!(server.count(), 3 + 1 + RETRIES as usize);
}

/// IMDS answers 404 while a VM's identity is being set up and 410 while IMDS itself is being
/// updated; the managed-identity guidance says to retry both, 410 for at least 70 s
/// (`crate::error::class_of_status`, IMDS column). Before issue 45 item 2 a 404 or 410 failed the
/// first token request of a freshly started VM.
#[tokio::test]
async fn imds_retries_a_404_and_keeps_retrying_a_410_for_its_window() {
    use azure_core::credentials::TokenCredential;
    use stemcell_gallery::azure::imds::RETRIES;
    let (server, cred) = imds_on_a_token_server(5).await;

    // The identity is being set up: two 404s, then the token.
    server.fail_next_with(2, 404);
    let t = cred.get_token(&[SCOPE], None).await.unwrap();
    assert_eq!(t.token.secret(), "imds-1");
    assert_eq!(server.count(), 3);

    // IMDS is being updated: more 410s than the retry count of other statuses, still a token
    // (the window is 140 first backoffs: 700 ms here, 70 s with the default 500 ms; these five
    // waits take 155 ms).
    let before = server.count();
    server.fail_next_with(RETRIES as u64 + 2, 410);
    let t = cred.get_token(&[SCOPE], None).await.unwrap();
    assert_eq!(t.token.secret(), "imds-2");
    assert_eq!(server.count(), before + RETRIES as usize + 3);

    // A 400 (an identity IMDS does not know) is final: one request.
    let before = server.count();
    server.fail_next_with(1, 400);
    let err = cred
        .get_token(&[SCOPE], None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("400"), "{err}");
    assert_eq!(server.count(), before + 1);
}

/// Issue 15 item 6: token requests trust the extra CA too (azure_identity's HTTP client is the
/// one built with the settings' CAs). Behind a private CA without it: a certificate failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_endpoint_behind_a_private_ca_works_once_ca_cert_trusts_it() {
    let server = TokenServer::standard().await;
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = tls_front::private_ca(dir.path());
    let authority = tls_front::tls_front(&server.url, &cert, &key).await;
    let ca = ca.display().to_string();
    let base = [
        ("AZURE_AUTHORITY_HOST", authority.as_str()),
        ("AZURE_TENANT_ID", "tenant-1"),
        ("AZURE_CLIENT_ID", "client-1"),
        ("AZURE_CLIENT_SECRET", "s3cr3t-Value-never-printed"),
    ];

    let untrusted = credential(&settings(&base, "secret").credentials()).unwrap();
    let err = untrusted.get_token(&[SCOPE]).await.unwrap_err();
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    assert!(
        stemcell_gallery::azure::tls::is_certificate_failure(&text),
        "{text}"
    );
    assert_eq!(server.count(), 0, "no token request got through");

    let mut env = base.to_vec();
    env.push(("STEMCELL_GALLERY_CA_CERT", ca.as_str()));
    let trusted = credential(&settings(&env, "secret").credentials()).unwrap();
    let t = trusted.get_token(&[SCOPE]).await.unwrap();
    assert_eq!(t.token.secret(), "entra-1");
    assert_eq!(server.count(), 1);
}

/// Azure Stack Hub: the ARM token audience is not the ARM endpoint. A command (not only
/// doctor's token check) must ask for the configured audience's scope, or every real request
/// gets 401 (issue 16, item 3: `ArmGallery::new` derived the scope from the endpoint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_on_azure_stack_asks_for_the_configured_audience() {
    let server = TokenServer::standard().await;
    let audience = "https://management.adfs.azurestack.local/4de154de-f8a8-4017-af41-df619da68155";
    let out =
        list_with_a_client_secret(&server, &format!("token_audience = \"{audience}\"\n")).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let scopes: Vec<Option<String>> = server.requests().into_iter().map(|r| r.scope).collect();
    assert!(!scopes.is_empty(), "a token was asked for");
    let want = format!("{audience}/.default");
    assert!(
        scopes.iter().all(|s| s.as_deref() == Some(want.as_str())),
        "every token is for {want}: {scopes:?}"
    );
}

/// `list` with `auth = "secret"` against `server` (its private CA trusted), the config lines
/// `extra` added, and a fresh emulator holding gallery g: the process's output.
async fn list_with_a_client_secret(server: &TokenServer, extra: &str) -> std::process::Output {
    let emulator =
        stemcell_gallery::emulator::start(stemcell_gallery::emulator::Options::default())
            .await
            .expect("the emulator starts");
    emulator
        .state
        .ensure_gallery("sub", "rg", "g", "westeurope")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "s3cr3t-Value-never-printed").unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "subscription = \"sub\"\nresource_group = \"rg\"\ngallery = \"g\"\nlocation = \"westeurope\"\n\
             arm_endpoint = \"{arm}\"\nauth = \"secret\"\ntenant_id = \"tenant-1\"\nclient_id = \"client-1\"\n\
             client_secret_file = \"{secret}\"\nauthority_host = \"{authority}\"\nca_cert = \"{ca}\"\n{extra}",
            arm = emulator.arm,
            secret = secret.display(),
            authority = server.authority,
            ca = server.ca_cert,
        ),
    )
    .unwrap();
    tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"));
        for (k, _) in std::env::vars() {
            if k.starts_with("AZURE_") || k.starts_with("STEMCELL_GALLERY_") {
                cmd.env_remove(k);
            }
        }
        let out = cmd
            .args(["--config"])
            .arg(&config)
            .args(["--output", "json", "list"])
            .output()
            .expect("the binary runs");
        drop(dir);
        out
    })
    .await
    .unwrap()
}

/// Issue 31 item 2: a token endpoint that is slow to answer is a wait like any other: the
/// command says what it waits for while it waits (it used to stand silent for 30 s), then goes
/// on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_token_endpoint_is_a_wait_that_says_what_it_waits_for() {
    let server = TokenServer::standard().await;
    server.delay(3_500);
    let out = list_with_a_client_secret(&server, "").await;
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("still waiting for a token for https://management.azure.com/.default"),
        "says what it waits for: {stderr}"
    );
    assert!(!stderr.contains("s3cr3t"), "{stderr}");
}

/// Issue 31 item 2: a refused credential is said to be the credential's problem, not "could not
/// reach Azure" (the network) and not the gallery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_credential_is_named_as_the_credential_not_the_network() {
    let server = TokenServer::standard().await;
    server.reject_all(true);
    let out = list_with_a_client_secret(&server, "").await;
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no token for") && stderr.contains("The credential"),
        "{stderr}"
    );
    assert!(!stderr.contains("could not reach Azure"), "{stderr}");
    assert!(!stderr.contains("s3cr3t"), "{stderr}");
}
