//! Reference hygiene through the binary against the emulator (issue 19 part 4): `references
//! prune` removes stemcell CIDs no director list or create-env state holds — dry run first,
//! refusing on unreadable or stale evidence (exit 5), never deleting a version — and `delete`
//! takes a CID (`--cid`) or several `--reference`s.

use std::path::Path;

use crate::support::seeding;

use seeding::{small_spec, write_stemcell, World, DEFINITION};
use serde_json::{json, Value};

const HELD: &str = "bosh-stemcell-a0000000-0000-4000-8000-00000000000a";
const GONE: &str = "bosh-stemcell-b0000000-0000-4000-8000-00000000000b";
const FREE_FORM: &str = "pipeline-nightly";

fn director_list(dir: &Path, name: &str, cids: &[&str]) -> String {
    let rows: Vec<Value> = cids
        .iter()
        .map(|c| json!({"name": DEFINITION, "version": "1.506*", "os": "ubuntu-jammy", "cpi": "", "cid": c}))
        .collect();
    let doc = json!({"Tables": [{"Content": "stemcells",
        "Header": {"name": "Name", "version": "Version", "os": "OS", "cpi": "CPI", "cid": "CID"},
        "Rows": rows, "Notes": ["(*) Currently deployed"]}], "Blocks": null, "Lines": ["Succeeded"]});
    let path = dir.join(name);
    std::fs::write(&path, doc.to_string()).unwrap();
    path.display().to_string()
}

fn references_of(v: &Value) -> Vec<String> {
    let tags = v["tags"].as_object().cloned().unwrap_or_default();
    let tags: std::collections::BTreeMap<String, String> = tags
        .into_iter()
        .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
        .collect();
    stemcell_gallery::gallery::tags::references(&tags)
}

