//! The connection task against scripted peers on loopback: pipelining, in-order
//! matching, timeouts, desyncs, hostile frames, ApiVersions fallback and reconnects.
//!
//! These peers misbehave on purpose, in ways no real broker can be made to; the real
//! brokers are exercised by `protocol-tests`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, MetadataRequest, MetadataResponse, RequestHeader, ResponseHeader,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes, decode_request_header_from_buffer};
use ottla::driver::{Cluster, TopicScope};
use ottla::{ClientConfig, Error, RequestError, WireError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const METADATA_VERSION: i16 = 9;

/// Reads one request frame; `None` on EOF.
async fn read_request(stream: &mut TcpStream) -> Option<(RequestHeader, Bytes)> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await.ok()?;
    let mut buf = vec![0u8; i32::from_be_bytes(len) as usize];
    stream.read_exact(&mut buf).await.ok()?;
    let mut bytes = Bytes::from(buf);
    let header = decode_request_header_from_buffer(&mut bytes).ok()?;
    Some((header, bytes))
}

fn response_frame<R: Encodable>(api: ApiKey, version: i16, correlation_id: i32, body: &R) -> Bytes {
    let mut inner = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut inner, api.response_header_version(version))
        .unwrap();
    body.encode(&mut inner, version).unwrap();
    let mut out = BytesMut::new();
    out.put_i32(inner.len() as i32);
    out.extend_from_slice(&inner);
    out.freeze()
}

fn api_versions(max_api_versions: i16) -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_api_keys(vec![
        ApiVersion::default()
            .with_api_key(18)
            .with_min_version(0)
            .with_max_version(max_api_versions),
        ApiVersion::default()
            .with_api_key(3)
            .with_min_version(0)
            .with_max_version(METADATA_VERSION),
    ])
}

/// Answers ApiVersions like a broker that tops out at v3.
async fn handshake(stream: &mut TcpStream) -> Option<()> {
    loop {
        let (h, _) = read_request(stream).await?;
        if h.request_api_version > 3 {
            let refusal = api_versions(3).with_error_code(35);
            stream
                .write_all(&response_frame(
                    ApiKey::ApiVersions,
                    0,
                    h.correlation_id,
                    &refusal,
                ))
                .await
                .ok()?;
            continue;
        }
        let frame = response_frame(
            ApiKey::ApiVersions,
            h.request_api_version,
            h.correlation_id,
            &api_versions(3),
        );
        stream.write_all(&frame).await.ok()?;
        return Some(());
    }
}

/// A Metadata response that echoes the requested topic names, so each caller can tell
/// its own answer from its neighbours'.
fn echo(body: Bytes, version: i16) -> MetadataResponse {
    let mut body = body;
    let req = MetadataRequest::decode(&mut body, version).unwrap();
    let topics = req
        .topics
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            MetadataResponseTopic::default()
                .with_name(t.name)
                .with_error_code(3)
        })
        .collect();
    MetadataResponse::default().with_topics(topics)
}

/// The first topic a Metadata request names ("" for none): the scripted peers
/// misbehave only for chosen topics, so the client's own bootstrap refresh succeeds.
fn first_topic(body: &Bytes, version: i16) -> String {
    let mut body = body.clone();
    MetadataRequest::decode(&mut body, version)
        .ok()
        .and_then(|r| r.topics)
        .and_then(|t| t.into_iter().next())
        .and_then(|t| t.name)
        .map(|n| n.0.to_string())
        .unwrap_or_default()
}

/// Starts a peer whose connections are each handled by `script(connection_index, stream)`.
async fn peer<F, Fut>(script: F) -> String
where
    F: Fn(usize, TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let script = Arc::new(script);
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(script(n, stream));
            n += 1;
        }
    });
    addr
}

fn config(addr: &str) -> ClientConfig {
    ClientConfig::new(addr)
        .with_request_timeout(Duration::from_millis(500))
        .with_connect_timeout(Duration::from_millis(500))
        .with_reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50))
}

fn topic_request(name: &str) -> MetadataRequest {
    MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(name.into())))),
        ]))
        .with_allow_auto_topic_creation(false)
}

