//! Errors, layered as in the wire stack: [`WireError`] (bytes on one connection) ->
//! [`RequestError`] (one request's fate) -> [`Error`] (what a user of the client sees).
//!
//! Every error is `Clone`, because one broken connection fails many waiting requests
//! with the same cause.

use std::time::Duration;

/// The Kafka API keys that errors name (re-exported from the codec, so that `api: ApiKey::Metadata`
/// can be matched without depending on it).
pub use kafka_protocol::messages::ApiKey;

pub use crate::proto::fetch::batch::{
    BatchError as RecordBatchError, BatchErrorKind as RecordBatchErrorKind,
};
pub use crate::proto::group::member::{CommitError, GroupError};
pub use crate::proto::produce::encode::EncodeError;
pub use crate::proto::sasl::SaslError;
pub use crate::proto::wire::{NegotiationError, VersionRangeDisplay, WireError};

/// The fate of one request sent on one broker connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The connection broke the wire rules (see [`WireError`]).
    #[error("wire error with {broker}: {source}")]
    Wire {
        /// The broker address.
        broker: String,
        /// The violation.
        #[source]
        source: WireError,
    },
    /// Connecting (TCP and ApiVersions) failed.
    #[error("cannot connect to {broker}: {reason}")]
    Connect {
        /// The broker address.
        broker: String,
        /// What went wrong.
        reason: String,
    },
    /// The connection dropped (I/O error, EOF, or poisoned by another request's failure)
    /// before this request's response arrived. The request may or may not have been
    /// processed by the broker.
    #[error("connection to {broker} lost: {reason}")]
    Disconnected {
        /// The broker address.
        broker: String,
        /// What went wrong.
        reason: String,
    },
    /// No response within the request timeout. The connection is dropped, as in the
    /// Java client, because later responses on it can no longer be matched.
    #[error("{api:?} to {broker} timed out after {after:?}")]
    Timeout {
        /// The broker address.
        broker: String,
        /// The API of the request.
        api: ApiKey,
        /// The timeout that expired.
        after: Duration,
    },
    /// Version negotiation failed for a required API.
    #[error("version negotiation with {broker} failed: {source}")]
    Negotiation {
        /// The broker address.
        broker: String,
        /// Why.
        #[source]
        source: NegotiationError,
    },
    /// The request asked for a version the connection did not negotiate.
    #[error("{api:?} v{version} is not usable with {broker} (negotiated: {negotiated})")]
    UnsupportedVersion {
        /// The broker address.
        broker: String,
        /// The API.
        api: ApiKey,
        /// The version asked for.
        version: i16,
        /// What was negotiated, if anything.
        negotiated: String,
    },
    /// The connection task has stopped (the client is shutting down).
    #[error("connection to {broker} is closed")]
    Closed {
        /// The broker address.
        broker: String,
    },
    /// The TLS handshake with the broker failed. This is configuration, not a passing
    /// fault: the connection is tried again only after the longest reconnect backoff.
    #[error("TLS with {broker} failed: {reason}; check {setting}")]
    Tls {
        /// The broker address.
        broker: String,
        /// What was wrong.
        reason: TlsFailure,
        /// The setting (or the broker-side thing) to change.
        setting: &'static str,
    },
    /// SASL authentication with the broker failed (wrong password, unknown user,
    /// mechanism not enabled, a server signature that does not verify). Retried only
    /// after the longest reconnect backoff.
    #[error("SASL {mechanism} authentication with {broker} failed: {source}")]
    Authentication {
        /// The broker address.
        broker: String,
        /// The mechanism, as `sasl.mechanism` names it.
        mechanism: &'static str,
        /// Why.
        #[source]
        source: AuthError,
    },
    /// The broker's listener most likely speaks another security protocol than
    /// `security.protocol` says: a plaintext request answered with a TLS record
    /// (`certain`, a configuration error like [`RequestError::Tls`]), or connections
    /// closed where such a listener closes them (not certain, and retried as any lost
    /// connection is). The message names `security.protocol` and the value to try.
    #[error("{}", wrong_protocol_message(broker, *configured, suggested, *certain, evidence))]
    WrongSecurityProtocol {
        /// The broker address.
        broker: String,
        /// The client's `security.protocol`.
        configured: crate::security::SecurityProtocol,
        /// The value (or values) of `security.protocol` to try.
        suggested: &'static str,
        /// Proven by the broker's bytes, or only likely.
        certain: bool,
        /// What the broker did.
        evidence: &'static str,
    },
}

