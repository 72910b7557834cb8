//! Offset resets through ListOffsets.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, ListOffsetsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tracing::debug;

use super::Fetcher;
use super::state::Position;
use super::types::{FetchError, FetcherEvent, OffsetReset};
use crate::fetch::request::IsolationLevel;
use crate::group::consumer_protocol::TopicPartition;
use crate::metadata::NodeId;
use crate::needs_metadata_refresh;

impl Fetcher {
    // ----- offset resets -----

    /// Brokers that have partitions to reset, claimed: follow with
    /// [`Fetcher::build_list_offsets`], then the response or the failure.
    pub fn resets_due(&mut self, now: Instant) -> Vec<NodeId> {
        if !self.resets_maybe {
            return Vec::new();
        }
        let mut nodes = BTreeSet::new();
        let mut unknown = false;
        let mut any = false;
        for s in self.partitions.values() {
            if let Position::NeedsReset(_) = s.position {
                any = true;
                if s.retry_at.is_some_and(|t| now < t) {
                    continue;
                }
                match s.leader {
                    Some(l) if !self.resetting.contains(&l) => {
                        nodes.insert(l);
                    }
                    Some(_) => {}
                    None => unknown = true,
                }
            }
        }
        self.resets_maybe = any;
        if unknown {
            self.need_metadata();
        }
        self.resetting.extend(nodes.iter().copied());
        nodes.into_iter().collect()
    }

    /// The ListOffsets for partitions led by `node` that need a reset, at `version`
    /// (1 or later). Marks them as resetting.
    pub fn build_list_offsets(
        &mut self,
        now: Instant,
        node: NodeId,
        version: i16,
    ) -> Option<ListOffsetsRequest> {
        let timestamp = match self.config.reset {
            OffsetReset::Earliest => -2,
            _ => -1,
        };
        let mut by_topic: BTreeMap<String, Vec<ListOffsetsPartition>> = BTreeMap::new();
        for (tp, s) in &mut self.partitions {
            let Position::NeedsReset(reason) = s.position else {
                continue;
            };
            if s.leader != Some(node) || s.retry_at.is_some_and(|t| now < t) {
                continue;
            }
            s.set_position(self.round, Position::Resetting(node, reason));
            let mut p = ListOffsetsPartition::default()
                .with_partition_index(tp.partition)
                .with_timestamp(timestamp);
            if version >= 4 {
                p.current_leader_epoch = s.leader_epoch;
            }
            by_topic.entry(tp.topic.clone()).or_default().push(p);
        }
        if by_topic.is_empty() {
            self.resetting.remove(&node);
            return None;
        }
        let mut request = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(
                by_topic
                    .into_iter()
                    .map(|(name, partitions)| {
                        ListOffsetsTopic::default()
                            .with_name(TopicName(StrBytes::from_string(name)))
                            .with_partitions(partitions)
                    })
                    .collect(),
            );
        if version >= 2 {
            request.isolation_level = match self.config.params.isolation {
                IsolationLevel::ReadUncommitted => 0,
                IsolationLevel::ReadCommitted => 1,
            };
        }
        Some(request)
    }

    /// A ListOffsets to `node` failed: its partitions retry after a backoff.
    pub(super) fn list_offsets_failed(&mut self, now: Instant, node: NodeId) {
        self.resetting.remove(&node);
        for s in self.partitions.values_mut() {
            if let Position::Resetting(n, reason) = s.position {
                if n == node {
                    s.set_position(self.round, Position::NeedsReset(reason));
                    s.failures += 1;
                    s.retry_at = Some(now + self.backoff.delay(s.failures));
                    self.resets_maybe = true;
                    self.retries_maybe = true;
                }
            }
        }
        self.need_metadata();
    }

    /// Takes a ListOffsets response from `node`.
    pub fn handle_list_offsets(
        &mut self,
        now: Instant,
        node: NodeId,
        response: ListOffsetsResponse,
    ) {
        self.resetting.remove(&node);
        let mut answered = BTreeSet::new();
        for topic in response.topics {
            let name = topic.name.0.to_string();
            for p in topic.partitions {
                let tp = TopicPartition {
                    topic: name.clone(),
                    partition: p.partition_index,
                };
                let Some(s) = self.partitions.get_mut(&tp) else {
                    continue;
                };
                let Position::Resetting(n, reason) = s.position else {
                    continue;
                };
                if n != node {
                    continue;
                }
                answered.insert(tp.clone());
                if p.error_code == 0 && p.offset >= 0 {
                    s.set_position(
                        self.round,
                        Position::At {
                            offset: p.offset,
                            epoch: p.leader_epoch,
                        },
                    );
                    s.retry_at = None;
                    s.failures = 0;
                    debug!(%tp, offset = p.offset, ?reason, "position reset");
                    self.events.push_back(FetcherEvent::OffsetReset {
                        partition: tp,
                        reason,
                        offset: p.offset,
                    });
                    continue;
                }
                s.set_position(self.round, Position::NeedsReset(reason));
                s.failures += 1;
                s.retry_at = Some(now + self.backoff.delay(s.failures));
                self.resets_maybe = true;
                self.retries_maybe = true;
                if needs_metadata_refresh(p.error_code) {
                    s.leader = None;
                    self.need_metadata();
                } else if p.error_code == ResponseError::TopicAuthorizationFailed.code() {
                    s.set_position(self.round, Position::Stopped(None));
                    self.stop(FetchError::Broker {
                        topic: tp.topic.clone(),
                        partition: tp.partition,
                        api: "ListOffsets",
                        code: p.error_code,
                    });
                }
            }
        }
        // Partitions the broker did not answer for retry.
        for (tp, s) in &mut self.partitions {
            if let Position::Resetting(n, reason) = s.position {
                if n == node && !answered.contains(tp) {
                    s.set_position(self.round, Position::NeedsReset(reason));
                    s.failures += 1;
                    s.retry_at = Some(now + self.backoff.delay(s.failures));
                    self.resets_maybe = true;
                    self.retries_maybe = true;
                }
            }
        }
    }
}
