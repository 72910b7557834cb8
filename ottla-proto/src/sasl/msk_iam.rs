//! Amazon MSK IAM authentication over `OAUTHBEARER`: the token the
//! `aws-msk-iam-sasl-signer` libraries (Python, Go, JavaScript) make, as a pure function
//! of the credentials, the region and the time. It is a SigV4-presigned URL for
//! `https://kafka.<region>.amazonaws.com/?Action=kafka-cluster%3AConnect` (service
//! `kafka-cluster`, `X-Amz-Expires=900`, only `host` signed, the empty payload's hash),
//! with a `User-Agent` parameter appended after signing, encoded in base64url without
//! padding. It expires 900 s after it was signed.
//!
//! [`sigv4`] holds the Signature Version 4 steps, checked against AWS's published test
//! suite.

use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;

/// How long a token is valid (the signers' `X-Amz-Expires`).
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(900);

/// AWS credentials, borrowed for one signature.
#[derive(Clone, Copy)]
pub struct Credentials<'a> {
    /// `AWS_ACCESS_KEY_ID`.
    pub access_key_id: &'a str,
    /// `AWS_SECRET_ACCESS_KEY`. Never printed.
    pub secret_access_key: &'a str,
    /// `AWS_SESSION_TOKEN`, for temporary credentials. Never printed.
    pub session_token: Option<&'a str>,
}

impl std::fmt::Debug for Credentials<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"[redacted]")
            .field("session_token", &self.session_token.map(|_| "[redacted]"))
            .finish()
    }
}

/// A signed MSK IAM token.
#[derive(Clone, PartialEq, Eq)]
pub struct MskIamToken {
    /// The OAUTHBEARER token: the presigned URL in base64url without padding.
    pub token: String,
    /// When it expires: [`TOKEN_LIFETIME`] after it was signed.
    pub expires_at: SystemTime,
}

impl std::fmt::Debug for MskIamToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MskIamToken")
            .field("token", &"[redacted]")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Why no token could be signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MskIamError {
    /// The region is empty or not a region name (`us-east-1`).
    #[error("AWS region {0:?} is not a region name (like us-east-1)")]
    BadRegion(String),
    /// The access key id or the secret key is empty.
    #[error("the AWS credentials are empty (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")]
    NoCredentials,
    /// The time is before 1970 or after 9999.
    #[error("the signing time is out of range")]
    BadTime,
}

/// The token for `region`, signed at `now` (whole seconds), with `user_agent` in its
/// `User-Agent` parameter (the signers put `<library>/<version>` there).
pub fn token(
    credentials: Credentials<'_>,
    region: &str,
    now: SystemTime,
    user_agent: &str,
) -> Result<MskIamToken, MskIamError> {
    if region.is_empty()
        || !region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(MskIamError::BadRegion(region.to_string()));
    }
    if credentials.access_key_id.is_empty() || credentials.secret_access_key.is_empty() {
        return Err(MskIamError::NoCredentials);
    }
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_err(|_| MskIamError::BadTime)?
        .as_secs();
    let signed_at = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    let amz_date = sigv4::amz_date(secs).ok_or(MskIamError::BadTime)?;
    let date = amz_date.get(..8).unwrap_or_default();
    let service = "kafka-cluster";
    let host = format!("kafka.{region}.amazonaws.com");
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let credential = format!("{}/{scope}", credentials.access_key_id);
    let expires = TOKEN_LIFETIME.as_secs().to_string();
    // In the order the signers write them (the canonical form sorts them).
    let mut query: Vec<(&str, &str)> = vec![
        ("Action", "kafka-cluster:Connect"),
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Credential", &credential),
        ("X-Amz-Date", &amz_date),
        ("X-Amz-Expires", &expires),
        ("X-Amz-SignedHeaders", "host"),
    ];
    if let Some(session) = credentials.session_token {
        query.push(("X-Amz-Security-Token", session));
    }
    let canonical = sigv4::canonical_request(
        "GET",
        "/",
        &sigv4::canonical_query(&query),
        &[("host", &host)],
        sigv4::EMPTY_SHA256,
    );
    let to_sign = sigv4::string_to_sign(&amz_date, &scope, &canonical);
    let key = sigv4::signing_key(credentials.secret_access_key, date, region, service);
    let signature = sigv4::signature(&key, &to_sign);
    query.push(("X-Amz-Signature", &signature));
    query.push(("User-Agent", user_agent));
    let url = format!("https://{host}/?{}", sigv4::query_string(&query));
    Ok(MskIamToken {
        token: B64URL.encode(url),
        expires_at: signed_at + TOKEN_LIFETIME,
    })
}

