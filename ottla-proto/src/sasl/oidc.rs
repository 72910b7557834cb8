//! OAUTHBEARER tokens from an OIDC token endpoint with the client-credentials grant
//! (RFC 6749 §4.4; KIP-768, librdkafka's `sasl.oauthbearer.method=oidc`), as pure
//! functions: the endpoint's URL parsed, the HTTP/1.1 request written, the answer's
//! bytes read into a token or an error that names the setting to look at. The driver
//! opens the connection, sends the bytes, reads until the server closes and hands them
//! back with the time.
//!
//! Nothing here prints a secret: the request (which carries the client secret) is
//! returned as bytes and never formatted, and no error quotes the token.

use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD as B64, URL_SAFE_NO_PAD as B64URL};

/// The most of an answer the driver reads (a token endpoint's answer is a few KiB).
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// Why no token came from the endpoint. Each names the setting to look at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OidcError {
    /// `sasl.oauthbearer.token.endpoint.url` is not an `http://` or `https://` URL.
    #[error("sasl.oauthbearer.token.endpoint.url: {0}")]
    BadUrl(String),
    /// The endpoint answered with an HTTP error (401 for wrong client credentials).
    #[error(
        "sasl.oauthbearer.token.endpoint.url answered HTTP {status}{}{}{}",
        error.as_ref().map(|e| format!(": {e}")).unwrap_or_default(),
        description.as_ref().map(|d| format!(" ({d})")).unwrap_or_default(),
        hint(*status, error.as_deref())
    )]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The body's `error` (RFC 6749 §5.2), e.g. `invalid_client`.
        error: Option<String>,
        /// The body's `error_description`.
        description: Option<String>,
    },
    /// The answer is not HTTP, or its body is not the JSON a token endpoint sends.
    #[error("sasl.oauthbearer.token.endpoint.url: {0}")]
    Malformed(String),
    /// The answer has no `access_token`.
    #[error(
        "sasl.oauthbearer.token.endpoint.url: the answer has no access_token (is it a token endpoint?)"
    )]
    NoAccessToken,
    /// Neither `expires_in` nor a JWT `exp` claim says how long the token lives.
    #[error(
        "sasl.oauthbearer.token.endpoint.url: the token's lifetime is unknown (no expires_in, and no exp claim)"
    )]
    NoLifetime,
    /// The token has no principal in the claim `sasl.oauthbearer.sub.claim.name` names.
    #[error("sasl.oauthbearer.sub.claim.name: the token has no {0:?} claim")]
    NoPrincipal(String),
}

/// The settings an HTTP error most likely points at.
fn hint(status: u16, error: Option<&str>) -> &'static str {
    match (status, error) {
        (401, _) | (_, Some("invalid_client" | "unauthorized_client")) => {
            "; check sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret"
        }
        (_, Some("invalid_scope")) => "; check sasl.oauthbearer.scope",
        (404, _) => "; check the path of sasl.oauthbearer.token.endpoint.url",
        _ => "",
    }
}

/// A token endpoint: `http://host[:port]/path` or `https://...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEndpoint {
    /// `https`.
    pub tls: bool,
    /// The host, without brackets for an IPv6 address.
    pub host: String,
    /// The port (80 or 443 unless given).
    pub port: u16,
    /// The path and query, at least `/`.
    pub path: String,
}

