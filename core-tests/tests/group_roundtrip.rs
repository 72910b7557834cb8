//! Round trips for every (group request, version) ottla sends: a generated
//! `GroupRequest` valid for the version goes through `proto::group::codec::encode` and
//! ottla's wire codec, is decoded as a broker would (header and body), re-encoded, and
//! must come out byte-identical.

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Decodable, Encodable, decode_request_header_from_buffer};
use ottla_proto::group::codec::{CONSUMER_GROUP_APIS, EncodedGroupRequest, GROUP_APIS, encode};
use ottla_proto::group::consumer_protocol::TopicPartition;
use ottla_proto::group::messages::{CommitOffset, GroupRequest};
use ottla_proto::wire::{Codec, SUPPORTED};
use proptest::prelude::*;

fn frame_roundtrip<R>(api: ApiKey, version: i16, request: &R) -> Result<(), TestCaseError>
where
    R: Encodable + Decodable + PartialEq + std::fmt::Debug,
{
    let mut codec = Codec::new(Some("roundtrip"), 1 << 20);
    let mut frame = BytesMut::new();
    codec
        .encode_request(api, version, request, true, &mut frame)
        .map_err(|e| TestCaseError::fail(format!("encode {api:?} v{version}: {e}")))?;
    let first = frame.clone().freeze();
    let _len = frame.get_i32();
    let header = decode_request_header_from_buffer(&mut frame)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(header.request_api_key, api as i16);
    prop_assert_eq!(header.request_api_version, version);
    let decoded = R::decode(&mut frame, version)
        .map_err(|e| TestCaseError::fail(format!("decode {api:?} v{version}: {e}")))?;
    prop_assert_eq!(frame.remaining(), 0);
    prop_assert_eq!(&decoded, request);
    let mut again = BytesMut::new();
    Codec::new(Some("roundtrip"), 1 << 20)
        .encode_request(api, version, &decoded, true, &mut again)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&first[..], &again[..]);
    Ok(())
}

fn roundtrip(request: &GroupRequest, version: i16) -> Result<(), TestCaseError> {
    let api = request.api();
    let encoded = encode(request, version)
        .map_err(|e| TestCaseError::fail(format!("{api:?} v{version}: {e}")))?;
    match encoded {
        EncodedGroupRequest::FindCoordinator(r) => frame_roundtrip(api, version, &r),
        EncodedGroupRequest::JoinGroup(r) => frame_roundtrip(api, version, &r),
        EncodedGroupRequest::SyncGroup(r) => frame_roundtrip(api, version, &r),
        EncodedGroupRequest::Heartbeat(r) => frame_roundtrip(api, version, &r),
        EncodedGroupRequest::LeaveGroup(r) => frame_roundtrip(api, version, &r),
        EncodedGroupRequest::OffsetCommit(r) => frame_roundtrip(api, version, &r),
        EncodedGroupRequest::OffsetFetch(r) => frame_roundtrip(api, version, &r),
        EncodedGroupRequest::ConsumerGroupHeartbeat(r) => frame_roundtrip(api, version, &r),
    }
}

fn range(api: ApiKey) -> std::ops::RangeInclusive<i16> {
    SUPPORTED
        .iter()
        .find(|(a, _, _)| *a == api)
        .map(|(_, min, max)| *min..=*max)
        .unwrap_or_else(|| panic!("{api:?} is not in SUPPORTED"))
}

fn name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9._-]{1,24}"
}

fn partitions() -> impl Strategy<Value = Vec<TopicPartition>> {
    prop::collection::btree_set((name(), 0i32..64), 0..6).prop_map(|s| {
        s.into_iter()
            .map(|(t, p)| TopicPartition::new(t, p))
            .collect()
    })
}

fn bytes() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from)
}