/// AWS Signature Version 4, step by step.
pub mod sigv4 {
    use hmac::{Hmac, Mac};
    use sha2::{Digest, Sha256};

    /// The SHA-256 of the empty payload, hex.
    pub const EMPTY_SHA256: &str =
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    /// RFC 3986 percent-encoding of everything but the unreserved characters
    /// (`A-Z a-z 0-9 - . _ ~`), as SigV4 wants it.
    pub fn uri_encode(s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    }

    /// `key=value` pairs, encoded, in the order given.
    pub fn query_string(pairs: &[(&str, &str)]) -> String {
        pairs
            .iter()
            .map(|(k, v)| format!("{}={}", uri_encode(k), uri_encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// The canonical query string: encoded, sorted by key then value.
    pub fn canonical_query(pairs: &[(&str, &str)]) -> String {
        let mut encoded: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (uri_encode(k), uri_encode(v)))
            .collect();
        encoded.sort();
        encoded
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// The canonical request. `headers` are the signed ones, their names lower-case;
    /// they are sorted here and their values trimmed.
    pub fn canonical_request(
        method: &str,
        path: &str,
        canonical_query: &str,
        headers: &[(&str, &str)],
        payload_hash: &str,
    ) -> String {
        let mut headers: Vec<(String, &str)> = headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim()))
            .collect();
        headers.sort();
        let canonical_headers: String = headers.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
        let signed = signed_headers(&headers);
        format!(
            "{method}\n{path}\n{canonical_query}\n{canonical_headers}\n{signed}\n{payload_hash}"
        )
    }

    fn signed_headers(headers: &[(String, &str)]) -> String {
        headers
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(";")
    }

    /// The string to sign.
    pub fn string_to_sign(amz_date: &str, scope: &str, canonical_request: &str) -> String {
        format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            hex(&Sha256::digest(canonical_request.as_bytes()))
        )
    }

