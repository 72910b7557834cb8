//! Secure connections: `security.protocol`, TLS and SASL.
//!
//! Every connection a client opens (bootstrap, brokers learnt from metadata, the group
//! coordinator's own connection, the producer's, the Processor's dead-letter producer)
//! takes these settings from its [`ClientConfig`](crate::ClientConfig):
//!
//! ```no_run
//! # async fn demo() -> ottla::Result<()> {
//! use ottla::ClientConfig;
//! use ottla::security::{SaslConfig, SecurityProtocol, TlsConfig};
//!
//! let config = ClientConfig::new("broker-1.example.com:9093")
//!     .with_security_protocol(SecurityProtocol::SaslSsl)
//!     .with_tls(TlsConfig::new()) // the platform's trusted roots
//!     .with_sasl(SaslConfig::scram_sha512("svc-billing", std::env::var("KAFKA_PASSWORD").unwrap_or_default()));
//! let consumer = ottla::Consumer::builder("unused")
//!     .client_config(config)
//!     .group_id("billing")
//!     .topics(["orders"])
//!     .build()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! TLS needs the `tls` cargo feature (rustls with its `ring` provider), or
//! `tls-core` with a `CryptoProvider` of your own (`TlsConfig::crypto_provider`).
//! SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER) is always built in; the
//! built-in OIDC client-credentials token provider ([`SaslConfig::oauth_bearer_oidc`],
//! `sasl.oauthbearer.method=oidc`) needs the `oauthbearer-oidc` feature (and `tls` for
//! an `https` token endpoint).
//!
//! Secrets (passwords, tokens, private keys given inline) are held in [`Secret`], whose
//! `Debug` and `Display` print `[redacted]`; no log line or error carries them.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

pub use crate::proto::sasl::Mechanism;
use crate::proto::sasl::UnsecuredJwtConfig;

/// A password, token or private key. `Debug` and `Display` print `[redacted]`; the value
/// is reachable only through [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(Arc::from(value.into()))
    }

    /// The secret itself. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret::new(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret::new(s)
    }
}

/// `security.protocol`: what every connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SecurityProtocol {
    /// Plain TCP (the default).
    #[default]
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL authentication over plain TCP.
    SaslPlaintext,
    /// SASL authentication over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Parses the Java/librdkafka names (`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`,
    /// `SASL_SSL`), in any case.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Some(Self::Plaintext),
            "SSL" => Some(Self::Ssl),
            "SASL_PLAINTEXT" => Some(Self::SaslPlaintext),
            "SASL_SSL" => Some(Self::SaslSsl),
            _ => None,
        }
    }

    /// The Java name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }

    /// Whether connections are wrapped in TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    /// Whether connections authenticate with SASL.
    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// PEM data, from a file or in memory (for secrets kept out of files).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pem {
    /// A file holding PEM blocks.
    File(PathBuf),
    /// PEM text. Held as a [`Secret`], since a private key may be given this way.
    Inline(Secret),
}

impl Pem {
    /// PEM text given in memory.
    pub fn inline(pem: impl Into<String>) -> Self {
        Pem::Inline(Secret::new(pem))
    }

    /// A PEM file.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Pem::File(path.into())
    }
}

/// Which certificate authorities a client trusts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TrustRoots {
    /// The platform's trusted roots (on Linux the system bundle, as OpenSSL finds it).
    /// The default.
    #[default]
    Platform,
    /// The CA certificates in this PEM bundle (`ssl.ca.location`), and only those.
    Pem(Pem),
    /// Mozilla's roots compiled into the binary (the `tls-webpki-roots` feature), for
    /// images without a system bundle.
    WebpkiRoots,
}

