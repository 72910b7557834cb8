//! The admin client's pure parts: the requests it builds for a negotiated version, what
//! it reads out of the responses, and which error codes send a request elsewhere.
//!
//! Nothing here performs I/O; `ottla::admin` routes the requests and retries them.
//! Every per-item error code a response carries comes back out of these functions as
//! that item's code, never dropped.

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::{
    BrokerId, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeConfigsRequest,
    DescribeConfigsResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    ListOffsetsRequest, ListOffsetsResponse, OffsetCommitRequest, OffsetCommitResponse,
    OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest, OffsetFetchResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::fetch::request::IsolationLevel;
use crate::group::consumer_protocol::{
    Assignment, Subscription, TopicPartition, decode_assignment, decode_subscription,
};
use crate::needs_metadata_refresh;

/// A topic to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTopic {
    /// The topic's name.
    pub name: String,
    /// How many partitions; `-1` leaves it to the broker's `num.partitions`.
    pub partitions: i32,
    /// How many replicas of each partition; `-1` leaves it to the broker's
    /// `default.replication.factor`.
    pub replication_factor: i16,
    /// Topic configs (`cleanup.policy`, `retention.ms`, ...).
    pub configs: BTreeMap<String, String>,
}

impl NewTopic {
    /// A topic with `partitions` partitions of `replication_factor` replicas each.
    pub fn new(name: impl Into<String>, partitions: i32, replication_factor: i16) -> Self {
        NewTopic {
            name: name.into(),
            partitions,
            replication_factor,
            configs: BTreeMap::new(),
        }
    }

    /// Adds a topic config.
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.configs.insert(key.into(), value.into());
        self
    }
}

/// Which offset of a partition `ottla::AdminClient::list_offsets` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OffsetSpec {
    /// The log start offset.
    Earliest,
    /// The log end offset (the last stable offset under `read_committed`).
    Latest,
    /// The offset of the record with the highest timestamp (KIP-734, ListOffsets v7+).
    MaxTimestamp,
    /// The first offset whose record timestamp is at or after this many ms since the
    /// epoch; none if every record is older.
    Timestamp(i64),
}

impl OffsetSpec {
    /// The `timestamp` field that asks for this offset.
    pub fn timestamp(self) -> i64 {
        match self {
            OffsetSpec::Earliest => -2,
            OffsetSpec::Latest => -1,
            OffsetSpec::MaxTimestamp => -3,
            OffsetSpec::Timestamp(t) => t,
        }
    }

    /// The lowest ListOffsets version that can ask for this offset.
    pub fn min_version(self) -> i16 {
        match self {
            OffsetSpec::MaxTimestamp => 7,
            _ => 1,
        }
    }
}

/// One partition's answer to ListOffsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedOffset {
    /// The offset, or `None` when no record matches (a timestamp after every record's).
    pub offset: Option<i64>,
    /// The timestamp of the record at `offset`, when the broker reports one
    /// (`-1` for earliest and latest on most brokers).
    pub timestamp: i64,
    /// The leader epoch the broker reported (`-1` if none).
    pub leader_epoch: i32,
}

impl ListedOffset {
    /// This answer read as the answer to `spec`. For a timestamp, Kafka returns the
    /// found record's timestamp, which is never before the one asked for; an answer
    /// with an earlier one (tansu 0.6.0 answers offset 0 with timestamp -1 when every
    /// record is older) found nothing.
    pub fn answering(self, spec: OffsetSpec) -> ListedOffset {
        match spec {
            OffsetSpec::Timestamp(t) if self.timestamp < t => ListedOffset {
                offset: None,
                ..self
            },
            _ => self,
        }
    }
}

/// A committed offset of a group, as OffsetFetch reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    /// The offset; `None` when the group committed nothing for the partition.
    pub offset: Option<i64>,
    /// The leader epoch committed with it (`-1` if none).
    pub leader_epoch: i32,
    /// The metadata string committed with it.
    pub metadata: Option<String>,
}

