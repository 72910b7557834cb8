//! Client configuration shared by every component: bootstrap servers, identity, and
//! the connection settings, with the Java client's names and defaults.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::properties::{self, IgnoredProperty, Property, PropertyError, Route, Scope};
use crate::proto::sasl::Mechanism;
use crate::proto::wire::DEFAULT_MAX_FRAME_SIZE;
use crate::security::{Pem, SaslConfig, Secret, SecurityProtocol, TlsConfig, TrustRoots};

pub use crate::proto::backoff::{DEFAULT_RETRY_BACKOFF, DEFAULT_RETRY_BACKOFF_MAX};
use crate::proto::wire::lifecycle::DEFAULT_MAX_IDLE;

/// Connection-level configuration.
///
/// | setting | Java name | default |
/// |---|---|---|
/// | `bootstrap_servers` | `bootstrap.servers` | (required) |
/// | `client_id` | `client.id` | `ottla` |
/// | `request_timeout` | `request.timeout.ms` | 30 s |
/// | `metadata_max_age` | `metadata.max.age.ms` | 5 min |
/// | `client_rack` | `client.rack` | none |
/// | `connect_timeout` | `socket.connection.setup.timeout.ms` | 10 s |
/// | `reconnect_backoff` | `reconnect.backoff.ms` | 50 ms |
/// | `reconnect_backoff_max` | `reconnect.backoff.max.ms` | 1 s |
/// | `retry_backoff` | `retry.backoff.ms` | 100 ms |
/// | `retry_backoff_max` | `retry.backoff.max.ms` | 1 s |
/// | `max_in_flight` | `max.in.flight.requests.per.connection` | 5 |
/// | `max_frame_size` | (none; the broker's `socket.request.max.bytes`) | 100 MiB |
/// | `connections_max_idle` | `connections.max.idle.ms` | 9 min (3 min on Azure Event Hubs) |
/// | `socket_keepalive` | `socket.keepalive.enable` | off |
/// | `security_protocol` | `security.protocol` | `PLAINTEXT` |
/// | `tls` | `ssl.*` ([`TlsConfig`]) | the platform's roots, host names verified |
/// | `sasl` | `sasl.*` ([`SaslConfig`]) | none |
///
/// Every setting can also be given by its Java or librdkafka property name with
/// [`ClientConfig::set`], [`ClientConfig::from_properties`] or
/// [`ClientConfig::from_env`] ([`crate::properties`] lists the names).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// `host:port` addresses used to discover the cluster.
    pub bootstrap_servers: Vec<String>,
    /// Sent in every request header.
    pub client_id: String,
    /// How long a request may wait for its response before the connection is dropped.
    pub request_timeout: Duration,
    /// How long TCP connect plus ApiVersions negotiation may take.
    pub connect_timeout: Duration,
    /// How old metadata may get before it is refreshed: a group leader refreshes at
    /// least this often to notice topics that gained partitions or were deleted.
    pub metadata_max_age: Duration,
    /// The rack this client runs in: a group member sends it in its subscription so
    /// rack-aware assignors (KIP-881) prefer partitions with a replica in this rack.
    pub client_rack: Option<String>,
    /// The first delay before reconnecting to a broker after a failure.
    pub reconnect_backoff: Duration,
    /// The cap of the exponential reconnect backoff.
    pub reconnect_backoff_max: Duration,
    /// The first delay before a failed request is tried again (the group member's
    /// requests, the fetcher's, the producer's, the commit at a revocation or close),
    /// doubled per consecutive failure. The one home of this setting: every component
    /// takes it from here.
    pub retry_backoff: Duration,
    /// The cap of that backoff.
    pub retry_backoff_max: Duration,
    /// Requests pipelined on one connection before further ones wait.
    pub max_in_flight: usize,
    /// The largest response frame accepted; larger ones poison the connection.
    pub max_frame_size: usize,
    /// How long a broker connection may carry no request before the client closes it
    /// (the Java client's `connections.max.idle.ms`); the next request that needs the
    /// broker opens a new one, and nothing fails meanwhile. `None` keeps idle
    /// connections for ever (librdkafka's default). On Azure Event Hubs
    /// (`*.servicebus.windows.net`), whose load balancer silently drops connections
    /// idle for about 4 minutes, the limit is at most 3 minutes.
    pub connections_max_idle: Option<Duration>,
    /// Sets `SO_KEEPALIVE` on every broker socket (librdkafka's
    /// `socket.keepalive.enable`), so the operating system probes a silent peer; its
    /// probe timing is the system's (`net.ipv4.tcp_keepalive_time`, 2 h on Linux).
    pub socket_keepalive: bool,
    /// Seed for the jitter of every backoff (reconnects, the group member's retries,
    /// the Processor's retry delays). Drawn from the OS's random source by default, so
    /// instances that fail together do not retry together; set it to replay a run.
    pub jitter_seed: u64,
    /// `security.protocol`: plain TCP, TLS, SASL, or SASL over TLS.
    pub security_protocol: SecurityProtocol,
    /// TLS settings, used with `SSL` and `SASL_SSL`.
    pub tls: TlsConfig,
    /// SASL settings, required with `SASL_PLAINTEXT` and `SASL_SSL`.
    pub sasl: Option<SaslConfig>,
    /// Properties given to `set` and ignored.
    ignored: Vec<IgnoredProperty>,
}

