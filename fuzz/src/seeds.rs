//! The committed seed corpus (`fuzz/seeds/<target>/<name>`): a handful of well-formed
//! inputs per target, so that every run starts past the first parse. Written and checked
//! by `cargo run --example seeds [-- --check]`; [`validate`] proves that each seed gets
//! where it was written to go.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, FetchResponse, FindCoordinatorResponse, GroupId,
    HeartbeatResponse, InitProducerIdResponse, JoinGroupResponse, LeaveGroupResponse,
    ListOffsetsResponse, MetadataResponse, OffsetCommitResponse, OffsetFetchResponse,
    ProduceResponse, ProducerId, SaslAuthenticateResponse, SaslHandshakeResponse,
    SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::{
    Compression as KpCompression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use ottla_proto::fetch::batch::Compression;
use ottla_proto::group::codec::GROUP_APIS;
use ottla_proto::group::consumer_protocol::{
    Assignment, Subscription, TopicPartition, decode_assignment, decode_subscription,
    encode_assignment, encode_subscription,
};
use ottla_proto::produce::encode::{OutRecord, ProducerFields, encode_batch};
use ottla_proto::wire::SUPPORTED;

use crate::batch::{CHECK_CRCS, CONTROL_BIT, Codec, TRANSACTIONAL_BIT, mode, rebase};
use crate::group_ops::Script;
use crate::response::{SCRAM_NONCE, TOPIC, TOPIC_ID, selector};

/// One seed: the target it feeds, its file name, its bytes.
#[derive(Debug, Clone)]
pub struct Seed {
    /// The fuzz target.
    pub target: &'static str,
    /// The file name under `fuzz/seeds/<target>/`.
    pub name: String,
    /// The input.
    pub bytes: Vec<u8>,
}

/// Every target that has seeds.
pub const TARGETS: &[&str] = &[
    "frame",
    "response",
    "group_response",
    "fetch_response",
    "consumer_protocol",
    "record_batch",
    "group_ops",
    "lanes_ops",
];

/// Every seed, in a stable order.
pub fn all() -> Vec<Seed> {
    let mut out = Vec::new();
    let mut add = |target: &'static str, name: String, bytes: Vec<u8>| {
        out.push(Seed {
            target,
            name,
            bytes,
        })
    };
    for (api, version, body) in responses() {
        let name = format!("{}-v{version}", api_name(api));
        let [a, v] = selector(api, version);
        let mut input = vec![a, v, 0];
        input.extend_from_slice(&body);
        add("response", name.clone(), input);
        if api == ApiKey::SaslAuthenticate {
            // The same server-first message for the SCRAM mechanisms (flags bits 3-4).
            for (mechanism, hash) in [(2u8, "scram-sha-256"), (3, "scram-sha-512")] {
                let mut input = vec![a, v, mechanism << 3];
                input.extend_from_slice(&body);
                add("response", format!("{name}-{hash}"), input);
            }
        }
        if GROUP_APIS.contains(&api) {
            let mut input = vec![group_selector(api, version)];
            input.extend_from_slice(&body);
            add("group_response", name, input);
        }
    }
    for (name, input) in frames() {
        add("frame", name, input);
    }
    for (name, input) in fetches() {
        add("fetch_response", name, input);
    }
    for (name, input) in consumer_protocol() {
        add("consumer_protocol", name, input);
    }
    for (name, input) in record_batches() {
        add("record_batch", name, input);
    }
    for (name, script, _) in group_scripts() {
        add("group_ops", name.to_string(), script);
    }
    for (name, script) in lanes_scripts() {
        add("lanes_ops", name.to_string(), script);
    }
    out
}

/// Checks that every seed is what it claims: responses decode through ottla, the
/// record-batch seeds read back, and each group script reaches the events it was
/// written for without breaking a promise. Panics otherwise.
pub fn validate() {
    for (api, version, body) in responses() {
        assert!(
            crate::response::decodes(api, version, Bytes::from(body)),
            "{api:?} v{version} does not decode"
        );
    }
    for (name, input) in fetches() {
        let version = 4 + i16::from(input[0]) % 13;
        assert!(
            crate::response::decodes(ApiKey::Fetch, version, Bytes::from(input[1..].to_vec())),
            "{name} does not decode"
        );
    }
    for (name, input) in consumer_protocol() {
        let ok = if name.starts_with("subscription") {
            decode_subscription(Bytes::from(input)).is_ok()
        } else {
            decode_assignment(Bytes::from(input)).is_ok()
        };
        assert!(ok, "{name} does not decode");
    }
    for (name, input) in record_batches() {
        let read = crate::batch::reads_back(&input);
        if name.ends_with("unknown") {
            assert_eq!(read, 0, "{name}: an unknown codec is an error");
        } else {
            assert!(read > 0, "{name}: no record reads back");
        }
    }
    for (name, script) in lanes_scripts() {
        if let Err(broken) = ottla_proto::process::lanes::script::run(&script) {
            panic!("{name}: {broken}");
        }
    }
    for (name, script, milestones) in group_scripts() {
        let trace = crate::group_ops::trace(&script).unwrap_or_else(|v| panic!("{name}: {v}"));
        for m in milestones {
            assert!(trace.contains(m), "{name} never reaches {m}:\n{trace}");
        }
    }
}

