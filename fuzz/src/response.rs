//! Every response ottla reads, decoded through ottla's own entry point for it and handed
//! to the state that consumes it, with the promises that state makes checked.
//!
//! [`apply`] is the one dispatcher: the `response` and `frame` targets call it, and it
//! panics on an API in [`SUPPORTED`] it does not know, so a new API cannot be added to
//! ottla without being fuzzed.

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, FetchResponse, InitProducerIdResponse, ListOffsetsResponse, MetadataResponse,
    ProduceResponse, SaslAuthenticateResponse, SaslHandshakeResponse,
};
use ottla_proto::fetch::fetcher::{Fetcher, FetcherConfig, FetcherEvent, OffsetReset};
use ottla_proto::fetch::request::IsolationLevel;
use ottla_proto::group::codec::{CONSUMER_GROUP_APIS, GROUP_APIS, decode_response as decode_group};
use ottla_proto::group::consumer_protocol::TopicPartition;
use ottla_proto::metadata::{
    ClusterMetadata, LeaderEpoch, NodeId, PartitionMetadata, TopicMetadata,
};
use ottla_proto::produce::accumulator::{Accumulator, ProducerConfig};
use ottla_proto::produce::encode::OutRecord;
use ottla_proto::sasl::{SaslClient, ScramHash, Step};
use ottla_proto::wire::{
    ApiVersionsOutcome, SUPPORTED, decode_response, handle_api_versions_response, negotiate,
};
use uuid::Uuid;

/// The topic every consumer in this module knows: "t", id 1, two partitions led by
/// node 1.
pub const TOPIC: &str = "t";
/// The id of [`TOPIC`], for Fetch v13+ and Metadata v10+.
pub const TOPIC_ID: Uuid = Uuid::from_u128(1);

/// Bit 0 of the flags byte: skip CRC checks so the fuzzer reaches the decoders behind
/// them.
pub const SKIP_CRCS: u8 = 1;
/// Bit 1: `read_committed`.
pub const READ_COMMITTED: u8 = 2;
/// Bit 2: `auto.offset.reset = earliest` (else latest).
pub const EARLIEST: u8 = 4;
/// The client nonce of the SCRAM exchange a SaslAuthenticate answer is fed to (RFC 7677's,
/// so that its server-first message is a seed that gets past the nonce check).
pub const SCRAM_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";

/// One fixed instant for a whole process, so that replays are identical.
pub fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// The API and version two selector bytes choose: any API ottla implements, at any
/// version it negotiates.
pub fn select(api: u8, version: u8) -> (ApiKey, i16) {
    let (key, min, max) = SUPPORTED[usize::from(api) % SUPPORTED.len()];
    (key, min + i16::from(version) % (max - min + 1))
}

/// The selector bytes that choose `api` at `version` (the inverse of [`select`]).
pub fn selector(api: ApiKey, version: i16) -> [u8; 2] {
    let i = SUPPORTED
        .iter()
        .position(|(a, _, _)| *a == api)
        .expect("an API ottla implements");
    let (_, min, _) = SUPPORTED[i];
    [
        u8::try_from(i).expect("few APIs"),
        u8::try_from(version - min).expect("a supported version"),
    ]
}

/// Decodes `body` as ottla decodes the response to `api` at `version`, and hands what
/// decodes to the state machine that reads it.
pub fn apply(api: ApiKey, version: i16, flags: u8, body: Bytes) {
    match api {
        ApiKey::ApiVersions => api_versions(version, body),
        ApiKey::Metadata => metadata(version, body),
        ApiKey::Fetch => fetch(version, flags, body),
        ApiKey::ListOffsets => list_offsets(version, flags, body),
        ApiKey::Produce => produce(version, body),
        ApiKey::InitProducerId => init_producer_id(version, body),
        ApiKey::SaslHandshake => {
            let _ = decode_response::<SaslHandshakeResponse>(api, version, body);
        }
        ApiKey::SaslAuthenticate => sasl_authenticate(version, flags, body),
        admin if is_admin(admin) => admin_response(admin, version, body),
        // The group member reads these through one codec; `group_ops` drives the
        // member with what it yields.
        group if GROUP_APIS.contains(&group) || CONSUMER_GROUP_APIS.contains(&group) => {
            let _ = decode_group(group, version, body);
        }
        ApiKey::AddPartitionsToTxn
        | ApiKey::AddOffsetsToTxn
        | ApiKey::TxnOffsetCommit
        | ApiKey::EndTxn => {
            let _ = decodes(api, version, body);
        }
        other => panic!("SUPPORTED lists {other:?}, which the fuzz targets do not decode"),
    }
}