crate::properties::by_name_entry_points!(
    ClientConfig,
    ClientConfig::new(""),
    "`bootstrap.servers` must be among them for [`ClientConfig::validate`] to pass.",
    "`OTTLA_CLIENT_ID` with prefix `OTTLA_` is `client.id`"
);

impl ClientConfig {
    /// A configuration with defaults for the given bootstrap servers
    /// (comma-separated `host:port` list).
    pub fn new(bootstrap_servers: &str) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            client_id: "ottla".into(),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            metadata_max_age: Duration::from_secs(300),
            client_rack: None,
            reconnect_backoff: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(1),
            retry_backoff: DEFAULT_RETRY_BACKOFF,
            retry_backoff_max: DEFAULT_RETRY_BACKOFF_MAX,
            max_in_flight: 5,
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            connections_max_idle: Some(DEFAULT_MAX_IDLE),
            socket_keepalive: false,
            jitter_seed: entropy_seed(),
            security_protocol: SecurityProtocol::Plaintext,
            tls: TlsConfig::default(),
            sasl: None,
            ignored: Vec::new(),
        }
    }

    /// Sets `security.protocol`.
    pub fn with_security_protocol(mut self, protocol: SecurityProtocol) -> Self {
        self.security_protocol = protocol;
        self
    }

    /// The TLS settings (used with `SSL` and `SASL_SSL`).
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = tls;
        self
    }

    /// The SASL settings (used with `SASL_PLAINTEXT` and `SASL_SSL`).
    pub fn with_sasl(mut self, sasl: SaslConfig) -> Self {
        self.sasl = Some(sasl);
        self
    }

    /// Sets one setting by its Java or librdkafka property name, for configurations
    /// people already have ([`crate::properties`] lists every name). A consumer,
    /// producer or Processor setting is recorded as ignored here (a `ClientConfig`
    /// holds only the connection settings), as is a Java or librdkafka property that
    /// means nothing to ottla: see [`ClientConfig::ignored_properties`]. An unknown key
    /// is [`PropertyError::Unknown`] with the closest known name; a value that does not
    /// parse is [`PropertyError::InvalidValue`] naming the key and the value.
    pub fn set(mut self, key: &str, value: &str) -> Result<Self> {
        match properties::route(key, &[Scope::Client])? {
            Route::Apply(p) => self.apply(p, key, value)?,
            Route::Ignore(reason) => self.ignore(key, reason),
        }
        Ok(self)
    }

    /// The properties given to `set` that were ignored, with the reason, in the order
    /// first given. Empty when every property was applied.
    pub fn ignored_properties(&self) -> &[IgnoredProperty] {
        &self.ignored
    }

    /// Records `key` as ignored (and logs a warning).
    pub(crate) fn ignore(&mut self, key: &str, reason: &'static str) {
        properties::record_ignored(&mut self.ignored, key, reason);
    }

    /// Applies a connection property; `key` is the name as given (for errors).
    pub(crate) fn apply(
        &mut self,
        property: &Property,
        key: &str,
        value: &str,
    ) -> std::result::Result<(), PropertyError> {
        let key = key.trim();
        let value = value.trim();
        match property.name {
            "bootstrap.servers" => {
                self.bootstrap_servers = ClientConfig::new(value).bootstrap_servers;
            }
            "client.id" => self.client_id = value.to_string(),
            "client.rack" => {
                self.client_rack = (!value.is_empty()).then(|| value.to_string());
            }
            "request.timeout.ms" => self.request_timeout = properties::millis(key, value)?,
            "metadata.max.age.ms" => self.metadata_max_age = properties::millis(key, value)?,
            "socket.connection.setup.timeout.ms" => {
                self.connect_timeout = properties::millis(key, value)?;
            }
            "reconnect.backoff.ms" => self.reconnect_backoff = properties::millis(key, value)?,
            "reconnect.backoff.max.ms" => {
                self.reconnect_backoff_max = properties::millis(key, value)?;
            }
            "retry.backoff.ms" => self.retry_backoff = properties::millis(key, value)?,
            "retry.backoff.max.ms" => self.retry_backoff_max = properties::millis(key, value)?,
            "max.in.flight.requests.per.connection" => {
                self.max_in_flight = properties::number(key, value, "a count of requests")?;
            }
            "receive.message.max.bytes" => {
                self.max_frame_size = properties::number(key, value, "a number of bytes")?;
            }
            "connections.max.idle.ms" => {
                // Java's -1 and librdkafka's 0 both turn it off.
                let ms: i64 = properties::number(
                    key,
                    value,
                    "a whole number of milliseconds (0 or -1: never close)",
                )?;
                self.connections_max_idle = u64::try_from(ms)
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis);
            }
            "socket.keepalive.enable" => self.socket_keepalive = properties::flag(key, value)?,
            "security.protocol" => {
                self.security_protocol = SecurityProtocol::parse(value).ok_or_else(|| {
                    properties::invalid(key, value, "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
                })?;
            }
            "ssl.ca.location" | "ssl.truststore.location" => {
                self.tls.roots = if value.eq_ignore_ascii_case("probe") {
                    TrustRoots::Platform
                } else {
                    TrustRoots::Pem(Pem::file(value))
                };
            }
            "ssl.ca.pem" | "ssl.truststore.certificates" => {
                self.tls.roots = TrustRoots::Pem(Pem::inline(value));
            }
            "ssl.truststore.type" | "ssl.keystore.type" => {
                if !value.eq_ignore_ascii_case("PEM") {
                    return Err(properties::invalid(
                        key,
                        value,
                        "PEM: other stores are not read; convert it to PEM (openssl pkcs12 -in store.p12 -nodes, or keytool -exportcert -rfc) and give the file",
                    ));
                }
            }
            "ssl.certificate.location" => self.tls.certificate = Some(Pem::file(value)),
            "ssl.key.location" => self.tls.key = Some(Pem::file(value)),
            "ssl.keystore.location" => {
                self.tls.certificate = Some(Pem::file(value));
                self.tls.key = Some(Pem::file(value));
            }
            "ssl.certificate.pem" | "ssl.keystore.certificate.chain" => {
                self.tls.certificate = Some(Pem::inline(value));
            }
            "ssl.key.pem" | "ssl.keystore.key" => self.tls.key = Some(Pem::inline(value)),
            "ssl.key.password" | "ssl.keystore.password" => {
                if !value.is_empty() {
                    return Err(PropertyError::Unsupported {
                        key: key.to_string(),
                        reason: "encrypted private keys are not read; decrypt the key (openssl pkcs8 -topk8 -nocrypt) and keep it as a secret",
                    });
                }
            }
            "ssl.endpoint.identification.algorithm" => match value.to_ascii_lowercase().as_str() {
                "https" => self.tls.skip_hostname_verification = false,
                "" | "none" => self.tls.skip_hostname_verification = true,
                _ => {
                    return Err(properties::invalid(
                        key,
                        value,
                        "https, or none to turn it off",
                    ));
                }
            },
            "sasl.mechanism" => {
                let mechanism = Mechanism::parse(value).ok_or_else(|| {
                    properties::invalid(
                        key,
                        value,
                        "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (others are not supported)",
                    )
                })?;
                self.sasl_mut().mechanism = Some(mechanism);
            }
            "sasl.username" => self.sasl_mut().username = value.to_string(),
            "sasl.password" => self.sasl_mut().password = Secret::new(value),
            "sasl.jaas.config" => {
                let jaas = parse_jaas(value).map_err(|m| properties::invalid(key, value, m))?;
                let sasl = self.sasl_mut();
                if let Some(u) = jaas.username {
                    sasl.username = u;
                }
                if let Some(p) = jaas.password {
                    sasl.password = p;
                }
                if let Some(id) = jaas.client_id {
                    sasl.oidc.client_id = id;
                }
                if let Some(secret) = jaas.client_secret {
                    sasl.oidc.client_secret = secret;
                }
                if let Some(scope) = jaas.scope {
                    sasl.oidc.scope = Some(scope);
                }
                sasl.oidc.extensions.extend(jaas.extensions);
            }
            "sasl.oauthbearer.method" => {
                self.sasl_mut().oidc_method = match value.to_ascii_lowercase().as_str() {
                    "oidc" => Some(true),
                    "default" | "" => Some(false),
                    _ => return Err(properties::invalid(key, value, "default or oidc")),
                };
            }
            "sasl.oauthbearer.token.endpoint.url" => {
                self.sasl_mut().oidc.token_endpoint_url = value.to_string();
            }
            "sasl.oauthbearer.client.credentials.client.id" => {
                self.sasl_mut().oidc.client_id = value.to_string();
            }
            "sasl.oauthbearer.client.credentials.client.secret" => {
                self.sasl_mut().oidc.client_secret = Secret::new(value);
            }
            "sasl.oauthbearer.scope" => {
                self.sasl_mut().oidc.scope = (!value.is_empty()).then(|| value.to_string());
            }
            "sasl.oauthbearer.extensions" => {
                // librdkafka's `key=value,key2=value2`.
                let mut extensions = Vec::new();
                for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    let Some((k, v)) = pair.split_once('=') else {
                        return Err(properties::invalid(
                            key,
                            value,
                            "comma-separated key=value pairs",
                        ));
                    };
                    extensions.push((k.trim().to_string(), v.trim().to_string()));
                }
                self.sasl_mut().oidc.extensions = extensions;
            }
            "sasl.oauthbearer.sub.claim.name" => {
                self.sasl_mut().oidc.sub_claim = value.to_string();
            }
            "sasl.oauthbearer.grant.type" => {
                if value != "client_credentials" {
                    return Err(PropertyError::Unsupported {
                        key: key.to_string(),
                        reason: "only the client_credentials grant is built in; give a TokenProvider (SaslConfig::oauth_bearer) for others",
                    });
                }
            }
            "https.ca.location" => {
                let oidc = &mut self.sasl_mut().oidc;
                oidc.tls = std::mem::take(&mut oidc.tls).ca(Pem::file(value));
            }
            "https.ca.pem" => {
                let oidc = &mut self.sasl_mut().oidc;
                oidc.tls = std::mem::take(&mut oidc.tls).ca(Pem::inline(value));
            }
            "sasl.oauthbearer.config" => self.sasl_mut().oauth_config = Some(value.to_string()),
            "enable.sasl.oauthbearer.unsecure.jwt" => {
                self.sasl_mut().unsecure_jwt = properties::flag(key, value)?;
            }
            _ => return Err(properties::not_here(key)),
        }
        Ok(())
    }

    fn sasl_mut(&mut self) -> &mut SaslConfig {
        self.sasl.get_or_insert_with(SaslConfig::unset)
    }

    /// Sets `client.id`.
    pub fn with_client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }

    /// Sets `request.timeout.ms`.
    pub fn with_request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// Sets `metadata.max.age.ms`.
    pub fn with_metadata_max_age(mut self, t: Duration) -> Self {
        self.metadata_max_age = t;
        self
    }

    /// Sets `socket.connection.setup.timeout.ms`.
    pub fn with_connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Sets `reconnect.backoff.ms` and `reconnect.backoff.max.ms`.
    pub fn with_reconnect_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.reconnect_backoff = initial;
        self.reconnect_backoff_max = max;
        self
    }

    /// Sets `max.in.flight.requests.per.connection`.
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Sets `connections.max.idle.ms`: how long a connection may carry no request before
    /// the client closes it; `None` never closes one.
    pub fn with_connections_max_idle(mut self, limit: Option<Duration>) -> Self {
        self.connections_max_idle = limit;
        self
    }

    /// Sets `socket.keepalive.enable`: `SO_KEEPALIVE` on every broker socket.
    pub fn with_socket_keepalive(mut self, on: bool) -> Self {
        self.socket_keepalive = on;
        self
    }

    /// Sets the largest response frame accepted.
    pub fn with_max_frame_size(mut self, bytes: usize) -> Self {
        self.max_frame_size = bytes;
        self
    }

    /// Checks every setting; the error names the one at fault.
    pub fn validate(&self) -> Result<()> {
        let bad = |setting, message: &str| {
            Err(Error::Config {
                setting,
                message: message.to_string(),
            })
        };
        if self.bootstrap_servers.is_empty() {
            return bad("bootstrap.servers", "give at least one host:port");
        }
        for s in &self.bootstrap_servers {
            let port_ok = s
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !port_ok {
                return Err(Error::Config {
                    setting: "bootstrap.servers",
                    message: format!("{s:?} is not host:port"),
                });
            }
        }
        if self.max_in_flight == 0 {
            return bad(
                "max.in.flight.requests.per.connection",
                "must be at least 1",
            );
        }
        if self.request_timeout.is_zero() {
            return bad("request.timeout.ms", "must be positive");
        }
        if self.connect_timeout.is_zero() {
            return bad("socket.connection.setup.timeout.ms", "must be positive");
        }
        if self.reconnect_backoff_max < self.reconnect_backoff {
            return bad(
                "reconnect.backoff.max.ms",
                "must be at least reconnect.backoff.ms",
            );
        }
        if self.retry_backoff_max < self.retry_backoff {
            return bad("retry.backoff.max.ms", "must be at least retry.backoff.ms");
        }
        if self.connections_max_idle.is_some_and(|d| d.is_zero()) {
            return bad(
                "connections.max.idle.ms",
                "must be positive; None (0 or -1 by name) never closes an idle connection",
            );
        }
        if self.max_frame_size < 1024 {
            return bad("max_frame_size", "must be at least 1024 bytes");
        }
        if self.security_protocol.uses_tls() && !cfg!(feature = "tls-core") {
            return Err(Error::Config {
                setting: "security.protocol",
                message: format!(
                    "{} needs TLS, and ottla was built without it: enable the `tls` cargo feature",
                    self.security_protocol
                ),
            });
        }
        if self.security_protocol.uses_sasl() {
            let Some(sasl) = &self.sasl else {
                return Err(Error::Config {
                    setting: "sasl.mechanism",
                    message: format!(
                        "{} needs SASL settings: sasl.mechanism and its credentials",
                        self.security_protocol
                    ),
                });
            };
            sasl.validate()?;
        }
        Ok(())
    }
}