/// TLS settings (used when `security.protocol` is `SSL` or `SASL_SSL`).
///
/// | setting | Java / librdkafka name | default |
/// |---|---|---|
/// | [`TlsConfig::ca`] | `ssl.ca.location`, `ssl.ca.pem`, `ssl.truststore.certificates` | the platform's roots |
/// | [`TlsConfig::client_certificate`] | `ssl.certificate.location` + `ssl.key.location` (or `.pem`) | none |
/// | [`TlsConfig::danger_disable_hostname_verification`] | `ssl.endpoint.identification.algorithm` = `none` | `https` (verified) |
#[derive(Clone, Default)]
pub struct TlsConfig {
    pub(crate) roots: TrustRoots,
    pub(crate) certificate: Option<Pem>,
    pub(crate) key: Option<Pem>,
    pub(crate) skip_hostname_verification: bool,
    #[cfg(feature = "tls-core")]
    pub(crate) provider: Option<Arc<rustls::crypto::CryptoProvider>>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("roots", &self.roots)
            .field("certificate", &self.certificate)
            .field("key", &self.key.as_ref().map(|_| "[redacted]"))
            .field("hostname_verification", &!self.skip_hostname_verification)
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Trust the platform's roots, verify host names, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust only the CA certificates of this PEM bundle (`ssl.ca.location`).
    pub fn ca(mut self, pem: Pem) -> Self {
        self.roots = TrustRoots::Pem(pem);
        self
    }

    /// Which roots to trust.
    pub fn trust_roots(mut self, roots: TrustRoots) -> Self {
        self.roots = roots;
        self
    }

    /// A client certificate (chain) and its private key, for mutual TLS
    /// (`ssl.certificate.location` and `ssl.key.location`). The key may be PKCS#8,
    /// PKCS#1 (RSA) or SEC1 (EC), unencrypted, in PEM.
    pub fn client_certificate(mut self, certificate: Pem, key: Pem) -> Self {
        self.certificate = Some(certificate);
        self.key = Some(key);
        self
    }

    /// Accepts a broker certificate whose names do not match the broker's host
    /// (`ssl.endpoint.identification.algorithm=none`). The chain is still verified
    /// against the trusted roots. Anyone holding any certificate from those roots can
    /// then impersonate any broker; ottla logs a warning when a client starts with it.
    pub fn danger_disable_hostname_verification(mut self) -> Self {
        self.skip_hostname_verification = true;
        self
    }

    /// Whether host names are verified (the default).
    pub fn verifies_hostname(&self) -> bool {
        !self.skip_hostname_verification
    }

    /// The rustls [`CryptoProvider`](rustls::crypto::CryptoProvider) to use. Without
    /// one, ottla uses the process default if one is installed
    /// (`CryptoProvider::install_default`), else `ring` (the `tls` feature).
    #[cfg(feature = "tls-core")]
    pub fn crypto_provider(mut self, provider: Arc<rustls::crypto::CryptoProvider>) -> Self {
        self.provider = Some(provider);
        self
    }
}

/// SASL settings (used when `security.protocol` is `SASL_PLAINTEXT` or `SASL_SSL`).
///
/// | constructor | `sasl.mechanism` | credentials |
/// |---|---|---|
/// | [`SaslConfig::plain`] | `PLAIN` | `sasl.username`, `sasl.password` |
/// | [`SaslConfig::scram_sha256`] / [`SaslConfig::scram_sha512`] | `SCRAM-SHA-256` / `SCRAM-SHA-512` | `sasl.username`, `sasl.password` |
/// | [`SaslConfig::oauth_bearer`] | `OAUTHBEARER` | a [`TokenProvider`] |
/// | [`SaslConfig::oauth_bearer_oidc`] | `OAUTHBEARER` | `sasl.oauthbearer.method=oidc` and an [`OidcConfig`] (feature `oauthbearer-oidc`) |
/// | [`SaslConfig::aws_msk_iam`] | `OAUTHBEARER` | Amazon MSK IAM: [`AwsCredentials`] and a region (feature `aws-msk-iam`) |
/// | [`SaslConfig::oauth_bearer_unsecured_jwt`] | `OAUTHBEARER` | `sasl.oauthbearer.config` (tests only) |
#[derive(Clone)]
pub struct SaslConfig {
    /// `None` only while being built from properties ([`crate::ClientConfig::set`]).
    pub(crate) mechanism: Option<Mechanism>,
    pub(crate) username: String,
    pub(crate) password: Secret,
    pub(crate) token_provider: Option<Arc<dyn TokenProvider>>,
    /// `sasl.oauthbearer.config`, used with `enable.sasl.oauthbearer.unsecure.jwt`.
    pub(crate) oauth_config: Option<String>,
    pub(crate) unsecure_jwt: bool,
    /// `sasl.oauthbearer.method`: `Some(true)` for `oidc`, `Some(false)` for `default`.
    pub(crate) oidc_method: Option<bool>,
    /// The OIDC settings read from properties (`sasl.oauthbearer.*`).
    pub(crate) oidc: OidcConfig,
}