/// Whether `body` decodes as ottla decodes the response to `api` at `version` (for the
/// seed writer).
pub fn decodes(api: ApiKey, version: i16, body: Bytes) -> bool {
    match api {
        ApiKey::ApiVersions => handle_api_versions_response(version, body).is_ok(),
        ApiKey::Metadata => decode_response::<MetadataResponse>(api, version, body).is_ok(),
        ApiKey::Fetch => decode_response::<FetchResponse>(api, version, body).is_ok(),
        ApiKey::ListOffsets => decode_response::<ListOffsetsResponse>(api, version, body).is_ok(),
        ApiKey::Produce => decode_response::<ProduceResponse>(api, version, body).is_ok(),
        ApiKey::InitProducerId => {
            decode_response::<InitProducerIdResponse>(api, version, body).is_ok()
        }
        ApiKey::SaslHandshake => {
            decode_response::<SaslHandshakeResponse>(api, version, body).is_ok()
        }
        ApiKey::SaslAuthenticate => {
            decode_response::<SaslAuthenticateResponse>(api, version, body).is_ok()
        }
        // The transaction manager's answers (ottla-proto's `TxnResponse` decodes them
        // with these types).
        ApiKey::AddPartitionsToTxn => decode_response::<
            kafka_protocol::messages::AddPartitionsToTxnResponse,
        >(api, version, body)
        .is_ok(),
        ApiKey::AddOffsetsToTxn => {
            decode_response::<kafka_protocol::messages::AddOffsetsToTxnResponse>(api, version, body)
                .is_ok()
        }
        ApiKey::TxnOffsetCommit => {
            decode_response::<kafka_protocol::messages::TxnOffsetCommitResponse>(api, version, body)
                .is_ok()
        }
        ApiKey::EndTxn => {
            decode_response::<kafka_protocol::messages::EndTxnResponse>(api, version, body).is_ok()
        }
        admin if is_admin(admin) => admin_decodes(admin, version, body),
        group => decode_group(group, version, body).is_ok(),
    }
}

/// The admin client's APIs (`ottla_proto::admin`).
fn is_admin(api: ApiKey) -> bool {
    matches!(
        api,
        ApiKey::CreateTopics
            | ApiKey::DeleteTopics
            | ApiKey::DescribeConfigs
            | ApiKey::CreatePartitions
            | ApiKey::ListGroups
            | ApiKey::DescribeGroups
            | ApiKey::OffsetDelete
    )
}

fn admin_decodes(api: ApiKey, version: i16, body: Bytes) -> bool {
    use kafka_protocol::messages as m;
    match api {
        ApiKey::CreateTopics => {
            decode_response::<m::CreateTopicsResponse>(api, version, body).is_ok()
        }
        ApiKey::DeleteTopics => {
            decode_response::<m::DeleteTopicsResponse>(api, version, body).is_ok()
        }
        ApiKey::DescribeConfigs => {
            decode_response::<m::DescribeConfigsResponse>(api, version, body).is_ok()
        }
        ApiKey::CreatePartitions => {
            decode_response::<m::CreatePartitionsResponse>(api, version, body).is_ok()
        }
        ApiKey::ListGroups => decode_response::<m::ListGroupsResponse>(api, version, body).is_ok(),
        ApiKey::DescribeGroups => {
            decode_response::<m::DescribeGroupsResponse>(api, version, body).is_ok()
        }
        ApiKey::OffsetDelete => {
            decode_response::<m::OffsetDeleteResponse>(api, version, body).is_ok()
        }
        _ => false,
    }
}

