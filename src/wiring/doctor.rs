//! The doctor use case: read-only preflight checks, in order, each with pass/fail and the fix.
//! It never writes anything to Azure. The CLI's `doctor` renders them.
//!
//! Checks: configuration complete → a token can be had → the resource group and gallery are
//! readable → the storage account is writable (through [`StorageProbe`]) → the image
//! definitions are readable. A check that cannot run because an earlier one failed is `skip`.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::azure::arm::{ArmGallery, ArmOptions};
use crate::azure::auth::Credential;
use crate::config::{AuthKind, ConfigError, Settings};
use crate::error::error_chain;
use crate::gallery::model::GalleryRef;
use crate::gallery::GalleryApi;

/// Whether the configured storage can be written (for the lock blob and uploads). Implemented
/// over the blob adapter by the storage layer; a probe must leave nothing behind that
/// matters (e.g. it may check permissions without writing data).
#[async_trait::async_trait]
pub trait StorageProbe: Send + Sync {
    async fn check_writable(&self) -> anyhow::Result<()>;
}

/// Makes the storage probe for resolved settings; `None` from the factory means this build
/// has no probe for the configured storage.
pub type StorageProbeFactory =
    dyn Fn(&Settings) -> anyhow::Result<Option<Arc<dyn StorageProbe>>> + Send + Sync;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

impl Check {
    fn pass(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Pass,
            detail: detail.into(),
            fix: None,
        }
    }
    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
    fn skip(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Skip,
            detail: detail.into(),
            fix: None,
        }
    }
}

/// Knobs for the checks (tests shorten the timeouts).
#[derive(Clone)]
pub struct DoctorOptions {
    pub token_timeout: Duration,
    pub arm: ArmOptions,
    pub storage: Option<Arc<StorageProbeFactory>>,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        Self {
            token_timeout: Duration::from_secs(30),
            // A preflight should answer quickly: one retry, short backoff.
            arm: ArmOptions {
                max_retries: 1,
                base_backoff: Duration::from_millis(200),
                max_backoff: Duration::from_secs(2),
                request_timeout: Duration::from_secs(30),
                ..ArmOptions::default()
            },
            storage: None,
        }
    }
}

/// The production storage probe: the stemcell container of the configured blob endpoint, read
/// with the configured credential.
pub fn container_probe() -> Arc<StorageProbeFactory> {
    Arc::new(|settings: &Settings| {
        let Some(url) = &settings.blob_endpoint else {
            return Ok(None);
        };
        let auth = match settings.auth {
            crate::config::AuthKind::Emulator => crate::azure::blob::StorageAuth::DevelopmentKey,
            _ => crate::azure::blob::StorageAuth::Token(crate::azure::auth::credential(
                &settings.credentials(),
            )?),
        };
        let target = crate::azure::blob::StorageTarget::with_options(
            url,
            auth,
            crate::azure::blob::RetrySettings::default(),
            &settings.ca_bundles,
        )?;
        Ok(Some(
            Arc::new(ContainerProbe { target }) as Arc<dyn StorageProbe>
        ))
    })
}

/// Reads the stemcell container: it must exist and list. Doctor never writes, so write
/// permission itself is proven by the first `seed`/`ensure` (its lock blob).
struct ContainerProbe {
    target: crate::azure::blob::StorageTarget,
}

/// The storage account answers, but the stemcell container is not there: the remedy is to create
/// it, not to grant a role.
#[derive(Debug, thiserror::Error)]
#[error("container {container} does not exist in {endpoint}")]
pub struct MissingContainer {
    pub container: String,
    pub account: String,
    pub endpoint: String,
}

#[async_trait::async_trait]
impl StorageProbe for ContainerProbe {
    async fn check_writable(&self) -> anyhow::Result<()> {
        let container = self
            .target
            .container(crate::azure::blob::STEMCELL_CONTAINER);
        if !container.exists().await? {
            return Err(MissingContainer {
                container: crate::azure::blob::STEMCELL_CONTAINER.to_string(),
                account: self.target.account_name().to_string(),
                endpoint: self.target.endpoint().to_string(),
            }
            .into());
        }
        crate::azure::blob::list_stemcell_blobs(&container).await?;
        Ok(())
    }
}

