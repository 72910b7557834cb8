//! The Consumer's own rules, beside the group member and the fetcher: when to commit
//! automatically, when to refresh metadata, and how the commit on close is tried.
//!
//! They used to live in the Consumer's async task, where only a broker and a real
//! clock could test them. Here they take `now` like every machine of the core, and the
//! task is a `select!` loop that does what they say.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::group::member::CommitError;
use crate::metadata::RefreshPace;

pub use crate::group::member::DEFAULT_CLOSE_TIMEOUT;

/// The consumer's session settings (the Java client's names).
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// `enable.auto.commit` with `auto.commit.interval.ms`: `None` when off.
    pub auto_commit: Option<Duration>,
    /// `retry.backoff.ms`: the first step of every backoff.
    pub retry_backoff: Duration,
    /// `retry.backoff.max.ms`: the cap of every backoff.
    pub retry_backoff_max: Duration,
    /// Seeds the backoffs' jitter.
    pub seed: u64,
    /// How long the commit on close may keep trying ([`DEFAULT_CLOSE_TIMEOUT`]; a
    /// group's `GroupConfig::close_timeout`).
    pub close_timeout: Duration,
}

/// What the driver must do for the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAction {
    /// Refresh the cluster metadata; report the end with
    /// [`ConsumerSession::metadata_refreshed`].
    RefreshMetadata,
    /// Commit the positions the application came back from; report the end with
    /// [`ConsumerSession::auto_commit_done`] (also when there was nothing to commit).
    AutoCommit,
}

/// The timers of a consumer's session, one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionTimer {
    /// `auto.commit.interval.ms` after the last automatic commit was due.
    AutoCommit,
    /// The end of the metadata refresh backoff ([`RefreshPace`]).
    MetadataRefresh,
}

/// The consumer's session: the automatic commit's clock and the metadata refresh pace.
///
/// Contract: [`ConsumerSession::metadata_needed`] when the fetcher asks for metadata;
/// [`ConsumerSession::handle_timeout`] on every turn of the driver, then
/// [`ConsumerSession::poll_action`] until `None`; report each action's end; sleep until
/// [`ConsumerSession::poll_timeout`].
#[derive(Debug, Clone)]
pub struct ConsumerSession {
    auto_commit: Option<AutoCommit>,
    metadata: RefreshPace,
    actions: std::collections::VecDeque<SessionAction>,
}

#[derive(Debug, Clone)]
struct AutoCommit {
    interval: Duration,
    next: Instant,
    /// One automatic commit at a time: an interval shorter than a commit's round trip
    /// would otherwise queue commits without end (the next one carries newer offsets).
    in_flight: bool,
}

impl ConsumerSession {
    /// A session started at `now`: the first automatic commit is due an interval later.
    pub fn new(config: &SessionConfig, now: Instant) -> Self {
        Self {
            auto_commit: config.auto_commit.map(|interval| AutoCommit {
                interval,
                next: now + interval,
                in_flight: false,
            }),
            metadata: RefreshPace::new(
                config.retry_backoff,
                config.retry_backoff_max,
                config.seed.rotate_left(41),
            ),
            actions: Default::default(),
        }
    }

    /// Whether automatic commits are on.
    pub fn auto_commits(&self) -> bool {
        self.auto_commit.is_some()
    }

    /// The fetcher (or anyone) wants fresh metadata.
    pub fn metadata_needed(&mut self) {
        self.metadata.request();
    }

    /// The refresh asked for by [`SessionAction::RefreshMetadata`] ended; `ok` whether
    /// it brought metadata. A failed one is asked again after a backoff that doubles
    /// with each failure in a row (KIP-580).
    pub fn metadata_refreshed(&mut self, now: Instant, ok: bool) {
        self.metadata.handle_done(now, ok);
    }

    /// The commit asked for by [`SessionAction::AutoCommit`] ended (either way).
    pub fn auto_commit_done(&mut self) {
        if let Some(a) = &mut self.auto_commit {
            a.in_flight = false;
        }
    }

    /// The time passed: queues what is due.
    ///
    /// An automatic commit is due every `auto.commit.interval.ms`. The interval restarts
    /// when it falls due, as the Java client's timer does, and a commit still in flight
    /// then makes this one skipped, not queued.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(a) = &mut self.auto_commit {
            if now >= a.next {
                a.next = now + a.interval;
                if !a.in_flight {
                    a.in_flight = true;
                    self.actions.push_back(SessionAction::AutoCommit);
                }
            }
        }
        if self.metadata.poll_start(now) {
            self.actions.push_back(SessionAction::RefreshMetadata);
        }
    }

    /// The next thing to do.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<SessionAction> {
        self.actions.pop_front()
    }

    /// The earliest timer, and which one.
    #[must_use]
    pub fn poll_timer(&self) -> Option<(Instant, SessionTimer)> {
        let commit = self
            .auto_commit
            .as_ref()
            .map(|a| (a.next, SessionTimer::AutoCommit));
        let metadata = self
            .metadata
            .poll_timeout()
            .map(|t| (t, SessionTimer::MetadataRefresh));
        [commit, metadata]
            .into_iter()
            .flatten()
            .min_by_key(|(t, _)| *t)
    }

    /// When to call [`ConsumerSession::handle_timeout`] next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.poll_timer().map(|(t, _)| t)
    }
}

