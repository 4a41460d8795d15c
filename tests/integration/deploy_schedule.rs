//! The scheduled cleanup as deployed: the evidence collector (scripts/collect-evidence.sh) run
//! against a fake `bosh`, the systemd unit's command line expanded as systemd expands it and
//! parsed by the CLI, and the Kubernetes CronJob's arguments, evidence ConfigMap and apply switch.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use clap::Parser;
use serde_yaml_ng::Value as Yaml;
use stemcell_gallery::cli::{self, Cli};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

/// The cleanup arguments the CLI parses from `argv` (after `stemcell-gallery`).
fn cleanup_args(argv: &[String]) -> cli::cleanup::CleanupArgs {
    let mut full = vec!["stemcell-gallery".to_string()];
    full.extend(argv.iter().cloned());
    match Cli::try_parse_from(&full) {
        Ok(Cli {
            command: cli::Command::Cleanup(a),
            ..
        }) => a,
        Ok(other) => panic!("{full:?} is not cleanup: {other:?}"),
        Err(e) => panic!("{full:?} does not parse: {e}"),
    }
}

/// A `bosh` that answers `-e ALIAS --json ... stemcells` with one stemcell named after the alias,
/// records each call with the client secret it was given, and fails for aliases starting `down`.
struct FakeBosh {
    dir: tempfile::TempDir,
}

impl FakeBosh {
    fn new() -> FakeBosh {
        let dir = tempfile::tempdir().unwrap();
        executable(
            &dir.path().join("bosh"),
            &format!(
                "#!/usr/bin/env bash\nalias=\"$2\"\n\
                 echo \"$* secret=${{BOSH_CLIENT_SECRET:-}}\" >> {calls}\n\
                 case \"$alias\" in down*) echo \"Fetching info: Performing request GET 'https://10.0.0.9:25555/info': connection refused\" >&2; exit 1;; esac\n\
                 printf '%s' '{{\"Tables\":[{{\"Content\":\"stemcells\",\"Rows\":[{{\"name\":\"bosh-azure-hyperv-ubuntu-jammy-go_agent\",\"version\":\"1.506\",\"cid\":\"bosh-stemcell-'\"$alias\"'\"}}]}}],\"Blocks\":null,\"Lines\":[]}}'\n",
                calls = dir.path().join("calls").display()
            ),
        );
        FakeBosh { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("bosh")
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("calls")).unwrap_or_default()
    }
}

/// A stand-in for the stemcell-gallery binary that records its arguments, one per line.
fn recorder(dir: &Path) -> (PathBuf, PathBuf) {
    let program = dir.join("record-args");
    let log = dir.join("args");
    executable(
        &program,
        &format!(
            "#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" > {}\n",
            log.display()
        ),
    );
    (program, log)
}

fn collector() -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("scripts/collect-evidence.sh"));
    for var in [
        "DIRECTORS",
        "CREATE_ENV_STATES",
        "CREDENTIALS_DIRECTORY",
        "BOSH_CLIENT_SECRET",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

fn evidence_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    v.sort();
    v
}

