//! Smoke tests of the test peers themselves, checked with independent clients:
//! rust-rdkafka (librdkafka) for metadata, and a tiny raw-TCP client built on
//! kafka-protocol's codec for what librdkafka would paper over (advertised versions,
//! injected errors, dropped connections). Also checks the mock's group-API quirk from
//! `PEERS.md`, which [`MockCluster::cap_group_apis`] works around.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, GroupId, HeartbeatRequest, HeartbeatResponse,
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, RequestHeader,
    ResponseHeader, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use protocol_tests::mock::MockCluster;
use protocol_tests::peer::Peer;
use protocol_tests::tansu::Tansu;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::metadata::Metadata;

const TIMEOUT: Duration = Duration::from_secs(10);

fn metadata(bootstrap: &str, topic: Option<&str>) -> anyhow::Result<Metadata> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "fixtures-check")
        .create()
        .context("creating an rdkafka consumer")?;
    consumer
        .fetch_metadata(topic, TIMEOUT)
        .context("fetch_metadata")
}

/// `broker -> host:port` from the mock's bootstrap list, which is in broker-id order.
fn broker_addr(mock: &MockCluster, broker: i32) -> String {
    mock.bootstrap()
        .split(',')
        .nth(broker as usize - 1)
        .expect("broker in bootstrap")
        .to_string()
}

/// One request on a fresh connection; returns the response body (after the header).
/// `Ok(None)` when the broker closed the connection instead of answering.
fn call_raw<Req: Encodable>(
    addr: &str,
    api: ApiKey,
    version: i16,
    request: &Req,
) -> anyhow::Result<Option<Bytes>> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    send_request(&mut stream, api, version, 7, request)?;
    read_response(&mut stream, api, version, 7)
}

/// Writes one request frame with `correlation_id` on `stream`.
fn send_request<Req: Encodable>(
    stream: &mut TcpStream,
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    request: &Req,
) -> anyhow::Result<()> {
    let header = RequestHeader::default()
        .with_request_api_key(api as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("fixtures")));
    let mut body = BytesMut::new();
    header.encode(&mut body, api.request_header_version(version))?;
    request.encode(&mut body, version)?;
    let mut frame = BytesMut::with_capacity(body.len() + 4);
    frame.put_i32(i32::try_from(body.len())?);
    frame.put_slice(&body);
    stream.write_all(&frame)?;
    Ok(())
}

/// Reads the next response frame on `stream`, which must carry `correlation_id`;
/// returns its body. `Ok(None)` when the broker closed the connection instead.
fn read_response(
    stream: &mut TcpStream,
    api: ApiKey,
    version: i16,
    correlation_id: i32,
) -> anyhow::Result<Option<Bytes>> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
            ) =>
        {
            return Ok(None);
        }
        Err(e) => {
            return Err(
                anyhow::Error::new(e).context(format!("{api:?} v{version}: reading the response"))
            );
        }
    }
    let mut buf = vec![0u8; usize::try_from(i32::from_be_bytes(len))?];
    stream.read_exact(&mut buf)?;
    let mut buf = Bytes::from(buf);
    let header = ResponseHeader::decode(&mut buf, api.response_header_version(version))?;
    anyhow::ensure!(
        header.correlation_id == correlation_id,
        "correlation id {}, expected {correlation_id}",
        header.correlation_id
    );
    Ok(Some(buf))
}

/// [`call_raw`], decoded; the whole body must be consumed.
fn call<Req: Encodable, Resp: Decodable>(
    addr: &str,
    api: ApiKey,
    version: i16,
    request: &Req,
) -> anyhow::Result<Option<Resp>> {
    let Some(mut buf) = call_raw(addr, api, version, request)? else {
        return Ok(None);
    };
    let response =
        Resp::decode(&mut buf, version).with_context(|| format!("decoding {api:?} v{version}"))?;
    anyhow::ensure!(
        !buf.has_remaining(),
        "{} bytes left after the {api:?} v{version} response",
        buf.remaining()
    );
    Ok(Some(response))
}

