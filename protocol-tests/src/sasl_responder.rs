//! A SASL front for a broker, in test code: it answers SaslHandshake and
//! SaslAuthenticate itself (PLAIN and OAUTHBEARER, which no server on these machines
//! serves) and forwards every other request to the broker behind it once the client has
//! authenticated. It accepts in-band re-authentication (KIP-368), which tansu refuses,
//! and it enforces the rules a Kafka broker enforces, recording each breach:
//!
//! - before authentication, only ApiVersions, SaslHandshake and SaslAuthenticate
//!   (anything else closes the connection, as Kafka does);
//! - a request that arrives after the session lifetime passed closes the connection
//!   (Kafka's `connections.max.reauth.ms`);
//! - no request between a re-authentication's SaslHandshake and its last
//!   SaslAuthenticate, and no re-authentication while responses are owed.
//!
//! This is ottla's own reading of the RFCs and KIPs, not an independent server: the
//! mechanisms proven here are proven against the RFC formats only.
//!
//! The broker must advertise the responder's address (tansu's
//! `--advertised-listener-url`), so that Metadata and FindCoordinator send clients back
//! through it. ApiVersions answers are rewritten to offer SaslHandshake v0-1 and
//! SaslAuthenticate v0-2. Produce with `acks=0` (which has no answer) is not supported.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes, decode_request_header_from_buffer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Kafka's UNSUPPORTED_SASL_MECHANISM.
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
/// Kafka's ILLEGAL_SASL_STATE.
const ILLEGAL_SASL_STATE: i16 = 34;
/// Kafka's SASL_AUTHENTICATION_FAILED.
const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// What the responder accepts.
#[derive(Debug, Clone)]
pub struct ResponderOptions {
    /// The mechanisms it enables, in the order it lists them (`PLAIN`, `OAUTHBEARER`).
    pub mechanisms: Vec<&'static str>,
    /// PLAIN users and passwords.
    pub users: Vec<(String, String)>,
    /// The OAUTHBEARER principal (`sub` claim) it accepts, in unsecured JWTs whose
    /// `exp` has not passed.
    pub oauth_principal: Option<String>,
    /// RSA public keys (modulus, exponent) that OAUTHBEARER tokens must be signed with
    /// (RS256), as a broker configured with the identity provider's JWKS checks them.
    /// Empty: the signature is not checked (ottla's unsecured test tokens).
    pub oauth_rsa_keys: Vec<(Vec<u8>, Vec<u8>)>,
    /// Amazon MSK IAM instead of JWTs: OAUTHBEARER tokens must be SigV4-presigned
    /// `kafka-cluster:Connect` URLs for this region, signed with this access key and
    /// secret (as IAM checks them), and not expired; the principal is the access key.
    pub msk_iam: Option<MskIam>,
    /// The session lifetime it gives (SaslAuthenticate v1+, KIP-368); for OAUTHBEARER
    /// never past the token's expiry, as Kafka does. `None`: sessions never expire.
    pub session_lifetime: Option<Duration>,
}

impl Default for ResponderOptions {
    fn default() -> Self {
        Self {
            mechanisms: vec!["PLAIN", "OAUTHBEARER"],
            users: Vec::new(),
            oauth_principal: None,
            oauth_rsa_keys: Vec::new(),
            msk_iam: None,
            session_lifetime: None,
        }
    }
}

/// The credentials an MSK IAM responder checks tokens against.
#[derive(Debug, Clone)]
pub struct MskIam {
    /// The cluster's region.
    pub region: String,
    /// The access key id the tokens must be signed with.
    pub access_key_id: String,
    /// Its secret.
    pub secret_access_key: String,
}