/// Run every check in order.
pub async fn run_checks(
    settings: Result<Settings, ConfigError>,
    opts: &DoctorOptions,
) -> Vec<Check> {
    let mut checks = Vec::new();
    checks.push(configuration_check(&settings));
    let Ok(settings) = settings else {
        for name in [
            "token",
            "gallery",
            "storage",
            "definitions",
            "protection",
            "consumers",
        ] {
            checks.push(Check::skip(
                name,
                "skipped: the configuration is incomplete",
            ));
        }
        return checks;
    };
    let Some(credential) = token_check(&settings, opts, &mut checks).await else {
        for name in [
            "gallery",
            "storage",
            "definitions",
            "protection",
            "consumers",
        ] {
            checks.push(Check::skip(name, "skipped: no token"));
        }
        return checks;
    };
    let gallery_ok = gallery_check(&settings, opts, &credential, &mut checks).await;
    checks.push(storage_check(&settings, opts).await);
    storage_account_id_check(&gallery_ok, &settings, &mut checks).await;
    checks.push(definitions_check(&gallery_ok).await);
    checks.push(match &gallery_ok {
        None => Check::skip("protection", "skipped: the gallery is not readable"),
        Some(arm) => protection_check(arm, settings.protect_held_versions).await,
    });

    // Consumer scopes: every delete path needs to see every VM, scale set and disk.
    checks.push(match &gallery_ok {
        None => Check::skip("consumers", "skipped: the gallery is not readable"),
        Some(arm) => {
            let mut subscriptions = vec![settings.subscription.clone()];
            subscriptions.extend(settings.consumer_subscriptions.iter().cloned());
            consumer_scopes_check(arm, &subscriptions).await
        }
    });
    checks
}

/// Whether the settings resolved: their summary, or the error and the way to fix it.
fn configuration_check(settings: &Result<Settings, ConfigError>) -> Check {
    match settings {
        Ok(s) => Check::pass("configuration", describe(s)),
        Err(e) => Check::fail(
            "configuration",
            e.to_string(),
            "set the missing or invalid setting with its flag, its environment variable, or \
             in the --config file (our TOML, or the Azure CPI's cpi.json)",
        ),
    }
}

/// Whether a token can be had within the timeout; pushes the token check and returns the
/// credential that got it.
async fn token_check(
    settings: &Settings,
    opts: &DoctorOptions,
    checks: &mut Vec<Check>,
) -> Option<Credential> {
    let scope = settings.token_scope.clone();
    let credential = match crate::azure::auth::credential(&settings.credentials()) {
        Ok(c) => Some(c),
        Err(e) => {
            checks.push(Check::fail("token", format!("{e:#}"), token_fix(settings)));
            None
        }
    };
    match credential {
        None => None,
        Some(c) => match tokio::time::timeout(
            opts.token_timeout,
            crate::progress::while_waiting(
                || {
                    format!(
                        "a token for {scope} (gives up after {} s)",
                        opts.token_timeout.as_secs()
                    )
                },
                c.get_token(&[&scope]),
            ),
        )
        .await
        {
            Ok(Ok(token)) => {
                checks.push(Check::pass(
                    "token",
                    format!(
                        "got a token for {scope} with --auth {} (expires {})",
                        settings.auth.as_str(),
                        // RFC 3339 to the second, as every other time the tool prints.
                        token
                            .expires_on
                            .replace_nanosecond(0)
                            .ok()
                            .and_then(|t| t
                                .format(&time::format_description::well_known::Rfc3339)
                                .ok())
                            .unwrap_or_else(|| token.expires_on.to_string())
                    ),
                ));
                Some(c)
            }
            Ok(Err(e)) => {
                checks.push(Check::fail(
                    "token",
                    // One line per check: azure_identity 1.x's messages carry a second
                    // "To troubleshoot, visit …" line.
                    format!(
                        "no token for {scope}: {}",
                        error_chain(&e)
                            .split_whitespace()
                            .collect::<Vec<_>>()
                            .join(" ")
                    ),
                    token_fix(settings),
                ));
                None
            }
            Err(_) => {
                // A wrong credential is refused at once; a wait this long is the way there
                // (issue 31: doctor suggested credential fixes for a network problem).
                let endpoint = token_endpoint(settings);
                checks.push(Check::fail(
                    "token",
                    format!(
                        "no answer for a token for {scope} within {} s: the credential was not \
                         refused, the token endpoint ({endpoint}) did not answer — a network \
                         problem (proxy, firewall, DNS) or a slow endpoint, not a wrong credential",
                        opts.token_timeout.as_secs(),
                    ),
                    format!(
                        "check that this host reaches {endpoint} (HTTPS_PROXY/NO_PROXY, \
                         firewall, DNS), then run doctor again"
                    ),
                ));
                None
            }
        },
    }
}

