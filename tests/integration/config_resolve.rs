//! Settings resolution: the Azure CPI's cpi.json, our TOML, the environment and the flags, in
//! that order of increasing precedence; clouds; and the rules that refuse insecure endpoints.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use stemcell_gallery::cli::GlobalArgs;
use stemcell_gallery::config::cloud::CloudName;
use stemcell_gallery::config::{AuthKind, ConfigError, ManagedIdentity, Settings};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/config")
        .join(name)
}

fn resolve(global: &GlobalArgs, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::resolve_with_env(global, &|k| env.get(k).cloned())
}

fn with_config(path: PathBuf) -> GlobalArgs {
    GlobalArgs {
        config: Some(path),
        ..Default::default()
    }
}

#[test]
fn azure_cpi_json_alone_is_enough_to_run() {
    let s = resolve(&with_config(fixture("cpi.json")), &[]).unwrap();
    assert_eq!(s.subscription, "12345678-1234-1234-1234-123456789012");
    assert_eq!(s.resource_group, "bosh-rg");
    assert_eq!(s.gallery, "bosh_gallery");
    assert_eq!(s.location.as_deref(), Some("eastus"));
    assert_eq!(s.cloud, CloudName::AzureCloud);
    assert_eq!(s.arm_endpoint.as_str(), "https://management.azure.com/");
    assert_eq!(
        s.authority_host.as_str(),
        "https://login.microsoftonline.com/"
    );
    assert_eq!(s.token_scope, "https://management.azure.com/.default");
    assert_eq!(s.auth, AuthKind::Secret);
    assert_eq!(
        s.tenant_id.as_deref(),
        Some("87654321-4321-4321-4321-210987654321")
    );
    assert_eq!(
        s.client_id.as_deref(),
        Some("11111111-2222-3333-4444-555555555555")
    );
    assert_eq!(
        s.client_secret.as_ref().map(|x| x.expose()),
        Some("cpi-json-client-secret-DO-NOT-PRINT")
    );
    assert_eq!(
        s.blob_endpoint.as_ref().map(|u| u.as_str()),
        Some("https://boshstemcells01.blob.core.windows.net/")
    );
    // cpi.json names the account but not its resource group: the id is looked up through ARM
    // when needed, never assumed to be in the gallery's resource group (issue 16).
    assert_eq!(s.storage_account.as_deref(), Some("boshstemcells01"));
    assert_eq!(s.storage_account_id(), None);
    assert_eq!(s.replicas, Some(2));
    assert!(!s.adopt_unverified, "never without the operator asking");
    assert!(
        s.protect_held_versions,
        "held versions are locked unless turned off"
    );
    // Debug output of the settings never shows the secret.
    let debug = format!("{s:?}");
    assert!(!debug.contains("DO-NOT-PRINT"), "{debug}");
}

#[test]
fn azure_stack_cpi_json_gives_custom_endpoints_and_managed_identity() {
    let s = resolve(&with_config(fixture("cpi-azurestack.json")), &[]).unwrap();
    assert_eq!(s.cloud, CloudName::Custom);
    assert_eq!(
        s.arm_endpoint.as_str(),
        "https://management.local.azurestack.external/"
    );
    assert_eq!(
        s.authority_host.as_str(),
        "https://login.microsoftonline.com/"
    );
    assert_eq!(
        s.token_scope,
        "https://management.adfs.azurestack.local/4de154de-f8a8-4017-af41-df619da68155/.default"
    );
    assert_eq!(
        s.blob_endpoint.as_ref().map(|u| u.as_str()),
        Some("https://stackstore.blob.local.azurestack.external/")
    );
    assert_eq!(s.auth, AuthKind::ManagedIdentity);
    assert_eq!(
        s.managed_identity,
        ManagedIdentity::ResourceId(
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/bosh".into()
        )
    );
}

#[test]
fn our_toml_reads_the_secret_from_a_file() {
    let s = resolve(&with_config(fixture("stemcell-gallery.toml")), &[]).unwrap();
    assert_eq!(s.auth, AuthKind::Secret);
    assert_eq!(
        s.client_secret.as_ref().map(|x| x.expose()),
        Some("secret-from-file-DO-NOT-PRINT")
    );
    assert_eq!(
        s.storage_account_id().as_deref(),
        Some("/subscriptions/12345678-1234-1234-1234-123456789012/resourceGroups/storage-rg/providers/Microsoft.Storage/storageAccounts/boshstemcells01")
    );
    assert_eq!(s.replicas, Some(3));
    assert_eq!(s.create_env_suffix.as_deref(), Some("-create-env"));
}