/// A group as ListGroups reports it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct GroupListing {
    /// The group id.
    pub group: String,
    /// Its protocol type (`consumer` for consumer groups; empty for groups that only
    /// commit offsets).
    pub protocol_type: String,
    /// Its state (ListGroups v4+; `None` before).
    pub state: Option<String>,
}

/// A member of a described group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    /// The member id.
    pub member_id: String,
    /// The static member id (`group.instance.id`), if any.
    pub instance_id: Option<String>,
    /// The member's client id.
    pub client_id: String,
    /// The member's host, as the broker saw it.
    pub client_host: String,
    /// The member's subscription, decoded when the group speaks the consumer protocol.
    pub subscription: Option<Subscription>,
    /// The member's assignment, decoded when the group speaks the consumer protocol.
    pub assignment: Option<Assignment>,
    /// The assignment bytes as the broker sent them.
    pub raw_assignment: Bytes,
}

/// A group as DescribeGroups reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// The group id.
    pub group: String,
    /// Its state: `Empty`, `PreparingRebalance`, `CompletingRebalance`, `Stable` or
    /// `Dead` (which a group that does not exist also reports).
    pub state: String,
    /// Its protocol type (`consumer`, ...).
    pub protocol_type: String,
    /// The protocol chosen by the group (the assignor's name, for consumers).
    pub protocol: String,
    /// Its members.
    pub members: Vec<MemberDescription>,
}

/// One topic config, as DescribeConfigs reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    /// The config's name.
    pub name: String,
    /// Its value; `None` for a sensitive value or one without a value.
    pub value: Option<String>,
    /// Whether it cannot be changed.
    pub read_only: bool,
    /// Whether the value is the broker's default (config source 5, or `is_default` on
    /// v0).
    pub is_default: bool,
    /// Whether the value is sensitive (hidden).
    pub sensitive: bool,
}

/// What an admin request's error code asks of the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reroute {
    /// The broker is not the controller (NOT_CONTROLLER): refresh metadata and send to
    /// the new controller.
    Controller,
    /// The broker is not (or not yet) the group's coordinator: find it again.
    Coordinator,
    /// The broker does not lead the partition: refresh metadata and send to the
    /// leader.
    Leader,
}

/// Whether `code` asks for the request to be sent again elsewhere (or again, after a
/// moment), and where. The one table of the admin client's retriable errors.
pub fn reroute(code: i16) -> Option<Reroute> {
    match ResponseError::try_from_code(code)? {
        ResponseError::NotController => Some(Reroute::Controller),
        ResponseError::NotCoordinator
        | ResponseError::CoordinatorNotAvailable
        | ResponseError::CoordinatorLoadInProgress => Some(Reroute::Coordinator),
        // UNKNOWN_TOPIC_OR_PARTITION is a final answer for an admin call about a topic
        // (the Java admin's too): the topic does not exist.
        ResponseError::UnknownTopicOrPartition => None,
        _ if needs_metadata_refresh(code) => Some(Reroute::Leader),
        _ => None,
    }
}

/// A per-item outcome read from a response: the item's name, its error code (0 for
/// success) and the broker's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemResult {
    /// The topic (or other item) the result is for.
    pub name: String,
    /// The error code, 0 for success.
    pub code: i16,
    /// The broker's error message, if any.
    pub message: Option<String>,
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn item(name: String, code: i16, message: Option<&StrBytes>) -> ItemResult {
    ItemResult {
        name,
        code,
        message: message.map(|m| m.to_string()),
    }
}

