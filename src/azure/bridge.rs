//! Temporary (issue 18): credentials across the legacy 0.21 SDK and the supported 1.x line
//! while the adapters move one at a time. Each direction forwards `get_token` and carries the
//! token and its expiry unchanged (the wrapped credential keeps its own cache and refresh).
//! This module leaves the build with the last 0.21 crate.

use std::sync::Arc;

use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use azure_core_legacy::auth::TokenCredential as LegacyTokenCredential;

/// A legacy (0.21) credential seen as a 1.x one.
pub fn v1(legacy: Arc<dyn LegacyTokenCredential>) -> Arc<dyn TokenCredential> {
    Arc::new(FromLegacy(legacy))
}

/// The tool's (1.x) credential seen as a legacy (0.21) one; `clear_cache` is its own.
pub fn legacy(v1: crate::azure::credential::Credential) -> Arc<dyn LegacyTokenCredential> {
    Arc::new(FromV1(v1))
}

#[derive(Debug)]
struct FromLegacy(Arc<dyn LegacyTokenCredential>);

#[async_trait::async_trait]
impl TokenCredential for FromLegacy {
    async fn get_token(
        &self,
        scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let token = self.0.get_token(scopes).await.map_err(|e| {
            azure_core::Error::with_message(azure_core::error::ErrorKind::Credential, e.to_string())
        })?;
        Ok(AccessToken::new(
            token.token.secret().to_string(),
            token.expires_on,
        ))
    }
}

#[derive(Debug)]
struct FromV1(crate::azure::credential::Credential);

#[async_trait::async_trait]
impl LegacyTokenCredential for FromV1 {
    async fn get_token(
        &self,
        scopes: &[&str],
    ) -> azure_core_legacy::Result<azure_core_legacy::auth::AccessToken> {
        let token = self.0.get_token(scopes).await.map_err(|e| {
            azure_core_legacy::Error::message(
                azure_core_legacy::error::ErrorKind::Credential,
                e.to_string(),
            )
        })?;
        Ok(azure_core_legacy::auth::AccessToken::new(
            azure_core_legacy::auth::Secret::new(token.token.secret().to_string()),
            token.expires_on,
        ))
    }

    async fn clear_cache(&self) -> azure_core_legacy::Result<()> {
        self.0.clear_cache().await.map_err(|e| {
            azure_core_legacy::Error::message(
                azure_core_legacy::error::ErrorKind::Credential,
                e.to_string(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fixed;

    #[async_trait::async_trait]
    impl TokenCredential for Fixed {
        async fn get_token(
            &self,
            scopes: &[&str],
            _: Option<TokenRequestOptions<'_>>,
        ) -> azure_core::Result<AccessToken> {
            Ok(AccessToken::new(
                format!("token-for-{}", scopes.join(",")),
                time::OffsetDateTime::UNIX_EPOCH,
            ))
        }
    }

    #[tokio::test]
    async fn a_token_and_its_expiry_cross_both_ways_unchanged() {
        let round = v1(legacy(crate::azure::credential::Credential::fixed(
            Arc::new(Fixed),
        )));
        let t = round.get_token(&["a/.default"], None).await.unwrap();
        assert_eq!(t.token.secret(), "token-for-a/.default");
        assert_eq!(t.expires_on, time::OffsetDateTime::UNIX_EPOCH);
    }
}