/// One version referenced by a CID a director holds, a CID nobody holds any more and a free-form
/// reference.
async fn three_references(world: &World, dir: &Path) {
    let (path, _) = write_stemcell(dir, "a.tgz", &small_spec("'1.506'", 5, 2));
    for r in [HELD, GONE, FREE_FORM] {
        world.seed(&path, &["--reference", r]).await.assert_ok();
    }
    let v = world.version(DEFINITION, "1.506.0").await.unwrap();
    assert_eq!(references_of(&v).len(), 3, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn prune_plans_first_refuses_without_whole_evidence_and_removes_only_unheld_cids() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    three_references(&world, dir.path()).await;
    let list = director_list(dir.path(), "director.json", &[HELD]);
    let before = world.writes().len();

    // Dry run: the plan names the one CID to prune; nothing is written.
    let r = world
        .run(&["references", "prune", "--director-stemcells", &list])
        .await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    assert_eq!(r.json["applied"], false);
    assert_eq!(r.json["summary"]["prune"], 1, "{}", r.json);
    assert_eq!(r.json["summary"]["keep"], 2, "{}", r.json);
    let verdicts: Vec<(String, String)> = r.json["versions"][0]["references"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["reference"].as_str().unwrap().to_string(),
                x["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        verdicts.contains(&(GONE.into(), "prune".into())),
        "{verdicts:?}"
    );
    assert!(
        verdicts.contains(&(HELD.into(), "keep".into())),
        "{verdicts:?}"
    );
    assert!(
        verdicts.contains(&(FREE_FORM.into(), "keep".into())),
        "{verdicts:?}"
    );
    assert_eq!(world.writes().len(), before, "a dry run writes nothing");

    // No record at all: a usage error, before anything is read.
    let r = world.run(&["references", "prune", "--apply"]).await;
    assert_eq!(r.code, 2, "{}\n{}", r.json, r.stderr);

    // An unreadable record (missing, or not what bosh writes) refuses the whole run: exit 5.
    let missing = dir.path().join("absent.json").display().to_string();
    let r = world
        .run(&[
            "references",
            "prune",
            "--apply",
            "--director-stemcells",
            &list,
            &missing,
        ])
        .await;
    assert_eq!(r.code, 5, "{}\n{}", r.json, r.stderr);
    assert!(r.stderr.contains("absent.json"), "{}", r.stderr);
    let bad_state = dir.path().join("bosh-state.json");
    std::fs::write(&bad_state, r#"{"stemcells": "not a list"}"#).unwrap();
    let r = world
        .run(&[
            "references",
            "prune",
            "--apply",
            "--director-stemcells",
            &list,
            "--create-env-state",
            &bad_state.display().to_string(),
        ])
        .await;
    assert_eq!(r.code, 5, "{}\n{}", r.json, r.stderr);

    // A director list saved longer ago than --max-list-age is refused with --apply.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let r = world
        .run(&[
            "references",
            "prune",
            "--apply",
            "--max-list-age",
            "10ms",
            "--director-stemcells",
            &list,
        ])
        .await;
    assert_eq!(r.code, 5, "{}\n{}", r.json, r.stderr);
    assert!(r.stderr.contains("--max-list-age"), "{}", r.stderr);
    assert_eq!(
        world.writes().len(),
        before,
        "no refused run writes anything"
    );
    assert_eq!(
        references_of(&world.version(DEFINITION, "1.506.0").await.unwrap()).len(),
        3
    );

    // Applied: the unheld CID goes; the held one and the free-form one stay.
    let r = world
        .run(&[
            "references",
            "prune",
            "--apply",
            "--director-stemcells",
            &list,
        ])
        .await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    assert_eq!(r.json["summary"]["pruned"], 1, "{}", r.json);
    let v = world.version(DEFINITION, "1.506.0").await.unwrap();
    let mut refs = references_of(&v);
    refs.sort();
    assert_eq!(refs, vec![HELD.to_string(), FREE_FORM.to_string()]);

    // The director lets go of its stemcell too: the last CID goes, the version stays (deleting
    // it is cleanup's decision), the free-form reference stays.
    let empty = director_list(dir.path(), "empty.json", &[]);
    let r = world
        .run(&[
            "references",
            "prune",
            "--apply",
            "--director-stemcells",
            &empty,
        ])
        .await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    let v = world
        .version(DEFINITION, "1.506.0")
        .await
        .expect("never deleted by a prune");
    assert_eq!(references_of(&v), vec![FREE_FORM.to_string()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_takes_a_cid_or_several_references() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    three_references(&world, dir.path()).await;

    // By CID: no name or version needed; the version stays for its other references.
    let r = world.run(&["delete", "--cid", GONE]).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    assert_eq!(r.json["result"], "kept", "{}", r.json);
    assert_eq!(r.json["definition"], DEFINITION, "{}", r.json);
    assert_eq!(r.json["version"], "1.506.0", "{}", r.json);
    // A CID no version records: exit 3.
    let r = world.run(&["delete", "--cid", GONE]).await;
    assert_eq!(r.code, 3, "{}\n{}", r.json, r.stderr);
    // --cid with --name is a usage error.
    let r = world
        .run(&[
            "delete",
            "--cid",
            HELD,
            "--name",
            DEFINITION,
            "--version",
            "1.506",
        ])
        .await;
    assert_eq!(r.code, 2, "{}\n{}", r.json, r.stderr);

    // Both remaining references at once: the version goes.
    let r = world
        .run(&[
            "delete",
            "--name",
            DEFINITION,
            "--version",
            "1.506",
            "--reference",
            HELD,
            "--reference",
            FREE_FORM,
        ])
        .await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    assert_eq!(r.json["result"], "deleted", "{}", r.json);
    assert_eq!(
        r.json["removed_references"],
        json!([HELD, FREE_FORM]),
        "{}",
        r.json
    );
    assert!(world.version(DEFINITION, "1.506.0").await.is_none());
}

/// `list` says how many more stemcell CIDs fit on each version before Azure's tag limit.
#[tokio::test(flavor = "multi_thread")]
async fn list_shows_the_reference_room_left() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    three_references(&world, dir.path()).await;
    let r = world.run(&["list"]).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    let room = r.json["definitions"][0]["versions"][0]["reference_room"]
        .as_u64()
        .unwrap();
    assert!(room > 100, "{}", r.json);
}

/// Human output names versions by `gallery/definition/version`, not by their whole ARM id
/// (the JSON keeps the id).
#[tokio::test(flavor = "multi_thread")]
async fn human_delete_output_shortens_arm_ids() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    three_references(&world, dir.path()).await;
    let mut args = world.global_args();
    let at = args.iter().position(|a| a == "--output").unwrap();
    args.drain(at..at + 2);
    let mut cmd = crate::support::binary::command();
    cmd.args(args).args(["delete", "--cid", GONE]);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("kept {}/{DEFINITION}/1.506.0", seeding::GALLERY)),
        "{text}"
    );
    assert!(!text.contains("/subscriptions/"), "{text}");
}
