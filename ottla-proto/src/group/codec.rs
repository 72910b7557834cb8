//! Group messages on the wire: [`GroupRequest`] to `kafka-protocol` requests for a
//! negotiated version, and responses back to [`GroupResponse`].
//!
//! Each field is set only in the versions that have it: `kafka-protocol` refuses to
//! encode a non-default field a version lacks, and ottla refuses to drop one silently
//! (static membership on a broker without JoinGroup v5 is an error, not a dynamic
//! member). Informational fields (the KIP-800 reason) are dropped where absent.

use bytes::Bytes;
use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions as HeartbeatTopicPartitions;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest,
    SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::consumer_protocol::{TopicPartition, by_topic};
use super::messages::{CommitOffset, GroupRequest, GroupResponse, JoinedMember};
use crate::wire::WireError;
use crate::wire::{SUPPORTED, decode_response as decode_body};

/// The classic group APIs, which a consumer in a group requires of every broker; their
/// version ranges live in [`crate::wire::SUPPORTED`], the one table negotiation
/// reads.
pub const GROUP_APIS: &[ApiKey] = &[
    ApiKey::FindCoordinator,
    ApiKey::JoinGroup,
    ApiKey::SyncGroup,
    ApiKey::Heartbeat,
    ApiKey::LeaveGroup,
    ApiKey::OffsetCommit,
    ApiKey::OffsetFetch,
];

/// The consumer group protocol's own API (KIP-848), beside FindCoordinator,
/// OffsetCommit and OffsetFetch. Not required at connection time: a member that asks
/// for it on a broker without it closes with an error naming `group.protocol`.
pub const CONSUMER_GROUP_APIS: &[ApiKey] = &[ApiKey::ConsumerGroupHeartbeat];

/// A group request encoded for one version, ready for the connection.
#[derive(Debug, Clone, PartialEq)]
pub enum EncodedGroupRequest {
    /// FindCoordinator.
    FindCoordinator(FindCoordinatorRequest),
    /// JoinGroup.
    JoinGroup(JoinGroupRequest),
    /// SyncGroup.
    SyncGroup(SyncGroupRequest),
    /// Heartbeat.
    Heartbeat(HeartbeatRequest),
    /// LeaveGroup.
    LeaveGroup(LeaveGroupRequest),
    /// OffsetCommit.
    OffsetCommit(OffsetCommitRequest),
    /// OffsetFetch.
    OffsetFetch(OffsetFetchRequest),
    /// ConsumerGroupHeartbeat (KIP-848).
    ConsumerGroupHeartbeat(ConsumerGroupHeartbeatRequest),
}

/// A group message that cannot be expressed or read at a version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupCodecError {
    /// ottla does not implement this version of the API.
    #[error("{api:?} v{version} is not implemented (ottla: {supported})")]
    Unsupported {
        /// The API.
        api: ApiKey,
        /// The version asked for.
        version: i16,
        /// What ottla implements.
        supported: String,
    },
    /// A field the caller set does not exist in this version.
    #[error("{api:?} v{version} cannot carry {field} (needs v{needs}+)")]
    Field {
        /// The API.
        api: ApiKey,
        /// The version.
        version: i16,
        /// The field.
        field: &'static str,
        /// The first version that has it.
        needs: i16,
    },
    /// The response did not decode.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The response decoded but is unusable.
    #[error("{api:?} v{version} response: {message}")]
    Response {
        /// The API.
        api: ApiKey,
        /// The version.
        version: i16,
        /// What is wrong.
        message: String,
    },
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn check(api: ApiKey, version: i16) -> Result<(), GroupCodecError> {
    let range = (GROUP_APIS.contains(&api) || CONSUMER_GROUP_APIS.contains(&api))
        .then(|| SUPPORTED.iter().find(|(a, _, _)| *a == api))
        .flatten();
    match range {
        Some((_, min, max)) if (*min..=*max).contains(&version) => Ok(()),
        Some((_, min, max)) => Err(GroupCodecError::Unsupported {
            api,
            version,
            supported: format!("v{min}..=v{max}"),
        }),
        None => Err(GroupCodecError::Unsupported {
            api,
            version,
            supported: "none".into(),
        }),
    }
}

fn need(
    api: ApiKey,
    version: i16,
    field: &'static str,
    needs: i16,
    set: bool,
) -> Result<(), GroupCodecError> {
    if set && version < needs {
        return Err(GroupCodecError::Field {
            api,
            version,
            field,
            needs,
        });
    }
    Ok(())
}

