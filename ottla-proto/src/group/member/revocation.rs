//! The commit an eager member makes of the partitions it gives back: which refusals
//! are tried again, and for how long. The driver makes the commits and sleeps; this
//! decides, on a clock it is given.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;

use kafka_protocol::ResponseError;

use crate::group::types::{CommitError, GroupConfig, GroupProtocol};

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

/// The revocation the application is finishing, as the driver must know it to act on
/// its answer: which of the partitions asked for are still the member's to give back.
///
/// Contract: [`PendingRevocation::asked`] on [`super::Event::RevokeRequested`];
/// [`PendingRevocation::lost`] and [`PendingRevocation::assigned`] on those events;
/// [`PendingRevocation::ready`] when the application says it finished, which returns
/// the partitions to stop fetching and commit: only those still under that
/// revocation. A partition lost meanwhile and assigned again (a fence in the middle of a
/// revocation, then a rejoin) belongs to the new assignment: stopping it on the old
/// revocation's word left it assigned and never fetched again (chaos under load,
/// consumer protocol: `lost=721 drained=false`).
#[derive(Debug, Clone, Default)]
pub struct PendingRevocation {
    pending: Option<(
        i32,
        std::collections::BTreeSet<crate::group::consumer_protocol::TopicPartition>,
    )>,
}

impl PendingRevocation {
    /// The member asked for `partitions` back in `generation`.
    pub fn asked(
        &mut self,
        generation: i32,
        partitions: &[crate::group::consumer_protocol::TopicPartition],
    ) {
        self.pending = Some((generation, partitions.iter().cloned().collect()));
    }

    /// `partitions` were lost: they are no longer this revocation's.
    pub fn lost(&mut self, partitions: &[crate::group::consumer_protocol::TopicPartition]) {
        self.forget(partitions);
    }

    /// `partitions` were assigned (again): they belong to the new assignment.
    pub fn assigned(&mut self, partitions: &[crate::group::consumer_protocol::TopicPartition]) {
        self.forget(partitions);
    }

    /// The application finished the revocation of `generation`: the partitions still
    /// under it, to commit and stop fetching (none for another generation's).
    pub fn ready(
        &mut self,
        generation: i32,
        partitions: &[crate::group::consumer_protocol::TopicPartition],
    ) -> Vec<crate::group::consumer_protocol::TopicPartition> {
        match self.pending.take() {
            Some((asked, pending)) if asked == generation => partitions
                .iter()
                .filter(|tp| pending.contains(*tp))
                .cloned()
                .collect(),
            other => {
                self.pending = other;
                Vec::new()
            }
        }
    }

    fn forget(&mut self, partitions: &[crate::group::consumer_protocol::TopicPartition]) {
        if let Some((_, pending)) = &mut self.pending {
            for tp in partitions {
                pending.remove(tp);
            }
        }
    }
}
