//! A hostile broker: a TCP proxy in front of every broker of a real cluster (the
//! librdkafka mock, in the suites) that forwards honestly until it is armed, then
//! answers chosen requests in ways no broker should: frames claiming huge sizes, arrays
//! with absurd counts, responses to requests never sent, and frames cut off mid-body
//! (the socket then closed, or held open). After `times` misbehaviours it forwards
//! honestly again, so a client's reconnect and recovery can be observed.
//!
//! The proxy rewrites the broker addresses in Metadata and FindCoordinator responses to
//! its own listeners, so every connection the client opens after bootstrap (to a
//! partition leader, to the group coordinator) also goes through it. Requests always
//! reach the upstream broker; only responses are tampered with, which keeps responses
//! in request order as Kafka promises.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, FetchResponse, FindCoordinatorResponse, MetadataResponse, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How one response is tampered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misbehaviour {
    /// Instead of the response: a length prefix claiming `claimed` bytes, the right
    /// correlation id and a few bytes of body, then silence (the socket stays open and
    /// nothing more is written to it).
    HugeFrame {
        /// The length prefix (negative and tiny values are allowed).
        claimed: i32,
    },
    /// Instead of the response: a well-framed response with the right correlation id
    /// whose first array claims `count` elements, followed by `padding` bytes of `0xff`
    /// and nothing else. Non-flexible versions carry `count` as an `i32` (so `-2` is a
    /// negative length beyond null); flexible ones as the unsigned varint `count + 1`
    /// (so `-2` claims 2^32 - 2 elements). The connection goes on afterwards.
    AbsurdArray {
        /// The element count written.
        count: i32,
        /// Bytes after the count.
        padding: usize,
    },
    /// A Fetch response that carries records gets, in place of the first partition's
    /// records, one uncompressed v2 batch (valid CRC, same base offset) holding one
    /// record that claims `count` headers, followed by `padding` bytes of `0xff`. The
    /// array count sits inside the records, where the Kafka codec never looks; the
    /// client's own record parser must refuse it. Responses without records pass
    /// untouched and do not count. The connection goes on afterwards.
    AbsurdRecordHeaders {
        /// The header count written (a zigzag varint).
        count: i32,
        /// Bytes after the count.
        padding: usize,
    },
    /// The real response with `offset` added to its correlation id: an answer to a
    /// request never sent. The connection goes on afterwards.
    WrongCorrelationId {
        /// Added to the correlation id.
        offset: i32,
    },
    /// The real response, then the same frame again: a second answer nobody asked
    /// for. The connection goes on afterwards.
    Duplicate,
    /// The first half of the real response, then the socket is closed.
    CutOffThenClose,
    /// The first half of the real response, then silence with the socket held open.
    CutOffThenHold,
}

impl Misbehaviour {
    /// Whether the proxy can apply this misbehaviour to `api` at `version`.
    fn applies_to(self, api: ApiKey, version: i16) -> bool {
        match self {
            Misbehaviour::AbsurdArray { .. } => bytes_before_first_array(api, version).is_some(),
            Misbehaviour::AbsurdRecordHeaders { .. } => api == ApiKey::Fetch,
            _ => true,
        }
    }
}

/// What the proxy is armed with.
#[derive(Debug, Clone, Copy)]
struct Armed {
    api: ApiKey,
    misbehaviour: Misbehaviour,
    left: u64,
}

#[derive(Debug)]
struct Shared {
    armed: Mutex<Option<Armed>>,
    /// Misbehaviours carried out.
    injected: AtomicU64,
    /// Client connections accepted, over all listeners.
    connections: AtomicU64,
    /// Client connections the client closed (the proxy read its end of stream).
    client_hangups: AtomicU64,
    /// The client's port of each connection accepted, in order.
    client_ports: Mutex<Vec<u16>>,
    /// Requests seen, by API key.
    requests: Mutex<HashMap<i16, u64>>,
    /// Upstream broker port -> the proxy port standing in for it.
    ports: HashMap<u16, u16>,
}