/// What the responder saw, across all connections.
#[derive(Debug, Clone, Default)]
pub struct ResponderStats {
    /// Connections accepted.
    pub connections: usize,
    /// First authentications that succeeded, by mechanism.
    pub authentications: Vec<String>,
    /// In-band re-authentications that succeeded (KIP-368).
    pub reauthentications: usize,
    /// Authentications refused, with the reason.
    pub refused: Vec<String>,
    /// Rules of the protocol the client broke (each closed its connection).
    pub violations: Vec<String>,
    /// Requests forwarded to the broker.
    pub forwarded: usize,
}

/// The running responder; it stops when dropped.
#[derive(Debug)]
pub struct SaslResponder {
    address: SocketAddr,
    stats: Arc<Mutex<ResponderStats>>,
    task: tokio::task::JoinHandle<()>,
}

impl SaslResponder {
    /// Serves `listener`, forwarding authenticated traffic to `upstream`. Call from
    /// inside a tokio runtime.
    pub fn start(listener: TcpListener, upstream: SocketAddr, options: ResponderOptions) -> Self {
        let address = listener.local_addr().unwrap_or(upstream);
        let stats = Arc::new(Mutex::new(ResponderStats::default()));
        let shared = stats.clone();
        let options = Arc::new(options);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                lock(&shared).connections += 1;
                let (stats, options) = (shared.clone(), options.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let mut conn = Conn {
                        options,
                        stats,
                        auth: Auth::None,
                        pending: VecDeque::new(),
                    };
                    conn.serve(client, server).await;
                });
            }
        });
        Self {
            address,
            stats,
            task,
        }
    }

    /// `host:port` of the responder.
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// What it saw so far.
    pub fn stats(&self) -> ResponderStats {
        lock(&self.stats).clone()
    }
}

impl Drop for SaslResponder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(stats: &Mutex<ResponderStats>) -> std::sync::MutexGuard<'_, ResponderStats> {
    stats.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a connection's authentication stands.
#[derive(Debug, Clone)]
enum Auth {
    None,
    /// SaslHandshake accepted; `reauth` when the connection was authenticated before.
    Exchanging {
        mechanism: &'static str,
        reauth: bool,
        /// The principal of the first authentication (a re-authentication must keep it).
        principal: Option<String>,
        /// OAUTHBEARER sent an error challenge; the client's `%x01` ends in failure.
        failing: Option<String>,
    },
    Authenticated {
        principal: String,
        expires: Option<Instant>,
    },
}

/// A response owed to the client, in request order.
enum Slot {
    /// Forwarded; the broker's answer goes out as it is, or, for ApiVersions at this
    /// version, rewritten to offer SASL.
    Upstream { api_versions: Option<i16> },
    /// Answered here.
    Ready(Vec<u8>),
}

struct Conn {
    options: Arc<ResponderOptions>,
    stats: Arc<Mutex<ResponderStats>>,
    auth: Auth,
    pending: VecDeque<Slot>,
}

/// What to do after a client request.
enum Next {
    Continue,
    /// Send what is owed, then close.
    Close,
}

