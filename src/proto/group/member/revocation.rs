//! The commit an eager member makes of the partitions it gives back: which refusals
//! are tried again, and for how long. The driver makes the commits and sleeps; this
//! decides, on a clock it is given.

use std::time::{Duration, Instant};

use crate::proto::backoff::Backoff;

use kafka_protocol::ResponseError;

use super::types::{CommitError, GroupConfig, GroupProtocol};

/// The commit of the partitions being revoked, tried again while it may still succeed.
///
/// Contract: [`RevocationCommit::new`] when the member asks for the partitions back
/// ([`super::Event::RevokeRequested`]); after each refused attempt,
/// [`RevocationCommit::handle_failure`] says whether to try again and when. A commit
/// that succeeds needs nothing more.
#[derive(Debug, Clone)]
pub struct RevocationCommit {
    deadline: Instant,
    backoff: Backoff,
    attempts: u32,
}

/// What to do after a refused commit at revocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevocationStep {
    /// Try the same commit again after this long.
    Retry {
        /// How long to wait first.
        after: Duration,
    },
    /// Stop: the revocation completes without this commit, and the next owner starts
    /// at the last committed offset.
    GiveUp {
        /// The attempts made.
        attempts: u32,
    },
}

impl RevocationCommit {
    /// The commits of a revocation the member asked for at `asked_at`.
    pub fn new(config: &GroupConfig, asked_at: Instant) -> Self {
        Self {
            deadline: asked_at + Self::budget(config),
            backoff: Backoff::new(config.retry_backoff, config.retry_backoff_max, config.seed),
            attempts: 0,
        }
    }

    /// How long after the member asked for its partitions back their commit may still
    /// be tried.
    ///
    /// Classic protocol: half the shorter of the session timeout and the rebalance
    /// timeout (`max.poll.interval.ms`), less a heartbeat interval. The JoinGroup waits
    /// for this commit, and the join phase it must reach is bounded by what the broker
    /// allows: Kafka waits for the rebalance timeout, but the librdkafka mock closes the
    /// round session timeout - 1 s after it began and expels whoever has not rejoined;
    /// the round may have begun a heartbeat interval before this member heard of it.
    /// The Java client's `onJoinPrepare` retries until its rebalance timeout, which on
    /// such a broker costs the member its place and starts the next round.
    ///
    /// Consumer protocol (KIP-848): half the rebalance timeout. There is no join
    /// phase; the broker waits up to the rebalance timeout for the member to
    /// acknowledge the revocation in a heartbeat.
    pub fn budget(config: &GroupConfig) -> Duration {
        match config.protocol {
            GroupProtocol::Classic => (config.session_timeout.min(config.max_poll_interval) / 2)
                .saturating_sub(config.heartbeat_interval),
            GroupProtocol::Consumer => config.max_poll_interval / 2,
        }
    }

    /// Until when an attempt may start.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// An attempt, made at `now`, was refused with `error`.
    ///
    /// Given up at once: without the generation (it ended, or the answer came after it
    /// did); on an error that is not retriable; and on REBALANCE_IN_PROGRESS. Kafka
    /// answers that only once the join phase is over, the librdkafka mock for as long
    /// as it lasts: either way the commit cannot succeed before this member has
    /// rejoined, and waiting for it keeps the JoinGroup from the round (the Java
    /// client's `onJoinPrepare` goes on to join: its RebalanceInProgressException is not
    /// retriable). Otherwise tried again after the backoff while that starts before
    /// [`RevocationCommit::deadline`].
    pub fn handle_failure(&mut self, now: Instant, error: &CommitError) -> RevocationStep {
        self.attempts += 1;
        let attempts = self.attempts;
        let rebalancing = matches!(error, CommitError::Broker { code, .. }
            if *code == ResponseError::RebalanceInProgress.code());
        let hopeless = matches!(error, CommitError::NoGeneration | CommitError::Stale { .. });
        let after = self.backoff.delay(attempts);
        if rebalancing || hopeless || !error.is_retriable() || now + after >= self.deadline {
            return RevocationStep::GiveUp { attempts };
        }
        RevocationStep::Retry { after }
    }
}