/// Builds the `kafka-protocol` request for `request` at `version`.
pub fn encode(
    request: &GroupRequest,
    version: i16,
) -> Result<EncodedGroupRequest, GroupCodecError> {
    let api = request.api();
    check(api, version)?;
    Ok(match request {
        GroupRequest::FindCoordinator { group } => {
            let mut r = FindCoordinatorRequest::default();
            if version >= 4 {
                r.coordinator_keys = vec![s(group)];
            } else {
                r.key = s(group);
            }
            EncodedGroupRequest::FindCoordinator(r)
        }
        GroupRequest::JoinGroup {
            group,
            member_id,
            instance_id,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            protocols,
            reason,
        } => {
            need(api, version, "group.instance.id", 5, instance_id.is_some())?;
            let mut r = JoinGroupRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_session_timeout_ms(*session_timeout_ms)
                .with_rebalance_timeout_ms(*rebalance_timeout_ms)
                .with_member_id(s(member_id))
                .with_protocol_type(s(protocol_type))
                .with_protocols(
                    protocols
                        .iter()
                        .map(|(name, metadata)| {
                            JoinGroupRequestProtocol::default()
                                .with_name(s(name))
                                .with_metadata(metadata.clone())
                        })
                        .collect(),
                );
            if version >= 5 {
                r.group_instance_id = instance_id.as_deref().map(s);
            }
            if version >= 8 {
                r.reason = reason.as_deref().map(s);
            }
            EncodedGroupRequest::JoinGroup(r)
        }
        GroupRequest::SyncGroup {
            group,
            generation,
            member_id,
            instance_id,
            protocol_type,
            protocol_name,
            assignments,
        } => {
            need(api, version, "group.instance.id", 3, instance_id.is_some())?;
            let mut r = SyncGroupRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_generation_id(*generation)
                .with_member_id(s(member_id))
                .with_assignments(
                    assignments
                        .iter()
                        .map(|(m, a)| {
                            SyncGroupRequestAssignment::default()
                                .with_member_id(s(m))
                                .with_assignment(a.clone())
                        })
                        .collect(),
                );
            if version >= 3 {
                r.group_instance_id = instance_id.as_deref().map(s);
            }
            if version >= 5 {
                r.protocol_type = Some(s(protocol_type));
                r.protocol_name = Some(s(protocol_name));
            }
            EncodedGroupRequest::SyncGroup(r)
        }
        GroupRequest::Heartbeat {
            group,
            generation,
            member_id,
            instance_id,
        } => {
            need(api, version, "group.instance.id", 3, instance_id.is_some())?;
            let mut r = HeartbeatRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_generation_id(*generation)
                .with_member_id(s(member_id));
            if version >= 3 {
                r.group_instance_id = instance_id.as_deref().map(s);
            }
            EncodedGroupRequest::Heartbeat(r)
        }
        GroupRequest::LeaveGroup {
            group,
            member_id,
            instance_id,
            reason,
        } => {
            // Below v3 the member id alone names the member, static or not: a static
            // member leaving for good is still removed, by its member id (as the Java
            // client's LeaveGroupRequest.Builder does for old versions).
            let mut r = LeaveGroupRequest::default().with_group_id(GroupId(s(group)));
            if version >= 3 {
                let mut m = MemberIdentity::default()
                    .with_member_id(s(member_id))
                    .with_group_instance_id(instance_id.as_deref().map(s));
                if version >= 5 {
                    m.reason = reason.as_deref().map(s);
                }
                r.members = vec![m];
            } else {
                r.member_id = s(member_id);
            }
            EncodedGroupRequest::LeaveGroup(r)
        }
        GroupRequest::OffsetCommit {
            group,
            generation,
            member_id,
            instance_id,
            offsets,
        } => {
            need(api, version, "group.instance.id", 7, instance_id.is_some())?;
            let mut r = OffsetCommitRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_generation_id_or_member_epoch(*generation)
                .with_member_id(s(member_id))
                .with_topics(commit_topics(offsets, version));
            if version >= 7 {
                r.group_instance_id = instance_id.as_deref().map(s);
            }
            EncodedGroupRequest::OffsetCommit(r)
        }
        GroupRequest::OffsetFetch {
            group,
            partitions,
            require_stable,
            member,
        } => {
            // require_stable is dropped below v7, which lacks it, as the Java client's
            // `OffsetFetchRequest.Builder` does: the answer is then as stable as the
            // broker makes it.
            let by_topic = by_topic(partitions);
            let mut r = OffsetFetchRequest::default();
            if version >= 8 {
                let mut g = OffsetFetchRequestGroup::default();
                // The member's id and epoch let the broker refuse a fenced member
                // (KIP-848); below v9 the broker does not check them (as Java's
                // builder, which drops them there).
                if let (Some((id, epoch)), true) = (member, version >= 9) {
                    g.member_id = Some(s(id));
                    g.member_epoch = *epoch;
                }
                r.groups = vec![
                    g.with_group_id(GroupId(s(group))).with_topics(Some(
                        by_topic
                            .into_iter()
                            .map(|(t, ps)| {
                                OffsetFetchRequestTopics::default()
                                    .with_name(TopicName(s(&t)))
                                    .with_partition_indexes(ps)
                            })
                            .collect(),
                    )),
                ];
            } else {
                r.group_id = GroupId(s(group));
                r.topics = Some(
                    by_topic
                        .into_iter()
                        .map(|(t, ps)| {
                            OffsetFetchRequestTopic::default()
                                .with_name(TopicName(s(&t)))
                                .with_partition_indexes(ps)
                        })
                        .collect(),
                );
            }
            if version >= 7 {
                r.require_stable = *require_stable;
            }
            EncodedGroupRequest::OffsetFetch(r)
        }
        GroupRequest::ConsumerGroupHeartbeat {
            group,
            member_id,
            member_epoch,
            instance_id,
            rack_id,
            rebalance_timeout_ms,
            subscribed_topic_names,
            subscribed_topic_regex,
            server_assignor,
            topic_partitions,
        } => {
            let mut r = ConsumerGroupHeartbeatRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_member_id(s(member_id))
                .with_member_epoch(*member_epoch)
                .with_instance_id(instance_id.as_deref().map(s))
                .with_rack_id(rack_id.as_deref().map(s))
                .with_rebalance_timeout_ms(*rebalance_timeout_ms)
                .with_subscribed_topic_names(
                    subscribed_topic_names
                        .as_ref()
                        .map(|ts| ts.iter().map(|t| TopicName(s(t))).collect()),
                )
                .with_server_assignor(server_assignor.as_deref().map(s))
                .with_topic_partitions(topic_partitions.as_ref().map(|tps| {
                    tps.iter()
                        .map(|(id, ps)| {
                            HeartbeatTopicPartitions::default()
                                .with_topic_id(*id)
                                .with_partitions(ps.clone())
                        })
                        .collect()
                }));
            // v0 has no regex; ottla speaks v1 only (the client-generated member id
            // of KIP-1082), so this is a guard for a table that changed.
            need(
                api,
                version,
                "SubscribedTopicRegex",
                1,
                subscribed_topic_regex.is_some(),
            )?;
            if version >= 1 {
                r.subscribed_topic_regex = subscribed_topic_regex.as_deref().map(s);
            }
            EncodedGroupRequest::ConsumerGroupHeartbeat(r)
        }
    })
}

