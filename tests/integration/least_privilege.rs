//! Least privilege: the custom role in deploy/azure/role-definition.json is exactly what the tool
//! needs. An operator's whole day — doctor, seed, a second director's reference, lookup, list,
//! delete, cleanup with blobs — succeeds with the emulator enforcing the role on the tool's
//! identity, and without any single one of its actions some step fails with a 403 naming it.

use crate::support::emulated;

use std::process::Output;

use emulated::{admin, binary_against, least_privilege, Raw, LOC, RG, SUB};
use serde_json::{json, Value};
use stemcell_gallery::emulator::{Handle, Options, Role, World};

const GALLERY: &str = "bosh_stemcells";

fn fixture(name: &str) -> String {
    format!("{}/fixtures/stemcells/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Consumers the cleanup and delete scans read: a VM, a scale set with one instance, a disk.
fn consumers() -> World {
    let base = format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute");
    let image = format!("{base}/galleries/other/images/x/versions/1.0.0");
    serde_json::from_value(json!({"resources": [
        {"id": format!("{base}/virtualMachines/worker-0"), "location": LOC,
         "properties": {"storageProfile": {"imageReference": {"id": image}}}},
        {"id": format!("{base}/virtualMachineScaleSets/pool"), "location": LOC,
         "properties": {"virtualMachineProfile": {"storageProfile": {"imageReference": {"id": image}}}}},
        {"id": format!("{base}/virtualMachineScaleSets/pool/virtualMachines/0"), "location": LOC,
         "properties": {"storageProfile": {"imageReference": {"id": image}}}},
        {"id": format!("{base}/disks/data-0"), "location": LOC,
         "properties": {"creationData": {"createOption": "Empty"}}}
    ]}))
    .expect("the world parses")
}

struct Step {
    name: &'static str,
    out: Output,
}

impl Step {
    fn text(&self) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&self.out.stdout),
            String::from_utf8_lossy(&self.out.stderr)
        )
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.out.stdout).unwrap_or(Value::Null)
    }
}

async fn run(h: &Handle, name: &'static str, args: Vec<String>) -> Step {
    let mut cmd = binary_against(h, GALLERY);
    cmd.args(&args).env("STEMCELL_GALLERY_ARM_RETRIES", "1");
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("the binary runs"))
        .await
        .unwrap();
    Step { name, out }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The operator's day under `role`. Stops at the first failing step; returns the steps run.