#[test]
fn flags_beat_environment_beat_toml_beat_cpi_json() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("sg.toml");
    // The TOML layers on the CPI's file: it overrides location and gallery only.
    std::fs::write(
        &toml,
        format!(
            "cpi_config = {:?}\nlocation = \"from-toml\"\ngallery = \"toml_gallery\"\nresource_group = \"toml-rg\"\n",
            fixture("cpi.json")
        ),
    )
    .unwrap();
    let global = GlobalArgs {
        config: Some(toml),
        subscription: Some("from-flag".into()),
        ..Default::default()
    };
    let env = [
        ("AZURE_SUBSCRIPTION_ID", "from-env"),
        ("STEMCELL_GALLERY_RESOURCE_GROUP", "env-rg"),
    ];
    let s = resolve(&global, &env).unwrap();
    assert_eq!(s.subscription, "from-flag", "flag beats env and files");
    assert_eq!(s.resource_group, "env-rg", "env beats the TOML");
    assert_eq!(s.gallery, "toml_gallery", "TOML beats cpi.json");
    assert_eq!(s.location.as_deref(), Some("from-toml"));
    assert_eq!(
        s.tenant_id.as_deref(),
        Some("87654321-4321-4321-4321-210987654321"),
        "cpi.json fills the rest"
    );
    assert_eq!(s.replicas, Some(2));
}

#[test]
fn unknown_toml_key_names_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("typo.toml");
    std::fs::write(&toml, "subscription = \"s\"\nresource_grup = \"rg\"\n").unwrap();
    let err = resolve(&with_config(toml.clone()), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("resource_grup"), "{err}");
    assert!(err.contains(&toml.display().to_string()), "{err}");
}

#[test]
fn json_that_is_not_a_cpi_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("other.json");
    std::fs::write(
        &json,
        r#"{"cloud": {"plugin": "aws", "properties": {"aws": {}}}}"#,
    )
    .unwrap();
    let err = resolve(&with_config(json), &[]).unwrap_err().to_string();
    assert!(err.contains("cloud.properties.azure"), "{err}");
}

#[test]
fn cpi_client_certificate_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("cpi.json");
    std::fs::write(
        &json,
        r#"{"cloud":{"properties":{"azure":{"credentials_source":"static","subscription_id":"s",
        "resource_group_name":"rg","compute_gallery_name":"g","tenant_id":"t","client_id":"c",
        "certificate":"-----BEGIN PRIVATE KEY-----"}}}}"#,
    )
    .unwrap();
    let global = GlobalArgs {
        config: Some(json),
        auth: Some("secret".into()),
        ..Default::default()
    };
    let err = resolve(&global, &[]).unwrap_err().to_string();
    assert!(err.contains("client certificate"), "{err}");
    assert!(!err.contains("PRIVATE KEY"), "{err}");
}

fn base() -> GlobalArgs {
    GlobalArgs {
        subscription: Some("s".into()),
        resource_group: Some("rg".into()),
        gallery: Some("g".into()),
        ..Default::default()
    }
}

#[test]
fn plain_http_authority_host_is_refused_unless_loopback() {
    let err = resolve(
        &base(),
        &[("AZURE_AUTHORITY_HOST", "http://login.example.com")],
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::InsecureUrl {
                what: "the authority host",
                ..
            }
        ),
        "{err}"
    );
    let s = resolve(
        &base(),
        &[("AZURE_AUTHORITY_HOST", "http://127.0.0.1:8080")],
    )
    .unwrap();
    assert_eq!(s.authority_host.as_str(), "http://127.0.0.1:8080/");
}