impl Conn {
    async fn serve(&mut self, client: TcpStream, server: TcpStream) {
        let (cr, mut cw) = client.into_split();
        let (sr, mut sw) = server.into_split();
        // One reader task per direction: a frame read is not cancellation-safe, so
        // the loop selects on channels instead.
        let mut from_client = frames(cr);
        let mut from_server = frames(sr);
        loop {
            tokio::select! {
                frame = from_client.recv() => {
                    let Some(frame) = frame else { return };
                    let next = self.on_request(frame, &mut sw).await;
                    if self.flush(&mut cw).await.is_err() {
                        return;
                    }
                    if matches!(next, Next::Close) {
                        // Answers the broker still owes are lost with the connection,
                        // as when Kafka closes one.
                        return;
                    }
                }
                frame = from_server.recv() => {
                    let Some(frame) = frame else { return };
                    self.on_upstream(frame);
                    if self.flush(&mut cw).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    fn violation(&self, what: String) -> Next {
        lock(&self.stats).violations.push(what);
        Next::Close
    }

    async fn on_request(
        &mut self,
        frame: Bytes,
        upstream: &mut tokio::net::tcp::OwnedWriteHalf,
    ) -> Next {
        let mut body = frame.slice(4..);
        let Ok(header) = decode_request_header_from_buffer(&mut body) else {
            return self.violation("a request header that does not decode".into());
        };
        let (api, version, correlation) = (
            header.request_api_key,
            header.request_api_version,
            header.correlation_id,
        );
        let Ok(key) = ApiKey::try_from(api) else {
            return self.violation(format!("unknown API key {api}"));
        };
        match key {
            ApiKey::SaslHandshake => self.handshake(key, version, correlation, body),
            ApiKey::SaslAuthenticate => self.authenticate(key, version, correlation, body),
            ApiKey::ApiVersions => self.forward(frame, Some(version), upstream).await,
            _ => {
                let now = Instant::now();
                match &self.auth {
                    Auth::None => self.violation(format!("{key:?} before authentication")),
                    Auth::Exchanging { reauth: true, .. } => {
                        self.violation(format!("{key:?} during a re-authentication"))
                    }
                    Auth::Exchanging { .. } => {
                        self.violation(format!("{key:?} during authentication"))
                    }
                    Auth::Authenticated {
                        expires: Some(at), ..
                    } if now >= *at => {
                        self.violation(format!("{key:?} {:?} after the session expired", now - *at))
                    }
                    Auth::Authenticated { .. } => self.forward(frame, None, upstream).await,
                }
            }
        }
    }

    async fn forward(
        &mut self,
        frame: Bytes,
        api_versions: Option<i16>,
        upstream: &mut tokio::net::tcp::OwnedWriteHalf,
    ) -> Next {
        if upstream.write_all(&frame).await.is_err() {
            return Next::Close;
        }
        if api_versions.is_none() {
            lock(&self.stats).forwarded += 1;
        }
        self.pending.push_back(Slot::Upstream { api_versions });
        Next::Continue
    }

    fn answer<R: Encodable>(&mut self, key: ApiKey, version: i16, correlation: i32, body: &R) {
        let mut out = BytesMut::new();
        out.extend_from_slice(&[0; 4]);
        let header = ResponseHeader::default().with_correlation_id(correlation);
        let encoded = header
            .encode(&mut out, key.response_header_version(version))
            .and_then(|()| body.encode(&mut out, version));
        if encoded.is_err() {
            lock(&self.stats)
                .violations
                .push(format!("{key:?} v{version}: the answer does not encode"));
            return;
        }
        let len = (out.len() - 4) as i32;
        out[..4].copy_from_slice(&len.to_be_bytes());
        self.pending.push_back(Slot::Ready(out.to_vec()));
    }

    fn handshake(&mut self, key: ApiKey, version: i16, correlation: i32, mut body: Bytes) -> Next {
        let Ok(request) = SaslHandshakeRequest::decode(&mut body, version) else {
            return self.violation("a SaslHandshake that does not decode".into());
        };
        let reauth = match &self.auth {
            Auth::None => false,
            Auth::Authenticated { .. } => {
                // KIP-368: the client re-authenticates only once nothing is owed.
                if !self.pending.is_empty() {
                    let owed = self.pending.len();
                    return self.violation(format!(
                        "re-authentication began with {owed} responses owed"
                    ));
                }
                if version < 1 {
                    return self.violation("re-authentication at SaslHandshake v0".into());
                }
                true
            }
            Auth::Exchanging { .. } => {
                return self.violation("a second SaslHandshake in one exchange".into());
            }
        };
        let wanted = request.mechanism.to_string();
        let enabled: Vec<StrBytes> = self
            .options
            .mechanisms
            .iter()
            .map(|m| StrBytes::from_static_str(m))
            .collect();
        let Some(mechanism) = self
            .options
            .mechanisms
            .iter()
            .copied()
            .find(|m| *m == wanted)
        else {
            let response = SaslHandshakeResponse::default()
                .with_error_code(UNSUPPORTED_SASL_MECHANISM)
                .with_mechanisms(enabled);
            self.answer(key, version, correlation, &response);
            lock(&self.stats)
                .refused
                .push(format!("mechanism {wanted} not enabled"));
            return Next::Close;
        };
        let principal = match &self.auth {
            Auth::Authenticated { principal, .. } => Some(principal.clone()),
            _ => None,
        };
        self.auth = Auth::Exchanging {
            mechanism,
            reauth,
            principal,
            failing: None,
        };
        let response = SaslHandshakeResponse::default().with_mechanisms(enabled);
        self.answer(key, version, correlation, &response);
        Next::Continue
    }

    fn authenticate(
        &mut self,
        key: ApiKey,
        version: i16,
        correlation: i32,
        mut body: Bytes,
    ) -> Next {
        let Ok(request) = SaslAuthenticateRequest::decode(&mut body, version) else {
            return self.violation("a SaslAuthenticate that does not decode".into());
        };
        let Auth::Exchanging {
            mechanism,
            reauth,
            principal: before,
            failing,
            ..
        } = self.auth.clone()
        else {
            let response = SaslAuthenticateResponse::default()
                .with_error_code(ILLEGAL_SASL_STATE)
                .with_error_message(Some(StrBytes::from_static_str(
                    "SaslAuthenticate without SaslHandshake",
                )));
            self.answer(key, version, correlation, &response);
            return self.violation("SaslAuthenticate without a SaslHandshake".into());
        };
        if let Some(reason) = failing {
            // The client acknowledged the OAUTHBEARER error challenge (RFC 7628 §3.2.3).
            return self.refuse(key, version, correlation, reason);
        }
        let now = SystemTime::now();
        let outcome = match mechanism {
            "PLAIN" => self.check_plain(&request.auth_bytes),
            _ => self.check_oauth(&request.auth_bytes, now),
        };
        let (principal, token_expiry) = match outcome {
            Ok(ok) => ok,
            Err(reason) if mechanism == "OAUTHBEARER" => {
                // KIP-255: the server answers with a JSON error challenge first.
                if let Auth::Exchanging { failing, .. } = &mut self.auth {
                    *failing = Some(reason);
                }
                let challenge = br#"{"status":"invalid_token"}"#;
                let response = SaslAuthenticateResponse::default()
                    .with_auth_bytes(Bytes::from_static(challenge));
                self.answer(key, version, correlation, &response);
                return Next::Continue;
            }
            Err(reason) => return self.refuse(key, version, correlation, reason),
        };
        if let Some(before) = before.filter(|b| *b != principal) {
            return self.refuse(
                key,
                version,
                correlation,
                format!("re-authentication as {principal}, not {before}"),
            );
        }
        let lifetime = match (self.options.session_lifetime, token_expiry) {
            (Some(l), Some(exp)) => Some(l.min(exp.duration_since(now).unwrap_or_default())),
            (l, None) => l,
            (None, Some(exp)) => Some(exp.duration_since(now).unwrap_or_default()),
        }
        .filter(|_| version >= 1);
        let mut response = SaslAuthenticateResponse::default();
        if let Some(l) = lifetime {
            response = response.with_session_lifetime_ms(l.as_millis() as i64);
        }
        self.auth = Auth::Authenticated {
            principal,
            expires: lifetime.map(|l| Instant::now() + l),
        };
        {
            let mut stats = lock(&self.stats);
            if reauth {
                stats.reauthentications += 1;
            } else {
                stats.authentications.push(mechanism.to_string());
            }
        }
        self.answer(key, version, correlation, &response);
        Next::Continue
    }

    fn refuse(&mut self, key: ApiKey, version: i16, correlation: i32, reason: String) -> Next {
        let response = SaslAuthenticateResponse::default()
            .with_error_code(SASL_AUTHENTICATION_FAILED)
            .with_error_message(Some(StrBytes::from_string(format!(
                "Authentication failed: {reason}"
            ))));
        self.answer(key, version, correlation, &response);
        lock(&self.stats).refused.push(reason);
        Next::Close
    }

    /// `authzid NUL user NUL password` (RFC 4616).
    fn check_plain(&self, message: &[u8]) -> Result<(String, Option<SystemTime>), String> {
        let parts: Vec<&[u8]> = message.split(|b| *b == 0).collect();
        let [authzid, user, password] = parts.as_slice() else {
            return Err("a PLAIN message without three fields".into());
        };
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| "not UTF-8".to_string());
        let (authzid, user, password) = (text(authzid)?, text(user)?, text(password)?);
        if !authzid.is_empty() && authzid != user {
            return Err(format!("authorization id {authzid} is not {user}"));
        }
        let known = self
            .options
            .users
            .iter()
            .any(|(u, p)| *u == user && *p == password);
        if !known {
            return Err("Invalid username or password".into());
        }
        Ok((user, None))
    }

    /// `n,,%x01auth=Bearer <token>%x01[key=value%x01]*%x01` (RFC 7628 §3.1) with an
    /// unsecured JWT whose `sub` is the accepted principal and whose `exp` lies ahead.
    fn check_oauth(
        &self,
        message: &[u8],
        now: SystemTime,
    ) -> Result<(String, Option<SystemTime>), String> {
        let text = std::str::from_utf8(message).map_err(|_| "not UTF-8".to_string())?;
        let rest = text
            .strip_prefix("n,,\x01")
            .ok_or("no gs2 header (n,,) and separator")?;
        let rest = rest
            .strip_suffix("\x01\x01")
            .ok_or("not ended by two separators")?;
        let mut token = None;
        for pair in rest.split('\x01') {
            let (k, v) = pair.split_once('=').ok_or("a pair without =")?;
            if k == "auth" {
                token = v.strip_prefix("Bearer ");
            }
        }
        let token = token.ok_or("no auth=Bearer")?;
        if let Some(msk) = &self.options.msk_iam {
            return check_msk_iam(token, msk, now);
        }
        if !self.options.oauth_rsa_keys.is_empty() {
            verify_rs256(token, &self.options.oauth_rsa_keys)?;
        }
        let claims = token.split('.').nth(1).ok_or("not a JWT")?;
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(claims)
            .map_err(|_| "the claims are not base64url".to_string())?;
        let claims = String::from_utf8(claims).map_err(|_| "the claims are not UTF-8")?;
        let sub = string_claim(&claims, "sub").ok_or("no sub claim")?;
        let exp = number_claim(&claims, "exp").ok_or("no exp claim")?;
        let expires = SystemTime::UNIX_EPOCH + Duration::from_secs(exp.max(0) as u64);
        if expires <= now {
            return Err(format!("the token for {sub} expired"));
        }
        if self.options.oauth_principal.as_deref() != Some(sub.as_str()) {
            return Err(format!("principal {sub} is not accepted"));
        }
        Ok((sub, Some(expires)))
    }

    fn on_upstream(&mut self, frame: Bytes) {
        let Some(at) = self
            .pending
            .iter()
            .position(|s| matches!(s, Slot::Upstream { .. }))
        else {
            lock(&self.stats)
                .violations
                .push("the broker answered a request nobody sent".into());
            return;
        };
        let frame = match &self.pending[at] {
            Slot::Upstream {
                api_versions: Some(version),
            } => offer_sasl(&frame, *version).unwrap_or_else(|| frame.to_vec()),
            _ => frame.to_vec(),
        };
        self.pending[at] = Slot::Ready(frame);
    }

    async fn flush(&mut self, client: &mut tokio::net::tcp::OwnedWriteHalf) -> std::io::Result<()> {
        while let Some(Slot::Ready(_)) = self.pending.front() {
            if let Some(Slot::Ready(bytes)) = self.pending.pop_front() {
                client.write_all(&bytes).await?;
            }
        }
        Ok(())
    }
}

/// The broker's ApiVersions answer with SaslHandshake v0-1 and SaslAuthenticate v0-2
/// added; `None` when it is an error (left as it is).
fn offer_sasl(frame: &[u8], version: i16) -> Option<Vec<u8>> {
    let mut body = Bytes::copy_from_slice(frame.get(4..)?);
    // ApiVersions answers always have the v0 response header (KIP-511).
    let header = ResponseHeader::decode(&mut body, 0).ok()?;
    let mut response = ApiVersionsResponse::decode(&mut body, version).ok()?;
    if response.error_code != 0 || body.has_remaining() {
        return None;
    }
    for (key, max) in [(ApiKey::SaslHandshake, 1), (ApiKey::SaslAuthenticate, 2)] {
        response.api_keys.retain(|a| a.api_key != key as i16);
        response.api_keys.push(
            ApiVersion::default()
                .with_api_key(key as i16)
                .with_min_version(0)
                .with_max_version(max),
        );
    }
    let mut out = BytesMut::new();
    out.extend_from_slice(&[0; 4]);
    header.encode(&mut out, 0).ok()?;
    response.encode(&mut out, version).ok()?;
    let len = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Some(out.to_vec())
}

/// An MSK IAM token: the presigned URL's fields, its signature recomputed with the
/// secret (the SigV4 steps are ottla-proto's, themselves checked against AWS's test
/// suite and the Python signer), and its expiry.
fn check_msk_iam(
    token: &str,
    msk: &MskIam,
    now: SystemTime,
) -> Result<(String, Option<SystemTime>), String> {
    use ottla_proto::sasl::msk_iam::sigv4;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| "not base64url without padding".to_string())?;
    let url = String::from_utf8(url).map_err(|_| "not UTF-8".to_string())?;
    let host = format!("kafka.{}.amazonaws.com", msk.region);
    let query = url
        .strip_prefix(&format!("https://{host}/?"))
        .ok_or_else(|| format!("not a URL of {host}"))?;
    let mut fields = Vec::new();
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').ok_or("a field without =")?;
        fields.push((percent_decode(k)?, percent_decode(v)?));
    }
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .ok_or(format!("no {name}"))
    };
    if get("Action")? != "kafka-cluster:Connect"
        || get("X-Amz-Algorithm")? != "AWS4-HMAC-SHA256"
        || get("X-Amz-SignedHeaders")? != "host"
        || get("X-Amz-Expires")? != "900"
    {
        return Err("not a kafka-cluster:Connect presigned URL".into());
    }
    let date = get("X-Amz-Date")?;
    let day = date.get(..8).ok_or("a short X-Amz-Date")?;
    let scope = format!("{day}/{}/kafka-cluster/aws4_request", msk.region);
    if get("X-Amz-Credential")? != format!("{}/{scope}", msk.access_key_id) {
        return Err(format!(
            "signed by another key or scope: {}",
            get("X-Amz-Credential")?
        ));
    }
    let signed: Vec<(&str, &str)> = fields
        .iter()
        .filter(|(k, _)| k != "X-Amz-Signature" && k != "User-Agent")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let canonical = sigv4::canonical_request(
        "GET",
        "/",
        &sigv4::canonical_query(&signed),
        &[("host", &host)],
        sigv4::EMPTY_SHA256,
    );
    let key = sigv4::signing_key(&msk.secret_access_key, day, &msk.region, "kafka-cluster");
    let expected = sigv4::signature(&key, &sigv4::string_to_sign(date, &scope, &canonical));
    if get("X-Amz-Signature")? != expected {
        return Err("the token's signature does not verify".into());
    }
    let signed_at = amz_date_secs(date).ok_or("X-Amz-Date does not parse")?;
    let expires = SystemTime::UNIX_EPOCH + Duration::from_secs(signed_at + 900);
    if expires <= now {
        return Err(format!("the token of {} expired", msk.access_key_id));
    }
    Ok((msk.access_key_id.clone(), Some(expires)))
}

