//! One task per broker connection. The task owns the socket, the [`Codec`] and the
//! queue of waiting callers; everyone else talks to it through a channel.
//!
//! Guarantees:
//! - requests are pipelined up to `max_in_flight`, and answered in order;
//! - a request that outlives `request_timeout` fails with [`RequestError::Timeout`] and
//!   drops the connection (later responses could no longer be matched);
//! - an I/O error, EOF or desync fails every pending request with a typed error;
//! - reconnects back off exponentially (`reconnect.backoff.ms` up to
//!   `reconnect.backoff.max.ms`, with ±20% jitter as in the Java client);
//! - a caller that stops waiting (drops the future) costs nothing: its response is
//!   read and discarded, so the stream stays in step;
//! - no caller waits forever: besides the task's own deadlines, every call carries a
//!   backstop timeout.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, trace, warn};

use crate::config::ClientConfig;
use crate::error::{RequestError, WireError};
use crate::proto::backoff::Backoff;
use crate::proto::wire::{
    ApiVersionsOutcome, Codec, ResponseFrame, SUPPORTED, VersionTable, api_versions_request,
    decode_response, encode_body, handle_api_versions_response, negotiate,
};

/// A handle to one broker connection task. Cheap to clone; the task stops when the
/// last handle is dropped, failing whatever is still pending with
/// [`RequestError::Closed`].
#[derive(Clone)]
pub struct BrokerConnection {
    address: Arc<str>,
    tx: mpsc::Sender<Command>,
    versions: watch::Receiver<Option<Arc<VersionTable>>>,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// A little more than connect plus request timeout: the caller's own guard
    /// against a wedged task.
    backstop: Duration,
}

impl std::fmt::Debug for BrokerConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerConnection")
            .field("address", &self.address)
            .finish()
    }
}

/// Settings of a connection task, derived from [`ClientConfig`].
#[derive(Debug, Clone)]
pub(crate) struct ConnectionSettings {
    pub client_id: String,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub reconnect_backoff: Duration,
    pub reconnect_backoff_max: Duration,
    pub max_in_flight: usize,
    pub max_frame_size: usize,
    pub jitter_seed: u64,
    /// APIs without which the connection is useless; negotiation fails without them.
    pub required: Vec<ApiKey>,
}

impl ConnectionSettings {
    pub fn from_config(config: &ClientConfig, required: Vec<ApiKey>) -> Self {
        Self {
            client_id: config.client_id.clone(),
            request_timeout: config.request_timeout,
            connect_timeout: config.connect_timeout,
            reconnect_backoff: config.reconnect_backoff,
            reconnect_backoff_max: config.reconnect_backoff_max,
            max_in_flight: config.max_in_flight.max(1),
            max_frame_size: config.max_frame_size,
            jitter_seed: config.jitter_seed,
            required,
        }
    }
}

enum Command {
    /// Connect if needed and report the negotiated versions.
    Negotiate {
        respond: oneshot::Sender<Result<Arc<VersionTable>, RequestError>>,
    },
    Request(Pending),
}

struct Pending {
    api: ApiKey,
    version: i16,
    body: Bytes,
    expects_response: bool,
    /// How long the broker may take once the request is written.
    timeout: Duration,
    deadline: Instant,
    respond: oneshot::Sender<Result<ResponseFrame, RequestError>>,
}

impl BrokerConnection {
    /// Starts the task for the broker at `address` (`host:port`). It connects lazily,
    /// on the first request.
    pub(crate) fn spawn(address: &str, settings: Arc<ConnectionSettings>) -> Self {
        // Twice the in-flight cap: enough to keep the pipeline full, small enough that a
        // stalled broker pushes back on callers instead of buffering without limit.
        let (tx, rx) = mpsc::channel(settings.max_in_flight * 2);
        let (versions_tx, versions) = watch::channel(None);
        let address: Arc<str> = Arc::from(address);
        let (connect_timeout, request_timeout) =
            (settings.connect_timeout, settings.request_timeout);
        let backstop = connect_timeout + request_timeout + Duration::from_secs(1);
        let seed = settings.jitter_seed ^ fxhash(address.as_bytes());
        let backoff = Backoff::new(
            settings.reconnect_backoff,
            settings.reconnect_backoff_max,
            seed,
        );
        let task = Task {
            address: address.clone(),
            settings,
            rx,
            versions_tx,
            failures: 0,
            connect_not_before: None,
            backoff,
        };
        tokio::spawn(task.run());
        Self {
            address,
            tx,
            versions,
            connect_timeout,
            request_timeout,
            backstop,
        }
    }

