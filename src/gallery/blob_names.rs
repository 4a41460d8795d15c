//! The names of the blobs kept beside a gallery version in the lock container: its lock, and
//! after it its reference record (`<lock>.refs`, `<lock>.refs.copy`), writers' intents and
//! arrivals (`<lock>.pending/…`). One place, so that every writer of a version (the service,
//! cleanup's executor) names them alike, and so that the lock and the record, which both name
//! blobs, depend on it rather than on each other. `gallery::lock` re-exports them.

use super::GalleryRef;

/// The lock of one version key of one definition of one gallery (its blob name, for the
/// blob-lease locks): `galleries/<subscription>/<resource group>/<gallery>/<definition>/<version>.lock`.
/// Everything kept beside it (the reference record, writers' intents and arrivals) is named after
/// it, so it belongs to exactly one gallery, named by its full identity: two galleries of one
/// name (in two resource groups or subscriptions) whose locks share a storage account never
/// share a record. ARM compares subscription, resource group and gallery names
/// case-insensitively, so those parts are lower-cased; a resource group may hold characters a
/// blob path should not (`(`, `)`, letters beyond ASCII), which are written `~XX` per UTF-8 byte
/// (`~` is not allowed in any of these names, so the encoding is one-to-one).
pub fn version_lock_name(gallery: &GalleryRef, definition: &str, version: &str) -> String {
    format!(
        "{}{}/{}.lock",
        gallery_lock_prefix(gallery),
        lock_name_part(definition),
        lock_name_part(version)
    )
}

/// The prefix of every version lock of one gallery: `galleries/<subscription>/<resource group>/<gallery>/`.
pub fn gallery_lock_prefix(gallery: &GalleryRef) -> String {
    format!(
        "galleries/{}/{}/{}/",
        identity_part(&gallery.subscription),
        identity_part(&gallery.resource_group),
        identity_part(&gallery.gallery)
    )
}

/// The lock name releases before the gallery's identity keyed them used,
/// `locks/<gallery>/<definition>/<version>.lock` (the gallery as configured, by name only).
/// This release also takes it while it holds a version's lock, so that hosts still running
/// the previous release and hosts running this one exclude each other while they are upgraded
/// one at a time; it reads the record the previous release kept beside it only to carry who
/// holds each reference (`record::load`).
pub fn legacy_version_lock_name(gallery: &str, definition: &str, version: &str) -> String {
    format!(
        "locks/{}/{}/{}.lock",
        lock_name_part(gallery),
        lock_name_part(definition),
        lock_name_part(version)
    )
}

/// The prefix of every legacy lock of the gallery named `gallery` (see
/// [`legacy_version_lock_name`]): `locks/<gallery>/`.
pub fn legacy_gallery_lock_prefix(gallery: &str) -> String {
    format!("locks/{}/", lock_name_part(gallery))
}

/// The legacy lock (see [`legacy_version_lock_name`]) of the version whose lock is `lock` (a
/// [`version_lock_name`]) in the gallery named `gallery` as configured; `None` for another name.
pub fn legacy_lock_of(lock: &str, gallery: &str) -> Option<String> {
    let rest = lock.strip_prefix("galleries/")?.strip_suffix(".lock")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let [_, _, _, definition, version] = parts.as_slice() else {
        return None;
    };
    Some(legacy_version_lock_name(gallery, definition, version))
}

/// The definition and version a version lock of the gallery whose prefix is `prefix` names
/// (`None` for another blob). Azure's definition and version names hold only characters the
/// lock names keep, so they come back as they are.
pub fn parse_version_lock_name<'a>(prefix: &str, lock: &'a str) -> Option<(&'a str, &'a str)> {
    lock.strip_prefix(prefix)?
        .strip_suffix(".lock")?
        .split_once('/')
        .filter(|(d, v)| !d.is_empty() && !v.is_empty() && !v.contains('/'))
}

/// One part of a gallery's identity in a blob name: lower case, `[a-z0-9._-]` as they are,
/// every other byte as `~XX`; never empty nor dots only.
fn identity_part(s: &str) -> String {
    let lower = s.trim().to_lowercase();
    let mut out = String::with_capacity(lower.len());
    for b in lower.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("~{b:02x}"));
        }
    }
    if out.is_empty() || out.chars().all(|c| c == '.') {
        out = out.replace('.', "~2e") + "~";
    }
    out
}

pub(super) fn lock_name_part(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.is_empty() || cleaned.chars().all(|c| c == '.') {
        cleaned.replace('.', "_") + "_"
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_are_per_version_and_sanitised() {
        let g = GalleryRef {
            subscription: "SUB".into(),
            resource_group: "rg".into(),
            gallery: "gal".into(),
        };
        assert_eq!(
            version_lock_name(&g, "bosh-azure-hyperv-ubuntu-jammy-go_agent", "1.506.0"),
            "galleries/sub/rg/gal/bosh-azure-hyperv-ubuntu-jammy-go_agent/1.506.0.lock"
        );
        assert_eq!(
            version_lock_name(&g, "d?e", ""),
            "galleries/sub/rg/gal/d_e/_.lock"
        );
        assert_ne!(
            version_lock_name(&g, "d", "1.0.0"),
            version_lock_name(&g, "d", "1.0.1")
        );
        assert_eq!(
            legacy_version_lock_name("gal", "bosh-azure-hyperv-ubuntu-jammy-go_agent", "1.506.0"),
            "locks/gal/bosh-azure-hyperv-ubuntu-jammy-go_agent/1.506.0.lock"
        );
        assert_eq!(
            legacy_version_lock_name("..", "d", "1"),
            "locks/___/d/1.lock"
        );
    }

    #[test]
    fn a_lock_belongs_to_one_gallery_identity_compared_as_arm_compares() {
        let g = |s: &str, rg: &str, name: &str| GalleryRef {
            subscription: s.into(),
            resource_group: rg.into(),
            gallery: name.into(),
        };
        let name = |x: &GalleryRef| version_lock_name(x, "d", "1.0.0");
        // Same name, other resource group or subscription: other locks.
        assert_ne!(name(&g("s", "rg1", "bosh")), name(&g("s", "rg2", "bosh")));
        assert_ne!(name(&g("s1", "rg", "bosh")), name(&g("s2", "rg", "bosh")));
        // ARM compares case-insensitively: one gallery, one lock.
        assert_eq!(name(&g("S", "RG1", "Bosh")), name(&g("s", "rg1", "bosh")));
        // Resource group names that a plain sanitiser would fold together stay apart.
        assert_ne!(name(&g("s", "rg(1)", "b")), name(&g("s", "rg_1_", "b")));
        assert_ne!(name(&g("s", "rgé", "b")), name(&g("s", "rg_", "b")));
        // The previous release's lock of the same version, for exclusion while upgrading.
        assert_eq!(
            legacy_lock_of(&name(&g("S", "RG1", "Bosh")), "Bosh").as_deref(),
            Some("locks/Bosh/d/1.0.0.lock")
        );
        assert_eq!(legacy_lock_of("locks/g/d/1.lock", "g"), None);
        // Parsed back by the gallery's prefix.
        let x = g("s", "rg(1)", "b");
        assert_eq!(
            parse_version_lock_name(&gallery_lock_prefix(&x), &name(&x)),
            Some(("d", "1.0.0"))
        );
    }
}