/// CreateTopics for `topics` (v2+).
pub fn create_topics_request(
    topics: &[NewTopic],
    timeout_ms: i32,
    validate_only: bool,
) -> CreateTopicsRequest {
    CreateTopicsRequest::default()
        .with_timeout_ms(timeout_ms)
        .with_validate_only(validate_only)
        .with_topics(
            topics
                .iter()
                .map(|t| {
                    CreatableTopic::default()
                        .with_name(TopicName(s(&t.name)))
                        .with_num_partitions(t.partitions)
                        .with_replication_factor(t.replication_factor)
                        .with_configs(
                            t.configs
                                .iter()
                                .map(|(k, v)| {
                                    CreatableTopicConfig::default()
                                        .with_name(s(k))
                                        .with_value(Some(s(v)))
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
}

/// Each topic's outcome in a CreateTopics response.
pub fn create_topics_results(response: &CreateTopicsResponse) -> Vec<ItemResult> {
    response
        .topics
        .iter()
        .map(|t| item(t.name.0.to_string(), t.error_code, t.error_message.as_ref()))
        .collect()
}

/// DeleteTopics for `names` at `version` (names move into `topics` at v6).
pub fn delete_topics_request(
    names: &[String],
    timeout_ms: i32,
    version: i16,
) -> DeleteTopicsRequest {
    let mut r = DeleteTopicsRequest::default().with_timeout_ms(timeout_ms);
    if version >= 6 {
        r.topics = names
            .iter()
            .map(|n| DeleteTopicState::default().with_name(Some(TopicName(s(n)))))
            .collect();
    } else {
        r.topic_names = names.iter().map(|n| TopicName(s(n))).collect();
    }
    r
}

/// Each topic's outcome in a DeleteTopics response (a result without a name is
/// skipped: ottla deletes by name only, so it cannot be matched to a request).
pub fn delete_topics_results(response: &DeleteTopicsResponse) -> Vec<ItemResult> {
    response
        .responses
        .iter()
        .filter_map(|t| {
            let name = t.name.as_ref()?.0.to_string();
            Some(item(name, t.error_code, t.error_message.as_ref()))
        })
        .collect()
}

/// CreatePartitions growing each topic to its count.
pub fn create_partitions_request(
    counts: &[(String, i32)],
    timeout_ms: i32,
    validate_only: bool,
) -> CreatePartitionsRequest {
    CreatePartitionsRequest::default()
        .with_timeout_ms(timeout_ms)
        .with_validate_only(validate_only)
        .with_topics(
            counts
                .iter()
                .map(|(name, count)| {
                    CreatePartitionsTopic::default()
                        .with_name(TopicName(s(name)))
                        .with_count(*count)
                        .with_assignments(None)
                })
                .collect(),
        )
}

/// Each topic's outcome in a CreatePartitions response.
pub fn create_partitions_results(response: &CreatePartitionsResponse) -> Vec<ItemResult> {
    response
        .results
        .iter()
        .map(|t| item(t.name.0.to_string(), t.error_code, t.error_message.as_ref()))
        .collect()
}

/// The resource type of a topic in DescribeConfigs.
const RESOURCE_TOPIC: i8 = 2;
/// `config_source` of a broker default (DescribeConfigs v1+).
const SOURCE_DEFAULT: i8 = 5;

/// A topic's configs, by name.
pub type TopicConfigs = BTreeMap<String, ConfigEntry>;

/// DescribeConfigs for every config of each topic.
pub fn describe_topic_configs_request(topics: &[String]) -> DescribeConfigsRequest {
    DescribeConfigsRequest::default().with_resources(
        topics
            .iter()
            .map(|t| {
                DescribeConfigsResource::default()
                    .with_resource_type(RESOURCE_TOPIC)
                    .with_resource_name(s(t))
                    .with_configuration_keys(None)
            })
            .collect(),
    )
}

/// Each topic's configs (by name) or its error code and message.
pub fn describe_topic_configs_results(
    response: &DescribeConfigsResponse,
) -> Vec<(String, Result<TopicConfigs, ItemResult>)> {
    response
        .results
        .iter()
        .filter(|r| r.resource_type == RESOURCE_TOPIC)
        .map(|r| {
            let name = r.resource_name.to_string();
            if r.error_code != 0 {
                let err = item(name.clone(), r.error_code, r.error_message.as_ref());
                return (name, Err(err));
            }
            let configs = r
                .configs
                .iter()
                .map(|c| {
                    (
                        c.name.to_string(),
                        ConfigEntry {
                            name: c.name.to_string(),
                            value: c.value.as_ref().map(|v| v.to_string()),
                            read_only: c.read_only,
                            is_default: c.config_source == SOURCE_DEFAULT,
                            sensitive: c.is_sensitive,
                        },
                    )
                })
                .collect();
            (name, Ok(configs))
        })
        .collect()
}

/// FindCoordinator for a group at `version` (v4 batches keys).
pub fn find_coordinator_request(group: &str, version: i16) -> FindCoordinatorRequest {
    let mut r = FindCoordinatorRequest::default();
    if version >= 4 {
        r.coordinator_keys = vec![s(group)];
    } else {
        r.key = s(group);
    }
    r
}

/// The coordinator a FindCoordinator response names: `(node, host:port)`, or its error
/// code.
pub fn coordinator_of(
    response: &FindCoordinatorResponse,
    version: i16,
) -> Result<(i32, String), i16> {
    let (code, node, host, port) = if version >= 4 {
        let Some(c) = response.coordinators.first() else {
            return Err(ResponseError::CoordinatorNotAvailable.code());
        };
        (c.error_code, c.node_id.0, &c.host, c.port)
    } else {
        (
            response.error_code,
            response.node_id.0,
            &response.host,
            response.port,
        )
    };
    if code != 0 {
        return Err(code);
    }
    Ok((node, format!("{host}:{port}")))
}

/// Reads a DescribeGroups entry; the members' subscriptions and assignments are decoded
/// when the group's protocol type is `consumer` (and left `None` when they do not
/// decode: the raw bytes stay in `raw_assignment`).
pub fn group_description(g: &DescribedGroup) -> GroupDescription {
    let consumer = g.protocol_type.as_str() == "consumer";
    GroupDescription {
        group: g.group_id.0.to_string(),
        state: g.group_state.to_string(),
        protocol_type: g.protocol_type.to_string(),
        protocol: g.protocol_data.to_string(),
        members: g
            .members
            .iter()
            .map(|m| MemberDescription {
                member_id: m.member_id.to_string(),
                instance_id: m.group_instance_id.as_ref().map(|i| i.to_string()),
                client_id: m.client_id.to_string(),
                client_host: m.client_host.to_string(),
                subscription: (consumer && !m.member_metadata.is_empty())
                    .then(|| decode_subscription(m.member_metadata.clone()).ok())
                    .flatten(),
                assignment: (consumer && !m.member_assignment.is_empty())
                    .then(|| decode_assignment(m.member_assignment.clone()).ok())
                    .flatten(),
                raw_assignment: m.member_assignment.clone(),
            })
            .collect(),
    }
}

fn by_topic<'a>(
    partitions: impl IntoIterator<Item = &'a TopicPartition>,
) -> BTreeMap<String, Vec<i32>> {
    let mut map: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for tp in partitions {
        map.entry(tp.topic.clone()).or_default().push(tp.partition);
    }
    map
}

/// OffsetFetch of `group` at `version`: the given partitions, or every partition the
/// group committed (`None`).
pub fn offset_fetch_request(
    group: &str,
    partitions: Option<&[TopicPartition]>,
    version: i16,
) -> OffsetFetchRequest {
    let topics = partitions.map(by_topic);
    let mut r = OffsetFetchRequest::default();
    if version >= 8 {
        r.groups = vec![
            OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s(group)))
                .with_topics(topics.map(|ts| {
                    ts.into_iter()
                        .map(|(t, ps)| {
                            OffsetFetchRequestTopics::default()
                                .with_name(TopicName(s(&t)))
                                .with_partition_indexes(ps)
                        })
                        .collect()
                })),
        ];
    } else {
        r.group_id = GroupId(s(group));
        r.topics = topics.map(|ts| {
            ts.into_iter()
                .map(|(t, ps)| {
                    OffsetFetchRequestTopic::default()
                        .with_name(TopicName(s(&t)))
                        .with_partition_indexes(ps)
                })
                .collect()
        });
    }
    r
}

/// A partition's committed offset, or its error code.
pub type PartitionOutcome<T> = (TopicPartition, Result<T, i16>);

/// Reads an OffsetFetch response: the group's error code (from v2; in the group entry
/// from v8), else each partition's committed offset or error code.
pub fn offset_fetch_results(
    response: &OffsetFetchResponse,
    version: i16,
) -> Result<Vec<PartitionOutcome<CommittedOffset>>, i16> {
    let committed = |offset: i64, epoch: i32, metadata: &Option<StrBytes>| CommittedOffset {
        offset: (offset >= 0).then_some(offset),
        leader_epoch: epoch,
        metadata: metadata.as_ref().map(|m| m.to_string()),
    };
    let outcome = |code: i16, c: CommittedOffset| if code != 0 { Err(code) } else { Ok(c) };
    if version >= 8 {
        let Some(g) = response.groups.first() else {
            return Err(ResponseError::UnknownServerError.code());
        };
        if g.error_code != 0 {
            return Err(g.error_code);
        }
        return Ok(g
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(move |p| {
                    (
                        TopicPartition::new(t.name.0.to_string(), p.partition_index),
                        outcome(
                            p.error_code,
                            committed(p.committed_offset, p.committed_leader_epoch, &p.metadata),
                        ),
                    )
                })
            })
            .collect());
    }
    if response.error_code != 0 {
        return Err(response.error_code);
    }
    Ok(response
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                (
                    TopicPartition::new(t.name.0.to_string(), p.partition_index),
                    outcome(
                        p.error_code,
                        committed(p.committed_offset, p.committed_leader_epoch, &p.metadata),
                    ),
                )
            })
        })
        .collect())
}