/// `YYYYMMDDTHHMMSSZ` to seconds since the epoch (Howard Hinnant's days_from_civil).
fn amz_date_secs(date: &str) -> Option<u64> {
    let n = |r: std::ops::Range<usize>| date.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (hh, mm, ss) = (n(9..11)?, n(11..13)?, n(13..15)?);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or("a cut-off escape")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| "a bad escape".to_string())?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "not UTF-8".to_string())
}

/// Checks a JWT's RS256 signature against any of `keys` (RFC 7515: the signature is
/// over `header.claims`).
fn verify_rs256(token: &str, keys: &[(Vec<u8>, Vec<u8>)]) -> Result<(), String> {
    let (signed, signature) = token.rsplit_once('.').ok_or("not a JWT")?;
    let header = signed.split('.').next().unwrap_or_default();
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| "the header is not base64url".to_string())?;
    if !String::from_utf8_lossy(&header).contains("\"RS256\"") {
        return Err("the token is not signed with RS256".into());
    }
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| "the signature is not base64url".to_string())?;
    let ok = keys.iter().any(|(n, e)| {
        ring::signature::RsaPublicKeyComponents { n, e }
            .verify(
                &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                signed.as_bytes(),
                &signature,
            )
            .is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err("the token's signature does not verify".into())
    }
}