impl TokenEndpoint {
    /// Parses the URL. No user info, no fragment; the host must not be empty.
    pub fn parse(url: &str) -> Result<Self, OidcError> {
        // A URL with user info may hold a password: it is not repeated.
        let bad = |m: &str| match url.contains('@') {
            true => Err(OidcError::BadUrl(m.to_string())),
            false => Err(OidcError::BadUrl(format!("{m} (got {url:?})"))),
        };
        let url = url.trim();
        let (tls, rest) = if let Some(r) = strip_prefix_ci(url, "https://") {
            (true, r)
        } else if let Some(r) = strip_prefix_ci(url, "http://") {
            (false, r)
        } else {
            return bad("must start with https:// (or http:// for tests)");
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_string()
        };
        if path.contains('#') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return bad("the path has a fragment, a space or a control character");
        }
        if authority.contains('@') {
            return bad(
                "no user name or password in the URL: give sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret",
            );
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let Some((host, after)) = v6.split_once(']') else {
                return bad("an IPv6 address without its closing ]");
            };
            match after.strip_prefix(':') {
                Some(p) => (host, p.parse().ok()),
                None if after.is_empty() => (host, Some(default_port)),
                None => (host, None),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, p.parse().ok()),
                None => (authority, Some(default_port)),
            }
        };
        let Some(port) = port.filter(|p| *p != 0) else {
            return bad("the port is not a number from 1 to 65535");
        };
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
        {
            return bad("the host is empty or not a host name or address");
        }
        Ok(Self {
            tls,
            host: host.to_string(),
            port,
            path,
        })
    }

    /// The `Host` header's value.
    fn host_header(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match (self.tls, self.port) {
            (true, 443) | (false, 80) => host,
            _ => format!("{host}:{}", self.port),
        }
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| s.get(prefix.len()..))
        .flatten()
}

/// The client-credentials request: `POST` with the client id and secret in HTTP Basic
/// authentication (RFC 6749 §2.3.1: each form-urlencoded first, as the Java client
/// does), `grant_type=client_credentials` and the scope in the form body, and
/// `Connection: close` (the driver reads the answer until the server closes).
///
/// The bytes carry the secret: send them, never print them.
pub fn token_request(
    endpoint: &TokenEndpoint,
    client_id: &str,
    client_secret: &str,
    scope: Option<&str>,
) -> Vec<u8> {
    let credentials = B64.encode(format!(
        "{}:{}",
        form_encode(client_id),
        form_encode(client_secret)
    ));
    let mut body = String::from("grant_type=client_credentials");
    if let Some(scope) = scope.map(str::trim).filter(|s| !s.is_empty()) {
        body.push_str("&scope=");
        body.push_str(&form_encode(scope));
    }
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Basic {credentials}\r\nAccept: application/json\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {len}\r\nConnection: close\r\nUser-Agent: ottla\r\n\r\n{body}",
        path = endpoint.path,
        host = endpoint.host_header(),
        len = body.len(),
    )
    .into_bytes()
}

/// `application/x-www-form-urlencoded` (space as `+`, all but unreserved bytes
/// percent-encoded).
fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                out.push(char::from(b));
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A token read from the endpoint's answer.
#[derive(Clone, PartialEq, Eq)]
pub struct FetchedToken {
    /// `access_token`.
    pub access_token: String,
    /// When it expires: the JWT's `exp` claim when the token is a JWT with one, else
    /// `expires_in` after the time given (librdkafka reads `exp`; when both are there,
    /// the earlier wins).
    pub expires_at: SystemTime,
    /// The principal (the claim `sasl.oauthbearer.sub.claim.name` names, `sub` by
    /// default), when the token is a JWT.
    pub principal: Option<String>,
}

impl std::fmt::Debug for FetchedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchedToken")
            .field("access_token", &"[redacted]")
            .field("expires_at", &self.expires_at)
            .field("principal", &self.principal)
            .finish()
    }
}

