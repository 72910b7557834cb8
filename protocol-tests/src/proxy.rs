//! A TCP proxy between a client and one broker that injects faults on the wire. It
//! reads the client's request headers to learn which API each response answers, then
//! either flips one byte inside the records of Fetch responses (corruption must end as
//! a typed error naming the partition and offset), or swallows every n-th Produce
//! response and drops the connection: the broker wrote the batch, the client never
//! hears of it and retries, as when a network fails after the write; or answers the
//! first OffsetCommits with an error of the test's choosing, as a coordinator that has
//! just moved or is loading the group does; or, once armed, turns the connection that
//! next sends a request of one API into a black hole (read, never answered, never
//! closed), as a host gone silent; or hides a topic's higher partitions from Metadata
//! answers, so a test can make a topic grow on a broker that cannot add partitions.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The running proxy; it stops when dropped.
#[derive(Debug)]
pub struct CorruptingProxy {
    address: SocketAddr,
    corrupted: Arc<AtomicU64>,
    silence: Arc<Silence>,
    task: tokio::task::JoinHandle<()>,
}

/// Fetch's API key.
const FETCH: i16 = 1;
/// Produce's API key.
const PRODUCE: i16 = 0;
/// OffsetCommit's API key.
const OFFSET_COMMIT: i16 = 8;
/// Metadata's API key.
const METADATA: i16 = 3;

/// The black hole's trigger and its record.
#[derive(Debug, Default)]
struct Silence {
    /// The next request of the silenced API swallows its connection; cleared when it
    /// does, so one arming silences one connection.
    armed: AtomicBool,
    /// When each connection went silent, in order.
    at: Mutex<Vec<Instant>>,
}

/// What the proxy does to responses.
#[derive(Debug, Clone)]
enum Fault {
    /// Flip the byte `from_end` bytes before the end of Fetch responses over `min_len`.
    CorruptFetch { min_len: usize, from_end: usize },
    /// Swallow every `every`-th Produce response and close the connection.
    DropProduce { every: u64 },
    /// Set every partition's error in the first `times` OffsetCommit answers to `code`.
    FailCommits { code: i16, times: u64 },
    /// Once armed, the next connection to send a request with this API key goes
    /// silent: that request and every later byte in either direction is dropped, and
    /// the client's socket stays open.
    Silence { api: i16 },
    /// Set every topic's error in the first `times` CreateTopics and DeleteTopics
    /// answers to NOT_CONTROLLER.
    NotController { times: u64 },
    /// In Metadata answers, `topic` lists only its partitions below `visible`.
    HidePartitions {
        topic: Arc<str>,
        visible: Arc<AtomicI32>,
    },
}

impl CorruptingProxy {
    /// Listens on `listener` and forwards every connection to `upstream`. Fetch
    /// responses longer than `min_len` bytes get the byte `from_end` bytes before their
    /// end flipped (for a one-partition response, that is inside its last record batch).
    pub fn start(
        listener: TcpListener,
        upstream: SocketAddr,
        min_len: usize,
        from_end: usize,
    ) -> Self {
        Self::with_fault(
            listener,
            upstream,
            Fault::CorruptFetch { min_len, from_end },
        )
    }

    /// Listens on `listener` and forwards to `upstream`, but swallows every `every`-th
    /// Produce response (counted across connections) and closes that connection.
    pub fn dropping_produce_responses(
        listener: TcpListener,
        upstream: SocketAddr,
        every: u64,
    ) -> Self {
        Self::with_fault(
            listener,
            upstream,
            Fault::DropProduce {
                every: every.max(1),
            },
        )
    }

    /// Listens on `listener` and forwards to `upstream`, but answers the first `times`
    /// OffsetCommits (counted across connections) with `code` for every partition: the
    /// broker committed nothing it reports, as a coordinator refusing them.
    /// ([`CorruptingProxy::corrupted`] counts them.)
    pub fn failing_commits(
        listener: TcpListener,
        upstream: SocketAddr,
        code: i16,
        times: u64,
    ) -> Self {
        Self::with_fault(listener, upstream, Fault::FailCommits { code, times })
    }

    /// Listens on `listener` and forwards to `upstream`, but answers the first `times`
    /// CreateTopics and DeleteTopics (counted across connections) with NOT_CONTROLLER
    /// for every topic, as a broker that just lost the controllership. The broker has
    /// acted on them all the same. ([`CorruptingProxy::corrupted`] counts them.)
    pub fn not_controller(listener: TcpListener, upstream: SocketAddr, times: u64) -> Self {
        Self::with_fault(listener, upstream, Fault::NotController { times })
    }

    /// Listens on `listener` and relays to `upstream` unchanged until
    /// [`CorruptingProxy::arm`] is called. Then the first connection to send a request
    /// with API key `api` becomes a black hole: that request and everything after it
    /// is read and dropped, the broker's answers are dropped too, and the client's
    /// socket is never closed by the proxy (it closes when the client gives up). Other
    /// connections, and later ones, relay normally. As a coordinator whose host stopped
    /// answering while the other brokers are fine.
    pub fn silencing(listener: TcpListener, upstream: SocketAddr, api: i16) -> Self {
        Self::with_fault(listener, upstream, Fault::Silence { api })
    }