    /// The broker's `host:port`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The version table of the current (or last) connection, connecting first if the
    /// task never has.
    pub async fn versions(&self) -> Result<Arc<VersionTable>, RequestError> {
        if let Some(table) = self.versions.borrow().clone() {
            return Ok(table);
        }
        let (respond, rx) = oneshot::channel();
        self.submit(
            ApiKey::ApiVersions,
            Command::Negotiate { respond },
            rx,
            self.backstop,
        )
        .await
    }

    /// Sends `request` at the highest version negotiated for its API and decodes the
    /// response.
    pub async fn send<R: Request>(&self, request: &R) -> Result<R::Response, RequestError> {
        let api = api_of::<R>();
        let table = self.versions().await?;
        let Some(version) = table.version(api) else {
            return Err(RequestError::UnsupportedVersion {
                broker: self.address.to_string(),
                api,
                version: -1,
                negotiated: "none".into(),
            });
        };
        self.send_version(request, version).await
    }

    /// Sends `request` encoded at `version`, which must be the negotiated version or
    /// lower within the broker's range, and decodes the response.
    pub async fn send_version<R: Request>(
        &self,
        request: &R,
        version: i16,
    ) -> Result<R::Response, RequestError> {
        let api = api_of::<R>();
        let frame = self.send_raw(api, version, request, true).await?;
        decode_response::<R::Response>(api, version, frame.body).map_err(|source| {
            RequestError::Wire {
                broker: self.address.to_string(),
                source,
            }
        })
    }

    /// Sends an already typed request and returns the raw response frame; for callers
    /// that decode lazily (fetch) or expect no response (`acks = 0`, which resolves
    /// once the request is queued for writing, with an empty body).
    pub async fn send_raw<R: Request>(
        &self,
        api: ApiKey,
        version: i16,
        request: &R,
        expects_response: bool,
    ) -> Result<ResponseFrame, RequestError> {
        self.send_raw_timeout(api, version, request, expects_response, None)
            .await
    }

    /// Like [`BrokerConnection::send_raw`] with a request timeout of its own, for
    /// requests the broker may legitimately hold (JoinGroup waits up to the rebalance
    /// timeout, so the Java client gives it `rebalance timeout + 5 s`).
    pub async fn send_raw_timeout<R: Request>(
        &self,
        api: ApiKey,
        version: i16,
        request: &R,
        expects_response: bool,
        timeout: Option<Duration>,
    ) -> Result<ResponseFrame, RequestError> {
        let body = encode_body(api, request, version).map_err(|source| RequestError::Wire {
            broker: self.address.to_string(),
            source,
        })?;
        let (respond, rx) = oneshot::channel();
        let timeout = timeout.unwrap_or(self.request_timeout);
        let pending = Pending {
            api,
            version,
            body,
            expects_response,
            timeout,
            // The deadline starts now: time spent waiting for a connection counts too.
            deadline: Instant::now() + self.connect_timeout + timeout,
            respond,
        };
        let backstop = self.connect_timeout + timeout + Duration::from_secs(1);
        self.submit(api, Command::Request(pending), rx, backstop)
            .await
    }

    async fn submit<T>(
        &self,
        api: ApiKey,
        command: Command,
        rx: oneshot::Receiver<Result<T, RequestError>>,
        backstop: Duration,
    ) -> Result<T, RequestError> {
        let closed = || RequestError::Closed {
            broker: self.address.to_string(),
        };
        let wait = async {
            self.tx.send(command).await.map_err(|_| closed())?;
            rx.await.map_err(|_| closed())?
        };
        match tokio::time::timeout(backstop, wait).await {
            Ok(result) => result,
            Err(_) => Err(RequestError::Timeout {
                broker: self.address.to_string(),
                api,
                after: backstop,
            }),
        }
    }
}

fn api_of<R: Request>() -> ApiKey {
    // Every `Request` implementor's KEY is a known API key.
    ApiKey::try_from(R::KEY).unwrap_or(ApiKey::ApiVersions)
}

/// Why a served connection ended.
enum End {
    /// The connection broke; reconnect on the next request.
    Broken,
    /// Every handle is gone; stop the task.
    Shutdown,
}

