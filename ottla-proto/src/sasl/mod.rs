//! SASL mechanisms, client side, as pure functions of the messages exchanged: `PLAIN`
//! (RFC 4616), `SCRAM-SHA-256`/`SCRAM-SHA-512` (RFC 5802, RFC 7677) and `OAUTHBEARER`
//! (RFC 7628, KIP-255, KIP-342). The driver carries the messages in SaslAuthenticate
//! requests and draws the SCRAM nonce; nothing here reads a clock or a random source.
//!
//! Secrets pass through as arguments and are never printed: the clients' `Debug` says
//! `[redacted]` where they hold one, and no error quotes one.

mod jwt;
#[cfg(feature = "aws-msk-iam")]
pub mod msk_iam;
mod oauth;
#[cfg(feature = "oidc")]
pub mod oidc;
mod plain;
mod refresh;
mod scram;

pub use jwt::UnsecuredJwtConfig;
pub use oauth::OAuthBearerClient;
pub use plain::PlainClient;
pub use refresh::{REFRESH_WINDOW, refresh_point};
pub use scram::{ScramClient, ScramHash};

use std::fmt;

/// A SASL mechanism ottla speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mechanism {
    /// `PLAIN`: user name and password in clear (use it over TLS).
    Plain,
    /// `SCRAM-SHA-256`.
    ScramSha256,
    /// `SCRAM-SHA-512`.
    ScramSha512,
    /// `OAUTHBEARER`.
    OAuthBearer,
}

impl Mechanism {
    /// The name `sasl.mechanism` and SaslHandshake use.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
            Mechanism::OAuthBearer => "OAUTHBEARER",
        }
    }

    /// Parses a mechanism name, in any case.
    pub fn parse(s: &str) -> Option<Mechanism> {
        [
            Mechanism::Plain,
            Mechanism::ScramSha256,
            Mechanism::ScramSha512,
            Mechanism::OAuthBearer,
        ]
        .into_iter()
        .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the client does after a server message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send these bytes in another SaslAuthenticate.
    Send(Vec<u8>),
    /// The exchange is complete (and, for SCRAM, the server proved it knows the
    /// password).
    Done,
}

/// Why an exchange failed on the client's side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SaslError {
    /// A server message does not follow the mechanism's grammar.
    #[error("{mechanism}: malformed server message: {detail}")]
    MalformedServerMessage {
        /// The mechanism.
        mechanism: Mechanism,
        /// What is wrong with it.
        detail: String,
    },
    /// The server's SCRAM nonce does not extend the client's.
    #[error("{mechanism}: the server nonce does not extend the client nonce")]
    NonceMismatch {
        /// The mechanism.
        mechanism: Mechanism,
    },
    /// The SCRAM iteration count is below Kafka's minimum of 4096.
    #[error("{mechanism}: {got} iterations is below the minimum of {min}")]
    IterationsTooLow {
        /// The mechanism.
        mechanism: Mechanism,
        /// What the server asked for.
        got: u32,
        /// The minimum.
        min: u32,
    },
    /// The SCRAM iteration count is above what ottla computes (2^18; Kafka stores at
    /// most 16,384): refused rather than spending minutes of CPU on it.
    #[error("{mechanism}: {got} iterations is above the maximum of {max}")]
    IterationsTooHigh {
        /// The mechanism.
        mechanism: Mechanism,
        /// What the server asked for.
        got: u32,
        /// The maximum.
        max: u32,
    },
    /// The server's SCRAM signature is wrong: it does not know the password. An
    /// authentication failure, never a success.
    #[error("{mechanism}: the server's signature does not verify (it does not know the password)")]
    ServerSignatureMismatch {
        /// The mechanism.
        mechanism: Mechanism,
    },
    /// The server reported an error inside the mechanism (SCRAM `e=`, an OAUTHBEARER
    /// JSON status).
    #[error("{mechanism}: the server says {message}")]
    ServerError {
        /// The mechanism.
        mechanism: Mechanism,
        /// Its message.
        message: String,
    },
    /// A server message came after the exchange had ended.
    #[error("{mechanism}: unexpected server message after the exchange ended")]
    UnexpectedMessage {
        /// The mechanism.
        mechanism: Mechanism,
    },
    /// An OAUTHBEARER extension with a reserved or malformed key or value (KIP-342).
    #[error("OAUTHBEARER: invalid SASL extension {key:?}")]
    InvalidExtension {
        /// The key.
        key: String,
    },
    /// The OAUTHBEARER token is not a bearer token (RFC 6750 `b64token`).
    #[error("OAUTHBEARER: the token is empty or has characters a bearer token cannot have")]
    InvalidToken,
    /// `sasl.oauthbearer.config` does not parse.
    #[error("sasl.oauthbearer.config: {0}")]
    InvalidJwtConfig(String),
}

