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

    /// A chain: each link is asked in turn until one gives a token; the first that does is
    /// kept for later calls (as azure_identity's chains do). When every link fails, the error
    /// names each link and why it failed. `clear_cache` forgets every link's tokens and the
    /// choice.
    pub fn chain(links: Vec<(&'static str, Credential)>) -> Self {
        let chain = Arc::new(Chain {
            links,
            chosen: std::sync::Mutex::new(None),
        });
        let again = chain.clone();
        Self {
            current: Arc::new(RwLock::new(chain as Arc<dyn TokenCredential>)),
            rebuild: Arc::new(move || {
                let chain = again.clone();
                Box::pin(async move {
                    for (_, link) in &chain.links {
                        link.clear_cache().await?;
                    }
                    *chain.chosen.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    Ok(chain as Arc<dyn TokenCredential>)
                })
            }),
        }
    }

    /// `inner` behind a token cache of ours, refreshed [`REFRESH_BEFORE`] ahead of expiry, for
    /// a credential that has none (azure_identity 1.x's `AzureCliCredential` runs `az` for
    /// every `get_token`, about a second each). Rebuilt by `make` on `clear_cache`.
    pub fn cached<F>(make: F) -> azure_core::Result<Self>
    where
        F: Fn() -> azure_core::Result<Arc<dyn TokenCredential>> + Send + Sync + 'static,
    {
        Self::rebuilt_by(move || {
            Ok(Arc::new(Cached {
                inner: make()?,
                tokens: tokio::sync::Mutex::new(std::collections::HashMap::new()),
            }) as Arc<dyn TokenCredential>)
        })
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

/// A cached token is refreshed this long before it expires (azure_identity 1.x's window too).
pub const REFRESH_BEFORE: time::Duration = time::Duration::minutes(5);

#[derive(Debug)]
struct Cached {
    inner: Arc<dyn TokenCredential>,
    tokens: tokio::sync::Mutex<std::collections::HashMap<Vec<String>, AccessToken>>,
}

#[async_trait::async_trait]
impl TokenCredential for Cached {
    async fn get_token(
        &self,
        scopes: &[&str],
        options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let key: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
        let mut tokens = self.tokens.lock().await;
        if let Some(t) = tokens.get(&key) {
            if t.expires_on > time::OffsetDateTime::now_utc() + REFRESH_BEFORE {
                return Ok(t.clone());
            }
        }
        let token = self.inner.get_token(scopes, options).await?;
        tokens.insert(key, token.clone());
        Ok(token)
    }
}

#[derive(Debug)]
struct Chain {
    links: Vec<(&'static str, Credential)>,
    chosen: std::sync::Mutex<Option<usize>>,
}

#[async_trait::async_trait]
impl TokenCredential for Chain {
    async fn get_token(
        &self,
        scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let chosen = *self.chosen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = chosen {
            return self.links[i].1.get_token(scopes).await;
        }
        let mut failures = Vec::new();
        for (i, (name, link)) in self.links.iter().enumerate() {
            match link.get_token(scopes).await {
                Ok(token) => {
                    tracing::debug!("default credential chain: using {name}");
                    *self.chosen.lock().unwrap_or_else(|e| e.into_inner()) = Some(i);
                    return Ok(token);
                }
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        Err(azure_core::Error::with_message(
            azure_core::error::ErrorKind::Credential,
            format!(
                "no credential of the default chain gave a token ({}); choose one with --auth",
                failures.join("; ")
            ),
        ))
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

    #[derive(Debug)]
    struct Refuses(&'static str);

    #[async_trait::async_trait]
    impl TokenCredential for Refuses {
        async fn get_token(
            &self,
            _: &[&str],
            _: Option<TokenRequestOptions<'_>>,
        ) -> azure_core::Result<AccessToken> {
            Err(azure_core::Error::with_message(
                azure_core::error::ErrorKind::Credential,
                self.0,
            ))
        }
    }

    #[tokio::test]
    async fn a_chain_uses_the_first_link_that_gives_a_token_and_names_every_failure() {
        let ok = Credential::fixed(Arc::new(CachesForever {
            token: "from-cli".into(),
        }));
        let chain = Credential::chain(vec![
            (
                "environment",
                Credential::fixed(Arc::new(Refuses("no env"))),
            ),
            (
                "managed identity",
                Credential::fixed(Arc::new(Refuses("no IMDS"))),
            ),
            ("Azure CLI", ok),
        ]);
        assert_eq!(
            chain.get_token(&["s"]).await.unwrap().token.secret(),
            "from-cli"
        );
        chain.clear_cache().await.unwrap();
        assert_eq!(
            chain.get_token(&["s"]).await.unwrap().token.secret(),
            "from-cli"
        );

        let none = Credential::chain(vec![
            (
                "environment",
                Credential::fixed(Arc::new(Refuses("no env"))),
            ),
            (
                "Azure CLI",
                Credential::fixed(Arc::new(Refuses("az not logged in"))),
            ),
        ]);
        let err = none.get_token(&["s"]).await.unwrap_err().to_string();
        assert!(
            err.contains("environment: no env") && err.contains("Azure CLI: az not logged in"),
            "{err}"
        );
    }
}
