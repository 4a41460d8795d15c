//! Resource ids and blob URLs given on the command line, parsed before anything is sent.

/// A storage account's resource id:
/// `/subscriptions/{guid}/resourceGroups/{rg}/providers/Microsoft.Storage/storageAccounts/{name}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageAccountId {
    pub subscription: String,
    pub resource_group: String,
    pub name: String,
}

const ACCOUNT_ID_FORM: &str =
    "/subscriptions/{subscription guid}/resourceGroups/{resource group}/providers/Microsoft.Storage/storageAccounts/{account name}";

impl StorageAccountId {
    /// Parse a storage account resource id (segment names compare case-insensitively, as ARM's
    /// do). The error says what was expected, not what was wrong in detail.
    pub fn parse(id: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "{id:?} is not a storage account resource id ({why}); expected {ACCOUNT_ID_FORM}"
            )
        };
        let rest = id
            .trim()
            .strip_prefix('/')
            .ok_or_else(|| bad("it does not start with /subscriptions/"))?;
        let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
        let [subs, sub, rgs, rg, providers, ns, kind, name] = parts.as_slice() else {
            return Err(bad("it does not have the eight segments of that form"));
        };
        let literal = |got: &str, want: &str| got.eq_ignore_ascii_case(want);
        if !literal(subs, "subscriptions")
            || !literal(rgs, "resourceGroups")
            || !literal(providers, "providers")
        {
            return Err(bad(
                "its segments are not subscriptions/…/resourceGroups/…/providers/…",
            ));
        }
        if !literal(ns, "Microsoft.Storage") || !literal(kind, "storageAccounts") {
            return Err(bad(
                "it does not name a Microsoft.Storage/storageAccounts resource",
            ));
        }
        if !is_guid(sub) {
            return Err(bad("the subscription is not a GUID"));
        }
        if !is_resource_group(rg) {
            return Err(bad("the resource group name is not valid"));
        }
        if !is_account_name(name) {
            return Err(bad(
                "the account name is not 3 to 24 lower-case letters and digits",
            ));
        }
        Ok(Self {
            subscription: sub.to_string(),
            resource_group: rg.to_string(),
            name: name.to_string(),
        })
    }
}

pub use crate::access::blob_in_account;
use crate::names::{is_guid, is_resource_group, is_storage_account as is_account_name};

/// A blob URL a gallery version can be made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobUrl {
    pub url: url::Url,
    /// The account named by the host (`https://{account}.blob.{suffix}/...`); `None` for
    /// path-style URLs (the emulator, Azurite: `http://127.0.0.1:10000/{account}/...`).
    pub host_account: Option<String>,
}

