//! A client secret never shows up in what the tool prints, at any verbosity, whether the
//! identity provider rejects it, is unreachable, or the command succeeds in getting a token.

use crate::support::token_server;

use assert_cmd::Command;
use token_server::TokenServer;

const SECRET: &str = "Leaky~Secret.Value_0123456789abcdef";

fn closed_port_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

/// The token server's https authority and the config line trusting its CA.
fn trusting(tokens: &TokenServer) -> (String, String) {
    (
        tokens.authority.clone(),
        format!("ca_cert = \"{}\"\n", tokens.ca_cert),
    )
}

/// Run `doctor` with the secret in the config file (inline, as cpi.json carries it) and return
/// everything printed.
async fn run(
    (authority, ca): (String, String),
    arm: String,
    extra_args: &[&str],
    rust_log: Option<&str>,
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("sg.toml");
    std::fs::write(
        &cfg,
        format!(
            "subscription = \"sub\"\nresource_group = \"rg\"\ngallery = \"g\"\nauth = \"secret\"\n\
             tenant_id = \"tenant-1\"\nclient_id = \"client-1\"\nclient_secret = \"{SECRET}\"\n\
             authority_host = \"{authority}\"\narm_endpoint = \"{arm}\"\n{ca}"
        ),
    )
    .unwrap();
    let args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
    let rust_log = rust_log.map(str::to_string);
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::cargo_bin("stemcell-gallery").unwrap();
        cmd.env_clear()
            .arg("-vvv")
            .args(&args)
            .arg("doctor")
            .arg("--config")
            .arg(&cfg);
        if let Some(level) = rust_log {
            cmd.env("RUST_LOG", level);
        }
        cmd.output().unwrap()
    })
    .await
    .unwrap();
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn rejected_secret_is_not_printed_at_trace_verbosity() {
    let tokens = TokenServer::standard().await;
    tokens.reject_all(true);
    for output in [&["--output", "human"][..], &["--output", "json"][..]] {
        for rust_log in [None, Some("trace")] {
            let printed = run(trusting(&tokens), closed_port_url(), output, rust_log).await;
            assert!(printed.contains("token"), "doctor ran: {printed}");
            assert!(
                !printed.contains(SECRET),
                "secret leaked ({output:?}, RUST_LOG={rust_log:?}):\n{printed}"
            );
        }
    }
    assert!(
        tokens.count() >= 4,
        "the secret was really sent to the token server"
    );
}

#[tokio::test]
async fn unreachable_authority_does_not_print_the_secret() {
    let authority = closed_port_url().replace("http:", "https:");
    let printed = run(
        (authority, String::new()),
        closed_port_url(),
        &[],
        Some("trace"),
    )
    .await;
    assert!(printed.contains("FAIL"), "{printed}");
    assert!(!printed.contains(SECRET), "secret leaked:\n{printed}");
}

#[tokio::test]
async fn accepted_secret_and_its_token_are_not_printed() {
    // The token server only accepts its own secret, so register ours.
    let tokens = TokenServer::start(token_server::Config {
        tenant: "tenant-1".into(),
        client_id: "client-1".into(),
        client_secret: SECRET.into(),
        ..Default::default()
    })
    .await;
    let printed = run(
        trusting(&tokens),
        closed_port_url(),
        &["--output", "json"],
        Some("trace"),
    )
    .await;
    assert!(
        printed.contains(r#""name":"token","status":"pass""#),
        "{printed}"
    );
    assert!(!printed.contains(SECRET), "secret leaked:\n{printed}");
    assert!(
        !printed.contains("entra-1"),
        "access token leaked:\n{printed}"
    );
}