/// Reads the endpoint's whole answer (the bytes up to the server's close), received at
/// `now`. A JWT's principal is read from `sub_claim` (`sub` by default); a JWT without
/// it is refused, as librdkafka and the Java client do; an opaque token has none.
pub fn read_token_response(
    response: &[u8],
    now: SystemTime,
    sub_claim: &str,
) -> Result<FetchedToken, OidcError> {
    let (status, body) = parse_http(response)?;
    let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    let field = |name: &str| {
        json.as_ref()
            .and_then(|j| j.get(name))
            .and_then(|v| v.as_str())
            .map(|s| s.chars().take(300).collect::<String>())
    };
    if !(200..300).contains(&status) {
        return Err(OidcError::Refused {
            status,
            error: field("error"),
            description: field("error_description"),
        });
    }
    let Some(json) = json.as_ref().filter(|j| j.is_object()) else {
        return Err(OidcError::Malformed(
            "the answer's body is not a JSON object".into(),
        ));
    };
    let Some(access_token) = json
        .get("access_token")
        .and_then(|v| v.as_str())
        .filter(|t| !t.is_empty())
    else {
        return Err(OidcError::NoAccessToken);
    };
    let expires_in = json.get("expires_in").and_then(|v| {
        // Some providers send it as a string.
        v.as_u64()
            .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
    });
    let claims = jwt_claims(access_token);
    let from_exp = claims
        .as_ref()
        .and_then(|c| c.get("exp"))
        .and_then(|v| v.as_f64().or_else(|| v.as_str()?.parse().ok()))
        .filter(|s| *s >= 0.0 && s.is_finite())
        .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs_f64(s.min(1e12)));
    let from_expires_in = expires_in.map(|s| now + Duration::from_secs(s.min(u64::from(u32::MAX))));
    let expires_at = match (from_exp, from_expires_in) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return Err(OidcError::NoLifetime),
    };
    let principal = match &claims {
        Some(c) => Some(
            c.get(sub_claim)
                .and_then(|v| v.as_str())
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .ok_or_else(|| OidcError::NoPrincipal(sub_claim.to_string()))?,
        ),
        None => None,
    };
    Ok(FetchedToken {
        access_token: access_token.to_string(),
        expires_at,
        principal,
    })
}

