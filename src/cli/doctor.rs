//! `stemcell-gallery doctor`: the doctor use case's checks (`wiring::doctor`), as a table or JSON;
//! exit 1 when any check failed.

use crate::cli::{GlobalArgs, Report};
use crate::config::Settings;
use crate::error::Exit;

pub use crate::wiring::doctor::{Check, DoctorOptions, Status, StorageProbe};

#[derive(Debug, Clone, clap::Args, Default)]
pub struct DoctorArgs {}

/// The CLI entry point, with the production storage probe.
pub async fn run(global: &GlobalArgs, _args: DoctorArgs) -> anyhow::Result<Report> {
    let opts = DoctorOptions {
        storage: Some(crate::wiring::doctor::container_probe()),
        ..DoctorOptions::default()
    };
    let checks = run_checks(global, &opts).await;
    Ok(report(&checks))
}

/// Every check in order, for the settings the flags resolve to.
pub async fn run_checks(global: &GlobalArgs, opts: &DoctorOptions) -> Vec<Check> {
    crate::wiring::doctor::run_checks(Settings::resolve(global), opts).await
}

/// Turn the checks into the command's report: exit 1 when any check failed.
pub fn report(checks: &[Check]) -> Report {
    let ok = checks.iter().all(|c| c.status != Status::Fail);
    let json = serde_json::json!({ "checks": checks, "ok": ok });
    let mut human = String::new();
    for c in checks {
        let tag = match c.status {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        };
        human.push_str(&format!("{tag}  {:<13} {}\n", c.name, c.detail));
        if let Some(fix) = &c.fix {
            human.push_str(&format!("      {:<13} fix: {fix}\n", ""));
        }
    }
    human.push_str(if ok {
        "all checks passed\n"
    } else {
        "some checks failed\n"
    });
    let report = Report::new(json, human);
    if ok {
        report
    } else {
        report.with_exit(Exit::Error)
    }
}
