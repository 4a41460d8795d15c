//! Unit tests of settings resolution.
use super::*;

/// Resolve without the process environment, so the tests are hermetic.
fn resolve(g: &Flags) -> Result<Settings, ConfigError> {
    Settings::resolve_with_env(g, &|_| None)
}

fn args() -> Flags {
    Flags {
        layer: Layer {
            subscription: Some("sub".into()),
            resource_group: Some("rg".into()),
            gallery: Some("g".into()),
            ..Default::default()
        },
        config: None,
    }
}

/// A throwaway self-signed CA (no key kept), for parsing only.
const TEST_CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBnjCCAUOgAwIBAgIUFUbTwyISHi+262FpxrLKLO34jScwCgYIKoZIzj0EAwIw\nIzEhMB8GA1UEAwwYc3RlbWNlbGwtZ2FsbGVyeSB0ZXN0IENBMCAXDTI2MTIwMTA5\nNTUwMVoYDzIxMjYxMTA3MDk1NTAxWjAjMSEwHwYDVQQDDBhzdGVtY2VsbC1nYWxs\nZXJ5IHRlc3QgQ0EwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAARVOHF11tVZrv3s\nFruOHRWzlsy3o69BbqsMlI5pCuJdNO3i64L+6QbN02io2shQQDc3fok02lsdrXaA\n25wUO1aPo1MwUTAdBgNVHQ4EFgQUqpOwxnCBJtRkQqESJLglEGGUraswHwYDVR0j\nBBgwFoAUqpOwxnCBJtRkQqESJLglEGGUraswDwYDVR0TAQH/BAUwAwEB/zAKBggq\nhkjOPQQDAgNJADBGAiEA8d3PVJ/2IgxU0Rv22oKRdeOIzQDrtMsSk048mZXZCQkC\nIQCrAD2L52GzJXDtDsTiWpcffYzaPRJ03MgtzySJhESaKQ==\n-----END CERTIFICATE-----\n";

#[test]
fn ca_cert_that_is_not_pem_is_a_config_error_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let mut g = args();
    g.layer.ca_cert = Some(junk);
    let err = resolve(&g).unwrap_err().to_string();
    assert!(err.contains("ca_cert") && err.contains("PEM"), "{err}");
    g.layer.ca_cert = Some(dir.path().join("absent.pem"));
    let err = resolve(&g).unwrap_err().to_string();
    assert!(
        err.contains("ca_cert") && err.contains("cannot read"),
        "{err}"
    );
    let good = dir.path().join("ca.pem");
    std::fs::write(&good, TEST_CA).unwrap();
    g.layer.ca_cert = Some(good);
    let s = resolve(&g).unwrap();
    assert_eq!(s.ca_bundles.len(), 1);
    assert_eq!(s.ca_bundles[0].count, 1);
}

#[test]
fn ca_cert_comes_from_the_environment_and_ssl_cert_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("ca.pem");
    std::fs::write(&good, TEST_CA).unwrap();
    let path = good.display().to_string();
    let env =
        |k: &str| matches!(k, "STEMCELL_GALLERY_CA_CERT" | "SSL_CERT_FILE").then(|| path.clone());
    let s = Settings::resolve_with_env(&args(), &env).unwrap();
    let sources: Vec<&str> = s.ca_bundles.iter().map(|b| b.source.as_str()).collect();
    assert!(sources[0].starts_with("ca_cert "), "{sources:?}");
    assert!(sources[1].starts_with("SSL_CERT_FILE "), "{sources:?}");
}

/// The Azure CPI job renders `azure.azure_stack.ca_cert` (PEM text) to
/// azure_stack_ca_cert.pem beside cpi.json; PEM text in cpi.json itself counts too.
#[test]
fn cpi_json_azure_stack_ca_cert_is_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let cpi = |stack: serde_json::Value| {
        serde_json::json!({"cloud": {"properties": {"azure": {
            "environment": "AzureStack", "subscription_id": "s", "resource_group_name": "rg",
            "compute_gallery_name": "g", "azure_stack": stack}}}})
        .to_string()
    };
    let path = dir.path().join("cpi.json");
    std::fs::write(&path, cpi(serde_json::json!({"domain": "local.azurestack.external", "resource": "https://management.example/x", "ca_cert": TEST_CA}))).unwrap();
    let g = Flags {
        config: Some(path.clone()),
        ..Default::default()
    };
    let s = resolve(&g).unwrap();
    assert_eq!(s.ca_bundles.len(), 1, "{:?}", s.ca_bundles);
    assert!(s.ca_bundles[0].source.contains("azure.azure_stack.ca_cert"));

    std::fs::write(&path, cpi(serde_json::json!({"domain": "local.azurestack.external", "resource": "https://management.example/x"}))).unwrap();
    std::fs::write(dir.path().join("azure_stack_ca_cert.pem"), TEST_CA).unwrap();
    let s = resolve(&g).unwrap();
    assert!(
        s.ca_bundles[0].source.ends_with("azure_stack_ca_cert.pem"),
        "{:?}",
        s.ca_bundles
    );

    std::fs::write(dir.path().join("azure_stack_ca_cert.pem"), "garbage").unwrap();
    let err = resolve(&g).unwrap_err().to_string();
    assert!(
        err.contains("azure_stack_ca_cert.pem") && err.contains("PEM"),
        "{err}"
    );
}