/// The claims of a JWT (`header.claims.signature`, base64url), if `token` is one. The
/// signature is not checked: the broker checks it.
pub fn jwt_claims(token: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    let mut parts = token.split('.');
    let (_header, claims, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = B64URL.decode(claims.trim_end_matches('=')).ok()?;
    match serde_json::from_slice(&bytes).ok()? {
        serde_json::Value::Object(map) => Some(map),
        _ => None,
    }
}

/// The status and the body of an HTTP/1.x answer read to its end: the body is cut at
/// `Content-Length` or decoded from chunks (`Transfer-Encoding: chunked`), else it is
/// everything after the head.
pub fn parse_http(response: &[u8]) -> Result<(u16, Vec<u8>), OidcError> {
    let malformed = |m: &str| OidcError::Malformed(m.to_string());
    let Some(head_end) = find(response, b"\r\n\r\n") else {
        return Err(malformed(
            "the answer is not HTTP (no end of headers; is the URL's scheme right?)",
        ));
    };
    let head = std::str::from_utf8(response.get(..head_end).unwrap_or_default())
        .map_err(|_| malformed("the answer's headers are not text"))?;
    let body = response.get(head_end + 4..).unwrap_or_default();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut words = status_line.split(' ');
    let (Some(version), Some(code)) = (words.next(), words.next()) else {
        return Err(malformed("the answer has no HTTP status line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(malformed("the answer is not HTTP/1.x"));
    }
    let status: u16 = code
        .parse()
        .map_err(|_| malformed("the HTTP status is not a number"))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| malformed("Content-Length is not a number"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    if chunked {
        return dechunk(body).map(|b| (status, b));
    }
    match length {
        Some(n) => body
            .get(..n)
            .map(|b| (status, b.to_vec()))
            .ok_or_else(|| malformed("the answer ended before its Content-Length")),
        None => Ok((status, body.to_vec())),
    }
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, OidcError> {
    let malformed = |m: &str| OidcError::Malformed(m.to_string());
    let mut out = Vec::new();
    loop {
        let Some(line_end) = find(body, b"\r\n") else {
            return Err(malformed("a chunk's size line is cut off"));
        };
        let size_line = std::str::from_utf8(body.get(..line_end).unwrap_or_default())
            .map_err(|_| malformed("a chunk size is not text"))?;
        let size_hex = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| malformed("a chunk size is not hexadecimal"))?;
        let start = line_end + 2;
        if size == 0 {
            return Ok(out);
        }
        let end = start
            .checked_add(size)
            .filter(|e| *e <= body.len() && out.len() + size <= MAX_RESPONSE_BYTES)
            .ok_or_else(|| malformed("a chunk is cut off"))?;
        out.extend_from_slice(body.get(start..end).unwrap_or_default());
        body = body.get(end..).unwrap_or_default();
        body = body.strip_prefix(b"\r\n").unwrap_or(body);
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        format!(
            "{}.{}.c2ln",
            B64URL.encode(r#"{"alg":"RS256"}"#),
            B64URL.encode(claims)
        )
    }

    fn http(status: &str, body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    const T0: u64 = 1_700_000_000;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn urls_parse_with_default_ports_and_paths() {
        let e = TokenEndpoint::parse("https://login.example.com/oauth2/v2.0/token").unwrap();
        assert_eq!(
            e,
            TokenEndpoint {
                tls: true,
                host: "login.example.com".into(),
                port: 443,
                path: "/oauth2/v2.0/token".into()
            }
        );
        let e = TokenEndpoint::parse("HTTP://127.0.0.1:8080").unwrap();
        assert_eq!((e.tls, e.port, e.path.as_str()), (false, 8080, "/"));
        assert_eq!(e.host_header(), "127.0.0.1:8080");
        let e = TokenEndpoint::parse("http://[::1]:9/t?a=b").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.path.as_str()),
            ("::1", 9, "/t?a=b")
        );
        assert_eq!(e.host_header(), "[::1]:9");
        for bad in [
            "ftp://h/t",
            "login.example.com/token",
            "https://",
            "https://h:0/t",
            "https://h:99999/t",
            "https://user:pw@h/t",
            "https://h/a b",
            "https://h/t#frag",
        ] {
            let err = TokenEndpoint::parse(bad).unwrap_err();
            assert!(
                err.to_string()
                    .starts_with("sasl.oauthbearer.token.endpoint.url"),
                "{bad}: {err}"
            );
        }
        let err = TokenEndpoint::parse("https://user:pw-secret@h/t").unwrap_err();
        assert!(!err.to_string().contains("pw-secret"), "{err}");
    }

    #[test]
    fn the_request_is_a_basic_authenticated_form_post() {
        let e = TokenEndpoint::parse("https://idp.example.com/token").unwrap();
        let req = token_request(&e, "my client", "s3cr:t&x", Some("kafka read"));
        let text = String::from_utf8(req).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert_eq!(body, "grant_type=client_credentials&scope=kafka+read");
        let lines: Vec<&str> = head.split("\r\n").collect();
        assert_eq!(lines[0], "POST /token HTTP/1.1");
        assert!(lines.contains(&"Host: idp.example.com"), "{head}");
        assert!(
            lines.contains(&"Content-Type: application/x-www-form-urlencoded"),
            "{head}"
        );
        assert!(lines.contains(&format!("Content-Length: {}", body.len()).as_str()));
        let basic = lines
            .iter()
            .find_map(|l| l.strip_prefix("Authorization: Basic "))
            .unwrap();
        assert_eq!(
            B64.decode(basic).unwrap(),
            b"my+client:s3cr%3At%26x".to_vec()
        );
        // No scope: no scope parameter.
        let req = token_request(&e, "id", "secret", None);
        assert!(
            String::from_utf8(req)
                .unwrap()
                .ends_with("\r\n\r\ngrant_type=client_credentials")
        );
    }

    #[test]
    fn a_jwt_gives_its_exp_and_sub() {
        let token = jwt(&format!(
            r#"{{"sub":"svc-orders","exp":{},"iat":{T0}}}"#,
            T0 + 300
        ));
        let body =
            format!(r#"{{"access_token":"{token}","token_type":"Bearer","expires_in":3600}}"#);
        let t = read_token_response(&http("200 OK", &body), at(T0), "sub").unwrap();
        assert_eq!(t.access_token, token);
        // exp (300 s) is earlier than expires_in (3600 s): exp wins.
        assert_eq!(t.expires_at, at(T0 + 300));
        assert_eq!(t.principal.as_deref(), Some("svc-orders"));
        assert!(!format!("{t:?}").contains(&token));
        // Another claim names the principal.
        let token = jwt(&format!(r#"{{"client_id":"app","exp":{}}}"#, T0 + 60));
        let body = format!(r#"{{"access_token":"{token}"}}"#);
        let t = read_token_response(&http("200 OK", &body), at(T0), "client_id").unwrap();
        assert_eq!(
            (t.principal.as_deref(), t.expires_at),
            (Some("app"), at(T0 + 60))
        );
        let err = read_token_response(&http("200 OK", &body), at(T0), "sub").unwrap_err();
        assert_eq!(err, OidcError::NoPrincipal("sub".into()));
        assert!(err.to_string().contains("sasl.oauthbearer.sub.claim.name"));
    }

    #[test]
    fn an_opaque_token_lives_expires_in() {
        let body = r#"{"access_token":"opaque-abc","expires_in":"120"}"#;
        let t = read_token_response(&http("200 OK", body), at(T0), "sub").unwrap();
        assert_eq!((t.expires_at, t.principal), (at(T0 + 120), None));
        let body = r#"{"access_token":"opaque-abc"}"#;
        assert_eq!(
            read_token_response(&http("200 OK", body), at(T0), "sub"),
            Err(OidcError::NoLifetime)
        );
    }

    #[test]
    fn refusals_name_the_error_and_the_settings() {
        let body =
            r#"{"error":"invalid_client","error_description":"Client authentication failed"}"#;
        let err = read_token_response(&http("401 Unauthorized", body), at(T0), "sub").unwrap_err();
        assert_eq!(
            err,
            OidcError::Refused {
                status: 401,
                error: Some("invalid_client".into()),
                description: Some("Client authentication failed".into())
            }
        );
        assert_eq!(
            err.to_string(),
            "sasl.oauthbearer.token.endpoint.url answered HTTP 401: invalid_client (Client authentication failed); check sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret"
        );
        let err = read_token_response(&http("404 Not Found", "<html>"), at(T0), "sub").unwrap_err();
        assert_eq!(
            err.to_string(),
            "sasl.oauthbearer.token.endpoint.url answered HTTP 404; check the path of sasl.oauthbearer.token.endpoint.url"
        );
        let err =
            read_token_response(&http("200 OK", r#"{"token":"x"}"#), at(T0), "sub").unwrap_err();
        assert_eq!(err, OidcError::NoAccessToken);
        assert!(err.to_string().contains("access_token"));
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        for bytes in [
            &b""[..],
            b"garbage",
            b"\x16\x03\x01\x00\x05hello",
            b"HTTP/1.1\r\n\r\n",
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"SSH-2.0 x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n{}",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n{}",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nab",
            b"HTTP/1.1 200 OK\r\n\r\n[1,2]",
            b"HTTP/1.1 200 OK\r\n\r\n{\"access_token\":7}",
        ] {
            assert!(
                read_token_response(bytes, at(T0), "sub").is_err(),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn chunked_answers_are_decoded() {
        let body = r#"{"access_token":"tok","expires_in":60}"#;
        let (a, b) = body.split_at(10);
        let bytes = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x};ext=1\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
        let t = read_token_response(bytes.as_bytes(), at(T0), "sub").unwrap();
        assert_eq!(
            (t.access_token.as_str(), t.expires_at),
            ("tok", at(T0 + 60))
        );
    }
}
