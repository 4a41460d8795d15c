//! Azure name syntax, in one place: what a subscription id, resource group, region, gallery,
//! image definition and storage account name may hold, and the resource id a storage account
//! has. Pure rules (no I/O, no error types of any layer): the settings, the stemcell reader and
//! the CLI each say in their own words what was wrong, but ask these functions whether it is.
//!
//! These names become ARM path segments and parts of blob names, so every one is checked before
//! any request: nothing a value holds can reach another resource.

/// The container the Azure CPI keeps stemcell VHDs in (`seed --container` defaults to it).
pub const STEMCELL_CONTAINER: &str = "stemcell";
/// The prefix of stemcell CIDs and blob names (the Azure CPI's `STEMCELL_PREFIX`).
pub const STEMCELL_PREFIX: &str = "bosh-stemcell";
/// Metadata key holding the SHA-256 of the stemcell's `image` file (shared with the Azure CPI).
pub const META_IMAGE_SHA256: &str = "image_sha256";

/// A new stemcell identity: (CID `bosh-stemcell-<uuid>`, blob name `bosh-stemcell-<uuid>.vhd`).
/// Choose it once, before the first request, and reuse it on retries.
pub fn new_stemcell_blob_name() -> (String, String) {
    let cid = format!("{STEMCELL_PREFIX}-{}", uuid::Uuid::new_v4());
    let blob = format!("{cid}.vhd");
    (cid, blob)
}

/// Whether `cid` has the shape of a stemcell CID the Azure CPI (or `publish`) makes,
/// `bosh-stemcell-<uuid>`: only such a CID owns a blob `<cid>.vhd`.
pub fn is_stemcell_cid(cid: &str) -> bool {
    cid.strip_prefix(STEMCELL_PREFIX)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|uuid| uuid.len() == 36 && uuid::Uuid::parse_str(uuid).is_ok())
}

/// A subscription id as a path segment: letters, digits and `-` (a GUID is checked by
/// [`is_guid`] where only a GUID will do).
pub fn is_subscription_segment(id: &str) -> bool {
    id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// 8-4-4-4-12 hexadecimal digits.
pub fn is_guid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Resource group names: 1 to 90 letters, digits, `_`, `-`, `.`, `(`, `)`; not ending in `.`.
pub fn is_resource_group(rg: &str) -> bool {
    (1..=90).contains(&rg.chars().count())
        && rg
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '(' | ')'))
        && !rg.ends_with('.')
}

/// Regions: `westeurope`, or a display name such as `West Europe`.
pub fn is_location(location: &str) -> bool {
    location
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ' ')
}

fn alnum(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_ascii_alphanumeric())
}

/// Compute Gallery names: 1 to 80 letters, digits, `_` and `.`, starting and ending with a
/// letter or digit (no `-`, unlike image definition names).
pub fn is_gallery_name(gallery: &str) -> bool {
    gallery.len() <= 80
        && gallery
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
        && alnum(gallery.chars().next())
        && alnum(gallery.chars().last())
}

/// What [`is_definition_name`] accepts, for messages.
pub const DEFINITION_NAME_RULE: &str =
    "1 to 80 letters, digits, '.', '_' or '-', starting and ending with a letter or digit";

/// Image definition names: 1 to 80 letters, digits, `.`, `_` and `-`, starting and ending with
/// a letter or digit.
pub fn is_definition_name(name: &str) -> bool {
    name.len() <= 80
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && alnum(name.chars().next())
        && alnum(name.chars().last())
}

/// Whether `s` can be part of a definition name (a suffix): letters, digits, `.`, `_`, `-`, not
/// ending in `.`.
pub fn is_definition_name_part(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !s.ends_with('.')
}

/// Storage account names: 3 to 24 lowercase letters and digits.
pub fn is_storage_account(account: &str) -> bool {
    (3..=24).contains(&account.len())
        && account
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// A storage account's resource id, as a gallery version's source names it
/// (`/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Storage/storageAccounts/{a}`).
pub fn storage_account_id(subscription: &str, resource_group: &str, account: &str) -> String {
    format!(
        "/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/Microsoft.Storage/storageAccounts/{account}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definition_names_follow_azures_rule() {
        assert!(is_definition_name(&"a".repeat(80)));
        assert!(!is_definition_name(&"a".repeat(81)));
        assert!(is_definition_name("x_1.2-gen2"));
        assert!(!is_definition_name(""));
        assert!(!is_definition_name("-x"));
        assert!(!is_definition_name("x."));
        assert!(!is_definition_name("a/b"));
    }

    #[test]
    fn gallery_names_allow_no_dash() {
        assert!(is_gallery_name("bosh_gallery.1"));
        assert!(!is_gallery_name("bosh-gallery"));
        assert!(!is_gallery_name("_x"));
    }

    #[test]
    fn guids_and_accounts() {
        assert!(is_guid("11111111-2222-3333-4444-555555555555"));
        assert!(!is_guid("11111111-2222-3333-4444-55555555555"));
        assert!(is_storage_account("devstoreaccount1"));
        assert!(!is_storage_account("Dev"));
        assert!(is_resource_group("bosh-rg(1)"));
        assert!(!is_resource_group("rg."));
    }
}