/// A hostile proxy in front of every broker of a cluster. Dropping it stops its
/// listeners; a connection already relayed ends when either side hangs up.
#[derive(Debug)]
pub struct HostileProxy {
    shared: Arc<Shared>,
    addresses: Vec<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl HostileProxy {
    /// Starts one listener on `127.0.0.1:0` per broker of `upstream_bootstrap`
    /// (comma-separated `host:port`, one entry per broker, as
    /// [`crate::MockCluster::bootstrap`] lists them). It forwards honestly until armed.
    pub async fn start(upstream_bootstrap: &str) -> anyhow::Result<Self> {
        let mut upstreams = Vec::new();
        for entry in upstream_bootstrap.split(',').map(str::trim) {
            let address = tokio::net::lookup_host(entry)
                .await
                .with_context(|| format!("resolving {entry}"))?
                .next()
                .with_context(|| format!("{entry} resolves to nothing"))?;
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            upstreams.push((address, listener));
        }
        let mut ports = HashMap::new();
        let mut addresses = Vec::new();
        for (upstream, listener) in &upstreams {
            let local = listener.local_addr()?;
            ports.insert(upstream.port(), local.port());
            addresses.push(local);
        }
        let shared = Arc::new(Shared {
            armed: Mutex::new(None),
            injected: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            client_hangups: AtomicU64::new(0),
            client_ports: Mutex::new(Vec::new()),
            requests: Mutex::new(HashMap::new()),
            ports,
        });
        let tasks = upstreams
            .into_iter()
            .map(|(upstream, listener)| {
                let shared = shared.clone();
                tokio::spawn(async move {
                    while let Ok((client, peer)) = listener.accept().await {
                        shared.connections.fetch_add(1, Ordering::SeqCst);
                        lock(&shared.client_ports).push(peer.port());
                        let shared = shared.clone();
                        tokio::spawn(async move {
                            if let Ok(server) = TcpStream::connect(upstream).await {
                                relay(client, server, shared).await;
                            }
                        });
                    }
                })
            })
            .collect();
        Ok(Self {
            shared,
            addresses,
            tasks,
        })
    }

    /// The proxies' `host:port` list, in the upstream's broker order: the bootstrap
    /// servers to give the client.
    pub fn bootstrap(&self) -> String {
        self.addresses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Makes the next `times` responses to `api` (on any connection) misbehave; after
    /// that the proxy is honest again. Replaces any earlier arming.
    pub fn arm(&self, api: ApiKey, misbehaviour: Misbehaviour, times: u64) {
        *lock(&self.shared.armed) = Some(Armed {
            api,
            misbehaviour,
            left: times,
        });
    }

    /// Stops misbehaving.
    pub fn disarm(&self) {
        *lock(&self.shared.armed) = None;
    }

    /// How many responses were tampered with so far.
    pub fn injected(&self) -> u64 {
        self.shared.injected.load(Ordering::SeqCst)
    }

    /// How many misbehaviours are still armed.
    pub fn armed_left(&self) -> u64 {
        lock(&self.shared.armed).map_or(0, |a| a.left)
    }

    /// How many client connections the proxy accepted so far (over every broker).
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// How many client connections the client closed so far (the proxy read the end of
    /// its stream); a connection the broker or the proxy closed does not count.
    pub fn client_hangups(&self) -> u64 {
        self.shared.client_hangups.load(Ordering::SeqCst)
    }

    /// The client's local port of every connection accepted so far, in order.
    pub fn client_ports(&self) -> Vec<u16> {
        lock(&self.shared.client_ports).clone()
    }

    /// How many requests of `api` the proxy forwarded so far.
    pub fn requests(&self, api: ApiKey) -> u64 {
        lock(&self.shared.requests)
            .get(&(api as i16))
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for HostileProxy {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A request in flight through the proxy.
#[derive(Debug, Clone, Copy)]
struct Expected {
    api: Option<ApiKey>,
    version: i16,
}

async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let expected: Arc<Mutex<HashMap<i32, Expected>>> = Arc::default();
    let up_expected = expected.clone();
    let up_shared = shared.clone();
    let mut up = tokio::spawn(async move {
        while let Some(frame) = read_frame(&mut cr).await {
            if let Some((api_key, version, correlation_id)) = request_header(&frame) {
                *lock(&up_shared.requests).entry(api_key).or_insert(0) += 1;
                let api = ApiKey::try_from(api_key).ok();
                lock(&up_expected).insert(correlation_id, Expected { api, version });
            }
            if sw.write_all(&frame).await.is_err() {
                return;
            }
        }
        // The client's stream ended: it hung up (the relay aborts this task first when
        // the broker's side ends).
        up_shared.client_hangups.fetch_add(1, Ordering::SeqCst);
    });
    let mut held = false;
    loop {
        let frame = tokio::select! {
            frame = read_frame(&mut sr) => frame,
            // The client hung up: nothing more to relay.
            _ = &mut up => break,
        };
        let Some(frame) = frame else { break };
        if held {
            // The stream to the client is garbage by now: swallow everything.
            continue;
        }
        let Some(correlation_id) = response_correlation_id(&frame) else {
            break;
        };
        let request = lock(&expected).remove(&correlation_id);
        let Some(Expected {
            api: Some(api),
            version,
        }) = request
        else {
            if cw.write_all(&frame).await.is_err() {
                break;
            }
            continue;
        };
        let frame = rewrite_addresses(api, version, frame, &shared.ports);
        // Claimed when the response is due, so a misbehaviour is never spent on a
        // request whose connection died before its answer.
        let Some(misbehaviour) = claim(&shared, api, version, &frame) else {
            if cw.write_all(&frame).await.is_err() {
                break;
            }
            continue;
        };
        shared.injected.fetch_add(1, Ordering::SeqCst);
        tracing::debug!(
            ?api,
            version,
            correlation_id,
            ?misbehaviour,
            "hostile proxy misbehaves"
        );
        match misbehave(&mut cw, misbehaviour, api, version, correlation_id, &frame).await {
            Ok(After::Continue) => {}
            Ok(After::Hold) => held = true,
            Ok(After::Close) | Err(_) => break,
        }
    }
    up.abort();
}

/// What the relay does after a misbehaviour.
enum After {
    /// Go on forwarding.
    Continue,
    /// Write nothing more to the client, keep the socket open until it hangs up.
    Hold,
    /// Close the connection.
    Close,
}

async fn misbehave(
    client: &mut OwnedWriteHalf,
    misbehaviour: Misbehaviour,
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    frame: &[u8],
) -> std::io::Result<After> {
    match misbehaviour {
        Misbehaviour::HugeFrame { claimed } => {
            let mut out = BytesMut::new();
            out.put_i32(claimed);
            out.put_i32(correlation_id);
            out.put_bytes(0, 24);
            client.write_all(&out).await?;
            Ok(After::Hold)
        }
        Misbehaviour::AbsurdArray { count, padding } => {
            let Some(out) = absurd_array_frame(api, version, correlation_id, count, padding) else {
                // `claim` checked the API; unreachable in practice.
                client.write_all(frame).await?;
                return Ok(After::Continue);
            };
            client.write_all(&out).await?;
            Ok(After::Continue)
        }
        Misbehaviour::AbsurdRecordHeaders { count, padding } => {
            match absurd_record_headers_frame(frame, version, count, padding) {
                Some(out) => client.write_all(&out).await?,
                // `claim` checked that the response carries records.
                None => client.write_all(frame).await?,
            }
            Ok(After::Continue)
        }
        Misbehaviour::WrongCorrelationId { offset } => {
            let mut out = frame.to_vec();
            if let Some(id) = out.get_mut(4..8) {
                id.copy_from_slice(&correlation_id.wrapping_add(offset).to_be_bytes());
            }
            client.write_all(&out).await?;
            Ok(After::Continue)
        }
        Misbehaviour::Duplicate => {
            client.write_all(frame).await?;
            client.write_all(frame).await?;
            Ok(After::Continue)
        }
        Misbehaviour::CutOffThenClose => {
            client.write_all(&frame[..frame.len() / 2]).await?;
            client.flush().await?;
            Ok(After::Close)
        }
        Misbehaviour::CutOffThenHold => {
            client.write_all(&frame[..frame.len() / 2]).await?;
            Ok(After::Hold)
        }
    }
}

/// Takes one misbehaviour for `frame`, a response to `api` at `version`, if armed for it.
fn claim(shared: &Shared, api: ApiKey, version: i16, frame: &[u8]) -> Option<Misbehaviour> {
    let mut armed = lock(&shared.armed);
    let a = armed.as_mut()?;
    if a.api != api || a.left == 0 || !a.misbehaviour.applies_to(api, version) {
        return None;
    }
    if let Misbehaviour::AbsurdRecordHeaders { count, padding } = a.misbehaviour {
        absurd_record_headers_frame(frame, version, count, padding)?;
    }
    a.left -= 1;
    Some(a.misbehaviour)
}

/// A response frame (length prefix included) to `api` at `version` whose first array
/// claims `count` elements, followed by `padding` bytes of `0xff`.
fn absurd_array_frame(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    count: i32,
    padding: usize,
) -> Option<Bytes> {
    let before = bytes_before_first_array(api, version)?;
    let header_version = api.response_header_version(version);
    // Sized exactly, so the proxy's own allocation is one buffer of the frame's size.
    let mut inner = BytesMut::with_capacity(4 + 1 + before + 5 + padding);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut inner, header_version)
        .ok()?;
    // Throttle time, error code, session id: zeros are valid (and no error) for all.
    inner.put_bytes(0, before);
    // ApiVersions keeps response header v0 for bootstrapping; its body is flexible from v3.
    let flexible = match api {
        ApiKey::ApiVersions => version >= 3,
        _ => header_version >= 1,
    };
    if flexible {
        // A compact array: its count as the unsigned varint `count + 1`.
        put_unsigned_varint(&mut inner, (count as u32).wrapping_add(1));
    } else {
        inner.put_i32(count);
    }
    inner.put_bytes(0xff, padding);
    let mut out = BytesMut::with_capacity(4 + inner.len());
    out.put_i32(i32::try_from(inner.len()).ok()?);
    out.extend_from_slice(&inner);
    Some(out.freeze())
}

/// `frame`, a Fetch response at `version` (length prefix included), with the records of
/// its first partition that has any replaced by a batch whose one record claims `count`
/// headers; `None` when no partition carries records.
fn absurd_record_headers_frame(
    frame: &[u8],
    version: i16,
    count: i32,
    padding: usize,
) -> Option<Vec<u8>> {
    let header_version = ApiKey::Fetch.response_header_version(version);
    let mut replaced = false;
    let out = reencode::<FetchResponse>(frame, header_version, version, |r| {
        let with_records = r
            .responses
            .iter_mut()
            .flat_map(|t| t.partitions.iter_mut())
            .find(|p| p.records.as_ref().is_some_and(|b| b.len() >= 8));
        let Some(partition) = with_records else {
            return;
        };
        let Some(records) = &partition.records else {
            return;
        };
        let base_offset = i64::from_be_bytes(records[..8].try_into().unwrap_or([0; 8]));
        partition.records = Some(batch_with_header_count(base_offset, count, padding));
        replaced = true;
    })?;
    replaced.then_some(out)
}

/// An uncompressed v2 record batch at `base_offset` with one record: no key, an empty
/// value, a header count of `count`, then `padding` bytes of `0xff`. Its CRC is right.
fn batch_with_header_count(base_offset: i64, count: i32, padding: usize) -> Bytes {
    let mut record = BytesMut::with_capacity(16 + padding);
    record.put_i8(0); // attributes
    put_varint(&mut record, 0); // timestamp delta
    put_varint(&mut record, 0); // offset delta
    put_varint(&mut record, -1); // null key
    put_varint(&mut record, 0); // empty value
    put_varint(&mut record, count);
    record.put_bytes(0xff, padding);
    // Everything the CRC covers: from the attributes to the end of the batch.
    let mut covered = BytesMut::with_capacity(64 + record.len());
    covered.put_i16(0); // attributes: no compression, create time
    covered.put_i32(0); // last offset delta
    covered.put_i64(0); // base timestamp
    covered.put_i64(0); // max timestamp
    covered.put_i64(-1); // producer id
    covered.put_i16(-1); // producer epoch
    covered.put_i32(-1); // base sequence
    covered.put_i32(1); // record count
    put_varint(
        &mut covered,
        i32::try_from(record.len()).unwrap_or(i32::MAX),
    );
    covered.extend_from_slice(&record);
    let mut batch = BytesMut::with_capacity(21 + covered.len());
    batch.put_i64(base_offset);
    // Batch length: everything after this field.
    batch.put_i32(i32::try_from(4 + 1 + 4 + covered.len()).unwrap_or(i32::MAX));
    batch.put_i32(0); // partition leader epoch
    batch.put_i8(2); // magic
    batch.put_u32(crc32c(&covered));
    batch.extend_from_slice(&covered);
    batch.freeze()
}

/// CRC-32C (Castagnoli), bit by bit: the record-batch checksum.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A zigzag varint, as record fields are written.
fn put_varint(out: &mut BytesMut, value: i32) {
    put_unsigned_varint(out, ((value << 1) ^ (value >> 31)) as u32);
}

/// The size of the fixed fields before the first array of a response body, for the
/// APIs whose body starts that way.
fn bytes_before_first_array(api: ApiKey, version: i16) -> Option<usize> {
    match api {
        // error_code, then api_keys.
        ApiKey::ApiVersions => Some(2),
        // throttle_time_ms from v3, then brokers.
        ApiKey::Metadata => Some(if version >= 3 { 4 } else { 0 }),
        // throttle_time_ms (v1+), error_code and session_id (v7+), then responses.
        ApiKey::Fetch => Some(if version >= 7 { 10 } else { 4 }),
        // throttle_time_ms from v2, then topics.
        ApiKey::ListOffsets => Some(if version >= 2 { 4 } else { 0 }),
        // throttle_time_ms, then coordinators (v4+; earlier versions have no array).
        ApiKey::FindCoordinator if version >= 4 => Some(4),
        // throttle_time_ms from v3, then topics (groups from v8).
        ApiKey::OffsetFetch => Some(if version >= 3 { 4 } else { 0 }),
        _ => None,
    }
}

fn put_unsigned_varint(out: &mut BytesMut, mut value: u32) {
    while value >= 0x80 {
        out.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// Points the broker addresses of Metadata and FindCoordinator responses at the
/// proxy's listeners. Anything else, or anything that fails to decode, passes as is.
fn rewrite_addresses(
    api: ApiKey,
    version: i16,
    frame: Vec<u8>,
    ports: &HashMap<u16, u16>,
) -> Vec<u8> {
    let header_version = api.response_header_version(version);
    let rewritten = match api {
        ApiKey::Metadata => reencode::<MetadataResponse>(&frame, header_version, version, |r| {
            for b in &mut r.brokers {
                redirect(&mut b.host, &mut b.port, ports);
            }
        }),
        ApiKey::FindCoordinator => {
            reencode::<FindCoordinatorResponse>(&frame, header_version, version, |r| {
                redirect(&mut r.host, &mut r.port, ports);
                for c in &mut r.coordinators {
                    redirect(&mut c.host, &mut c.port, ports);
                }
            })
        }
        _ => None,
    };
    rewritten.unwrap_or(frame)
}

fn redirect(host: &mut StrBytes, port: &mut i32, ports: &HashMap<u16, u16>) {
    let Some(proxy) = u16::try_from(*port).ok().and_then(|p| ports.get(&p)) else {
        return;
    };
    *host = StrBytes::from_static_str("127.0.0.1");
    *port = i32::from(*proxy);
}

/// Decodes a response frame (length prefix included), edits the body and encodes it
/// again. A trailing empty tag block (the mock's Metadata quirk) is dropped.
fn reencode<R: Decodable + Encodable>(
    frame: &[u8],
    header_version: i16,
    version: i16,
    edit: impl FnOnce(&mut R),
) -> Option<Vec<u8>> {
    let mut body = Bytes::copy_from_slice(frame.get(4..)?);
    let header = ResponseHeader::decode(&mut body, header_version).ok()?;
    let mut response = R::decode(&mut body, version).ok()?;
    edit(&mut response);
    let mut inner = BytesMut::new();
    header.encode(&mut inner, header_version).ok()?;
    response.encode(&mut inner, version).ok()?;
    let mut out = Vec::with_capacity(4 + inner.len());
    out.extend_from_slice(&i32::try_from(inner.len()).ok()?.to_be_bytes());
    out.extend_from_slice(&inner);
    Some(out)
}

/// `(api_key, api_version, correlation_id)` of a request frame (length prefix included).
fn request_header(frame: &[u8]) -> Option<(i16, i16, i32)> {
    let h = frame.get(4..12)?;
    Some((
        i16::from_be_bytes([h[0], h[1]]),
        i16::from_be_bytes([h[2], h[3]]),
        i32::from_be_bytes([h[4], h[5], h[6], h[7]]),
    ))
}

/// The correlation id of a response frame (length prefix included).
fn response_correlation_id(frame: &[u8]) -> Option<i32> {
    let id = frame.get(4..8)?;
    Some(i32::from_be_bytes([id[0], id[1], id[2], id[3]]))
}

/// Reads one frame, length prefix included; `None` on EOF or a negative length. Only
/// used on the trusted legs (ottla's requests, the upstream broker's responses).
async fn read_frame(s: &mut OwnedReadHalf) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let n = usize::try_from(i32::from_be_bytes(len)).ok()?;
    let mut frame = vec![0u8; n + 4];
    frame[..4].copy_from_slice(&len);
    s.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
