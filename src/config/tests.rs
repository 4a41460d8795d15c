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
        assert_eq!(crate::error::HasExit::exit(&err), crate::error::Exit::Usage);
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