/// OffsetCommit of `offsets` for `group` from outside the group, as the Java admin's
/// `alterConsumerGroupOffsets` sends it: generation `-1` and an empty member id, which
/// the broker accepts only while the group has no active members.
pub fn alter_offsets_request(
    group: &str,
    offsets: &[(TopicPartition, i64)],
    version: i16,
) -> OffsetCommitRequest {
    let mut map: BTreeMap<&str, Vec<(i32, i64)>> = BTreeMap::new();
    for (tp, o) in offsets {
        map.entry(&tp.topic).or_default().push((tp.partition, *o));
    }
    let mut r = OffsetCommitRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(StrBytes::default())
        .with_topics(
            map.into_iter()
                .map(|(t, ps)| {
                    OffsetCommitRequestTopic::default()
                        .with_name(TopicName(s(t)))
                        .with_partitions(
                            ps.into_iter()
                                .map(|(p, o)| {
                                    OffsetCommitRequestPartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(o)
                                        .with_committed_metadata(Some(StrBytes::default()))
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
    if (2..=4).contains(&version) {
        // -1: the broker's retention applies (v2-v4 carry the field; v5 dropped it).
        r.retention_time_ms = -1;
    }
    r
}

/// Each partition's outcome in an OffsetCommit response.
pub fn offset_commit_results(response: &OffsetCommitResponse) -> Vec<PartitionOutcome<()>> {
    response
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                (
                    TopicPartition::new(t.name.0.to_string(), p.partition_index),
                    if p.error_code == 0 {
                        Ok(())
                    } else {
                        Err(p.error_code)
                    },
                )
            })
        })
        .collect()
}

/// OffsetDelete of `partitions` for `group`.
pub fn offset_delete_request(group: &str, partitions: &[TopicPartition]) -> OffsetDeleteRequest {
    OffsetDeleteRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(
            by_topic(partitions)
                .into_iter()
                .map(|(t, ps)| {
                    OffsetDeleteRequestTopic::default()
                        .with_name(TopicName(s(&t)))
                        .with_partitions(
                            ps.into_iter()
                                .map(|p| {
                                    OffsetDeleteRequestPartition::default().with_partition_index(p)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
}

/// Reads an OffsetDelete response: the group's error code, else each partition's
/// outcome.
pub fn offset_delete_results(
    response: &OffsetDeleteResponse,
) -> Result<Vec<PartitionOutcome<()>>, i16> {
    if response.error_code != 0 {
        return Err(response.error_code);
    }
    Ok(response
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                (
                    TopicPartition::new(t.name.0.to_string(), p.partition_index),
                    if p.error_code == 0 {
                        Ok(())
                    } else {
                        Err(p.error_code)
                    },
                )
            })
        })
        .collect())
}

/// ListOffsets for `partitions` (each with its spec and the leader epoch known for it)
/// at `version`, as a consumer (replica id -1).
pub fn list_offsets_request(
    partitions: &[(TopicPartition, OffsetSpec, i32)],
    isolation: IsolationLevel,
    version: i16,
) -> ListOffsetsRequest {
    let mut map: BTreeMap<&str, Vec<ListOffsetsPartition>> = BTreeMap::new();
    for (tp, spec, epoch) in partitions {
        let mut p = ListOffsetsPartition::default()
            .with_partition_index(tp.partition)
            .with_timestamp(spec.timestamp());
        if version >= 4 {
            p.current_leader_epoch = *epoch;
        }
        map.entry(&tp.topic).or_default().push(p);
    }
    let mut r = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(
            map.into_iter()
                .map(|(t, ps)| {
                    ListOffsetsTopic::default()
                        .with_name(TopicName(s(t)))
                        .with_partitions(ps)
                })
                .collect(),
        );
    if version >= 2 {
        r.isolation_level = match isolation {
            IsolationLevel::ReadUncommitted => 0,
            IsolationLevel::ReadCommitted => 1,
        };
    }
    r
}

/// Each partition's offset, or its error code, in a ListOffsets response.
pub fn list_offsets_results(response: &ListOffsetsResponse) -> Vec<PartitionOutcome<ListedOffset>> {
    response
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                let tp = TopicPartition::new(t.name.0.to_string(), p.partition_index);
                if p.error_code != 0 {
                    return (tp, Err(p.error_code));
                }
                (
                    tp,
                    Ok(ListedOffset {
                        offset: (p.offset >= 0).then_some(p.offset),
                        timestamp: p.timestamp,
                        leader_epoch: p.leader_epoch,
                    }),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use kafka_protocol::messages::describe_groups_response::DescribedGroupMember;
    use kafka_protocol::messages::list_offsets_response::{
        ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
    };
    use kafka_protocol::messages::offset_fetch_response::{
        OffsetFetchResponseGroup, OffsetFetchResponsePartitions, OffsetFetchResponseTopics,
    };
    use kafka_protocol::protocol::{Decodable, Encodable};

    use super::*;
    use crate::group::consumer_protocol::{encode_assignment, encode_subscription};

    /// Encodes `r` at `v` and decodes it back: the request is valid at that version.
    fn roundtrip<T: Encodable + Decodable + PartialEq + std::fmt::Debug>(r: &T, v: i16) -> T {
        let mut buf = BytesMut::new();
        r.encode(&mut buf, v).expect("encodes");
        let mut bytes = buf.freeze();
        let back = T::decode(&mut bytes, v).expect("decodes");
        assert!(bytes.is_empty(), "trailing bytes at v{v}");
        back
    }

    #[test]
    fn reroute_sends_each_error_to_its_broker() {
        assert_eq!(reroute(41), Some(Reroute::Controller));
        assert_eq!(reroute(16), Some(Reroute::Coordinator));
        assert_eq!(reroute(14), Some(Reroute::Coordinator));
        assert_eq!(reroute(6), Some(Reroute::Leader));
        // A missing topic, a topic that exists already, an authorisation failure: final.
        assert_eq!(reroute(3), None);
        assert_eq!(reroute(36), None);
        assert_eq!(reroute(29), None);
        assert_eq!(reroute(0), None);
    }

    #[test]
    fn create_topics_carries_every_setting_at_every_version() {
        let topics = [NewTopic::new("a", 3, 1).config("cleanup.policy", "compact")];
        for v in 2..=7 {
            let r = roundtrip(&create_topics_request(&topics, 5000, true), v);
            assert!(r.validate_only);
            assert_eq!(r.timeout_ms, 5000);
            let t = &r.topics[0];
            assert_eq!(
                (t.name.0.as_str(), t.num_partitions, t.replication_factor),
                ("a", 3, 1)
            );
            assert_eq!(t.configs[0].name.as_str(), "cleanup.policy");
            assert_eq!(t.configs[0].value.as_deref(), Some("compact"));
        }
    }

    #[test]
    fn delete_topics_names_topics_in_the_versions_field() {
        let names = vec!["a".to_string(), "b".to_string()];
        for v in 1..=6 {
            let r = roundtrip(&delete_topics_request(&names, 1000, v), v);
            let got: Vec<String> = if v >= 6 {
                r.topics
                    .iter()
                    .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
                    .collect()
            } else {
                r.topic_names.iter().map(|n| n.0.to_string()).collect()
            };
            assert_eq!(got, names, "v{v}");
        }
    }

    #[test]
    fn create_partitions_and_configs_requests_encode() {
        for v in 0..=3 {
            let r = roundtrip(
                &create_partitions_request(&[("a".into(), 4)], 1000, false),
                v,
            );
            assert_eq!((r.topics[0].name.0.as_str(), r.topics[0].count), ("a", 4));
        }
        for v in 1..=4 {
            let r = roundtrip(&describe_topic_configs_request(&["a".into()]), v);
            assert_eq!(r.resources[0].resource_type, RESOURCE_TOPIC);
            assert_eq!(r.resources[0].configuration_keys, None);
        }
    }

    #[test]
    fn offset_fetch_of_all_partitions_sends_null_topics() {
        for v in 1..=9 {
            let r = roundtrip(&offset_fetch_request("g", None, v), v);
            if v >= 8 {
                assert_eq!(r.groups[0].topics, None);
            } else if v >= 2 {
                assert_eq!(r.topics, None);
            }
        }
        let tps = [TopicPartition::new("t", 1), TopicPartition::new("t", 0)];
        let r = roundtrip(&offset_fetch_request("g", Some(&tps), 9), 9);
        let topics = r.groups[0].topics.as_ref().expect("topics");
        assert_eq!(topics[0].partition_indexes, vec![1, 0]);
    }

    #[test]
    fn offset_fetch_results_keep_group_and_partition_errors() {
        let partition = |i, offset, code| {
            OffsetFetchResponsePartitions::default()
                .with_partition_index(i)
                .with_committed_offset(offset)
                .with_error_code(code)
        };
        let response = OffsetFetchResponse::default().with_groups(vec![
            OffsetFetchResponseGroup::default().with_topics(vec![
                OffsetFetchResponseTopics::default()
                    .with_name(TopicName(s("t")))
                    .with_partitions(vec![
                        partition(0, 42, 0),
                        partition(1, -1, 0),
                        partition(2, -1, 3),
                    ]),
            ]),
        ]);
        let got = offset_fetch_results(&response, 8).expect("no group error");
        assert_eq!(got[0].1.as_ref().map(|c| c.offset), Ok(Some(42)));
        assert_eq!(got[1].1.as_ref().map(|c| c.offset), Ok(None));
        assert_eq!(got[2].1, Err(3));
        let mut failed = response.clone();
        failed.groups[0].error_code = 16;
        assert_eq!(offset_fetch_results(&failed, 8), Err(16));
    }

    #[test]
    fn alter_offsets_commits_as_no_member() {
        let offsets = [
            (TopicPartition::new("t", 0), 5),
            (TopicPartition::new("t", 1), 7),
        ];
        for v in 2..=9 {
            let r = roundtrip(&alter_offsets_request("g", &offsets, v), v);
            assert_eq!(r.generation_id_or_member_epoch, -1);
            assert_eq!(r.member_id.as_str(), "");
            let ps = &r.topics[0].partitions;
            assert_eq!((ps[0].committed_offset, ps[1].committed_offset), (5, 7));
        }
    }

    #[test]
    fn list_offsets_asks_each_spec_by_its_timestamp() {
        let parts = [
            (TopicPartition::new("t", 0), OffsetSpec::Earliest, 3),
            (TopicPartition::new("t", 1), OffsetSpec::Latest, 3),
            (TopicPartition::new("u", 0), OffsetSpec::MaxTimestamp, -1),
            (
                TopicPartition::new("u", 1),
                OffsetSpec::Timestamp(1_700_000_000_000),
                -1,
            ),
        ];
        let r = roundtrip(
            &list_offsets_request(&parts, IsolationLevel::ReadCommitted, 7),
            7,
        );
        let ts: Vec<i64> = r
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.timestamp))
            .collect();
        assert_eq!(ts, vec![-2, -1, -3, 1_700_000_000_000]);
        assert_eq!(r.isolation_level, 1);
        assert_eq!(r.topics[0].partitions[0].current_leader_epoch, 3);
        let response = ListOffsetsResponse::default().with_topics(vec![
            ListOffsetsTopicResponse::default()
                .with_name(TopicName(s("t")))
                .with_partitions(vec![
                    ListOffsetsPartitionResponse::default()
                        .with_partition_index(0)
                        .with_offset(9)
                        .with_timestamp(77),
                    ListOffsetsPartitionResponse::default()
                        .with_partition_index(1)
                        .with_offset(-1),
                    ListOffsetsPartitionResponse::default()
                        .with_partition_index(2)
                        .with_error_code(6),
                ]),
        ]);
        let got = list_offsets_results(&response);
        assert_eq!(got[0].1.map(|l| (l.offset, l.timestamp)), Ok((Some(9), 77)));
        assert_eq!(got[1].1.map(|l| l.offset), Ok(None));
        assert_eq!(got[2].1, Err(6));
    }

    #[test]
    fn a_timestamp_answered_with_an_older_one_found_nothing() {
        let listed = |offset, timestamp| ListedOffset {
            offset: Some(offset),
            timestamp,
            leader_epoch: 0,
        };
        let t = 1_700_000_000_000;
        assert_eq!(
            listed(3, t + 5).answering(OffsetSpec::Timestamp(t)).offset,
            Some(3)
        );
        assert_eq!(
            listed(3, t).answering(OffsetSpec::Timestamp(t)).offset,
            Some(3)
        );
        assert_eq!(
            listed(0, -1).answering(OffsetSpec::Timestamp(t)).offset,
            None
        );
        // Earliest and latest carry timestamp -1 on most brokers: kept.
        assert_eq!(
            listed(0, -1).answering(OffsetSpec::Earliest).offset,
            Some(0)
        );
        assert_eq!(listed(9, -1).answering(OffsetSpec::Latest).offset, Some(9));
    }

    #[test]
    fn consumer_group_members_have_their_assignment_decoded() {
        let assignment = Assignment {
            partitions: vec![TopicPartition::new("t", 0), TopicPartition::new("t", 2)],
            user_data: None,
        };
        let subscription = Subscription {
            topics: vec!["t".into()],
            generation_id: -1,
            ..Default::default()
        };
        let member = DescribedGroupMember::default()
            .with_member_id(s("m-1"))
            .with_member_metadata(encode_subscription(&subscription, 1).expect("encodes"))
            .with_member_assignment(encode_assignment(&assignment, 1).expect("encodes"));
        let group = DescribedGroup::default()
            .with_group_id(GroupId(s("g")))
            .with_group_state(s("Stable"))
            .with_protocol_type(s("consumer"))
            .with_protocol_data(s("range"))
            .with_members(vec![member.clone()]);
        let d = group_description(&group);
        assert_eq!((d.state.as_str(), d.protocol.as_str()), ("Stable", "range"));
        assert_eq!(
            d.members[0].assignment.as_ref().map(|a| &a.partitions),
            Some(&assignment.partitions)
        );
        assert_eq!(
            d.members[0].subscription.as_ref().map(|s| &s.topics),
            Some(&subscription.topics)
        );
        // Another protocol type: the bytes are kept, not guessed at.
        let other = group.with_protocol_type(s("connect"));
        let d = group_description(&other);
        assert_eq!(d.members[0].assignment, None);
        assert_eq!(d.members[0].raw_assignment, member.member_assignment);
    }
}
