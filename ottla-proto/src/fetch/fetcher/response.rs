//! A Fetch answered or failed: sessions moved on or dropped, data buffered, partition
//! errors handled, the backoff of a broker.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::FetchResponse;
use kafka_protocol::messages::fetch_response::PartitionData;
use tracing::{debug, warn};
use uuid::Uuid;

use super::Fetcher;
use super::FetcherRequest;
use super::state::{Completed, Position, SentPartition, sent_in, sent_of_topic};
use super::types::{FetchError, FetchToken, ResetReason};
use crate::Failure;
use crate::error_name;
use crate::fetch::batch::{Batches, CommittedFilter, control_markers};
use crate::fetch::request::IsolationLevel;
use crate::group::consumer_protocol::TopicPartition;
use crate::metadata::NodeId;
use crate::needs_metadata_refresh;

impl Fetcher {
    /// A request failed without a response (disconnect, timeout, undecodable answer,
    /// no usable version). A Fetch: the session is dropped and the broker backs off. A
    /// ListOffsets: its partitions retry after a backoff.
    pub fn handle_failure(&mut self, now: Instant, request: FetcherRequest, failure: Failure) {
        debug!(?request, ?failure, "fetcher request failed");
        match request {
            FetcherRequest::Fetch(node) => self.fetch_failed(now, node),
            FetcherRequest::ListOffsets(node) => self.list_offsets_failed(now, node),
        }
    }

    fn fetch_failed(&mut self, now: Instant, node: NodeId) {
        self.fetching.remove(&node);
        self.sessions.remove(&node);
        // A replica the leader named that cannot be fetched from: back to the leader
        // (Java's `handleFetchFailure`), which may name it again once it is back.
        for (tp, s) in &mut self.partitions {
            if s.reads_from_replica(node) {
                debug!(%tp, replica = node.0, "preferred read replica failed; back to the leader");
                s.read_replica = None;
            }
        }
        let at = self.node_backoff(now, node);
        self.node_retry_at.insert(node, at);
        self.need_metadata();
    }

    /// When `node` may be fetched from again after one more failure in a row.
    fn node_backoff(&mut self, now: Instant, node: NodeId) -> Instant {
        let failures = self.node_failures.entry(node).or_insert(0);
        *failures += 1;
        now + self.backoff.delay(*failures)
    }

    /// Takes a Fetch response.
    pub fn handle_fetch(&mut self, now: Instant, token: FetchToken, response: FetchResponse) {
        let Some(inflight) = self.fetching.remove(&token.node) else {
            return;
        };
        if inflight.version != Some(token.version) {
            return;
        }
        self.node_retry_at.remove(&token.node);
        let node = token.node;
        let failures = self.node_failures.remove(&node);
        let error = response.error_code;
        if error != 0 {
            // FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR
            // and anything else at the top level: start over with a full fetch.
            debug!(node = node.0, error = %error_name(error), "fetch failed; the session is reset");
            self.sessions.remove(&node);
            let session_error = matches!(
                ResponseError::try_from_code(error),
                Some(
                    ResponseError::FetchSessionIdNotFound
                        | ResponseError::InvalidFetchSessionEpoch
                        | ResponseError::FetchSessionTopicIdError
                )
            );
            if !session_error {
                // Still failing: the step goes on from where it was.
                if let Some(failures) = failures {
                    self.node_failures.insert(node, failures);
                }
                let at = self.node_backoff(now, node);
                self.node_retry_at.insert(node, at);
            }
            return;
        }
        // Topic ids of the fetch, one entry per topic (its partitions are together).
        let mut names: Vec<(Uuid, &Arc<str>)> = Vec::new();
        if token.version >= 13 {
            for (topic, _, sent) in &inflight.partitions {
                if !sent.topic_id.is_nil()
                    && names.last().is_none_or(|(id, _)| *id != sent.topic_id)
                {
                    names.push((sent.topic_id, topic));
                }
            }
            names.sort_unstable_by_key(|(id, _)| *id);
        }
        // The whole response stays in memory while any of its partitions' data waits
        // (the records are slices of it), so it is charged to the buffer as one.
        let charge = self.next_charge;
        self.next_charge += 1;
        let before = self.completed.len();
        let mut bytes = 0;
        for topic in response.responses {
            let name: String = if token.version >= 13 {
                match names.binary_search_by_key(&topic.topic_id, |(id, _)| *id) {
                    Ok(i) => names
                        .get(i)
                        .map_or_else(String::new, |(_, n)| n.to_string()),
                    Err(_) => continue,
                }
            } else {
                topic.topic.0.to_string()
            };
            // The partitions this fetch sent of the topic: a partition is then found by
            // its index, without comparing names.
            let sent = sent_of_topic(&inflight.partitions, &name);
            let mut parts: Vec<Option<PartitionData>> =
                topic.partitions.into_iter().map(Some).collect();
            let slow = self.take_quiet_partitions(&name, sent, &parts);
            let from = node;
            // One key per topic, its partition set per entry: no name is allocated per
            // partition.
            let mut key = TopicPartition {
                topic: name,
                partition: 0,
            };
            for i in slow {
                let Some(p) = parts.get_mut(i).and_then(Option::take) else {
                    continue;
                };
                let Some(sent) = sent_in(sent, p.partition_index) else {
                    continue;
                };
                key.partition = p.partition_index;
                bytes += self.on_partition(now, from, &key, sent.offset, p, charge);
            }
        }
        let parts = self.completed.len() - before;
        if parts > 0 {
            self.buffered_bytes += bytes;
            self.charges.insert(charge, (bytes, parts));
        }
        // The session moves on only when the request succeeded.
        if self.config.sessions && token.version >= 7 {
            let (sent_id, sent_epoch) = inflight.session_sent;
            let session = self.sessions.entry(node).or_default();
            if sent_id == 0 {
                session.id = response.session_id;
                session.epoch = 1;
            } else {
                session.epoch = if sent_epoch == i32::MAX {
                    1
                } else {
                    sent_epoch + 1
                };
            }
            session.partitions = if session.id != 0 {
                inflight.partitions
            } else {
                Vec::new()
            };
        }
    }