#[test]
fn imds_over_http_only_to_the_link_local_address_or_loopback() {
    let s = resolve(&base(), &[]).unwrap();
    assert_eq!(
        s.imds_endpoint.as_str(),
        "http://169.254.169.254/metadata/identity/oauth2/token"
    );
    for ok in [
        "http://127.0.0.1:1/metadata/identity/oauth2/token",
        "http://[::1]:2/x",
        "https://imds.example/x",
    ] {
        assert!(
            resolve(&base(), &[("STEMCELL_GALLERY_IMDS_ENDPOINT", ok)]).is_ok(),
            "{ok}"
        );
    }
    for bad in [
        "http://169.254.169.253/x",
        "http://10.0.0.1/x",
        "http://imds.example/x",
    ] {
        let err = resolve(&base(), &[("STEMCELL_GALLERY_IMDS_ENDPOINT", bad)]).unwrap_err();
        assert!(
            matches!(err, ConfigError::InsecureUrl { .. }),
            "{bad}: {err}"
        );
    }
}

#[test]
fn a_custom_cloud_needs_its_endpoints() {
    let mut g = base();
    g.cloud = Some("AzureStack".into());
    let err = resolve(&g, &[]).unwrap_err().to_string();
    assert!(err.contains("--arm-endpoint"), "{err}");
    g.arm_endpoint = Some("https://management.hub.example".into());
    let err = resolve(&g, &[]).unwrap_err().to_string();
    assert!(err.contains("authority"), "{err}");
    let s = resolve(&g, &[("AZURE_AUTHORITY_HOST", "https://adfs.hub.example")]).unwrap();
    assert_eq!(s.token_scope, "https://management.hub.example/.default");
    assert_eq!(s.storage_suffix, None);
}

#[test]
fn unknown_cloud_and_auth_kinds_are_named() {
    let mut g = base();
    g.cloud = Some("AzureGermanCloud".into());
    let err = resolve(&g, &[]).unwrap_err().to_string();
    assert!(
        err.contains("AzureGermanCloud") && err.contains("AzureUSGovernment"),
        "{err}"
    );
    let mut g = base();
    g.auth = Some("password".into());
    let err = resolve(&g, &[]).unwrap_err().to_string();
    assert!(
        err.contains("password") && err.contains("workload-identity"),
        "{err}"
    );
}