/// A well-behaved peer: answers in order, but only after a burst has gathered, and
/// records the largest number of requests it ever saw waiting.
async fn batching_peer(max_outstanding: Arc<AtomicUsize>) -> String {
    peer(move |_, mut stream| {
        let max_outstanding = max_outstanding.clone();
        async move {
            handshake(&mut stream).await;
            let (mut rd, mut wr) = stream.into_split();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(RequestHeader, Bytes)>();
            tokio::spawn(async move {
                loop {
                    let mut len = [0u8; 4];
                    if rd.read_exact(&mut len).await.is_err() {
                        return;
                    }
                    let mut buf = vec![0u8; i32::from_be_bytes(len) as usize];
                    if rd.read_exact(&mut buf).await.is_err() {
                        return;
                    }
                    let mut bytes = Bytes::from(buf);
                    let h = decode_request_header_from_buffer(&mut bytes).unwrap();
                    if tx.send((h, bytes)).is_err() {
                        return;
                    }
                }
            });
            loop {
                let Some(first) = rx.recv().await else { return };
                let mut batch = vec![first];
                tokio::time::sleep(Duration::from_millis(2)).await;
                while let Ok(more) = rx.try_recv() {
                    batch.push(more);
                }
                max_outstanding.fetch_max(batch.len(), Ordering::SeqCst);
                for (h, body) in batch {
                    let resp = echo(body, h.request_api_version);
                    let frame = response_frame(
                        ApiKey::Metadata,
                        h.request_api_version,
                        h.correlation_id,
                        &resp,
                    );
                    if wr.write_all(&frame).await.is_err() {
                        return;
                    }
                }
            }
        }
    })
    .await
}

#[tokio::test]
async fn pipelined_requests_match_their_callers_and_respect_the_in_flight_cap() {
    let max_outstanding = Arc::new(AtomicUsize::new(0));
    let addr = batching_peer(max_outstanding.clone()).await;
    let cluster_config = config(&addr).with_max_in_flight(4);
    let cluster = Cluster::connect(&cluster_config, TopicScope::Topics(Default::default()), &[])
        .await
        .unwrap();
    let conn = cluster.connection(&addr);
    let calls = (0..300).map(|i| {
        let conn = conn.clone();
        async move {
            let name = format!("topic-{i}");
            let resp = conn
                .send_version(&topic_request(&name), METADATA_VERSION)
                .await
                .unwrap();
            assert_eq!(resp.topics.len(), 1);
            assert_eq!(resp.topics[0].name.as_ref().unwrap().0.as_str(), name);
        }
    });
    futures_join_all(calls).await;
    let seen = max_outstanding.load(Ordering::SeqCst);
    assert!(
        seen <= 4,
        "the peer saw {seen} requests outstanding with a cap of 4"
    );
    assert!(
        seen >= 2,
        "requests were not pipelined (max outstanding {seen})"
    );
}

#[tokio::test]
async fn a_response_with_the_wrong_correlation_id_poisons_only_that_connection() {
    let addr = peer(|_, mut stream| async move {
        handshake(&mut stream).await;
        while let Some((h, body)) = read_request(&mut stream).await {
            // Topic "a" is answered with a correlation id nobody asked for.
            let bad = first_topic(&body, h.request_api_version) == "a";
            let id = if bad {
                h.correlation_id + 1000
            } else {
                h.correlation_id
            };
            let resp = echo(body, h.request_api_version);
            let _ = stream
                .write_all(&response_frame(
                    ApiKey::Metadata,
                    h.request_api_version,
                    id,
                    &resp,
                ))
                .await;
        }
    })
    .await;
    let conn = connect_direct(&addr).await;
    let err = conn
        .send_version(&topic_request("a"), METADATA_VERSION)
        .await
        .unwrap_err();
    match err {
        RequestError::Wire {
            source: WireError::CorrelationMismatch { expected, got, api },
            ..
        } => {
            assert_eq!(got, expected + 1000);
            assert_eq!(api, ApiKey::Metadata);
        }
        other => panic!("expected a correlation mismatch, got {other:?}"),
    }
    // The next request reconnects and is answered properly.
    let resp = conn
        .send_version(&topic_request("b"), METADATA_VERSION)
        .await
        .unwrap();
    assert_eq!(resp.topics[0].name.as_ref().unwrap().0.as_str(), "b");
}

