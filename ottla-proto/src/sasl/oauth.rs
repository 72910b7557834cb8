//! `OAUTHBEARER` (RFC 7628) as Kafka uses it (KIP-255), with SASL extensions (KIP-342).

use super::{Mechanism, SaslError, Step};

/// An `OAUTHBEARER` exchange.
pub struct OAuthBearerClient {
    message: Vec<u8>,
    state: State,
    server_error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Initial,
    Sent,
    /// The server sent an error; the client answered `%x01` and waits for the failure.
    Failing,
    Done,
}

impl std::fmt::Debug for OAuthBearerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthBearerClient")
            .field("token", &"[redacted]")
            .field("state", &self.state)
            .finish()
    }
}

impl OAuthBearerClient {
    /// The exchange for `token`, with `extensions` (keys `[A-Za-z]+` and not `auth`;
    /// values of printable characters, RFC 7628 §3.1).
    pub fn new(token: &str, extensions: &[(String, String)]) -> Result<Self, SaslError> {
        if !is_b64token(token) {
            return Err(SaslError::InvalidToken);
        }
        let mut message = format!("n,,\x01auth=Bearer {token}\x01").into_bytes();
        for (key, value) in extensions {
            let key_ok =
                !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphabetic()) && key != "auth";
            let value_ok = value
                .bytes()
                .all(|b| matches!(b, 0x21..=0x7e | b' ' | b'\t' | b'\r' | b'\n'));
            if !key_ok || !value_ok {
                return Err(SaslError::InvalidExtension { key: key.clone() });
            }
            message.extend_from_slice(format!("{key}={value}\x01").as_bytes());
        }
        message.push(0x01);
        Ok(Self {
            message,
            state: State::Initial,
            server_error: None,
        })
    }

    /// The client's only real message.
    pub fn initial_response(&mut self) -> Vec<u8> {
        self.state = State::Sent;
        std::mem::take(&mut self.message)
    }

    /// An empty answer accepts the token. A non-empty one is the server's JSON error;
    /// RFC 7628 §3.2.3 has the client answer it with `%x01`, and the broker then fails
    /// the exchange.
    pub fn handle_challenge(&mut self, server: &[u8]) -> Result<Step, SaslError> {
        match self.state {
            State::Sent if server.is_empty() => {
                self.state = State::Done;
                Ok(Step::Done)
            }
            State::Sent => {
                self.server_error = Some(String::from_utf8_lossy(server).into_owned());
                self.state = State::Failing;
                Ok(Step::Send(vec![0x01]))
            }
            State::Failing => Err(SaslError::ServerError {
                mechanism: Mechanism::OAuthBearer,
                message: self.server_error.clone().unwrap_or_default(),
            }),
            State::Initial | State::Done => Err(SaslError::UnexpectedMessage {
                mechanism: Mechanism::OAuthBearer,
            }),
        }
    }

    /// The server's JSON error, if it sent one.
    pub fn server_error(&self) -> Option<&str> {
        self.server_error.as_deref()
    }
}

/// RFC 6750: `b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
fn is_b64token(token: &str) -> bool {
    let body = token.trim_end_matches('=');
    !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initial_response_is_rfc_7628() {
        let ext = vec![("traceId".to_string(), "123".to_string())];
        let mut c = OAuthBearerClient::new("eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.", &ext).unwrap();
        assert_eq!(
            c.initial_response(),
            b"n,,\x01auth=Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.\x01traceId=123\x01\x01"
        );
        assert_eq!(c.handle_challenge(b""), Ok(Step::Done));
        assert!(c.handle_challenge(b"").is_err());
    }

    #[test]
    fn a_server_error_is_answered_with_x01_then_kept() {
        let mut c = OAuthBearerClient::new("tok", &[]).unwrap();
        let _ = c.initial_response();
        let json = br#"{"status":"invalid_token"}"#;
        assert_eq!(c.handle_challenge(json), Ok(Step::Send(vec![1])));
        assert_eq!(c.server_error(), Some(r#"{"status":"invalid_token"}"#));
        assert!(matches!(
            c.handle_challenge(b"x"),
            Err(SaslError::ServerError { .. })
        ));
    }

    #[test]
    fn bad_tokens_and_extensions_are_refused_without_quoting_them() {
        let e = OAuthBearerClient::new("has space secret", &[]).unwrap_err();
        assert!(!e.to_string().contains("secret"));
        assert!(OAuthBearerClient::new("", &[]).is_err());
        for key in ["auth", "", "a1", "x-y"] {
            let ext = vec![(key.to_string(), "v".to_string())];
            assert!(OAuthBearerClient::new("t", &ext).is_err(), "{key}");
        }
        let ext = vec![("k".to_string(), "bad\x01value".to_string())];
        assert!(OAuthBearerClient::new("t", &ext).is_err());
        let c = OAuthBearerClient::new("secrettoken", &[]).unwrap();
        assert!(!format!("{c:?}").contains("secrettoken"));
    }
}