struct Task {
    address: Arc<str>,
    settings: Arc<ConnectionSettings>,
    rx: mpsc::Receiver<Command>,
    versions_tx: watch::Sender<Option<Arc<VersionTable>>>,
    failures: u32,
    connect_not_before: Option<Instant>,
    backoff: Backoff,
}

/// One waiting caller of a request on the wire.
struct Waiter {
    correlation_id: i32,
    api: ApiKey,
    timeout: Duration,
    deadline: Instant,
    respond: oneshot::Sender<Result<ResponseFrame, RequestError>>,
}

impl Task {
    async fn run(mut self) {
        loop {
            // Disconnected: connect only when someone needs the connection.
            let Some(first) = self.rx.recv().await else {
                return;
            };
            let mut queue = VecDeque::from([first]);
            if let Some(at) = self.connect_not_before {
                tokio::time::sleep_until(at).await;
            }
            match self.connect().await {
                Ok((stream, codec, table)) => {
                    self.failures = 0;
                    self.versions_tx.send_replace(Some(table.clone()));
                    let end = self.serve(stream, codec, table, queue).await;
                    if matches!(end, End::Shutdown) {
                        return;
                    }
                    // Back off after a broken connection too, so a broker that accepts
                    // and drops connections is not hammered.
                    self.failures = 1;
                    self.connect_not_before = Some(Instant::now() + self.backoff());
                }
                Err(err) => {
                    self.failures = self.failures.saturating_add(1);
                    let backoff = self.backoff();
                    warn!(broker = %self.address, error = %err, ?backoff, "connect failed");
                    self.connect_not_before = Some(Instant::now() + backoff);
                    // Fail everything queued so far; later requests trigger a new attempt.
                    while let Ok(cmd) = self.rx.try_recv() {
                        queue.push_back(cmd);
                    }
                    for cmd in queue {
                        fail_command(cmd, err.clone());
                    }
                }
            }
        }
    }

    /// The reconnect delay after `failures` consecutive failures:
    /// `reconnect.backoff.ms * 2^(failures-1)`, capped, with ±20% jitter.
    fn backoff(&mut self) -> Duration {
        self.backoff.delay(self.failures)
    }

    /// TCP connect, then ApiVersions negotiation, all within `connect_timeout`.
    async fn connect(&mut self) -> Result<(TcpStream, Codec, Arc<VersionTable>), RequestError> {
        let connect_err = |reason: String| RequestError::Connect {
            broker: self.address.to_string(),
            reason,
        };
        let attempt = async {
            let mut version = SUPPORTED
                .iter()
                .find(|(api, _, _)| *api == ApiKey::ApiVersions)
                .map(|(_, _, max)| *max)
                .unwrap_or(0);
            // A broker may hang up after refusing a version (then reconnect at the version
            // it allowed), or hang up without answering, as brokers older than ApiVersions
            // do (then reconnect one version lower).
            for _ in 0..4 {
                let mut stream = TcpStream::connect(&*self.address)
                    .await
                    .map_err(|e| connect_err(e.to_string()))?;
                let _ = stream.set_nodelay(true);
                let mut codec =
                    Codec::new(Some(&self.settings.client_id), self.settings.max_frame_size);
                let mut rbuf = BytesMut::with_capacity(8 * 1024);
                let mut refused_here = false;
                loop {
                    let mut out = BytesMut::new();
                    codec
                        .encode_request(
                            ApiKey::ApiVersions,
                            version,
                            &api_versions_request(version),
                            true,
                            &mut out,
                        )
                        .map_err(|e| connect_err(e.to_string()))?;
                    let exchange = async {
                        stream.write_all(&out).await?;
                        read_frame(&mut stream, &mut codec, &mut rbuf).await
                    };
                    let frame = match exchange.await {
                        Ok(frame) => frame,
                        Err(ReadError::Eof | ReadError::Io(_)) if refused_here => break,
                        Err(ReadError::Eof | ReadError::Io(_)) if version > 0 => {
                            version -= 1;
                            break;
                        }
                        Err(e) => return Err(connect_err(e.to_string())),
                    };
                    match handle_api_versions_response(version, frame.body) {
                        Ok(ApiVersionsOutcome::Retry { version: lower }) => {
                            debug!(broker = %self.address, from = version, to = lower, "ApiVersions version refused; retrying lower");
                            version = lower;
                            refused_here = true;
                        }
                        Ok(ApiVersionsOutcome::Done(response)) => {
                            if response.error_code != 0 {
                                return Err(RequestError::Negotiation {
                                    broker: self.address.to_string(),
                                    source: crate::error::NegotiationError::Broker {
                                        code: response.error_code,
                                    },
                                });
                            }
                            let table = negotiate(&response, &self.settings.required).map_err(
                                |source| RequestError::Negotiation {
                                    broker: self.address.to_string(),
                                    source,
                                },
                            )?;
                            debug!(broker = %self.address, api_versions = version, "connected");
                            return Ok((stream, codec, Arc::new(table)));
                        }
                        Err(e) => return Err(connect_err(e.to_string())),
                    }
                }
            }
            Err(connect_err(
                "broker kept closing the connection during ApiVersions".into(),
            ))
        };
        match tokio::time::timeout(self.settings.connect_timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(connect_err(format!(
                "no connection within {:?}",
                self.settings.connect_timeout
            ))),
        }
    }

