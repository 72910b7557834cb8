//! The commit an eager member makes of the partitions it gives back: which refusals
//! are tried again, and for how long. The driver makes the commits and sleeps; this
//! decides, on a clock it is given.

use std::time::{Duration, Instant};

use crate::proto::backoff::Backoff;

use super::types::{CommitError, GroupConfig};

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
    /// be tried: half the rebalance timeout (`max.poll.interval.ms`). The Java client's
    /// `onJoinPrepare` retries until its rebalance timeout; the other half is left for
    /// the member to rejoin before its own revocation deadline.
    pub fn budget(config: &GroupConfig) -> Duration {
        config.max_poll_interval / 2
    }

    /// Until when an attempt may start.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// An attempt, made at `now`, was refused with `error`.
    pub fn handle_failure(&mut self, now: Instant, error: &CommitError) -> RevocationStep {
        self.attempts += 1;
        let attempts = self.attempts;
        // Without the generation (it ended, or the answer came after it did) another
        // try cannot help.
        let hopeless = matches!(error, CommitError::NoGeneration | CommitError::Stale { .. });
        let after = self.backoff.delay(attempts);
        if hopeless || !error.is_retriable() || now + after >= self.deadline {
            return RevocationStep::GiveUp { attempts };
        }
        RevocationStep::Retry { after }
    }
}
