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

/// Save a dry run's JSON as the plan `--apply --plan` reads, made `ago` seconds before now (a
/// director list must be saved at least a minute after its plan; backdating the plan stands for
/// the operator's wait).
fn save_plan(dir: &Path, name: &str, dry_run: &Value, ago: u64) -> String {
    let mut doc = dry_run.clone();
    let at = time::OffsetDateTime::parse(
        doc["planned_at"]
            .as_str()
            .expect("a dry run says when it was planned"),
        &time::format_description::well_known::Rfc3339,
    )
    .expect("RFC 3339")
        - time::Duration::seconds(ago as i64);
    doc["planned_at"] = json!(at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap());
    let path = dir.join(name);
    std::fs::write(&path, doc.to_string()).unwrap();
    path.display().to_string()
}

/// `references prune --apply --plan PLAN` with `args` (the records).
async fn apply(world: &World, plan: &str, args: &[&str]) -> seeding::Seeded {
    let mut all = vec!["references", "prune", "--apply", "--plan", plan];
    all.extend_from_slice(args);
    world.run(&all).await
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
    let plan = save_plan(dir.path(), "plan.json", &r.json, 120);

    // No record at all: a usage error, before anything is read.
    let r = world
        .run(&["references", "prune", "--apply", "--plan", &plan])
        .await;
    assert_eq!(r.code, 2, "{}\n{}", r.json, r.stderr);
    // No saved plan: a usage error too (see the next test for why).
    let r = world
        .run(&[
            "references",
            "prune",
            "--apply",
            "--director-stemcells",
            &list,
        ])
        .await;
    assert_eq!(r.code, 2, "{}\n{}", r.json, r.stderr);
    assert!(r.stderr.contains("--plan"), "{}", r.stderr);

    // An unreadable record (missing, or not what bosh writes) refuses the whole run: exit 5.
    let missing = dir.path().join("absent.json").display().to_string();
    let r = apply(&world, &plan, &["--director-stemcells", &list, &missing]).await;
    assert_eq!(r.code, 5, "{}\n{}", r.json, r.stderr);
    assert!(r.stderr.contains("absent.json"), "{}", r.stderr);
    let bad_state = dir.path().join("bosh-state.json");
    std::fs::write(&bad_state, r#"{"stemcells": "not a list"}"#).unwrap();
    let r = apply(
        &world,
        &plan,
        &[
            "--director-stemcells",
            &list,
            "--create-env-state",
            &bad_state.display().to_string(),
        ],
    )
    .await;
    assert_eq!(r.code, 5, "{}\n{}", r.json, r.stderr);

    // A director list saved longer ago than --max-list-age is refused with --apply.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let r = apply(
        &world,
        &plan,
        &["--max-list-age", "10ms", "--director-stemcells", &list],
    )
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
    let r = apply(&world, &plan, &["--director-stemcells", &list]).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    assert_eq!(r.json["summary"]["pruned"], 1, "{}", r.json);
    let v = world.version(DEFINITION, "1.506.0").await.unwrap();
    let mut refs = references_of(&v);
    refs.sort();
    assert_eq!(refs, vec![HELD.to_string(), FREE_FORM.to_string()]);

    // The director lets go of its stemcell too (its list, saved again at the same path, is
    // empty): the last CID goes, the version stays (deleting it is cleanup's decision), the
    // free-form reference stays.
    let empty = director_list(dir.path(), "director.json", &[]);
    let r = apply(&world, &plan, &["--director-stemcells", &empty]).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    let v = world
        .version(DEFINITION, "1.506.0")
        .await
        .expect("never deleted by a prune");
    assert_eq!(references_of(&v), vec![FREE_FORM.to_string()]);
}