    /// Runs one established connection until it breaks or every handle is dropped.
    async fn serve(
        &mut self,
        mut stream: TcpStream,
        mut codec: Codec,
        table: Arc<VersionTable>,
        mut queue: VecDeque<Command>,
    ) -> End {
        let broker = self.address.to_string();
        let (mut rd, mut wr) = stream.split();
        let mut rbuf = BytesMut::with_capacity(64 * 1024);
        let mut wbuf = BytesMut::new();
        let mut waiting: VecDeque<Waiter> = VecDeque::new();
        let cap = self.settings.max_in_flight;
        let mut channel_open = true;

        // Fails every waiter and reports why the connection ended.
        let fail_all =
            |waiting: &mut VecDeque<Waiter>, queue: &mut VecDeque<Command>, err: RequestError| {
                for w in waiting.drain(..) {
                    let _ = w.respond.send(Err(err.clone()));
                }
                for cmd in queue.drain(..) {
                    fail_command(cmd, err.clone());
                }
            };

        loop {
            // Move queued commands onto the wire while the pipeline has room.
            while waiting.len() < cap {
                let Some(cmd) = queue.pop_front() else { break };
                match cmd {
                    Command::Negotiate { respond } => {
                        let _ = respond.send(Ok(table.clone()));
                    }
                    Command::Request(p) => {
                        if let Err(err) = check_version(&broker, &table, p.api, p.version) {
                            let _ = p.respond.send(Err(err));
                            continue;
                        }
                        if Instant::now() >= p.deadline {
                            let _ = p.respond.send(Err(RequestError::Timeout {
                                broker: broker.clone(),
                                api: p.api,
                                after: p.timeout,
                            }));
                            continue;
                        }
                        match codec.encode_raw(
                            p.api,
                            p.version,
                            &p.body,
                            p.expects_response,
                            &mut wbuf,
                        ) {
                            Ok(id) => {
                                trace!(broker = %broker, api = ?p.api, version = p.version, correlation_id = id.0, "request queued");
                                if p.expects_response {
                                    let deadline = (Instant::now() + p.timeout).min(p.deadline);
                                    waiting.push_back(Waiter {
                                        correlation_id: id.0,
                                        api: p.api,
                                        timeout: p.timeout,
                                        deadline,
                                        respond: p.respond,
                                    });
                                } else {
                                    let _ = p.respond.send(Ok(ResponseFrame {
                                        request: crate::proto::wire::InFlight {
                                            correlation_id: id,
                                            api: p.api,
                                            version: p.version,
                                        },
                                        body: Bytes::new(),
                                    }));
                                }
                            }
                            Err(source) => {
                                let _ = p.respond.send(Err(RequestError::Wire {
                                    broker: broker.clone(),
                                    source,
                                }));
                            }
                        }
                    }
                }
            }
            if !channel_open && waiting.is_empty() && queue.is_empty() && wbuf.is_empty() {
                return End::Shutdown;
            }
            let next_deadline = waiting.iter().map(|w| w.deadline).min();
            let accept = channel_open && waiting.len() < cap && queue.is_empty();

            tokio::select! {
                read = rd.read_buf(&mut rbuf) => {
                    let failure = match read {
                        Ok(0) => Some(RequestError::Disconnected { broker: broker.clone(), reason: "closed by broker".into() }),
                        Err(e) => Some(RequestError::Disconnected { broker: broker.clone(), reason: e.to_string() }),
                        Ok(_) => deliver_frames(&mut codec, &mut rbuf, &mut waiting)
                            .err()
                            .map(|source| RequestError::Wire { broker: broker.clone(), source }),
                    };
                    if let Some(err) = failure {
                        // Worth a warning only if someone still waits for an answer;
                        // a client shutting down leaves requests nobody reads.
                        let waited_for = waiting.iter().filter(|w| !w.respond.is_closed()).count();
                        if waited_for > 0 {
                            warn!(broker = %broker, error = %err, pending = waited_for, "connection dropped");
                        } else {
                            debug!(broker = %broker, error = %err, "connection dropped with no caller waiting");
                        }
                        fail_all(&mut waiting, &mut queue, err);
                        return End::Broken;
                    }
                }
                written = wr.write_buf(&mut wbuf), if !wbuf.is_empty() => {
                    if let Err(e) = written {
                        let err = RequestError::Disconnected { broker: broker.clone(), reason: e.to_string() };
                        warn!(broker = %broker, error = %err, "write failed");
                        fail_all(&mut waiting, &mut queue, err);
                        return End::Broken;
                    }
                }
                cmd = self.rx.recv(), if accept => {
                    match cmd {
                        Some(cmd) => queue.push_back(cmd),
                        None => channel_open = false,
                    }
                }
                _ = super::sleep_until(next_deadline), if next_deadline.is_some() => {
                    let now = Instant::now();
                    let Some(api) = waiting.iter().find(|w| w.deadline <= now).map(|w| w.api) else {
                        continue;
                    };
                    warn!(broker = %broker, api = ?api, "request timed out; dropping the connection");
                    // The expired requests fail with Timeout, the others with Disconnected.
                    let reason = format!("dropped after a {api:?} request timed out");
                    for w in waiting.drain(..) {
                        let err = if w.deadline <= now {
                            RequestError::Timeout { broker: broker.clone(), api: w.api, after: w.timeout }
                        } else {
                            RequestError::Disconnected { broker: broker.clone(), reason: reason.clone() }
                        };
                        let _ = w.respond.send(Err(err));
                    }
                    fail_all(&mut waiting, &mut queue, RequestError::Disconnected { broker: broker.clone(), reason });
                    return End::Broken;
                }
            }
        }
    }
}