#[test]
fn the_collector_gathers_every_director_and_state_and_passes_each_file() {
    let bosh = FakeBosh::new();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("evidence");
    let state = dir.path().join("env-a/bosh-state.json");
    std::fs::create_dir_all(state.parent().unwrap()).unwrap();
    std::fs::write(&state, r#"{"stemcells":[]}"#).unwrap();
    let creds = dir.path().join("creds");
    std::fs::create_dir_all(&creds).unwrap();
    std::fs::write(creds.join("bosh_bosh-a"), "secret-for-a").unwrap();
    let (program, log) = recorder(dir.path());
    let o = collector()
        .arg("--out")
        .arg(&out)
        .args(["--director", "bosh-a", "--exec", "--"])
        .arg(&program)
        .args(["cleanup", "--min-age", "1h"])
        .env("BOSH", bosh.path())
        .env("DIRECTORS", "bosh-b")
        .env("CREATE_ENV_STATES", state.as_os_str())
        .env("CREDENTIALS_DIRECTORY", &creds)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(!String::from_utf8_lossy(&o.stderr).contains("secret-for-a"));
    let calls = bosh.calls();
    assert!(
        calls.contains("-e bosh-a --json --non-interactive stemcells secret=secret-for-a"),
        "{calls}"
    );
    assert!(
        calls.contains("-e bosh-b --json --non-interactive stemcells secret=\n"),
        "{calls}"
    );

    let state_name = format!(
        "create-env-{}",
        state
            .to_str()
            .unwrap()
            .trim_start_matches('/')
            .replace('/', "_")
    );
    assert_eq!(
        evidence_files(&out),
        [
            state_name.clone(),
            "director-bosh-a.json".to_string(),
            "director-bosh-b.json".to_string()
        ]
    );
    assert!(read(&out.join("director-bosh-b.json")).contains("bosh-stemcell-bosh-b"));
    let args: Vec<String> = read(&log).lines().map(String::from).collect();
    let parsed = cleanup_args(&args);
    assert_eq!(
        parsed.director_stemcells,
        [
            out.join("director-bosh-a.json"),
            out.join("director-bosh-b.json")
        ]
    );
    assert_eq!(parsed.create_env_state, [out.join(&state_name)]);
}

#[test]
fn the_collector_refuses_with_exit_5_and_leaves_no_evidence_when_a_director_is_down() {
    let bosh = FakeBosh::new();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("evidence");
    let (program, log) = recorder(dir.path());
    let run = |directors: &str| {
        collector()
            .arg("--out")
            .arg(&out)
            .args(["--exec", "--"])
            .arg(&program)
            .arg("cleanup")
            .env("BOSH", bosh.path())
            .env("DIRECTORS", directors)
            .output()
            .unwrap()
    };
    let o = run("bosh-a");
    assert!(o.status.success(), "{o:?}");
    std::fs::remove_file(&log).unwrap();
    // Yesterday's list of bosh-a must not pass for today's.
    let o = run("bosh-a downtown");
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("downtown") && err.contains("connection refused"),
        "{err}"
    );
    assert!(!log.exists(), "cleanup must not run");
    assert!(
        evidence_files(&out).is_empty(),
        "{:?}",
        evidence_files(&out)
    );

    let state = dir.path().join("missing/bosh-state.json");
    let o = collector()
        .arg("--out")
        .arg(&out)
        .arg("--state")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(5), "{o:?}");

    let o = collector().arg("--out").arg(&out).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "no source at all is a usage error: {o:?}"
    );
}

/// `Key=value` lines of a systemd unit, section by section.
fn unit(path: &Path) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in read(path).lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        let (k, v) = line.split_once('=').unwrap();
        out.push((section.clone(), k.to_string(), v.to_string()));
    }
    out
}

/// An EnvironmentFile's assignments.
fn env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// An ExecStart= line expanded as systemd.service(5) says: `${VAR}` is one word, a word that is
/// exactly `$VAR` becomes the variable's whitespace-separated words (none when empty).
fn systemd_expand(line: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for word in line.split_whitespace() {
        if let Some(name) = word.strip_prefix('$').filter(|n| !n.starts_with('{')) {
            let value = env.get(name).map(String::as_str).unwrap_or("");
            out.extend(value.split_whitespace().map(String::from));
        } else {
            let mut w = word.to_string();
            for (k, v) in env {
                w = w.replace(&format!("${{{k}}}"), v);
            }
            assert!(!w.contains("${"), "{word}: unset variable");
            out.push(w);
        }
    }
    out
}