/// The credentials in a Java `sasl.jaas.config`.
#[derive(Default)]
struct Jaas {
    username: Option<String>,
    password: Option<Secret>,
    client_id: Option<String>,
    client_secret: Option<Secret>,
    scope: Option<String>,
    extensions: Vec<(String, String)>,
}

/// Reads `username` and `password` from a `PlainLoginModule` or `ScramLoginModule`
/// entry: `org.apache.kafka.common.security.plain.PlainLoginModule required
/// username="u" password="p";`, and `clientId`, `clientSecret`, `scope` and
/// `extension_<key>` from an `OAuthBearerLoginModule` entry (the Java client's OIDC
/// client credentials).
fn parse_jaas(value: &str) -> std::result::Result<Jaas, String> {
    let mut words = value
        .trim()
        .trim_end_matches(';')
        .splitn(3, char::is_whitespace);
    let module = words.next().unwrap_or_default();
    let oauth = module.ends_with(".OAuthBearerLoginModule");
    if !(module.ends_with(".PlainLoginModule") || module.ends_with(".ScramLoginModule") || oauth) {
        return Err(format!(
            "only PlainLoginModule, ScramLoginModule and OAuthBearerLoginModule entries are read (got {module:?})"
        ));
    }
    let _flag = words.next();
    let mut rest = words.next().unwrap_or_default().trim();
    let mut jaas = Jaas::default();
    while !rest.is_empty() {
        let Some((name, after)) = rest.split_once('=') else {
            return Err("expected name=\"value\" options".into());
        };
        let after = after.trim_start();
        let Some(quoted) = after.strip_prefix('"') else {
            return Err(format!("the value of {} must be quoted", name.trim()));
        };
        let Some(end) = quoted.find('"') else {
            return Err(format!("the value of {} is not closed", name.trim()));
        };
        let (v, tail) = quoted.split_at(end);
        match (name.trim(), oauth) {
            ("username", false) => jaas.username = Some(v.to_string()),
            ("password", false) => jaas.password = Some(Secret::new(v)),
            ("clientId", true) => jaas.client_id = Some(v.to_string()),
            ("clientSecret", true) => jaas.client_secret = Some(Secret::new(v)),
            ("scope", true) => jaas.scope = Some(v.to_string()),
            (name, true) if name.starts_with("unsecuredLogin") => {
                return Err(format!(
                    "{name}: the Java client's unsecured tokens are not read; give sasl.oauthbearer.config with enable.sasl.oauthbearer.unsecure.jwt=true"
                ));
            }
            (name, true) => {
                if let Some(ext) = name.strip_prefix("extension_") {
                    jaas.extensions.push((ext.to_string(), v.to_string()));
                }
            }
            _ => {}
        }
        rest = tail.get(1..).unwrap_or_default().trim();
    }
    Ok(jaas)
}