#[test]
fn plain_http_is_refused_unless_loopback() {
    let mut g = args();
    g.layer.arm_endpoint = Some("http://example.com".into());
    assert!(matches!(resolve(&g), Err(ConfigError::InsecureUrl { .. })));
    g.layer.arm_endpoint = Some("http://127.0.0.1:9999".into());
    assert!(resolve(&g).is_ok());
}

#[test]
fn emulator_auth_is_refused_for_remote_endpoints() {
    let mut g = args();
    g.layer.auth = Some("emulator".into());
    assert!(matches!(
        resolve(&g),
        Err(ConfigError::EmulatorAuthRemote { .. })
    ));
    g.layer.arm_endpoint = Some("http://localhost:1".into());
    assert!(resolve(&g).is_ok());
}

#[test]
fn missing_gallery_names_the_flag() {
    let mut g = args();
    g.layer.gallery = None;
    let err = resolve(&g).unwrap_err().to_string();
    assert!(err.contains("--gallery"), "{err}");
}

/// Found by tests/integration/bad_input.rs: these went into ARM paths and lock blob names unchecked
/// (`--gallery g/images/x` addressed another resource, and blobs were written first).
#[test]
fn names_that_are_arm_path_segments_are_checked_before_any_request() {
    for (field, bad) in [
        ("gallery", "g/images/x"),
        ("gallery", "bosh-gallery"),
        ("gallery", "has space"),
        ("gallery", "_lead"),
        ("gallery", "trail."),
        ("gallery", &"g".repeat(81)),
        ("resource group", "rg/providers/x"),
        ("resource group", "rg."),
        ("resource group", &"r".repeat(91)),
        ("subscription", "sub/resourceGroups/rg"),
        ("subscription", "sub?x=1"),
        ("location", "west/europe?"),
    ] {
        let mut g = args();
        match field {
            "gallery" => g.layer.gallery = Some(bad.to_string()),
            "resource group" => g.layer.resource_group = Some(bad.to_string()),
            "location" => g.layer.location = Some(bad.to_string()),
            _ => g.layer.subscription = Some(bad.to_string()),
        }
        let err = resolve(&g).unwrap_err();
        assert_eq!(
            crate::error::Classified::class(&err).exit(),
            crate::error::Exit::Usage
        );
        let text = err.to_string();
        assert!(text.contains(field) && text.contains(bad), "{bad}: {text}");
    }
    for (gallery, rg) in [
        ("bosh_gallery", "bosh-rg"),
        ("g.1", "rg_(prod).1"),
        ("G", "Ressourcengruppe-ä"),
    ] {
        let mut g = args();
        g.layer.gallery = Some(gallery.into());
        g.layer.resource_group = Some(rg.into());
        assert!(resolve(&g).is_ok(), "{gallery} {rg}");
    }
}

#[test]
fn loopback_is_this_machine_only() {
    for yes in [
        "http://localhost:1",
        "http://LOCALHOST",
        "http://127.0.0.1",
        "http://127.10.0.3:5",
        "http://[::1]:7",
    ] {
        assert!(is_loopback(&url::Url::parse(yes).unwrap()), "{yes}");
    }
    for no in [
        "http://127.0.0.1.example.com",
        "http://localhost.example.com",
        "http://10.0.0.1",
        "http://169.254.169.254",
        "http://[::2]",
        "http://example.com",
    ] {
        assert!(!is_loopback(&url::Url::parse(no).unwrap()), "{no}");
    }
}

#[test]
fn non_http_schemes_are_refused() {
    let mut g = args();
    g.layer.arm_endpoint = Some("ftp://127.0.0.1".into());
    assert!(matches!(resolve(&g), Err(ConfigError::BadUrl { .. })));
}