    /// Listens on `listener` and forwards to `upstream`, but in every Metadata answer
    /// `topic` lists only the partitions whose index is below `visible` (read at each
    /// answer): raising it makes the topic grow, for brokers without CreatePartitions.
    /// ([`CorruptingProxy::corrupted`] counts the answers that hid a partition.)
    pub fn hiding_partitions(
        listener: TcpListener,
        upstream: SocketAddr,
        topic: &str,
        visible: Arc<AtomicI32>,
    ) -> Self {
        Self::with_fault(
            listener,
            upstream,
            Fault::HidePartitions {
                topic: topic.into(),
                visible,
            },
        )
    }

    fn with_fault(listener: TcpListener, upstream: SocketAddr, fault: Fault) -> Self {
        let address = listener.local_addr().unwrap_or(upstream);
        let corrupted = Arc::new(AtomicU64::new(0));
        let silence = Arc::new(Silence::default());
        let count = corrupted.clone();
        let seen = Arc::new(AtomicU64::new(0));
        let shared_silence = silence.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (count, seen) = (count.clone(), seen.clone());
                let (fault, silence) = (fault.clone(), shared_silence.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, fault, count, seen, silence).await;
                    }
                });
            }
        });
        Self {
            address,
            corrupted,
            silence,
            task,
        }
    }

    /// Arms the black hole of a [`CorruptingProxy::silencing`] proxy: the next
    /// connection to send a request of its API goes silent.
    pub fn arm(&self) {
        self.silence.armed.store(true, Ordering::SeqCst);
    }

    /// Whether the proxy is armed and has not silenced a connection yet.
    pub fn armed(&self) -> bool {
        self.silence.armed.load(Ordering::SeqCst)
    }

    /// How many connections went silent so far.
    pub fn silenced(&self) -> usize {
        self.silence.at.lock().unwrap().len()
    }

    /// When the latest connection went silent (the moment its trigger request
    /// arrived), if one did.
    pub fn silenced_at(&self) -> Option<Instant> {
        self.silence.at.lock().unwrap().last().copied()
    }

    /// `host:port` of the proxy.
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// How many responses were corrupted or swallowed so far.
    pub fn corrupted(&self) -> u64 {
        self.corrupted.load(Ordering::SeqCst)
    }
}

impl Drop for CorruptingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_frame(s: &mut tokio::net::tcp::OwnedReadHalf) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let n = usize::try_from(i32::from_be_bytes(len)).ok()?;
    let mut frame = vec![0u8; n + 4];
    frame[..4].copy_from_slice(&len);
    s.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

/// A Metadata answer (`frame`, length prefix included) in which `topic` lists only its
/// partitions below `visible`; `None` if it does not decode or hides nothing.
fn hide_partitions(frame: &[u8], version: i16, topic: &str, visible: i32) -> Option<Vec<u8>> {
    use kafka_protocol::messages::{ApiKey, MetadataResponse};
    rewrite(
        frame,
        ApiKey::Metadata,
        version,
        |response: &mut MetadataResponse| {
            let mut hidden = false;
            for t in &mut response.topics {
                if t.name.as_ref().is_some_and(|n| n.as_str() == topic) {
                    let before = t.partitions.len();
                    t.partitions.retain(|p| p.partition_index < visible);
                    hidden |= t.partitions.len() < before;
                }
            }
            hidden
        },
    )
}

/// An OffsetCommit answer (`frame`, length prefix included) with every partition's
/// error set to `code`; `None` if it does not decode.
fn fail_commit(frame: &[u8], version: i16, code: i16) -> Option<Vec<u8>> {
    use kafka_protocol::messages::{ApiKey, OffsetCommitResponse};
    rewrite(
        frame,
        ApiKey::OffsetCommit,
        version,
        |response: &mut OffsetCommitResponse| {
            for topic in &mut response.topics {
                for partition in &mut topic.partitions {
                    partition.error_code = code;
                }
            }
            true
        },
    )
}

/// A CreateTopics (19) or DeleteTopics (20) answer with every topic's error set to
/// NOT_CONTROLLER; `None` for another API or if it does not decode.
fn not_controller(frame: &[u8], api: i16, version: i16) -> Option<Vec<u8>> {
    use kafka_protocol::messages::{ApiKey, CreateTopicsResponse, DeleteTopicsResponse};
    const NOT_CONTROLLER: i16 = 41;
    match api {
        19 => rewrite(
            frame,
            ApiKey::CreateTopics,
            version,
            |r: &mut CreateTopicsResponse| {
                r.topics
                    .iter_mut()
                    .for_each(|t| t.error_code = NOT_CONTROLLER);
                true
            },
        ),
        20 => rewrite(
            frame,
            ApiKey::DeleteTopics,
            version,
            |r: &mut DeleteTopicsResponse| {
                r.responses
                    .iter_mut()
                    .for_each(|t| t.error_code = NOT_CONTROLLER);
                true
            },
        ),
        _ => None,
    }
}