/// An admin answer, decoded as the admin client decodes it and read by the same pure
/// readers (`ottla_proto::admin`): per-item results, topic configs, and each described
/// member's subscription and assignment bytes.
fn admin_response(api: ApiKey, version: i16, body: Bytes) {
    use kafka_protocol::messages as m;
    use ottla_proto::admin;
    match api {
        ApiKey::CreateTopics => {
            if let Ok(r) = decode_response::<m::CreateTopicsResponse>(api, version, body) {
                assert_eq!(admin::create_topics_results(&r).len(), r.topics.len());
            }
        }
        ApiKey::DeleteTopics => {
            if let Ok(r) = decode_response::<m::DeleteTopicsResponse>(api, version, body) {
                assert!(admin::delete_topics_results(&r).len() <= r.responses.len());
            }
        }
        ApiKey::DescribeConfigs => {
            if let Ok(r) = decode_response::<m::DescribeConfigsResponse>(api, version, body) {
                let _ = admin::describe_topic_configs_results(&r);
            }
        }
        ApiKey::CreatePartitions => {
            if let Ok(r) = decode_response::<m::CreatePartitionsResponse>(api, version, body) {
                assert_eq!(admin::create_partitions_results(&r).len(), r.results.len());
            }
        }
        ApiKey::ListGroups => {
            let _ = decode_response::<m::ListGroupsResponse>(api, version, body);
        }
        ApiKey::DescribeGroups => {
            if let Ok(r) = decode_response::<m::DescribeGroupsResponse>(api, version, body) {
                for g in &r.groups {
                    let described = admin::group_description(g);
                    assert_eq!(described.members.len(), g.members.len());
                }
            }
        }
        ApiKey::OffsetDelete => {
            if let Ok(r) = decode_response::<m::OffsetDeleteResponse>(api, version, body) {
                let _ = admin::offset_delete_results(&r);
            }
        }
        _ => {}
    }
}

/// ApiVersions: the fallback on UNSUPPORTED_VERSION, then negotiation. A retry asks for
/// a lower version; a chosen version lies in both ranges.
fn api_versions(sent: i16, body: Bytes) {
    match handle_api_versions_response(sent, body) {
        Ok(ApiVersionsOutcome::Retry { version }) => {
            assert!(
                (0..sent).contains(&version),
                "retry at v{version} after sending v{sent}"
            );
        }
        Ok(ApiVersionsOutcome::Done(response)) => {
            let required: &[&[ApiKey]] = &[&[], &[ApiKey::Metadata, ApiKey::Fetch]];
            for required in required {
                let Ok(table) = negotiate(&response, required) else {
                    continue;
                };
                for row in table.rows() {
                    let Some(v) = row.chosen else { continue };
                    assert!(row.ours.min <= v && v <= row.ours.max, "{row:?}");
                    let broker = row.broker.expect("a chosen version has a broker range");
                    assert!(broker.min <= v && v <= broker.max, "{row:?}");
                    assert_eq!(table.version(row.api), Some(v));
                }
                for api in *required {
                    assert!(table.version(*api).is_some(), "{api:?} was required");
                }
            }
        }
        Err(_) => {}
    }
}

/// Metadata: the snapshot, merged over a previous one, then given to the fetcher and
/// the producer, which read leaders from it.
fn metadata(version: i16, body: Bytes) {
    let Ok(response) = decode_response::<MetadataResponse>(ApiKey::Metadata, version, body) else {
        return;
    };
    let previous = cluster(2);
    let fresh = ClusterMetadata::from_response(None, &response);
    let merged = ClusterMetadata::from_response(Some(&previous), &response);
    for md in [&fresh, &merged] {
        for (node, broker) in &md.brokers {
            assert_eq!(*node, broker.node);
            let _ = broker.address();
        }
        for topic in md.topics.values() {
            assert!(
                topic.partitions.is_sorted_by_key(|p| p.partition),
                "partitions are sorted"
            );
            for p in &topic.partitions {
                let _ = md.leader(&topic.name, p.partition);
            }
            let _ = md.topic_by_id(topic.id);
        }
    }
    // "A topic that comes back with an error keeps its previous partitions."
    let errored = response.topics.iter().any(|t| {
        t.name.as_ref().is_some_and(|n| n.0.as_str() == TOPIC)
            && t.error_code != 0
            && t.partitions.is_empty()
    });
    let replaced = response.topics.iter().any(|t| {
        t.name.as_ref().is_some_and(|n| n.0.as_str() == TOPIC)
            && !(t.error_code != 0 && t.partitions.is_empty())
    });
    if errored && !replaced {
        assert_eq!(
            merged.topics[TOPIC].partitions,
            previous.topics[TOPIC].partitions
        );
    }

    let now = base();
    let mut fetcher = Fetcher::new(FetcherConfig::default());
    fetcher.assign(&partitions(), false);
    fetcher.update_metadata(&merged);
    let _ = fetcher.claim_fetches(now);
    let _ = fetcher.resets_due(now);
    let mut producer = Accumulator::new(ProducerConfig::default());
    producer.update_metadata(&merged);
    for p in 0..3 {
        let _ = producer.append(now, TOPIC, Some(p), record(p));
        let _ = producer.append(now, TOPIC, None, record(p));
    }
}

