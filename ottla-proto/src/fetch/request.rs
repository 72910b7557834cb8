//! Fetch requests for a negotiated version, and the partitions of a Fetch response.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

/// `isolation.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationLevel {
    /// Every record, including those of open or aborted transactions (the default).
    #[default]
    ReadUncommitted,
    /// Only committed records, up to the last stable offset.
    ReadCommitted,
}

/// Request-wide fetch settings (the Java client's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchParams {
    /// `fetch.max.wait.ms`.
    pub max_wait_ms: i32,
    /// `fetch.min.bytes`.
    pub min_bytes: i32,
    /// `fetch.max.bytes`.
    pub max_bytes: i32,
    /// `isolation.level`.
    pub isolation: IsolationLevel,
}

impl Default for FetchParams {
    fn default() -> Self {
        Self {
            max_wait_ms: 500,
            min_bytes: 1,
            max_bytes: 50 * 1024 * 1024,
            isolation: IsolationLevel::ReadUncommitted,
        }
    }
}

/// One partition to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchTarget {
    /// The topic name.
    pub topic: String,
    /// The topic id (needed from Fetch v13, where topics are named by id).
    pub topic_id: Uuid,
    /// The partition.
    pub partition: i32,
    /// The offset to fetch from.
    pub offset: i64,
    /// The leader epoch the client believes current (KIP-320), or -1.
    pub leader_epoch: i32,
    /// `max.partition.fetch.bytes`.
    pub max_bytes: i32,
}

/// A fetch that cannot be expressed at the negotiated version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FetchRequestError {
    /// Fetch v13+ names topics by id and this topic has none.
    #[error("Fetch v{version} needs the id of topic {topic}, which metadata did not give")]
    NoTopicId {
        /// The version.
        version: i16,
        /// The topic.
        topic: String,
    },
}

/// One partition to fetch, borrowing its topic name: what the fetcher builds a request
/// from without a name allocated per partition per round (a member with 10,000
/// partitions builds one every few milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetRef<'a> {
    /// The topic name.
    pub topic: &'a str,
    /// The topic id (needed from Fetch v13).
    pub topic_id: Uuid,
    /// The partition.
    pub partition: i32,
    /// The offset to fetch from.
    pub offset: i64,
    /// The leader epoch the client believes current (KIP-320), or -1.
    pub leader_epoch: i32,
    /// `max.partition.fetch.bytes`.
    pub max_bytes: i32,
}

impl<'a> From<&'a FetchTarget> for TargetRef<'a> {
    fn from(t: &'a FetchTarget) -> Self {
        TargetRef {
            topic: &t.topic,
            topic_id: t.topic_id,
            partition: t.partition,
            offset: t.offset,
            leader_epoch: t.leader_epoch,
            max_bytes: t.max_bytes,
        }
    }
}

/// Builds a full (sessionless) Fetch request at `version` (4..=16).
pub fn fetch_request(
    version: i16,
    params: &FetchParams,
    targets: &[FetchTarget],
) -> Result<FetchRequest, FetchRequestError> {
    let targets: Vec<TargetRef<'_>> = targets.iter().map(TargetRef::from).collect();
    fetch_request_refs(version, params, &targets)
}

