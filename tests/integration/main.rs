//! The integration tests, one binary: real HTTP against the emulator (and Azurite for blobs),
//! the built `stemcell-gallery` binary run as operators run it, and the library driven over its
//! in-memory fakes. One module per area, named after the file it was (so `cargo test --test
//! integration cpi_create::` runs that area); [`support`] is the one support module.
//!
//! Every test shares this process: no test may change the process environment, the working
//! directory or any other process-wide state (pass settings to the child `Command` instead).

mod support;

mod architecture;
mod auth_credentials;
mod auth_process_env;
mod auth_secret_leak;
mod bad_input;
mod blob_azurite;
mod bosh_release;
mod cleanup_emulator;
mod cleanup_planner_props;
mod cleanup_scale;
mod cleanup_scenarios;
mod cli_frictions;
mod cli_resolved_settings;
mod config_resolve;
mod cpi_create;
mod cpi_delete;
mod cpi_deploy;
mod cpi_protocol;
mod delete_blob_cli;
mod deploy_and_docs;
mod deploy_schedule;
mod docs_samples;
mod doctor;
mod doctor_emulator;
mod emulator_admin;
mod emulator_arm;
mod emulator_blob;
mod emulator_fixtures;
mod emulator_locks;
mod emulator_python_conformance;
mod emulator_today;
mod ensure_from_blob;
mod gallery_scenarios;
mod inspect_cli;
mod least_privilege;
mod migrate_cli;
mod mixed_release;
mod references_cli;
mod reliability_concurrency;
mod reliability_crash;
mod reliability_faults;
mod secrets_never_printed;
mod seed_azurite;
mod seed_emulator;
mod soft_delete_restore;
mod untrusted_certificates;