impl fmt::Debug for SaslConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SaslConfig")
            .field("mechanism", &self.mechanism.map(Mechanism::name))
            .field("username", &self.username)
            .field("password", &self.password)
            .field(
                "token_provider",
                &self.token_provider.as_ref().map(|_| "[provider]"),
            )
            .field("oidc", &self.oidc)
            .finish()
    }
}

impl SaslConfig {
    /// No mechanism yet: the start of a configuration read from properties.
    pub(crate) fn unset() -> Self {
        SaslConfig {
            mechanism: None,
            username: String::new(),
            password: Secret::new(""),
            token_provider: None,
            oauth_config: None,
            unsecure_jwt: false,
            oidc_method: None,
            oidc: OidcConfig::default(),
        }
    }

    fn with_password(mechanism: Mechanism, username: &str, password: Secret) -> Self {
        SaslConfig {
            mechanism: Some(mechanism),
            username: username.to_string(),
            password,
            ..Self::unset()
        }
    }

    /// `PLAIN` (RFC 4616): the password travels as is, so use it over `SASL_SSL` only.
    pub fn plain(username: &str, password: impl Into<Secret>) -> Self {
        Self::with_password(Mechanism::Plain, username, password.into())
    }

    /// `SCRAM-SHA-256` (RFC 5802, RFC 7677). The broker's signature is checked.
    pub fn scram_sha256(username: &str, password: impl Into<Secret>) -> Self {
        Self::with_password(Mechanism::ScramSha256, username, password.into())
    }

    /// `SCRAM-SHA-512`.
    pub fn scram_sha512(username: &str, password: impl Into<Secret>) -> Self {
        Self::with_password(Mechanism::ScramSha512, username, password.into())
    }

    /// `OAUTHBEARER` (RFC 7628, KIP-255) with tokens from `provider`. A token is fetched
    /// when a connection authenticates, reused until 80% of its lifetime has passed
    /// (the Java client's `sasl.login.refresh.window.factor`), then fetched anew; a
    /// connection re-authenticates before its session ends (KIP-368) with the fresh one.
    pub fn oauth_bearer(provider: Arc<dyn TokenProvider>) -> Self {
        SaslConfig {
            mechanism: Some(Mechanism::OAuthBearer),
            token_provider: Some(provider),
            ..Self::unset()
        }
    }

    /// `OAUTHBEARER` with tokens from an OIDC token endpoint, with the client-credentials
    /// grant (KIP-768; librdkafka's `sasl.oauthbearer.method=oidc`). A token is fetched
    /// when the first connection authenticates and again once 80% of its lifetime has
    /// passed (its lifetime is the JWT's `exp`, else the answer's `expires_in`); the
    /// connections re-authenticate with the new one before their sessions end (KIP-368).
    /// The settings are checked here; the error names the setting.
    ///
    /// ```
    /// use ottla::security::{OidcConfig, SaslConfig};
    ///
    /// let sasl = SaslConfig::oauth_bearer_oidc(
    ///     OidcConfig::new("https://login.example.com/oauth2/token", "my-app", "app-secret")
    ///         .scope("kafka")
    ///         .extension("logicalCluster", "lkc-abc123"),
    /// )?;
    /// # Ok::<(), ottla::Error>(())
    /// ```
    #[cfg(feature = "oauthbearer-oidc")]
    pub fn oauth_bearer_oidc(config: OidcConfig) -> crate::Result<Self> {
        let provider = crate::driver::oidc::OidcProvider::new(config)?;
        Ok(Self::oauth_bearer(Arc::new(provider)))
    }