impl BlobUrl {
    /// `https://{account}.blob.{suffix}/{container}/{blob}`, or `http(s)://{loopback}:{port}/
    /// {account}/{container}/{blob}` for a local emulator. Other schemes (`file:`, `ftp:`) and
    /// URLs that name no blob are refused. `shown` is how to name the value in errors.
    pub fn parse(value: &str, shown: &str) -> Result<Self, String> {
        let expected = "use https://ACCOUNT.blob.core.windows.net/CONTAINER/BLOB.vhd (http only for a local emulator on a loopback address)";
        let url = url::Url::parse(value).map_err(|e| {
            format!(
                "{shown} {} is not a URL ({e}); {expected}",
                crate::redact::uri(value)
            )
        })?;
        let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
        let loopback = match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            None => false,
        };
        let scheme_ok = url.scheme() == "https" || (url.scheme() == "http" && loopback);
        if !scheme_ok || host.is_empty() {
            return Err(format!(
                "{shown} {} is not a blob URL; {expected}",
                crate::redact::uri(value)
            ));
        }
        let segments: Vec<&str> = url
            .path_segments()
            .map(|s| s.filter(|p| !p.is_empty()).collect())
            .unwrap_or_default();
        let host_account = match host.split_once(".blob.") {
            Some((account, _)) if !loopback => Some(account.to_string()),
            _ => None,
        };
        // Path-style URLs carry the account as their first segment.
        let needed = if host_account.is_some() { 2 } else { 3 };
        if segments.len() < needed {
            return Err(format!(
                "{shown} {} names no container and blob; {expected}",
                crate::redact::uri(value)
            ));
        }
        Ok(Self { url, host_account })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_uris_split_into_container_and_name_in_the_endpoints_account_only() {
        let ep = "https://bosh.blob.core.windows.net";
        assert_eq!(
            blob_in_account(ep, &format!("{ep}/stemcell/bosh-stemcell-1.vhd")),
            Some(("stemcell".into(), "bosh-stemcell-1.vhd".into()))
        );
        assert_eq!(
            blob_in_account(
                ep,
                "https://BOSH.blob.core.windows.net:443/stemcell/a%20b.vhd?sv=x"
            ),
            Some(("stemcell".into(), "a b.vhd".into()))
        );
        assert_eq!(
            blob_in_account(ep, "https://other.blob.core.windows.net/stemcell/x.vhd"),
            None
        );
        assert_eq!(blob_in_account(ep, &format!("{ep}/stemcell")), None);
        assert_eq!(blob_in_account(ep, &format!("{ep}/stemcell/")), None);
        let emu = "http://127.0.0.1:10000/devstoreaccount1";
        assert_eq!(
            blob_in_account(
                emu,
                "http://127.0.0.1:10000/devstoreaccount1/stemcell/x.vhd"
            ),
            Some(("stemcell".into(), "x.vhd".into()))
        );
        assert_eq!(
            blob_in_account(
                emu,
                "http://127.0.0.1:10000/devstoreaccount2/stemcell/x.vhd"
            ),
            None
        );
        assert_eq!(
            blob_in_account(
                emu,
                "http://127.0.0.1:10001/devstoreaccount1/stemcell/x.vhd"
            ),
            None
        );
    }

    const ID: &str = "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/bosh-rg/providers/Microsoft.Storage/storageAccounts/bosh";

    #[test]
    fn storage_account_ids_are_parsed_strictly() {
        let id = StorageAccountId::parse(ID).unwrap();
        assert_eq!(
            (id.resource_group.as_str(), id.name.as_str()),
            ("bosh-rg", "bosh")
        );
        assert!(StorageAccountId::parse(&ID.to_ascii_lowercase()).is_ok());
        for bad in [
            "bosh",
            "",
            "/subscriptions/not-a-guid/resourceGroups/bosh-rg/providers/Microsoft.Storage/storageAccounts/bosh",
            "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/bosh-rg/providers/Microsoft.Compute/disks/bosh",
            "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/bosh rg/providers/Microsoft.Storage/storageAccounts/bosh",
            "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/bosh-rg/providers/Microsoft.Storage/storageAccounts/Bosh_1",
            "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/bosh-rg/providers/Microsoft.Storage/storageAccounts/bosh/blobServices/default",
        ] {
            let err = StorageAccountId::parse(bad).unwrap_err();
            assert!(err.contains("is not a storage account resource id"), "{bad}: {err}");
        }
    }

    #[test]
    fn blob_urls_must_be_https_blobs() {
        let u = BlobUrl::parse(
            "https://bosh.blob.core.windows.net/stemcell/x.vhd",
            "--blob-uri",
        )
        .unwrap();
        assert_eq!(u.host_account.as_deref(), Some("bosh"));
        let u = BlobUrl::parse(
            "http://127.0.0.1:10000/devstoreaccount1/stemcell/x.vhd",
            "--blob-uri",
        )
        .unwrap();
        assert_eq!(u.host_account, None);
        for bad in [
            "file:///etc/passwd",
            "ftp://bosh.blob.core.windows.net/stemcell/x.vhd",
            "http://bosh.blob.core.windows.net/stemcell/x.vhd",
            "https://bosh.blob.core.windows.net/stemcell",
            "http://127.0.0.1:10000/devstoreaccount1/stemcell",
            "data:text/plain,hello",
        ] {
            assert!(BlobUrl::parse(bad, "--blob-uri").is_err(), "{bad}");
        }
        let err = BlobUrl::parse("ftp://a.blob.core.windows.net/c/b?sig=SECRET", "--blob-uri")
            .unwrap_err();
        assert!(!err.contains("SECRET"), "{err}");
    }
}
