//! Planning a fetch: which brokers can be fetched from and when, which partitions a
//! request carries (sessions, rotation, the room left in the buffer), and the request.

use std::time::{Duration, Instant};

use kafka_protocol::messages::FetchRequest;
use kafka_protocol::protocol::StrBytes;

use super::Fetcher;
use super::state::{
    InFlightFetch, PartitionState, Position, SentList, SentPartition, sent_find, target_ref,
};
use super::types::FetchToken;
use crate::fetch::request::{
    FetchParams, IsolationLevel, TargetRef, fetch_request_refs, forgotten_topics_refs,
};
use crate::metadata::NodeId;

impl Fetcher {
    // ----- fetching -----

    fn fetchable(&self, now: Instant, s: &PartitionState) -> bool {
        matches!(s.position, Position::At { .. })
            && s.paused.is_none()
            && s.buffered.is_none()
            && s.source(now).is_some()
            && s.retry_at.is_none_or(|t| now >= t)
    }

    /// The earliest time a backoff or a deferred fetch ends, for the driver's timer.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let partitions = if self.retries_maybe {
            self.partitions.values().filter_map(|s| s.retry_at).min()
        } else {
            None
        };
        let nodes = self.node_retry_at.values().copied();
        partitions
            .into_iter()
            .chain(nodes)
            .chain(self.deferred_until)
            .min()
    }

    /// Whether a Fetch to `node` now would only long-poll: every partition it would
    /// carry has caught up with the log end seen last, while other partitions of the
    /// node still have data waiting in the buffer. The broker would hold such a Fetch
    /// for `fetch.max.wait.ms`, and the waiting partitions could not be fetched again
    /// until it returns, so the fetch waits (at most `fetch.max.wait.ms` after that data
    /// came) for them to drain and then goes out with them. Paused partitions' data
    /// counts too, and so does a partition paused (within that wait) with data still
    /// to get: the Processor pauses a full lane's partition after draining it and
    /// resumes it moments later, and a long poll sent meanwhile held it back for
    /// `fetch.max.wait.ms` (the 1 KiB stall in docs/benchmarks.md). `Some(deadline)`
    /// while deferred.
    fn deferred(&self, now: Instant, node: NodeId) -> Option<Instant> {
        let wait =
            Duration::from_millis(u64::try_from(self.config.params.max_wait_ms).unwrap_or(0));
        let committed = self.config.params.isolation == IsolationLevel::ReadCommitted;
        let caught_up = |s: &PartitionState| {
            let end = if committed && s.last_stable_offset >= 0 {
                s.last_stable_offset
            } else {
                s.high_watermark
            };
            matches!(s.position, Position::At { offset, .. } if end >= 0 && offset >= end)
        };
        let mut deadline: Option<Instant> = None;
        let mut hold_until = |until: Instant| {
            if now < until {
                deadline = Some(deadline.map_or(until, |d| d.min(until)));
            }
        };
        for s in self.partitions.values() {
            if s.source(now) != Some(node) {
                continue;
            }
            if let Some(since) = s.buffered {
                // Paused ones too: a pause to hold back delivery (the Processor's lanes
                // do it when full) usually ends within moments, and a long one costs the
                // other partitions at most this one wait.
                hold_until(since + wait);
            } else if let Some(since) = s.paused {
                // Likewise a pause of a partition that has more to fetch; a pause of a
                // caught-up one (or a long one, past the wait) holds nothing back.
                if !caught_up(s) && matches!(s.position, Position::At { .. }) {
                    hold_until(since + wait);
                }
            } else if self.fetchable(now, s) && !caught_up(s) {
                return None;
            }
        }
        deadline
    }

    /// Brokers that can be fetched from now. Each is marked in flight: follow with
    /// [`Fetcher::build_fetch`], then [`Fetcher::handle_fetch`] or
    /// [`Fetcher::handle_failure`].
    pub fn claim_fetches(&mut self, now: Instant) -> Vec<NodeId> {
        if self.buffered_bytes >= self.config.buffer_max_bytes {
            return Vec::new();
        }
        // One pass over the partitions; each broker is decided once (a few of them,
        // in small lists), not looked up in the maps once per partition.
        let mut nodes: Vec<NodeId> = Vec::new();
        let mut busy: Vec<NodeId> = Vec::new();
        let mut retries = false;
        for s in self.partitions.values() {
            retries |= s.retry_at.is_some();
            // The leader, or the replica it named (KIP-392).
            let Some(source) = s.source(now) else {
                continue;
            };
            if nodes.contains(&source) || busy.contains(&source) || !self.fetchable(now, s) {
                continue;
            }
            if self.fetching.contains_key(&source)
                || self.node_retry_at.get(&source).is_some_and(|t| now < *t)
            {
                busy.push(source);
            } else {
                nodes.push(source);
            }
        }
        nodes.sort_unstable();
        self.retries_maybe = retries;
        self.deferred_until = None;
        nodes.retain(|node| match self.deferred(now, *node) {
            Some(until) => {
                self.deferred_until = Some(self.deferred_until.map_or(until, |d| d.min(until)));
                false
            }
            None => true,
        });
        for node in &nodes {
            self.fetching.insert(
                *node,
                InFlightFetch {
                    version: None,
                    partitions: Vec::new(),
                    session_sent: (0, -1),
                },
            );
        }
        nodes
    }

    /// Builds the Fetch for a claimed broker at the highest version up to
    /// `max_version` that can name its topics (v13+ needs topic ids). `None` releases
    /// the claim: nothing is left to fetch there.
    pub fn build_fetch(
        &mut self,
        now: Instant,
        node: NodeId,
        max_version: i16,
    ) -> Option<(FetchRequest, FetchToken)> {
        if !self.fetching.contains_key(&node) {
            return None;
        }
        let room = self
            .config
            .buffer_max_bytes
            .saturating_sub(self.buffered_bytes);
        let mut wanted: SentList = Vec::new();
        for (tp, s) in &self.partitions {
            if s.source(now) != Some(node) || !self.fetchable(now, s) {
                continue;
            }
            let Position::At { offset, .. } = s.position else {
                continue;
            };
            wanted.push((
                s.topic.clone(),
                tp.partition,
                SentPartition {
                    offset,
                    max_bytes: self.config.partition_max_bytes,
                    leader_epoch: s.leader_epoch,
                    topic_id: s.topic_id,
                },
            ));
        }
        if wanted.is_empty() || room == 0 {
            self.fetching.remove(&node);
            return None;
        }
        let version = if wanted.iter().any(|(_, _, p)| p.topic_id.is_nil()) {
            max_version.min(12)
        } else {
            max_version
        };
        let use_session = self.config.sessions && version >= 7;
        let session = self.sessions.entry(node).or_default();
        // A session's topic naming is fixed by its version: start a new one if a topic
        // lost its id.
        let target = target_ref;
        let (session_id, session_epoch, mut send, forgotten) = if use_session && session.id != 0 {
            let send: Vec<TargetRef<'_>> = wanted
                .iter()
                .filter(|(t, partition, p)| {
                    sent_find(&session.partitions, t, *partition) != Some(p)
                })
                .map(target)
                .collect();
            let forgotten: Vec<TargetRef<'_>> = session
                .partitions
                .iter()
                .filter(|(t, partition, _)| sent_find(&wanted, t, *partition).is_none())
                .map(target)
                .collect();
            (session.id, session.epoch, send, forgotten)
        } else {
            // A full fetch; epoch 0 asks the broker for a new session, -1 for none.
            let epoch = if use_session { 0 } else { -1 };
            (0, epoch, wanted.iter().map(target).collect(), Vec::new())
        };
        let params = FetchParams {
            max_bytes: self
                .config
                .params
                .max_bytes
                .min(i32::try_from(room).unwrap_or(i32::MAX)),
            ..self.config.params
        };
        if !send.is_empty() {
            let turn = self.rotation % send.len();
            send.rotate_left(turn);
            self.rotation = self.rotation.wrapping_add(1);
        }
        let built = fetch_request_refs(version, &params, &send).map(|mut request| {
            if let (Some(rack), true) = (&self.config.rack, version >= 11) {
                request.rack_id = StrBytes::from_string(rack.clone());
            }
            if version >= 7 {
                request.session_id = session_id;
                request.session_epoch = session_epoch;
                request.forgotten_topics_data = forgotten_topics_refs(version, &forgotten);
            }
            request
        });
        let Ok(request) = built else {
            self.fetching.remove(&node);
            return None;
        };
        if let Some(f) = self.fetching.get_mut(&node) {
            f.version = Some(version);
            f.partitions = wanted;
            f.session_sent = (session_id, session_epoch);
        }
        Some((request, FetchToken { node, version }))
    }
}