/// [`fetch_request`] from borrowed targets.
pub fn fetch_request_refs(
    version: i16,
    params: &FetchParams,
    targets: &[TargetRef<'_>],
) -> Result<FetchRequest, FetchRequestError> {
    // Topics in the order of their first partition, partitions in the order given: a
    // broker fills a response in request order.
    let mut by_topic: Vec<((&str, Uuid), Vec<&TargetRef<'_>>)> = Vec::new();
    let mut index: HashMap<(&str, Uuid), usize> = HashMap::new();
    for t in targets {
        if version >= 13 && t.topic_id.is_nil() {
            return Err(FetchRequestError::NoTopicId {
                version,
                topic: t.topic.to_string(),
            });
        }
        let key = (t.topic, t.topic_id);
        // A topic's partitions come together (the fetcher sends them in order): the
        // last topic is tried before the index, so a partition costs a comparison,
        // not a hash.
        if let Some((last, parts)) = by_topic.last_mut() {
            if *last == key {
                parts.push(t);
                continue;
            }
        }
        match index.get(&key).and_then(|&i| by_topic.get_mut(i)) {
            Some((_, parts)) => parts.push(t),
            None => {
                index.insert(key, by_topic.len());
                by_topic.push((key, vec![t]));
            }
        }
    }
    let topics = by_topic
        .into_iter()
        .map(|((name, id), parts)| {
            let mut topic = FetchTopic::default();
            if version >= 13 {
                topic.topic_id = id;
            } else {
                topic.topic = TopicName(StrBytes::from_string(name.to_string()));
            }
            topic.partitions = parts
                .into_iter()
                .map(|t| {
                    let mut p = FetchPartition::default()
                        .with_partition(t.partition)
                        .with_fetch_offset(t.offset)
                        .with_partition_max_bytes(t.max_bytes);
                    if version >= 9 {
                        p.current_leader_epoch = t.leader_epoch;
                    }
                    p
                })
                .collect();
            topic
        })
        .collect();
    let mut request = FetchRequest::default()
        .with_max_wait_ms(params.max_wait_ms)
        .with_min_bytes(params.min_bytes)
        .with_topics(topics);
    request.max_bytes = params.max_bytes;
    request.isolation_level = match params.isolation {
        IsolationLevel::ReadUncommitted => 0,
        IsolationLevel::ReadCommitted => 1,
    };
    Ok(request)
}

/// The `forgotten_topics_data` of an incremental fetch (v7+): partitions leaving the
/// fetch session, named by topic id from v13.
pub fn forgotten_topics(version: i16, targets: &[FetchTarget]) -> Vec<ForgottenTopic> {
    let targets: Vec<TargetRef<'_>> = targets.iter().map(TargetRef::from).collect();
    forgotten_topics_refs(version, &targets)
}

/// [`forgotten_topics`] from borrowed targets.
pub fn forgotten_topics_refs(version: i16, targets: &[TargetRef<'_>]) -> Vec<ForgottenTopic> {
    let mut by_topic: BTreeMap<(&str, Uuid), Vec<i32>> = BTreeMap::new();
    for t in targets {
        by_topic
            .entry((t.topic, t.topic_id))
            .or_default()
            .push(t.partition);
    }
    by_topic
        .into_iter()
        .map(|((name, id), partitions)| {
            let mut topic = ForgottenTopic::default();
            if version >= 13 {
                topic.topic_id = id;
            } else {
                topic.topic = TopicName(StrBytes::from_string(name.to_string()));
            }
            topic.partitions = partitions;
            topic
        })
        .collect()
}

/// One partition of a Fetch response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedPartition {
    /// The topic name (resolved from its id from v13).
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The partition's error code.
    pub error: i16,
    /// The high watermark: the offset after the last replicated record.
    pub high_watermark: i64,
    /// The last stable offset (read_committed's limit).
    pub last_stable_offset: i64,
    /// The log start offset.
    pub log_start_offset: i64,
    /// `(producer id, first offset)` of transactions aborted in the fetched range.
    pub aborted: Vec<(i64, i64)>,
    /// The record batches, possibly ending in a partial one.
    pub records: Bytes,
}

/// The partitions of `response`; topic ids are resolved through `names` (v13+).
/// Partitions of unknown topic ids are skipped.
pub fn fetched_partitions(
    version: i16,
    response: FetchResponse,
    names: &BTreeMap<Uuid, String>,
) -> Vec<FetchedPartition> {
    let mut out = Vec::new();
    for topic in response.responses {
        let name = if version >= 13 {
            match names.get(&topic.topic_id) {
                Some(n) => n.clone(),
                None => continue,
            }
        } else {
            topic.topic.0.to_string()
        };
        for p in topic.partitions {
            out.push(FetchedPartition {
                topic: name.clone(),
                partition: p.partition_index,
                error: p.error_code,
                high_watermark: p.high_watermark,
                last_stable_offset: p.last_stable_offset,
                log_start_offset: p.log_start_offset,
                aborted: p
                    .aborted_transactions
                    .unwrap_or_default()
                    .into_iter()
                    .map(|a| (a.producer_id.0, a.first_offset))
                    .collect(),
                records: p.records.unwrap_or_default(),
            });
        }
    }
    out
}