#[test]
fn secret_auth_names_what_is_missing() {
    let mut g = base();
    g.auth = Some("secret".into());
    let err = resolve(&g, &[("AZURE_CLIENT_ID", "c")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("tenant id"), "{err}");
    let err = resolve(&g, &[("AZURE_CLIENT_ID", "c"), ("AZURE_TENANT_ID", "t")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("client secret"), "{err}");
}

#[test]
fn sovereign_cloud_derives_blob_endpoint_with_its_suffix() {
    let mut g = base();
    g.cloud = Some("AzureChinaCloud".into());
    let s = resolve(&g, &[("STEMCELL_GALLERY_STORAGE_ACCOUNT", "acct01")]).unwrap();
    assert_eq!(
        s.blob_endpoint.as_ref().map(|u| u.as_str()),
        Some("https://acct01.blob.core.chinacloudapi.cn/")
    );
    assert_eq!(
        s.arm_endpoint.as_str(),
        "https://management.chinacloudapi.cn/"
    );
    let err = resolve(&g, &[("STEMCELL_GALLERY_STORAGE_ACCOUNT", "Bad_Name")]).unwrap_err();
    assert!(err.to_string().contains("Bad_Name"), "{err}");
}

#[test]
fn a_broken_secret_line_is_reported_by_line_number_without_its_text() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("broken.toml");
    std::fs::write(
        &toml,
        "subscription = \"s\"\nclient_secret = \"half-typed-SECRET-value\nresource_group = \"rg\"\n",
    )
    .unwrap();
    let err = resolve(&with_config(toml), &[]).unwrap_err().to_string();
    assert!(err.contains("line 2"), "{err}");
    assert!(!err.contains("half-typed-SECRET-value"), "{err}");

    let toml = dir.path().join("typed.toml");
    std::fs::write(&toml, "client_secret = 12345678987654321\n").unwrap();
    let err = resolve(&with_config(toml), &[]).unwrap_err().to_string();
    assert!(err.contains("line 1"), "{err}");
    assert!(!err.contains("12345678987654321"), "{err}");
}

#[test]
fn the_documented_example_with_every_key_resolves() {
    let s = resolve(&with_config(fixture("all-keys.toml")), &[]).unwrap();
    assert_eq!(s.gallery, "bosh_gallery");
    assert_eq!(s.auth, AuthKind::Secret);
    assert_eq!(
        s.location.as_deref(),
        Some("westeurope"),
        "the TOML beats its cpi.json"
    );
    assert_eq!(s.replicas, Some(3));
    assert_eq!(s.create_env, Some(false));
    assert_eq!(
        s.consumer_subscriptions,
        vec!["22222222-3333-4444-5555-666666666666"]
    );
    assert_eq!(
        s.federated_token_file.as_deref(),
        Some(Path::new(
            "/var/run/secrets/azure/tokens/azure-identity-token"
        ))
    );
}

/// Consumer subscriptions come from the flag (`cleanup --consumer-subscription`), the environment
/// (comma-separated) and the TOML file, and every source counts: reading more scopes only keeps
/// more. Each is a GUID; duplicates and the gallery's own subscription are dropped.
#[test]
fn consumer_subscriptions_from_flags_environment_and_file_all_count() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("c.toml");
    std::fs::write(
        &toml,
        "subscription = \"11111111-2222-3333-4444-555555555555\"\nresource_group = \"rg\"\n\
         gallery = \"g\"\nauth = \"emulator\"\narm_endpoint = \"http://127.0.0.1:1\"\n\
         consumer_subscriptions = [\"aaaaaaaa-0000-0000-0000-000000000001\", \"11111111-2222-3333-4444-555555555555\"]\n",
    )
    .unwrap();
    let mut g = with_config(toml.clone());
    g.consumer_subscriptions = vec!["BBBBBBBB-0000-0000-0000-000000000002".into()];
    let s = resolve(
        &g,
        &[(
            "STEMCELL_GALLERY_CONSUMER_SUBSCRIPTIONS",
            "cccccccc-0000-0000-0000-000000000003, aaaaaaaa-0000-0000-0000-000000000001",
        )],
    )
    .unwrap();
    assert_eq!(
        s.consumer_subscriptions,
        vec![
            "bbbbbbbb-0000-0000-0000-000000000002",
            "cccccccc-0000-0000-0000-000000000003",
            "aaaaaaaa-0000-0000-0000-000000000001",
        ]
    );
    let none = resolve(&with_config(toml.clone()), &[]).unwrap();
    assert_eq!(
        none.consumer_subscriptions,
        vec!["aaaaaaaa-0000-0000-0000-000000000001"]
    );
    for bad in [
        "not-a-guid",
        "",
        "11111111-2222-3333-4444-55555555555g",
        "/subscriptions/x",
    ] {
        let mut g = with_config(toml.clone());
        g.consumer_subscriptions = vec![bad.into()];
        let err = resolve(&g, &[]).unwrap_err();
        assert!(matches!(err, ConfigError::Invalid(_)), "{bad}: {err}");
        assert!(err.to_string().contains("GUID"), "{err}");
    }
}

/// The CPI front reads its consumer subscriptions from cpi.json (our key beside the Azure CPI's).
#[test]
fn cpi_json_names_consumer_subscriptions_for_delete_stemcell() {
    let dir = tempfile::tempdir().unwrap();
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("cpi.json")).unwrap()).unwrap();
    doc["cloud"]["properties"]["azure"]["stemcell_gallery_consumer_subscriptions"] =
        serde_json::json!(["dddddddd-0000-0000-0000-000000000004"]);
    let path = dir.path().join("cpi.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    let s = resolve(&with_config(path.clone()), &[]).unwrap();
    assert_eq!(
        s.consumer_subscriptions,
        vec!["dddddddd-0000-0000-0000-000000000004"]
    );
    doc["cloud"]["properties"]["azure"]["stemcell_gallery_consumer_subscriptions"] =
        serde_json::json!("dddddddd-0000-0000-0000-000000000004");
    std::fs::write(&path, doc.to_string()).unwrap();
    assert!(resolve(&with_config(path), &[]).is_err());
}