/// The evidence-age gap: a director saves its stemcell list, then uploads a stemcell whose
/// version already exists (the CPI adds the new CID to it). Pruning against that list must not
/// remove the new CID: if it did, the director's next delete_stemcell of another CID would empty
/// the references and delete a version the director still holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_stemcell_uploaded_after_its_director_list_was_saved_keeps_its_reference() {
    const LATE: &str = "bosh-stemcell-c0000000-0000-4000-8000-00000000000c";
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    three_references(&world, dir.path()).await;
    // The operator plans, waits, saves the director's list again...
    let old_list = director_list(dir.path(), "director.json", &[HELD]);
    let r = world
        .run(&["references", "prune", "--director-stemcells", &old_list])
        .await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    let dry_run = r.json;
    let list = director_list(dir.path(), "director.json", &[HELD]);
    // ...and the director uploads the same stemcell again meanwhile: a new CID on the version.
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    world.seed(&path, &["--reference", LATE]).await.assert_ok();

    // Without a saved plan nothing tells LATE from a CID the director deleted: refused.
    let r = world
        .run(&[
            "references",
            "prune",
            "--apply",
            "--director-stemcells",
            &list,
        ])
        .await;
    assert_eq!(r.code, 2, "{}\n{}", r.json, r.stderr);
    assert!(
        references_of(&world.version(DEFINITION, "1.506.0").await.unwrap())
            .contains(&LATE.to_string()),
        "a refused run removes nothing"
    );
    let plan = save_plan(dir.path(), "plan.json", &dry_run, 120);

    // With the plan: LATE was not on the version when the plan was made, so it stays.
    let r = apply(&world, &plan, &["--director-stemcells", &list]).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    assert_eq!(r.json["summary"]["pruned"], 1, "{}", r.json);
    let late = r.json["versions"][0]["references"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["reference"] == LATE)
        .cloned()
        .unwrap_or_default();
    assert_eq!(late["verdict"], "keep", "{late}");
    assert!(
        late["reason"].as_str().unwrap_or("").contains("saved plan"),
        "{late}"
    );
    let mut refs = references_of(&world.version(DEFINITION, "1.506.0").await.unwrap());
    refs.sort();
    assert_eq!(
        refs,
        vec![HELD.to_string(), LATE.to_string(), FREE_FORM.to_string()]
    );

    // A list saved before the plan (or within a minute of it) is refused: it may miss a
    // stemcell the plan saw.
    let r = world
        .run(&["references", "prune", "--director-stemcells", &list])
        .await;
    let fresh_plan = save_plan(dir.path(), "fresh-plan.json", &r.json, 0);
    let before = world.writes().len();
    let r = apply(&world, &fresh_plan, &["--director-stemcells", &list]).await;
    assert_eq!(r.code, 5, "{}\n{}", r.json, r.stderr);
    assert!(r.stderr.contains("fresh-plan.json"), "{}", r.stderr);
    // Only create-env state (read live) and a plan made seconds ago: refused too, as a state read
    // now may predate bosh-cli's record of a stemcell the plan saw.
    let state = dir.path().join("bosh-state.json");
    std::fs::write(
        &state,
        json!({"stemcells": [{"id": "s1", "name": DEFINITION, "version": "1.506", "api_version": 3, "cid": HELD}]}).to_string(),
    )
    .unwrap();
    let state = state.display().to_string();
    let r = world
        .run(&["references", "prune", "--create-env-state", &state])
        .await;
    let state_plan = save_plan(dir.path(), "state-plan.json", &r.json, 0);
    let r = apply(&world, &state_plan, &["--create-env-state", &state]).await;
    assert_eq!(r.code, 5, "{}\n{}", r.json, r.stderr);
    assert!(r.stderr.contains("less than 60s ago"), "{}", r.stderr);
    assert_eq!(world.writes().len(), before, "refused before any write");
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

/// Issue 28 item 1: the plan read the lists of directors A and B and keeps B's CID; the apply is
/// given only A's list (B's forgotten). It must not act on less evidence than its plan read:
/// exit 5 naming B's list, nothing removed. (Before: B's CID removed, exit 0 — and A's next
/// delete_stemcell could then delete the version B uses.)
#[tokio::test(flavor = "multi_thread")]
async fn an_apply_given_fewer_director_lists_than_its_plan_removes_nothing() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    three_references(&world, dir.path()).await;
    let a = director_list(dir.path(), "director-a.json", &[]);
    let b = director_list(dir.path(), "director-b.json", &[HELD]);
    let r = world
        .run(&["references", "prune", "--director-stemcells", &a, &b])
        .await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    let plan = save_plan(dir.path(), "plan.json", &r.json, 120);
    let a = director_list(dir.path(), "director-a.json", &[]);
    let before = world.writes().len();
    let r = apply(&world, &plan, &["--director-stemcells", &a]).await;
    assert_eq!(r.code, 5, "{}\n{}", r.json, r.stderr);
    assert!(r.stderr.contains("director-b.json"), "{}", r.stderr);
    assert_eq!(world.writes().len(), before, "nothing written");
    assert!(
        references_of(&world.version(DEFINITION, "1.506.0").await.unwrap())
            .contains(&HELD.to_string()),
        "B's CID stays"
    );
    // Given both again (saved anew): GONE, held by neither, goes; B's stays.
    let b = director_list(dir.path(), "director-b.json", &[HELD]);
    let r = apply(&world, &plan, &["--director-stemcells", &a, &b]).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    let refs = references_of(&world.version(DEFINITION, "1.506.0").await.unwrap());
    assert!(refs.contains(&HELD.to_string()) && !refs.contains(&GONE.to_string()));
}

