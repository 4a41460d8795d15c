//! Temporary (issue 18): the tool's 1.x credential handed to the adapters still on the legacy
//! 0.21 SDK (ARM and blob storage) while they move one at a time. It forwards `get_token` and
//! `clear_cache` and carries the token and its expiry unchanged (the wrapped credential keeps
//! its own cache and refresh). This module leaves the build with the last 0.21 crate.

use std::sync::Arc;

use azure_core_legacy::auth::TokenCredential as LegacyTokenCredential;

/// The tool's (1.x) credential seen as a legacy (0.21) one; `clear_cache` is its own.
pub fn legacy(v1: crate::azure::credential::Credential) -> Arc<dyn LegacyTokenCredential> {
    Arc::new(FromV1(v1))
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
    use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};

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
    async fn a_token_and_its_expiry_cross_unchanged() {
        let bridged = legacy(crate::azure::credential::Credential::fixed(Arc::new(Fixed)));
        let t = bridged.get_token(&["a/.default"]).await.unwrap();
        assert_eq!(t.token.secret(), "token-for-a/.default");
        assert_eq!(t.expires_on, time::OffsetDateTime::UNIX_EPOCH);
    }
}