/// The commit a consumer makes on close, tried again while it may still land.
///
/// Contract: [`CloseCommit::new`] when the close begins; after each refused attempt,
/// [`CloseCommit::handle_failure`] says what to do.
#[derive(Debug, Clone)]
pub struct CloseCommit {
    deadline: Instant,
    backoff: Backoff,
    attempts: u32,
}

/// What to do after a refused commit on close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseStep {
    /// Commit again, with what is still owned, after this long.
    Retry {
        /// How long to wait first.
        after: Duration,
    },
    /// Stop trying; the close succeeds. The generation ended under the commit, so the
    /// partitions' next owner starts at the last committed offset (the Java client
    /// logs this and closes).
    Abandon,
    /// Stop trying; the close fails with this error.
    Fail,
}

impl CloseCommit {
    /// The commits of a close that began at `now`, tried for up to
    /// [`SessionConfig::close_timeout`].
    pub fn new(config: &SessionConfig, now: Instant) -> Self {
        Self {
            deadline: now + config.close_timeout,
            backoff: Backoff::new(
                config.retry_backoff,
                config.retry_backoff_max,
                config.seed.rotate_left(7),
            ),
            attempts: 0,
        }
    }

    /// Until when an attempt may start.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// An attempt, made at `now`, was refused with `error`.
    ///
    /// Tried again, after the backoff and while that is before the deadline: a
    /// retriable refusal (a rebalance in progress is waited out, so the commit lands
    /// in the next generation) and [`CommitError::NotOwned`] (a revocation raced the
    /// commit; the next attempt carries what is still owned). Abandoned, with the close
    /// succeeding: a refusal that means the member's generation ended (its partitions
    /// belong to their next owner). Anything else fails the close (authorization, a
    /// fatal group error, a rebalance or race still going at the deadline).
    pub fn handle_failure(&mut self, now: Instant, error: &CommitError) -> CloseStep {
        self.attempts += 1;
        let again = error.is_retriable() || matches!(error, CommitError::NotOwned(_));
        if again {
            let after = self.backoff.delay(self.attempts);
            if now + after < self.deadline {
                return CloseStep::Retry { after };
            }
        }
        if error.membership_lost() {
            return CloseStep::Abandon;
        }
        CloseStep::Fail
    }

    /// The attempts made.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::ResponseError;

    use super::*;
    use crate::group::consumer_protocol::TopicPartition;

    fn config(auto_commit: Option<Duration>) -> SessionConfig {
        SessionConfig {
            auto_commit,
            retry_backoff: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(1),
            seed: 5,
            close_timeout: DEFAULT_CLOSE_TIMEOUT,
        }
    }

    fn drain(s: &mut ConsumerSession) -> Vec<SessionAction> {
        std::iter::from_fn(|| s.poll_action()).collect()
    }

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn auto_commit_falls_due_every_interval_from_the_start() {
        let t0 = Instant::now();
        let mut s = ConsumerSession::new(&config(Some(5 * SEC)), t0);
        assert_eq!(
            s.poll_timer(),
            Some((t0 + 5 * SEC, SessionTimer::AutoCommit))
        );
        s.handle_timeout(t0 + 4 * SEC);
        assert_eq!(drain(&mut s), vec![]);
        s.handle_timeout(t0 + 5 * SEC);
        assert_eq!(drain(&mut s), vec![SessionAction::AutoCommit]);
        s.auto_commit_done();
        assert_eq!(s.poll_timeout(), Some(t0 + 10 * SEC));
        // A late timer (a busy host) restarts the interval from when it fired.
        s.handle_timeout(t0 + 13 * SEC);
        assert_eq!(drain(&mut s), vec![SessionAction::AutoCommit]);
        assert_eq!(s.poll_timeout(), Some(t0 + 18 * SEC));
    }

    #[test]
    fn auto_commit_due_while_one_is_in_flight_is_skipped_not_queued() {
        let t0 = Instant::now();
        let mut s = ConsumerSession::new(&config(Some(SEC)), t0);
        s.handle_timeout(t0 + SEC);
        assert_eq!(drain(&mut s), vec![SessionAction::AutoCommit]);
        for i in 2..6 {
            s.handle_timeout(t0 + i * SEC);
            assert_eq!(drain(&mut s), vec![], "second {i}: the first is still out");
        }
        s.auto_commit_done();
        s.handle_timeout(t0 + 6 * SEC);
        assert_eq!(drain(&mut s), vec![SessionAction::AutoCommit]);
    }