fn api_name(api: ApiKey) -> String {
    let name = format!("{api:?}");
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The `group_response` target's selector byte for `api` at `version`.
fn group_selector(api: ApiKey, version: i16) -> u8 {
    let (_, min, max) = *SUPPORTED
        .iter()
        .find(|(a, _, _)| *a == api)
        .expect("a group API");
    (0..=255u8)
        .find(|s| {
            GROUP_APIS[usize::from(*s) % GROUP_APIS.len()] == api
                && min + i16::from(*s >> 3) % (max - min + 1) == version
        })
        .expect("a selector")
}

fn encode<R: Encodable>(r: &R, version: i16) -> Vec<u8> {
    let mut b = BytesMut::new();
    r.encode(&mut b, version)
        .unwrap_or_else(|e| panic!("seed encodes at v{version}: {e}"));
    b.to_vec()
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// `(api, version, body)`: a realistic answer per API ottla reads, at its lowest and
/// highest version.
fn responses() -> Vec<(ApiKey, i16, Vec<u8>)> {
    let mut out = Vec::new();
    for &(api, min, max) in SUPPORTED {
        for version in [min, max] {
            out.push((api, version, response_body(api, version)));
        }
    }
    // The UNSUPPORTED_VERSION answer to ApiVersions v3, in the v0 layout.
    let mut refused = BytesMut::new();
    refused.put_i16(35);
    refused.put_i32(1);
    refused.put_i16(ApiKey::ApiVersions as i16);
    refused.put_i16(0);
    refused.put_i16(2);
    out.push((ApiKey::ApiVersions, 3, refused.to_vec()));
    out
}

fn response_body(api: ApiKey, version: i16) -> Vec<u8> {
    match api {
        ApiKey::ApiVersions => {
            let mut r = ApiVersionsResponse::default();
            r.api_keys = SUPPORTED
                .iter()
                .map(|&(a, min, max)| {
                    let mut v = ApiVersion::default();
                    v.api_key = a as i16;
                    v.min_version = min;
                    v.max_version = max;
                    v
                })
                .collect();
            encode(&r, version)
        }
        ApiKey::Metadata => {
            let mut broker = MetadataResponseBroker::default();
            broker.node_id = BrokerId(1);
            broker.host = s("localhost");
            broker.port = 9092;
            let mut topic = MetadataResponseTopic::default();
            topic.name = Some(TopicName(s(TOPIC)));
            if version >= 10 {
                topic.topic_id = TOPIC_ID;
            }
            topic.partitions = (0..2)
                .map(|p| {
                    let mut mp = MetadataResponsePartition::default();
                    mp.partition_index = p;
                    mp.leader_id = BrokerId(1);
                    mp.replica_nodes = vec![BrokerId(1)];
                    mp.isr_nodes = vec![BrokerId(1)];
                    if version >= 7 {
                        mp.leader_epoch = 3;
                    }
                    mp
                })
                .collect();
            let mut r = MetadataResponse::default();
            r.brokers = vec![broker];
            r.controller_id = BrokerId(1);
            r.topics = vec![topic];
            encode(&r, version)
        }
        ApiKey::Fetch => {
            let records = [plain_batch(0, 3, false), plain_batch(3, 2, false)].concat();
            fetch_body(version, records, vec![])
        }
        ApiKey::ListOffsets => {
            let mut topic = ListOffsetsTopicResponse::default();
            topic.name = TopicName(s(TOPIC));
            topic.partitions = (0..2)
                .map(|p| {
                    let mut lp = ListOffsetsPartitionResponse::default();
                    lp.partition_index = p;
                    lp.offset = 42;
                    lp.timestamp = -1;
                    if version >= 4 {
                        lp.leader_epoch = 3;
                    }
                    lp
                })
                .collect();
            let mut r = ListOffsetsResponse::default();
            r.topics = vec![topic];
            encode(&r, version)
        }
        ApiKey::Produce => {
            let mut topic = TopicProduceResponse::default();
            topic.name = TopicName(s(TOPIC));
            topic.partition_responses = (0..2)
                .map(|p| {
                    let mut pp = PartitionProduceResponse::default();
                    pp.index = p;
                    pp.base_offset = 100;
                    pp
                })
                .collect();
            let mut r = ProduceResponse::default();
            r.responses = vec![topic];
            encode(&r, version)
        }
        ApiKey::InitProducerId => {
            let mut r = InitProducerIdResponse::default();
            r.producer_id = ProducerId(42);
            r.producer_epoch = 3;
            encode(&r, version)
        }
        ApiKey::FindCoordinator => {
            let mut r = FindCoordinatorResponse::default();
            if version >= 4 {
                let mut c = Coordinator::default();
                c.key = s("g");
                c.node_id = BrokerId(1);
                c.host = s("localhost");
                c.port = 9092;
                r.coordinators = vec![c];
            } else {
                r.node_id = BrokerId(1);
                r.host = s("localhost");
                r.port = 9092;
            }
            encode(&r, version)
        }
        ApiKey::JoinGroup => {
            let subscription = Subscription {
                topics: vec![TOPIC.into()],
                user_data: None,
                owned_partitions: vec![],
                generation_id: -1,
                rack_id: None,
            };
            let metadata = encode_subscription(&subscription, 1).expect("subscription");
            let mut r = JoinGroupResponse::default();
            r.generation_id = 1;
            if version >= 7 {
                r.protocol_type = Some(s("consumer"));
            }
            r.protocol_name = Some(s("range"));
            r.leader = s("m1");
            r.member_id = s("m1");
            r.members = ["m1", "m2"]
                .iter()
                .map(|m| {
                    let mut jm = JoinGroupResponseMember::default();
                    jm.member_id = s(m);
                    jm.metadata = metadata.clone();
                    jm
                })
                .collect();
            encode(&r, version)
        }
        ApiKey::SyncGroup => {
            let assignment = Assignment {
                partitions: vec![TopicPartition::new(TOPIC, 0), TopicPartition::new(TOPIC, 1)],
                user_data: None,
            };
            let mut r = SyncGroupResponse::default();
            if version >= 5 {
                r.protocol_type = Some(s("consumer"));
                r.protocol_name = Some(s("range"));
            }
            r.assignment = encode_assignment(&assignment, 0).expect("assignment");
            encode(&r, version)
        }
        ApiKey::Heartbeat => encode(&HeartbeatResponse::default(), version),
        ApiKey::LeaveGroup => encode(&LeaveGroupResponse::default(), version),
        ApiKey::OffsetCommit => {
            let mut topic = OffsetCommitResponseTopic::default();
            topic.name = TopicName(s(TOPIC));
            topic.partitions = (0..2)
                .map(|p| {
                    let mut cp = OffsetCommitResponsePartition::default();
                    cp.partition_index = p;
                    cp
                })
                .collect();
            let mut r = OffsetCommitResponse::default();
            r.topics = vec![topic];
            encode(&r, version)
        }
        ApiKey::OffsetFetch => {
            let mut r = OffsetFetchResponse::default();
            if version >= 8 {
                let mut topic = OffsetFetchResponseTopics::default();
                topic.name = TopicName(s(TOPIC));
                topic.partitions = (0..2)
                    .map(|p| {
                        let mut fp = OffsetFetchResponsePartitions::default();
                        fp.partition_index = p;
                        fp.committed_offset = 7;
                        fp
                    })
                    .collect();
                let mut group = OffsetFetchResponseGroup::default();
                group.group_id = GroupId(s("g"));
                group.topics = vec![topic];
                r.groups = vec![group];
            } else {
                let mut topic = OffsetFetchResponseTopic::default();
                topic.name = TopicName(s(TOPIC));
                topic.partitions = (0..2)
                    .map(|p| {
                        let mut fp = OffsetFetchResponsePartition::default();
                        fp.partition_index = p;
                        fp.committed_offset = 7;
                        fp
                    })
                    .collect();
                r.topics = vec![topic];
            }
            encode(&r, version)
        }
        ApiKey::SaslHandshake => {
            let mut r = SaslHandshakeResponse::default();
            r.mechanisms = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
                .iter()
                .map(|m| s(m))
                .collect();
            encode(&r, version)
        }
        ApiKey::SaslAuthenticate => {
            // RFC 7677's server-first message, which extends `SCRAM_NONCE`.
            let mut r = SaslAuthenticateResponse::default();
            r.auth_bytes = Bytes::from(format!(
                "r={SCRAM_NONCE}%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
            ));
            if version >= 1 {
                r.session_lifetime_ms = 60_000;
            }
            encode(&r, version)
        }
        ApiKey::ConsumerGroupHeartbeat => {
            use kafka_protocol::messages::ConsumerGroupHeartbeatResponse;
            use kafka_protocol::messages::consumer_group_heartbeat_response::{
                Assignment, TopicPartitions,
            };
            let mut topic = TopicPartitions::default();
            topic.topic_id = TOPIC_ID;
            topic.partitions = vec![0, 1];
            let mut assignment = Assignment::default();
            assignment.topic_partitions = vec![topic];
            let mut r = ConsumerGroupHeartbeatResponse::default();
            r.member_id = Some(s("member-1"));
            r.member_epoch = 3;
            r.heartbeat_interval_ms = 3000;
            r.assignment = Some(assignment);
            encode(&r, version)
        }
        // The admin client's answers (`ottla_proto::admin`).
        ApiKey::CreateTopics => {
            use kafka_protocol::messages::CreateTopicsResponse;
            use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
            let mut t = CreatableTopicResult::default();
            t.name = TopicName(s(TOPIC));
            if version >= 5 {
                t.num_partitions = 2;
                t.replication_factor = 1;
            }
            let mut refused = CreatableTopicResult::default();
            refused.name = TopicName(s("exists"));
            refused.error_code = 36; // TOPIC_ALREADY_EXISTS
            refused.error_message = Some(s("Topic 'exists' already exists."));
            let mut r = CreateTopicsResponse::default();
            r.topics = vec![t, refused];
            encode(&r, version)
        }
        ApiKey::DeleteTopics => {
            use kafka_protocol::messages::DeleteTopicsResponse;
            use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
            let mut t = DeletableTopicResult::default();
            t.name = Some(TopicName(s(TOPIC)));
            if version >= 6 {
                t.topic_id = TOPIC_ID;
            }
            let mut r = DeleteTopicsResponse::default();
            r.responses = vec![t];
            encode(&r, version)
        }
        ApiKey::DescribeConfigs => {
            use kafka_protocol::messages::DescribeConfigsResponse;
            use kafka_protocol::messages::describe_configs_response::{
                DescribeConfigsResourceResult, DescribeConfigsResult,
            };
            let mut c = DescribeConfigsResourceResult::default();
            c.name = s("cleanup.policy");
            c.value = Some(s("compact"));
            c.config_source = 1; // DYNAMIC_TOPIC_CONFIG
            let mut t = DescribeConfigsResult::default();
            t.resource_type = 2; // TOPIC
            t.resource_name = s(TOPIC);
            t.configs = vec![c];
            let mut r = DescribeConfigsResponse::default();
            r.results = vec![t];
            encode(&r, version)
        }
        ApiKey::CreatePartitions => {
            use kafka_protocol::messages::CreatePartitionsResponse;
            use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
            let mut t = CreatePartitionsTopicResult::default();
            t.name = TopicName(s(TOPIC));
            let mut r = CreatePartitionsResponse::default();
            r.results = vec![t];
            encode(&r, version)
        }
        ApiKey::ListGroups => {
            use kafka_protocol::messages::ListGroupsResponse;
            use kafka_protocol::messages::list_groups_response::ListedGroup;
            let mut g = ListedGroup::default();
            g.group_id = GroupId(s("billing"));
            g.protocol_type = s("consumer");
            if version >= 4 {
                g.group_state = s("Stable");
            }
            let mut r = ListGroupsResponse::default();
            r.groups = vec![g];
            encode(&r, version)
        }
        ApiKey::DescribeGroups => {
            use kafka_protocol::messages::DescribeGroupsResponse;
            use kafka_protocol::messages::describe_groups_response::{
                DescribedGroup, DescribedGroupMember,
            };
            use ottla_proto::group::consumer_protocol::{encode_assignment, encode_subscription};
            let subscription = Subscription {
                topics: vec![TOPIC.to_string()],
                user_data: None,
                owned_partitions: vec![],
                generation_id: -1,
                rack_id: None,
            };
            let assignment = Assignment {
                partitions: vec![TopicPartition::new(TOPIC, 0), TopicPartition::new(TOPIC, 1)],
                user_data: None,
            };
            let mut m = DescribedGroupMember::default();
            m.member_id = s("member-1");
            m.client_id = s("ottla");
            m.client_host = s("/127.0.0.1");
            m.member_metadata = encode_subscription(&subscription, 1).expect("a subscription");
            m.member_assignment = encode_assignment(&assignment, 1).expect("an assignment");
            let mut g = DescribedGroup::default();
            g.group_id = GroupId(s("billing"));
            g.group_state = s("Stable");
            g.protocol_type = s("consumer");
            g.protocol_data = s("range");
            g.members = vec![m];
            let mut r = DescribeGroupsResponse::default();
            r.groups = vec![g];
            encode(&r, version)
        }
        ApiKey::OffsetDelete => {
            use kafka_protocol::messages::OffsetDeleteResponse;
            use kafka_protocol::messages::offset_delete_response::{
                OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
            };
            let mut p = OffsetDeleteResponsePartition::default();
            p.partition_index = 0;
            let mut t = OffsetDeleteResponseTopic::default();
            t.name = TopicName(s(TOPIC));
            t.partitions = vec![p];
            let mut r = OffsetDeleteResponse::default();
            r.topics = vec![t];
            encode(&r, version)
        }
        ApiKey::AddPartitionsToTxn => {
            use kafka_protocol::messages::AddPartitionsToTxnResponse;
            use kafka_protocol::messages::add_partitions_to_txn_response::{
                AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
            };
            let mut p = AddPartitionsToTxnPartitionResult::default();
            p.partition_index = 0;
            let mut t = AddPartitionsToTxnTopicResult::default();
            t.name = TopicName(s(TOPIC));
            t.results_by_partition = vec![p];
            let mut r = AddPartitionsToTxnResponse::default();
            r.results_by_topic_v3_and_below = vec![t];
            encode(&r, version)
        }
        ApiKey::AddOffsetsToTxn => {
            let r = kafka_protocol::messages::AddOffsetsToTxnResponse::default();
            encode(&r, version)
        }
        ApiKey::TxnOffsetCommit => {
            use kafka_protocol::messages::TxnOffsetCommitResponse;
            use kafka_protocol::messages::txn_offset_commit_response::{
                TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
            };
            let mut p = TxnOffsetCommitResponsePartition::default();
            p.partition_index = 0;
            let mut t = TxnOffsetCommitResponseTopic::default();
            t.name = TopicName(s(TOPIC));
            t.partitions = vec![p];
            let mut r = TxnOffsetCommitResponse::default();
            r.topics = vec![t];
            encode(&r, version)
        }
        ApiKey::EndTxn => {
            let r = kafka_protocol::messages::EndTxnResponse::default();
            encode(&r, version)
        }
        other => panic!("no seed for {other:?}: add one"),
    }
}

/// Streams of framed responses, with the requests in flight they answer.
fn frames() -> Vec<(String, Vec<u8>)> {
    // (name, the requests in flight, bytes cut off the end)
    type Stream = (&'static str, &'static [(ApiKey, i16)], usize);
    let streams: &[Stream] = &[
        ("api-versions", &[(ApiKey::ApiVersions, 3)], 0),
        (
            "metadata-then-coordinator",
            &[(ApiKey::Metadata, 12), (ApiKey::FindCoordinator, 4)],
            0,
        ),
        (
            "fetch-then-a-cut-frame",
            &[(ApiKey::Fetch, 12), (ApiKey::Heartbeat, 4)],
            3,
        ),
        (
            "group-round",
            &[
                (ApiKey::JoinGroup, 5),
                (ApiKey::SyncGroup, 3),
                (ApiKey::OffsetFetch, 8),
            ],
            0,
        ),
    ];
    streams
        .iter()
        .map(|(name, requests, cut)| {
            let mut input = vec![u8::try_from(requests.len() - 1).expect("few")];
            for (api, version) in *requests {
                input.extend_from_slice(&selector(*api, *version));
            }
            for (i, (api, version)) in requests.iter().enumerate() {
                let body = response_body(*api, *version);
                let mut frame = BytesMut::new();
                frame.put_i32(i32::try_from(i).expect("few"));
                if api.response_header_version(*version) >= 1 {
                    frame.put_u8(0); // no tagged fields
                }
                frame.put_slice(&body);
                input.put_i32(i32::try_from(frame.len()).expect("small"));
                input.extend_from_slice(&frame);
            }
            input.truncate(input.len() - cut);
            (name.to_string(), input)
        })
        .collect()
}

/// A batch of `n` uncompressed records from `first`, as kafka-protocol writes them.
fn plain_batch(first: i64, n: i64, transactional: bool) -> Vec<u8> {
    let records: Vec<Record> = (first..first + n)
        .map(|o| Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: if transactional { 9 } else { -1 },
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: o,
            sequence: o as i32,
            timestamp: 1_700_000_000_000 + o,
            key: (o % 2 == 0).then(|| Bytes::from(format!("k{o}"))),
            value: Some(Bytes::from(format!("value {o}"))),
            headers: [(s("h"), Some(Bytes::from_static(b"v")))]
                .into_iter()
                .collect(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: KpCompression::None,
        },
    )
    .expect("encode");
    buf.to_vec()
}

/// A batch of `n` records written by ottla's encoder under `codec`, at `first`.
fn ottla_batch(first: i64, n: usize, codec: Compression, producer: i64, attributes: i16) -> Bytes {
    let records: Vec<OutRecord> = (0..n)
        .map(|i| OutRecord {
            timestamp: 1_700_000_000_000 + i as i64,
            key: (i % 2 == 0).then(|| Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(format!("value {i} ").repeat(3))),
            headers: vec![("h".into(), Some(Bytes::from_static(b"v")))],
        })
        .collect();
    let fields = ProducerFields {
        producer_id: producer,
        producer_epoch: if producer >= 0 { 0 } else { -1 },
        base_sequence: if producer >= 0 { 0 } else { -1 },
        transactional: false,
    };
    let batch = encode_batch(&records, codec, fields).expect("encode");
    rebase(&batch, first, attributes)
}

/// A transaction marker of `producer` at `offset`: ABORT or COMMIT.
fn marker(offset: i64, producer: i64, abort: bool) -> Bytes {
    let record = OutRecord {
        timestamp: 1_700_000_000_000,
        key: Some(Bytes::from(vec![0, 0, 0, u8::from(!abort)])),
        value: Some(Bytes::from_static(&[0, 0, 0, 0, 0, 0])),
        headers: vec![],
    };
    let fields = ProducerFields {
        producer_id: producer,
        producer_epoch: 0,
        base_sequence: -1,
        transactional: false,
    };
    let batch = encode_batch(&[record], Compression::None, fields).expect("encode");
    rebase(&batch, offset, TRANSACTIONAL_BIT | CONTROL_BIT)
}

fn fetch_body(version: i16, records: Vec<u8>, aborted: Vec<(i64, i64)>) -> Vec<u8> {
    let end = if aborted.is_empty() { 5 } else { 10 };
    let mut p0 = PartitionData::default();
    p0.partition_index = 0;
    p0.high_watermark = end;
    p0.last_stable_offset = end;
    if !aborted.is_empty() {
        p0.aborted_transactions = Some(
            aborted
                .into_iter()
                .map(|(producer, first)| {
                    let mut a = AbortedTransaction::default();
                    a.producer_id = ProducerId(producer);
                    a.first_offset = first;
                    a
                })
                .collect(),
        );
    }
    p0.records = Some(Bytes::from(records));
    let mut p1 = PartitionData::default();
    p1.partition_index = 1;
    p1.error_code = 1;
    let mut topic = FetchableTopicResponse::default();
    if version >= 13 {
        topic.topic_id = TOPIC_ID;
    } else {
        topic.topic = TopicName(s(TOPIC));
    }
    topic.partitions = vec![p0, p1];
    let mut response = FetchResponse::default();
    response.responses = vec![topic];
    if version >= 7 {
        response.session_id = 5;
    }
    encode(&response, version)
}

/// `fetch_response` seeds: `[selector] body`, version `4 + selector % 13`.
fn fetches() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for version in [4i16, 7, 11, 12, 13, 16] {
        let mut records = plain_batch(0, 3, false);
        records.extend_from_slice(&plain_batch(3, 2, version >= 11));
        let mut input = vec![u8::try_from(version - 4).expect("small")];
        input.extend_from_slice(&fetch_body(version, records, vec![]));
        out.push((format!("fetch-v{version}"), input));
    }
    // Compressed batches, then a transaction aborted by its marker, read committed.
    let version = 12i16;
    let records = [
        ottla_batch(0, 3, Compression::Gzip, -1, 0),
        ottla_batch(3, 2, Compression::Zstd, -1, 0),
        ottla_batch(5, 2, Compression::Lz4, 7, TRANSACTIONAL_BIT),
        marker(7, 7, true),
        ottla_batch(8, 2, Compression::Snappy, -1, 0),
    ]
    .concat();
    // 0x40 reads committed; 4 + (0x40 | 8) % 13 = 12.
    let selector = (0x40..0x80u8)
        .find(|s| 4 + i16::from(*s) % 13 == version)
        .expect("a selector");
    let mut input = vec![selector];
    input.extend_from_slice(&fetch_body(version, records, vec![(7, 5)]));
    out.push(("fetch-v12-compressed-read-committed".into(), input));
    out
}

fn consumer_protocol() -> Vec<(String, Vec<u8>)> {
    let owned = vec![
        TopicPartition::new("t", 0),
        TopicPartition::new("u", 1),
        TopicPartition::new("t", 2),
    ];
    let mut out = Vec::new();
    for version in 0..=3 {
        let subscription = Subscription {
            topics: vec!["t".into(), "u".into()],
            user_data: Some(Bytes::from_static(b"\x00\x01data")),
            owned_partitions: owned.clone(),
            generation_id: 4,
            rack_id: Some("rack-a".into()),
        };
        let bytes = encode_subscription(&subscription, version).expect("subscription");
        out.push((format!("subscription-v{version}"), bytes.to_vec()));
        let assignment = Assignment {
            partitions: owned.clone(),
            user_data: (version > 0).then(|| Bytes::from_static(b"ud")),
        };
        let bytes = encode_assignment(&assignment, version).expect("assignment");
        out.push((format!("assignment-v{version}"), bytes.to_vec()));
    }
    // A version from the future: read with the newest schema, the rest ignored.
    let mut future = out[6].1.clone();
    future[0..2].copy_from_slice(&7i16.to_be_bytes());
    future.extend_from_slice(b"appended by v7");
    out.push(("subscription-v7".into(), future));
    out
}

/// `record_batch` seeds: a records field as it is, and each built form under each codec.
fn record_batches() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let field = [
        ottla_batch(0, 3, Compression::Gzip, -1, 0),
        ottla_batch(3, 2, Compression::None, 1, TRANSACTIONAL_BIT),
        marker(5, 1, true),
        ottla_batch(6, 2, Compression::Lz4, -1, 0),
    ]
    .concat();
    let mut input = vec![CHECK_CRCS];
    input.extend_from_slice(&field);
    out.push(("records-field".into(), input));

    // The records of a plain two-record batch: what the raw forms compress.
    let plain = ottla_batch(0, 2, Compression::None, -1, 0);
    let content = &plain[61..];
    let codecs = [
        ("none", Codec::None),
        ("gzip", Codec::Gzip),
        ("snappy", Codec::Snappy),
        ("xerial", Codec::XerialSnappy),
        ("lz4", Codec::Lz4),
        ("zstd", Codec::Zstd),
        ("unknown", Codec::Unknown),
    ];
    for (name, codec) in codecs {
        let mut input = vec![mode(codec, false)];
        input.extend_from_slice(&0i64.to_be_bytes()); // base offset
        input.extend_from_slice(&1u16.to_be_bytes()); // last offset delta
        input.push(2); // record count
        input.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        input.push(0); // producer id -1
        input.extend_from_slice(&u16::try_from(content.len()).expect("small").to_be_bytes());
        input.extend_from_slice(content);
        input.extend_from_slice(&16u16.to_be_bytes()); // xerial block size
        input.push(0); // unknown codec id 5
        out.push((format!("raw-{name}"), input));
        if codec == Codec::Unknown {
            continue;
        }
        let mut input = vec![mode(codec, true)];
        input.extend_from_slice(&100i64.to_be_bytes()); // base offset
        input.push(2); // three records
        for i in 0..3u8 {
            input.extend_from_slice(&(1_000 + u32::from(i)).to_be_bytes());
            input.extend_from_slice(&[1, 0, 2, b'k', b'0' + i]); // key
            input.extend_from_slice(&[1, 0, 6]); // value
            input.extend_from_slice(b"value ");
            input.extend_from_slice(&[1, 0, 1, b'h', 1, 0, 1, b'v']); // one header
        }
        input.push(8); // producer id 7
        out.push((format!("ottla-{name}"), input));
    }
    out
}

