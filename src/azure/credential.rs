//! The credential as the tool's adapters hold it: a 1.x `TokenCredential` that can also be told
//! to forget its cached tokens.
//!
//! azure_core 1.x's `TokenCredential` has no `clear_cache` (0.21's had). The ARM and blob
//! adapters need one: a 401 means the cached token is no good (revoked, or minted before a role
//! assignment), and the one retry after it must present a fresh token. [`Credential::clear_cache`]
//! rebuilds the underlying credential from its recipe, which drops the SDK's cache with it.

use std::fmt;
use std::sync::Arc;

use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use futures::future::BoxFuture;
use tokio::sync::RwLock;

/// How a fresh credential is made (after `clear_cache`).
type Rebuild =
    dyn Fn() -> BoxFuture<'static, azure_core::Result<Arc<dyn TokenCredential>>> + Send + Sync;

/// A 1.x token credential with `clear_cache`. Cheap to clone (clones share one cache).
#[derive(Clone)]
pub struct Credential {
    current: Arc<RwLock<Arc<dyn TokenCredential>>>,
    rebuild: Arc<Rebuild>,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential").finish_non_exhaustive()
    }
}

impl Credential {
    /// A credential built by `make`, rebuilt by it again on `clear_cache`.
    pub fn rebuilt_by<F>(make: F) -> azure_core::Result<Self>
    where
        F: Fn() -> azure_core::Result<Arc<dyn TokenCredential>> + Send + Sync + 'static,
    {
        let first = make()?;
        let make = Arc::new(make);
        Ok(Self {
            current: Arc::new(RwLock::new(first)),
            rebuild: Arc::new(move || {
                let make = make.clone();
                Box::pin(async move { make() })
            }),
        })
    }

    /// A credential that keeps its own cache and is never rebuilt (one with nothing to forget,
    /// such as the emulator's fixed token, or one whose own `get_token` already refreshes).
    pub fn fixed(credential: Arc<dyn TokenCredential>) -> Self {
        let again = credential.clone();
        Self {
            current: Arc::new(RwLock::new(credential)),
            rebuild: Arc::new(move || {
                let again = again.clone();
                Box::pin(async move { Ok(again) })
            }),
        }
    }

    /// Temporary (issue 18): a legacy 0.21 credential; `clear_cache` is its own.
    pub fn from_legacy(legacy: Arc<dyn azure_core_legacy::auth::TokenCredential>) -> Self {
        let bridged = crate::azure::bridge::v1(legacy.clone());
        Self {
            current: Arc::new(RwLock::new(bridged)),
            rebuild: Arc::new(move || {
                let legacy = legacy.clone();
                Box::pin(async move {
                    let _ = legacy.clear_cache().await;
                    Ok(crate::azure::bridge::v1(legacy))
                })
            }),
        }
    }

    /// A token for `scopes`, from the cache while it is fresh.
    pub async fn get_token(&self, scopes: &[&str]) -> azure_core::Result<AccessToken> {
        let current = self.current.read().await.clone();
        current.get_token(scopes, None).await
    }

    /// Forget every cached token: the next `get_token` asks the identity provider.
    pub async fn clear_cache(&self) -> azure_core::Result<()> {
        let fresh = (self.rebuild)().await?;
        *self.current.write().await = fresh;
        Ok(())
    }

    /// The same credential as the SDK's trait object (for 1.x pipeline policies).
    pub fn as_token_credential(&self) -> Arc<dyn TokenCredential> {
        Arc::new(self.clone())
    }
}

#[async_trait::async_trait]
impl TokenCredential for Credential {
    async fn get_token(
        &self,
        scopes: &[&str],
        options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let current = self.current.read().await.clone();
        current.get_token(scopes, options).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// Caches its one token forever, like an SDK credential with a long-lived token.
    #[derive(Debug)]
    struct CachesForever {
        token: String,
    }

    #[async_trait::async_trait]
    impl TokenCredential for CachesForever {
        async fn get_token(
            &self,
            _: &[&str],
            _: Option<TokenRequestOptions<'_>>,
        ) -> azure_core::Result<AccessToken> {
            Ok(AccessToken::new(
                self.token.clone(),
                time::OffsetDateTime::now_utc() + time::Duration::hours(1),
            ))
        }
    }

    #[tokio::test]
    async fn clear_cache_makes_the_next_token_a_fresh_one() {
        let built = Arc::new(AtomicU32::new(0));
        let counter = built.clone();
        let cred = Credential::rebuilt_by(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(Arc::new(CachesForever {
                token: format!("token-{n}"),
            }) as Arc<dyn TokenCredential>)
        })
        .unwrap();
        let clone = cred.clone();
        assert_eq!(
            cred.get_token(&["s"]).await.unwrap().token.secret(),
            "token-1"
        );
        assert_eq!(
            cred.get_token(&["s"]).await.unwrap().token.secret(),
            "token-1"
        );
        clone.clear_cache().await.unwrap();
        // Clones share one cache: the original sees the fresh token too.
        assert_eq!(
            cred.get_token(&["s"]).await.unwrap().token.secret(),
            "token-2"
        );
        let via_trait = cred.as_token_credential();
        assert_eq!(
            via_trait
                .get_token(&["s"], None)
                .await
                .unwrap()
                .token
                .secret(),
            "token-2"
        );
        assert_eq!(built.load(Ordering::SeqCst), 2);
    }
}