/// The advertised `(min, max)` of `api`, from an ApiVersions v0 exchange.
fn advertised(addr: &str, api: ApiKey) -> anyhow::Result<Option<(i16, i16)>> {
    let response: ApiVersionsResponse =
        call(addr, ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())?
            .context("ApiVersions dropped")?;
    anyhow::ensure!(
        response.error_code == 0,
        "ApiVersions error {}",
        response.error_code
    );
    Ok(response
        .api_keys
        .iter()
        .find(|k| k.api_key == api as i16)
        .map(|k| (k.min_version, k.max_version)))
}

fn api_versions_error(addr: &str) -> anyhow::Result<Option<i16>> {
    let response: Option<ApiVersionsResponse> =
        call(addr, ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())?;
    Ok(response.map(|r| r.error_code))
}

#[test]
fn mock_three_brokers_and_a_six_partition_topic() -> anyhow::Result<()> {
    let mock = MockCluster::new(3)?;
    mock.create_topic("six", 6, 1)?;
    assert_eq!(mock.broker_ids(), vec![1, 2, 3]);
    let md = metadata(&mock.bootstrap(), Some("six"))?;
    let mut brokers: Vec<(i32, String)> = md
        .brokers()
        .iter()
        .map(|b| (b.id(), format!("{}:{}", b.host(), b.port())))
        .collect();
    brokers.sort();
    // The bootstrap list is in broker-id order (the raw-TCP checks rely on it).
    let expected: Vec<(i32, String)> = mock
        .broker_ids()
        .into_iter()
        .map(|b| (b, broker_addr(&mock, b)))
        .collect();
    assert_eq!(brokers, expected);
    let topic = md
        .topics()
        .iter()
        .find(|t| t.name() == "six")
        .context("topic six missing")?;
    assert!(topic.error().is_none(), "{:?}", topic.error());
    assert_eq!(topic.partitions().len(), 6);
    assert!(
        topic
            .partitions()
            .iter()
            .all(|p| (1..=3).contains(&p.leader()))
    );
    // A second create of the same name is an error, and a readable one.
    let err = mock
        .create_topic("six", 6, 1)
        .expect_err("duplicate topic")
        .to_string();
    assert!(err.contains("TOPIC_ALREADY_EXISTS"), "{err}");
    Ok(())
}

#[test]
fn mock_tracks_requests() -> anyhow::Result<()> {
    let mock = MockCluster::new(3)?;
    mock.create_topic("tracked", 2, 1)?;
    mock.start_request_tracking();
    metadata(&mock.bootstrap(), Some("tracked"))?;
    let requests = mock.requests();
    assert!(
        requests.iter().any(|r| r.api_key == 3),
        "no Metadata request in {requests:?}"
    );
    assert!(
        requests
            .iter()
            .all(|r| (1..=3).contains(&r.broker) && r.timestamp_us > 0),
        "{requests:?}"
    );
    mock.clear_requests();
    assert!(mock.requests().is_empty());
    mock.stop_request_tracking();
    metadata(&mock.bootstrap(), None)?;
    assert!(mock.requests().is_empty());
    Ok(())
}

#[test]
fn mock_broker_down_and_up() -> anyhow::Result<()> {
    let mock = MockCluster::new(3)?;
    let addr = broker_addr(&mock, 2);
    assert!(TcpStream::connect(&addr).is_ok());
    mock.broker_down(2)?;
    assert!(
        TcpStream::connect(&addr).is_err(),
        "broker 2 still accepts connections while down"
    );
    // The others still answer; their metadata leaves broker 2 out while it is down.
    assert_eq!(metadata(&broker_addr(&mock, 1), None)?.brokers().len(), 2);
    mock.broker_up(2)?;
    assert_eq!(
        api_versions_error(&addr)?,
        Some(0),
        "broker 2 up again on the same port"
    );
    assert_eq!(metadata(&broker_addr(&mock, 1), None)?.brokers().len(), 3);
    let err = mock.broker_down(9).expect_err("no broker 9").to_string();
    assert!(err.contains("broker 9"), "{err}");
    Ok(())
}

