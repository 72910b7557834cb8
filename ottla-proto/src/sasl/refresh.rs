//! When an OAUTHBEARER token is fetched again: once 80% of the lifetime it had when it
//! was fetched has passed (the Java client's `sasl.login.refresh.window.factor`, and
//! librdkafka's refresh at 80% of the token's lifetime).

use std::time::{Duration, SystemTime};

/// The share of a token's lifetime after which it is refreshed.
pub const REFRESH_WINDOW: f64 = 0.8;

/// When a token fetched at `fetched_at` that expires at `expires_at` is fetched again.
/// A token that had already expired when it came is refreshed at once (the next
/// connection asks again).
pub fn refresh_point(fetched_at: SystemTime, expires_at: SystemTime) -> SystemTime {
    let lifetime = expires_at
        .duration_since(fetched_at)
        .unwrap_or(Duration::ZERO);
    fetched_at + lifetime.mul_f64(REFRESH_WINDOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_refreshed_at_80_percent_of_its_lifetime() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(refresh_point(t0, at(3600)), at(2880));
        assert_eq!(refresh_point(t0, at(5)), t0 + Duration::from_millis(4000));
        // Already expired on arrival, or expiring now: refreshed at once.
        assert_eq!(refresh_point(at(10), at(5)), at(10));
        assert_eq!(refresh_point(t0, t0), t0);
    }
}