#[test]
fn auth_is_inferred_from_the_credential_material() {
    let layer = |f: &dyn Fn(&mut Layer)| {
        let mut l = Layer {
            subscription: Some("s".into()),
            resource_group: Some("rg".into()),
            gallery: Some("g".into()),
            tenant_id: Some("t".into()),
            client_id: Some("c".into()),
            ..Layer::default()
        };
        f(&mut l);
        Settings::from_layer(l, None).map(|s| s.auth)
    };
    assert_eq!(layer(&|_| {}).unwrap(), AuthKind::Default);
    assert_eq!(
        layer(&|l| l.client_secret = Some(SecretString::new("x"))).unwrap(),
        AuthKind::Secret
    );
    assert_eq!(
        layer(&|l| l.federated_token_file = Some("/t".into())).unwrap(),
        AuthKind::WorkloadIdentity
    );
    assert_eq!(
        layer(&|l| l.managed_identity_client_id = Some("id".into())).unwrap(),
        AuthKind::ManagedIdentity
    );
    // An explicit choice wins.
    assert_eq!(
        layer(&|l| {
            l.client_secret = Some(SecretString::new("x"));
            l.auth = Some("azure-cli".into());
        })
        .unwrap(),
        AuthKind::AzureCli
    );
    assert!(layer(&|l| {
        l.managed_identity_client_id = Some("a".into());
        l.managed_identity_resource_id = Some("b".into());
    })
    .is_err());
}

/// A multi-CPI director sends each CPI's properties in the request context; they win over the
/// job's cpi.json key by key, as in the Azure CPI (`cloud_properties['azure'].merge!(context)`).
#[test]
fn a_request_context_names_the_gallery_subscription_and_credentials_of_its_cpi() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cpi.json");
    std::fs::write(
        &path,
        serde_json::json!({"cloud": {"properties": {"azure": {
            "environment": "AzureCloud", "subscription_id": "11111111-1111-1111-1111-111111111111",
            "resource_group_name": "rg-a", "compute_gallery_name": "gallery_a",
            "storage_account_name": "accounta", "location": "westeurope",
            "tenant_id": "tenant-a", "client_id": "client-a", "client_secret": "secret-a"}}}})
        .to_string(),
    )
    .unwrap();
    let g = Flags {
        config: Some(path),
        ..Default::default()
    };
    let context: serde_json::Map<String, serde_json::Value> = serde_json::from_value(
        serde_json::json!({"director_uuid": "d", "request_id": "cpi-1",
            "subscription_id": "22222222-2222-2222-2222-222222222222",
            "resource_group_name": "rg-b", "compute_gallery_name": "gallery_b",
            "storage_account_name": "accountb", "client_id": "client-b",
            "client_secret": "secret-b", "unknown_cpi_key": {"x": 1}}),
    )
    .unwrap();
    let layer = context_layer(&context).unwrap().expect("properties found");
    assert!(!layer
        .keys
        .iter()
        .any(|k| k == "director_uuid" || k == "unknown_cpi_key"));
    let s = Settings::resolve_with_context(&g, &|_| None, Some(&layer)).unwrap();
    assert_eq!(s.gallery, "gallery_b");
    assert_eq!(s.resource_group, "rg-b");
    assert_eq!(s.subscription, "22222222-2222-2222-2222-222222222222");
    assert_eq!(s.client_id.as_deref(), Some("client-b"));
    assert_eq!(
        s.client_secret.as_ref().map(|x| x.expose()),
        Some("secret-b")
    );
    // Key by key: what the context does not name comes from cpi.json.
    assert_eq!(s.tenant_id.as_deref(), Some("tenant-a"));
    assert_eq!(s.location.as_deref(), Some("westeurope"));
    assert_eq!(
        s.blob_endpoint
            .as_ref()
            .map(|u| u.host_str().unwrap_or_default().to_string()),
        Some("accountb.blob.core.windows.net".to_string())
    );
    // Without the context, the file's.
    assert_eq!(resolve(&g).unwrap().gallery, "gallery_a");
}

#[test]
fn a_context_without_cpi_properties_changes_nothing_and_bad_values_are_refused() {
    let bosh_only: serde_json::Map<String, serde_json::Value> =
        serde_json::from_value(serde_json::json!({"director_uuid": "d", "request_id": "r", "vm": {"stemcell": {"api_version": 3}}}))
            .unwrap();
    assert!(context_layer(&bosh_only).unwrap().is_none());
    let bad: serde_json::Map<String, serde_json::Value> =
        serde_json::from_value(serde_json::json!({"compute_gallery_name": ["not", "a", "string"]}))
            .unwrap();
    let err = context_layer(&bad).unwrap_err().to_string();
    assert!(
        err.contains("request context") && err.contains("compute_gallery_name"),
        "{err}"
    );
}

