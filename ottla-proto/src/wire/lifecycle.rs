//! The numbers of a broker connection's life, in one place: how its requests are
//! bounded, when a session re-authenticates, when a connection counts as stalled and
//! when repeated hang-ups are diagnosed. The connection task (`ottla`'s driver) keeps
//! the sequencing async, as tokio-postgres's `connect_raw` does; what it waits for and
//! how long comes from here, where a test can reach it without a socket.

use std::time::{Duration, Instant};

/// How many times in a row a broker may close the connection on one request at one
/// version before ottla says so and steps down to a lower version.
pub const HANGUPS_BEFORE_DIAGNOSIS: u32 = 3;

/// How many hang-up reports wait for a reader.
pub const HANGUP_REPORTS_KEPT: usize = 64;

/// How long the oldest request on a connection may wait before the connection ranks
/// behind one that is not connected yet. Brokers answer most requests within
/// milliseconds; a Fetch waits `fetch.max.wait.ms` (500 ms by default) at most.
pub const STALLED_AFTER: Duration = Duration::from_secs(1);

/// A caller's backstop beyond the connection's own deadline (`connect_timeout` plus the
/// request's timeout): the connection task fails a request at its deadline, and the
/// caller gives up only if that never comes (the task gone).
pub const BACKSTOP_SLACK: Duration = Duration::from_secs(1);

/// How far past `connect_timeout` the connect attempt may run, so that a TLS handshake
/// that never ends reports itself rather than a bare timeout.
pub const HANDSHAKE_GRACE: Duration = Duration::from_millis(100);

/// How many requests may queue for a connection: twice the in-flight cap, enough to
/// keep the pipeline full, small enough that a stalled broker pushes back on callers
/// instead of buffering without limit.
pub fn request_queue(max_in_flight: usize) -> usize {
    max_in_flight.saturating_mul(2).max(1)
}

/// How long a caller waits for a request's answer at most: the connect deadline, the
/// request's timeout and [`BACKSTOP_SLACK`].
pub fn backstop(connect_timeout: Duration, request_timeout: Duration) -> Duration {
    connect_timeout + request_timeout + BACKSTOP_SLACK
}

/// When to re-authenticate a SASL session of `lifetime` that began at `now` (KIP-368):
/// at a point between 85% and 95% of it, `unit` (uniform in `[0, 1)`, from the
/// connection's seeded jitter) choosing where, as the Java client does, so that the
/// connections of many clients do not all re-authenticate at once.
pub fn reauth_point(now: Instant, lifetime: Duration, unit: f64) -> Instant {
    now + lifetime.mul_f64(0.85 + 0.10 * unit.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reauthentication_falls_between_85_and_95_percent_of_the_session() {
        let now = Instant::now();
        let life = Duration::from_secs(100);
        assert_eq!(reauth_point(now, life, 0.0), now + Duration::from_secs(85));
        assert_eq!(reauth_point(now, life, 0.5), now + Duration::from_secs(90));
        let last = reauth_point(now, life, 0.999_999);
        assert!(last < now + Duration::from_secs(95) && last > now + Duration::from_secs(94));
        // Out-of-range jitter never schedules past the session or before 85%.
        assert_eq!(reauth_point(now, life, 7.0), now + Duration::from_secs(95));
        assert_eq!(reauth_point(now, life, -1.0), now + Duration::from_secs(85));
    }

    #[test]
    fn a_request_is_bounded_and_the_queue_pushes_back() {
        assert_eq!(
            backstop(Duration::from_secs(10), Duration::from_secs(30)),
            Duration::from_secs(41)
        );
        assert_eq!(request_queue(5), 10);
        assert_eq!(request_queue(0), 1, "a channel needs room for one");
    }
}