    /// Amazon MSK IAM authentication (`OAUTHBEARER` on MSK's IAM listener, port 9098,
    /// over `SASL_SSL`): each token is the SigV4-presigned `kafka-cluster:Connect` URL
    /// that Amazon's `aws-msk-iam-sasl-signer` libraries make, signed with
    /// `credentials` for `region`, valid 15 minutes, made again at 80% of that.
    ///
    /// ```
    /// use ottla::security::{AwsCredentials, SaslConfig};
    ///
    /// // AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and AWS_REGION:
    /// let from_env = SaslConfig::aws_msk_iam_from_env();
    /// // Or explicitly:
    /// let sasl = SaslConfig::aws_msk_iam("eu-west-1", AwsCredentials::new("AKIA...", "secret"))?;
    /// # Ok::<(), ottla::Error>(())
    /// ```
    #[cfg(feature = "aws-msk-iam")]
    pub fn aws_msk_iam(region: &str, credentials: AwsCredentials) -> crate::Result<Self> {
        let provider = MskIamProvider {
            region: region.trim().to_string(),
            credentials,
        };
        // Signing once checks the region and the credentials now, not at the first
        // connection.
        provider.sign(SystemTime::now())?;
        Ok(Self::oauth_bearer(Arc::new(provider)))
    }

    /// [`SaslConfig::aws_msk_iam`] with the region from `AWS_REGION` (or
    /// `AWS_DEFAULT_REGION`) and the credentials from [`AwsCredentials::from_env`].
    #[cfg(feature = "aws-msk-iam")]
    pub fn aws_msk_iam_from_env() -> crate::Result<Self> {
        let region = std::env::var("AWS_REGION")
            .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
            .map_err(|_| crate::Error::Config {
                setting: "AWS_REGION",
                message: "not set: the region of the MSK cluster (like us-east-1)".into(),
            })?;
        Self::aws_msk_iam(&region, AwsCredentials::from_env()?)
    }

    /// `OAUTHBEARER` with unsigned JWTs built from librdkafka's `sasl.oauthbearer.config`
    /// syntax (`principal=admin scope=read lifeSeconds=3600 extension_k=v`), as
    /// librdkafka's `enable.sasl.oauthbearer.unsecure.jwt`. For development brokers
    /// only: no real broker should accept an unsigned token.
    pub fn oauth_bearer_unsecured_jwt(config: &str) -> crate::Result<Self> {
        let jwt = UnsecuredJwtConfig::parse(config).map_err(|e| crate::Error::Config {
            setting: "sasl.oauthbearer.config",
            message: e.to_string(),
        })?;
        Ok(Self::oauth_bearer(Arc::new(UnsecuredJwtProvider(jwt))))
    }

    /// The mechanism (`None` until `sasl.mechanism` is set, for a configuration read
    /// from properties).
    pub fn mechanism(&self) -> Option<Mechanism> {
        self.mechanism
    }

    /// Checks that the mechanism has what it needs; the error names the setting.
    pub fn validate(&self) -> crate::Result<()> {
        self.resolve().map(|_| ())
    }

