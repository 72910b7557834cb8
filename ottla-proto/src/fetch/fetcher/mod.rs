//! The fetcher, sans-IO: positions, leaders, fetch sessions, offset resets, pause and
//! resume, and a bounded buffer of fetched data that the application drains record by
//! record.
//!
//! The driver asks which brokers can be fetched from ([`Fetcher::claim_fetches`]), has
//! the fetcher build each request at the version the broker negotiated
//! ([`Fetcher::build_fetch`]), and hands back the response ([`Fetcher::handle_fetch`])
//! or the failure. Offset resets go the same way through ListOffsets. The application
//! side drains records with [`Fetcher::next_record`]. Nothing here reads a clock: every
//! call that needs the time takes `now`.
//!
//! Rules this module keeps (see docs/invariants.md):
//! - At most one Fetch in flight per broker, and a partition is never in a request while
//!   fetched data of it waits in the buffer.
//! - Data is kept only if the partition's position still equals the offset it was
//!   fetched from; a seek, reset, revocation or reassignment discards it.
//! - No new fetch starts while the buffered bytes are at the cap, and a request asks for
//!   no more than the room left (the broker may still return one whole batch, KIP-74).
//! - A corrupt batch stops its partition at the batch's offset with a typed error; the
//!   position never moves past a record that was not delivered.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, warn};
use uuid::Uuid;

use super::request::IsolationLevel;
use crate::backoff::Backoff;
use crate::group::consumer_protocol::TopicPartition;
use crate::metadata::{ClusterMetadata, NodeId};

mod drain;
mod plan;
mod resets;
mod response;
mod state;
mod types;

pub use super::record::{ConsumerRecord, ConsumerRecordBuilder, Header, Headers, TimestampType};
use state::{Completed, InFlightFetch, PartitionState, Position, Session};
pub use types::{
    FetchError, FetchToken, FetcherConfig, FetcherEvent, FetcherRequest, OffsetReset, ResetReason,
};

/// The fetcher. See the module docs.
#[derive(Debug)]
pub struct Fetcher {
    config: FetcherConfig,
    partitions: BTreeMap<TopicPartition, PartitionState>,
    sessions: HashMap<NodeId, Session>,
    fetching: HashMap<NodeId, InFlightFetch>,
    /// Brokers with a ListOffsets claimed or in flight.
    resetting: BTreeSet<NodeId>,
    node_retry_at: HashMap<NodeId, Instant>,
    /// Failed Fetch requests in a row, per broker (the backoff's step).
    node_failures: HashMap<NodeId, u32>,
    /// `retry.backoff.ms` doubling to `retry.backoff.max.ms`, jittered.
    backoff: Backoff,
    completed: VecDeque<Completed>,
    buffered_bytes: usize,
    /// Per response with data still buffered: `(bytes, partitions not yet drained)`.
    charges: HashMap<u64, (usize, usize)>,
    next_charge: u64,
    errors: VecDeque<FetchError>,
    events: VecDeque<FetcherEvent>,
    metadata_needed: bool,
    /// Counts the calls of [`Fetcher::mark_consumed`], from 1.
    round: u64,
    /// The earliest end of a deferred fetch (see [`Fetcher::deferred`]), as of the last
    /// [`Fetcher::claim_fetches`].
    deferred_until: Option<Instant>,
    /// Turns the order of partitions in each request (KIP-74: a broker fills partitions
    /// in request order, so a fixed order starves the last ones).
    rotation: usize,
    /// False only when no partition needs a reset: [`Fetcher::resets_due`], called on
    /// every turn of the driver, then skips its pass over every partition. Set
    /// wherever a position becomes `NeedsReset`, cleared by a pass that finds none.
    resets_maybe: bool,
    /// False only when no partition has a `retry_at`: [`Fetcher::poll_timeout`] then
    /// skips its pass. Set wherever a `retry_at` is, cleared by
    /// [`Fetcher::claim_fetches`]'s pass when it sees none.
    retries_maybe: bool,
}

