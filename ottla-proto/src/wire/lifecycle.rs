//! The numbers of a broker connection's life, in one place: how its requests are
//! bounded, when a session re-authenticates, when a connection counts as stalled, when
//! repeated hang-ups are diagnosed and when an idle connection closes ([`IdleClock`]). The connection task (`ottla`'s driver) keeps
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

/// `connections.max.idle.ms` by default: the Java client's 9 minutes (librdkafka keeps
/// idle connections unless told otherwise).
pub const DEFAULT_MAX_IDLE: Duration = Duration::from_secs(540);

/// The idle limit on Azure Event Hubs (`*.servicebus.windows.net`), whose load balancer
/// drops a connection idle for about 4 minutes without telling either side
/// (librdkafka#3109): the client closes first, as librdkafka does there.
pub const AZURE_MAX_IDLE: Duration = Duration::from_secs(180);

/// The idle limit of a client's connections: `configured` (`None`: disabled), lowered to
/// [`AZURE_MAX_IDLE`] when a bootstrap host is on Azure Event Hubs, where a longer limit
/// is never reached (its load balancer drops the connection first).
pub fn max_idle<'a>(
    configured: Option<Duration>,
    mut bootstrap_hosts: impl Iterator<Item = &'a str>,
) -> Option<Duration> {
    let configured = configured?;
    let azure = bootstrap_hosts.any(|h| {
        let host = h.rsplit_once(':').map_or(h, |(host, _)| host);
        host.to_ascii_lowercase()
            .ends_with(".servicebus.windows.net")
    });
    Some(if azure {
        configured.min(AZURE_MAX_IDLE)
    } else {
        configured
    })
}

/// When a connection that carries nothing closes (`connections.max.idle.ms`, the Java
/// client's `Selector` idle expiry). Activity is a request written or an answer read;
/// a connection with a request in flight is never idle, whatever the time. A closed
/// idle connection is not a failure: the next request that needs the broker opens a
/// new one.
///
/// Driven as every machine: [`IdleClock::handle_activity`] on each write and read,
/// [`IdleClock::poll_timeout`] for the deadline to sleep to while nothing is in flight,
/// [`IdleClock::expired`] when it passes.
#[derive(Debug, Clone)]
pub struct IdleClock {
    max_idle: Option<Duration>,
    last_active: Instant,
}

impl IdleClock {
    /// A clock for a connection that became ready at `now` (the handshake counts as
    /// activity). `max_idle`: `None` never closes.
    pub fn new(now: Instant, max_idle: Option<Duration>) -> Self {
        Self {
            max_idle,
            last_active: now,
        }
    }

    /// A request was written or an answer read at `now`.
    pub fn handle_activity(&mut self, now: Instant) {
        self.last_active = self.last_active.max(now);
    }

    /// When the connection is due to close if nothing happens before; `None` when it
    /// never closes. Only meaningful while nothing is in flight.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.max_idle.map(|limit| self.last_active + limit)
    }

    /// Whether to close the connection at `now`: idle for longer than the limit, with
    /// nothing in flight (`busy`: a request written and unanswered, or queued).
    pub fn expired(&self, now: Instant, busy: bool) -> bool {
        !busy && self.poll_timeout().is_some_and(|at| now >= at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_connection_closes_after_the_limit_and_activity_postpones_it() {
        let t0 = Instant::now();
        let limit = Duration::from_secs(540);
        let mut clock = IdleClock::new(t0, Some(limit));
        assert_eq!(clock.poll_timeout(), Some(t0 + limit));
        assert!(!clock.expired(t0 + limit - Duration::from_millis(1), false));
        assert!(clock.expired(t0 + limit, false));
        // A request in flight keeps it open, however long the broker holds it.
        assert!(!clock.expired(t0 + limit * 10, true));
        // An answer read at 5 minutes moves the deadline to 14 minutes.
        let answered = t0 + Duration::from_secs(300);
        clock.handle_activity(answered);
        assert_eq!(clock.poll_timeout(), Some(answered + limit));
        assert!(!clock.expired(t0 + limit, false));
        assert!(clock.expired(answered + limit, false));
        // Activity reported out of order never moves the deadline back.
        clock.handle_activity(t0);
        assert_eq!(clock.poll_timeout(), Some(answered + limit));
    }

    #[test]
    fn a_disabled_limit_never_closes() {
        let t0 = Instant::now();
        let clock = IdleClock::new(t0, None);
        assert_eq!(clock.poll_timeout(), None);
        assert!(!clock.expired(t0 + Duration::from_secs(86_400 * 365), false));
    }

    #[test]
    fn azure_event_hubs_lowers_the_limit_below_its_load_balancer() {
        let azure = ["ns.servicebus.windows.net:9093"];
        assert_eq!(
            max_idle(Some(DEFAULT_MAX_IDLE), azure.into_iter()),
            Some(AZURE_MAX_IDLE)
        );
        assert_eq!(
            max_idle(Some(Duration::from_secs(60)), azure.into_iter()),
            Some(Duration::from_secs(60)),
            "a shorter limit stands"
        );
        assert_eq!(
            max_idle(None, azure.into_iter()),
            None,
            "disabled stays disabled"
        );
        let elsewhere = ["kafka-1:9092", "servicebus.windows.net.example:9092"];
        assert_eq!(
            max_idle(Some(DEFAULT_MAX_IDLE), elsewhere.into_iter()),
            Some(DEFAULT_MAX_IDLE)
        );
    }

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
