//! `stemcell-gallery inspect` over every committed fixture, as an operator would run it.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use stemcell_gallery::stemcell::testgen::{self, Expect, Order, StemcellSpec, VhdSpec};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/stemcells")
}

fn inspect_json(path: &Path) -> (i32, serde_json::Value, String) {
    let out = Command::cargo_bin("stemcell-gallery")
        .unwrap()
        .args(["--output", "json", "inspect"])
        .arg(path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{}: stdout is not one JSON document ({e}): {stderr}",
            path.display()
        )
    });
    (out.status.code().unwrap_or(-1), json, stderr)
}

#[test]
fn committed_fixtures_are_exactly_what_the_generator_writes() {
    let expected = testgen::fixtures().unwrap();
    let mut on_disk: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tgz"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = expected.iter().map(|f| f.file.to_string()).collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "regenerate with: cargo run --example gen_stemcell -- --fixtures fixtures/stemcells"
    );
    let total: usize = expected.iter().map(|f| f.bytes.len()).sum();
    assert!(
        total < 1024 * 1024,
        "fixtures must stay under 1 MiB, are {total} bytes"
    );
    for f in &expected {
        let bytes = std::fs::read(fixtures_dir().join(f.file)).unwrap();
        assert!(
            bytes == f.bytes,
            "{} differs from the generator's output; regenerate the fixtures",
            f.file
        );
    }
}

#[test]
fn valid_fixtures_inspect_cleanly_with_every_field() {
    for f in testgen::fixtures().unwrap() {
        let Expect::Valid {
            name,
            version,
            version_key,
            definition,
            architecture,
            generation,
            generated,
        } = f.expect
        else {
            continue;
        };
        let path = fixtures_dir().join(f.file);
        let (code, j, stderr) = inspect_json(&path);
        assert_eq!(code, 0, "{}: {stderr}", f.file);
        assert_eq!(j["name"], name, "{}", f.file);
        assert_eq!(j["version"], version, "{}", f.file);
        assert_eq!(j["version_key"], version_key, "{}", f.file);
        assert_eq!(j["director_definition"], definition, "{}", f.file);
        assert_eq!(
            j["create_env_definition"],
            format!("{definition}-create-env"),
            "{}",
            f.file
        );
        assert_eq!(j["architecture"], architecture, "{}", f.file);
        assert_eq!(j["generation"], generation, "{}", f.file);
        assert_eq!(j["sha1"], generated.image_sha1, "{}", f.file);
        assert_eq!(j["image_sha256"], generated.image_sha256, "{}", f.file);
        assert_eq!(
            j["vhd_virtual_size"],
            generated.vhd_file_size - 512,
            "{}",
            f.file
        );
        assert_eq!(j["data_bytes"], generated.data_bytes, "{}", f.file);
        assert_eq!(j["zero_bytes"], generated.zero_bytes, "{}", f.file);
        assert_eq!(j["formats"], serde_json::json!(["azure-vhd"]), "{}", f.file);
        assert_eq!(j["checksum_verified"], true);
        assert!(j["seconds"].as_f64().unwrap() >= 0.0);
        assert!(j["mib_per_s"].as_f64().is_some());
    }
}

#[test]
fn human_summary_names_version_key_definitions_and_digests() {
    let out = Command::cargo_bin("stemcell-gallery")
        .unwrap()
        .arg("inspect")
        .arg(fixtures_dir().join("gen2-arm64.tgz"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "Gallery version     1.507.2",
        "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2 (director)",
        "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2-create-env (create-env)",
        "Arm64, Hyper-V V2",
        "sha1 verified",
        "SHA-256 of image",
        " zeros",
        "MiB/s",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn broken_fixtures_exit_1_with_their_own_message_and_never_panic() {
    let mut count = 0;
    for f in testgen::fixtures().unwrap() {
        let Expect::Broken(needle) = f.expect else {
            continue;
        };
        count += 1;
        let path = fixtures_dir().join(f.file);
        let out = Command::cargo_bin("stemcell-gallery")
            .unwrap()
            .arg("inspect")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {stderr}", f.file);
        assert!(
            stderr.contains(needle),
            "{}: {stderr:?} lacks {needle:?}",
            f.file
        );
        assert!(
            stderr.contains(f.file),
            "{}: the error names the file: {stderr}",
            f.file
        );
        assert!(!stderr.contains("panicked"), "{}: {stderr}", f.file);
        assert!(
            out.stdout.is_empty(),
            "{}: nothing on stdout in human mode",
            f.file
        );
        // JSON mode: one error document on stdout, same exit code.
        let (code, j, _) = inspect_json(&path);
        assert_eq!(code, 1);
        assert_eq!(j["error"]["exit_code"], 1);
        assert!(
            j["error"]["message"].as_str().unwrap().contains(needle),
            "{}",
            f.file
        );
    }
    assert!(count >= 15, "the broken corpus shrank to {count}");
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let out = Command::cargo_bin("stemcell-gallery")
        .unwrap()
        .args(["inspect", "/nonexistent/stemcell.tgz"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read the stemcell /nonexistent/stemcell.tgz: no such file"),
        "{stderr}"
    );
}

#[test]
fn a_generated_multi_chunk_stemcell_image_first_with_dot_prefixes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.tgz");
    let spec = StemcellSpec {
        order: Order::ImageFirst,
        dot_prefix: true,
        version_yaml: "1.100".into(),
        vhd: VhdSpec {
            mib: 24,
            data_fraction: 0.25,
            seed: 9,
            ..VhdSpec::default()
        },
        level: 1,
        ..StemcellSpec::default()
    };
    let generated = spec.write_to(&path).unwrap();
    assert!(
        !dir.path().join("big.image.tmp").exists(),
        "the staging file is removed"
    );
    let (code, j, stderr) = inspect_json(&path);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(j["version_key"], "1.100.0");
    assert_eq!(j["image_sha256"], generated.image_sha256);
    assert_eq!(j["data_bytes"], generated.data_bytes);
    assert_eq!(j["data_bytes"], 6 * 1024 * 1024 + 512);
    assert_eq!(j["vhd_virtual_size"], 24 * 1024 * 1024);
}

/// Issue 19: Azure has no Arm64 Gen1 image, so `inspect` refuses such a stemcell (exit 1) and
/// says what an Arm64 stemcell needs, instead of reporting it publishable.
#[test]
fn inspect_refuses_an_arm64_gen1_stemcell() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("arm64-gen1.tgz");
    StemcellSpec {
        arm64: true,
        gen2: false,
        ..StemcellSpec::default()
    }
    .write_to(&path)
    .unwrap();
    let (code, json, stderr) = inspect_json(&path);
    assert_eq!(code, 1, "{json}\n{stderr}");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("Arm64") && message.contains("generation: gen2"),
        "{json}"
    );
}
