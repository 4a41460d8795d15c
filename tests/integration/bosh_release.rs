//! deploy/bosh as a BOSH release, checked without bosh-cli: its structure (every job's templates
//! and packages exist, the names bosh-cli reads), every ERB template rendered with Ruby the way
//! bosh renders it (scripts/bosh-render.rb), and the rendered config accepted by the built binary
//! (against the emulator) and by the rendered bin/cpi. The combined create-env job is generated
//! (scripts/bosh-create-env-job.rb) from a small Azure CPI job written here, not a copy of the
//! real one. The tests need `ruby` (CI installs Debian's; `.ci/run`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use serde_yaml_ng::Value as Yaml;
use stemcell_gallery::emulator::Handle;

use crate::support::{binary, emulated, tls_front, DEFINITION, RG, SUB};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn release() -> PathBuf {
    repo().join("deploy/bosh")
}

fn yaml_file(path: &Path) -> Yaml {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: cannot read it: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn names_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn string_list(v: &Yaml) -> Vec<String> {
    v.as_sequence()
        .map(|s| s.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The structure bosh-cli's create-release reads, checked for one job directory against the
/// release's packages.
fn check_job(job_dir: &Path, packages: &BTreeSet<String>) {
    let name = job_dir.file_name().unwrap().to_str().unwrap();
    let spec = yaml_file(&job_dir.join("spec"));
    assert_eq!(spec["name"].as_str(), Some(name), "{name}: spec name");
    assert!(job_dir.join("monit").is_file(), "{name}: no monit file");
    let templates = spec["templates"].as_mapping().expect("templates");
    let listed: BTreeSet<String> = templates
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    let on_disk = names_in(&job_dir.join("templates"));
    assert_eq!(listed, on_disk, "{name}: templates listed vs on disk");
    assert!(
        templates.values().any(|d| d.as_str() == Some("bin/cpi")),
        "{name}: renders no bin/cpi"
    );
    for p in string_list(&spec["packages"]) {
        assert!(
            packages.contains(&p),
            "{name}: package {p} is not in the release"
        );
    }
    let properties = spec["properties"].as_mapping().expect("properties");
    for (k, v) in properties {
        assert!(
            v["description"]
                .as_str()
                .is_some_and(|d| !d.trim().is_empty()),
            "{name}: property {k:?} has no description"
        );
    }
}

#[test]
fn the_release_directory_has_what_bosh_create_release_reads() {
    let final_yml = yaml_file(&release().join("config/final.yml"));
    assert_eq!(final_yml["final_name"].as_str(), Some("stemcell-gallery"));
    assert!(final_yml["blobstore"]["provider"].as_str().is_some());
    assert!(yaml_file(&release().join("config/blobs.yml")).is_mapping());
    assert!(
        release().join("src").is_dir(),
        "bosh create-release needs src/"
    );

    let packages = names_in(&release().join("packages"));
    assert_eq!(packages, BTreeSet::from(["stemcell-gallery".to_string()]));
    for p in &packages {
        let dir = release().join("packages").join(p);
        let spec = yaml_file(&dir.join("spec"));
        assert_eq!(spec["name"].as_str(), Some(p.as_str()));
        let packaging = std::fs::read_to_string(dir.join("packaging")).unwrap();
        assert!(packaging.starts_with("#!/usr/bin/env bash\n"));
        // The file the package installs is the blob the release script adds.
        let files = string_list(&spec["files"]);
        assert_eq!(
            files,
            [
                "stemcell-gallery/stemcell-gallery-linux-amd64",
                "stemcell-gallery/source.json"
            ]
        );
        let script = std::fs::read_to_string(repo().join("scripts/bosh-release.sh")).unwrap();
        for file in &files {
            assert!(packaging.contains(file), "packaging installs {file}");
            assert!(
                script.contains(&format!(" {file}\n")) && script.contains("add-blob --dir"),
                "the script adds {file}"
            );
        }
        assert!(packaging.contains("${BOSH_INSTALL_TARGET}/bin/stemcell-gallery"));
    }

    let jobs = names_in(&release().join("jobs"));
    assert_eq!(jobs, BTreeSet::from(["stemcell_gallery_cpi".to_string()]));
    for j in &jobs {
        check_job(&release().join("jobs").join(j), &packages);
    }
}

/// `ruby`, or a failure that says how to get it (CI installs it; a test that needs it never
/// passes without it).
fn ruby() -> Command {
    let probe = Command::new("ruby").arg("--version").output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "these tests render the job templates with Ruby: install it (apt-get install -y ruby)"
    );
    Command::new("ruby")
}

/// Render every template of `job_dir` with `properties` (YAML) into `out`.
fn render(job_dir: &Path, properties: &str, out: &Path) -> Output {
    let props = out.with_extension("properties.yml");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&props, properties).unwrap();
    ruby()
        .arg(repo().join("scripts/bosh-render.rb"))
        .arg(job_dir)
        .arg(&props)
        .arg(out)
        .output()
        .unwrap()
}

fn render_ok(job_dir: &Path, properties: &str, out: &Path) {
    let o = render(job_dir, properties, out);
    assert!(
        o.status.success(),
        "rendering {} failed: {}",
        job_dir.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `[tuning]` table of a rendered settings file.
fn tuning_table(rendered: &Path) -> toml::Table {
    let settings: toml::Table =
        toml::from_str(&read(&rendered.join("config/stemcell-gallery.toml"))).unwrap();
    settings["tuning"]
        .as_table()
        .cloned()
        .unwrap_or_else(|| panic!("no [tuning] table: {settings:?}"))
}

fn cpi_job() -> PathBuf {
    release().join("jobs/stemcell_gallery_cpi")
}

#[test]
fn the_cpi_job_renders_with_its_defaults_and_with_every_knob_set() {
    let dir = tempfile::tempdir().unwrap();
    let defaults = dir.path().join("defaults");
    render_ok(&cpi_job(), "{}", &defaults);
    let toml = read(&defaults.join("config/stemcell-gallery.toml"));
    assert!(toml.contains("cpi_config = \"/var/vcap/jobs/azure_cpi/config/cpi.json\""));
    assert!(!toml.contains("location"), "no default region: {toml}");
    assert!(!toml.contains("ca_cert"), "{toml}");
    let tuning = tuning_table(&defaults);
    assert_eq!(
        tuning,
        toml::from_str::<toml::Table>("lock_wait = 600.0\ncoalesce = true").unwrap()
    );
    assert!(
        !defaults.join("config/tuning.env").exists(),
        "the knobs reach the binary one way only"
    );
    let bin = read(&defaults.join("bin/cpi"));
    assert!(
        bin.contains("cpi --delegate '/var/vcap/jobs/azure_cpi/bin/cpi' --director"),
        "{bin}"
    );

    let all = dir.path().join("all");
    render_ok(
        &cpi_job(),
        r#"
stemcell_gallery:
  delegate: other_cpi/bin/cpi
  mode: auto
  verbose: true
  location: eastus
  replicas: 3
  create_env_suffix: -bootstrap
  adopt_unverified: true
  storage_account_resource_group: storage-rg
  consumer_subscriptions: [22222222-3333-4444-5555-666666666666]
  ca_certs: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
  http_timeout: 30
  operation_timeout: 1800.5
  arm_retries: 4
  blob_retries: 0
  lock_wait: 45
  coalesce: false
"#,
        &all,
    );
    let settings: toml::Table =
        toml::from_str(&read(&all.join("config/stemcell-gallery.toml"))).unwrap();
    assert_eq!(settings["location"].as_str(), Some("eastus"));
    assert_eq!(settings["replicas"].as_integer(), Some(3));
    assert_eq!(settings["create_env_suffix"].as_str(), Some("-bootstrap"));
    assert_eq!(settings["adopt_unverified"].as_bool(), Some(true));
    assert_eq!(
        settings["storage_account_resource_group"].as_str(),
        Some("storage-rg")
    );
    assert_eq!(settings["ca_cert"].as_str(), Some("ca_certs.pem"));
    assert_eq!(
        settings["consumer_subscriptions"][0].as_str(),
        Some("22222222-3333-4444-5555-666666666666")
    );
    assert!(read(&all.join("config/ca_certs.pem")).contains("BEGIN CERTIFICATE"));
    let tuning = tuning_table(&all);
    assert_eq!(
        tuning,
        toml::from_str::<toml::Table>(
            "arm_retries = 4\nblob_retries = 0\nhttp_timeout = 30.0\n\
             operation_timeout = 1800.5\nlock_wait = 45.0\ncoalesce = false"
        )
        .unwrap()
    );
    let bin = read(&all.join("bin/cpi"));
    assert!(
        bin.contains("cpi --delegate \"$BOSH_JOBS_DIR\"/'other_cpi/bin/cpi' --verbose"),
        "{bin}"
    );
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(all.join("bin/cpi"))
        .output()
        .unwrap();
    assert!(syntax.status.success(), "{syntax:?}");
}

/// A copy of the CPI job in which `edit` has changed something.
fn edited_job(dir: &Path, edit: impl FnOnce(&Path)) -> PathBuf {
    let job = dir.join("stemcell_gallery_cpi");
    std::fs::create_dir_all(job.join("templates")).unwrap();
    std::fs::copy(cpi_job().join("spec"), job.join("spec")).unwrap();
    for t in names_in(&cpi_job().join("templates")) {
        std::fs::copy(
            cpi_job().join("templates").join(&t),
            job.join("templates").join(&t),
        )
        .unwrap();
    }
    edit(&job);
    job
}

#[test]
fn a_template_naming_a_property_the_spec_lacks_does_not_render() {
    let dir = tempfile::tempdir().unwrap();
    // The spec loses a property a template reads.
    let job = edited_job(&dir.path().join("a"), |job| {
        let spec = read(&job.join("spec"));
        let start = spec.find("  stemcell_gallery.lock_wait:").unwrap();
        let end = spec[start..].find("  stemcell_gallery.coalesce:").unwrap() + start;
        std::fs::write(
            job.join("spec"),
            format!("{}{}", &spec[..start], &spec[end..]),
        )
        .unwrap();
    });
    let o = render(&job, "{}", &dir.path().join("out-a"));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("stemcell-gallery.toml.erb") && err.contains("stemcell_gallery.lock_wait"),
        "{err}"
    );
    // A template reads a property no spec declares, even with a default given to p().
    let job = edited_job(&dir.path().join("b"), |job| {
        let path = job.join("templates/stemcell-gallery.toml.erb");
        let text = read(&path) + "<%= p('stemcell_gallery.typo', 1) %>\n";
        std::fs::write(path, text).unwrap();
    });
    let o = render(&job, "{}", &dir.path().join("out-b"));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("stemcell_gallery.typo"), "{err}");
    // A value the template refuses names the property.
    let o = render(
        &cpi_job(),
        "stemcell_gallery: {mode: sideways}",
        &dir.path().join("out-c"),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("stemcell_gallery.mode"));
}

/// The Azure CPI's cpi.json as its job renders it for the test's emulator gallery.
fn write_cpi_json(path: &Path, gallery: &str) {
    let doc = serde_json::json!({"cloud": {"plugin": "azure", "properties": {"azure": {
        "environment": "AzureCloud",
        "subscription_id": SUB,
        "resource_group_name": RG,
        "compute_gallery_name": gallery,
        "storage_account_name": "devstoreaccount1",
    }}}});
    std::fs::write(path, doc.to_string()).unwrap();
}

/// The binary with the rendered config: `--config` the rendered TOML (its `[tuning]` table
/// included), the emulator's endpoints and auth as flags.
fn with_rendered_config(h: &Handle, rendered: &Path) -> Command {
    let mut cmd = binary::command();
    cmd.args(["--arm-endpoint", &h.arm, "--blob-endpoint", &h.blob])
        .args(["--auth", "emulator", "--output", "json", "--config"])
        .arg(rendered.join("config/stemcell-gallery.toml"));
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rendered_config_is_what_the_binary_runs_with() {
    let h = emulated::start_default().await;
    h.state.ensure_gallery(SUB, RG, "g", "eastus").unwrap();
    h.state.ensure_container("stemcell").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cpi_json = dir.path().join("cpi.json");
    write_cpi_json(&cpi_json, "g");
    let (ca, _, _) = tls_front::private_ca(dir.path());
    let properties = serde_json::json!({"stemcell_gallery": {
        "cpi_json": cpi_json,
        "create_env_suffix": "-bootstrap",
        "ca_certs": read(&ca),
        "http_timeout": 30,
        "arm_retries": 2,
        "lock_wait": 45,
    }});
    let rendered = dir.path().join("rendered");
    render_ok(&cpi_job(), &properties.to_string(), &rendered);

    let blob = "https://devstoreaccount1.blob.core.windows.net/stemcell/a.vhd";
    let out = with_rendered_config(&h, &rendered)
        .args(["ensure", "--blob-uri", blob, "--name", DEFINITION, "--version", "1.506"])
        .args(["--sha256", &"a".repeat(64), "--create-env"])
        .args(["--storage-account-id", &format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Storage/storageAccounts/devstoreaccount1")])
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{doc}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The gallery (from cpi.json) and the suffix (from the job's properties); no location is
    // configured, so the version is in the gallery's region.
    let version = emulated::Raw::new(&h.arm)
        .get(&format!(
            "{}/images/{DEFINITION}-bootstrap/versions/1.506.0",
            emulated::gallery_path("g")
        ))
        .await;
    assert_eq!(version.body["location"], "eastus", "{}", version.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_knob_the_binary_refuses_fails_with_the_property_s_setting_named() {
    let h = emulated::start_default().await;
    let dir = tempfile::tempdir().unwrap();
    let cpi_json = dir.path().join("cpi.json");
    write_cpi_json(&cpi_json, "g");
    for (i, (knob, named)) in [
        // The knobs are the rendered file's [tuning] keys (bin/cpi exports no variable).
        ("lock_wait: 0", "tuning.lock_wait"),
        ("arm_retries: 50", "tuning.arm_retries"),
        ("create_env_suffix: -gen2", "create_env_suffix"),
    ]
    .into_iter()
    .enumerate()
    {
        let rendered = dir.path().join(format!("r{i}"));
        let props = format!(
            "stemcell_gallery:\n  cpi_json: {}\n  {knob}\n",
            cpi_json.display()
        );
        render_ok(&cpi_job(), &props, &rendered);
        let out = with_rendered_config(&h, &rendered)
            .arg("list")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{knob}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(named), "{knob}: {err}");
    }
}

/// A job directory laid out as on a director: BOSH_JOBS_DIR/<job>/{bin,config},
/// BOSH_PACKAGES_DIR/stemcell-gallery/bin/stemcell-gallery, and a delegate that records the
/// request and its environment.
struct Installed {
    _dir: tempfile::TempDir,
    jobs: PathBuf,
    packages: PathBuf,
    seen: PathBuf,
}

fn install(job_dir: &Path, job: &str, properties: impl Fn(&Path) -> String) -> Installed {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    let packages = dir.path().join("packages");
    let bin = packages.join("stemcell-gallery/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_stemcell-gallery"),
        bin.join("stemcell-gallery"),
    )
    .unwrap();
    let seen = dir.path().join("seen");
    std::fs::create_dir_all(&seen).unwrap();
    let delegate = dir.path().join("delegate");
    std::fs::write(
        &delegate,
        format!(
            "#!/usr/bin/env bash\ncat > {seen}/stdin\nenv > {seen}/env\n\
             echo '{{\"result\":true,\"error\":null,\"log\":\"\"}}'\n",
            seen = seen.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &delegate,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    render_ok(job_dir, &properties(&delegate), &jobs.join(job));
    Installed {
        _dir: dir,
        jobs,
        packages,
        seen,
    }
}

fn run_cpi(i: &Installed, job: &str, request: &str) -> Output {
    use std::io::Write;
    let mut base = binary::command();
    base.env("BOSH_JOBS_DIR", &i.jobs)
        .env("BOSH_PACKAGES_DIR", &i.packages)
        // What a caller's shell may hold (bosh-cli passes its own environment on to the CPI):
        // bin/cpi must not pass it on.
        .env(
            "AZURE_SUBSCRIPTION_ID",
            "99999999-9999-9999-9999-999999999999",
        )
        .env("STEMCELL_GALLERY_GALLERY", "not_this_one");
    let mut child = spawn_with_env_of(&base, &i.jobs.join(job).join("bin/cpi"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `program`, run with the environment `base` prepares (its settings and removals), piped.
fn spawn_with_env_of(base: &Command, program: &Path) -> std::process::Child {
    let mut cmd = Command::new(program);
    for (k, v) in base.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

const HAS_VM: &str =
    r#"{"method":"has_vm","arguments":["vm-1"],"context":{"director_uuid":"d","request_id":"7"}}"#;

#[test]
fn the_rendered_bin_cpi_hands_other_methods_to_the_delegate_with_its_knobs_only() {
    let cpi_json = tempfile::NamedTempFile::new().unwrap();
    write_cpi_json(cpi_json.path(), "g");
    let i = install(&cpi_job(), "stemcell_gallery_cpi", |delegate| {
        format!(
            "stemcell_gallery:\n  delegate: {}\n  cpi_json: {}\n  lock_wait: 33\n",
            delegate.display(),
            cpi_json.path().display()
        )
    });
    let out = run_cpi(&i, "stemcell_gallery_cpi", HAS_VM);
    assert!(out.status.success(), "{out:?}");
    let response: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(response["result"], true, "{response}");
    assert_eq!(read(&i.seen.join("stdin")), HAS_VM, "the same stdin bytes");
    // The knobs are in the rendered TOML (its [tuning] table), not the environment: the delegate
    // sees none of ours and none of the caller's.
    assert!(read(
        &i.jobs
            .join("stemcell_gallery_cpi/config/stemcell-gallery.toml")
    )
    .contains("lock_wait = 33.0\n"));
    let env = read(&i.seen.join("env"));
    assert!(!env.contains("STEMCELL_GALLERY_"), "{env}");
    assert!(!env.contains("AZURE_SUBSCRIPTION_ID"), "{env}");

    // With a delegate, even info is the Azure CPI's (its formats and API version are the truth).
    let info = r#"{"method":"info","arguments":[],"context":{"director_uuid":"d"}}"#;
    let out = run_cpi(&i, "stemcell_gallery_cpi", info);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(read(&i.seen.join("stdin")), info);
}

/// A small Azure CPI job in the layout of bosh-azure-cpi-release's azure_cpi (written here, not
/// copied): a bin/cpi that names azure_cpi/config/cpi.json, a cpi.json template, two packages.
fn fake_azure_cpi_release(dir: &Path) -> PathBuf {
    let job = dir.join("jobs/azure_cpi");
    std::fs::create_dir_all(job.join("templates")).unwrap();
    std::fs::write(
        job.join("spec"),
        "---\nname: azure_cpi\ntemplates:\n  cpi.erb: bin/cpi\n  cpi.json.erb: config/cpi.json\n\
         packages:\n- fake-ruby\n- fake_azure_cpi\nproperties:\n  azure.subscription_id:\n    description: s\n\
         \x20 azure.resource_group_name:\n    description: r\n  azure.compute_gallery_name:\n    description: g\n\
         \x20 azure.environment:\n    description: e\n    default: AzureCloud\n",
    )
    .unwrap();
    std::fs::write(
        job.join("templates/cpi.erb"),
        "#!/usr/bin/env bash\nexec ruby-cpi \"${BOSH_JOBS_DIR:-/var/vcap/jobs}/azure_cpi/config/cpi.json\"\n",
    )
    .unwrap();
    std::fs::write(
        job.join("templates/cpi.json.erb"),
        "<%= require 'json'; JSON.dump({'cloud' => {'plugin' => 'azure', 'properties' => {'azure' => {\
         'environment' => p('azure.environment'), 'subscription_id' => p('azure.subscription_id'), \
         'resource_group_name' => p('azure.resource_group_name'), \
         'compute_gallery_name' => p('azure.compute_gallery_name'), \
         'storage_account_name' => 'devstoreaccount1'}}}}) %>\n",
    )
    .unwrap();
    dir.to_path_buf()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_generated_create_env_job_holds_both_cpis_and_its_config_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let azure = fake_azure_cpi_release(&dir.path().join("azure"));
    let scratch = dir.path().join("release");
    std::fs::create_dir_all(scratch.join("jobs")).unwrap();
    let cp = Command::new("cp")
        .arg("-R")
        .arg(cpi_job())
        .arg(scratch.join("jobs/"))
        .status()
        .unwrap();
    assert!(cp.success());
    let gen = ruby()
        .arg(repo().join("scripts/bosh-create-env-job.rb"))
        .arg(&azure)
        .arg(&scratch)
        .output()
        .unwrap();
    assert!(gen.status.success(), "{gen:?}");
    let job = scratch.join("jobs/stemcell_gallery_create_env_cpi");
    let packages: BTreeSet<String> = ["stemcell-gallery", "fake-ruby", "fake_azure_cpi"]
        .map(String::from)
        .into();
    check_job(&job, &packages);
    let spec = yaml_file(&job.join("spec"));
    assert_eq!(
        string_list(&spec["packages"]),
        ["stemcell-gallery", "fake-ruby", "fake_azure_cpi"]
    );
    assert_eq!(
        spec["templates"]["azure_cpi.erb"].as_str(),
        Some("bin/azure_cpi")
    );
    assert_eq!(spec["templates"]["cpi.erb"].as_str(), Some("bin/cpi"));
    assert!(spec["properties"]["azure.subscription_id"].is_mapping());

    // The properties a create-env manifest gives cloud_provider (azure/cpi.yml + create-env.yml).
    let h = emulated::start_default().await;
    h.state.ensure_gallery(SUB, RG, "g", "westeurope").unwrap();
    h.state.ensure_container("stemcell").unwrap();
    let props = format!(
        "azure: {{subscription_id: {SUB}, resource_group_name: {RG}, compute_gallery_name: g}}\n\
         stemcell_gallery: {{mode: create-env, lock_wait: 12}}\n"
    );
    let rendered = dir.path().join("rendered/stemcell_gallery_create_env_cpi");
    render_ok(&job, &props, &rendered);
    let azure_bin = read(&rendered.join("bin/azure_cpi"));
    assert!(
        azure_bin.contains("/stemcell_gallery_create_env_cpi/config/cpi.json"),
        "{azure_bin}"
    );
    let bin = read(&rendered.join("bin/cpi"));
    assert!(
        bin.contains("stemcell_gallery_create_env_cpi/config\""),
        "{bin}"
    );
    assert!(
        bin.contains("--delegate \"$BOSH_JOBS_DIR\"/'stemcell_gallery_create_env_cpi/bin/azure_cpi' --create-env"),
        "{bin}"
    );
    // The TOML reads the cpi.json rendered beside it; the binary accepts the pair.
    let out = with_rendered_config(&h, &rendered)
        .arg("list")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_ops_files_use_the_release_the_script_builds() {
    let script = read(&repo().join("scripts/bosh-release.sh"));
    for var in [
        "stemcell_gallery_release_version",
        "stemcell_gallery_release_url",
        "stemcell_gallery_release_sha1",
    ] {
        assert!(
            script.contains(&format!("{var}:")),
            "the script writes {var}"
        );
        for ops in ["director.yml", "create-env.yml"] {
            assert!(
                read(&release().join("ops").join(ops)).contains(&format!("(({var}))")),
                "{ops} uses {var}"
            );
        }
    }
    assert!(script.contains("--name stemcell-gallery"));
    assert!(script.contains("cargo build --release --locked"));
    // Every job and property the ops files name exists in the release (or is generated).
    let director = yaml_file(&release().join("ops/director.yml"));
    let spec = yaml_file(&cpi_job().join("spec"));
    for op in director.as_sequence().unwrap() {
        if op["path"]
            .as_str()
            .unwrap()
            .ends_with("jobs/name=stemcell_gallery_cpi?")
        {
            for (k, _) in op["value"]["properties"]["stemcell_gallery"]
                .as_mapping()
                .unwrap()
            {
                let name = format!("stemcell_gallery.{}", k.as_str().unwrap());
                assert!(spec["properties"][name.as_str()].is_mapping(), "{name}");
            }
        }
    }
    let generator = read(&repo().join("scripts/bosh-create-env-job.rb"));
    assert!(generator.contains("JOB = 'stemcell_gallery_create_env_cpi'"));
}

#[test]
fn the_release_script_refuses_clearly_without_bosh_cli() {
    let out = Command::new("bash")
        .arg(repo().join("scripts/bosh-release.sh"))
        .arg(tempfile::tempdir().unwrap().path())
        .env("PATH", "/usr/bin:/bin")
        .env("BOSH", "")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bosh-cli not found") && err.contains("BOSH="),
        "{err}"
    );
}

/// A copy of what scripts/bosh-release.sh reads (the script, Cargo.toml, deploy/bosh) as a git
/// repository of its own, with one commit.
fn release_checkout() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let copy = |rel: &str| {
        let status = Command::new("cp")
            .args(["-R", "--parents", rel])
            .arg(dir.path())
            .current_dir(repo())
            .status()
            .unwrap();
        assert!(status.success(), "cp {rel}");
    };
    for rel in ["scripts/bosh-release.sh", "Cargo.toml", "deploy/bosh"] {
        copy(rel);
    }
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "git {args:?}: {o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "release source"]);
    dir
}

/// Stand-ins for `cargo` (the build copies this test's binary into place) and bosh-cli (add-blob
/// stores the blob as bosh does, under blobs/; create-release refuses a package file, from the
/// package spec's `files`, that is in neither blobs/ nor src/, then packs the release directory
/// as the tarball).
fn release_tools(dir: &Path) {
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    };
    write(
        "cargo",
        format!(
            "#!/bin/bash\nset -e\n[ \"$*\" = \"build --release --locked --bin stemcell-gallery\" ] || exit 3\n\
             mkdir -p \"$CARGO_TARGET_DIR/release\"\ncp {} \"$CARGO_TARGET_DIR/release/stemcell-gallery\"\n",
            env!("CARGO_BIN_EXE_stemcell-gallery")
        ),
    );
    write(
        "bosh",
        "#!/bin/bash\nset -e\ncmd=$1; shift\n\
         case $cmd in\n\
         add-blob) [ \"$1\" = --dir ]; mkdir -p \"$2/blobs/$(dirname \"$4\")\"; cp \"$3\" \"$2/blobs/$4\";;\n\
         create-release) dir=$2; tarball=$8\n\
           for f in $(sed -n '/^files:/,$ s/^- //p' \"$dir/packages/stemcell-gallery/spec\"); do\n\
             [ -e \"$dir/blobs/$f\" ] || [ -e \"$dir/src/$f\" ] || { echo \"missing package file $f\" >&2; exit 1; }\n\
           done\n\
           tar -C \"$dir\" -czf \"$tarball\" blobs packages jobs;;\n\
         inspect-local-release) echo inspected;;\n\
         *) exit 3;;\n\
         esac\n"
            .to_string(),
    );
}

fn git_head(dir: &Path) -> String {
    let o = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(dir)
        .output()
        .unwrap();
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// Runs the release script of `checkout`; returns its output, the release's source.json and the
/// variables file.
fn build_release(checkout: &Path) -> (Output, Value, Yaml) {
    let tools = tempfile::tempdir().unwrap();
    release_tools(tools.path());
    let out = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let o = Command::new("bash")
        .arg(checkout.join("scripts/bosh-release.sh"))
        .arg(out.path())
        .env("PATH", format!("{}:/usr/bin:/bin", tools.path().display()))
        .env("BOSH", tools.path().join("bosh"))
        .env("CARGO_TARGET_DIR", target.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let tarball = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "tgz"))
        .expect("a release tarball");
    let unpacked = tempfile::tempdir().unwrap();
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(unpacked.path())
        .status()
        .unwrap();
    assert!(status.success());
    let source: Value = serde_json::from_str(&read(
        &unpacked.path().join("blobs/stemcell-gallery/source.json"),
    ))
    .unwrap();
    let vars = yaml_file(&out.path().join("stemcell-gallery-release-vars.yml"));
    (o, source, vars)
}

/// Issue 31: the release records the commit it was built from and whether the tree was dirty:
/// in the package (source.json, installed beside the binary), the variables file and the log.
#[test]
fn the_release_records_the_commit_it_was_built_from() {
    let checkout = release_checkout();
    let head = git_head(checkout.path());
    assert_eq!(head.len(), 40);

    let (o, source, vars) = build_release(checkout.path());
    assert_eq!(source["commit"], head.as_str(), "{source}");
    assert_eq!(source["dirty"], Value::Bool(false), "{source}");
    assert_eq!(
        source["release_version"].as_str(),
        vars["stemcell_gallery_release_version"].as_str()
    );
    assert_eq!(vars["stemcell_gallery_release_commit"], head.as_str());
    assert_eq!(vars["stemcell_gallery_release_dirty"], Yaml::Bool(false));
    let log = String::from_utf8_lossy(&o.stdout);
    assert!(
        log.contains(&format!(
            "built from commit {head} (uncommitted changes: false)"
        )),
        "{log}"
    );

    // A change not committed: the same commit, marked dirty.
    let spec = checkout
        .path()
        .join("deploy/bosh/jobs/stemcell_gallery_cpi/spec");
    std::fs::write(&spec, format!("{}\n# local edit\n", read(&spec))).unwrap();
    let (_, source, vars) = build_release(checkout.path());
    assert_eq!(source["commit"], head.as_str());
    assert_eq!(source["dirty"], Value::Bool(true), "{source}");
    assert_eq!(vars["stemcell_gallery_release_dirty"], Yaml::Bool(true));

    // Outside a git checkout nothing is made up.
    std::fs::remove_dir_all(checkout.path().join(".git")).unwrap();
    let (_, source, vars) = build_release(checkout.path());
    assert_eq!(source["commit"], "unknown");
    assert_eq!(source["dirty"], Value::Null);
    assert_eq!(vars["stemcell_gallery_release_commit"], "unknown");
}