/// A storage account from the context replaces a blob endpoint from the file (they would name
/// two accounts), and static credentials from the context replace a managed identity.
#[test]
fn context_storage_and_credentials_replace_what_belongs_with_them() {
    let lower = Layer {
        blob_endpoint: Some("https://accounta.blob.core.windows.net".into()),
        storage_account_resource_group: Some("rg-a".into()),
        managed_identity: true,
        client_secret_file: Some("/etc/secret-a".into()),
        ..Default::default()
    };
    let context: serde_json::Map<String, serde_json::Value> = serde_json::from_value(
        serde_json::json!({"storage_account_name": "accountb", "credentials_source": "static",
            "client_id": "c", "client_secret": "s"}),
    )
    .unwrap();
    let merged = context_layer(&context).unwrap().unwrap().over(lower);
    assert_eq!(merged.blob_endpoint, None);
    assert_eq!(merged.storage_account.as_deref(), Some("accountb"));
    assert_eq!(merged.storage_account_resource_group, None);
    assert!(!merged.managed_identity);
    assert_eq!(merged.client_secret_file, None);
}

/// deploy/ installs the configuration at /etc/stemcell-gallery/config.toml: it is read when no
/// file is named and it exists; a named file wins; an empty name turns it off.
#[test]
fn the_default_config_file_is_discovered_when_present() {
    let dir = tempfile::tempdir().unwrap();
    let default = dir.path().join("config.toml");
    assert_eq!(config_file_to_read(None, &default), None);
    std::fs::write(&default, "gallery = \"g\"\n").unwrap();
    assert_eq!(config_file_to_read(None, &default), Some(default.clone()));
    let named = dir.path().join("other.toml");
    assert_eq!(
        config_file_to_read(Some(named.clone()), &default),
        Some(named)
    );
    assert_eq!(config_file_to_read(Some(PathBuf::new()), &default), None);
    assert_eq!(DEFAULT_CONFIG_FILE, "/etc/stemcell-gallery/config.toml");
}

/// Issue 30 item 6: the end of life and the deletion block come from cpi.json
/// (`stemcell_gallery_end_of_life`, `stemcell_gallery_block_deletion_before_end_of_life`) or the
/// TOML keys; an unreadable end of life is a config error naming the key.
#[test]
fn end_of_life_and_deletion_block_are_settings_and_a_bad_one_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cpi.json");
    std::fs::write(
        &path,
        serde_json::json!({"cloud": {"properties": {"azure": {
            "subscription_id": "s", "resource_group_name": "rg", "compute_gallery_name": "g",
            "stemcell_gallery_end_of_life": "26weeks",
            "stemcell_gallery_block_deletion_before_end_of_life": true}}}})
        .to_string(),
    )
    .unwrap();
    let g = Flags {
        config: Some(path),
        ..Default::default()
    };
    let s = resolve(&g).unwrap();
    assert_eq!(
        s.safeguards,
        crate::safeguards::Safeguards {
            end_of_life: Some(crate::safeguards::EndOfLife::After(
                std::time::Duration::from_secs(26 * 7 * 86_400)
            )),
            block_deletion_before_end_of_life: true,
        }
    );
    assert_eq!(resolve(&args()).unwrap().safeguards, Default::default());
    let mut bad = args();
    bad.layer.end_of_life = Some("soon".into());
    let err = resolve(&bad).unwrap_err().to_string();
    assert!(
        err.contains("end_of_life") && err.contains("\"soon\""),
        "{err}"
    );
}

/// Issue 48 item 3: with nothing configured, one run names every missing setting with its flag,
/// environment variable and config key, and says `--emulator` tries the tool without Azure.
#[test]
fn every_missing_setting_is_named_at_once_with_every_way_to_set_it() {
    let g = Flags {
        layer: Layer::default(),
        config: None,
    };
    let err = resolve(&g).unwrap_err();
    let text = err.to_string();
    for want in [
        "--subscription",
        "AZURE_SUBSCRIPTION_ID",
        "`subscription`",
        "--resource-group",
        "STEMCELL_GALLERY_RESOURCE_GROUP",
        "`resource_group`",
        "--gallery",
        "STEMCELL_GALLERY_GALLERY",
        "`gallery`",
        "--emulator",
    ] {
        assert!(text.contains(want), "{want} missing from: {text}");
    }
    assert_eq!(
        crate::error::Classified::class(&err),
        crate::error::Class::Usage
    );
    // One missing: named alone.
    let mut one = args();
    one.layer.resource_group = None;
    let text = resolve(&one).unwrap_err().to_string();
    assert!(
        text.starts_with("the resource group is not set (--resource-group"),
        "{text}"
    );
    assert!(!text.contains("--gallery"), "{text}");
}

/// Issue 48 item 5: `--gallery ''` is refused by name, not taken as unset.
#[test]
fn a_gallery_name_given_empty_is_refused() {
    let mut g = args();
    g.layer.gallery = Some(String::new());
    let text = resolve(&g).unwrap_err().to_string();
    assert!(
        text.contains("the gallery name is empty (--gallery '')"),
        "{text}"
    );
}
