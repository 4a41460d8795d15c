//! deploy/bosh: the ops files are valid YAML go-patch operations, and the job's template only
//! uses properties its spec declares.

use std::path::PathBuf;

use serde_yaml_ng::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/bosh")
}

fn yaml(rel: &str) -> Value {
    let text = std::fs::read_to_string(root().join(rel)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{rel} is not valid YAML: {e}"))
}

#[test]
fn ops_files_are_go_patch_operations() {
    for rel in ["ops/director.yml", "ops/create-env.yml"] {
        let ops = yaml(rel);
        let ops = ops.as_sequence().unwrap_or_else(|| panic!("{rel}: a list"));
        assert!(!ops.is_empty());
        for op in ops {
            assert_eq!(op["type"].as_str(), Some("replace"), "{rel}: {op:?}");
            let path = op["path"].as_str().unwrap();
            assert!(path.starts_with('/'), "{rel}: {path}");
            assert!(!op["value"].is_null(), "{rel}: {path} has a value");
        }
    }
}

#[test]
fn director_ops_file_points_the_director_at_the_wrapper_job() {
    let ops = yaml("ops/director.yml");
    let cpi_job = ops
        .as_sequence()
        .unwrap()
        .iter()
        .find(|op| op["path"] == "/instance_groups/name=bosh/properties/director/cpi_job")
        .expect("sets director.cpi_job");
    assert_eq!(cpi_job["value"], "stemcell_gallery_cpi");
}

#[test]
fn create_env_ops_file_switches_the_cloud_provider_template() {
    let ops = yaml("ops/create-env.yml");
    let t = ops
        .as_sequence()
        .unwrap()
        .iter()
        .find(|op| op["path"] == "/cloud_provider/template")
        .expect("replaces cloud_provider.template");
    // The combined job (wrapper + Azure CPI): bosh-cli runs exactly one bin/cpi.
    assert_eq!(t["value"]["name"], "stemcell_gallery_create_env_cpi");
    assert_eq!(t["value"]["release"], "stemcell-gallery");
}

#[test]
fn the_wrapper_template_uses_only_declared_properties_and_execs_cpi_with_a_delegate() {
    let spec = yaml("jobs/stemcell_gallery_cpi/spec");
    assert_eq!(spec["name"], "stemcell_gallery_cpi");
    let declared: Vec<String> = spec["properties"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    let template =
        std::fs::read_to_string(root().join("jobs/stemcell_gallery_cpi/templates/cpi.erb"))
            .unwrap();
    let mut used = 0;
    for part in template.split("p('").skip(1) {
        let name = part.split('\'').next().unwrap();
        assert!(
            declared.iter().any(|d| d == name),
            "{name} is not in the spec"
        );
        used += 1;
    }
    assert!(used >= 3);
    assert!(template.contains("cpi --delegate"));
    assert!(template.contains("--config"));
    assert!(template.starts_with("#!/usr/bin/env bash\n"));
}