    /// The mechanism with its credentials, the unsecured-JWT provider built if the
    /// properties asked for one.
    pub(crate) fn resolve(&self) -> crate::Result<SaslConfig> {
        let bad = |setting, message: &str| {
            Err(crate::Error::Config {
                setting,
                message: message.to_string(),
            })
        };
        let Some(mechanism) = self.mechanism else {
            return bad(
                "sasl.mechanism",
                "not set (Java's default, GSSAPI/Kerberos, is not supported): use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER",
            );
        };
        match mechanism {
            Mechanism::Plain | Mechanism::ScramSha256 | Mechanism::ScramSha512 => {
                if self.username.is_empty() {
                    return bad("sasl.username", "required by PLAIN and SCRAM");
                }
                if self.password.expose().is_empty() {
                    return bad("sasl.password", "required by PLAIN and SCRAM");
                }
                Ok(self.clone())
            }
            Mechanism::OAuthBearer => {
                if self.token_provider.is_some() {
                    return Ok(self.clone());
                }
                // librdkafka turns OIDC on with sasl.oauthbearer.method=oidc; the Java
                // client with a token endpoint URL.
                let oidc = self
                    .oidc_method
                    .unwrap_or(!self.oidc.token_endpoint_url.is_empty());
                if oidc {
                    return self.resolve_oidc();
                }
                match (&self.oauth_config, self.unsecure_jwt) {
                    (Some(config), true) => Self::oauth_bearer_unsecured_jwt(config),
                    _ => bad(
                        "sasl.oauthbearer.method",
                        "OAUTHBEARER needs sasl.oauthbearer.method=oidc with sasl.oauthbearer.token.endpoint.url, sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret, a TokenProvider (SaslConfig::oauth_bearer), or enable.sasl.oauthbearer.unsecure.jwt=true with sasl.oauthbearer.config for test tokens",
                    ),
                }
            }
            _ => bad(
                "sasl.mechanism",
                "not supported: use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER",
            ),
        }
    }
}

impl SaslConfig {
    #[cfg(feature = "oauthbearer-oidc")]
    fn resolve_oidc(&self) -> crate::Result<SaslConfig> {
        let mut resolved = Self::oauth_bearer_oidc(self.oidc.clone())?;
        resolved.oidc = self.oidc.clone();
        Ok(resolved)
    }

    #[cfg(not(feature = "oauthbearer-oidc"))]
    fn resolve_oidc(&self) -> crate::Result<SaslConfig> {
        Err(crate::Error::Config {
            setting: "sasl.oauthbearer.method",
            message: "oidc needs ottla's `oauthbearer-oidc` cargo feature (and `tls` for an https token endpoint)".into(),
        })
    }
}

/// The settings of the OIDC client-credentials token provider
/// ([`SaslConfig::oauth_bearer_oidc`]; KIP-768).
///
/// | method | librdkafka name | Java name |
/// |---|---|---|
/// | [`OidcConfig::new`] | `sasl.oauthbearer.token.endpoint.url`, `sasl.oauthbearer.client.id`, `sasl.oauthbearer.client.secret` | `sasl.oauthbearer.token.endpoint.url`, `sasl.oauthbearer.client.credentials.client.id` and `.client.secret` (or `clientId` and `clientSecret` in `sasl.jaas.config`) |
/// | [`OidcConfig::scope`] | `sasl.oauthbearer.scope` | `sasl.oauthbearer.scope` (or `scope` in `sasl.jaas.config`) |
/// | [`OidcConfig::extension`] | `sasl.oauthbearer.extensions` (`k=v,k2=v2`) | `extension_<k>` in `sasl.jaas.config` |
/// | [`OidcConfig::sub_claim_name`] | | `sasl.oauthbearer.sub.claim.name` (default `sub`) |
/// | [`OidcConfig::tls`] | `https.ca.location`, `https.ca.pem` | |
///
/// The client id and secret go to the endpoint in HTTP Basic authentication, the grant
/// type and the scope in the form body, as librdkafka and the Java client send them.
#[derive(Clone, Default)]
pub struct OidcConfig {
    pub(crate) token_endpoint_url: String,
    pub(crate) client_id: String,
    pub(crate) client_secret: Secret,
    pub(crate) scope: Option<String>,
    pub(crate) extensions: Vec<(String, String)>,
    pub(crate) sub_claim: String,
    pub(crate) tls: TlsConfig,
}

