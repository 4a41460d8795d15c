//! The bearer-token step of the tool's azure_core 1.x pipelines (ARM and blob storage).
//!
//! azure_core 1.x has `BearerTokenAuthorizationPolicy`, but it refuses every URL that is not
//! https (azure_core-1.1.0 `bearer_token_policy.rs`), and the local emulator listens on plain
//! http. The settings already refuse plain http for any endpoint that is not loopback
//! (`config`: `InsecureUrl`), so this step sends a token over https, or over http to a
//! loopback host only, and refuses anything else with a message naming the URL's host. It keeps
//! no cache of its own: the [`Credential`] does, and the adapters' retry loops call
//! [`Credential::clear_cache`] after a 401 before their one retry with a fresh token.

use std::sync::Arc;

use azure_core::error::ErrorKind;
use azure_core::http::headers::AUTHORIZATION;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{Context, Request};

use crate::azure::credential::Credential;

/// Adds `Authorization: Bearer <token>` for `scope` to every request it sends.
#[derive(Clone)]
pub struct BearerPolicy {
    credential: Credential,
    scope: String,
}

impl std::fmt::Debug for BearerPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BearerPolicy")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl BearerPolicy {
    pub fn new(credential: Credential, scope: impl Into<String>) -> Self {
        Self {
            credential,
            scope: scope.into(),
        }
    }

    /// As a pipeline policy.
    pub fn into_policy(self) -> Arc<dyn Policy> {
        Arc::new(self)
    }
}

/// Whether a token may be sent to `url`: https, or plain http to a loopback host (the emulator).
pub fn may_carry_token(url: &url::Url) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => crate::access::is_loopback(url),
        _ => false,
    }
}

#[async_trait::async_trait]
impl Policy for BearerPolicy {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        if !may_carry_token(request.url()) {
            let host = request.url().host_str().unwrap_or("").to_string();
            return Err(azure_core::Error::with_message(
                ErrorKind::Other,
                format!(
                    "refusing to send a token to {host} over {}: use an https endpoint \
                     (plain http is only for the emulator or Azurite on a loopback address)",
                    request.url().scheme()
                ),
            ));
        }
        // A token endpoint that does not answer (a proxy, a firewall, a slow IMDS) is a wait
        // like any other: it says what it waits for (issue 31: 30 s of silence).
        let token = crate::progress::while_waiting(
            || {
                format!(
                    "a token for {} (the identity provider, IMDS or `az` has not answered)",
                    self.scope
                )
            },
            self.credential.get_token(&[self.scope.as_str()]),
        )
        .await?;
        request.insert_header(AUTHORIZATION, format!("Bearer {}", token.token.secret()));
        next[0].send(ctx, request, &next[1..]).await
    }
}

#[cfg(test)]
mod tests {
    use super::may_carry_token;

    #[test]
    fn a_token_goes_over_https_anywhere_and_over_http_only_to_loopback() {
        for yes in [
            "https://management.azure.com/x",
            "https://acct.blob.core.windows.net/c/b",
            "http://127.0.0.1:10000/devstoreaccount1/c",
            "http://[::1]:8080/subscriptions",
            "http://localhost:8080/subscriptions",
        ] {
            assert!(may_carry_token(&url::Url::parse(yes).unwrap()), "{yes}");
        }
        for no in [
            "http://management.azure.com/x",
            "http://10.0.0.5:8080/subscriptions",
            "http://127.0.0.1.example.com/x",
            "ftp://127.0.0.1/x",
        ] {
            assert!(!may_carry_token(&url::Url::parse(no).unwrap()), "{no}");
        }
    }
}