/// An instance id only where the version carries one.
fn instance(version: i16, from: i16, id: Option<String>) -> Option<String> {
    if version >= from { id } else { None }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn find_coordinator(v in range(ApiKey::FindCoordinator), group in name()) {
        roundtrip(&GroupRequest::FindCoordinator { group }, v)?;
    }

    #[test]
    fn join_group(
        v in range(ApiKey::JoinGroup),
        group in name(), member in prop::option::of(name()), id in prop::option::of(name()),
        session in 1i32..100_000, rebalance in 1i32..1_000_000,
        protocols in prop::collection::vec((name(), bytes()), 1..4), reason in prop::option::of(name()),
    ) {
        roundtrip(&GroupRequest::JoinGroup {
            group, member_id: member.unwrap_or_default(), instance_id: instance(v, 5, id),
            session_timeout_ms: session, rebalance_timeout_ms: rebalance, protocol_type: "consumer".into(),
            protocols, reason,
        }, v)?;
    }

    #[test]
    fn sync_group(
        v in range(ApiKey::SyncGroup), group in name(), generation in -1i32..1000, member in name(),
        id in prop::option::of(name()), protocol in name(), assignments in prop::collection::vec((name(), bytes()), 0..4),
    ) {
        roundtrip(&GroupRequest::SyncGroup {
            group, generation, member_id: member, instance_id: instance(v, 3, id),
            protocol_type: "consumer".into(), protocol_name: protocol, assignments,
        }, v)?;
    }

    #[test]
    fn heartbeat(v in range(ApiKey::Heartbeat), group in name(), generation in -1i32..1000, member in name(), id in prop::option::of(name())) {
        roundtrip(&GroupRequest::Heartbeat { group, generation, member_id: member, instance_id: instance(v, 3, id) }, v)?;
    }

    #[test]
    fn leave_group(v in range(ApiKey::LeaveGroup), group in name(), member in name(), id in prop::option::of(name()), reason in prop::option::of(name())) {
        roundtrip(&GroupRequest::LeaveGroup { group, member_id: member, instance_id: instance(v, 3, id), reason }, v)?;
    }

    #[test]
    fn offset_commit(
        v in range(ApiKey::OffsetCommit), group in name(), generation in -1i32..1000, member in name(),
        id in prop::option::of(name()), parts in partitions(), offset in 0i64..i64::MAX, epoch in -1i32..100,
        metadata in prop::option::of(name()),
    ) {
        let offsets = parts.into_iter().map(|p| CommitOffset { partition: p, offset, leader_epoch: if v >= 6 { epoch } else { -1 }, metadata: metadata.clone() }).collect();
        roundtrip(&GroupRequest::OffsetCommit { group, generation, member_id: member, instance_id: instance(v, 7, id), offsets }, v)?;
    }

    #[test]
    fn offset_fetch(v in range(ApiKey::OffsetFetch), group in name(), parts in partitions(), stable in any::<bool>(), member in prop::option::of((name(), -1i32..1000))) {
        // The member's id and epoch exist from v9; below, the codec drops them and the
        // decoded request has none.
        let member = member.filter(|_| v >= 9);
        roundtrip(&GroupRequest::OffsetFetch { group, partitions: parts, require_stable: stable && v >= 7, member }, v)?;
    }

    #[test]
    fn consumer_group_heartbeat(
        v in range(ApiKey::ConsumerGroupHeartbeat), group in name(), member in name(), epoch in -2i32..1000,
        instance in prop::option::of(name()), rack in prop::option::of(name()), timeout in -1i32..600_000,
        topics in prop::option::of(prop::collection::vec(name(), 0..4)), assignor in prop::option::of(name()),
        owned in prop::option::of(prop::collection::vec((any::<u128>(), prop::collection::vec(0i32..64, 0..4)), 0..3)),
    ) {
        let regex = topics.as_ref().map(|_| String::new());
        let topic_partitions = owned.map(|o| o.into_iter().map(|(id, ps)| (uuid::Uuid::from_u128(id), ps)).collect());
        roundtrip(&GroupRequest::ConsumerGroupHeartbeat {
            group, member_id: member, member_epoch: epoch, instance_id: instance, rack_id: rack,
            rebalance_timeout_ms: timeout, subscribed_topic_names: topics, subscribed_topic_regex: regex,
            server_assignor: assignor, topic_partitions,
        }, v)?;
    }
}

#[test]
fn every_group_api_has_a_round_trip() {
    let covered = [
        ApiKey::FindCoordinator,
        ApiKey::JoinGroup,
        ApiKey::SyncGroup,
        ApiKey::Heartbeat,
        ApiKey::LeaveGroup,
        ApiKey::OffsetCommit,
        ApiKey::OffsetFetch,
        ApiKey::ConsumerGroupHeartbeat,
    ];
    for api in GROUP_APIS.iter().chain(CONSUMER_GROUP_APIS) {
        assert!(covered.contains(api), "{api:?} has no round-trip property");
    }
}