/// Whether the gallery (and with it the resource group) is readable; pushes the gallery check
/// and returns the ARM client the later checks read through.
async fn gallery_check(
    settings: &Settings,
    opts: &DoctorOptions,
    credential: &Credential,
    checks: &mut Vec<Check>,
) -> Option<ArmGallery> {
    let gallery_ref = GalleryRef {
        subscription: settings.subscription.clone(),
        resource_group: settings.resource_group.clone(),
        gallery: settings.gallery.clone(),
    };
    let arm = ArmGallery::new(
        &settings.arm_endpoint,
        credential.clone(),
        gallery_ref.clone(),
        ArmOptions {
            ca_bundles: settings.ca_bundles.clone(),
            token_scope: Some(settings.token_scope.clone()),
            ..opts.arm.clone()
        },
    );
    match arm {
        Err(e) => {
            checks.push(Check::fail(
                "gallery",
                format!("cannot set up the ARM client: {e:#}"),
                "check --arm-endpoint",
            ));
            None
        }
        Ok(arm) => match arm.gallery_region().await {
            Ok(Some(own)) => {
                let mut check = gallery_location_check(settings, &gallery_ref, own);
                check
                    .detail
                    .push_str(&soft_delete_text(arm.soft_delete().await));
                checks.push(check);
                Some(arm)
            }
            Ok(None) => {
                checks.push(Check::fail(
                    "gallery",
                    format!(
                        "gallery {} does not exist at {}",
                        gallery_ref.id(),
                        settings.arm_endpoint
                    ),
                    format!(
                        "create it (az sig create --resource-group {} --gallery-name {} \
                         --location {}), or fix --subscription/--resource-group/--gallery",
                        settings.resource_group,
                        settings.gallery,
                        settings.location.as_deref().unwrap_or("REGION")
                    ),
                ));
                None
            }
            Err(e) => {
                checks.push(Check::fail(
                    "gallery",
                    format!("{e:#}"),
                    "check --arm-endpoint and the network path to it, and that the identity has \
                     at least Reader on the resource group (see deploy/ for the least-privilege role)",
                ));
                None
            }
        },
    }
}

/// Whether the stemcell container of the configured storage is there and readable.
async fn storage_check(settings: &Settings, opts: &DoctorOptions) -> Check {
    match (&settings.blob_endpoint, &opts.storage) {
        (None, _) => Check::skip("storage", "skipped: no blob endpoint configured"),
        (Some(endpoint), None) => Check::skip(
            "storage",
            format!("skipped: no storage probe in this build for {endpoint}"),
        ),
        (Some(endpoint), Some(factory)) => match factory(settings) {
            Ok(None) => Check::skip(
                "storage",
                format!("skipped: no storage probe for {endpoint}"),
            ),
            Ok(Some(probe)) => match probe.check_writable().await {
                Ok(()) => Check::pass(
                    "storage",
                    format!("{endpoint}: the stemcell container is there and readable (doctor never writes; the first seed or ensure exercises write access)"),
                ),
                Err(e) => match e.downcast_ref::<MissingContainer>() {
                    Some(missing) => Check::fail(
                        "storage",
                        format!("{missing}"),
                        format!(
                            "create the container (az storage container create --name {} \
                             --account-name {} --auth-mode login), or check --blob-endpoint / \
                             --storage-account if this is the wrong account",
                            missing.container, missing.account
                        ),
                    ),
                    None => Check::fail(
                        "storage",
                        format!("{endpoint} is not writable: {e:#}"),
                        "grant the identity Storage Blob Data Contributor on the storage account, \
                         and check --blob-endpoint / --storage-account",
                    ),
                },
            },
            Err(e) => Check::fail(
                "storage",
                format!("cannot set up the storage client for {endpoint}: {e:#}"),
                "check --blob-endpoint / --storage-account",
            ),
        },
    }
}

