//! `stemcell-gallery cpi` as bosh runs it: one request on stdin, one response line on stdout.
//! No Azure is needed for any of these: info, protocol errors and delegation build no client.

use std::path::PathBuf;

use assert_cmd::Command;
use serde_json::Value;

fn cpi() -> Command {
    let mut c = Command::cargo_bin("stemcell-gallery").unwrap();
    // No configuration at all: proves these paths never resolve settings or credentials.
    c.env_remove("STEMCELL_GALLERY_CONFIG")
        .env_remove("AZURE_SUBSCRIPTION_ID")
        .arg("cpi");
    c
}

/// Run with `input`, check exit 0 and exactly one JSON line on stdout; return it.
fn one_response(mut cmd: Command, input: &[u8]) -> Value {
    let out = cmd.write_stdin(input.to_vec()).output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout {stdout} stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one response line: {stdout:?}");
    serde_json::from_str(lines[0]).unwrap()
}

#[test]
fn info_announces_the_azure_stemcell_formats() {
    let r = one_response(
        cpi(),
        br#"{"method":"info","arguments":[],"context":{"director_uuid":"d"},"api_version":2}"#,
    );
    assert_eq!(r["error"], Value::Null);
    assert_eq!(
        r["result"],
        serde_json::json!({"stemcell_formats": ["azure-vhd", "azure-light"], "api_version": 2})
    );
}

fn error_of(r: &Value) -> (String, String, bool) {
    (
        r["error"]["type"].as_str().unwrap_or_default().to_string(),
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        r["error"]["ok_to_retry"].as_bool().unwrap(),
    )
}

#[test]
fn bad_json_is_an_invalid_call_response_not_a_crash() {
    for input in [&b""[..], b"{", b"[1,2]", b"not json at all"] {
        let r = one_response(cpi(), input);
        let (kind, message, retry) = error_of(&r);
        assert_eq!(kind, "InvalidCall", "{r}");
        assert!(!retry);
        assert!(!message.is_empty());
        assert_eq!(r["result"], Value::Null);
        // The problem is in the response log too, for `bosh task --cpi`.
        assert!(r["log"].as_str().unwrap().contains(&message), "{r}");
    }
}

#[test]
fn wrong_argument_types_name_the_argument() {
    let r = one_response(
        cpi(),
        br#"{"method":"create_stemcell","arguments":[42,{"name":"n","version":"1"}],"context":{}}"#,
    );
    let (kind, message, _) = error_of(&r);
    assert_eq!(kind, "InvalidCall");
    assert!(message.contains("image_path"), "{message}");

    let r = one_response(
        cpi(),
        br#"{"method":"create_stemcell","arguments":["/tmp/image","props"],"context":{}}"#,
    );
    let (kind, message, _) = error_of(&r);
    assert_eq!(kind, "InvalidCall");
    assert!(message.contains("cloud_properties"), "{message}");

    let r = one_response(
        cpi(),
        br#"{"method":"delete_stemcell","arguments":[{"cid":"x"}],"context":{}}"#,
    );
    let (kind, message, _) = error_of(&r);
    assert_eq!(kind, "InvalidCall");
    assert!(message.contains("stemcell_cid"), "{message}");
}

#[test]
fn unknown_method_without_a_delegate_is_not_implemented() {
    let r = one_response(
        cpi(),
        br#"{"method":"create_vm","arguments":["agent",null,{},{},[],{}],"context":{}}"#,
    );
    let (kind, message, retry) = error_of(&r);
    assert_eq!(kind, "Bosh::Clouds::NotImplemented");
    assert!(message.contains("--delegate"), "{message}");
    assert!(!retry);
}

#[test]
fn light_stemcell_without_a_delegate_says_no_gallery_is_needed() {
    let r = one_response(
        cpi(),
        br#"{"method":"create_stemcell","arguments":["/tmp/image",{"name":"bosh-azure-hyperv-ubuntu-jammy-go_agent","version":"1.506","image":{"publisher":"pivotal","offer":"bosh-ubuntu-jammy","sku":"jammy","version":"1.506.0"}}],"context":{}}"#,
    );
    let (kind, message, _) = error_of(&r);
    assert_eq!(kind, "Bosh::Clouds::CloudError");
    assert!(message.contains("light stemcell"), "{message}");
    assert!(message.contains("--delegate"), "{message}");
}

fn fake_delegate() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/cpi/fake-delegate.sh")
}

/// The delegate gets our stdin byte for byte; its stdout and exit status come back unchanged.
fn assert_delegated(input: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("stdin");
    let out = cpi()
        .arg("--delegate")
        .arg(fake_delegate())
        .env("FAKE_CPI_STDIN", &seen)
        .write_stdin(input.to_vec())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "the delegate's exit status");
    assert_eq!(
        out.stdout,
        b"{\"result\":\"from-the-delegate\",\"error\":null,\"log\":\"azure cpi log\\n\"}\n",
        "the delegate's stdout, unchanged"
    );
    assert_eq!(std::fs::read(&seen).unwrap(), input, "stdin, byte for byte");
}

#[test]
fn other_methods_pass_through_to_the_delegate_byte_for_byte() {
    // Odd spacing, unicode and a trailing newline-less body must all arrive unchanged.
    assert_delegated(
        "{ \"method\" : \"create_vm\", \"arguments\": [\"agent-1\", \"bosh-stemcell-x\", {\"instance_type\": \"Standard_D2s_v3\"}, {}, [], {\"note\": \"caf\u{e9}\"}],\n \"context\": {\"director_uuid\": \"d\", \"request_id\": \"cpi-42\"}, \"api_version\": 2}"
            .as_bytes(),
    );
}

#[test]
fn info_and_light_stemcells_go_to_the_delegate_when_there_is_one() {
    assert_delegated(br#"{"method":"info","arguments":[],"context":{}}"#);
    assert_delegated(
        br#"{"method":"create_stemcell","arguments":["/tmp/image",{"name":"n","version":"1","image":{"publisher":"p","offer":"o","sku":"s","version":"1"}}],"context":{"request_id":"cpi-1"}}"#,
    );
}

#[test]
fn a_missing_delegate_is_a_cloud_error_naming_the_path() {
    let r = one_response(
        {
            let mut c = cpi();
            c.arg("--delegate").arg("/nonexistent/azure_cpi/bin/cpi");
            c
        },
        br#"{"method":"create_vm","arguments":[],"context":{}}"#,
    );
    let (kind, message, _) = error_of(&r);
    assert_eq!(kind, "Bosh::Clouds::CloudError");
    assert!(
        message.contains("/nonexistent/azure_cpi/bin/cpi"),
        "{message}"
    );
}
