//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), as Kafka's `ScramSaslClient`
//! speaks them: gs2 header `n,,`, no channel binding, at least 4096 iterations, and
//! the server's signature checked before the exchange counts as done.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};

use super::{Mechanism, SaslError, Step};

/// Kafka's minimum iteration count (`ScramMechanism.minIterations`).
const MIN_ITERATIONS: u32 = 4096;
/// The most iterations ottla will compute. Kafka stores credentials with at most 16,384
/// (`ScramMechanism.maxIterations`); this leaves room for other brokers, while a server
/// (or anything answering on its port) asking for `i=4294967295` gets an error instead
/// of hours of PBKDF2 on a runtime thread.
const MAX_ITERATIONS: u32 = 1 << 18;
/// base64("n,,"): the gs2 header, echoed in the client-final message.
const CHANNEL_BINDING: &str = "biws";

/// The hash of a SCRAM mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScramHash {
    /// SHA-256.
    Sha256,
    /// SHA-512.
    Sha512,
}

/// A SCRAM exchange.
pub struct ScramClient {
    hash: ScramHash,
    password: String,
    client_first_bare: String,
    nonce: String,
    state: State,
}

enum State {
    Initial,
    /// client-first sent; waiting for server-first.
    First,
    /// client-final sent; the server's signature must be this.
    Final {
        expected: Vec<u8>,
    },
    Done,
}

impl std::fmt::Debug for ScramClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramClient")
            .field("hash", &self.hash)
            .field("password", &"[redacted]")
            .finish_non_exhaustive()
    }
}

impl ScramClient {
    /// The exchange for `username` and `password` with the client nonce `nonce`.
    pub fn new(hash: ScramHash, username: &str, password: &str, nonce: &str) -> Self {
        Self {
            hash,
            password: password.to_string(),
            client_first_bare: format!("n={},r={nonce}", saslname(username)),
            nonce: nonce.to_string(),
            state: State::Initial,
        }
    }