    /// The signing key: `HMAC("AWS4" + secret, date)`, then region, service and
    /// `aws4_request`.
    pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
        let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
        let k = hmac(&k, region.as_bytes());
        let k = hmac(&k, service.as_bytes());
        hmac(&k, b"aws4_request")
    }

    /// The signature, hex.
    pub fn signature(key: &[u8; 32], string_to_sign: &str) -> String {
        hex(&hmac(key, string_to_sign.as_bytes()))
    }

    fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
        // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
            return [0; 32];
        };
        mac.update(data);
        mac.finalize().into_bytes().into()
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// `YYYYMMDDTHHMMSSZ` for seconds since the epoch (UTC); `None` past year 9999.
    pub fn amz_date(secs: u64) -> Option<String> {
        let days = secs / 86_400;
        let rest = secs % 86_400;
        let (year, month, day) = crate::process::dlq::civil_from_days(i64::try_from(days).ok()?);
        if year > 9999 {
            return None;
        }
        Some(format!(
            "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
            rest / 3600,
            rest % 3600 / 60,
            rest % 60
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::sigv4::*;
    use super::*;

    // AWS's SigV4 test suite, as awslabs/aws-c-auth keeps it
    // (tests/aws-signing-test-suite/v4/<case>/): credentials AKIDEXAMPLE /
    // wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY, region us-east-1, service `service`,
    // 2015-08-30T12:36:00Z (the same vectors as AWS's published aws-sig-v4-test-suite).
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    fn header_signed(query: &[(&str, &str)]) -> String {
        let headers = [
            ("host", "example.amazonaws.com"),
            ("x-amz-date", "20150830T123600Z"),
        ];
        let canonical =
            canonical_request("GET", "/", &canonical_query(query), &headers, EMPTY_SHA256);
        let to_sign = string_to_sign(
            "20150830T123600Z",
            "20150830/us-east-1/service/aws4_request",
            &canonical,
        );
        signature(
            &signing_key(SECRET, "20150830", "us-east-1", "service"),
            &to_sign,
        )
    }

    #[test]
    fn sigv4_matches_the_aws_test_suite() {
        // get-vanilla/header-signed-request.txt
        assert_eq!(
            header_signed(&[]),
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
        // get-vanilla-query-order-key-case/header-signed-request.txt: the query given as
        // Param2, Param1 is sorted.
        assert_eq!(
            header_signed(&[("Param2", "value2"), ("Param1", "value1")]),
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        );
        // get-vanilla-query-order-key-case/query-string-to-sign.txt's scope and hash
        // line format; and the presigned form's canonical request, as its
        // query-canonical-request.txt spells it.
        let query = [
            ("Param2", "value2"),
            ("Param1", "value1"),
            ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
            (
                "X-Amz-Credential",
                "AKIDEXAMPLE/20150830/us-east-1/service/aws4_request",
            ),
            ("X-Amz-Date", "20150830T123600Z"),
            ("X-Amz-SignedHeaders", "host"),
        ];
        let canonical = canonical_request(
            "GET",
            "/",
            &canonical_query(&query),
            &[("host", "example.amazonaws.com")],
            EMPTY_SHA256,
        );
        assert_eq!(
            canonical,
            "GET\n/\nParam1=value1&Param2=value2&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20150830%2Fus-east-1%2Fservice%2Faws4_request&X-Amz-Date=20150830T123600Z&X-Amz-SignedHeaders=host\nhost:example.amazonaws.com\n\nhost\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            string_to_sign(
                "20150830T123600Z",
                "20150830/us-east-1/service/aws4_request",
                &canonical
            ),
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\neb1512f5ed1470925b7b1072c2108953680032d6bc3ccbef8eb7c6fdf1639827"
        );
    }

    #[test]
    fn amz_dates_are_utc_calendar_dates() {
        assert_eq!(amz_date(0).as_deref(), Some("19700101T000000Z"));
        assert_eq!(amz_date(1_440_938_160).as_deref(), Some("20150830T123600Z"));
        assert_eq!(amz_date(1_709_296_496).as_deref(), Some("20240301T123456Z"));
        // 2024-02-29, a leap day; 2000-03-01 after a century leap year.
        assert_eq!(amz_date(1_709_164_800).as_deref(), Some("20240229T000000Z"));
        assert_eq!(amz_date(951_868_800).as_deref(), Some("20000301T000000Z"));
        assert_eq!(amz_date(253_402_300_800), None);
    }

    // The tokens that aws-msk-iam-sasl-signer-python 1.0.2 (PyPI, on botocore 1.44.8)
    // produced for these credentials, region eu-west-1, with botocore's clock fixed at
    // 2024-03-01T12:34:56Z (`botocore.auth.get_current_datetime` replaced):
    // `__construct_auth_token(region, Credentials(key, secret, token))`.
    const PY_UA: &str = "aws-msk-iam-sasl-signer-python/1.0.2";
    const PY_TOKEN: &str = "aHR0cHM6Ly9rYWZrYS5ldS13ZXN0LTEuYW1hem9uYXdzLmNvbS8_QWN0aW9uPWthZmthLWNsdXN0ZXIlM0FDb25uZWN0JlgtQW16LUFsZ29yaXRobT1BV1M0LUhNQUMtU0hBMjU2JlgtQW16LUNyZWRlbnRpYWw9QUtJQUlPU0ZPRE5ON0VYQU1QTEUlMkYyMDI0MDMwMSUyRmV1LXdlc3QtMSUyRmthZmthLWNsdXN0ZXIlMkZhd3M0X3JlcXVlc3QmWC1BbXotRGF0ZT0yMDI0MDMwMVQxMjM0NTZaJlgtQW16LUV4cGlyZXM9OTAwJlgtQW16LVNpZ25lZEhlYWRlcnM9aG9zdCZYLUFtei1TaWduYXR1cmU9ZDRjMjU0ZGVjYzQ5ZmM3ODU0OTYzZDJmMTcxYTU4OTA5MzdjOTViODFkMzUzN2EzNDRkNTEyMjRjNDM4NmM2OCZVc2VyLUFnZW50PWF3cy1tc2staWFtLXNhc2wtc2lnbmVyLXB5dGhvbiUyRjEuMC4y";
    const PY_TOKEN_SESSION: &str = "aHR0cHM6Ly9rYWZrYS5ldS13ZXN0LTEuYW1hem9uYXdzLmNvbS8_QWN0aW9uPWthZmthLWNsdXN0ZXIlM0FDb25uZWN0JlgtQW16LUFsZ29yaXRobT1BV1M0LUhNQUMtU0hBMjU2JlgtQW16LUNyZWRlbnRpYWw9QUtJQUlPU0ZPRE5ON0VYQU1QTEUlMkYyMDI0MDMwMSUyRmV1LXdlc3QtMSUyRmthZmthLWNsdXN0ZXIlMkZhd3M0X3JlcXVlc3QmWC1BbXotRGF0ZT0yMDI0MDMwMVQxMjM0NTZaJlgtQW16LUV4cGlyZXM9OTAwJlgtQW16LVNpZ25lZEhlYWRlcnM9aG9zdCZYLUFtei1TZWN1cml0eS1Ub2tlbj1Gd29HWlhJdllYZHpFWEFNUExFJTJGJTJGc2Vzc2lvbiUyQnRva2VuJTNEJlgtQW16LVNpZ25hdHVyZT0yOGYwOWQzNDk0NWYyNjNlNzNmNGFiMTA2ZDIyNTBlZTM1NWExODEzZDlmYzcxMThkMzU5ZGEzNGZhODQ0Zjk2JlVzZXItQWdlbnQ9YXdzLW1zay1pYW0tc2FzbC1zaWduZXItcHl0aG9uJTJGMS4wLjI";

    fn creds(session: Option<&'static str>) -> Credentials<'static> {
        Credentials {
            access_key_id: "AKIAIOSFODNN7EXAMPLE",
            secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            session_token: session,
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn tokens_equal_the_python_signers() {
        let t = token(creds(None), "eu-west-1", at(1_709_296_496), PY_UA).unwrap();
        assert_eq!(t.token, PY_TOKEN);
        // The Python signer's expiry: 1709297396000 ms.
        assert_eq!(t.expires_at, at(1_709_297_396));
        let session = Some("FwoGZXIvYXdzEXAMPLE//session+token=");
        let t = token(creds(session), "eu-west-1", at(1_709_296_496), PY_UA).unwrap();
        assert_eq!(t.token, PY_TOKEN_SESSION);
        // Sub-second parts of the time are dropped, as the signature's date does.
        let t = token(
            creds(None),
            "eu-west-1",
            at(1_709_296_496) + Duration::from_millis(999),
            PY_UA,
        )
        .unwrap();
        assert_eq!(
            (t.token.as_str(), t.expires_at),
            (PY_TOKEN, at(1_709_297_396))
        );
    }

    #[test]
    fn a_token_decodes_field_by_field() {
        let session = Some("FwoGZXIvYXdzEXAMPLE//session+token=");
        let t = token(
            creds(session),
            "us-east-1",
            at(1_440_938_160),
            "ottla/0.1.0",
        )
        .unwrap();
        assert!(
            t.token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "base64url without padding: {}",
            t.token
        );
        let url = String::from_utf8(B64URL.decode(&t.token).unwrap()).unwrap();
        let (base, query) = url.split_once('?').unwrap();
        assert_eq!(base, "https://kafka.us-east-1.amazonaws.com/");
        let fields: Vec<(&str, &str)> = query
            .split('&')
            .map(|p| p.split_once('=').unwrap())
            .collect();
        let names: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names,
            [
                "Action",
                "X-Amz-Algorithm",
                "X-Amz-Credential",
                "X-Amz-Date",
                "X-Amz-Expires",
                "X-Amz-SignedHeaders",
                "X-Amz-Security-Token",
                "X-Amz-Signature",
                "User-Agent"
            ]
        );
        let get = |k: &str| fields.iter().find(|(n, _)| *n == k).unwrap().1;
        assert_eq!(get("Action"), "kafka-cluster%3AConnect");
        assert_eq!(get("X-Amz-Algorithm"), "AWS4-HMAC-SHA256");
        assert_eq!(
            get("X-Amz-Credential"),
            "AKIAIOSFODNN7EXAMPLE%2F20150830%2Fus-east-1%2Fkafka-cluster%2Faws4_request"
        );
        assert_eq!(get("X-Amz-Date"), "20150830T123600Z");
        assert_eq!(get("X-Amz-Expires"), "900");
        assert_eq!(get("X-Amz-SignedHeaders"), "host");
        assert_eq!(
            get("X-Amz-Security-Token"),
            "FwoGZXIvYXdzEXAMPLE%2F%2Fsession%2Btoken%3D"
        );
        assert_eq!(get("User-Agent"), "ottla%2F0.1.0");
        // The signature, recomputed from its parts: the User-Agent is not signed.
        let signed: Vec<(&str, &str)> = vec![
            ("Action", "kafka-cluster:Connect"),
            ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
            (
                "X-Amz-Credential",
                "AKIAIOSFODNN7EXAMPLE/20150830/us-east-1/kafka-cluster/aws4_request",
            ),
            ("X-Amz-Date", "20150830T123600Z"),
            ("X-Amz-Expires", "900"),
            ("X-Amz-SignedHeaders", "host"),
            (
                "X-Amz-Security-Token",
                "FwoGZXIvYXdzEXAMPLE//session+token=",
            ),
        ];
        let canonical = canonical_request(
            "GET",
            "/",
            &canonical_query(&signed),
            &[("host", "kafka.us-east-1.amazonaws.com")],
            EMPTY_SHA256,
        );
        let to_sign = string_to_sign(
            "20150830T123600Z",
            "20150830/us-east-1/kafka-cluster/aws4_request",
            &canonical,
        );
        let key = signing_key(
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "20150830",
            "us-east-1",
            "kafka-cluster",
        );
        assert_eq!(get("X-Amz-Signature"), signature(&key, &to_sign));
        assert_eq!(t.expires_at, at(1_440_938_160 + 900));
        assert!(!format!("{t:?}").contains(&t.token));
    }

    #[test]
    fn bad_inputs_are_errors() {
        let now = at(1_709_296_496);
        for region in ["", "US-EAST-1", "us east 1", "eu-west-1/"] {
            assert_eq!(
                token(creds(None), region, now, PY_UA),
                Err(MskIamError::BadRegion(region.into()))
            );
        }
        let mut c = creds(None);
        c.secret_access_key = "";
        assert_eq!(
            token(c, "eu-west-1", now, PY_UA),
            Err(MskIamError::NoCredentials)
        );
        assert!(!format!("{:?}", creds(Some("tok-secret"))).contains("tok-secret"));
        assert!(!format!("{:?}", creds(None)).contains("EXAMPLEKEY"));
    }
}