impl Default for Secret {
    fn default() -> Self {
        Secret::new("")
    }
}

impl fmt::Debug for OidcConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OidcConfig")
            // A URL with user info (refused when checked) may carry a password.
            .field(
                "token_endpoint_url",
                &match self.token_endpoint_url.contains('@') {
                    true => "[redacted: the URL has user info]",
                    false => self.token_endpoint_url.as_str(),
                },
            )
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret)
            .field("scope", &self.scope)
            .field("extensions", &self.extensions)
            .field("sub_claim_name", &self.sub_claim())
            .finish_non_exhaustive()
    }
}

impl OidcConfig {
    /// The token endpoint (`https://...`; `http://` is accepted for tests), and the
    /// client's id and secret.
    pub fn new(
        token_endpoint_url: impl Into<String>,
        client_id: impl Into<String>,
        client_secret: impl Into<Secret>,
    ) -> Self {
        Self {
            token_endpoint_url: token_endpoint_url.into(),
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            ..Self::default()
        }
    }

    /// The `scope` sent with the request (`sasl.oauthbearer.scope`), e.g. Azure's
    /// `api://<app>/.default`. None by default.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// A SASL extension sent to the broker with every token (KIP-342), e.g. Confluent
    /// Cloud's `logicalCluster` and `identityPoolId`.
    pub fn extension(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extensions.push((key.into(), value.into()));
        self
    }

    /// The JWT claim that names the principal (`sasl.oauthbearer.sub.claim.name`;
    /// `sub` by default). A JWT without it is refused; an opaque token is sent as it is.
    pub fn sub_claim_name(mut self, claim: impl Into<String>) -> Self {
        self.sub_claim = claim.into();
        self
    }

    /// TLS settings for an `https` token endpoint (its CA: librdkafka's
    /// `https.ca.location`); the platform's roots by default.
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = tls;
        self
    }

    pub(crate) fn sub_claim(&self) -> &str {
        match self.sub_claim.as_str() {
            "" => "sub",
            claim => claim,
        }
    }
}

/// AWS credentials for [`SaslConfig::aws_msk_iam`]: an access key and its secret, and
/// a session token with temporary credentials. The secret and the token print as
/// `[redacted]`.
#[cfg(feature = "aws-msk-iam")]
#[derive(Clone, Debug)]
pub struct AwsCredentials {
    access_key_id: String,
    secret_access_key: Secret,
    session_token: Option<Secret>,
}

#[cfg(feature = "aws-msk-iam")]
impl AwsCredentials {
    /// Long-term credentials (an IAM user's access key).
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<Secret>) -> Self {
        Self {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            session_token: None,
        }
    }

    /// Temporary credentials' session token (STS, an assumed role).
    pub fn session_token(mut self, token: impl Into<Secret>) -> Self {
        self.session_token = Some(token.into());
        self
    }

    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, if set, `AWS_SESSION_TOKEN`.
    /// (Profiles, instance metadata and web identity are the AWS SDK's; give their
    /// credentials with [`AwsCredentials::new`], or a [`TokenProvider`] of your own.)
    pub fn from_env() -> crate::Result<Self> {
        let var = |name: &'static str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or(crate::Error::Config {
                    setting: name,
                    message: "not set: the AWS credentials for MSK IAM".into(),
                })
        };
        let mut credentials = Self::new(var("AWS_ACCESS_KEY_ID")?, var("AWS_SECRET_ACCESS_KEY")?);
        if let Ok(token) = var("AWS_SESSION_TOKEN") {
            credentials = credentials.session_token(token);
        }
        Ok(credentials)
    }
}