/// A seed from the OS's random source. Without one (no such source on the platform),
/// the process id and the clock, which still differ between instances.
pub(crate) fn entropy_seed() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_setting() {
        let err = ClientConfig::new("").validate().unwrap_err();
        assert!(err.to_string().contains("bootstrap.servers"), "{err}");
        let err = ClientConfig::new("localhost").validate().unwrap_err();
        assert!(err.to_string().contains("not host:port"), "{err}");
        let err = ClientConfig::new("h:1")
            .with_max_in_flight(0)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("max.in.flight"), "{err}");
        ClientConfig::new("a:1, b:2").validate().unwrap();
    }

    #[test]
    fn retry_backoff_has_one_home_with_the_java_names_and_defaults() {
        let c = ClientConfig::new("h:1");
        assert_eq!(
            (c.retry_backoff, c.retry_backoff_max),
            (Duration::from_millis(100), Duration::from_secs(1))
        );
        let c = c
            .set("retry.backoff.ms", "250")
            .unwrap()
            .set("retry.backoff.max.ms", "4000")
            .unwrap();
        assert_eq!(
            (c.retry_backoff, c.retry_backoff_max),
            (Duration::from_millis(250), Duration::from_secs(4))
        );
        c.validate().unwrap();
        let err = c
            .set("retry.backoff.max.ms", "10")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("retry.backoff.max.ms"), "{err}");
        let err = ClientConfig::new("h:1")
            .set("retry.backoff.ms", "soon")
            .unwrap_err();
        assert!(err.to_string().contains("retry.backoff.ms"), "{err}");
    }

    #[test]
    fn properties_set_security() {
        let c = ClientConfig::new("h:1")
            .set("security.protocol", "sasl_ssl")
            .unwrap()
            .set("sasl.mechanisms", "SCRAM-SHA-512")
            .unwrap()
            .set("sasl.username", "alice")
            .unwrap()
            .set("sasl.password", "hunter2")
            .unwrap()
            .set("ssl.ca.location", "/etc/ca.pem")
            .unwrap()
            .set("ssl.endpoint.identification.algorithm", "none")
            .unwrap();
        assert_eq!(c.security_protocol, SecurityProtocol::SaslSsl);
        let sasl = c.sasl.as_ref().unwrap();
        assert_eq!(sasl.mechanism, Some(Mechanism::ScramSha512));
        assert_eq!(sasl.username, "alice");
        assert_eq!(sasl.password.expose(), "hunter2");
        assert_eq!(c.tls.roots, TrustRoots::Pem(Pem::file("/etc/ca.pem")));
        assert!(!c.tls.verifies_hostname());
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    fn oidc_base() -> ClientConfig {
        ClientConfig::new("h:1")
            .set("security.protocol", "SASL_PLAINTEXT")
            .unwrap()
            .set("sasl.mechanism", "OAUTHBEARER")
            .unwrap()
    }

    /// The setting an OIDC configuration's validation names.
    #[cfg(feature = "oauthbearer-oidc")]
    fn oidc_refusal(c: ClientConfig) -> &'static str {
        match c.sasl.as_ref().map(SaslConfig::validate) {
            Some(Err(Error::Config { setting, .. })) => setting,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn oidc_by_librdkafka_and_java_names() {
        let rdkafka = oidc_base()
            .set("sasl.oauthbearer.method", "OIDC")
            .and_then(|c| {
                c.set(
                    "sasl.oauthbearer.token.endpoint.url",
                    "http://127.0.0.1:1/token",
                )
            })
            .and_then(|c| c.set("sasl.oauthbearer.client.id", "app"))
            .and_then(|c| c.set("sasl.oauthbearer.client.secret", "S3cret-x9"))
            .and_then(|c| c.set("sasl.oauthbearer.scope", "kafka"))
            .and_then(|c| {
                c.set(
                    "sasl.oauthbearer.extensions",
                    "logicalCluster=lkc-1, identityPoolId=pool-2",
                )
            })
            .and_then(|c| c.set("sasl.oauthbearer.grant.type", "client_credentials"))
            .unwrap();
        let java = oidc_base()
            .set("sasl.oauthbearer.token.endpoint.url", "http://127.0.0.1:1/token")
            .and_then(|c| c.set("sasl.oauthbearer.sub.claim.name", "client_id"))
            .and_then(|c| c.set("sasl.jaas.config", r#"org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientId="app" clientSecret="S3cret-x9" scope="kafka" extension_logicalCluster="lkc-1" extension_identityPoolId="pool-2";"#))
            .unwrap();
        for c in [&rdkafka, &java] {
            let oidc = &c.sasl.as_ref().unwrap().oidc;
            assert_eq!(oidc.token_endpoint_url, "http://127.0.0.1:1/token");
            assert_eq!(oidc.client_id, "app");
            assert_eq!(oidc.client_secret.expose(), "S3cret-x9");
            assert_eq!(oidc.scope.as_deref(), Some("kafka"));
            assert_eq!(
                oidc.extensions,
                [
                    ("logicalCluster".to_string(), "lkc-1".to_string()),
                    ("identityPoolId".to_string(), "pool-2".to_string())
                ]
            );
            assert!(!format!("{c:?}").contains("S3cret-x9"), "{c:?}");
            #[cfg(feature = "oauthbearer-oidc")]
            c.validate().unwrap();
            #[cfg(not(feature = "oauthbearer-oidc"))]
            {
                let err = c.validate().unwrap_err().to_string();
                assert!(err.contains("oauthbearer-oidc"), "{err}");
            }
        }
        let java = &java.sasl.as_ref().unwrap().oidc;
        assert_eq!(java.sub_claim(), "client_id");
        // Java's Kafka 4.1 names for the client id and secret (KIP-1139).
        let c = oidc_base()
            .set("sasl.oauthbearer.client.credentials.client.id", "app2")
            .and_then(|c| c.set("sasl.oauthbearer.client.credentials.client.secret", "s2"))
            .unwrap();
        assert_eq!(c.sasl.as_ref().unwrap().oidc.client_id, "app2");
        // Refused values.
        let err = oidc_base()
            .set(
                "sasl.oauthbearer.grant.type",
                "urn:ietf:params:oauth:grant-type:jwt-bearer",
            )
            .unwrap_err();
        assert!(
            matches!(err, Error::Property(PropertyError::Unsupported { .. })),
            "{err}"
        );
        let err = oidc_base()
            .set("sasl.oauthbearer.method", "kerberos")
            .unwrap_err();
        assert!(err.to_string().contains("default or oidc"), "{err}");
        let err = oidc_base()
            .set("sasl.oauthbearer.extensions", "novalue")
            .unwrap_err();
        assert!(err.to_string().contains("key=value"), "{err}");
        let err = oidc_base().set("sasl.jaas.config", r#"org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientSecret="S3cret-x9" unsecuredLoginStringClaim_sub="a";"#).unwrap_err();
        assert!(!err.to_string().contains("S3cret-x9"), "{err}");
    }

    #[cfg(feature = "oauthbearer-oidc")]
    #[test]
    fn oidc_settings_are_checked_at_build_naming_the_setting() {
        let full = |c: ClientConfig| {
            c.set("sasl.oauthbearer.client.id", "app")
                .and_then(|c| c.set("sasl.oauthbearer.client.secret", "s"))
                .unwrap()
        };
        let oidc = || oidc_base().set("sasl.oauthbearer.method", "oidc").unwrap();
        assert_eq!(
            oidc_refusal(full(oidc())),
            "sasl.oauthbearer.token.endpoint.url"
        );
        for url in [
            "ftp://idp/token",
            "idp.example.com/token",
            "https://:443/t",
            "http://h:x/t",
        ] {
            let c = full(
                oidc()
                    .set("sasl.oauthbearer.token.endpoint.url", url)
                    .unwrap(),
            );
            assert_eq!(
                oidc_refusal(c),
                "sasl.oauthbearer.token.endpoint.url",
                "{url}"
            );
        }
        let url = |c: ClientConfig| {
            c.set(
                "sasl.oauthbearer.token.endpoint.url",
                "http://127.0.0.1:1/t",
            )
            .unwrap()
        };
        let c = url(oidc())
            .set("sasl.oauthbearer.client.secret", "s")
            .unwrap();
        assert_eq!(oidc_refusal(c), "sasl.oauthbearer.client.id");
        let c = url(oidc())
            .set("sasl.oauthbearer.client.id", "app")
            .unwrap();
        assert_eq!(oidc_refusal(c), "sasl.oauthbearer.client.secret");
        let c = full(url(oidc()))
            .set("sasl.oauthbearer.extensions", "bad-key=1")
            .unwrap();
        assert_eq!(oidc_refusal(c), "sasl.oauthbearer.extensions");
        // Neither OIDC nor a provider nor unsecured tokens.
        assert_eq!(oidc_refusal(oidc_base()), "sasl.oauthbearer.method");
        // method=default turns OIDC off even with an endpoint (librdkafka).
        let c = full(url(oidc_base()))
            .set("sasl.oauthbearer.method", "default")
            .unwrap();
        assert_eq!(oidc_refusal(c), "sasl.oauthbearer.method");
        #[cfg(not(feature = "tls-core"))]
        {
            let c = full(
                oidc()
                    .set("sasl.oauthbearer.token.endpoint.url", "https://idp/t")
                    .unwrap(),
            );
            assert_eq!(oidc_refusal(c), "sasl.oauthbearer.token.endpoint.url");
        }
    }

    #[test]
    fn jaas_config_gives_credentials() {
        let c = ClientConfig::new("h:1")
            .set("sasl.mechanism", "PLAIN")
            .unwrap()
            .set(
                "sasl.jaas.config",
                r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="KEY" password="SECRET";"#,
            )
            .unwrap();
        let sasl = c.sasl.unwrap();
        assert_eq!(sasl.username, "KEY");
        assert_eq!(sasl.password.expose(), "SECRET");
        let err = ClientConfig::new("h:1")
            .set(
                "sasl.jaas.config",
                "com.sun.security.auth.module.Krb5LoginModule required;",
            )
            .unwrap_err();
        assert!(err.to_string().contains("PlainLoginModule"), "{err}");
    }

    #[test]
    fn security_settings_are_validated() {
        let err = ClientConfig::new("h:1")
            .with_security_protocol(SecurityProtocol::SaslPlaintext)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("sasl.mechanism"), "{err}");
        let err = ClientConfig::new("h:1")
            .set("security.protocol", "SASL_PLAINTEXT")
            .unwrap()
            .set("sasl.username", "alice")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("sasl.mechanism"), "{err}");
        let err = ClientConfig::new("h:1")
            .set("security.protocol", "kerberos")
            .unwrap_err();
        assert!(err.to_string().contains("security.protocol"), "{err}");
        let err = ClientConfig::new("h:1")
            .set("sasl.mechanism", "GSSAPI")
            .unwrap_err();
        assert!(err.to_string().contains("not supported"), "{err}");
        let err = ClientConfig::new("h:1")
            .set("ssl.truststore.type", "JKS")
            .unwrap_err();
        assert!(err.to_string().contains("PEM"), "{err}");
        let err = ClientConfig::new("h:1")
            .set("no.such.key", "1")
            .unwrap_err();
        assert!(err.to_string().contains("no.such.key"), "{err}");
    }

    #[test]
    fn each_configuration_draws_its_own_jitter_seed() {
        // A constant seed made every instance retry on the same schedule: the
        // thundering herd jitter exists to prevent.
        let seeds: std::collections::BTreeSet<u64> = (0..4)
            .map(|_| ClientConfig::new("h:9092").jitter_seed)
            .collect();
        assert_eq!(seeds.len(), 4, "{seeds:?}");
    }

    #[test]
    fn idle_limit_and_keepalive_by_their_java_and_librdkafka_names() {
        let c = ClientConfig::new("h:1");
        assert_eq!(c.connections_max_idle, Some(Duration::from_secs(540)));
        assert!(!c.socket_keepalive);
        let c = c
            .set("connections.max.idle.ms", "180000")
            .unwrap()
            .set("socket.keepalive.enable", "true")
            .unwrap();
        assert_eq!(c.connections_max_idle, Some(Duration::from_secs(180)));
        assert!(c.socket_keepalive);
        assert!(c.ignored_properties().is_empty());
        // Java's -1 and librdkafka's 0 both keep idle connections.
        for off in ["-1", "0"] {
            let c = ClientConfig::new("h:1")
                .set("connections.max.idle.ms", off)
                .unwrap();
            assert_eq!(c.connections_max_idle, None, "{off}");
            c.validate().unwrap();
        }
        let err = ClientConfig::new("h:1")
            .set("connections.max.idle.ms", "9min")
            .unwrap_err();
        assert!(err.to_string().contains("connections.max.idle.ms"), "{err}");
        let err = ClientConfig::new("h:1")
            .with_connections_max_idle(Some(Duration::ZERO))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("connections.max.idle.ms"), "{err}");
    }
}