/// What a command prints for people (`--output human`).
fn human(world: &World, args: &[&str]) -> String {
    let out = world.human_command(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Issue 28 item 2: every reference records who holds it; `lookup` and `list` show holders, and
/// `references prune` prunes a holder's CIDs only against that holder's own list (or create-env
/// state): a holder whose list is absent keeps every CID it holds, and the plan says so.
#[tokio::test(flavor = "multi_thread")]
async fn holders_are_shown_and_a_holder_without_its_list_keeps_its_references() {
    const D1: &str = "d1d1d1d1-0000-4000-8000-000000000001";
    const D2: &str = "d2d2d2d2-0000-4000-8000-000000000002";
    const D3: &str = "d3d3d3d3-0000-4000-8000-000000000003";
    const C1: &str = "bosh-stemcell-c1000000-0000-4000-8000-000000000001";
    const C2: &str = "bosh-stemcell-c2000000-0000-4000-8000-000000000002";
    const C3: &str = "bosh-stemcell-c3000000-0000-4000-8000-000000000003";
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    for (cid, holder) in [(C1, D1), (C2, D2), (C3, D3)] {
        world
            .seed(&path, &["--reference", cid, "--holder", holder])
            .await
            .assert_ok();
    }
    // An unheld legacy-style reference without a holder.
    world.seed(&path, &["--reference", GONE]).await.assert_ok();

    let r = world
        .run(&["lookup", "--name", DEFINITION, "--version", "1.506"])
        .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let sources = r.json["reference_sources"].as_array().unwrap().clone();
    let holder_of = |cid: &str| {
        sources
            .iter()
            .find(|s| s["reference"] == cid)
            .map(|s| s["holder"].clone())
            .unwrap_or_default()
    };
    assert_eq!(holder_of(C1), json!(format!("director:{D1}")), "{}", r.json);
    assert_eq!(holder_of(GONE), Value::Null);
    let text = human(
        &world,
        &["lookup", "--name", DEFINITION, "--version", "1.506"],
    );
    assert!(
        text.contains(&format!("{C1} [held by director:{D1}]")),
        "{text}"
    );
    let listed = world.run(&["list"]).await;
    let v = &listed.json["definitions"][0]["versions"][0];
    assert!(
        v["reference_sources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["holder"] == format!("director:{D2}")),
        "{v}"
    );
    let table = human(&world, &["list"]);
    assert!(
        table.contains("HOLDERS") && table.contains("director:d1d1d1d1"),
        "{table}"
    );

    // D1's list (labelled), empty: C1 goes. D2's list not given: C2 stays, saying why. D3's
    // create-env state names it by director_id and holds C3. GONE has no holder: any list
    // counts, as before.
    let d1 = director_list(dir.path(), "d1.json", &[]);
    let state = dir.path().join("bosh-state.json");
    std::fs::write(
        &state,
        json!({"director_id": D3, "stemcells": [{"id": "s1", "name": DEFINITION, "version": "1.506", "api_version": 3, "cid": C3}]}).to_string(),
    )
    .unwrap();
    let state = state.display().to_string();
    let labelled = format!("{D1}={d1}");
    let r = world
        .run(&[
            "references",
            "prune",
            "--director-stemcells",
            &labelled,
            "--create-env-state",
            &state,
        ])
        .await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    let verdict = |cid: &str| {
        r.json["versions"][0]["references"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["reference"] == cid)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(verdict(C1)["verdict"], "prune", "{}", r.json);
    assert_eq!(verdict(C1)["holder"], format!("director:{D1}"));
    assert_eq!(verdict(C2)["verdict"], "keep", "{}", r.json);
    assert!(
        verdict(C2)["reason"].as_str().unwrap().contains(D2),
        "{}",
        verdict(C2)
    );
    assert_eq!(verdict(C3)["verdict"], "keep");
    assert_eq!(verdict(GONE)["verdict"], "prune");
    let plan = save_plan(dir.path(), "plan.json", &r.json, 120);
    let d1 = director_list(dir.path(), "d1.json", &[]);
    let labelled = format!("{D1}={d1}");
    let r = apply(
        &world,
        &plan,
        &[
            "--director-stemcells",
            &labelled,
            "--create-env-state",
            &state,
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    let mut refs = references_of(&world.version(DEFINITION, "1.506.0").await.unwrap());
    refs.sort();
    assert_eq!(refs, vec![C2.to_string(), C3.to_string()]);
}