fn commit_topics(offsets: &[CommitOffset], version: i16) -> Vec<OffsetCommitRequestTopic> {
    let mut map: std::collections::BTreeMap<&str, Vec<&CommitOffset>> =
        std::collections::BTreeMap::new();
    for o in offsets {
        map.entry(&o.partition.topic).or_default().push(o);
    }
    map.into_iter()
        .map(|(t, os)| {
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(s(t)))
                .with_partitions(
                    os.into_iter()
                        .map(|o| {
                            let mut p = OffsetCommitRequestPartition::default()
                                .with_partition_index(o.partition.partition)
                                .with_committed_offset(o.offset)
                                .with_committed_metadata(o.metadata.as_deref().map(s));
                            if version >= 6 {
                                p.committed_leader_epoch = o.leader_epoch;
                            }
                            p
                        })
                        .collect(),
                )
        })
        .collect()
}

/// Decodes a group response body at `version` and reduces it to a [`GroupResponse`].
pub fn decode_response(
    api: ApiKey,
    version: i16,
    body: Bytes,
) -> Result<GroupResponse, GroupCodecError> {
    check(api, version)?;
    let bad = |message: &str| GroupCodecError::Response {
        api,
        version,
        message: message.to_string(),
    };
    Ok(match api {
        ApiKey::FindCoordinator => {
            let r: FindCoordinatorResponse = decode_body(api, version, body)?;
            if version >= 4 {
                let c = r
                    .coordinators
                    .first()
                    .ok_or_else(|| bad("no coordinator in the response"))?;
                GroupResponse::FindCoordinator {
                    error: c.error_code,
                    node_id: c.node_id.0,
                    host: c.host.to_string(),
                    port: c.port,
                }
            } else {
                GroupResponse::FindCoordinator {
                    error: r.error_code,
                    node_id: r.node_id.0,
                    host: r.host.to_string(),
                    port: r.port,
                }
            }
        }
        ApiKey::JoinGroup => {
            let r: JoinGroupResponse = match decode_body(api, version, body.clone()) {
                Ok(r) => r,
                // The librdkafka mock writes null leader and member ids in JoinGroup
                // error replies, which the schema does not allow. The error code comes
                // before them: read that.
                Err(e) => match error_code_at(if version >= 2 { 4 } else { 0 }, &body) {
                    Some(code) if code != 0 => {
                        return Ok(GroupResponse::JoinGroup {
                            error: code,
                            generation: -1,
                            protocol_name: None,
                            leader: String::new(),
                            member_id: String::new(),
                            members: vec![],
                            skip_assignment: false,
                        });
                    }
                    _ => return Err(e.into()),
                },
            };
            GroupResponse::JoinGroup {
                error: r.error_code,
                generation: r.generation_id,
                protocol_name: r.protocol_name.map(|p| p.to_string()),
                leader: r.leader.to_string(),
                member_id: r.member_id.to_string(),
                members: r
                    .members
                    .into_iter()
                    .map(|m| JoinedMember {
                        member_id: m.member_id.to_string(),
                        instance_id: m.group_instance_id.map(|i| i.to_string()),
                        metadata: m.metadata,
                    })
                    .collect(),
                skip_assignment: r.skip_assignment,
            }
        }
        ApiKey::SyncGroup => match decode_body::<SyncGroupResponse>(api, version, body.clone()) {
            Ok(r) => GroupResponse::SyncGroup {
                error: r.error_code,
                protocol_name: r.protocol_name.map(|p| p.to_string()),
                assignment: r.assignment,
            },
            // The librdkafka mock answers SyncGroup errors with a null assignment, which
            // the schema does not allow. The error code comes before it: read that.
            Err(e) => match error_code_at(if version >= 1 { 4 } else { 0 }, &body) {
                Some(code) if code != 0 => GroupResponse::SyncGroup {
                    error: code,
                    protocol_name: None,
                    assignment: Bytes::new(),
                },
                _ => return Err(e.into()),
            },
        },
        ApiKey::Heartbeat => {
            let r: HeartbeatResponse = decode_body(api, version, body)?;
            GroupResponse::Heartbeat {
                error: r.error_code,
            }
        }
        ApiKey::LeaveGroup => {
            let r: LeaveGroupResponse = decode_body(api, version, body)?;
            let member_error = r
                .members
                .iter()
                .map(|m| m.error_code)
                .find(|c| *c != 0)
                .unwrap_or(0);
            GroupResponse::LeaveGroup {
                error: if r.error_code != 0 {
                    r.error_code
                } else {
                    member_error
                },
            }
        }
        ApiKey::OffsetCommit => {
            let r: OffsetCommitResponse = decode_body(api, version, body)?;
            GroupResponse::OffsetCommit {
                partitions: r
                    .topics
                    .iter()
                    .flat_map(|t| {
                        t.partitions.iter().map(move |p| {
                            (
                                TopicPartition::new(t.name.0.to_string(), p.partition_index),
                                p.error_code,
                            )
                        })
                    })
                    .collect(),
            }
        }
        ApiKey::OffsetFetch => {
            let r: OffsetFetchResponse = decode_body(api, version, body)?;
            if version >= 8 {
                let g = r
                    .groups
                    .first()
                    .ok_or_else(|| bad("no group in the response"))?;
                GroupResponse::OffsetFetch {
                    error: g.error_code,
                    partitions: g
                        .topics
                        .iter()
                        .flat_map(|t| {
                            t.partitions.iter().map(move |p| {
                                (
                                    TopicPartition::new(t.name.0.to_string(), p.partition_index),
                                    p.committed_offset,
                                    p.committed_leader_epoch,
                                    p.error_code,
                                )
                            })
                        })
                        .collect(),
                    metadata: g
                        .topics
                        .iter()
                        .flat_map(|t| {
                            t.partitions.iter().filter_map(move |p| {
                                let m = p.metadata.as_ref().filter(|m| !m.is_empty())?;
                                Some((
                                    TopicPartition::new(t.name.0.to_string(), p.partition_index),
                                    m.to_string(),
                                ))
                            })
                        })
                        .collect(),
                }
            } else {
                GroupResponse::OffsetFetch {
                    error: r.error_code,
                    partitions: r
                        .topics
                        .iter()
                        .flat_map(|t| {
                            t.partitions.iter().map(move |p| {
                                (
                                    TopicPartition::new(t.name.0.to_string(), p.partition_index),
                                    p.committed_offset,
                                    p.committed_leader_epoch,
                                    p.error_code,
                                )
                            })
                        })
                        .collect(),
                    metadata: r
                        .topics
                        .iter()
                        .flat_map(|t| {
                            t.partitions.iter().filter_map(move |p| {
                                let m = p.metadata.as_ref().filter(|m| !m.is_empty())?;
                                Some((
                                    TopicPartition::new(t.name.0.to_string(), p.partition_index),
                                    m.to_string(),
                                ))
                            })
                        })
                        .collect(),
                }
            }
        }
        ApiKey::ConsumerGroupHeartbeat => {
            let r: ConsumerGroupHeartbeatResponse = decode_body(api, version, body)?;
            GroupResponse::ConsumerGroupHeartbeat {
                error: r.error_code,
                error_message: r.error_message.map(|m| m.to_string()),
                member_id: r.member_id.map(|m| m.to_string()),
                member_epoch: r.member_epoch,
                heartbeat_interval_ms: r.heartbeat_interval_ms,
                assignment: r.assignment.map(|a| {
                    a.topic_partitions
                        .into_iter()
                        .map(|t| (t.topic_id, t.partitions))
                        .collect()
                }),
            }
        }
        other => {
            return Err(GroupCodecError::Unsupported {
                api: other,
                version,
                supported: "none".into(),
            });
        }
    })
}