/// Fetch: handed to a fetcher that asked for both partitions from offset 0, then
/// drained. Records go forward and no position goes below where fetching started.
pub fn fetch(version: i16, flags: u8, body: Bytes) {
    let Ok(response) = decode_response::<FetchResponse>(ApiKey::Fetch, version, body) else {
        return;
    };
    let now = base();
    let mut config = FetcherConfig::default();
    config.batch.check_crcs = flags & SKIP_CRCS == 0;
    config.batch.max_decompressed = 1 << 20;
    if flags & READ_COMMITTED != 0 {
        config.params.isolation = IsolationLevel::ReadCommitted;
    }
    let mut fetcher = Fetcher::new(config);
    let tps = partitions();
    fetcher.assign(&tps, true);
    for tp in &tps {
        fetcher.set_committed(tp, 0, -1);
    }
    fetcher.update_metadata(&cluster(2));
    fetcher.claim_fetches(now);
    let Some((_, token)) = fetcher.build_fetch(now, NodeId(1), version) else {
        return;
    };
    fetcher.handle_fetch(now, token, response);
    let mut last = [0i64; 2];
    while let Some(item) = fetcher.next_record() {
        if let Ok(r) = item {
            let p = usize::try_from(r.partition()).unwrap_or(0) % 2;
            assert!(r.offset() >= last[p], "records go forward");
            last[p] = r.offset();
            // Every field reads back through the accessors without a panic, and the
            // shared slices agree with the borrowed ones.
            assert_eq!(r.key_bytes().as_deref(), r.key());
            assert_eq!(r.value_bytes().as_deref(), r.value());
            let owned = r.headers_owned();
            assert_eq!(owned.len(), r.headers().count());
            for ((k, v), h) in owned.iter().zip(r.headers()) {
                assert_eq!((&k[..], v.as_deref()), (h.key(), h.value()));
            }
        }
    }
    for tp in &tps {
        if let Some((offset, _)) = fetcher.position(tp) {
            assert!(offset >= 0, "a position never goes below the start");
        }
    }
    while fetcher.poll_event().is_some() {}
}

/// ListOffsets: both partitions need a reset; the answer sets their positions. A reset
/// never sets a negative position; what was not answered is asked again later.
fn list_offsets(version: i16, flags: u8, body: Bytes) {
    let Ok(response) = decode_response::<ListOffsetsResponse>(ApiKey::ListOffsets, version, body)
    else {
        return;
    };
    let mut config = FetcherConfig {
        reset: if flags & EARLIEST != 0 {
            OffsetReset::Earliest
        } else {
            OffsetReset::Latest
        },
        ..FetcherConfig::default()
    };
    if flags & READ_COMMITTED != 0 {
        config.params.isolation = IsolationLevel::ReadCommitted;
    }
    let mut fetcher = Fetcher::new(config);
    let tps = partitions();
    fetcher.assign(&tps, false);
    fetcher.update_metadata(&cluster(2));
    let now = base();
    for at in [now, now + Duration::from_secs(1)] {
        for node in fetcher.resets_due(at) {
            if fetcher.build_list_offsets(at, node, version).is_some() {
                fetcher.handle_list_offsets(at, node, response.clone());
            }
        }
        while let Some(event) = fetcher.poll_event() {
            if let FetcherEvent::OffsetReset { offset, .. } = event {
                assert!(offset >= 0, "reset to {offset}");
            }
        }
        for tp in &tps {
            if let Some((offset, _)) = fetcher.position(tp) {
                assert!(offset >= 0, "{tp} at {offset}");
            }
        }
    }
}

/// Produce: three records in two partitions, sent, answered. Every record is delivered
/// at most once, and after a retry the accumulator still builds requests.
fn produce(version: i16, body: Bytes) {
    let Ok(response) = decode_response::<ProduceResponse>(ApiKey::Produce, version, body) else {
        return;
    };
    let now = base();
    let mut acc = Accumulator::new(ProducerConfig {
        linger: Duration::ZERO,
        ..ProducerConfig::default()
    });
    acc.update_metadata(&cluster(2));
    if acc.claim_producer_id(now) {
        acc.set_producer_id(now, Ok((42, 3)));
    }
    let mut ids = HashSet::new();
    for i in 0..3 {
        if let Ok((id, _)) = acc.append(now, TOPIC, Some(i % 2), record(i)) {
            ids.insert(id);
        }
    }
    acc.flush();
    let mut delivered = HashSet::new();
    let later = now + Duration::from_secs(1);
    for at in [now, later] {
        for node in acc.claim_ready(at) {
            match acc.build_produce(at, node, version) {
                Some((_, token)) => acc.handle_produce(at, token, response.clone()),
                None => acc.release_claim(node),
            }
        }
        while let Some(d) = acc.poll_delivery() {
            assert!(ids.contains(&d.id), "delivery of a record never appended");
            assert!(delivered.insert(d.id), "record {:?} delivered twice", d.id);
        }
        if acc.claim_producer_id(at) {
            acc.set_producer_id(at, Ok((43, 0)));
        }
    }
}