/// The storage account's resource id, which a new version's source names: looked up through
/// ARM unless storage_account_resource_group is configured (as seed and ensure do), so a
/// missing Microsoft.Storage/storageAccounts/read fails here, not after an upload. Amends the
/// storage check, if it passed.
async fn storage_account_id_check(
    gallery_ok: &Option<ArmGallery>,
    settings: &Settings,
    checks: &mut [Check],
) {
    if let (Some(arm), None, Some(last)) = (
        gallery_ok,
        &settings.storage_account_resource_group,
        checks.last_mut(),
    ) {
        let account = settings
            .blob_endpoint
            .as_ref()
            .and_then(crate::azure::blob::endpoint_account)
            .or_else(|| settings.storage_account.clone());
        if let (true, Some(account)) = (last.status == Status::Pass, account) {
            let subscription = &settings.subscription;
            use crate::gallery::api::StorageAccounts;
            match arm.find_storage_account(subscription, &account).await {
                Ok(Some(id)) => last
                    .detail
                    .push_str(&format!("; its resource id is {id} (looked up through ARM)")),
                Ok(None) => {
                    *last = Check::fail(
                        "storage",
                        format!("storage account {account} not found in subscription {subscription}, so a new version could not name its source"),
                        "set storage_account_resource_group to the account's resource group, or check --subscription and --blob-endpoint",
                    )
                }
                Err(e) => {
                    *last = Check::fail(
                        "storage",
                        format!("cannot look up the resource id of storage account {account}: {e:#}"),
                        "grant the identity Microsoft.Storage/storageAccounts/read (see deploy/azure/role-definition.json), or set storage_account_resource_group",
                    )
                }
            }
        }
    }
}

/// Whether the image definitions, their versions and the soft-deleted versions are readable.
async fn definitions_check(gallery_ok: &Option<ArmGallery>) -> Check {
    match gallery_ok {
        None => Check::skip("definitions", "skipped: the gallery is not readable"),
        Some(arm) => match arm.list_definitions().await {
            Ok(defs) => {
                let mut versions = Vec::new();
                let mut unreadable = None;
                for d in &defs {
                    match arm.list_versions(&d.name).await {
                        Ok(vs) => versions.extend(vs),
                        Err(e) => {
                            unreadable = Some(e);
                            break;
                        }
                    }
                }
                let soft = soft_deleted_of(arm, &defs).await;
                match (unreadable, soft) {
                    (None, Ok(soft)) => Check::pass(
                        "definitions",
                        format!(
                            "{} image definition(s) and {} version(s) readable in the gallery; {}; {}",
                            defs.len(),
                            versions.len(),
                            blocked_text(&versions, arm.server_time()),
                            soft
                        ),
                    ),
                    (None, Err(e)) => Check::fail(
                        "definitions",
                        format!("the soft-deleted versions cannot be listed: {e:#}"),
                        "grant the identity Microsoft.Compute/galleries/softDeletedArtifactTypes/artifacts/versions/read (deploy/azure/role-definition.json): `list --soft-deleted`, `restore` and a create under a soft-deleted name need it",
                    ),
                    (Some(e), _) => Check::fail(
                        "definitions",
                        format!("{e:#}"),
                        "grant the identity read access to the gallery's image versions",
                    ),
                }
            }
            Err(e) => Check::fail(
                "definitions",
                format!("{e:#}"),
                "grant the identity read access to the gallery's image definitions",
            ),
        },
    }
}

/// Whether held versions are protected by their delete lock (`gallery::protect`): the setting,
/// the identity's lock permissions at the gallery's resource group, and every held version's
/// lock. Read only.
async fn protection_check(arm: &ArmGallery, configured: bool) -> Check {
    use crate::gallery::protect;
    const NAME: &str = "protection";
    if !configured {
        return Check::pass(
            NAME,
            "off on purpose (protect_held_versions = false): held versions carry no delete lock, so clients that do not read their references (portal, az, Terraform, Azure CPI v52.0.1-v53.0.0) can delete them",
        );
    }
    let fix_permissions = format!(
        "grant {} at the gallery's resource group (deploy/azure/role-definition.json has them), or set protect_held_versions = false to run without the lock on purpose",
        protect::LOCK_ACTIONS
    );
    match arm.missing_lock_actions().await {
        Ok(missing) if !missing.is_empty() => {
            return Check::fail(
                NAME,
                format!(
                    "held versions are not protected: the identity lacks {}, so no delete lock is placed and any client can delete a version this tool holds",
                    missing.join(", ")
                ),
                fix_permissions,
            )
        }
        Ok(_) => {}
        Err(e) => {
            return Check::fail(
                NAME,
                format!("cannot read the identity's lock permissions: {e:#}"),
                fix_permissions,
            )
        }
    }
    let listed = async {
        let mut versions = Vec::new();
        for d in arm.list_definitions().await? {
            versions.extend(arm.list_versions(&d.name).await?);
        }
        let locks = arm.gallery_locks().await?;
        Ok::<_, crate::gallery::Error>((versions, locks))
    }
    .await;
    match listed {
        Err(e) => Check::fail(
            NAME,
            format!("cannot list the versions and their locks: {e:#}"),
            fix_permissions,
        ),
        Ok((versions, locks)) => {
            let repairs = protect::lock_repairs(&versions, &locks);
            let held = versions.iter().filter(|v| protect::is_held(v)).count();
            if repairs.is_empty() {
                Check::pass(
                    NAME,
                    format!(
                        "on: {held} held version(s), each with its delete lock {}",
                        protect::LOCK_NAME
                    ),
                )
            } else {
                Check::fail(
                    NAME,
                    format!(
                        "the delete lock of {} version(s) is out of line with their references (held without it, or held by the Azure CPI alone and still locked): {}",
                        repairs.len(),
                        repairs.join(", ")
                    ),
                    "run `stemcell-gallery cleanup --apply` (or write any reference to them): each is repaired under its version lock",
                )
            }
        }
    }
}