#[test]
fn cpi_json_stemcell_gallery_adopt_unverified_is_the_operators_override() {
    let dir = tempfile::tempdir().unwrap();
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("cpi.json")).unwrap()).unwrap();
    doc["cloud"]["properties"]["azure"]["stemcell_gallery_adopt_unverified"] = true.into();
    let path = dir.path().join("cpi.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    assert!(
        resolve(&with_config(path.clone()), &[])
            .unwrap()
            .adopt_unverified
    );
    doc["cloud"]["properties"]["azure"]["stemcell_gallery_adopt_unverified"] = "yes".into();
    std::fs::write(&path, doc.to_string()).unwrap();
    let err = resolve(&with_config(path), &[]).unwrap_err().to_string();
    assert!(err.contains("stemcell_gallery_adopt_unverified"), "{err}");
}

/// Issue 46: `stemcell_gallery_protect_held_versions: false` in cpi.json turns the delete lock
/// off on purpose; a value that is not a boolean is refused, naming the key.
#[test]
fn cpi_json_can_turn_the_delete_lock_of_held_versions_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("cpi.json")).unwrap()).unwrap();
    doc["cloud"]["properties"]["azure"]["stemcell_gallery_protect_held_versions"] = false.into();
    let path = dir.path().join("cpi.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    assert!(
        !resolve(&with_config(path.clone()), &[])
            .unwrap()
            .protect_held_versions
    );
    doc["cloud"]["properties"]["azure"]["stemcell_gallery_protect_held_versions"] = "no".into();
    std::fs::write(&path, doc.to_string()).unwrap();
    let err = resolve(&with_config(path), &[]).unwrap_err().to_string();
    assert!(
        err.contains("stemcell_gallery_protect_held_versions"),
        "{err}"
    );
}

/// Issue 31: `--config ''`, `--config=` and an empty STEMCELL_GALLERY_CONFIG, documented (README,
/// `--help`) to turn the default config file off, exited 2 ("a value is required"). Each now runs
/// with no config file; a named file that does not exist still fails the configuration check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_config_name_reads_no_config_file() {
    let h = stemcell_gallery::emulator::start(stemcell_gallery::emulator::Options::default())
        .await
        .unwrap();
    let sub = "11111111-2222-3333-4444-555555555555";
    h.state
        .ensure_gallery(sub, "bosh-rg", "g", "westeurope")
        .unwrap();
    h.state.ensure_container("stemcell").unwrap();
    let doctor = |config: &[&str], env: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"));
        cmd.args(config)
            .args(["--arm-endpoint", &h.arm, "--blob-endpoint", &h.blob])
            .args(["--auth", "emulator", "--subscription", sub])
            .args(["--resource-group", "bosh-rg", "--gallery", "g"])
            .args(["--output", "json", "doctor"])
            .env_remove("AZURE_SUBSCRIPTION_ID")
            .env_remove("STEMCELL_GALLERY_CONFIG");
        if let Some(value) = env {
            cmd.env("STEMCELL_GALLERY_CONFIG", value);
        }
        let out = cmd.output().unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        (out, doc)
    };
    for (config, env) in [
        (&["--config", ""][..], None),
        (&["--config="][..], None),
        (&[][..], Some("")),
        // The flag wins over the variable, empty or not.
        (&["--config", ""][..], Some("/nonexistent/config.toml")),
    ] {
        let (out, doc) = doctor(config, env);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{config:?} STEMCELL_GALLERY_CONFIG={env:?}: {doc}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let checks = doc["checks"].as_array().unwrap();
        let configuration = checks
            .iter()
            .find(|c| c["name"] == "configuration")
            .unwrap();
        let detail = configuration["detail"].as_str().unwrap();
        assert!(!detail.contains(", config "), "{detail}");
    }

    // A named file is read: one that does not exist fails doctor's configuration check.
    for (config, env) in [
        (&["--config", "/nonexistent/config.toml"][..], None),
        (&[][..], Some("/nonexistent/config.toml")),
    ] {
        let (out, doc) = doctor(config, env);
        assert_eq!(out.status.code(), Some(1), "{doc}");
        let configuration = &doc["checks"][0];
        assert_eq!(configuration["name"], "configuration");
        assert_eq!(configuration["status"], "fail");
        assert!(
            configuration["detail"]
                .as_str()
                .unwrap()
                .contains("config file /nonexistent/config.toml: cannot read it"),
            "{doc}"
        );
    }
}