fn wrong_protocol_message(
    broker: &str,
    configured: crate::security::SecurityProtocol,
    suggested: &str,
    certain: bool,
    evidence: &str,
) -> String {
    if certain {
        format!(
            "{broker} {evidence}: its listener does not speak security.protocol={configured}; set security.protocol to {suggested}"
        )
    } else {
        format!(
            "cannot talk to {broker}: it {evidence}; its listener may not speak security.protocol={configured}: check security.protocol, likely {suggested}"
        )
    }
}

/// What was wrong in a TLS handshake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The broker's certificate chain does not lead to a trusted root.
    #[error("the broker's certificate is signed by an unknown issuer")]
    UnknownIssuer,
    /// The broker's certificate has expired (or the clock is wrong).
    #[error("the broker's certificate has expired")]
    Expired,
    /// The broker's certificate is not valid yet (or the clock is wrong).
    #[error("the broker's certificate is not valid yet")]
    NotYetValid,
    /// The broker's certificate does not name the host ottla connected to.
    #[error("the broker's certificate is not valid for {host}")]
    NameMismatch {
        /// The host name or address used (the broker's advertised host).
        host: String,
    },
    /// The broker's certificate has been revoked.
    #[error("the broker's certificate is revoked")]
    Revoked,
    /// The broker's certificate is unusable for another reason.
    #[error("the broker's certificate is invalid: {0}")]
    BadCertificate(String),
    /// The broker refused the handshake (a TLS alert), most often because it requires
    /// a client certificate (mutual TLS) that was not given or not trusted.
    #[error("the broker refused the handshake ({0})")]
    HandshakeRefused(String),
    /// The local TLS settings cannot be used (a file that does not parse, a key that
    /// does not match).
    #[error("{0}")]
    Config(String),
    /// Another TLS protocol failure.
    #[error("{0}")]
    Protocol(String),
}

impl TlsFailure {
    /// The setting a user should look at for this failure.
    pub fn setting(&self) -> &'static str {
        match self {
            TlsFailure::UnknownIssuer => {
                "ssl.ca.location (the CA that signed the broker's certificate)"
            }
            TlsFailure::Expired | TlsFailure::NotYetValid | TlsFailure::Revoked => {
                "the broker's certificate (and this machine's clock)"
            }
            TlsFailure::NameMismatch { .. } => {
                "the broker's advertised host and its certificate's names (ssl.endpoint.identification.algorithm)"
            }
            TlsFailure::BadCertificate(_) => "the broker's certificate",
            TlsFailure::HandshakeRefused(_) => {
                "ssl.certificate.location and ssl.key.location (the broker may require a client certificate)"
            }
            TlsFailure::Config(_) => "the ssl.* settings",
            TlsFailure::Protocol(_) => {
                "security.protocol (this port may not speak TLS: try PLAINTEXT, or SASL_PLAINTEXT if it authenticates)"
            }
        }
    }
}

/// Why SASL authentication failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The broker does not enable the mechanism asked for.
    #[error("the broker does not enable {wanted}; it enables {} (sasl.mechanism)", if enabled.is_empty() { "none".to_string() } else { enabled.join(", ") })]
    MechanismNotEnabled {
        /// The mechanism asked for.
        wanted: &'static str,
        /// The mechanisms the broker enables.
        enabled: Vec<String>,
    },
    /// The broker refused the credentials (`SASL_AUTHENTICATION_FAILED`: a wrong
    /// password, an unknown user, an invalid token), with its message.
    #[error("{name} (code {code}): {message} (sasl.username, sasl.password or the token)")]
    Rejected {
        /// The Kafka error code.
        code: i16,
        /// The error's protocol name.
        name: String,
        /// The broker's message, if it gave one.
        message: String,
    },
    /// The exchange failed on ottla's side: the broker's messages were malformed, or
    /// its SCRAM signature did not verify (it does not know the password: never a
    /// success).
    #[error(transparent)]
    Exchange(#[from] crate::proto::sasl::SaslError),
    /// The OAUTHBEARER token provider failed.
    #[error("the token provider failed: {0}")]
    Token(String),
    /// The broker advertises no SASL APIs, or closed the connection during the
    /// exchange (which old brokers do instead of answering with an error).
    #[error("{0}")]
    Protocol(String),
}