impl Fetcher {
    /// A fetcher with no partitions.
    pub fn new(config: FetcherConfig) -> Self {
        let backoff = Backoff::new(config.retry_backoff, config.retry_backoff_max, config.seed);
        Self {
            config,
            partitions: BTreeMap::new(),
            sessions: HashMap::new(),
            fetching: HashMap::new(),
            resetting: BTreeSet::new(),
            node_retry_at: HashMap::new(),
            node_failures: HashMap::new(),
            backoff,
            completed: VecDeque::new(),
            buffered_bytes: 0,
            charges: HashMap::new(),
            next_charge: 0,
            errors: VecDeque::new(),
            events: VecDeque::new(),
            metadata_needed: false,
            round: 1,
            deferred_until: None,
            rotation: 0,
            resets_maybe: false,
            retries_maybe: false,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FetcherConfig {
        &self.config
    }

    // ----- assignment and positions -----

    /// Adds partitions. With `await_committed`, each waits for
    /// [`Fetcher::set_committed`]; otherwise it starts from `auto.offset.reset`.
    /// Partitions already assigned are left as they are.
    pub fn assign(&mut self, partitions: &[TopicPartition], await_committed: bool) {
        for tp in partitions {
            if self.partitions.contains_key(tp) {
                continue;
            }
            let position = if await_committed {
                Position::AwaitingCommitted
            } else {
                self.reset_position(tp, ResetReason::NoCommittedOffset)
            };
            self.partitions.insert(
                tp.clone(),
                PartitionState {
                    topic: Arc::from(tp.topic.as_str()),
                    topic_id: Uuid::nil(),
                    leader: None,
                    leader_epoch: -1,
                    read_replica: None,
                    position,
                    paused: None,
                    high_watermark: -1,
                    last_stable_offset: -1,
                    log_start_offset: -1,
                    retry_at: None,
                    failures: 0,
                    buffered: None,
                    consumed: None,
                    moved_round: 0,
                },
            );
        }
        // New partitions need their leaders, whatever was asked before.
        self.metadata_needed = false;
        self.need_metadata();
    }

    fn reset_position(&mut self, tp: &TopicPartition, reason: ResetReason) -> Position {
        if self.config.reset == OffsetReset::None {
            let error = match reason {
                ResetReason::OutOfRange { offset } => FetchError::OutOfRange {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    offset,
                },
                _ => FetchError::NoOffset {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                },
            };
            self.stop(error);
            let at = match reason {
                ResetReason::OutOfRange { offset } => Some((offset, -1)),
                _ => None,
            };
            Position::Stopped(at)
        } else {
            self.resets_maybe = true;
            Position::NeedsReset(reason)
        }
    }

    fn stop(&mut self, error: FetchError) {
        warn!(%error, "partition stopped");
        self.events
            .push_back(FetcherEvent::PartitionStopped(error.clone()));
        self.errors.push_back(error);
    }

    /// Removes partitions (revoked or lost) and drops their buffered data. Returns their
    /// positions: `(partition, offset, leader epoch)`.
    pub fn unassign(&mut self, partitions: &[TopicPartition]) -> Vec<(TopicPartition, i64, i32)> {
        let mut out = Vec::new();
        for tp in partitions {
            if let Some(state) = self.partitions.remove(tp) {
                if let Position::At { offset, epoch } | Position::Stopped(Some((offset, epoch))) =
                    state.position
                {
                    out.push((tp.clone(), offset, epoch));
                }
            }
        }
        let gone: BTreeSet<&TopicPartition> = partitions.iter().collect();
        self.drop_completed(|c| gone.contains(&c.tp));
        out
    }

    /// Sets the start position of a partition awaiting its committed offset
    /// (`offset < 0`: none committed, so `auto.offset.reset` applies).
    pub fn set_committed(&mut self, tp: &TopicPartition, offset: i64, leader_epoch: i32) {
        let awaiting = self
            .partitions
            .get(tp)
            .is_some_and(|s| s.position == Position::AwaitingCommitted);
        if !awaiting {
            return;
        }
        let position = if offset >= 0 {
            Position::At {
                offset,
                epoch: leader_epoch,
            }
        } else {
            self.reset_position(tp, ResetReason::NoCommittedOffset)
        };
        if let Some(s) = self.partitions.get_mut(tp) {
            s.set_position(self.round, position);
            // The committed offset is what was consumed, from now on.
            s.consumed = Some((offset, leader_epoch));
        }
    }

    /// Moves a partition to `offset` (also restarts a stopped partition).
    pub fn seek(&mut self, tp: &TopicPartition, offset: i64) {
        if let Some(s) = self.partitions.get_mut(tp) {
            s.set_position(self.round, Position::At { offset, epoch: -1 });
            s.retry_at = None;
            s.failures = 0;
        }
        self.drop_completed(|c| &c.tp == tp);
    }

    /// Resets a partition through `auto.offset.reset` (also restarts a stopped one).
    pub fn reset(&mut self, tp: &TopicPartition) {
        if self.partitions.contains_key(tp) {
            let position = self.reset_position(tp, ResetReason::Requested);
            if let Some(s) = self.partitions.get_mut(tp) {
                s.set_position(self.round, position);
            }
        }
        self.drop_completed(|c| &c.tp == tp);
    }

    /// Drops a partition's fetched, undelivered records; its position stays at the
    /// last record delivered.
    pub fn discard_buffered(&mut self, tp: &TopicPartition) {
        self.drop_completed(|c| &c.tp == tp);
    }

    /// Stops fetching a partition; its buffered records are held back until
    /// [`Fetcher::resume`]. `now` is when: a Fetch that would only long-poll waits up
    /// to `fetch.max.wait.ms` from then for a paused partition with data to get
    /// (see [`Fetcher::poll_timeout`]).
    pub fn pause(&mut self, now: Instant, tp: &TopicPartition) {
        if let Some(s) = self.partitions.get_mut(tp) {
            s.paused.get_or_insert(now);
        }
    }

    /// Resumes a paused partition.
    pub fn resume(&mut self, tp: &TopicPartition) {
        if let Some(s) = self.partitions.get_mut(tp) {
            s.paused = None;
        }
    }

    /// The paused partitions.
    pub fn paused(&self) -> Vec<TopicPartition> {
        self.partitions
            .iter()
            .filter(|(_, s)| s.paused.is_some())
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    /// The assigned partitions.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.partitions.keys().cloned().collect()
    }

    /// The next offset to deliver, with the leader epoch of the last record delivered
    /// (for a stopped partition: where it stopped).
    pub fn position(&self, tp: &TopicPartition) -> Option<(i64, i32)> {
        match self.partitions.get(tp)?.position {
            Position::At { offset, epoch } | Position::Stopped(Some((offset, epoch))) => {
                Some((offset, epoch))
            }
            _ => None,
        }
    }

    /// Whether a partition is stopped by an error (until a seek).
    pub fn is_stopped(&self, tp: &TopicPartition) -> bool {
        self.partitions
            .get(tp)
            .is_some_and(|s| matches!(s.position, Position::Stopped(_)))
    }

    /// Every known position (see [`Fetcher::position`]).
    pub fn positions(&self) -> Vec<(TopicPartition, i64, i32)> {
        self.partitions
            .keys()
            .filter_map(|tp| self.position(tp).map(|(o, e)| (tp.clone(), o, e)))
            .collect()
    }

    /// Records that the application finished everything delivered so far (it came back
    /// for more): those positions become the ones [`Fetcher::consumed`] reports.
    pub fn mark_consumed(&mut self) {
        self.round += 1;
    }

    /// Positions as of the last [`Fetcher::mark_consumed`], for partitions in `only`
    /// (all when `None`); partitions never delivered from are left out.
    pub fn consumed(&self, only: Option<&[TopicPartition]>) -> Vec<(TopicPartition, i64, i32)> {
        self.partitions
            .iter()
            .filter(|(tp, _)| only.is_none_or(|o| o.contains(tp)))
            .filter_map(|(tp, s)| {
                let (offset, epoch) = s.consumed_in(self.round)?;
                (offset >= 0).then(|| (tp.clone(), offset, epoch))
            })
            .collect()
    }

    /// The high watermark minus the position: records not yet delivered.
    pub fn lag(&self, tp: &TopicPartition) -> Option<i64> {
        let s = self.partitions.get(tp)?;
        match s.position {
            Position::At { offset, .. } if s.high_watermark >= 0 => {
                let end = match self.config.params.isolation {
                    IsolationLevel::ReadCommitted if s.last_stable_offset >= 0 => {
                        s.last_stable_offset
                    }
                    _ => s.high_watermark,
                };
                Some((end - offset).max(0))
            }
            _ => None,
        }
    }

    /// The last high watermark, last stable offset and log start offset seen.
    pub fn watermarks(&self, tp: &TopicPartition) -> Option<(i64, i64, i64)> {
        let s = self.partitions.get(tp)?;
        Some((s.high_watermark, s.last_stable_offset, s.log_start_offset))
    }

    /// Bytes fetched and not yet delivered.
    pub fn buffered_bytes(&self) -> usize {
        self.buffered_bytes
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<FetcherEvent> {
        self.events.pop_front()
    }

    /// Leaders, leader epochs and topic ids from fresh metadata.
    pub fn update_metadata(&mut self, metadata: &ClusterMetadata) {
        self.metadata_needed = false;
        // The topic is looked up once per run of its partitions, and a partition by
        // binary search (metadata keeps them sorted): `ClusterMetadata::leader` scans
        // the topic's partitions, which made this quadratic in a topic's size.
        let mut topic: Option<&crate::metadata::TopicMetadata> = None;
        for (tp, s) in &mut self.partitions {
            if topic.is_none_or(|t| t.name != tp.topic) {
                topic = metadata.topic(&tp.topic);
            }
            if let Some((replica, _)) = s.read_replica {
                if !metadata.brokers.contains_key(&replica) {
                    debug!(%tp, replica = replica.0, "the preferred read replica left the cluster; back to the leader");
                    s.read_replica = None;
                }
            }
            let Some(t) = topic else {
                continue;
            };
            s.topic_id = t.id;
            let found = t
                .partitions
                .binary_search_by_key(&tp.partition, |p| p.partition)
                .ok()
                // Metadata not sorted (built by hand): a scan.
                .or_else(|| {
                    t.partitions
                        .iter()
                        .position(|p| p.partition == tp.partition)
                })
                .and_then(|i| t.partitions.get(i))
                .and_then(|p| Some((p.leader?, p.leader_epoch)));
            match found {
                Some((leader, epoch)) if epoch.0 >= s.leader_epoch || s.leader.is_none() => {
                    if s.leader != Some(leader) {
                        debug!(%tp, leader = leader.0, epoch = epoch.0, "partition leader");
                    }
                    s.leader = Some(leader);
                    s.leader_epoch = epoch.0;
                }
                Some(_) => {}
                None => s.leader = None,
            }
        }
    }

    fn need_metadata(&mut self) {
        if !self.metadata_needed {
            self.metadata_needed = true;
            self.events.push_back(FetcherEvent::MetadataNeeded);
        }
    }
}

#[cfg(test)]
mod tests;