#[tokio::test]
async fn a_silent_broker_times_the_request_out_and_fails_the_rest_of_the_pipeline() {
    let addr = peer(|_, mut stream| async move {
        handshake(&mut stream).await;
        // Answer the bootstrap refresh, then nothing.
        while let Some((h, body)) = read_request(&mut stream).await {
            if first_topic(&body, h.request_api_version).is_empty() {
                let frame = response_frame(
                    ApiKey::Metadata,
                    h.request_api_version,
                    h.correlation_id,
                    &echo(body, h.request_api_version),
                );
                let _ = stream.write_all(&frame).await;
            }
        }
    })
    .await;
    let conn = connect_direct(&addr).await;
    let started = std::time::Instant::now();
    let (ra, rb) = (topic_request("a"), topic_request("b"));
    let (a, b) = tokio::join!(
        conn.send_version(&ra, METADATA_VERSION),
        conn.send_version(&rb, METADATA_VERSION)
    );
    let elapsed = started.elapsed();
    for r in [a, b] {
        match r.unwrap_err() {
            RequestError::Timeout { api, .. } => assert_eq!(api, ApiKey::Metadata),
            RequestError::Disconnected { reason, .. } => {
                assert!(reason.contains("timed out"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // Request timeout is 500 ms; nothing hangs past the caller's budget.
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
}

#[tokio::test]
async fn a_frame_claiming_a_huge_size_is_refused_before_allocation() {
    let addr = peer(|_, mut stream| async move {
        handshake(&mut stream).await;
        while let Some((h, body)) = read_request(&mut stream).await {
            if first_topic(&body, h.request_api_version).is_empty() {
                let frame = response_frame(
                    ApiKey::Metadata,
                    h.request_api_version,
                    h.correlation_id,
                    &echo(body, h.request_api_version),
                );
                let _ = stream.write_all(&frame).await;
                continue;
            }
            let mut out = BytesMut::new();
            out.put_i32(i32::MAX);
            out.put_i32(h.correlation_id);
            let _ = stream.write_all(&out).await;
        }
    })
    .await;
    let conn = connect_direct(&addr).await;
    let err = conn
        .send_version(&topic_request("a"), METADATA_VERSION)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RequestError::Wire {
                source: WireError::FrameTooLarge { size, .. },
                ..
            } if size == i32::MAX as usize
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn data_cut_off_mid_frame_fails_the_request_as_disconnected() {
    let addr = peer(|_, mut stream| async move {
        handshake(&mut stream).await;
        while let Some((h, body)) = read_request(&mut stream).await {
            let cut = !first_topic(&body, h.request_api_version).is_empty();
            let frame = response_frame(
                ApiKey::Metadata,
                h.request_api_version,
                h.correlation_id,
                &echo(body, h.request_api_version),
            );
            if cut {
                let _ = stream.write_all(&frame[..frame.len() / 2]).await;
                // Returning drops the stream: closed mid-frame.
                return;
            }
            let _ = stream.write_all(&frame).await;
        }
    })
    .await;
    let conn = connect_direct(&addr).await;
    let err = conn
        .send_version(&topic_request("a"), METADATA_VERSION)
        .await
        .unwrap_err();
    assert!(matches!(err, RequestError::Disconnected { .. }), "{err:?}");
}

#[tokio::test]
async fn a_garbage_body_is_a_typed_decode_error_and_the_connection_survives() {
    let addr = peer(|_, mut stream| async move {
        handshake(&mut stream).await;
        while let Some((h, body)) = read_request(&mut stream).await {
            let frame = if first_topic(&body, h.request_api_version) == "a" {
                // Right correlation id, then a body whose first array claims 2^31-1 brokers.
                let mut out = BytesMut::new();
                out.put_i32(4 + 4 + 4 + 3);
                out.put_i32(h.correlation_id);
                out.put_i32(0); // throttle
                out.put_i32(i32::MAX); // brokers count
                out.put_slice(&[1, 2, 3]);
                out.freeze()
            } else {
                response_frame(
                    ApiKey::Metadata,
                    h.request_api_version,
                    h.correlation_id,
                    &echo(body, h.request_api_version),
                )
            };
            let _ = stream.write_all(&frame).await;
        }
    })
    .await;
    let conn = connect_direct(&addr).await;
    // Metadata v9 is flexible, so ask at v4 where arrays carry an i32 count.
    let err = conn.send_version(&topic_request("a"), 4).await.unwrap_err();
    assert!(
        matches!(
            err,
            RequestError::Wire {
                source: WireError::Decode {
                    api: ApiKey::Metadata,
                    ..
                },
                ..
            }
        ),
        "{err:?}"
    );
    let resp = conn.send_version(&topic_request("b"), 4).await.unwrap();
    assert_eq!(resp.topics[0].name.as_ref().unwrap().0.as_str(), "b");
}

#[tokio::test]
async fn a_caller_that_gives_up_does_not_desync_the_stream() {
    let addr = peer(|_, mut stream| async move {
        handshake(&mut stream).await;
        while let Some((h, body)) = read_request(&mut stream).await {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let frame = response_frame(
                ApiKey::Metadata,
                h.request_api_version,
                h.correlation_id,
                &echo(body, h.request_api_version),
            );
            let _ = stream.write_all(&frame).await;
        }
    })
    .await;
    let conn = connect_direct(&addr).await;
    let gave_up = tokio::time::timeout(
        Duration::from_millis(20),
        conn.send_version(&topic_request("dropped"), METADATA_VERSION),
    )
    .await;
    assert!(gave_up.is_err(), "the first call should still be waiting");
    let resp = conn
        .send_version(&topic_request("kept"), METADATA_VERSION)
        .await
        .unwrap();
    assert_eq!(resp.topics[0].name.as_ref().unwrap().0.as_str(), "kept");
}

#[tokio::test]
async fn api_versions_falls_back_when_the_broker_closes_after_refusing() {
    // Like some brokers: refuse ApiVersions v4 with a mock-style body, then hang up.
    let addr = peer(|_, mut stream| async move {
        let Some((h, _)) = read_request(&mut stream).await else {
            return;
        };
        if h.request_api_version > 3 {
            let mut out = BytesMut::new();
            out.put_i32(4 + 2 + 1);
            out.put_i32(h.correlation_id);
            out.put_i16(35);
            out.put_u8(0);
            let _ = stream.write_all(&out).await;
            return;
        }
        let frame = response_frame(
            ApiKey::ApiVersions,
            h.request_api_version,
            h.correlation_id,
            &api_versions(3),
        );
        let _ = stream.write_all(&frame).await;
        while let Some((h, body)) = read_request(&mut stream).await {
            let frame = response_frame(
                ApiKey::Metadata,
                h.request_api_version,
                h.correlation_id,
                &echo(body, h.request_api_version),
            );
            let _ = stream.write_all(&frame).await;
        }
    })
    .await;
    let conn = connect_direct(&addr).await;
    let table = conn.versions().await.unwrap();
    assert_eq!(table.version(ApiKey::Metadata), Some(METADATA_VERSION));
    assert_eq!(table.version(ApiKey::ApiVersions), Some(3));
}

#[tokio::test]
async fn a_refused_connection_fails_fast_with_a_typed_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let err = Cluster::connect(&config(&addr), TopicScope::All, &[])
        .await
        .unwrap_err();
    match err {
        Error::Bootstrap { tried, last } => {
            assert_eq!(tried, vec![addr]);
            assert!(
                matches!(last, Some(RequestError::Connect { .. })),
                "{last:?}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn a_required_api_the_broker_lacks_is_a_startup_error_naming_it() {
    // A broker whose Metadata stops at v0, below the v1 ottla needs.
    let addr_low = peer(|_, mut stream| async move {
        let Some((h, _)) = read_request(&mut stream).await else {
            return;
        };
        let resp = ApiVersionsResponse::default().with_api_keys(vec![
            ApiVersion::default()
                .with_api_key(18)
                .with_min_version(0)
                .with_max_version(3),
            ApiVersion::default()
                .with_api_key(3)
                .with_min_version(0)
                .with_max_version(0),
        ]);
        let v = h.request_api_version.min(3);
        let _ = stream
            .write_all(&response_frame(
                ApiKey::ApiVersions,
                v,
                h.correlation_id,
                &resp,
            ))
            .await;
        while read_request(&mut stream).await.is_some() {}
    })
    .await;
    let err = Cluster::connect(&config(&addr_low), TopicScope::All, &[])
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("Metadata") && msg.contains("v1..=v13") && msg.contains("v0..=v0"),
        "{msg}"
    );
}

async fn connect_direct(addr: &str) -> ottla::driver::BrokerConnection {
    let cluster = Cluster::connect(&config(addr), TopicScope::Topics(Default::default()), &[])
        .await
        .unwrap();
    cluster.connection(addr)
}

async fn futures_join_all<F: std::future::Future<Output = ()>>(futs: impl Iterator<Item = F>) {
    let mut set = Vec::new();
    for f in futs {
        set.push(f);
    }
    let mut pinned: Vec<_> = set.into_iter().map(Box::pin).collect();
    // Poll all concurrently on this task.
    std::future::poll_fn(|cx| {
        pinned.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if pinned.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}