/// InitProducerId: the id and epoch are what the next batches carry.
fn init_producer_id(version: i16, body: Bytes) {
    let Ok(response) =
        decode_response::<InitProducerIdResponse>(ApiKey::InitProducerId, version, body)
    else {
        return;
    };
    if response.error_code != 0 {
        return;
    }
    let now = base();
    let mut acc = Accumulator::new(ProducerConfig {
        linger: Duration::ZERO,
        ..ProducerConfig::default()
    });
    acc.update_metadata(&cluster(2));
    assert!(acc.claim_producer_id(now));
    acc.set_producer_id(now, Ok((response.producer_id.0, response.producer_epoch)));
    let _ = acc.append(now, TOPIC, Some(0), record(0));
    acc.flush();
    for node in acc.claim_ready(now) {
        if acc.build_produce(now, node, 9).is_none() {
            acc.release_claim(node);
        }
    }
}

/// SaslAuthenticate: the server's bytes go to the mechanism the flags choose (bits 3-4:
/// PLAIN, OAUTHBEARER, SCRAM-SHA-256, SCRAM-SHA-512), once as its first challenge and
/// again as the next one. Whatever the bytes, the mechanism answers with a message or an
/// error; it never says done to a SCRAM server that did not prove the password.
fn sasl_authenticate(version: i16, flags: u8, body: Bytes) {
    let Ok(response) =
        decode_response::<SaslAuthenticateResponse>(ApiKey::SaslAuthenticate, version, body)
    else {
        return;
    };
    let server = response.auth_bytes;
    let mut client = match (flags >> 3) & 3 {
        0 => SaslClient::plain("user", "pencil"),
        1 => match SaslClient::oauth_bearer("eyJhbGciOiJub25lIn0.e30.", &[]) {
            Ok(c) => c,
            Err(e) => panic!("a valid token is refused: {e}"),
        },
        2 => SaslClient::scram(ScramHash::Sha256, "user", "pencil", SCRAM_NONCE),
        _ => SaslClient::scram(ScramHash::Sha512, "user", "pencil", SCRAM_NONCE),
    };
    let scram = matches!(client, SaslClient::Scram(_));
    let _ = client.initial_response();
    let first = client.handle_challenge(&server);
    if scram {
        assert!(
            !matches!(first, Ok(Step::Done)),
            "SCRAM is done after the server-first message"
        );
    }
    if let Ok(Step::Send(_)) = first {
        let second = client.handle_challenge(&server);
        // A server-final equal to the server-first cannot carry the right signature.
        assert!(
            !(scram && matches!(second, Ok(Step::Done))),
            "SCRAM accepted a server signature it did not compute"
        );
    }
}

/// [`TOPIC`] with `n` partitions led by node 1 at epoch 0.
pub fn cluster(n: i32) -> ClusterMetadata {
    let mut metadata = ClusterMetadata::default();
    metadata.topics.insert(
        TOPIC.into(),
        TopicMetadata {
            name: TOPIC.into(),
            id: TOPIC_ID,
            internal: false,
            partitions: (0..n)
                .map(|p| PartitionMetadata {
                    partition: p,
                    leader: Some(NodeId(1)),
                    leader_epoch: LeaderEpoch(0),
                    replicas: vec![],
                    isr: vec![],
                    error: 0,
                })
                .collect(),
            error: 0,
        },
    );
    metadata
}

fn partitions() -> [TopicPartition; 2] {
    [TopicPartition::new(TOPIC, 0), TopicPartition::new(TOPIC, 1)]
}

fn record(i: i32) -> OutRecord {
    OutRecord {
        timestamp: 1_700_000_000_000,
        key: (i % 2 == 0).then(|| Bytes::from(format!("k{i}"))),
        value: Some(Bytes::from(format!("v{i}"))),
        headers: vec![("h".into(), None)],
    }
}