#[test]
fn mock_error_stacks_rtt_and_leaders() -> anyhow::Result<()> {
    let mock = MockCluster::new(3)?;
    let api_versions = ApiKey::ApiVersions as i16;
    // Cluster-wide: the next two ApiVersions get 7 then 8, on any broker, then none.
    mock.push_request_errors(api_versions, &[7, 8]);
    assert_eq!(api_versions_error(&broker_addr(&mock, 1))?, Some(7));
    assert_eq!(api_versions_error(&broker_addr(&mock, 3))?, Some(8));
    assert_eq!(api_versions_error(&broker_addr(&mock, 1))?, Some(0));
    mock.push_request_errors(api_versions, &[7]);
    mock.clear_request_errors(api_versions);
    assert_eq!(api_versions_error(&broker_addr(&mock, 1))?, Some(0));
    // A transport error closes the connection.
    mock.push_request_errors(api_versions, &[-195]);
    assert_eq!(api_versions_error(&broker_addr(&mock, 1))?, None);

    // Per broker, with delays, in order.
    mock.push_broker_request_errors(
        2,
        api_versions,
        &[(7, Duration::from_millis(300)), (8, Duration::ZERO)],
    )?;
    assert_eq!(
        api_versions_error(&broker_addr(&mock, 1))?,
        Some(0),
        "broker 1 is not affected"
    );
    let started = Instant::now();
    assert_eq!(api_versions_error(&broker_addr(&mock, 2))?, Some(7));
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(api_versions_error(&broker_addr(&mock, 2))?, Some(8));
    assert!(
        mock.push_broker_request_errors(9, api_versions, &[(7, Duration::ZERO)])
            .is_err()
    );

    mock.set_rtt(3, Duration::from_millis(300))?;
    let started = Instant::now();
    assert_eq!(api_versions_error(&broker_addr(&mock, 3))?, Some(0));
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "rtt not applied: {:?}",
        started.elapsed()
    );

    mock.create_topic("moved", 1, 1)?;
    let before = metadata(&mock.bootstrap(), Some("moved"))?.topics()[0].partitions()[0].leader();
    let target = mock
        .broker_ids()
        .into_iter()
        .find(|b| *b != before)
        .context("another broker")?;
    mock.partition_set_leader("moved", 0, target)?;
    let after = metadata(&mock.bootstrap(), Some("moved"))?.topics()[0].partitions()[0].leader();
    assert_eq!(after, target);
    // An unknown partition of a known topic is an error (an unknown topic is auto-created).
    assert!(mock.partition_set_leader("moved", 5, 1).is_err());

    mock.set_group_coordinator("g", 2)?;
    mock.set_group_initial_rebalance_delay(Duration::from_millis(0));
    Ok(())
}

/// What a broker did with one request.
#[derive(Debug, PartialEq)]
enum Answer {
    /// A response kafka-protocol decodes.
    Decoded,
    /// A response kafka-protocol rejects (the reason, and the body's first bytes).
    Undecodable(String),
    /// The connection was closed instead.
    Dropped,
}

fn answer<Resp: Decodable>(body: Option<Bytes>, version: i16) -> Answer {
    match body {
        None => Answer::Dropped,
        Some(body) => {
            let head: Vec<u8> = body.iter().take(12).copied().collect();
            let mut buf = body;
            match Resp::decode(&mut buf, version) {
                Ok(_) if !buf.has_remaining() => Answer::Decoded,
                Ok(_) => Answer::Undecodable(format!(
                    "{} bytes left over; body {head:02x?}",
                    buf.remaining()
                )),
                Err(e) => Answer::Undecodable(format!("{e}; body {head:02x?}")),
            }
        }
    }
}

