//! Round trips for every (request, version) ottla sends: encode with ottla's codec
//! (header included), decode with kafka-protocol's broker-side decoder, encode again,
//! and compare bytes. A request ottla can build but a broker would read differently
//! fails here.

use bytes::{Buf, BytesMut};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, MetadataRequest, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes, decode_request_header_from_buffer};
use ottla_proto::wire::{Codec, SUPPORTED};
use proptest::prelude::*;

/// Encodes `request` as a full frame, decodes header and body as a broker would,
/// re-encodes, and checks both the value and the bytes.
fn roundtrip<R>(api: ApiKey, version: i16, request: &R) -> Result<(), TestCaseError>
where
    R: Encodable + Decodable + PartialEq + std::fmt::Debug,
{
    let mut codec = Codec::new(Some("roundtrip"), 1 << 20);
    let mut frame = BytesMut::new();
    codec
        .encode_request(api, version, request, true, &mut frame)
        .map_err(|e| TestCaseError::fail(format!("encode {api:?} v{version}: {e}")))?;
    let first = frame.clone().freeze();
    let length = frame.get_i32();
    prop_assert_eq!(length as usize, frame.len());
    let header = decode_request_header_from_buffer(&mut frame)
        .map_err(|e| TestCaseError::fail(format!("header: {e}")))?;
    prop_assert_eq!(header.request_api_key, api as i16);
    prop_assert_eq!(header.request_api_version, version);
    let decoded =
        R::decode(&mut frame, version).map_err(|e| TestCaseError::fail(format!("decode: {e}")))?;
    prop_assert_eq!(frame.remaining(), 0, "decode left bytes");
    prop_assert_eq!(&decoded, request);

    let mut again_codec = Codec::new(Some("roundtrip"), 1 << 20);
    let mut second = BytesMut::new();
    again_codec
        .encode_request(api, version, &decoded, true, &mut second)
        .map_err(|e| TestCaseError::fail(format!("re-encode: {e}")))?;
    prop_assert_eq!(&first[..], &second[..]);
    Ok(())
}

fn versions(api: ApiKey) -> std::ops::RangeInclusive<i16> {
    let (_, min, max) = SUPPORTED
        .iter()
        .find(|(a, _, _)| *a == api)
        .copied()
        .unwrap_or((api, 0, -1));
    min..=max
}

fn name() -> impl Strategy<Value = StrBytes> {
    "[a-zA-Z0-9._-]{1,40}".prop_map(StrBytes::from_string)
}

fn api_versions_request() -> impl Strategy<Value = (i16, ApiVersionsRequest)> {
    (versions(ApiKey::ApiVersions), name(), name()).prop_map(|(v, software, ver)| {
        let mut r = ApiVersionsRequest::default();
        if v >= 3 {
            r = r
                .with_client_software_name(software)
                .with_client_software_version(ver);
        }
        (v, r)
    })
}

fn metadata_request() -> impl Strategy<Value = (i16, MetadataRequest)> {
    let topics = prop::option::of(prop::collection::vec(
        (name(), any::<u128>(), any::<bool>()),
        0..8,
    ));
    (versions(ApiKey::Metadata), topics, any::<[bool; 3]>()).prop_map(|(v, topics, flags)| {
        let topics = topics.map(|ts| {
            ts.into_iter()
                .map(|(n, id, by_id)| {
                    let t = MetadataRequestTopic::default();
                    // From v10 a topic may be named by id alone (the name is nullable).
                    if v >= 10 && by_id {
                        t.with_topic_id(uuid::Uuid::from_u128(id)).with_name(None)
                    } else if v >= 10 {
                        t.with_topic_id(uuid::Uuid::from_u128(id))
                            .with_name(Some(TopicName(n)))
                    } else {
                        t.with_name(Some(TopicName(n)))
                    }
                })
                .collect()
        });
        let mut r = MetadataRequest::default().with_topics(topics);
        if v >= 4 {
            r.allow_auto_topic_creation = flags[0];
        }
        if (8..=10).contains(&v) {
            r.include_cluster_authorized_operations = flags[1];
        }
        if v >= 8 {
            r.include_topic_authorized_operations = flags[2];
        }
        (v, r)
    })
}