#[test]
fn the_cleanup_unit_loads_secrets_alerts_on_failure_and_passes_every_file() {
    let dir = repo().join("deploy/systemd");
    let service = unit(&dir.join("stemcell-gallery-cleanup.service"));
    let get = |key: &str| -> Vec<String> {
        service
            .iter()
            .filter(|(_, k, _)| k == key)
            .map(|(_, _, v)| v.clone())
            .collect()
    };
    let on_failure = get("OnFailure");
    assert_eq!(on_failure, ["stemcell-gallery-alert@%n.service"]);
    assert!(dir.join("stemcell-gallery-alert@.service").is_file());
    let alert = unit(&dir.join("stemcell-gallery-alert@.service"));
    assert!(alert
        .iter()
        .any(|(_, k, v)| k == "ExecStart" && v == "/usr/local/bin/stemcell-gallery-alert %i"));
    let creds = get("LoadCredential");
    assert!(creds.iter().any(|c| c.starts_with("bosh:")), "{creds:?}");
    assert!(
        creds.iter().any(|c| c.starts_with("azure-client-secret:")),
        "{creds:?}"
    );
    for (_, k, v) in &service {
        assert!(
            !(k == "Environment" && v.to_ascii_uppercase().contains("SECRET")),
            "a secret in Environment=: {v}"
        );
    }
    let exec = get("ExecStart");
    assert_eq!(exec.len(), 1);
    let exec = &exec[0];
    assert!(!exec.contains("${DIRECTOR_STEMCELLS}") && !exec.contains("${CREATE_ENV_STATE}"));

    // Run the unit's command line as systemd would, with the example environment file, the
    // collector from this checkout, a fake bosh and a recorder for the binary.
    let bosh = FakeBosh::new();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("bosh-state.json");
    std::fs::write(&state, r#"{"stemcells":[]}"#).unwrap();
    let (program, log) = recorder(tmp.path());
    let example = env_file(&read(&dir.join("cleanup.env.example")));
    for (apply, states, want_states) in [("", state.to_str().unwrap(), 1), ("--apply", "", 0)] {
        let mut env = example.clone();
        env.insert("CLEANUP_APPLY".into(), apply.into());
        env.insert("CREATE_ENV_STATES".into(), states.into());
        let argv = systemd_expand(exec, &env);
        let evidence = tmp.path().join("evidence");
        let argv: Vec<String> = argv
            .into_iter()
            .map(|w| match w.as_str() {
                "/usr/local/bin/stemcell-gallery-collect-evidence" => repo()
                    .join("scripts/collect-evidence.sh")
                    .display()
                    .to_string(),
                "/usr/local/bin/stemcell-gallery" => program.display().to_string(),
                "/var/lib/stemcell-gallery/evidence" => evidence.display().to_string(),
                _ => w,
            })
            .collect();
        let o: Output = Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("BOSH", bosh.path())
            .envs(&env)
            .output()
            .unwrap();
        assert!(o.status.success(), "{argv:?}: {o:?}");
        let args: Vec<String> = read(&log).lines().map(String::from).collect();
        let parsed = cleanup_args(&args);
        let directors = example["DIRECTORS"].split_whitespace().count();
        assert!(directors >= 2, "the example shows several directors");
        assert_eq!(parsed.director_stemcells.len(), directors, "{args:?}");
        assert_eq!(parsed.create_env_state.len(), want_states, "{args:?}");
        assert_eq!(parsed.apply, apply == "--apply");
    }
}

fn docs(path: &Path) -> Vec<Yaml> {
    let text = read(path);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

#[test]
fn the_cronjob_reads_every_evidence_file_runs_a_built_image_and_has_an_apply_switch() {
    let dir = repo().join("deploy/kubernetes");
    let all = docs(&dir.join("cleanup-cronjob.yaml"));
    let cron = all.iter().find(|d| d["kind"] == "CronJob").unwrap();
    let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<String> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let parsed = cleanup_args(&args);
    assert!(!parsed.apply, "the base CronJob only plans");
    assert!(parsed.director_stemcells.len() >= 2, "several directors");
    assert!(!parsed.create_env_state.is_empty());

    // Every evidence file is an item of the ConfigMap volume, under a key the collector writes.
    let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
    let volume = &pod["volumes"][0]["configMap"];
    assert_eq!(volume["optional"], Yaml::Bool(false));
    let items: Vec<(String, String)> = volume["items"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["key"].as_str().unwrap().into(),
                i["path"].as_str().unwrap().into(),
            )
        })
        .collect();
    let files: Vec<PathBuf> = parsed
        .director_stemcells
        .iter()
        .chain(&parsed.create_env_state)
        .cloned()
        .collect();
    assert_eq!(files.len(), items.len());
    for f in &files {
        let name = f.strip_prefix(mount).unwrap().to_str().unwrap();
        assert!(items.iter().any(|(k, p)| k == name && p == name), "{name}");
        assert!(
            name.starts_with("director-") || name.starts_with("create-env-"),
            "{name}"
        );
    }

    // The image is the tag the documented build command makes from this version.
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        container["image"].as_str(),
        Some(format!("stemcell-gallery:{version}").as_str())
    );
    let build =
        format!("docker build -f deploy/container/Dockerfile -t stemcell-gallery:{version} .");
    let kustomization = read(&dir.join("kustomization.yaml"));
    assert!(
        kustomization.contains(&build),
        "kustomization.yaml documents {build}"
    );
    assert!(
        read(&repo().join("README.md")).contains(&build),
        "README documents {build}"
    );
    let k: Yaml = serde_yaml_ng::from_str(&kustomization).unwrap();
    assert_eq!(k["resources"][0], "cleanup-cronjob.yaml");

    // The apply switch: the same CronJob with --apply appended to its arguments.
    let apply: Yaml =
        serde_yaml_ng::from_str(&read(&dir.join("apply/kustomization.yaml"))).unwrap();
    assert_eq!(apply["resources"][0], "..");
    let patch: Yaml =
        serde_yaml_ng::from_str(apply["patches"][0]["patch"].as_str().unwrap()).unwrap();
    assert_eq!(patch[0]["op"], "add");
    assert_eq!(
        patch[0]["path"],
        "/spec/jobTemplate/spec/template/spec/containers/0/args/-"
    );
    let mut with_apply = args.clone();
    with_apply.push(patch[0]["value"].as_str().unwrap().to_string());
    let parsed = cleanup_args(&with_apply);
    assert!(parsed.apply);
    assert_eq!(
        parsed.director_stemcells.len(),
        files.len() - parsed.create_env_state.len()
    );
}