    /// `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub fn mechanism(&self) -> Mechanism {
        match self.hash {
            ScramHash::Sha256 => Mechanism::ScramSha256,
            ScramHash::Sha512 => Mechanism::ScramSha512,
        }
    }

    /// `n,,n=<user>,r=<nonce>`.
    pub fn client_first(&mut self) -> Vec<u8> {
        self.state = State::First;
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// server-first gives client-final; server-final ends the exchange.
    pub fn handle_challenge(&mut self, server: &[u8]) -> Result<Step, SaslError> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::First => self.client_final(server).map(Step::Send),
            State::Final { expected } => self.check_server_final(server, &expected),
            State::Initial | State::Done => Err(SaslError::UnexpectedMessage {
                mechanism: self.mechanism(),
            }),
        }
    }

    fn client_final(&mut self, server: &[u8]) -> Result<Vec<u8>, SaslError> {
        let mechanism = self.mechanism();
        let server_first = std::str::from_utf8(server).map_err(|_| self.malformed("not UTF-8"))?;
        let attrs = attributes(server_first);
        if let Some(e) = attr(&attrs, 'e') {
            return Err(SaslError::ServerError {
                mechanism,
                message: e.to_string(),
            });
        }
        if attr(&attrs, 'm').is_some() {
            return Err(self.malformed("a mandatory extension (m=) is not supported"));
        }
        let nonce = attr(&attrs, 'r').ok_or_else(|| self.malformed("no nonce (r=)"))?;
        if !nonce.starts_with(&self.nonce) || nonce.len() <= self.nonce.len() {
            return Err(SaslError::NonceMismatch { mechanism });
        }
        let salt = attr(&attrs, 's').ok_or_else(|| self.malformed("no salt (s=)"))?;
        let salt = B64
            .decode(salt)
            .map_err(|_| self.malformed("the salt is not base64"))?;
        let iterations: u32 = attr(&attrs, 'i')
            .ok_or_else(|| self.malformed("no iteration count (i=)"))?
            .parse()
            .map_err(|_| self.malformed("the iteration count is not a number"))?;
        if iterations < MIN_ITERATIONS {
            return Err(SaslError::IterationsTooLow {
                mechanism,
                got: iterations,
                min: MIN_ITERATIONS,
            });
        }
        if iterations > MAX_ITERATIONS {
            return Err(SaslError::IterationsTooHigh {
                mechanism,
                got: iterations,
                max: MAX_ITERATIONS,
            });
        }
        let without_proof = format!("c={CHANNEL_BINDING},r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let keys = Keys::derive(self.hash, self.password.as_bytes(), &salt, iterations);
        let signature = hmac(self.hash, &keys.stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = keys
            .client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        self.state = State::Final {
            expected: hmac(self.hash, &keys.server_key, auth_message.as_bytes()),
        };
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    fn check_server_final(&mut self, server: &[u8], expected: &[u8]) -> Result<Step, SaslError> {
        let mechanism = self.mechanism();
        let server_final = std::str::from_utf8(server).map_err(|_| self.malformed("not UTF-8"))?;
        let attrs = attributes(server_final);
        if let Some(e) = attr(&attrs, 'e') {
            return Err(SaslError::ServerError {
                mechanism,
                message: e.to_string(),
            });
        }
        let verifier = attr(&attrs, 'v').ok_or_else(|| self.malformed("no verifier (v=)"))?;
        let got = B64
            .decode(verifier)
            .map_err(|_| self.malformed("the verifier is not base64"))?;
        if !constant_time_eq(&got, expected) {
            return Err(SaslError::ServerSignatureMismatch { mechanism });
        }
        Ok(Step::Done)
    }

    fn malformed(&self, detail: &str) -> SaslError {
        SaslError::MalformedServerMessage {
            mechanism: self.mechanism(),
            detail: detail.to_string(),
        }
    }
}

/// ClientKey, StoredKey and ServerKey (RFC 5802 §3).
struct Keys {
    client_key: Vec<u8>,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl Keys {
    fn derive(hash: ScramHash, password: &[u8], salt: &[u8], iterations: u32) -> Self {
        let salted = match hash {
            ScramHash::Sha256 => {
                pbkdf2::pbkdf2_hmac_array::<Sha256, 32>(password, salt, iterations).to_vec()
            }
            ScramHash::Sha512 => {
                pbkdf2::pbkdf2_hmac_array::<Sha512, 64>(password, salt, iterations).to_vec()
            }
        };
        let client_key = hmac(hash, &salted, b"Client Key");
        let stored_key = match hash {
            ScramHash::Sha256 => Sha256::digest(&client_key).to_vec(),
            ScramHash::Sha512 => Sha512::digest(&client_key).to_vec(),
        };
        let server_key = hmac(hash, &salted, b"Server Key");
        Self {
            client_key,
            stored_key,
            server_key,
        }
    }
}

fn hmac(hash: ScramHash, key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
    match hash {
        ScramHash::Sha256 => Hmac::<Sha256>::new_from_slice(key)
            .map(|mut m| {
                m.update(data);
                m.finalize().into_bytes().to_vec()
            })
            .unwrap_or_default(),
        ScramHash::Sha512 => Hmac::<Sha512>::new_from_slice(key)
            .map(|mut m| {
                m.update(data);
                m.finalize().into_bytes().to_vec()
            })
            .unwrap_or_default(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `=` and `,` escaped in a SCRAM user name (RFC 5802 §5.1).
fn saslname(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

/// `a=value` pairs of a SCRAM message (a value may itself contain `=`).
fn attributes(message: &str) -> Vec<(char, &str)> {
    message
        .split(',')
        .filter_map(|part| {
            let mut chars = part.chars();
            let name = chars.next()?;
            let value = part.get(1..)?.strip_prefix('=')?;
            Some((name, value))
        })
        .collect()
}

fn attr<'a>(attrs: &[(char, &'a str)], name: char) -> Option<&'a str> {
    attrs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 7677 §3.
    const RFC7677_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
    const RFC7677_SERVER_FIRST: &str =
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";

    fn first(hash: ScramHash, nonce: &str) -> ScramClient {
        let mut c = ScramClient::new(hash, "user", "pencil", nonce);
        let _ = c.client_first();
        c
    }

    #[test]
    fn rfc_7677_scram_sha_256_vector() {
        let mut c = ScramClient::new(ScramHash::Sha256, "user", "pencil", RFC7677_NONCE);
        assert_eq!(c.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let Ok(Step::Send(client_final)) = c.handle_challenge(RFC7677_SERVER_FIRST.as_bytes())
        else {
            panic!("no client-final");
        };
        assert_eq!(
            String::from_utf8(client_final).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert_eq!(
            c.handle_challenge(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
            Ok(Step::Done)
        );
    }

    /// No RFC gives a SCRAM-SHA-512 vector. This one was computed with Python's
    /// hashlib and hmac (an independent implementation), for the RFC 7677 inputs:
    ///
    /// ```text
    /// salted = hashlib.pbkdf2_hmac('sha512', b'pencil', base64.b64decode('W22ZaJ0SNY7soEsUEjb6gQ=='), 4096)
    /// ck = hmac.new(salted, b'Client Key', 'sha512').digest(); sk = hashlib.sha512(ck).digest()
    /// am = b'n=user,r=N,' + server_first + b',c=biws,r=' + nonce
    /// proof = xor(ck, hmac.new(sk, am, 'sha512').digest())
    /// v = hmac.new(hmac.new(salted, b'Server Key', 'sha512').digest(), am, 'sha512').digest()
    /// ```
    #[test]
    fn scram_sha_512_matches_an_independent_implementation() {
        let mut c = first(ScramHash::Sha512, RFC7677_NONCE);
        let Ok(Step::Send(client_final)) = c.handle_challenge(RFC7677_SERVER_FIRST.as_bytes())
        else {
            panic!("no client-final");
        };
        let client_final = String::from_utf8(client_final).unwrap();
        assert_eq!(
            client_final,
            format!("c=biws,r={},p={}", SHA512_NONCE, SHA512_PROOF)
        );
        assert_eq!(
            c.handle_challenge(format!("v={SHA512_VERIFIER}").as_bytes()),
            Ok(Step::Done)
        );
    }

    const SHA512_NONCE: &str = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
    const SHA512_PROOF: &str =
        "gMGXRcevScNtxZ6/8lQYpGtnsNAc3mGcmNomv+xnoOMw+3R2xNJdMNnzMlTN8PPC6wdp6dybEmDYXYTxwnYPJQ==";
    const SHA512_VERIFIER: &str =
        "ZQnYEgWQMFmmsM8aQMF0nDDCy/AgCzkwk8CmMZYcMg0vSVlKDanekLtifDSeVGT4+5ZxXnJq199RVG2rR7N7Zw==";

    #[test]
    fn an_absurd_iteration_count_is_refused_before_any_hashing() {
        let mut c = first(ScramHash::Sha512, "abc");
        let err = c.handle_challenge(b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4294967295");
        assert_eq!(
            err,
            Err(SaslError::IterationsTooHigh {
                mechanism: Mechanism::ScramSha512,
                got: u32::MAX,
                max: MAX_ITERATIONS,
            })
        );
    }

    #[test]
    fn a_wrong_server_signature_fails() {
        let mut c = first(ScramHash::Sha256, RFC7677_NONCE);
        c.handle_challenge(RFC7677_SERVER_FIRST.as_bytes()).unwrap();
        assert_eq!(
            c.handle_challenge(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
            Err(SaslError::ServerSignatureMismatch {
                mechanism: Mechanism::ScramSha256
            })
        );
    }

    #[test]
    fn the_server_nonce_must_extend_ours() {
        let mut c = first(ScramHash::Sha256, "abc");
        let err = c.handle_challenge(b"r=xyzdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096");
        assert!(
            matches!(err, Err(SaslError::NonceMismatch { .. })),
            "{err:?}"
        );
        let mut c = first(ScramHash::Sha256, "abc");
        let err = c.handle_challenge(b"r=abc,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096");
        assert!(
            matches!(err, Err(SaslError::NonceMismatch { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn fewer_than_4096_iterations_are_refused() {
        let mut c = first(ScramHash::Sha256, "abc");
        let err = c.handle_challenge(b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4095");
        assert!(
            matches!(err, Err(SaslError::IterationsTooLow { got: 4095, .. })),
            "{err:?}"
        );
    }

    #[test]
    fn a_server_error_is_reported() {
        let mut c = first(ScramHash::Sha256, RFC7677_NONCE);
        c.handle_challenge(RFC7677_SERVER_FIRST.as_bytes()).unwrap();
        let err = c.handle_challenge(b"e=invalid-proof").unwrap_err();
        assert_eq!(
            err,
            SaslError::ServerError {
                mechanism: Mechanism::ScramSha256,
                message: "invalid-proof".into()
            }
        );
        assert!(!format!("{c:?}").contains("pencil"));
    }

    #[test]
    fn user_names_are_escaped() {
        let mut c = ScramClient::new(ScramHash::Sha256, "a=b,c", "p", "n");
        assert_eq!(c.client_first(), b"n,,n=a=3Db=2Cc,r=n");
    }

    #[test]
    fn malformed_server_messages_are_errors() {
        for bad in [
            &b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"[..],
            b"r=abcdef,i=4096",
            b"r=abcdef,s=!!!,i=4096",
            b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==",
            b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=many",
            b"m=ext,r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            b"\xff\xfe",
        ] {
            let mut c = first(ScramHash::Sha256, "abc");
            assert!(
                matches!(
                    c.handle_challenge(bad),
                    Err(SaslError::MalformedServerMessage { .. })
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut c = first(ScramHash::Sha256, RFC7677_NONCE);
        c.handle_challenge(RFC7677_SERVER_FIRST.as_bytes()).unwrap();
        assert!(c.handle_challenge(b"v=not base64!").is_err());
        assert!(c.handle_challenge(b"v=x").is_err(), "after the end");
    }

    proptest! {
        #[test]
        fn arbitrary_server_bytes_never_panic(first_msg in proptest::collection::vec(any::<u8>(), 0..128),
                                              second in proptest::collection::vec(any::<u8>(), 0..128)) {
            let mut c = ScramClient::new(ScramHash::Sha256, "u", "p", "abc");
            let _ = c.client_first();
            let _ = c.handle_challenge(&first_msg);
            let _ = c.handle_challenge(&second);
            let mut c = ScramClient::new(ScramHash::Sha512, "u", "p", "abc");
            let _ = c.client_first();
            let mut m = b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".to_vec();
            m.extend_from_slice(&first_msg);
            let _ = c.handle_challenge(&m);
            let _ = c.handle_challenge(&second);
        }
    }
}