fn fetch_request() -> impl Strategy<Value = (i16, kafka_protocol::messages::FetchRequest)> {
    use ottla_proto::fetch::request::{FetchParams, FetchTarget, IsolationLevel, fetch_request};
    let target = (
        name(),
        any::<u128>(),
        0i32..100,
        0i64..i64::MAX,
        -1i32..50,
        1i32..10_000_000,
    );
    (
        versions(ApiKey::Fetch),
        prop::collection::vec(target, 0..8),
        0i32..10_000,
        1i32..1_000_000,
        any::<bool>(),
    )
        .prop_map(|(v, targets, wait, min, committed)| {
            let targets: Vec<FetchTarget> = targets
                .into_iter()
                .map(|(t, id, p, offset, epoch, max)| FetchTarget {
                    topic: t.to_string(),
                    topic_id: uuid::Uuid::from_u128(id.max(1)),
                    partition: p,
                    offset,
                    leader_epoch: epoch,
                    max_bytes: max,
                })
                .collect();
            let params = FetchParams {
                max_wait_ms: wait,
                min_bytes: min,
                max_bytes: 50 << 20,
                isolation: if committed {
                    IsolationLevel::ReadCommitted
                } else {
                    IsolationLevel::ReadUncommitted
                },
            };
            (
                v,
                fetch_request(v, &params, &targets).expect("fetch request"),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn fetch_requests_round_trip((version, request) in fetch_request()) {
        roundtrip(ApiKey::Fetch, version, &request)?;
    }

    #[test]
    fn api_versions_requests_round_trip((version, request) in api_versions_request()) {
        roundtrip(ApiKey::ApiVersions, version, &request)?;
    }

    #[test]
    fn metadata_requests_round_trip((version, request) in metadata_request()) {
        roundtrip(ApiKey::Metadata, version, &request)?;
    }
}

/// Metadata naming `topics` (each with `partitions` partitions, all led by node 1).
fn fetcher_metadata(
    topics: &[(String, u128)],
    partitions: i32,
) -> ottla_proto::metadata::ClusterMetadata {
    use ottla_proto::metadata::{
        ClusterMetadata, LeaderEpoch, NodeId, PartitionMetadata, TopicMetadata,
    };
    let mut m = ClusterMetadata::default();
    for (name, id) in topics {
        m.topics.insert(
            name.clone(),
            TopicMetadata {
                name: name.clone(),
                id: uuid::Uuid::from_u128(*id),
                internal: false,
                partitions: (0..partitions)
                    .map(|p| PartitionMetadata {
                        partition: p,
                        leader: Some(NodeId(1)),
                        leader_epoch: LeaderEpoch(p),
                        replicas: vec![],
                        isr: vec![],
                        error: 0,
                    })
                    .collect(),
                error: 0,
            },
        );
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The fetcher's own requests: a full fetch that opens a session, then an
    /// incremental one that changes some offsets and forgets paused partitions.
    #[test]
    fn fetcher_requests_round_trip(
        version in versions(ApiKey::Fetch),
        topics in prop::collection::btree_map("[a-z]{1,12}", 1u128..u128::MAX, 1..4),
        partitions in 1i32..5,
        offsets in prop::collection::vec(0i64..1 << 40, 16),
        moves in prop::collection::vec(any::<bool>(), 16),
        committed in any::<bool>(),
    ) {
        use std::time::Instant;
        use kafka_protocol::messages::FetchResponse;
        use ottla_proto::fetch::fetcher::{Fetcher, FetcherConfig};
        use ottla_proto::fetch::request::IsolationLevel;
        use ottla_proto::group::consumer_protocol::TopicPartition;
        use ottla_proto::metadata::NodeId;
        let topics: Vec<(String, u128)> = topics.into_iter().collect();
        let mut config = FetcherConfig::default();
        if committed {
            config.params.isolation = IsolationLevel::ReadCommitted;
        }
        let mut f = Fetcher::new(config);
        let tps: Vec<TopicPartition> = topics
            .iter()
            .flat_map(|(t, _)| (0..partitions).map(move |p| TopicPartition::new(t.clone(), p)))
            .collect();
        f.assign(&tps, true);
        for (i, tp) in tps.iter().enumerate() {
            f.set_committed(tp, offsets[i % offsets.len()], -1);
        }
        f.update_metadata(&fetcher_metadata(&topics, partitions));
        let now = Instant::now();
        f.claim_fetches(now);
        let (request, token) = f.build_fetch(now, NodeId(1), version).expect("a full fetch");
        roundtrip(ApiKey::Fetch, token.version(), &request)?;
        let mut response = FetchResponse::default();
        response.session_id = 77;
        f.handle_fetch(now, token, response);
        for (i, tp) in tps.iter().enumerate() {
            match (moves[i % moves.len()], i % 3) {
                (true, 0) => f.pause(now, tp),
                (true, _) => f.seek(tp, offsets[(i + 1) % offsets.len()] + 1),
                _ => {}
            }
        }
        f.claim_fetches(now);
        if let Some((request, token)) = f.build_fetch(now, NodeId(1), version) {
            if token.version() >= 7 {
                prop_assert_eq!(request.session_id, 77);
            }
            roundtrip(ApiKey::Fetch, token.version(), &request)?;
        }
    }

    #[test]
    fn list_offsets_requests_round_trip(
        version in versions(ApiKey::ListOffsets),
        topics in prop::collection::btree_map("[a-z]{1,12}", 1u128..u128::MAX, 1..4),
        partitions in 1i32..5,
        earliest in any::<bool>(),
        committed in any::<bool>(),
    ) {
        use std::time::Instant;
        use ottla_proto::fetch::fetcher::{Fetcher, FetcherConfig, OffsetReset};
        use ottla_proto::fetch::request::IsolationLevel;
        use ottla_proto::group::consumer_protocol::TopicPartition;
        let topics: Vec<(String, u128)> = topics.into_iter().collect();
        let mut config = FetcherConfig {
            reset: if earliest { OffsetReset::Earliest } else { OffsetReset::Latest },
            ..FetcherConfig::default()
        };
        if committed {
            config.params.isolation = IsolationLevel::ReadCommitted;
        }
        let mut f = Fetcher::new(config);
        let tps: Vec<TopicPartition> = topics
            .iter()
            .flat_map(|(t, _)| (0..partitions).map(move |p| TopicPartition::new(t.clone(), p)))
            .collect();
        f.assign(&tps, false);
        f.update_metadata(&fetcher_metadata(&topics, partitions));
        let now = Instant::now();
        let nodes = f.resets_due(now);
        prop_assert_eq!(nodes.len(), 1);
        let request = f.build_list_offsets(now, nodes[0], version).expect("a ListOffsets");
        let asked: usize = request.topics.iter().map(|t| t.partitions.len()).sum();
        prop_assert_eq!(asked, tps.len());
        roundtrip(ApiKey::ListOffsets, version, &request)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The producer's requests: batches for several partitions, idempotent or not,
    /// under every codec.
    #[test]
    fn produce_requests_round_trip(
        version in versions(ApiKey::Produce),
        partitions in 1i32..5,
        values in prop::collection::vec(prop::option::of(prop::collection::vec(any::<u8>(), 0..64)), 1..40),
        codec in 0usize..5,
        idempotent in any::<bool>(),
    ) {
        use std::time::{Duration, Instant};
        use ottla_proto::fetch::batch::Compression;
        use ottla_proto::metadata::NodeId;
        use ottla_proto::produce::accumulator::{Accumulator, ProducerConfig};
        use ottla_proto::produce::encode::OutRecord;
        let codec = [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd][codec];
        let mut a = Accumulator::new(ProducerConfig {
            compression: codec,
            idempotence: idempotent,
            linger: Duration::ZERO,
            ..ProducerConfig::default()
        });
        a.update_metadata(&fetcher_metadata(&[("t".to_string(), 1)], partitions));
        let now = Instant::now();
        if a.claim_producer_id(now) {
            a.set_producer_id(now, Ok((1234, 5)));
        }
        for (i, v) in values.iter().enumerate() {
            let record = OutRecord {
                timestamp: 1_700_000_000_000 + i as i64,
                key: (i % 2 == 0).then(|| bytes::Bytes::from(format!("k{i}"))),
                value: v.clone().map(bytes::Bytes::from),
                headers: vec![("h".into(), None), ("h".into(), Some(bytes::Bytes::from_static(b"x")))],
            };
            let partition = i32::try_from(i).unwrap_or(0) % partitions;
            a.append(now, "t", Some(partition), record).map_err(|e| TestCaseError::fail(e.0.to_string()))?;
        }
        a.claim_ready(now);
        let (request, _) = a.build_produce(now, NodeId(1), version).expect("a Produce");
        roundtrip(ApiKey::Produce, version, &request)?;
    }

    #[test]
    fn init_producer_id_requests_round_trip(version in versions(ApiKey::InitProducerId), timeout in 1i32..1_000_000) {
        let request = kafka_protocol::messages::InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(timeout);
        roundtrip(ApiKey::InitProducerId, version, &request)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// SaslHandshake as `driver::connection::authenticate` builds it: the name of one of
    /// the mechanisms ottla speaks.
    #[test]
    fn sasl_handshake_requests_round_trip(version in versions(ApiKey::SaslHandshake), which in 0usize..4) {
        use ottla_proto::sasl::Mechanism;
        let mechanism = [Mechanism::Plain, Mechanism::ScramSha256, Mechanism::ScramSha512, Mechanism::OAuthBearer][which];
        let request = kafka_protocol::messages::SaslHandshakeRequest::default()
            .with_mechanism(StrBytes::from_static_str(mechanism.name()));
        roundtrip(ApiKey::SaslHandshake, version, &request)?;
    }

    /// SaslAuthenticate carrying a mechanism's message: any bytes, empty included
    /// (PLAIN's and OAUTHBEARER's final acknowledgements are empty).
    #[test]
    fn sasl_authenticate_requests_round_trip(
        version in versions(ApiKey::SaslAuthenticate),
        auth in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let request = kafka_protocol::messages::SaslAuthenticateRequest::default()
            .with_auth_bytes(bytes::Bytes::from(auth));
        roundtrip(ApiKey::SaslAuthenticate, version, &request)?;
    }
}

fn topic_names() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec("[a-zA-Z0-9._-]{1,40}", 1..5)
}

fn topic_partitions() -> impl Strategy<Value = Vec<ottla::consumer::TopicPartition>> {
    prop::collection::vec(("[a-zA-Z0-9._-]{1,40}", 0..1000i32), 1..8).prop_map(|v| {
        v.into_iter()
            .map(|(t, p)| ottla::consumer::TopicPartition::new(t, p))
            .collect()
    })
}

// The admin client's requests, as `ottla_proto::admin` builds them, at every version
// the admin client negotiates.
proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn create_topics_requests_round_trip(
        version in versions(ApiKey::CreateTopics),
        topics in prop::collection::vec(
            ("[a-zA-Z0-9._-]{1,40}", -1..100i32, -1..5i16,
             prop::collection::btree_map("[a-z.]{1,20}", "[a-z0-9]{0,10}", 0..3)),
            1..4,
        ),
        timeout in 0..60_000i32,
        validate_only in any::<bool>(),
    ) {
        let topics: Vec<ottla::admin::NewTopic> = topics
            .into_iter()
            .map(|(name, partitions, replicas, configs)| {
                configs.into_iter().fold(
                    ottla::admin::NewTopic::new(name, partitions, replicas),
                    |t, (k, v)| t.config(k, v),
                )
            })
            .collect();
        let request = ottla_proto::admin::create_topics_request(&topics, timeout, validate_only);
        roundtrip(ApiKey::CreateTopics, version, &request)?;
    }

    #[test]
    fn delete_topics_requests_round_trip(
        version in versions(ApiKey::DeleteTopics),
        names in topic_names(),
        timeout in 0..60_000i32,
    ) {
        let request = ottla_proto::admin::delete_topics_request(&names, timeout, version);
        roundtrip(ApiKey::DeleteTopics, version, &request)?;
    }

    #[test]
    fn create_partitions_requests_round_trip(
        version in versions(ApiKey::CreatePartitions),
        counts in prop::collection::vec(("[a-zA-Z0-9._-]{1,40}", 1..1000i32), 1..4),
        timeout in 0..60_000i32,
        validate_only in any::<bool>(),
    ) {
        let request =
            ottla_proto::admin::create_partitions_request(&counts, timeout, validate_only);
        roundtrip(ApiKey::CreatePartitions, version, &request)?;
    }

    #[test]
    fn describe_configs_requests_round_trip(
        version in versions(ApiKey::DescribeConfigs),
        names in topic_names(),
    ) {
        let request = ottla_proto::admin::describe_topic_configs_request(&names);
        roundtrip(ApiKey::DescribeConfigs, version, &request)?;
    }

    #[test]
    fn group_listing_requests_round_trip(
        list_version in versions(ApiKey::ListGroups),
        describe_version in versions(ApiKey::DescribeGroups),
        group in name(),
    ) {
        roundtrip(
            ApiKey::ListGroups,
            list_version,
            &kafka_protocol::messages::ListGroupsRequest::default(),
        )?;
        let describe = kafka_protocol::messages::DescribeGroupsRequest::default()
            .with_groups(vec![kafka_protocol::messages::GroupId(group)]);
        roundtrip(ApiKey::DescribeGroups, describe_version, &describe)?;
    }

    #[test]
    fn offset_delete_requests_round_trip(
        version in versions(ApiKey::OffsetDelete),
        group in "[a-zA-Z0-9._-]{1,40}",
        partitions in topic_partitions(),
    ) {
        let request = ottla_proto::admin::offset_delete_request(&group, &partitions);
        roundtrip(ApiKey::OffsetDelete, version, &request)?;
    }
}

/// The transaction manager's requests, as it builds them, one of each kind: driven
/// through init, a partition, offsets with a live member's group metadata, and a
/// commit.
fn transactional_requests(
    txn_id: &str,
    group: &str,
    member: &str,
    generation: i32,
    instance: Option<String>,
    partitions: &[(String, i32)],
) -> Vec<ottla_proto::produce::transaction::TxnBody> {
    use ottla_proto::group::consumer_protocol::TopicPartition;
    use ottla_proto::metadata::NodeId;
    use ottla_proto::produce::transaction::*;
    let now = std::time::Instant::now();
    let mut m = TransactionManager::new(TransactionConfig::new(txn_id));
    let mut bodies = Vec::new();
    let answer = |m: &mut TransactionManager, bodies: &mut Vec<TxnBody>| -> bool {
        let Some((_, body, token)) = m.poll_request(now) else {
            return false;
        };
        let response = match &body {
            TxnBody::FindCoordinator { .. } => TxnResponse::FindCoordinator {
                error: 0,
                node: Some(NodeId(1)),
            },
            TxnBody::InitProducerId(_) => TxnResponse::InitProducerId {
                error: 0,
                producer_id: 4000,
                epoch: 2,
            },
            TxnBody::AddPartitionsToTxn { partitions, .. } => TxnResponse::AddPartitionsToTxn {
                error: 0,
                partitions: partitions.iter().map(|p| (p.clone(), 0)).collect(),
            },
            TxnBody::AddOffsetsToTxn(_) => TxnResponse::AddOffsetsToTxn { error: 0 },
            TxnBody::TxnOffsetCommit(_) => TxnResponse::TxnOffsetCommit {
                partitions: Vec::new(),
            },
            TxnBody::EndTxn(_) => TxnResponse::EndTxn { error: 0 },
            _ => return false,
        };
        bodies.push(body);
        m.handle_response(now, token, response);
        true
    };
    m.init().expect("init");
    while answer(&mut m, &mut bodies) {}
    m.begin().expect("begin");
    for (t, p) in partitions {
        m.add_partition(&TopicPartition::new(t.clone(), *p))
            .expect("add");
    }
    let offsets = partitions
        .iter()
        .map(|(t, p)| TxnOffset {
            partition: TopicPartition::new(t.clone(), *p),
            offset: 7,
            leader_epoch: 1,
            metadata: None,
        })
        .collect();
    let metadata = GroupMetadata {
        group_id: group.to_string(),
        generation_id: generation,
        member_id: member.to_string(),
        group_instance_id: instance,
    };
    m.send_offsets(metadata, offsets).expect("offsets");
    m.commit().expect("commit");
    while answer(&mut m, &mut bodies) {}
    bodies
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn transactional_requests_round_trip(
        add_version in versions(ApiKey::AddPartitionsToTxn),
        offsets_version in versions(ApiKey::AddOffsetsToTxn),
        commit_version in versions(ApiKey::TxnOffsetCommit),
        end_version in versions(ApiKey::EndTxn),
        init_version in versions(ApiKey::InitProducerId),
        txn_id in "[a-zA-Z0-9._-]{1,40}",
        group in "[a-zA-Z0-9._-]{1,40}",
        member in "[a-z0-9-]{0,40}",
        generation in -1..1000i32,
        instance in prop::option::of("[a-z0-9-]{1,20}"),
        partitions in prop::collection::vec(("[a-zA-Z0-9._-]{1,40}", 0..100i32), 1..4),
    ) {
        use ottla_proto::produce::transaction::TxnBody;
        let bodies = transactional_requests(&txn_id, &group, &member, generation, instance, &partitions);
        let kinds: Vec<&str> = bodies.iter().map(|b| match b {
            TxnBody::FindCoordinator { .. } => "find",
            TxnBody::InitProducerId(_) => "init",
            TxnBody::AddPartitionsToTxn { .. } => "add",
            TxnBody::AddOffsetsToTxn(_) => "offsets",
            TxnBody::TxnOffsetCommit(_) => "commit",
            TxnBody::EndTxn(_) => "end",
            _ => "other",
        }).collect();
        for kind in ["init", "add", "offsets", "commit", "end"] {
            prop_assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
        }
        for body in &bodies {
            match body {
                TxnBody::InitProducerId(r) => roundtrip(ApiKey::InitProducerId, init_version, r)?,
                TxnBody::AddPartitionsToTxn { .. } => {
                    let r = body.add_partitions_request(add_version).expect("request");
                    roundtrip(ApiKey::AddPartitionsToTxn, add_version, &r)?;
                }
                TxnBody::AddOffsetsToTxn(r) => roundtrip(ApiKey::AddOffsetsToTxn, offsets_version, r)?,
                TxnBody::TxnOffsetCommit(r) => roundtrip(ApiKey::TxnOffsetCommit, commit_version, r)?,
                TxnBody::EndTxn(r) => roundtrip(ApiKey::EndTxn, end_version, r)?,
                _ => {}
            }
        }
    }
}

/// Every API in ottla's supported table has a round-trip property above; a new entry
/// without one fails here.
#[test]
fn every_supported_api_has_a_round_trip() {
    // The group APIs are covered in group_roundtrip.rs.
    let covered = [
        ApiKey::ApiVersions,
        ApiKey::Metadata,
        ApiKey::Fetch,
        ApiKey::ListOffsets,
        ApiKey::Produce,
        ApiKey::InitProducerId,
        ApiKey::FindCoordinator,
        ApiKey::JoinGroup,
        ApiKey::SyncGroup,
        ApiKey::Heartbeat,
        ApiKey::LeaveGroup,
        ApiKey::OffsetCommit,
        ApiKey::OffsetFetch,
        ApiKey::ConsumerGroupHeartbeat,
        ApiKey::SaslHandshake,
        ApiKey::SaslAuthenticate,
        ApiKey::CreateTopics,
        ApiKey::DeleteTopics,
        ApiKey::CreatePartitions,
        ApiKey::DescribeConfigs,
        ApiKey::ListGroups,
        ApiKey::DescribeGroups,
        ApiKey::OffsetDelete,
        ApiKey::AddPartitionsToTxn,
        ApiKey::AddOffsetsToTxn,
        ApiKey::TxnOffsetCommit,
        ApiKey::EndTxn,
    ];
    for (api, _, _) in SUPPORTED {
        assert!(
            covered.contains(api),
            "{api:?} is sent by ottla but has no round-trip property"
        );
    }
}