async fn operators_day(role: Role) -> (Vec<Step>, Vec<u16>) {
    let h = emulated::start(Options {
        role: Some(role),
        world: Some(consumers()),
        ..Options::default()
    })
    .await;
    // The gallery and container exist, as deploy/azure/README.md has the operator create them.
    h.state.ensure_gallery(SUB, RG, GALLERY, LOC).unwrap();
    h.state.ensure_container("stemcell").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let no_director = dir.path().join("director-stemcells.json");
    std::fs::write(
        &no_director,
        r#"{"Tables": [{"Content": "stemcells", "Header": {}, "Rows": []}]}"#,
    )
    .unwrap();
    let mut steps = Vec::new();
    let plan: Vec<(&'static str, Vec<String>)> = vec![
        ("doctor", args(&["doctor"])),
        (
            "seed gen1 as director r1",
            args(&["seed", &fixture("gen1-x86_64.tgz"), "--reference", "r1"]),
        ),
        (
            "seed gen1 again as director r2",
            args(&["seed", &fixture("gen1-x86_64.tgz"), "--reference", "r2"]),
        ),
    ];
    for (name, a) in plan {
        let step = run(&h, name, a).await;
        let ok = step.out.status.success();
        steps.push(step);
        if !ok {
            return (steps, statuses(&h).await);
        }
    }
    let seeded = steps[1].json();
    let definition = seeded["definition"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let version = seeded["version"].as_str().unwrap_or_default().to_string();
    let plan: Vec<(&'static str, Vec<String>)> = vec![
        (
            "lookup",
            args(&["lookup", "--name", &definition, "--version", &version]),
        ),
        ("list", args(&["list"])),
        (
            "delete r1 (kept for r2)",
            args(&[
                "delete",
                "--name",
                &definition,
                "--version",
                &version,
                "--reference",
                "r1",
            ]),
        ),
        (
            "seed gen2 as director r3",
            args(&["seed", &fixture("gen2-arm64.tgz"), "--reference", "r3"]),
        ),
        (
            "delete r2 (last reference: deleted)",
            args(&[
                "delete",
                "--name",
                &definition,
                "--version",
                &version,
                "--reference",
                "r2",
            ]),
        ),
    ];
    for (name, a) in plan {
        let step = run(&h, name, a).await;
        let ok = step.out.status.success();
        steps.push(step);
        if !ok {
            return (steps, statuses(&h).await);
        }
    }
    // The gen2 version loses its reference by hand (an operator's manual edit), so cleanup finds
    // an orphan, deletes it and its blob.
    if let Value::String(id) = steps[6].json()["id"].clone() {
        let raw = Raw::new(&h.arm);
        let r = raw
            .send(
                "PATCH",
                &format!("{id}?api-version=2023-07-03"),
                Some(json!({"tags": {"stemcell_gallery_mode": "director"}})),
                true,
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let _ = raw.get(&id).await;
    }
    let cleanup = run(
        &h,
        "cleanup --apply --blobs",
        args(&[
            "cleanup",
            "--apply",
            "--blobs",
            "--director-stemcells",
            &no_director.display().to_string(),
            "--min-age",
            "0s",
            "--keep-latest",
            "0",
        ]),
    )
    .await;
    steps.push(cleanup);
    // Soft-deleted versions are read by `list --soft-deleted`, `restore` and every create.
    steps.push(run(&h, "list --soft-deleted", args(&["list", "--soft-deleted"])).await);
    (steps, statuses(&h).await)
}

async fn statuses(h: &Handle) -> Vec<u16> {
    let log = admin(h, "GET", "/_emulator/requests", None).await;
    log.body["requests"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| r["status"].as_u64().unwrap_or(0) as u16)
                .collect()
        })
        .unwrap_or_default()
}

