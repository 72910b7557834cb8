//! `PLAIN` (RFC 4616): `authzid NUL authcid NUL passwd`, with an empty authzid.

use super::{Mechanism, SaslError, Step};

/// A `PLAIN` exchange.
pub struct PlainClient {
    message: Vec<u8>,
    sent: bool,
}

impl std::fmt::Debug for PlainClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlainClient([redacted])")
    }
}

impl PlainClient {
    /// The exchange for `username` and `password`.
    pub fn new(username: &str, password: &str) -> Self {
        let mut message = Vec::with_capacity(2 + username.len() + password.len());
        message.push(0);
        message.extend_from_slice(username.as_bytes());
        message.push(0);
        message.extend_from_slice(password.as_bytes());
        Self {
            message,
            sent: false,
        }
    }

    /// The only client message.
    pub fn initial_response(&mut self) -> Vec<u8> {
        self.sent = true;
        std::mem::take(&mut self.message)
    }

    /// The server answers an accepted login with nothing.
    pub fn handle_challenge(&mut self, server: &[u8]) -> Result<Step, SaslError> {
        if !self.sent || !server.is_empty() {
            return Err(SaslError::UnexpectedMessage {
                mechanism: Mechanism::Plain,
            });
        }
        Ok(Step::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_rfc_4616() {
        let mut c = PlainClient::new("alice", "hunter2");
        assert_eq!(c.initial_response(), b"\0alice\0hunter2");
        assert!(!format!("{c:?}").contains("hunter2"));
        assert_eq!(c.handle_challenge(b""), Ok(Step::Done));
        let mut c = PlainClient::new("alice", "hunter2");
        let _ = c.initial_response();
        assert!(c.handle_challenge(b"more?").is_err());
    }
}
