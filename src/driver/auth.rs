//! SASL for broker connections: a fresh [`SaslClient`] per (re-)authentication, with
//! its nonce drawn here (the sans-IO mechanisms take it as an argument), and the
//! OAUTHBEARER token cache that refreshes before expiry.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tracing::{debug, warn};

use crate::error::AuthError;
use crate::proto::sasl::{Mechanism, SaslClient, ScramHash, refresh_point};
use crate::security::{OAuthToken, SaslConfig, TokenProvider};

/// Makes the SASL client of each exchange for one cluster's connections.
pub(crate) struct Authenticator {
    sasl: SaslConfig,
    tokens: Option<TokenCache>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("sasl", &self.sasl)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// `sasl` must be resolved ([`SaslConfig::resolve`]): a mechanism with what it needs.
    pub(crate) fn new(sasl: SaslConfig) -> Self {
        let tokens = sasl.token_provider.clone().map(TokenCache::new);
        Self { sasl, tokens }
    }

    /// The mechanism.
    pub(crate) fn mechanism(&self) -> Mechanism {
        self.sasl.mechanism.unwrap_or(Mechanism::Plain)
    }

    /// A client for one exchange.
    pub(crate) async fn client(&self) -> Result<SaslClient, AuthError> {
        let (user, password) = (&self.sasl.username, self.sasl.password.expose());
        match self.mechanism() {
            Mechanism::Plain => Ok(SaslClient::plain(user, password)),
            Mechanism::ScramSha256 => Ok(SaslClient::scram(
                ScramHash::Sha256,
                user,
                password,
                &nonce()?,
            )),
            Mechanism::ScramSha512 => Ok(SaslClient::scram(
                ScramHash::Sha512,
                user,
                password,
                &nonce()?,
            )),
            Mechanism::OAuthBearer => {
                let Some(tokens) = &self.tokens else {
                    return Err(AuthError::Token("no token provider".into()));
                };
                let token = tokens.get().await?;
                Ok(SaslClient::oauth_bearer(
                    token.value.expose(),
                    &token.extensions,
                )?)
            }
            // `SaslConfig::validate` refuses a mechanism this client cannot run.
            other => Err(AuthError::Token(format!(
                "{other:?} is not supported by this client"
            ))),
        }
    }
}

/// 24 random bytes, base64: a SCRAM client nonce (printable, no commas).
fn nonce() -> Result<String, AuthError> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes)
        .map_err(|e| AuthError::Protocol(format!("no randomness for the SCRAM nonce: {e}")))?;
    use base64::Engine;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The current OAUTHBEARER token, fetched again once 80% of its lifetime has passed.
/// Calls to the provider never overlap: connections that need a token while one is
/// being fetched wait for it.
struct TokenCache {
    provider: Arc<dyn TokenProvider>,
    current: tokio::sync::Mutex<Option<Cached>>,
}

struct Cached {
    token: OAuthToken,
    refresh_at: SystemTime,
}

impl TokenCache {
    fn new(provider: Arc<dyn TokenProvider>) -> Self {
        Self {
            provider,
            current: tokio::sync::Mutex::new(None),
        }
    }

    async fn get(&self) -> Result<OAuthToken, AuthError> {
        let mut current = self.current.lock().await;
        let now = SystemTime::now();
        if let Some(c) = current.as_ref().filter(|c| now < c.refresh_at) {
            return Ok(c.token.clone());
        }
        match self.provider.token().await {
            Ok(token) => {
                let lifetime = token
                    .expires_at
                    .duration_since(now)
                    .unwrap_or(Duration::ZERO);
                debug!(lifetime = ?lifetime, "OAUTHBEARER token refreshed");
                let refresh_at = refresh_point(now, token.expires_at);
                *current = Some(Cached {
                    token: token.clone(),
                    refresh_at,
                });
                Ok(token)
            }
            // The old token still works: use it, and try again next time.
            Err(e) => match current.as_ref().filter(|c| now < c.token.expires_at) {
                Some(c) => {
                    warn!(error = %e, "OAUTHBEARER token refresh failed; using the current token until it expires");
                    Ok(c.token.clone())
                }
                None => Err(AuthError::Token(e.0)),
            },
        }
    }
}