/// `(name, script)` for `lanes_ops`, in the format of
/// `ottla_proto::process::lanes::script`: a configuration byte, then operations.
fn lanes_scripts() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            // One record at a time: a retry, a dead-letter write that fails, is tried
            // again and lands, then the next record succeeds.
            "retry-then-dead-letter",
            vec![
                0b0_0000, // max_batch 1, commit after every step, concurrency 1
                0, 0, 4, // 5 records on partition 0
                1, 0, 0, 4, // a transient error
                5, 100, 0, // 100 ms: the retry
                1, 0, 0, 6, // a permanent error: the dead-letter write
                4, 0, 0, // it fails: halted
                5, 200, 0, // 200 ms: written again
                4, 0, 1, // acknowledged
                1, 0, 0, 0, // the next record succeeds
            ],
        ),
        (
            // Batches of three on an interval: progress on the way, then a revocation
            // the handler answers by stopping, and the handover.
            "batches-progress-revoke",
            vec![
                0b0_0110, // max_batch 3, 700 ms commits, concurrency 1
                0, 1, 4, // 5 records on partition 1
                3, 0, 2, // the call finished two
                6, 1, 0xe8, 0x03, // partition 1 revoked, 1 s to stop
                1, 0, 0, 8, // the call stops on the cancellation
                5, 0xe8, 0x03, // 1 s
            ],
        ),
        (
            // Two partitions at once: one lost mid-call, a crashed task on the other,
            // a stray answer, a failed commit, and the lost partition assigned again.
            "lose-crash-stray",
            vec![
                0b0_1000, // max_batch 1, commit after every step, concurrency 2
                0, 0, 1, // 2 records on partition 0
                0, 2, 1, // 2 records on partition 2
                7, 0, // partition 0 lost
                1, 0, 0, 11, // the other call's task crashes
                4, 0, 1, // its dead-letter write lands
                9, 3, 0, // an answer for a call never made
                8, // the next commit fails
                0, 0, 0, // partition 0 again: 1 record
                1, 0, 0, 0, // done
                1, 0, 0, 0, // done
                5, 0xb8, 0x0b, // 3 s
            ],
        ),
    ]
}