/// Hands every complete response in `rbuf` to its waiter. The codec matches each
/// response to the oldest in-flight request, which is the front waiter by construction.
fn deliver_frames(
    codec: &mut Codec,
    rbuf: &mut BytesMut,
    waiting: &mut VecDeque<Waiter>,
) -> Result<(), WireError> {
    while let Some(frame) = codec.decode_frame(rbuf)? {
        let Some(w) = waiting.pop_front() else {
            return Err(WireError::Unsolicited {
                correlation_id: frame.request.correlation_id.0,
            });
        };
        debug_assert_eq!(w.correlation_id, frame.request.correlation_id.0);
        let _ = w.respond.send(Ok(frame));
    }
    Ok(())
}

fn check_version(
    broker: &str,
    table: &VersionTable,
    api: ApiKey,
    version: i16,
) -> Result<(), RequestError> {
    let usable = match (table.version(api), table.broker_range(api)) {
        (Some(chosen), Some(range)) => version >= range.min && version <= chosen,
        _ => false,
    };
    if usable {
        return Ok(());
    }
    Err(RequestError::UnsupportedVersion {
        broker: broker.to_string(),
        api,
        version,
        negotiated: table
            .version(api)
            .map(|v| format!("up to v{v}"))
            .unwrap_or_else(|| "none".into()),
    })
}

fn fail_command(cmd: Command, err: RequestError) {
    match cmd {
        Command::Negotiate { respond } => {
            let _ = respond.send(Err(err));
        }
        Command::Request(p) => {
            let _ = p.respond.send(Err(err));
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("connection closed")]
    Eof,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Wire(#[from] WireError),
}

async fn read_frame(
    stream: &mut TcpStream,
    codec: &mut Codec,
    rbuf: &mut BytesMut,
) -> Result<ResponseFrame, ReadError> {
    loop {
        if let Some(frame) = codec.decode_frame(rbuf)? {
            return Ok(frame);
        }
        if stream.read_buf(rbuf).await? == 0 {
            return Err(ReadError::Eof);
        }
    }
}

/// A small, stable hash so each connection's jitter differs but stays replayable.
fn fxhash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
