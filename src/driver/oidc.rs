//! The OIDC client-credentials token provider (KIP-768, librdkafka's
//! `sasl.oauthbearer.method=oidc`): one HTTP/1.1 POST per token, over plain TCP or
//! rustls, read until the server closes. What is sent and how the answer is read are
//! the core's (`proto::sasl::oidc`); this file only carries the bytes. The token is
//! cached and refreshed at 80% of its lifetime by the connections' token cache
//! (`driver::auth`), which calls a provider once at a time.

use std::time::{Duration, SystemTime};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::debug;

use crate::proto::sasl::oidc::{self, MAX_RESPONSE_BYTES, TokenEndpoint};
use crate::security::{OAuthToken, OidcConfig, Secret, TokenError, TokenFuture, TokenProvider};

/// How long one token request may take, connection included (the Java client's
/// `sasl.login.connect.timeout.ms` and `sasl.login.read.timeout.ms` together; it has no
/// default for them, librdkafka waits 20 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Fetches tokens from the endpoint of an [`OidcConfig`].
pub(crate) struct OidcProvider {
    config: OidcConfig,
    endpoint: TokenEndpoint,
    #[cfg(feature = "tls-core")]
    tls: Option<super::tls::TlsConnector>,
}

impl OidcProvider {
    /// Checks the settings (each error names its setting) and, for `https`, builds the
    /// TLS client.
    pub(crate) fn new(config: OidcConfig) -> crate::Result<Self> {
        let bad = |setting, message: &str| crate::Error::Config {
            setting,
            message: message.to_string(),
        };
        if config.token_endpoint_url.trim().is_empty() {
            return Err(bad(
                "sasl.oauthbearer.token.endpoint.url",
                "required by sasl.oauthbearer.method=oidc",
            ));
        }
        let endpoint = TokenEndpoint::parse(&config.token_endpoint_url).map_err(|e| {
            bad(
                "sasl.oauthbearer.token.endpoint.url",
                e.to_string()
                    .trim_start_matches("sasl.oauthbearer.token.endpoint.url: "),
            )
        })?;
        if config.client_id.is_empty() {
            return Err(bad(
                "sasl.oauthbearer.client.id",
                "required by sasl.oauthbearer.method=oidc",
            ));
        }
        if config.client_secret.expose().is_empty() {
            return Err(bad(
                "sasl.oauthbearer.client.secret",
                "required by sasl.oauthbearer.method=oidc",
            ));
        }
        // The extensions are checked now, not at the first connection.
        crate::proto::sasl::SaslClient::oauth_bearer("t", &config.extensions).map_err(|e| {
            crate::Error::Config {
                setting: "sasl.oauthbearer.extensions",
                message: e.to_string(),
            }
        })?;
        #[cfg(feature = "tls-core")]
        let tls = match endpoint.tls {
            true => Some(super::tls::TlsConnector::new(&config.tls)?),
            false => None,
        };
        #[cfg(not(feature = "tls-core"))]
        if endpoint.tls {
            return Err(bad(
                "sasl.oauthbearer.token.endpoint.url",
                "https needs TLS, and ottla was built without it: enable the `tls` cargo feature",
            ));
        }
        Ok(Self {
            config,
            endpoint,
            #[cfg(feature = "tls-core")]
            tls,
        })
    }

    async fn fetch(&self) -> Result<OAuthToken, TokenError> {
        let e = &self.endpoint;
        let request = oidc::token_request(
            e,
            &self.config.client_id,
            self.config.client_secret.expose(),
            self.config.scope.as_deref(),
        );
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(&request))
            .await
            .map_err(|_| {
                TokenError(format!(
                    "sasl.oauthbearer.token.endpoint.url: no answer from {}:{} within {REQUEST_TIMEOUT:?}",
                    e.host, e.port
                ))
            })??;
        let token = oidc::read_token_response(&answer, SystemTime::now(), self.config.sub_claim())
            .map_err(|e| TokenError(e.to_string()))?;
        debug!(
            principal = token.principal.as_deref().unwrap_or("(opaque token)"),
            lifetime = ?token.expires_at.duration_since(SystemTime::now()).unwrap_or_default(),
            "OIDC token fetched"
        );
        Ok(OAuthToken {
            value: Secret::new(token.access_token),
            expires_at: token.expires_at,
            extensions: self.config.extensions.clone(),
        })
    }

    /// Sends the request and reads the answer to its end.
    async fn exchange(&self, request: &[u8]) -> Result<Vec<u8>, TokenError> {
        let e = &self.endpoint;
        let io = |what: &str, err: std::io::Error| {
            TokenError(format!(
                "sasl.oauthbearer.token.endpoint.url: {what} {}:{}: {err}",
                e.host, e.port
            ))
        };
        let tcp = TcpStream::connect((e.host.as_str(), e.port))
            .await
            .map_err(|err| io("cannot connect to", err))?;
        #[cfg(feature = "tls-core")]
        if let Some(tls) = &self.tls {
            let stream = tls.connect(&e.host, tcp).await.map_err(|f| {
                // TlsFailure speaks of the broker; here it is the token endpoint, whose
                // CA is https.ca.location.
                let hint = match f {
                    crate::error::TlsFailure::UnknownIssuer => {
                        "; check https.ca.location (the CA that signed the endpoint's certificate)"
                    }
                    _ => "",
                };
                let failure = f.to_string().replace("the broker", "the endpoint") + hint;
                TokenError(format!(
                    "sasl.oauthbearer.token.endpoint.url: TLS with {}:{} failed: {failure}",
                    e.host, e.port
                ))
            })?;
            return round_trip(stream, request)
                .await
                .map_err(|err| io("talking to", err));
        }
        round_trip(tcp, request)
            .await
            .map_err(|err| io("talking to", err))
    }
}

impl TokenProvider for OidcProvider {
    fn token(&self) -> TokenFuture<'_> {
        Box::pin(self.fetch())
    }
}

/// Writes `request`, then reads until the server closes (`Connection: close`), at most
/// [`MAX_RESPONSE_BYTES`].
async fn round_trip<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &[u8],
) -> std::io::Result<Vec<u8>> {
    stream.write_all(request).await?;
    stream.flush().await?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) => return Ok(answer),
            Ok(n) => {
                answer.extend_from_slice(chunk.get(..n).unwrap_or_default());
                if answer.len() > MAX_RESPONSE_BYTES {
                    return Err(std::io::Error::other(format!(
                        "the answer is larger than {MAX_RESPONSE_BYTES} bytes"
                    )));
                }
            }
            // A TLS server that closes without close_notify: what came is the answer
            // (it is checked against its Content-Length).
            Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {
                return Ok(answer);
            }
            Err(err) => return Err(err),
        }
    }
}