    #[test]
    fn without_auto_commit_no_commit_and_no_timer() {
        let t0 = Instant::now();
        let mut s = ConsumerSession::new(&config(None), t0);
        assert!(!s.auto_commits());
        assert_eq!(s.poll_timeout(), None);
        s.handle_timeout(t0 + 3600 * SEC);
        assert_eq!(drain(&mut s), vec![]);
    }

    #[test]
    fn metadata_refreshes_are_paced_and_failures_back_off_exponentially() {
        let t0 = Instant::now();
        let mut s = ConsumerSession::new(&config(None), t0);
        s.metadata_needed();
        s.handle_timeout(t0);
        assert_eq!(drain(&mut s), vec![SessionAction::RefreshMetadata]);
        // Asked again while it runs: coalesced.
        s.metadata_needed();
        s.handle_timeout(t0);
        assert_eq!(drain(&mut s), vec![]);
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..4 {
            s.metadata_refreshed(now, false);
            let (at, timer) = s.poll_timer().expect("a failed refresh is asked again");
            assert_eq!(timer, SessionTimer::MetadataRefresh);
            s.handle_timeout(at - Duration::from_millis(1));
            assert_eq!(drain(&mut s), vec![], "not before the backoff");
            s.handle_timeout(at);
            assert_eq!(drain(&mut s), vec![SessionAction::RefreshMetadata]);
            waits.push((at - now).as_millis() as u64);
            now = at;
        }
        // 200, 400, 800, 1000 ms nominal (±20%, capped at 1 s): it used to be flat.
        for (w, nominal) in waits.iter().zip([200u64, 400, 800, 1000]) {
            assert!(*w >= nominal * 8 / 10 && *w <= 1000, "{waits:?}");
        }
        assert!(waits[0] < waits[1] && waits[1] < waits[2], "{waits:?}");
        s.metadata_refreshed(now, true);
        assert_eq!(s.poll_timeout(), None, "nothing wanted after a success");
    }

    fn broker(code: ResponseError) -> CommitError {
        CommitError::Broker {
            code: code.code(),
            name: format!("{code:?}"),
        }
    }

    #[test]
    fn close_commit_waits_out_a_rebalance_then_fails_at_the_deadline() {
        let t0 = Instant::now();
        let mut c = CloseCommit::new(&config(None), t0);
        assert_eq!(c.deadline(), t0 + 30 * SEC);
        let mut now = t0;
        loop {
            match c.handle_failure(now, &broker(ResponseError::RebalanceInProgress)) {
                CloseStep::Retry { after } => {
                    assert!(after <= SEC);
                    now += after;
                }
                CloseStep::Fail => break,
                CloseStep::Abandon => panic!("a rebalance is not a lost generation"),
            }
        }
        assert!(
            now <= t0 + 30 * SEC && now + SEC >= t0 + 29 * SEC,
            "{:?}",
            now - t0
        );
        assert!(c.attempts() > 25, "{}", c.attempts());
    }

    #[test]
    fn close_commit_retries_a_revocation_race_and_abandons_a_lost_generation() {
        let t0 = Instant::now();
        let mut c = CloseCommit::new(&config(None), t0);
        let raced = CommitError::NotOwned(TopicPartition::new("t", 0));
        assert!(matches!(
            c.handle_failure(t0, &raced),
            CloseStep::Retry { .. }
        ));
        assert_eq!(
            c.handle_failure(t0, &broker(ResponseError::IllegalGeneration)),
            CloseStep::Abandon
        );
        assert_eq!(
            c.handle_failure(t0, &broker(ResponseError::UnknownMemberId)),
            CloseStep::Abandon
        );
        assert_eq!(
            c.handle_failure(t0, &broker(ResponseError::GroupAuthorizationFailed)),
            CloseStep::Fail
        );
        // A revocation race that never ends fails the close at the deadline, as
        // before (it is not a lost generation).
        assert_eq!(c.handle_failure(t0 + 30 * SEC, &raced), CloseStep::Fail);
    }

    #[test]
    fn close_commit_deadline_is_the_given_timeout() {
        let t0 = Instant::now();
        let mut c = CloseCommit::new(
            &SessionConfig {
                close_timeout: 2 * SEC,
                ..config(None)
            },
            t0,
        );
        let mut now = t0;
        while let CloseStep::Retry { after } =
            c.handle_failure(now, &broker(ResponseError::CoordinatorLoadInProgress))
        {
            now += after;
        }
        assert!(now < t0 + 2 * SEC);
    }
}
