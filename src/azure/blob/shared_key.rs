//! Shared Key authorization for the Blob service: a per-try step of the azure_core 1.x pipeline.
//!
//! azure_storage_blob 1.x authorizes with Entra ID tokens only. Shared Key stays for the account
//! key users, the emulator and Azurite (their well-known development key), so this step signs
//! every try itself: it sets `x-ms-date` and `Authorization: SharedKey <account>:<signature>`.
//!
//! The string-to-sign is the Blob service's for version 2009-09-19 and later, as Microsoft's
//! "Authorize with Shared Key" page documents it
//! (<https://learn.microsoft.com/en-us/rest/api/storageservices/authorize-with-shared-key>):
//! the verb, then Content-Encoding, Content-Language, Content-Length (empty when 0, from version
//! 2015-02-21), Content-MD5, Content-Type, Date, If-Modified-Since, If-Match, If-None-Match,
//! If-Unmodified-Since and Range, each on its own line; then the canonicalized `x-ms-` headers
//! (names lower-cased, sorted, values trimmed with inner whitespace runs folded to one space),
//! one `name:value` line each; then the canonicalized resource: `/{account}{encoded URI path}`
//! followed by one `\nname:value` line per query parameter, names lower-cased and sorted, the
//! values of a repeated name sorted and comma-joined. A path-style emulator URL carries the
//! account in its path as well (`/devstoreaccount1/devstoreaccount1/container`). The signature is
//! the base64 HMAC-SHA256 of that string under the base64-decoded account key.
//!
//! The key is a secret: it is decoded once into [`SharedKey`], whose `Debug` shows the account
//! only, and it never appears in an error (a key that is not base64 is reported as such).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use azure_core::http::headers::AUTHORIZATION;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{Context, Request};
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};

/// An account name and its decoded key.
#[derive(Clone)]
pub struct SharedKey {
    account: String,
    key: Arc<[u8]>,
}

impl fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedKey")
            .field("account", &self.account)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// Why an account key cannot be used (the key itself is never part of it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the account key for storage account `{account}` is not valid base64; copy it again from the portal (Access keys) or `az storage account keys list`")]
pub struct InvalidKey {
    pub account: String,
}

/// The key is the same on every retry.
impl crate::error::Classified for InvalidKey {
    fn class(&self) -> crate::error::Class {
        crate::error::Class::Permanent
    }
}

impl SharedKey {
    /// `key` is the base64 account key as the portal shows it.
    pub fn new(account: impl Into<String>, key: &str) -> Result<Self, InvalidKey> {
        let account = account.into();
        match base64::engine::general_purpose::STANDARD.decode(key.trim()) {
            Ok(bytes) if !bytes.is_empty() => Ok(Self {
                account,
                key: bytes.into(),
            }),
            _ => Err(InvalidKey { account }),
        }
    }

    pub fn account(&self) -> &str {
        &self.account
    }

    /// The base64 HMAC-SHA256 of `string_to_sign` under the key.
    pub fn sign(&self, string_to_sign: &str) -> String {
        // HMAC takes a key of any length (`new_from_slice` fails only for fixed-size keys); an
        // empty signature would only be refused by the service.
        let Ok(mut mac) = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&self.key) else {
            return String::new();
        };
        mac.update(string_to_sign.as_bytes());
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    }
}