/// Whether the identity may read every consumer of each subscription (see `azure::permissions`).
async fn consumer_scopes_check(arm: &ArmGallery, subscriptions: &[String]) -> Check {
    const NAME: &str = "consumers";
    let scopes: Vec<String> = subscriptions
        .iter()
        .map(|s| format!("/subscriptions/{s}"))
        .collect();
    for (subscription, scope) in subscriptions.iter().zip(&scopes) {
        match arm.check_consumer_view(subscription).await {
            Ok(()) => {}
            Err(e @ crate::gallery::Error::PartialView { .. }) => {
                return Check::fail(
                    NAME,
                    format!("{e}"),
                    format!(
                        "assign deploy/azure/consumer-reader-role.json (or Reader) at {scope}: \
                         az role assignment create --assignee-object-id PRINCIPAL \
                         --role \"BOSH Stemcell Gallery Consumer Reader\" --scope {scope}"
                    ),
                )
            }
            Err(e) => {
                return Check::fail(
                    NAME,
                    format!("cannot read the identity's permissions at {scope}: {e:#}"),
                    "check --arm-endpoint and the network path to it, then re-run doctor",
                )
            }
        }
    }
    Check::pass(
        NAME,
        format!(
            "the identity reads every VM, scale set and disk of {}, so cleanup and delete can \
             prove what is unused",
            scopes.join(", ")
        ),
    )
}

/// The gallery is readable: say where new definitions and versions will go. Without a configured
/// location that is the gallery's own region (what ensure, seed and the CPI use).
fn gallery_location_check(settings: &Settings, gallery: &GalleryRef, own: Option<String>) -> Check {
    let readable = format!("gallery {} is readable", gallery.id());
    match (&settings.location, own) {
        (None, Some(own)) => Check::pass(
            "gallery",
            format!(
                "{readable}; its location is {own}, and as no location is configured new image \
                 definitions and versions are created there"
            ),
        ),
        (None, None) => Check::fail(
            "gallery",
            format!("{readable}, but its location could not be read and none is configured"),
            "pass --location REGION (or set location in the config file)",
        ),
        (Some(configured), Some(own)) if !configured.eq_ignore_ascii_case(&own) => Check::pass(
            "gallery",
            format!(
                "{readable}; its location is {own}, but new image definitions and versions are \
                 created in the configured location {configured}"
            ),
        ),
        (Some(configured), _) => Check::pass(
            "gallery",
            format!("{readable}; new image definitions and versions are created in {configured}"),
        ),
    }
}

/// The gallery's soft-delete policy, appended to the gallery check (issue 30 item 7).
fn soft_delete_text(
    policy: Result<Option<crate::gallery::model::SoftDelete>, crate::gallery::Error>,
) -> String {
    match policy {
        Ok(None) => "; soft delete is off".into(),
        Ok(Some(p)) => format!(
            "; soft delete is on: a deleted version stays restorable for {} days, and a Failed version cannot be deleted (see docs/end-of-life.md)",
            p.retention_days
                .unwrap_or(crate::gallery::lifecycle::DEFAULT_RETENTION_DAYS)
        ),
        Err(e) => format!("; its soft-delete policy could not be read: {e}"),
    }
}