/// One raw request of a classic group API at `version`, for a group of its own (a
/// JoinGroup to a group with an earlier member waits for that member's rebalance).
fn group_api_answer(addr: &str, api: ApiKey, version: i16) -> anyhow::Result<Answer> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let group = GroupId(StrBytes::from_string(format!(
        "quirk-check-{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )));
    let member = StrBytes::from_static_str("member-1");
    Ok(match api {
        ApiKey::JoinGroup => {
            let request = JoinGroupRequest::default()
                .with_group_id(group)
                .with_session_timeout_ms(6000)
                .with_rebalance_timeout_ms(6000)
                .with_protocol_type(StrBytes::from_static_str("consumer"))
                .with_protocols(vec![
                    JoinGroupRequestProtocol::default()
                        .with_name(StrBytes::from_static_str("range"))
                        .with_metadata(Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0, 0])),
                ]);
            answer::<JoinGroupResponse>(call_raw(addr, api, version, &request)?, version)
        }
        ApiKey::SyncGroup => {
            let request = SyncGroupRequest::default()
                .with_group_id(group)
                .with_generation_id(1)
                .with_member_id(member);
            answer::<SyncGroupResponse>(call_raw(addr, api, version, &request)?, version)
        }
        ApiKey::Heartbeat => {
            let request = HeartbeatRequest::default()
                .with_group_id(group)
                .with_generation_id(1)
                .with_member_id(member);
            answer::<HeartbeatResponse>(call_raw(addr, api, version, &request)?, version)
        }
        ApiKey::LeaveGroup => {
            let mut request = LeaveGroupRequest::default().with_group_id(group);
            if version >= 3 {
                request.members = vec![MemberIdentity::default().with_member_id(member)];
            } else {
                request.member_id = member;
            }
            answer::<LeaveGroupResponse>(call_raw(addr, api, version, &request)?, version)
        }
        other => bail!("not a group API: {other:?}"),
    })
}

/// A JoinGroup for the range assignor, `member_id` empty for a new member.
fn range_join(group: &str, member_id: &str) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
        .with_session_timeout_ms(2000)
        .with_rebalance_timeout_ms(2000)
        .with_member_id(StrBytes::from_string(member_id.to_string()))
        .with_protocol_type(StrBytes::from_static_str("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0, 0])),
        ])
}

/// The test-only patch of the mock (vendor/rdkafka-sys/OTTLA-PATCH.md): a member
/// whose JoinGroup the coordinator still holds sends another on a second connection,
/// as a client does when it gave up waiting or the coordinator moved. Kafka replaces
/// the member's awaiting request; the published mock asserted `!member->resp` in
/// `rd_kafka_mock_cgrp_classic_member_add` and aborted the whole process (issue 34's
/// classic chaos runs). Patched, the second JoinGroup is answered, the first is dropped
/// without an answer, and its connection is served again. Also checks that member ids
/// are unique, not a reusable address.
#[test]
fn mock_member_rejoining_on_a_second_connection_replaces_its_held_join() -> anyhow::Result<()> {
    let mock = MockCluster::new(1)?;
    mock.set_group_initial_rebalance_delay(Duration::ZERO);
    let addr = broker_addr(&mock, 1);
    let version = 5;
    let first: JoinGroupResponse = call(
        &addr,
        ApiKey::JoinGroup,
        version,
        &range_join("held-join", ""),
    )?
    .context("first JoinGroup dropped")?;
    assert_eq!(first.error_code, 0, "first JoinGroup: {first:?}");
    let member = first.member_id.to_string();
    assert!(
        member.contains('-'),
        "a member id of the patched mock carries a sequence number: {member}"
    );

    // The rejoin on connection A is held (a rebalance of a group that was syncing
    // waits up to the session timeout less a second).
    let mut held = TcpStream::connect(&addr)?;
    held.set_read_timeout(Some(TIMEOUT))?;
    send_request(
        &mut held,
        ApiKey::JoinGroup,
        version,
        1,
        &range_join("held-join", &member),
    )?;
    std::thread::sleep(Duration::from_millis(300));

    // The same member again, on connection B: unpatched, the mock aborts here.
    let second: JoinGroupResponse = call(
        &addr,
        ApiKey::JoinGroup,
        version,
        &range_join("held-join", &member),
    )?
    .context("second JoinGroup dropped")?;
    assert_eq!(second.error_code, 0, "second JoinGroup: {second:?}");
    assert_eq!(second.member_id.to_string(), member);
    assert!(
        second.generation_id > first.generation_id,
        "a new generation: {} after {}",
        second.generation_id,
        first.generation_id
    );

    // Connection A is served again and its JoinGroup was dropped: the next frame on
    // it answers a later request.
    send_request(
        &mut held,
        ApiKey::ApiVersions,
        0,
        2,
        &ApiVersionsRequest::default(),
    )?;
    let body = read_response(&mut held, ApiKey::ApiVersions, 0, 2)?
        .context("connection A closed instead of answering")?;
    let versions = ApiVersionsResponse::decode(&mut body.clone(), 0)?;
    assert_eq!(versions.error_code, 0);

    // A second new member gets an id of its own.
    let other: JoinGroupResponse = call(
        &addr,
        ApiKey::JoinGroup,
        version,
        &range_join("held-join-2", ""),
    )?
    .context("third JoinGroup dropped")?;
    assert_ne!(other.member_id.to_string(), member);
    Ok(())
}