/// Signs MSK IAM tokens ([`SaslConfig::aws_msk_iam`]).
#[cfg(feature = "aws-msk-iam")]
struct MskIamProvider {
    region: String,
    credentials: AwsCredentials,
}

#[cfg(feature = "aws-msk-iam")]
impl MskIamProvider {
    fn sign(&self, now: SystemTime) -> crate::Result<OAuthToken> {
        use crate::proto::sasl::msk_iam;
        let credentials = msk_iam::Credentials {
            access_key_id: &self.credentials.access_key_id,
            secret_access_key: self.credentials.secret_access_key.expose(),
            session_token: self.credentials.session_token.as_ref().map(Secret::expose),
        };
        let user_agent = concat!("ottla/", env!("CARGO_PKG_VERSION"));
        let token = msk_iam::token(credentials, &self.region, now, user_agent).map_err(|e| {
            let setting = match e {
                msk_iam::MskIamError::BadRegion(_) => "AWS_REGION",
                msk_iam::MskIamError::NoCredentials => "AWS_ACCESS_KEY_ID",
                _ => "aws-msk-iam",
            };
            crate::Error::Config {
                setting,
                message: e.to_string(),
            }
        })?;
        Ok(OAuthToken {
            value: Secret::new(token.token),
            expires_at: token.expires_at,
            extensions: Vec::new(),
        })
    }
}

#[cfg(feature = "aws-msk-iam")]
impl TokenProvider for MskIamProvider {
    fn token(&self) -> TokenFuture<'_> {
        let signed = self
            .sign(SystemTime::now())
            .map_err(|e| TokenError(e.to_string()));
        Box::pin(std::future::ready(signed))
    }
}

/// An OAuth bearer token and what the broker should know with it.
#[derive(Clone, Debug)]
pub struct OAuthToken {
    /// The token (a JWT for most identity providers).
    pub value: Secret,
    /// When it stops being valid.
    pub expires_at: SystemTime,
    /// SASL extensions sent with it (KIP-342), e.g. Confluent Cloud's
    /// `logicalCluster` and `identityPoolId`.
    pub extensions: Vec<(String, String)>,
}

/// Why a [`TokenProvider`] could not give a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TokenError(pub String);

/// The future a [`TokenProvider`] returns.
pub type TokenFuture<'a> =
    Pin<Box<dyn Future<Output = Result<OAuthToken, TokenError>> + Send + 'a>>;

/// Where `OAUTHBEARER` tokens come from: an OIDC client-credentials request, an
/// Amazon MSK IAM signer, a file a sidecar rotates, ...
///
/// ottla calls it when a connection authenticates and the cached token is past 80% of
/// its lifetime; calls never overlap. If a refresh fails while the old token is still
/// valid, the old one is used and the failure logged.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use ottla::security::{OAuthToken, Secret, TokenError, TokenFuture, TokenProvider};
///
/// struct FromSidecar(std::path::PathBuf);
///
/// impl TokenProvider for FromSidecar {
///     fn token(&self) -> TokenFuture<'_> {
///         Box::pin(async move {
///             let jwt = std::fs::read_to_string(&self.0).map_err(|e| TokenError(e.to_string()))?;
///             Ok(OAuthToken {
///                 value: Secret::new(jwt.trim()),
///                 expires_at: SystemTime::now() + Duration::from_secs(300),
///                 extensions: Vec::new(),
///             })
///         })
///     }
/// }
/// ```
pub trait TokenProvider: Send + Sync + 'static {
    /// A fresh token.
    fn token(&self) -> TokenFuture<'_>;
}

/// Unsigned JWTs for tests ([`SaslConfig::oauth_bearer_unsecured_jwt`]).
struct UnsecuredJwtProvider(UnsecuredJwtConfig);