impl RequestError {
    /// Whether retrying the request (possibly on a fresh connection) may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            RequestError::Connect { .. }
            | RequestError::Disconnected { .. }
            | RequestError::Timeout { .. } => true,
            RequestError::WrongSecurityProtocol { certain, .. } => !certain,
            // A wire error poisons one connection; a new one may behave.
            RequestError::Wire { source, .. } => !matches!(
                source,
                WireError::Encode { .. } | WireError::FrameTooLarge { .. }
            ),
            RequestError::Negotiation { .. }
            | RequestError::UnsupportedVersion { .. }
            | RequestError::Closed { .. }
            | RequestError::Tls { .. }
            | RequestError::Authentication { .. } => false,
        }
    }

    /// Whether this is a TLS or authentication failure: configuration that a retry on
    /// the next connection will not fix.
    pub fn is_security(&self) -> bool {
        matches!(
            self,
            RequestError::Tls { .. }
                | RequestError::Authentication { .. }
                | RequestError::WrongSecurityProtocol { certain: true, .. }
        )
    }
}

/// The error type of ottla's public API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A request failed (see [`RequestError`]).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A broker answered with an error code.
    #[error("{api:?} failed: {name} (code {code}){}", context.as_deref().map(|c| format!(" for {c}")).unwrap_or_default())]
    Broker {
        /// The API that failed.
        api: ApiKey,
        /// The Kafka error code.
        code: i16,
        /// The error's protocol name.
        name: String,
        /// What the error applies to (a topic, a partition, a group), if known.
        context: Option<String>,
    },
    /// No bootstrap server could be reached, or none answered Metadata.
    #[error("no bootstrap server reachable (tried {tried:?}): {}", last.as_ref().map_or_else(|| "no broker supports Metadata".to_string(), |e| e.to_string()))]
    Bootstrap {
        /// The addresses tried.
        tried: Vec<String>,
        /// The last failure, typed (a refused connection, a decode error, ...); `None`
        /// when every broker answered but none supports Metadata.
        #[source]
        last: Option<RequestError>,
    },
    /// The configuration is invalid; the message names the setting.
    #[error("invalid configuration: {setting}: {message}")]
    Config {
        /// The setting at fault.
        setting: &'static str,
        /// What to change.
        message: String,
    },
    /// A configuration property was refused: unknown (with a suggestion), unsupported,
    /// or with a value that does not parse (see [`crate::properties`]).
    #[error("invalid configuration: {0}")]
    Property(#[from] crate::properties::PropertyError),
    /// Cluster metadata does not know a broker the client needs.
    #[error("unknown broker {node}")]
    UnknownBroker {
        /// The node id.
        node: i32,
    },
    /// A partition stopped (corrupt batch, offset out of range with no reset, ...).
    #[error(transparent)]
    Fetch(#[from] crate::proto::fetch::fetcher::FetchError),
    /// The group member failed for good.
    #[error(transparent)]
    Group(#[from] crate::proto::group::member::GroupError),
    /// The group member was refused something it keeps asking for (a topic ACL on the
    /// heartbeat, a group ACL on FindCoordinator): not fatal, the consumer goes on and
    /// recovers by itself once the ACL is granted. Returned once per refusal, as the
    /// Java client throws these from `poll`.
    #[error(transparent)]
    GroupRetrying(crate::proto::group::member::GroupError),
    /// A commit failed.
    #[error(transparent)]
    Commit(#[from] crate::proto::group::member::CommitError),
    /// A record was not written.
    #[error(transparent)]
    Produce(#[from] crate::proto::produce::accumulator::ProduceError),
    /// A transactional producer's call failed, or a record was sent outside an open
    /// transaction: [`TxnError::txn_requires_abort`](crate::producer::TransactionError::txn_requires_abort)
    /// and [`is_fatal`](crate::producer::TransactionError::is_fatal) say what is left.
    #[error(transparent)]
    Transaction(#[from] crate::proto::produce::transaction::TxnError),
    /// The consumer is closed.
    #[error("the consumer is closed")]
    Closed,
}

impl Error {
    /// Builds a [`Error::Broker`] from a response error code.
    pub fn broker(api: ApiKey, code: i16, context: Option<String>) -> Self {
        Error::Broker {
            api,
            code,
            name: crate::proto::error_name(code),
            context,
        }
    }
}

/// The result type of ottla's public API.
pub type Result<T, E = Error> = std::result::Result<T, E>;