/// The test-only patch of the mock (vendor/rdkafka-sys/OTTLA-PATCH.md): the published
/// mock completes a sync as soon as the leader's SyncGroup brings every assignment, and
/// answers a follower's SyncGroup that arrives after it INVALID_REQUEST, so a client
/// whose followers are slower than its leader (aiokafka) rejoins round after round.
/// Kafka, in Stable, answers it with the member's assignment; so does the patched mock.
#[test]
fn mock_follower_syncing_after_the_leader_gets_its_assignment() -> anyhow::Result<()> {
    let mock = MockCluster::new(1)?;
    mock.set_group_initial_rebalance_delay(Duration::from_millis(500));
    let addr = broker_addr(&mock, 1);
    let joins: Vec<std::thread::JoinHandle<anyhow::Result<Option<JoinGroupResponse>>>> = (0..2)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                call(&addr, ApiKey::JoinGroup, 5, &range_join("late-sync", ""))
            })
        })
        .collect();
    let mut joined = Vec::new();
    for join in joins {
        let response = join
            .join()
            .map_err(|_| anyhow::anyhow!("join thread panicked"))??
            .context("JoinGroup dropped")?;
        assert_eq!(response.error_code, 0, "{response:?}");
        joined.push(response);
    }
    let (leader, follower) = match joined.iter().position(|r| r.leader == r.member_id) {
        Some(0) => (&joined[0], &joined[1]),
        Some(1) => (&joined[1], &joined[0]),
        _ => bail!("no leader among {joined:?}"),
    };
    assert_eq!(leader.generation_id, follower.generation_id);
    let assignment_of = |member: &StrBytes| Bytes::from(format!("assignment of {member}"));
    let sync = |member: &StrBytes, assignments: Vec<SyncGroupRequestAssignment>| {
        SyncGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("late-sync")))
            .with_generation_id(leader.generation_id)
            .with_member_id(member.clone())
            .with_assignments(assignments)
    };
    let assignments = [&leader.member_id, &follower.member_id]
        .into_iter()
        .map(|m| {
            SyncGroupRequestAssignment::default()
                .with_member_id(m.clone())
                .with_assignment(assignment_of(m))
        })
        .collect();
    let synced: SyncGroupResponse = call(
        &addr,
        ApiKey::SyncGroup,
        3,
        &sync(&leader.member_id, assignments),
    )?
    .context("leader's SyncGroup dropped")?;
    assert_eq!(synced.error_code, 0, "leader: {synced:?}");
    assert_eq!(synced.assignment, assignment_of(&leader.member_id));

    // The follower's SyncGroup, after the sync completed: unpatched, INVALID_REQUEST.
    let late: SyncGroupResponse = call(
        &addr,
        ApiKey::SyncGroup,
        3,
        &sync(&follower.member_id, Vec::new()),
    )?
    .context("follower's SyncGroup dropped")?;
    assert_eq!(late.error_code, 0, "follower: {late:?}");
    assert_eq!(late.assignment, assignment_of(&follower.member_id));
    Ok(())
}

