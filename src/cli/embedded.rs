//! The global `--emulator` flag: start the emulator in-process and point the command at it.

use super::GlobalArgs;
use crate::emulator;

pub const DEFAULT_SUBSCRIPTION: &str = "00000000-0000-0000-0000-000000000000";
pub const DEFAULT_RESOURCE_GROUP: &str = "bosh-rg";
pub const DEFAULT_GALLERY: &str = "bosh_stemcells";
pub const DEFAULT_LOCATION: &str = "westeurope";
pub const DEFAULT_CONTAINER: &str = "stemcell";

/// The least-privilege role shipped in deploy/azure: `--emulator` holds every command to it, so
/// running anything on the embedded emulator also proves the role is enough for it.
pub const LEAST_PRIVILEGE_ROLE: &str = include_str!("../../deploy/azure/role-definition.json");

/// [`LEAST_PRIVILEGE_ROLE`], parsed.
pub fn least_privilege_role() -> emulator::Role {
    emulator::Role::from_json(LEAST_PRIVILEGE_ROLE)
        .expect("deploy/azure/role-definition.json is a role definition (checked by its unit test)")
}

/// When `--emulator` is set: start the emulator, set the endpoints and `--auth emulator`, fill
/// unset subscription / resource group / gallery / location with defaults, and create that gallery
/// and the blob container `stemcell` so commands work at once. Keep the handle alive for the
/// command's duration.
pub async fn apply(global: &mut GlobalArgs) -> anyhow::Result<Option<emulator::Handle>> {
    if !global.emulator {
        return Ok(None);
    }
    // `STEMCELL_GALLERY_EMULATOR_TIMING=azure` (and `..._TIME_SCALE=N`): Azure's durations.
    let timing = super::emulator::timing_from_env()?;
    let handle = emulator::start(emulator::Options {
        role: Some(least_privilege_role()),
        timing,
        ..Default::default()
    })
    .await?;
    global.arm_endpoint = Some(handle.arm.clone());
    global.blob_endpoint = Some(handle.blob.clone());
    global.auth = Some("emulator".into());
    // Only what is unset: one given empty (`--gallery ''`) is refused by the settings, never
    // replaced by a default behind the operator's back.
    let fill = |v: &mut Option<String>, default: &str| {
        if v.is_none() {
            *v = Some(default.to_string());
        }
    };
    fill(&mut global.subscription, DEFAULT_SUBSCRIPTION);
    fill(&mut global.resource_group, DEFAULT_RESOURCE_GROUP);
    fill(&mut global.gallery, DEFAULT_GALLERY);
    fill(&mut global.location, DEFAULT_LOCATION);
    let field = |v: &Option<String>| v.clone().unwrap_or_default();
    let named = [
        &global.subscription,
        &global.resource_group,
        &global.gallery,
    ];
    if named.iter().any(|v| field(v).trim().is_empty()) {
        // The settings refuse it, naming the flag.
        return Ok(Some(handle));
    }
    handle.state.ensure_gallery(
        &field(&global.subscription),
        &field(&global.resource_group),
        &field(&global.gallery),
        &field(&global.location),
    )?;
    handle.state.ensure_container(DEFAULT_CONTAINER)?;
    tracing::debug!(arm = %handle.arm, blob = %handle.blob, "in-process emulator started");
    Ok(Some(handle))
}