/// `(name, script, events the trace must show)`.
fn group_scripts() -> Vec<(&'static str, Vec<u8>, &'static [&'static str])> {
    let range = (0, 1);
    vec![
        (
            "eager-alone",
            Script::new(0b0001, false, false, 0)
                .counts(4, 2, 1)
                .find_coordinator(0, 0, 1)
                .join(0, 0, range, true, &[])
                .sync(0, 0, 0x000f)
                .offset_fetch(0, 4)
                .advance_secs(1)
                .commit(0x01, &[10])
                .commit_answer(1, 0, 1)
                .answer(0, 27) // the heartbeat: REBALANCE_IN_PROGRESS
                .complete_revocation()
                .join(0, 0, range, true, &[])
                .sync(0, 0, 0x0003)
                .fire()
                .answer(1, 0)
                .leave()
                .answer(1, 0)
                .into_bytes(),
            &[
                "Joined",
                "Assigned",
                "CommittedOffsets",
                "CommitCompleted",
                "RevokeRequested",
                "Left",
            ],
        ),
        (
            "cooperative-two-members",
            Script::new(0b1000, true, false, 0)
                .counts(4, 2, 0)
                .find_coordinator(0, 0, 1)
                .join(0, 0, (0, 1), true, &[(0x33, 0)])
                .sync(0, 0, 0x0033)
                .offset_fetch(0, 4)
                .advance_secs(1)
                .answer(0, 27) // the heartbeat: REBALANCE_IN_PROGRESS
                .join(0, 0, (0, 1), false, &[])
                .sync(0, 0, 0x0011)
                .complete_revocation()
                .join(0, 0, (0, 1), false, &[])
                .sync(0, 0, 0x0011)
                .advance_secs(1)
                .into_bytes(),
            &["RevokeRequested", "generation: 3"],
        ),
        (
            "static-leader-holds-sync",
            Script::new(0b0011, false, true, 51)
                .counts(3, 0, 0)
                .find_coordinator(0, 0, 2)
                .join(0, 0, (1, 2), true, &[(0x01, 0)])
                .advance_ms(60)
                .sync(0, 0, 0x0003)
                .advance_secs(40)
                .progress()
                .fire()
                // In flight: the OffsetFetch (0), then the FindCoordinator (1).
                .find_coordinator(1, 0, 2)
                .into_bytes(),
            // 40 s without heartbeat answers: the member doubts its coordinator
            // (keeping its partitions, as the Java client) until max.poll.interval.ms
            // takes them; back, it finds the coordinator and rejoins.
            &["Joined", "ProgressTimeout", "application resumed"],
        ),
        (
            "errors-everywhere",
            Script::new(0b0010, false, false, 0)
                .counts(4, 0, 0)
                .find_coordinator(0, 15, 1) // COORDINATOR_NOT_AVAILABLE
                .fire()
                .find_coordinator(0, 0, 1)
                .join(0, 79, range, true, &[]) // MEMBER_ID_REQUIRED
                .join(0, 0, range, true, &[])
                .sync(0, 0, 0x0007)
                .lose(0)
                .advance_secs(1)
                .answer(0, 25) // the heartbeat: UNKNOWN_MEMBER_ID
                .join(0, 22, range, true, &[]) // ILLEGAL_GENERATION
                .join(0, 0, range, true, &[])
                .fail(0, 0)
                .fire()
                .find_coordinator(0, 0, 1)
                .fire()
                .join(0, 0, range, true, &[])
                .sync(0, 0, 0x0001)
                .late()
                .commit(0x81, &[3])
                .advance_secs(1)
                .answer(1, 30) // GROUP_AUTHORIZATION_FAILED
                .into_bytes(),
            &["KIP-394", "UnknownMember", "NotOwned", "Fatal"],
        ),
        (
            "progress-timeout-leaves",
            {
                let mut s = Script::new(0b0001, false, false, 0)
                    .counts(2, 0, 0)
                    .find_coordinator(0, 0, 1)
                    .join(0, 0, range, true, &[])
                    .sync(0, 0, 0x0003)
                    .offset_fetch(0, 2);
                for _ in 0..7 {
                    s = s.advance_secs(5).answer(0, 0);
                }
                s.progress().into_bytes()
            },
            &["ProgressTimeout", "LeaveGroup", "application resumed"],
        ),
        (
            "late-heartbeat-after-rebalance",
            Script::new(0b1000, false, false, 0)
                .counts(2, 0, 0)
                .find_coordinator(0, 0, 1)
                .join(0, 0, (0, 1), true, &[])
                .sync(0, 0, 0x0003)
                .offset_fetch(0, 2)
                .advance_secs(1)
                .counts(3, 0, 0) // the leader's assignment is stale: rebalance
                .join(1, 0, (0, 1), true, &[])
                .sync(1, 0, 0x0007)
                .answer(0, 25) // the old generation's heartbeat: UNKNOWN_MEMBER_ID
                .into_bytes(),
            &["metadata changed", "generation: 2"],
        ),
    ]
}