/// PEERS.md: the mock advertises flexible versions of the classic group APIs that it
/// cannot parse. Records what it advertises and what it does with each version, and
/// checks that the fixture's cap leaves only versions it answers.
#[test]
fn mock_group_api_quirk_and_cap() -> anyhow::Result<()> {
    let mock = MockCluster::new(1)?;
    mock.set_group_initial_rebalance_delay(Duration::ZERO);
    let addr = broker_addr(&mock, 1);
    let apis = [
        (ApiKey::JoinGroup, 6),
        (ApiKey::SyncGroup, 4),
        (ApiKey::Heartbeat, 4),
        (ApiKey::LeaveGroup, 4),
    ];
    let mut dropped = Vec::new();
    for (api, first_flexible) in apis {
        let (min, max) =
            advertised(&addr, api)?.with_context(|| format!("{api:?} not advertised"))?;
        println!("{api:?}: advertised v{min}..=v{max}, first flexible v{first_flexible}");
        // kafka-protocol encodes up to Heartbeat v4; the mock advertises v5 too.
        for v in min..=max.min(api.valid_versions().max) {
            let started = Instant::now();
            let a = group_api_answer(&addr, api, v)?;
            println!("  v{v}: {a:?} in {:?}", started.elapsed());
            if a == Answer::Dropped {
                dropped.push((api, v));
            }
        }
    }
    println!("dropped: {dropped:?}");
    assert!(
        [(ApiKey::JoinGroup, 6), (ApiKey::SyncGroup, 4)]
            .iter()
            .all(|d| dropped.contains(d)),
        "the mock now answers flexible JoinGroup/SyncGroup; the cap may be lifted: dropped only {dropped:?}"
    );
    // LeaveGroup v3+ (batched members) is read as v0-v2 and answered without the
    // members array, so it is capped at v2.
    assert!(matches!(
        group_api_answer(&addr, ApiKey::LeaveGroup, 3)?,
        Answer::Undecodable(_)
    ));

    mock.cap_group_apis()?;
    for (api, max) in [
        (ApiKey::JoinGroup, 5),
        (ApiKey::SyncGroup, 3),
        (ApiKey::Heartbeat, 3),
        (ApiKey::LeaveGroup, 2),
    ] {
        let (min, advertised_max) =
            advertised(&addr, api)?.with_context(|| format!("{api:?} not advertised"))?;
        assert_eq!(advertised_max, max, "{api:?}");
        for v in min..=advertised_max {
            match group_api_answer(&addr, api, v)? {
                Answer::Decoded => {}
                // Its SyncGroup error responses carry a null assignment (length -1)
                // where Kafka has empty bytes: a client must cope (PEERS.md).
                Answer::Undecodable(e)
                    if api == ApiKey::SyncGroup && e.contains("negative (-1)") => {}
                other => panic!("{api:?} v{v} after the cap: {other:?}"),
            }
        }
    }
    // Peer::mock applies the cap.
    let peer = Peer::mock(1)?;
    assert_eq!(
        advertised(&peer.bootstrap(), ApiKey::JoinGroup)?,
        Some((0, 5))
    );
    Ok(())
}