impl TokenProvider for UnsecuredJwtProvider {
    fn token(&self) -> TokenFuture<'_> {
        Box::pin(async move {
            let now_ms = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            let (token, expiry_ms) = self.0.token(now_ms);
            let expires_at = SystemTime::UNIX_EPOCH
                + std::time::Duration::from_millis(u64::try_from(expiry_ms).unwrap_or(0));
            Ok(OAuthToken {
                value: Secret::new(token),
                expires_at,
                extensions: self.0.extensions.clone(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_print_redacted() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s}"), "[redacted]");
        assert_eq!(format!("{s:?}"), "[redacted]");
        let sasl = SaslConfig::scram_sha256("alice", "hunter2");
        assert!(!format!("{sasl:?}").contains("hunter2"), "{sasl:?}");
        let tls = TlsConfig::new().client_certificate(
            Pem::file("/c.pem"),
            Pem::inline("-----BEGIN PRIVATE KEY-----\nsecretkey\n"),
        );
        assert!(!format!("{tls:?}").contains("secretkey"), "{tls:?}");
        let oidc = OidcConfig::new("https://app:pw-in-url@idp/token", "app", "client-secret");
        let shown = format!("{oidc:?}");
        assert!(
            !shown.contains("pw-in-url") && !shown.contains("client-secret"),
            "{shown}"
        );
    }

    #[cfg(feature = "aws-msk-iam")]
    #[tokio::test]
    async fn msk_iam_tokens_are_signed_urls_that_live_15_minutes() {
        use base64::Engine;
        let creds = AwsCredentials::new("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI-secret-KEY")
            .session_token("session-TOKEN-secret");
        let shown = format!("{creds:?}");
        assert!(
            !shown.contains("wJalrXUtnFEMI") && !shown.contains("session-TOKEN"),
            "{shown}"
        );
        let sasl = SaslConfig::aws_msk_iam("eu-west-1", creds.clone()).unwrap();
        assert_eq!(sasl.mechanism(), Some(Mechanism::OAuthBearer));
        let provider = sasl.token_provider.clone().unwrap();
        let before = SystemTime::now();
        let token = provider.token().await.unwrap();
        let lifetime = token.expires_at.duration_since(before).unwrap();
        assert!(
            lifetime > std::time::Duration::from_secs(898)
                && lifetime <= std::time::Duration::from_secs(900),
            "{lifetime:?}"
        );
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.value.expose())
            .unwrap();
        let url = String::from_utf8(url).unwrap();
        assert!(
            url.starts_with(
                "https://kafka.eu-west-1.amazonaws.com/?Action=kafka-cluster%3AConnect&"
            ),
            "{url}"
        );
        assert!(
            url.contains("&X-Amz-Security-Token=session-TOKEN-secret&"),
            "{url}"
        );
        assert!(
            url.ends_with(&format!(
                "&User-Agent=ottla%2F{}",
                env!("CARGO_PKG_VERSION")
            )),
            "{url}"
        );
        // The region and the credentials are checked when the configuration is made.
        let Err(crate::Error::Config { setting, .. }) = SaslConfig::aws_msk_iam("", creds) else {
            panic!("an empty region was accepted");
        };
        assert_eq!(setting, "AWS_REGION");
        let Err(crate::Error::Config { setting, .. }) =
            SaslConfig::aws_msk_iam("us-east-1", AwsCredentials::new("", "x"))
        else {
            panic!("empty credentials were accepted");
        };
        assert_eq!(setting, "AWS_ACCESS_KEY_ID");
    }

    #[test]
    fn protocol_names_round_trip() {
        for p in [
            SecurityProtocol::Plaintext,
            SecurityProtocol::Ssl,
            SecurityProtocol::SaslPlaintext,
            SecurityProtocol::SaslSsl,
        ] {
            assert_eq!(SecurityProtocol::parse(p.name()), Some(p));
            assert_eq!(SecurityProtocol::parse(&p.name().to_lowercase()), Some(p));
        }
        assert_eq!(SecurityProtocol::parse("TLS"), None);
    }
}