/// The error code at byte `at` of a response body (after the throttle time, where the
/// version has one).
fn error_code_at(at: usize, body: &[u8]) -> Option<i16> {
    let b = body.get(at..at + 2)?;
    Some(i16::from_be_bytes([b[0], b[1]]))
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, BytesMut};
    use kafka_protocol::protocol::Encodable;

    use super::*;

    fn join(instance: Option<&str>) -> GroupRequest {
        GroupRequest::JoinGroup {
            group: "g".into(),
            member_id: String::new(),
            instance_id: instance.map(String::from),
            session_timeout_ms: 6000,
            rebalance_timeout_ms: 30000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"\0\0"))],
            reason: Some("why".into()),
        }
    }

    #[test]
    fn static_membership_on_an_old_join_group_is_a_clear_error() {
        let err = encode(&join(Some("i")), 4).unwrap_err();
        assert!(
            err.to_string().contains("group.instance.id") && err.to_string().contains("v5"),
            "{err}"
        );
        assert!(encode(&join(Some("i")), 5).is_ok());
        // The reason is informational: dropped where absent.
        let EncodedGroupRequest::JoinGroup(r) = encode(&join(None), 7).unwrap() else {
            panic!()
        };
        assert_eq!(r.reason, None);
    }

    #[test]
    fn versions_outside_the_table_are_refused() {
        assert!(matches!(
            encode(&join(None), 0),
            Err(GroupCodecError::Unsupported { .. })
        ));
        assert!(matches!(
            encode(&join(None), 10),
            Err(GroupCodecError::Unsupported { .. })
        ));
    }

    #[test]
    fn mock_style_sync_group_error_with_a_null_assignment_still_yields_the_error_code() {
        // v3: throttle, error INVALID_REQUEST (42), assignment length -1.
        let mut body = BytesMut::new();
        body.put_i32(0);
        body.put_i16(42);
        body.put_i32(-1);
        let r = decode_response(ApiKey::SyncGroup, 3, body.freeze()).unwrap();
        assert_eq!(
            r,
            GroupResponse::SyncGroup {
                error: 42,
                protocol_name: None,
                assignment: Bytes::new()
            }
        );
    }

    #[test]
    fn mock_style_join_group_error_with_null_ids_still_yields_the_error_code() {
        // v5: throttle, error INCONSISTENT_GROUP_PROTOCOL (23), generation, then a null
        // protocol name and null (non-nullable) leader and member ids.
        let mut body = BytesMut::new();
        body.put_i32(0);
        body.put_i16(23);
        body.put_i32(-1);
        body.put_i16(-1);
        body.put_i16(-1);
        body.put_i16(-1);
        body.put_i32(0);
        let r = decode_response(ApiKey::JoinGroup, 5, body.freeze()).unwrap();
        assert!(
            matches!(r, GroupResponse::JoinGroup { error: 23, .. }),
            "{r:?}"
        );
    }

    #[test]
    fn find_coordinator_v4_without_coordinators_is_an_error_not_a_panic() {
        let mut body = BytesMut::new();
        FindCoordinatorResponse::default()
            .encode(&mut body, 4)
            .unwrap();
        assert!(matches!(
            decode_response(ApiKey::FindCoordinator, 4, body.freeze()),
            Err(GroupCodecError::Response { .. })
        ));
    }
}