#[test]
fn tansu_starts_and_creates_a_topic() -> anyhow::Result<()> {
    let tansu = Tansu::start()?;
    tansu.create_topic("six", 6)?;
    let md = metadata(&tansu.bootstrap(), Some("six"))?;
    let brokers: Vec<(i32, String, i32)> = md
        .brokers()
        .iter()
        .map(|b| (b.id(), b.host().to_string(), b.port()))
        .collect();
    assert_eq!(
        brokers,
        vec![(
            Tansu::NODE_ID,
            "127.0.0.1".to_string(),
            i32::from(tansu.port())
        )]
    );
    let topic = md
        .topics()
        .iter()
        .find(|t| t.name() == "six")
        .context("topic six missing")?;
    assert!(topic.error().is_none(), "{:?}", topic.error());
    assert_eq!(topic.partitions().len(), 6);
    assert!(
        topic
            .partitions()
            .iter()
            .all(|p| p.leader() == Tansu::NODE_ID)
    );
    let err = tansu.create_topic("six", 6).expect_err("duplicate topic");
    println!("duplicate create: {err:#}");

    // Two at once get different ports; each stops on drop.
    let other = Peer::tansu()?;
    assert_ne!(other.bootstrap(), tansu.bootstrap());
    let addr = tansu.bootstrap();
    drop(tansu);
    let deadline = Instant::now() + TIMEOUT;
    while TcpStream::connect(&addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "tansu still listening after drop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[test]
fn mock_cluster_binary() -> anyhow::Result<()> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mock-cluster"))
        .args([
            "--brokers",
            "2",
            "--topic",
            "a:4",
            "--topic",
            "b:1",
            "--cap-group-apis",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let result = (|| -> anyhow::Result<()> {
        let mut stdin = child.stdin.take().context("stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        let mut next = |line: &mut String| -> anyhow::Result<String> {
            line.clear();
            stdout.read_line(line)?;
            Ok(line.trim_end().to_string())
        };
        let bootstrap = next(&mut line)?;
        assert_eq!(bootstrap.split(',').count(), 2, "{bootstrap}");
        let md = metadata(&bootstrap, None)?;
        let mut topics: Vec<(String, usize)> = md
            .topics()
            .iter()
            .map(|t| (t.name().to_string(), t.partitions().len()))
            .collect();
        topics.sort();
        assert_eq!(topics, vec![("a".into(), 4), ("b".into(), 1)]);
        let first = bootstrap.split(',').next().context("first broker")?;
        assert_eq!(advertised(first, ApiKey::JoinGroup)?, Some((0, 5)));

        for (command, answer) in [
            ("topic c 3", "ok"),
            ("topic c 3", "error: create topic c"),
            ("coordinator g 2", "ok"),
            ("rtt 1 0", "ok"),
            ("leader a 0 2", "ok"),
            ("errors 18 7,8", "ok"),
            ("clear-errors 18", "ok"),
            ("broker-errors 1 18 7:10,8", "ok"),
            ("clear-errors 18", "ok"),
            ("apiversion 11 0 4", "ok"),
            ("down 2", "ok"),
            ("up 2", "ok"),
            ("down", "error: down takes 1 argument"),
            ("frobnicate", "error: unknown command"),
            ("track on", "ok"),
        ] {
            writeln!(stdin, "{command}")?;
            let got = next(&mut line)?;
            assert!(got.starts_with(answer), "{command}: {got}");
        }
        // Broker-level stack on broker 1 is separate from the cleared cluster-wide one.
        assert_eq!(api_versions_error(first)?, Some(7));
        assert_eq!(api_versions_error(first)?, Some(8));
        assert_eq!(advertised(first, ApiKey::JoinGroup)?, Some((0, 4)));
        writeln!(stdin, "requests")?;
        let mut tracked = Vec::new();
        loop {
            let l = next(&mut line)?;
            if l == "end" {
                break;
            }
            anyhow::ensure!(l.starts_with("broker="), "unexpected {l:?}");
            tracked.push(l);
        }
        assert_eq!(next(&mut line)?, "ok");
        assert!(
            tracked.iter().any(|l| l.contains("api_key=18")),
            "{tracked:?}"
        );
        writeln!(stdin, "quit")?;
        assert_eq!(next(&mut line)?, "ok");
        Ok(())
    })();
    if result.is_err() {
        let _ = child.kill();
    }
    let status = child.wait()?;
    result?;
    assert!(status.success(), "{status}");
    Ok(())
}

#[test]
fn mock_cluster_binary_keeps_serving_after_eof() -> anyhow::Result<()> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mock-cluster"))
        .args(["--brokers", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
    let mut bootstrap = String::new();
    stdout.read_line(&mut bootstrap)?;
    std::thread::sleep(Duration::from_millis(300));
    let alive = child.try_wait()?.is_none();
    let answered = api_versions_error(bootstrap.trim());
    // SIGTERM stops it.
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status()?;
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("mock-cluster did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(alive, "exited on EOF");
    assert_eq!(answered?, Some(0));
    assert!(killed.success());
    assert!(status.success(), "{status}");
    Ok(())
}

/// `Peer::External` creates topics through rdkafka's admin client, also from inside a
/// tokio runtime; tansu stands in for the external cluster.
#[tokio::test]
async fn external_peer_creates_topics_from_async_code() -> anyhow::Result<()> {
    let tansu = Tansu::start()?;
    let peer = Peer::External(tansu.bootstrap());
    assert_eq!(peer.name(), "external");
    peer.create_topic("ext", 3)?;
    // Already there: not an error on an external cluster.
    peer.create_topic("ext", 3)?;
    let md = metadata(&peer.bootstrap(), Some("ext"))?;
    let topic = md
        .topics()
        .iter()
        .find(|t| t.name() == "ext")
        .context("topic ext missing")?;
    assert_eq!(topic.partitions().len(), 3);
    Ok(())
}
