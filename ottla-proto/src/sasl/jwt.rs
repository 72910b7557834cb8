//! Unsigned JWTs for tests, built from librdkafka's `sasl.oauthbearer.config` syntax
//! (with `enable.sasl.oauthbearer.unsecure.jwt`): `principal=admin scope=read,write
//! lifeSeconds=3600 principalClaimName=sub extension_traceId=123`.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;

use super::SaslError;

/// What an unsecured JWT says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsecuredJwtConfig {
    /// The principal (required).
    pub principal: String,
    /// The claim that carries it (default `sub`).
    pub principal_claim_name: String,
    /// The `scope` claim, if any.
    pub scope: Vec<String>,
    /// How long a token lives (default one hour).
    pub lifetime: Duration,
    /// SASL extensions (`extension_<key>=<value>`).
    pub extensions: Vec<(String, String)>,
}

impl UnsecuredJwtConfig {
    /// Parses the space-separated `key=value` list. `principal` is required; an unknown
    /// key is an error naming it.
    pub fn parse(s: &str) -> Result<Self, SaslError> {
        let bad = |m: String| SaslError::InvalidJwtConfig(m);
        let mut config = UnsecuredJwtConfig {
            principal: String::new(),
            principal_claim_name: "sub".into(),
            scope: Vec::new(),
            lifetime: Duration::from_secs(3600),
            extensions: Vec::new(),
        };
        for pair in s.split_whitespace() {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| bad(format!("{pair:?} is not key=value")))?;
            match key {
                "principal" => config.principal = value.to_string(),
                "principalClaimName" => config.principal_claim_name = value.to_string(),
                "scope" => {
                    config.scope = value
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect();
                }
                "lifeSeconds" => {
                    let secs: u64 = value
                        .parse()
                        .map_err(|_| bad(format!("lifeSeconds={value:?} is not a number")))?;
                    config.lifetime = Duration::from_secs(secs);
                }
                _ => match key.strip_prefix("extension_") {
                    Some(k) => config.extensions.push((k.to_string(), value.to_string())),
                    None => return Err(bad(format!("unknown key {key:?}"))),
                },
            }
        }
        if config.principal.is_empty() {
            return Err(bad("principal=... is required".into()));
        }
        Ok(config)
    }

    /// The token issued at `now_unix_ms`, and when it expires (ms since the epoch):
    /// `base64url({"alg":"none"}) . base64url(claims) .` with an empty signature.
    pub fn token(&self, now_unix_ms: i64) -> (String, i64) {
        let iat = now_unix_ms.div_euclid(1000);
        let lifetime = i64::try_from(self.lifetime.as_secs()).unwrap_or(i64::MAX / 2000);
        let exp = iat.saturating_add(lifetime);
        let mut claims = format!(
            "{{{}:{},\"iat\":{iat},\"exp\":{exp}",
            json_string(&self.principal_claim_name),
            json_string(&self.principal)
        );
        if !self.scope.is_empty() {
            let scope: Vec<String> = self.scope.iter().map(|s| json_string(s)).collect();
            claims.push_str(&format!(",\"scope\":[{}]", scope.join(",")));
        }
        claims.push('}');
        let token = format!(
            "{}.{}.",
            B64URL.encode(br#"{"alg":"none"}"#),
            B64URL.encode(claims.as_bytes())
        );
        (token, exp.saturating_mul(1000))
    }
}

/// A JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_librdkafka_syntax() {
        let c = UnsecuredJwtConfig::parse(
            "principal=admin scope=read,write lifeSeconds=60 principalClaimName=azp extension_traceId=123",
        )
        .unwrap();
        assert_eq!(c.principal, "admin");
        assert_eq!(c.principal_claim_name, "azp");
        assert_eq!(c.scope, ["read", "write"]);
        assert_eq!(c.lifetime, Duration::from_secs(60));
        assert_eq!(c.extensions, [("traceId".to_string(), "123".to_string())]);
        assert!(UnsecuredJwtConfig::parse("scope=x").is_err());
        let err = UnsecuredJwtConfig::parse("principal=a colour=blue").unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    #[test]
    fn the_token_is_an_unsigned_jwt() {
        let c = UnsecuredJwtConfig::parse("principal=ad\"min scope=read lifeSeconds=60").unwrap();
        let (token, expiry) = c.token(1_700_000_000_500);
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[2], "");
        assert_eq!(B64URL.decode(parts[0]).unwrap(), br#"{"alg":"none"}"#);
        let claims = String::from_utf8(B64URL.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(
            claims,
            r#"{"sub":"ad\"min","iat":1700000000,"exp":1700000060,"scope":["read"]}"#
        );
        assert_eq!(expiry, 1_700_000_060_000);
    }
}