/// How many versions block their deletion before their end of life, by Azure's clock `now`, and
/// until when the last block lasts (issue 30 item 7).
fn blocked_text(
    versions: &[crate::gallery::ImageVersion],
    now: Option<time::OffsetDateTime>,
) -> String {
    let blocks: Vec<Option<time::OffsetDateTime>> = versions
        .iter()
        .filter_map(|v| v.deletion_blocked(now))
        .collect();
    if blocks.is_empty() {
        return "none blocks its deletion before its end of life".into();
    }
    let last = blocks.iter().flatten().max().copied();
    let open = blocks.iter().filter(|b| b.is_none()).count();
    format!(
        "{} block their deletion before their end of life{}{}",
        blocks.len(),
        match crate::gallery::lifecycle::until_rfc3339(last) {
            Some(at) => format!(", the last until {at}"),
            None => String::new(),
        },
        if open > 0 {
            format!(" ({open} name no end of life)")
        } else {
            String::new()
        }
    )
}

/// The definitions' soft-deleted versions, for the definitions check: how many, until when the
/// last can be restored, and how many consumers still name or run them (issue 30 item 5). `Err`:
/// the list is refused (a role without its action). An Azure without the list (400) says so.
async fn soft_deleted_of(
    arm: &crate::azure::arm::ArmGallery,
    defs: &[crate::gallery::model::ImageDefinition],
) -> Result<String, crate::gallery::Error> {
    use crate::gallery::lifecycle::until_rfc3339;
    let mut soft = Vec::new();
    for d in defs {
        match arm.list_soft_deleted(&d.name).await {
            Ok(s) => soft.extend(s),
            Err(e) if e.azure_answer().is_some_and(|a| a.status == 400) => {
                return Ok(format!("soft-deleted versions are not listed here ({e})"))
            }
            Err(e) => return Err(e),
        }
    }
    if soft.is_empty() {
        return Ok("no soft-deleted versions".into());
    }
    let policy = arm.soft_delete().await.unwrap_or(None);
    let last = soft.iter().filter_map(|s| s.restorable_until(policy)).max();
    let users = match arm.list_consumers().await {
        Ok(consumers) => {
            let n = consumers
                .iter()
                .filter(|c| {
                    soft.iter()
                        .any(|s| crate::gallery::latest::uses_soft_deleted(c, s))
                })
                .count();
            format!("{n} consumer(s) still name or run them")
        }
        Err(e) => format!("which consumers still use them cannot be read: {e}"),
    };
    Ok(format!(
        "{} soft-deleted version(s) (`list --soft-deleted`), restorable until {} at the latest; {users}",
        soft.len(),
        until_rfc3339(last).unwrap_or_else(|| "unknown".into())
    ))
}

fn describe(s: &Settings) -> String {
    format!(
        "subscription {}, resource group {}, gallery {}, location {}, cloud {}, ARM {}, auth {}{}",
        s.subscription,
        s.resource_group,
        s.gallery,
        s.location
            .as_deref()
            .unwrap_or("not set (the gallery's own is used)"),
        s.cloud,
        s.arm_endpoint,
        s.auth.as_str(),
        s.config_file
            .as_ref()
            .map(|p| format!(", config {}", p.display()))
            .unwrap_or_default()
    )
}

/// Where the configured credential gets its tokens.
fn token_endpoint(s: &Settings) -> String {
    match s.auth {
        AuthKind::ManagedIdentity => s.imds_endpoint.to_string(),
        AuthKind::AzureCli => "the Azure CLI (az account get-access-token)".into(),
        AuthKind::Emulator => s.arm_endpoint.to_string(),
        _ => s.authority_host.to_string(),
    }
}

fn token_fix(s: &Settings) -> String {
    match s.auth {
        AuthKind::Default => "log in with `az login`, or choose a credential with --auth \
             (secret, workload-identity, managed-identity) and its settings"
            .into(),
        AuthKind::Secret => format!(
            "check the tenant id, client id and client secret of the service principal, and \
             that {} is the right authority for the cloud",
            s.authority_host
        ),
        AuthKind::WorkloadIdentity => "check the federated token file, the client id and the \
             federated credential of the identity (issuer and subject)"
            .into(),
        AuthKind::ManagedIdentity => format!(
            "check that the VM (or pod) has the managed identity assigned and that {} answers",
            s.imds_endpoint
        ),
        AuthKind::AzureCli => "run `az login` (Azure CLI 2.54 or newer)".into(),
        AuthKind::Emulator => "start the emulator and point --arm-endpoint at it".into(),
    }
}