/// Decodes the answer in `frame` (length prefix included) as `R`, lets `edit` change
/// it, and encodes it again with the same header; `None` if it does not decode or
/// `edit` changed nothing.
fn rewrite<R>(
    frame: &[u8],
    api: kafka_protocol::messages::ApiKey,
    version: i16,
    edit: impl FnOnce(&mut R) -> bool,
) -> Option<Vec<u8>>
where
    R: kafka_protocol::protocol::Decodable + kafka_protocol::protocol::Encodable,
{
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::ResponseHeader;
    use kafka_protocol::protocol::{Decodable, Encodable};
    let header_version = api.response_header_version(version);
    let mut body = Bytes::copy_from_slice(frame.get(4..)?);
    let header = ResponseHeader::decode(&mut body, header_version).ok()?;
    let mut response = R::decode(&mut body, version).ok()?;
    if !edit(&mut response) {
        return None;
    }
    let mut out = BytesMut::new();
    out.extend_from_slice(&[0; 4]);
    header.encode(&mut out, header_version).ok()?;
    response.encode(&mut out, version).ok()?;
    let len = i32::try_from(out.len() - 4).ok()?;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Some(out.to_vec())
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    fault: Fault,
    count: Arc<AtomicU64>,
    seen: Arc<AtomicU64>,
    silence: Arc<Silence>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // correlation id -> (api key, version) of requests in flight.
    let apis: Arc<Mutex<HashMap<i32, (i16, i16)>>> = Arc::default();
    let up_apis = apis.clone();
    // This connection is a black hole.
    let silent = Arc::new(AtomicBool::new(false));
    let up_silent = silent.clone();
    let silenced_api = match fault {
        Fault::Silence { api } => Some(api),
        _ => None,
    };
    let mut up = tokio::spawn(async move {
        while let Some(frame) = read_frame(&mut cr).await {
            if up_silent.load(Ordering::SeqCst) {
                continue;
            }
            if frame.len() >= 12 {
                let api = i16::from_be_bytes([frame[4], frame[5]]);
                let version = i16::from_be_bytes([frame[6], frame[7]]);
                let correlation = i32::from_be_bytes([frame[8], frame[9], frame[10], frame[11]]);
                if silenced_api == Some(api)
                    && silence
                        .armed
                        .compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                {
                    up_silent.store(true, Ordering::SeqCst);
                    silence.at.lock().unwrap().push(Instant::now());
                    continue;
                }
                up_apis.lock().unwrap().insert(correlation, (api, version));
            }
            if sw.write_all(&frame).await.is_err() {
                break;
            }
        }
    });
    while let Some(mut frame) = read_frame(&mut sr).await {
        if silent.load(Ordering::SeqCst) {
            continue;
        }
        if frame.len() >= 8 {
            let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
            let sent = apis.lock().unwrap().remove(&correlation);
            let api = sent.map(|(api, _)| api);
            match fault {
                Fault::CorruptFetch { min_len, from_end }
                    if api == Some(FETCH) && frame.len() > min_len && frame.len() > from_end =>
                {
                    let at = frame.len() - from_end;
                    frame[at] ^= 0x5a;
                    count.fetch_add(1, Ordering::SeqCst);
                }
                Fault::DropProduce { every }
                    if api == Some(PRODUCE)
                        && (seen.fetch_add(1, Ordering::SeqCst) + 1).is_multiple_of(every) =>
                {
                    count.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                Fault::FailCommits { code, times }
                    if api == Some(OFFSET_COMMIT) && count.load(Ordering::SeqCst) < times =>
                {
                    let version = sent.map_or(0, |(_, v)| v);
                    if let Some(failed) = fail_commit(&frame, version, code) {
                        frame = failed;
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Fault::NotController { times } if count.load(Ordering::SeqCst) < times => {
                    let (api, version) = sent.unwrap_or((-1, 0));
                    if let Some(refused) = not_controller(&frame, api, version) {
                        frame = refused;
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Fault::HidePartitions {
                    ref topic,
                    ref visible,
                } if api == Some(METADATA) => {
                    let version = sent.map_or(0, |(_, v)| v);
                    let visible = visible.load(Ordering::SeqCst);
                    if let Some(hidden) = hide_partitions(&frame, version, topic, visible) {
                        frame = hidden;
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                }
                _ => {}
            }
        }
        if cw.write_all(&frame).await.is_err() {
            break;
        }
    }
    // A black hole never closes the client's socket: hold its write half until the
    // client hangs up (the reading task ends), whatever the broker did.
    if silent.load(Ordering::SeqCst) {
        let _ = (&mut up).await;
        drop(cw);
        return;
    }
    up.abort();
}
