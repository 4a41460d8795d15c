//! Credentials over azure_identity 0.21, plus the emulator's fixed development token.

use std::sync::Arc;

use azure_core::auth::{AccessToken, Secret, TokenCredential};

use crate::config::{AuthKind, Settings, EMULATOR_TOKEN};

/// The emulator's credential: a fixed development token, valid for a day from each request.
#[derive(Debug, Clone, Default)]
pub struct EmulatorCredential;

#[async_trait::async_trait]
impl TokenCredential for EmulatorCredential {
    async fn get_token(&self, _scopes: &[&str]) -> azure_core::Result<AccessToken> {
        Ok(AccessToken::new(
            Secret::new(EMULATOR_TOKEN),
            time::OffsetDateTime::now_utc() + time::Duration::days(1),
        ))
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        Ok(())
    }
}

/// Build the credential the settings ask for.
pub fn credential(settings: &Settings) -> anyhow::Result<Arc<dyn TokenCredential>> {
    match settings.auth {
        AuthKind::Emulator => Ok(Arc::new(EmulatorCredential)),
        AuthKind::Default => Ok(azure_identity::create_credential()?),
    }
}
