//! Sending: which partitions are ready, which brokers to send to, and the Produce
//! request.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;

use super::Accumulator;
use super::state::{PartitionState, ProducerIdState};
use super::types::{ProduceError, ProduceToken};
use crate::group::consumer_protocol::TopicPartition;
use crate::metadata::NodeId;
use crate::produce::encode::{ProducerFields, encode_batch};

impl Accumulator {
    fn sendable(&self, now: Instant, p: &PartitionState) -> bool {
        !p.in_flight
            && p.retry_at.is_none_or(|t| now >= t)
            && (p.queue.front().is_some()
                || p.open
                    .as_ref()
                    .is_some_and(|b| self.flush_requested || now >= b.created + self.config.linger))
    }

    /// Brokers with a batch ready and no Produce in flight, claimed: follow with
    /// [`Accumulator::build_produce`].
    pub fn claim_ready(&mut self, now: Instant) -> Vec<NodeId> {
        self.claim_ready_gated(now, |_| true)
    }

    /// As [`Accumulator::claim_ready`], counting only the partitions `may_send`
    /// allows: a transactional producer holds a partition's batches until the
    /// coordinator added it to the transaction
    /// ([`TransactionManager::may_send`](crate::produce::transaction::TransactionManager::may_send)).
    pub fn claim_ready_gated(
        &mut self,
        now: Instant,
        may_send: impl Fn(&TopicPartition) -> bool,
    ) -> Vec<NodeId> {
        if matches!(
            self.producer_id,
            ProducerIdState::Needed { .. } | ProducerIdState::Requested
        ) {
            return Vec::new();
        }
        let mut nodes = BTreeSet::new();
        let mut unknown = false;
        for (tp, p) in &self.partitions {
            if !self.sendable(now, p) || !may_send(tp) {
                continue;
            }
            match self.leaders.get(tp) {
                Some(n) if !self.in_flight.contains_key(n) => {
                    nodes.insert(*n);
                }
                Some(_) => {}
                None => unknown = true,
            }
        }
        if unknown {
            self.need_metadata();
        }
        for n in &nodes {
            self.in_flight.insert(*n, (0, Vec::new()));
        }
        nodes.into_iter().collect()
    }

    /// The Produce request for a claimed broker: the head batch of each of its ready
    /// partitions, up to `max.request.size`. `None` releases the claim.
    pub fn build_produce(
        &mut self,
        now: Instant,
        node: NodeId,
        version: i16,
    ) -> Option<(ProduceRequest, ProduceToken)> {
        self.build_produce_gated(now, node, version, |_| true)
    }

    /// As [`Accumulator::build_produce`], with the partitions `may_send` allows
    /// (see [`Accumulator::claim_ready_gated`]).
    pub fn build_produce_gated(
        &mut self,
        now: Instant,
        node: NodeId,
        version: i16,
        may_send: impl Fn(&TopicPartition) -> bool,
    ) -> Option<(ProduceRequest, ProduceToken)> {
        if !self.in_flight.contains_key(&node) {
            return None;
        }
        let fields = match self.producer_id {
            ProducerIdState::Ready { id, epoch } => Some((id, epoch)),
            _ => None,
        };
        let ready: Vec<TopicPartition> = self
            .partitions
            .iter()
            .filter(|(tp, p)| {
                self.leaders.get(*tp) == Some(&node) && self.sendable(now, p) && may_send(tp)
            })
            .map(|(tp, _)| tp.clone())
            .collect();
        let mut by_topic: BTreeMap<String, Vec<PartitionProduceData>> = BTreeMap::new();
        let mut sent = Vec::new();
        let mut size = 0;
        let compression = self.config.compression;
        for tp in ready {
            let Some(p) = self.partitions.get_mut(&tp) else {
                continue;
            };
            if p.queue.is_empty() {
                if let Some(b) = p.open.take() {
                    p.queue.push_back(b);
                }
            }
            let next_sequence = p.next_sequence;
            let Some(batch) = p.queue.front_mut() else {
                continue;
            };
            if size > 0 && size + batch.bytes > self.config.max_request_size {
                break;
            }
            if batch.encoded.is_none() {
                let producer = match fields {
                    Some((id, epoch)) => {
                        let base = *batch.base_sequence.get_or_insert(next_sequence);
                        ProducerFields {
                            producer_id: id,
                            producer_epoch: epoch,
                            base_sequence: base,
                            transactional: self.transactional,
                        }
                    }
                    None => ProducerFields::NONE,
                };
                match encode_batch(&batch.records, compression, producer) {
                    Ok(bytes) => batch.encoded = Some(bytes),
                    Err(e) => {
                        // Nothing was sent: fail the batch, keep the sequence.
                        if let Some(b) = p.queue.pop_front() {
                            self.finish(&tp, b, Err(ProduceError::Encode(e)));
                        }
                        continue;
                    }
                }
                if fields.is_some() {
                    let count = i32::try_from(batch.records.len()).unwrap_or(i32::MAX);
                    p.next_sequence = next_sequence.wrapping_add(count) & i32::MAX;
                }
            }
            batch.attempts += 1;
            if batch.attempts > 1 {
                self.retries += 1;
            }
            let encoded = batch.encoded.clone().unwrap_or_default();
            size += encoded.len();
            p.in_flight = true;
            by_topic.entry(tp.topic.clone()).or_default().push(
                PartitionProduceData::default()
                    .with_index(tp.partition)
                    .with_records(Some(encoded)),
            );
            sent.push(tp);
        }
        self.flush_requested &= !self.is_idle();
        if sent.is_empty() {
            self.in_flight.remove(&node);
            return None;
        }
        self.serial += 1;
        let serial = self.serial;
        self.in_flight.insert(node, (serial, sent));
        // v3-v12 share these fields; v13 (topic ids) is not negotiated.
        let _ = version;
        let transactional_id = (self.config.transactional_id.clone())
            .map(|id| TransactionalId(StrBytes::from_string(id)));
        let request = ProduceRequest::default()
            .with_transactional_id(transactional_id)
            .with_acks(self.config.acks.code())
            .with_timeout_ms(
                i32::try_from(self.config.request_timeout.as_millis()).unwrap_or(i32::MAX),
            )
            .with_topic_data(
                by_topic
                    .into_iter()
                    .map(|(name, partitions)| {
                        TopicProduceData::default()
                            .with_name(TopicName(StrBytes::from_string(name)))
                            .with_partition_data(partitions)
                    })
                    .collect(),
            );
        Some((request, ProduceToken { node, serial }))
    }

    /// Drops a claim that will not be built (the broker is unreachable or offers no
    /// usable Produce version); its batches wait for the next round.
    pub fn release_claim(&mut self, node: NodeId) {
        if self
            .in_flight
            .get(&node)
            .is_some_and(|(serial, _)| *serial == 0)
        {
            self.in_flight.remove(&node);
            self.need_metadata();
        }
    }
}