/// One client-side exchange; a fresh one per (re-)authentication.
#[derive(Debug)]
pub enum SaslClient {
    /// `PLAIN`.
    Plain(PlainClient),
    /// `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    Scram(ScramClient),
    /// `OAUTHBEARER`.
    OAuthBearer(OAuthBearerClient),
}

impl SaslClient {
    /// `PLAIN` with an empty authorization id.
    pub fn plain(username: &str, password: &str) -> Self {
        SaslClient::Plain(PlainClient::new(username, password))
    }

    /// SCRAM with the client nonce `nonce` (printable ASCII without `,`; the driver
    /// draws 24 random bytes and encodes them in base64).
    pub fn scram(hash: ScramHash, username: &str, password: &str, nonce: &str) -> Self {
        SaslClient::Scram(ScramClient::new(hash, username, password, nonce))
    }

    /// `OAUTHBEARER` with `token` and KIP-342 `extensions`.
    pub fn oauth_bearer(token: &str, extensions: &[(String, String)]) -> Result<Self, SaslError> {
        OAuthBearerClient::new(token, extensions).map(SaslClient::OAuthBearer)
    }

    /// The mechanism.
    pub fn mechanism(&self) -> Mechanism {
        match self {
            SaslClient::Plain(_) => Mechanism::Plain,
            SaslClient::Scram(c) => c.mechanism(),
            SaslClient::OAuthBearer(_) => Mechanism::OAuthBearer,
        }
    }

    /// The first message (the first SaslAuthenticate's bytes).
    pub fn initial_response(&mut self) -> Result<Vec<u8>, SaslError> {
        match self {
            SaslClient::Plain(c) => Ok(c.initial_response()),
            SaslClient::Scram(c) => Ok(c.client_first()),
            SaslClient::OAuthBearer(c) => Ok(c.initial_response()),
        }
    }

    /// Takes the server's bytes from a SaslAuthenticate answered without error.
    pub fn handle_challenge(&mut self, server: &[u8]) -> Result<Step, SaslError> {
        match self {
            SaslClient::Plain(c) => c.handle_challenge(server),
            SaslClient::Scram(c) => c.handle_challenge(server),
            SaslClient::OAuthBearer(c) => c.handle_challenge(server),
        }
    }

    /// The error the server sent inside the exchange before failing it (OAUTHBEARER's
    /// JSON status), for the error report.
    pub fn server_error(&self) -> Option<&str> {
        match self {
            SaslClient::OAuthBearer(c) => c.server_error(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mechanism_names_parse_in_any_case() {
        for m in [
            Mechanism::Plain,
            Mechanism::ScramSha256,
            Mechanism::ScramSha512,
            Mechanism::OAuthBearer,
        ] {
            assert_eq!(Mechanism::parse(m.name()), Some(m));
            assert_eq!(Mechanism::parse(&m.name().to_lowercase()), Some(m));
        }
        assert_eq!(Mechanism::parse("GSSAPI"), None);
    }
}