/// The parts of a request the signature covers, independent of the HTTP types.
#[derive(Debug, Clone, Default)]
pub struct Signable<'a> {
    pub method: &'a str,
    pub url: Option<&'a url::Url>,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> &'h str {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

/// The canonicalized `x-ms-` headers: lower-cased names, sorted, values trimmed and inner runs of
/// whitespace folded to one space, each line ending in `\n`.
pub fn canonicalized_headers(headers: &[(String, String)]) -> String {
    let mut ms: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .filter(|(k, _)| k.starts_with("x-ms-"))
        .map(|(k, v)| (k, v.split_whitespace().collect::<Vec<_>>().join(" ")))
        .collect();
    ms.sort();
    ms.iter().map(|(k, v)| format!("{k}:{v}\n")).collect()
}

/// The canonicalized resource: `/{account}{path}` and the sorted query parameters.
pub fn canonicalized_resource(account: &str, url: &url::Url) -> String {
    let mut resource = format!("/{account}{}", url.path());
    let mut params: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in url.query_pairs() {
        params
            .entry(k.to_lowercase())
            .or_default()
            .push(v.into_owned());
    }
    for (k, mut values) in params {
        values.sort();
        resource.push('\n');
        resource.push_str(&k);
        resource.push(':');
        resource.push_str(&values.join(","));
    }
    resource
}

/// The Blob service string-to-sign (version 2009-09-19 and later; see the module comment).
pub fn string_to_sign(account: &str, req: &Signable<'_>) -> String {
    let h = |name| header(&req.headers, name);
    let length = match h("content-length") {
        "0" => "",
        other => other,
    };
    let resource = req
        .url
        .map(|u| canonicalized_resource(account, u))
        .unwrap_or_default();
    format!(
        "{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}{}",
        req.method.to_ascii_uppercase(),
        h("content-encoding"),
        h("content-language"),
        length,
        h("content-md5"),
        h("content-type"),
        h("date"),
        h("if-modified-since"),
        h("if-match"),
        h("if-none-match"),
        h("if-unmodified-since"),
        h("range"),
        canonicalized_headers(&req.headers),
        resource
    )
}

/// The pipeline step: dates and signs each try.
#[derive(Clone, Debug)]
pub struct SharedKeyPolicy {
    key: SharedKey,
}

impl SharedKeyPolicy {
    pub fn new(key: SharedKey) -> Self {
        Self { key }
    }
}

#[async_trait::async_trait]
impl Policy for SharedKeyPolicy {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        let now = time::OffsetDateTime::now_utc();
        request.insert_header("x-ms-date", azure_core::time::to_rfc7231(&now));
        // The transport sends Content-Length from the body when no header says it; sign the
        // same number.
        if request
            .headers()
            .get_optional_str(&azure_core::http::headers::CONTENT_LENGTH)
            .is_none()
        {
            if let Some(len) = request.body().len().filter(|&n| n > 0) {
                request.insert_header("content-length", len.to_string());
            }
        }
        let method = request.method().to_string();
        let headers: Vec<(String, String)> = request
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_ascii_lowercase(), v.as_str().to_string()))
            .collect();
        let url = request.url().clone();
        let signable = Signable {
            method: &method,
            url: Some(&url),
            headers,
        };
        let signature = self.key.sign(&string_to_sign(&self.key.account, &signable));
        request.insert_header(
            AUTHORIZATION,
            format!("SharedKey {}:{signature}", self.key.account),
        );
        next[0].send(ctx, request, &next[1..]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> url::Url {
        url::Url::parse(s).expect("url")
    }

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    // The canonicalized-resource examples of "Authorize with Shared Key" (2009-09-19 and later
    // format), with test data written here.

    #[test]
    fn resource_of_a_container_metadata_request() {
        // GET .../mycontainer?restype=container&comp=metadata
        assert_eq!(
            canonicalized_resource(
                "myaccount",
                &url("https://myaccount.blob.core.windows.net/mycontainer?restype=container&comp=metadata")
            ),
            "/myaccount/mycontainer\ncomp:metadata\nrestype:container"
        );
    }

    #[test]
    fn repeated_parameters_are_sorted_and_comma_joined() {
        // The documented listing example: `include` given three times.
        assert_eq!(
            canonicalized_resource(
                "myaccount",
                &url("https://myaccount.blob.core.windows.net/mycontainer?restype=container&comp=list&include=snapshots&include=metadata&include=uncommittedblobs")
            ),
            "/myaccount/mycontainer\ncomp:list\ninclude:metadata,snapshots,uncommittedblobs\nrestype:container"
        );
    }

    #[test]
    fn a_secondary_endpoint_signs_the_primary_account() {
        // The documented secondary-location example: the account name, not the host's label.
        assert_eq!(
            canonicalized_resource(
                "myaccount",
                &url("https://myaccount-secondary.blob.core.windows.net/mycontainer/myblob")
            ),
            "/myaccount/mycontainer/myblob"
        );
    }

    #[test]
    fn parameter_names_are_lower_cased_and_values_decoded() {
        assert_eq!(
            canonicalized_resource(
                "acct",
                &url("https://acct.blob.core.windows.net/c?Restype=container&COMP=list&prefix=locks%2Fg%2F")
            ),
            "/acct/c\ncomp:list\nprefix:locks/g/\nrestype:container"
        );
    }

    #[test]
    fn path_style_emulator_urls_carry_the_account_twice() {
        assert_eq!(
            canonicalized_resource(
                "devstoreaccount1",
                &url("http://127.0.0.1:10000/devstoreaccount1/stemcell/locks/g/d/1.0.0.lock?comp=lease")
            ),
            "/devstoreaccount1/devstoreaccount1/stemcell/locks/g/d/1.0.0.lock\ncomp:lease"
        );
    }

    #[test]
    fn x_ms_headers_are_lower_cased_sorted_and_trimmed() {
        let h = headers(&[
            ("x-ms-version", "2009-09-19"),
            ("X-MS-Meta-Name", "  a   b  "),
            ("x-ms-date", "Fri, 26 Jun 2015 23:39:12 GMT"),
            ("content-type", "text/plain"),
        ]);
        assert_eq!(
            canonicalized_headers(&h),
            "x-ms-date:Fri, 26 Jun 2015 23:39:12 GMT\nx-ms-meta-name:a b\nx-ms-version:2009-09-19\n"
        );
    }

    #[test]
    fn string_to_sign_has_every_standard_header_in_order() {
        // The documented shape: twelve lines of standard headers (empty when absent; Date empty
        // because x-ms-date is set), the x-ms- headers, then the resource.
        let u = url("https://myaccount.blob.core.windows.net/mycontainer?restype=container&comp=metadata&timeout=20");
        let req = Signable {
            method: "GET",
            url: Some(&u),
            headers: headers(&[
                ("x-ms-date", "Sun, 11 Oct 2009 21:49:13 GMT"),
                ("x-ms-version", "2009-09-19"),
            ]),
        };
        assert_eq!(
            string_to_sign("myaccount", &req),
            "GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:Sun, 11 Oct 2009 21:49:13 GMT\nx-ms-version:2009-09-19\n/myaccount/mycontainer\ncomp:metadata\nrestype:container\ntimeout:20"
        );
    }

    #[test]
    fn content_length_zero_is_signed_empty_and_others_as_given() {
        let u = url("http://127.0.0.1:10000/devstoreaccount1/c/b");
        let mut req = Signable {
            method: "put",
            url: Some(&u),
            headers: headers(&[
                ("content-length", "0"),
                ("if-none-match", "*"),
                ("x-ms-blob-type", "BlockBlob"),
            ]),
        };
        assert_eq!(
            string_to_sign("devstoreaccount1", &req),
            "PUT\n\n\n\n\n\n\n\n\n*\n\n\nx-ms-blob-type:BlockBlob\n/devstoreaccount1/devstoreaccount1/c/b"
        );
        req.headers = headers(&[
            ("content-length", "512"),
            ("content-type", "application/octet-stream"),
            ("range", "bytes=0-511"),
        ]);
        assert_eq!(
            string_to_sign("devstoreaccount1", &req),
            "PUT\n\n\n512\n\napplication/octet-stream\n\n\n\n\n\nbytes=0-511\n/devstoreaccount1/devstoreaccount1/c/b"
        );
    }

    #[test]
    fn signature_is_hmac_sha256_of_the_string_under_the_decoded_key() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let key = SharedKey::new(
            "a",
            &base64::engine::general_purpose::STANDARD.encode("Jefe"),
        )
        .expect("key");
        let expected = base64::engine::general_purpose::STANDARD.encode(
            hex::decode("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
                .expect("hex"),
        );
        assert_eq!(key.sign("what do ya want for nothing?"), expected);
    }

    /// Stands in for the transport: keeps the request as the policy left it.
    #[derive(Debug, Default)]
    struct Capture(std::sync::Mutex<Option<Request>>);

    #[async_trait::async_trait]
    impl Policy for Capture {
        async fn send(
            &self,
            _: &Context,
            req: &mut Request,
            _: &[Arc<dyn Policy>],
        ) -> PolicyResult {
            *self.0.lock().unwrap() = Some(req.clone());
            Ok(azure_core::http::AsyncRawResponse::from_bytes(
                azure_core::http::StatusCode::Created,
                azure_core::http::headers::Headers::new(),
                bytes::Bytes::new(),
            ))
        }
    }

    #[tokio::test]
    async fn the_policy_dates_signs_and_counts_the_body_it_sends() {
        let key = SharedKey::new("devstoreaccount1", crate::devstore::DEV_ACCOUNT_KEY).unwrap();
        let mut req = Request::new(
            url("http://127.0.0.1:10000/devstoreaccount1/stemcell/b.vhd?comp=page"),
            azure_core::http::Method::Put,
        );
        req.insert_header("x-ms-page-write", "update");
        req.insert_header("range", "bytes=0-511");
        req.set_body(bytes::Bytes::from(vec![7u8; 512]));
        let capture = Arc::new(Capture::default());
        let next: Vec<Arc<dyn Policy>> = vec![capture.clone()];
        SharedKeyPolicy::new(key.clone())
            .send(&Context::new(), &mut req, &next)
            .await
            .unwrap();
        let sent = capture.0.lock().unwrap().take().unwrap();
        let h = |n: &'static str| {
            sent.headers()
                .get_optional_str(&azure_core::http::headers::HeaderName::from_static(n))
                .map(str::to_string)
        };
        let date = h("x-ms-date").expect("dated");
        assert!(azure_core::time::parse_rfc7231(&date).is_ok(), "{date}");
        assert_eq!(h("content-length").as_deref(), Some("512"));
        let expected = format!(
            "PUT\n\n\n512\n\n\n\n\n\n\n\nbytes=0-511\nx-ms-date:{date}\nx-ms-page-write:update\n/devstoreaccount1/devstoreaccount1/stemcell/b.vhd\ncomp:page"
        );
        assert_eq!(
            h("authorization").as_deref(),
            Some(format!("SharedKey devstoreaccount1:{}", key.sign(&expected)).as_str())
        );
    }

    #[test]
    fn the_key_is_never_shown() {
        let key = SharedKey::new("acct", "VkVSWVNFQ1JFVEtFWQ==").expect("key");
        let dbg = format!("{key:?} {:?}", SharedKeyPolicy::new(key.clone()));
        assert!(!dbg.contains("VkVSWVNFQ1JFVEtFWQ"), "{dbg}");
        assert!(!dbg.contains("VERYSECRETKEY"), "{dbg}");
        let err = SharedKey::new("acct", "not base64 VERYSECRET!").expect_err("refused");
        assert!(!err.to_string().contains("VERYSECRET"), "{err}");
    }
}