fn no_panics(steps: &[Step]) {
    for s in steps {
        assert!(!s.text().contains("panicked"), "{}: {}", s.name, s.text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_whole_day_succeeds_under_the_least_privilege_role() {
    let (steps, statuses) = operators_day(least_privilege()).await;
    no_panics(&steps);
    for s in &steps {
        assert!(s.out.status.success(), "{} failed: {}", s.name, s.text());
    }
    assert_eq!(steps.len(), 10, "every step ran");
    assert_eq!(steps[5].json()["result"], "kept", "{}", steps[5].text());
    assert_eq!(steps[7].json()["result"], "deleted", "{}", steps[7].text());
    let cleanup = steps[8].json();
    assert!(
        cleanup.to_string().contains("deleted"),
        "cleanup deleted the orphan: {cleanup}"
    );
    assert!(
        !statuses.contains(&403),
        "no request was refused: {statuses:?}"
    );
}

/// Each action of the role is needed: without it, some step of the day fails with a 403 that names
/// it, and nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn removing_any_one_action_makes_the_day_fail_naming_it() {
    let role = least_privilege();
    let every: Vec<String> = role
        .actions
        .iter()
        .chain(&role.data_actions)
        .cloned()
        .collect();
    assert!(every.len() >= 10, "the role lists its actions: {every:?}");
    let mut tasks = Vec::new();
    for action in every.clone() {
        let less = role.without(&action);
        tasks.push(tokio::spawn(async move {
            let (steps, statuses) = operators_day(less).await;
            (action, steps, statuses)
        }));
    }
    let mut unneeded = Vec::new();
    for t in tasks {
        let (action, steps, statuses) = t.await.unwrap();
        no_panics(&steps);
        let failed = steps.iter().find(|s| !s.out.status.success());
        match failed {
            None => unneeded.push(action),
            Some(step) => {
                let text = step.text();
                // A consumer read that the permissions at subscription scope lack is refused before
                // any list is sent (ARM would answer the list with a silently short page).
                let refused_view =
                    text.contains("cannot prove which VMs") && text.contains(action.as_str());
                // doctor reads the identity's permissions and fails naming a lock action it
                // lacks (held versions would not be protected), before any lock request.
                let doctor_names_it = step.name == "doctor"
                    && text.contains("protection")
                    && text.contains(action.as_str());
                assert!(
                    statuses.contains(&403) || refused_view || doctor_names_it,
                    "without {action}, {} failed but not on a 403: {}",
                    step.name,
                    step.text()
                );
                assert!(
                    text.contains(&action)
                        || text.contains("AuthorizationPermissionMismatch")
                        || text.contains("AuthorizationFailed"),
                    "without {action}, {} fails with an error that says why: {text}",
                    step.name
                );
                eprintln!("without {action}: `{}` fails", step.name);
            }
        }
    }
    assert!(
        unneeded.is_empty(),
        "the role grants actions the tool never needs (remove them): {unneeded:?}"
    );
}

/// `emulator --role FILE` enforces the role on the development token; a broken file is refused
/// with a message naming it.
#[tokio::test]
async fn the_standalone_emulator_enforces_a_role_file() {
    use std::io::{BufRead, BufReader};
    let role = format!(
        "{}/deploy/azure/role-definition.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"))
        .args(["emulator", "--listen", "127.0.0.1:0", "--role", &role])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: Value = serde_json::from_str(&line).expect("the ready line is JSON");
    let arm = ready["arm"].as_str().unwrap().to_string();
    let gallery = format!(
        "{arm}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/g?api-version=2023-07-03"
    );
    let http = reqwest::Client::new();
    let put = |token: &'static str| {
        http.put(&gallery)
            .bearer_auth(token)
            .json(&json!({"location": LOC}))
            .send()
    };
    let denied = put(stemcell_gallery::config::EMULATOR_TOKEN).await.unwrap();
    assert_eq!(denied.status().as_u16(), 403);
    let body: Value = denied.json().await.unwrap();
    assert_eq!(body["error"]["code"], "AuthorizationFailed");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Microsoft.Compute/galleries/write"));
    let owner = put("owner-token").await.unwrap();
    assert!(owner.status().is_success(), "{}", owner.status());
    let _ = child.kill();
    let _ = child.wait();

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("role.json");
    std::fs::write(&bad, r#"{"Name": "nothing"}"#).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"))
        .args(["emulator", "--role", &bad.display().to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("role.json") && err.contains("grants no actions"),
        "{err}"
    );
    assert!(!err.contains("panicked"));
}

/// An emulator enforcing `role` on the tool's identity, with the gallery, the stemcell container
/// and the fixture stemcell seeded with reference `r1`: (emulator, what `seed` printed).
async fn seeded_under(role: Role) -> (Handle, Value) {
    let h = emulated::start(Options {
        role: Some(role),
        ..Options::default()
    })
    .await;
    h.state.ensure_gallery(SUB, RG, GALLERY, LOC).unwrap();
    h.state.ensure_container("stemcell").unwrap();
    let seeded = run(
        &h,
        "seed",
        args(&["seed", &fixture("gen1-x86_64.tgz"), "--reference", "r1"]),
    )
    .await;
    assert!(seeded.out.status.success(), "{}", seeded.text());
    (h, seeded.json())
}

/// The role assigned at the gallery's resource group only (as deploy/azure/README.md once said):
/// a subscription-wide VM list then silently leaves out a VM in another resource group that runs
/// from the version. Cleanup must not take that short list as "nothing uses it".
#[tokio::test(flavor = "multi_thread")]
async fn a_role_assigned_below_the_consumer_scope_refuses_cleanup_and_keeps_the_version() {
    let rg_scope = format!("/subscriptions/{SUB}/resourceGroups/{RG}");
    let (h, seeded) = seeded_under(least_privilege().assigned_at(&[rg_scope.as_str()])).await;
    let version_id = seeded["id"].as_str().unwrap().to_string();
    // A VM in another resource group of the subscription runs from the version.
    let raw = Raw::new(&h.arm);
    let vm = format!(
        "/subscriptions/{SUB}/resourceGroups/apps-rg/providers/Microsoft.Compute/virtualMachines/app-0"
    );
    let put = raw
        .send(
            "PUT",
            &format!("{vm}?api-version=2024-07-01"),
            Some(json!({"location": LOC,
                        "properties": {"storageProfile": {"imageReference": {"id": version_id}}}})),
            true,
        )
        .await;
    assert!(put.status < 300, "{}", put.text);
    // As the tool's identity, the subscription-wide list is short: the VM is not in it.
    let listed = reqwest::Client::new()
        .get(format!(
            "{}/subscriptions/{SUB}/providers/Microsoft.Compute/virtualMachines?api-version=2024-07-01",
            h.arm
        ))
        .bearer_auth(stemcell_gallery::config::EMULATOR_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status().as_u16(), 200);
    let listed = listed.text().await.unwrap();
    assert!(!listed.contains("app-0"), "{listed}");
    // Strip the reference by hand, so that only the VM holds the version.
    let patched = raw
        .send(
            "PATCH",
            &format!("{version_id}?api-version=2023-07-03"),
            Some(json!({"tags": {"image_sha256": "x"}})),
            true,
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text);
    let _ = raw.get(&version_id).await;

    let cleanup = run(
        &h,
        "cleanup --apply",
        args(&[
            "cleanup",
            "--apply",
            "--min-age",
            "0s",
            "--keep-latest",
            "0",
        ]),
    )
    .await;
    assert_eq!(cleanup.out.status.code(), Some(5), "{}", cleanup.text());
    let text = cleanup.text();
    assert!(
        text.contains(&format!("/subscriptions/{SUB}")) && text.contains("cannot prove"),
        "{text}"
    );
    assert_eq!(
        raw.get(&version_id).await.status,
        200,
        "the VM's image survives"
    );

    // `delete` of the last reference keeps the version and says why (exit 0: a delete_stemcell
    // error would fail the whole create-env, bosh-cli#619).
    let delete = run(
        &h,
        "delete",
        args(&[
            "delete",
            "--name",
            seeded["definition"].as_str().unwrap(),
            "--version",
            seeded["version"].as_str().unwrap(),
        ]),
    )
    .await;
    assert_eq!(delete.out.status.code(), Some(0), "{}", delete.text());
    assert_eq!(delete.json()["result"], "kept", "{}", delete.text());
    assert!(
        delete.json()["kept_because"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot prove"),
        "{}",
        delete.text()
    );
    assert_eq!(
        raw.get(&version_id).await.status,
        200,
        "the VM's image survives delete"
    );

    let doctor = run(&h, "doctor", args(&["doctor"])).await;
    let consumers = doctor.json()["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "consumers")
        .cloned()
        .unwrap_or_default();
    assert_eq!(consumers["status"], "fail", "{}", doctor.text());
    assert!(
        consumers["detail"]
            .as_str()
            .unwrap()
            .contains("cannot prove"),
        "{consumers}"
    );
    assert!(!doctor.out.status.success(), "{}", doctor.text());
}

/// Issue 46, "Done when": with the default configuration and the shipped role, a version the tool
/// holds carries its delete lock, so a raw ARM DELETE from another client (the portal, `az`, a
/// plain Azure CPI v53.0.0) is refused with 409 ScopeLocked and the version stays; the tool's own
/// `delete` of the last reference still deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_shipped_role_a_held_version_is_refused_to_any_raw_delete() {
    let (h, json) = seeded_under(least_privilege()).await;
    let id = json["id"].as_str().expect("the version's id").to_string();
    let raw = Raw::new(&h.arm);
    let refused = raw
        .send(
            "DELETE",
            &format!("{id}?api-version=2023-07-03"),
            None,
            true,
        )
        .await;
    assert_eq!(refused.status, 409, "{}", refused.text);
    assert!(refused.text.contains("ScopeLocked"), "{}", refused.text);
    assert_eq!(raw.get(&id).await.status, 200, "the version stays");
    let (definition, version) = (
        json["definition"].as_str().unwrap().to_string(),
        json["version"].as_str().unwrap().to_string(),
    );
    let deleted = run(
        &h,
        "delete r1",
        args(&[
            "delete",
            "--name",
            &definition,
            "--version",
            &version,
            "--reference",
            "r1",
        ]),
    )
    .await;
    assert_eq!(deleted.json()["result"], "deleted", "{}", deleted.text());
    assert!(
        !statuses(&h).await.contains(&403),
        "nothing was refused the tool"
    );
}