/// `"name":"value"` in a flat JSON object (enough for the tokens ottla's tests make).
fn string_claim(json: &str, name: &str) -> Option<String> {
    let at = json.find(&format!("\"{name}\":\""))? + name.len() + 4;
    let end = json.get(at..)?.find('"')?;
    json.get(at..at + end).map(str::to_string)
}

/// `"name":123` in a flat JSON object.
fn number_claim(json: &str, name: &str) -> Option<i64> {
    let at = json.find(&format!("\"{name}\":"))? + name.len() + 3;
    let digits: String = json
        .get(at..)?
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits.parse().ok()
}

/// The frames read from `stream`, until it ends; the reader stops when the receiver is
/// dropped.
fn frames<R: AsyncRead + Unpin + Send + 'static>(
    mut stream: R,
) -> tokio::sync::mpsc::Receiver<Bytes> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        while let Some(frame) = read_frame(&mut stream).await {
            if tx.send(frame).await.is_err() {
                break;
            }
        }
    });
    rx
}

async fn read_frame<R: AsyncRead + Unpin>(stream: &mut R) -> Option<Bytes> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await.ok()?;
    let n = usize::try_from(i32::from_be_bytes(len)).ok()?;
    if n > 64 << 20 {
        return None;
    }
    let mut frame = vec![0u8; n + 4];
    frame[..4].copy_from_slice(&len);
    stream.read_exact(&mut frame[4..]).await.ok()?;
    Some(Bytes::from(frame))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amz_dates_parse_to_epoch_seconds() {
        assert_eq!(amz_date_secs("19700101T000000Z"), Some(0));
        assert_eq!(amz_date_secs("20240301T123456Z"), Some(1_709_296_496));
        assert_eq!(amz_date_secs("20240229T000000Z"), Some(1_709_164_800));
        assert_eq!(amz_date_secs("2024"), None);
    }

    #[test]
    fn claims_are_read_from_ottlas_unsecured_tokens() {
        let config = ottla_proto::sasl::UnsecuredJwtConfig::parse("principal=svc lifeSeconds=30")
            .expect("config");
        let (token, exp_ms) = config.token(1_700_000_000_000);
        let claims = token.split('.').nth(1).expect("claims");
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(claims)
            .expect("base64url");
        let claims = String::from_utf8(claims).expect("utf-8");
        assert_eq!(string_claim(&claims, "sub").as_deref(), Some("svc"));
        assert_eq!(number_claim(&claims, "exp"), Some(exp_ms / 1000));
    }
}