    /// Takes the partitions of one topic of a response that carry neither records nor
    /// an error (most of a large fetch: a broker returns data for some partitions
    /// and an empty entry for every other one), in one ordered walk over the topic's
    /// partitions instead of a lookup by name each. What they change is what
    /// [`Fetcher::on_partition`] would: the watermarks, and the retry cleared, where
    /// the position is still the one fetched from. Returns the indices of the others,
    /// in response order, for [`Fetcher::on_partition`].
    fn take_quiet_partitions(
        &mut self,
        topic: &str,
        sent: &[(Arc<str>, i32, SentPartition)],
        parts: &[Option<PartitionData>],
    ) -> Vec<usize> {
        let mut quiet: Vec<(i32, usize)> = Vec::new();
        let mut slow: Vec<usize> = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let Some(p) = p else {
                continue;
            };
            let empty = p.records.as_ref().is_none_or(|r| r.is_empty());
            // A leader naming a replica to fetch from answers without records, and
            // `on_partition` takes the replica.
            if p.error_code == 0 && empty && p.preferred_read_replica.0 < 0 {
                quiet.push((p.partition_index, i));
            } else {
                slow.push(i);
            }
        }
        if quiet.is_empty() {
            return slow;
        }
        quiet.sort_unstable();
        let from = TopicPartition {
            topic: topic.to_string(),
            partition: i32::MIN,
        };
        let mut states = self
            .partitions
            .range_mut(from..)
            .take_while(|(tp, _)| tp.topic == topic)
            .peekable();
        for (partition, i) in quiet {
            while states.next_if(|(tp, _)| tp.partition < partition).is_some() {}
            let Some((tp, s)) = states.next_if(|(tp, _)| tp.partition == partition) else {
                continue;
            };
            let (Some(Some(p)), Some(sent)) = (parts.get(i), sent_in(sent, partition)) else {
                continue;
            };
            if !matches!(s.position, Position::At { offset, .. } if offset == sent.offset) {
                // The position moved (seek, reset) while the fetch was out.
                continue;
            }
            tracing::trace!(%tp, fetch_offset = sent.offset, high_watermark = p.high_watermark, log_start = p.log_start_offset, "fetched partition: no records");
            s.high_watermark = p.high_watermark;
            s.last_stable_offset = p.last_stable_offset;
            s.log_start_offset = p.log_start_offset;
            s.retry_at = None;
            s.failures = 0;
        }
        slow
    }

    /// Takes one partition of a response from broker `from`; returns the bytes it left
    /// in the buffer.
    fn on_partition(
        &mut self,
        now: Instant,
        from: NodeId,
        tp: &TopicPartition,
        fetch_offset: i64,
        p: PartitionData,
        charge: u64,
    ) -> usize {
        let isolation = self.config.params.isolation;
        let options = self.config.batch;
        let Some(s) = self.partitions.get_mut(tp) else {
            return 0;
        };
        if !matches!(s.position, Position::At { offset, .. } if offset == fetch_offset) {
            // The position moved (seek, reset) while the fetch was out.
            return 0;
        }
        let code = p.error_code;
        tracing::trace!(%tp, fetch_offset, error = %error_name(code), high_watermark = p.high_watermark, log_start = p.log_start_offset, bytes = p.records.as_ref().map_or(0, |r| r.len()), "fetched partition");
        let replica = p.preferred_read_replica.0;
        if code == 0 && replica >= 0 && NodeId(replica) != from {
            // KIP-392: the leader names a replica (in this consumer's rack) to fetch
            // from, until `metadata.max.age.ms` passes.
            debug!(%tp, replica, leader = from.0, "fetching from the preferred read replica");
            s.read_replica = Some((NodeId(replica), now + self.config.read_replica_expiry));
        }
        let from_replica = s.reads_from_replica(from);
        if code == 0 {
            s.high_watermark = p.high_watermark;
            s.last_stable_offset = p.last_stable_offset;
            s.log_start_offset = p.log_start_offset;
            s.retry_at = None;
            s.failures = 0;
            let records = p.records.unwrap_or_default();
            if records.is_empty() || s.buffered.is_some() {
                return 0;
            }
            s.buffered = Some(now);
            let filter = (isolation == IsolationLevel::ReadCommitted).then(|| {
                CommittedFilter::new(
                    p.aborted_transactions
                        .unwrap_or_default()
                        .into_iter()
                        .map(|a| (a.producer_id.0, a.first_offset))
                        .collect(),
                )
                .with_markers(control_markers(&records))
            });
            let counted = records.len();
            self.completed.push_back(Completed {
                tp: tp.clone(),
                topic: s.topic.clone(),
                batches: Batches::new(records, options),
                charge,
                filter,
                records: VecDeque::new(),
                pending_error: None,
                batch_epoch: -1,
                batch_end: fetch_offset,
            });
            return counted;
        }
        s.failures += 1;
        let retry_at = now + self.backoff.delay(s.failures);
        if from_replica {
            // Java's rules for a replica the leader named: an offset out of range there
            // (a replica behind the leader, or ahead of a truncated one) is not the
            // position's fault, so no reset: the next fetch asks the leader. The
            // errors that send the leader's fetch to metadata send this one back to
            // the leader (and to metadata too, below). Unlike Java, the next fetch waits
            // out the partition's backoff: a leader that names the same lagging replica
            // again would otherwise be asked in a tight loop.
            s.read_replica = None;
            if code == ResponseError::OffsetOutOfRange.code() {
                debug!(%tp, offset = fetch_offset, replica = from.0, "offset out of range on the read replica; back to the leader");
                s.retry_at = Some(retry_at);
                self.retries_maybe = true;
                return 0;
            }
        }
        match ResponseError::try_from_code(code) {
            Some(ResponseError::OffsetOutOfRange) => {
                debug!(%tp, offset = fetch_offset, "offset out of range");
                let position = self.reset_position(
                    tp,
                    ResetReason::OutOfRange {
                        offset: fetch_offset,
                    },
                );
                if let Some(s) = self.partitions.get_mut(tp) {
                    s.set_position(self.round, position);
                }
            }
            _ if needs_metadata_refresh(code)
                || code == ResponseError::ReplicaNotAvailable.code()
                || code == ResponseError::OffsetNotAvailable.code() =>
            {
                debug!(%tp, error = %error_name(code), "fetch: leadership changed; refreshing metadata");
                s.leader = None;
                s.retry_at = Some(retry_at);
                self.retries_maybe = true;
                self.need_metadata();
            }
            Some(
                ResponseError::TopicAuthorizationFailed
                | ResponseError::CorruptMessage
                | ResponseError::UnsupportedCompressionType,
            ) => {
                s.set_position(self.round, Position::Stopped(Some((fetch_offset, -1))));
                self.stop(FetchError::Broker {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    api: "Fetch",
                    code,
                });
            }
            _ => {
                warn!(%tp, error = %error_name(code), "fetch error; retrying after a backoff");
                s.retry_at = Some(retry_at);
                self.retries_maybe = true;
            }
        }
        0
    }
}
