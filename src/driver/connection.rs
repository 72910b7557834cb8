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
//!   backstop timeout;
//! - with `SSL`/`SASL_SSL` the stream is TLS, and with `SASL_*` the connection
//!   authenticates after ApiVersions, before any other request;
//! - a TLS or authentication failure is configuration, not a passing fault: the next
//!   attempt waits the longest reconnect backoff, and callers in between get the same
//!   typed error at once (no tight loop, no silent retrying);
//! - when the broker gives a SASL session lifetime (KIP-368), the connection
//!   re-authenticates at 85-95% of it: it stops writing, lets the requests on the wire
//!   finish, re-authenticates, and goes on, so nothing is lost or reordered. A broker
//!   that refuses re-authentication gets a fresh connection instead, with the waiting
//!   requests carried over in order;
//! - a connection that carried no request for `connections.max.idle.ms` is closed
//!   quietly ([`IdleClock`]): no caller sees an error, no backoff is armed, and the
//!   next request connects again; with `socket.keepalive.enable` every socket has
//!   `SO_KEEPALIVE`;
//! - a listener that seems to speak another `security.protocol` is named, with the
//!   likely value ([`RequestError::WrongSecurityProtocol`], `proto::wire::listener`);
//! - a broker that closes the connection on the same request at the same version
//!   [`HANGUPS_BEFORE_DIAGNOSIS`] times in a row, each time after a good connect and
//!   ApiVersions, is diagnosed: a warning names the API, the version and the broker,
//!   clients report a [`BrokerHangUp`], and later connections to that broker use the
//!   next lower version both sides support, if there is one. This is how a broker
//!   that advertises a version it cannot parse looks from here (the librdkafka mock
//!   and the flexible group APIs).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Request, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, info, trace, warn};

use super::auth::Authenticator;
use super::stream::BrokerStream;
use crate::config::ClientConfig;
use crate::error::{AuthError, Error, RequestError, TlsFailure, WireError};
use crate::proto::backoff::Backoff;
use crate::proto::sasl::Step;
use crate::proto::wire::listener::{self, Configured, Evidence};
use crate::proto::wire::{
    ApiVersionsOutcome, Codec, ResponseFrame, SUPPORTED, VersionTable, api_versions_request,
    decode_response, encode_body, handle_api_versions_response, negotiate,
};
use crate::security::SecurityProtocol;

/// A handle to one broker connection task. Cheap to clone; the task stops when the
/// last handle is dropped, failing whatever is still pending with
/// [`RequestError::Closed`].
#[derive(Clone)]
pub struct BrokerConnection {
    address: Arc<str>,
    tx: mpsc::Sender<Command>,
    load: Arc<Load>,
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

/// How busy and how healthy a connection is, as its task last saw it: what the
/// cluster needs to pick the least-loaded live broker (the Java client's
/// `leastLoadedNode`).
#[derive(Debug)]
struct Load {
    /// Connected and negotiated.
    ready: AtomicBool,
    /// Requests written and unanswered, plus those queued behind them.
    in_flight: AtomicUsize,
    /// The last attempt failed (or the connection broke): no new attempt before this.
    backoff_until: Mutex<Option<Instant>>,
    /// When the oldest unanswered request went out, in milliseconds since `since`
    /// plus one (0: none); an atomic, as the serving loop stores it on every turn.
    oldest: AtomicU64,
    since: Instant,
    /// Bumped by [`BrokerConnection::disconnect`]: the live connection closes.
    abort: watch::Sender<u64>,
}

impl Load {
    fn new() -> Self {
        Self {
            ready: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            backoff_until: Mutex::new(None),
            oldest: AtomicU64::new(0),
            since: Instant::now(),
            abort: watch::Sender::new(0),
        }
    }
}

/// How a connection ranks for a request any broker can answer, lowest first: a
/// ready connection by its load, then one that may connect now, then a stalled one by
/// how long its oldest request has waited, then one still in its reconnect backoff by
/// the time left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rank {
    /// Connected, with this many requests in flight, none waiting longer than
    /// [`STALLED_AFTER`].
    Ready(usize),
    /// Not connected; an attempt may start now.
    Idle,
    /// Connected, but its oldest request has waited this long, more than
    /// [`STALLED_AFTER`]: a broker gone silent looks like this (it takes requests and
    /// answers none), and a new connection elsewhere is the better bet.
    Stalled(Duration),
    /// The last attempt failed; the next may start after this long.
    BackingOff(Duration),
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
    /// TLS, when `security.protocol` is `SSL` or `SASL_SSL`.
    #[cfg(feature = "tls-core")]
    pub tls: Option<super::tls::TlsConnector>,
    /// SASL, when `security.protocol` is `SASL_PLAINTEXT` or `SASL_SSL`.
    pub sasl: Option<Arc<Authenticator>>,
    /// Where connections report TLS and authentication failures, for the clients to
    /// surface.
    pub alarm: Arc<SecurityAlarm>,
    /// Where connections report brokers that keep hanging up on one request.
    pub hangups: Arc<HangUpReports>,
    /// `security.protocol`, for the advice when a listener seems to speak another.
    pub security_protocol: SecurityProtocol,
    /// `connections.max.idle.ms`, Azure's limit applied ([`max_idle`]); `None`: never.
    pub max_idle: Option<Duration>,
    /// `socket.keepalive.enable`.
    pub keepalive: bool,
}

impl ConnectionSettings {
    /// The settings of every connection of one client. Loads the TLS files (an error
    /// names the setting) and logs what deserves a warning about the security settings.
    pub fn from_config(config: &ClientConfig, required: Vec<ApiKey>) -> Result<Self, Error> {
        let protocol = config.security_protocol;
        if protocol.uses_tls() && !config.tls.verifies_hostname() {
            warn!(
                "ssl.endpoint.identification.algorithm=none: broker host names are NOT verified, so any holder of a certificate from the trusted roots can impersonate a broker"
            );
        }
        if !protocol.uses_sasl() && config.sasl.is_some() {
            warn!(security_protocol = %protocol, "SASL settings are given but security.protocol does not use SASL; they are ignored");
        }
        let sasl = match (&config.sasl, protocol.uses_sasl()) {
            (Some(sasl), true) => {
                let sasl = sasl.resolve()?;
                if protocol == SecurityProtocol::SaslPlaintext
                    && sasl.mechanism == Some(crate::proto::sasl::Mechanism::Plain)
                {
                    warn!(
                        "sasl.mechanism=PLAIN over SASL_PLAINTEXT sends the password in clear text; use SASL_SSL"
                    );
                }
                Some(Arc::new(Authenticator::new(sasl)))
            }
            _ => None,
        };
        Ok(Self {
            client_id: config.client_id.clone(),
            request_timeout: config.request_timeout,
            connect_timeout: config.connect_timeout,
            reconnect_backoff: config.reconnect_backoff,
            reconnect_backoff_max: config.reconnect_backoff_max,
            max_in_flight: config.max_in_flight.max(1),
            max_frame_size: config.max_frame_size,
            jitter_seed: config.jitter_seed,
            required,
            #[cfg(feature = "tls-core")]
            tls: if protocol.uses_tls() {
                Some(super::tls::TlsConnector::new(&config.tls)?)
            } else {
                None
            },
            sasl,
            alarm: Arc::new(SecurityAlarm::default()),
            hangups: Arc::new(HangUpReports::default()),
            security_protocol: protocol,
            max_idle: max_idle(
                config.connections_max_idle,
                config.bootstrap_servers.iter().map(String::as_str),
            ),
            keepalive: config.socket_keepalive,
        })
    }
}

pub use crate::proto::wire::lifecycle::HANGUPS_BEFORE_DIAGNOSIS;
use crate::proto::wire::lifecycle::{
    HANDSHAKE_GRACE, HANGUP_REPORTS_KEPT, IdleClock, STALLED_AFTER, backstop, max_idle,
    reauth_point, request_queue,
};

/// A broker kept closing the connection on one request at one version, after good
/// connects and ApiVersions exchanges: most likely it advertises a version it cannot
/// parse.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BrokerHangUp {
    /// The broker's `host:port`.
    pub broker: String,
    /// The request it hung up on.
    pub api: ApiKey,
    /// At this version.
    pub version: i16,
    /// Consecutive hang-ups on it.
    pub hangups: u32,
    /// The version ottla uses for this API with this broker from now on, if a lower one
    /// is common to both sides; `None`: there is none, and the request keeps failing.
    pub stepped_down_to: Option<i16>,
}

impl std::fmt::Display for BrokerHangUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} closed the connection on {:?} v{} {} times in a row",
            self.broker, self.api, self.version, self.hangups
        )?;
        match self.stepped_down_to {
            Some(v) => write!(f, "; using v{v} from now on"),
            None => write!(
                f,
                "; no lower version is common to both sides, so it keeps failing"
            ),
        }
    }
}

/// State that the connections write and the clients watch: each report bumps a
/// counter that the clients' `watch` receivers see.
#[derive(Debug)]
pub(crate) struct Watched<T> {
    state: Mutex<T>,
    changes: watch::Sender<u64>,
}

impl<T: Default> Default for Watched<T> {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            changes: watch::channel(0).0,
        }
    }
}

impl<T> Watched<T> {
    /// Changes the state and tells the watchers.
    fn report(&self, change: impl FnOnce(&mut T)) {
        change(&mut super::lock(&self.state));
        self.changes.send_modify(|n| *n += 1);
    }

    /// Changes the state without telling anyone.
    fn quietly(&self, change: impl FnOnce(&mut T)) {
        change(&mut super::lock(&self.state));
    }

    fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&super::lock(&self.state))
    }

    /// A receiver that sees every report from now on.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

/// Where connections report [`BrokerHangUp`]s, for the clients to surface.
pub(crate) type HangUpReports = Watched<HangUpLog>;

/// The latest [`HANGUP_REPORTS_KEPT`] reports: a broker that keeps hanging up at a
/// version with none below it is reported again every few hang-ups, for as long as
/// the client runs.
#[derive(Debug, Default)]
pub(crate) struct HangUpLog {
    /// Reports dropped from the front so far: the number of the first one kept.
    dropped: usize,
    recent: VecDeque<BrokerHangUp>,
}

impl HangUpReports {
    fn raise(&self, report: BrokerHangUp) {
        self.report(|log| {
            if log.recent.len() == HANGUP_REPORTS_KEPT {
                log.recent.pop_front();
                log.dropped += 1;
            }
            log.recent.push_back(report);
        });
    }

    /// The reports from the `seen`-th on that are still kept; `seen` moves past them.
    pub(crate) fn since(&self, seen: &mut usize) -> Vec<BrokerHangUp> {
        self.read(|log| {
            let skip = seen.saturating_sub(log.dropped);
            let new = log.recent.iter().skip(skip).cloned().collect();
            *seen = log.dropped + log.recent.len();
            new
        })
    }
}

/// The latest TLS or authentication failure of each broker whose last connection
/// attempt failed that way; a successful connection clears its broker's entry.
pub(crate) type SecurityAlarm = Watched<BTreeMap<String, RequestError>>;

impl SecurityAlarm {
    fn raise(&self, broker: &str, err: &RequestError) {
        self.report(|failures| {
            failures.insert(broker.to_string(), err.clone());
        });
    }

    fn clear(&self, broker: &str) {
        self.quietly(|failures| {
            failures.remove(broker);
        });
    }

    /// Any standing failure.
    pub(crate) fn any(&self) -> Option<RequestError> {
        self.read(|failures| failures.values().next().cloned())
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
        let (tx, rx) = mpsc::channel(request_queue(settings.max_in_flight));
        let (versions_tx, versions) = watch::channel(None);
        let address: Arc<str> = Arc::from(address);
        let (connect_timeout, request_timeout) =
            (settings.connect_timeout, settings.request_timeout);
        let backstop = backstop(connect_timeout, request_timeout);
        let seed = settings.jitter_seed ^ fxhash(address.as_bytes());
        let backoff = Backoff::new(
            settings.reconnect_backoff,
            settings.reconnect_backoff_max,
            seed,
        );
        let load = Arc::new(Load::new());
        let task = Task {
            address: address.clone(),
            load: load.clone(),
            settings,
            rx,
            versions_tx,
            failures: 0,
            connect_not_before: None,
            backoff,
            refused: None,
            hangups: HashMap::new(),
            caps: HashMap::new(),
        };
        tokio::spawn(task.run());
        Self {
            address,
            tx,
            load,
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

    /// Closes the live connection, if any: the requests on it fail at once with
    /// [`RequestError::Disconnected`], and the next request connects again (after the
    /// reconnect backoff). For a coordinator given up on: the Java client disconnects
    /// from it too, so nothing waits on a connection to a host that went silent.
    pub(crate) fn disconnect(&self) {
        self.load.abort.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// How this connection ranks for a request any broker can answer ([`Rank`]).
    pub(crate) fn rank(&self) -> Rank {
        if self.load.ready.load(Ordering::Relaxed) {
            let waited = match self.load.oldest.load(Ordering::Relaxed) {
                0 => Duration::ZERO,
                at => self
                    .load
                    .since
                    .elapsed()
                    .saturating_sub(Duration::from_millis(at - 1)),
            };
            if waited > STALLED_AFTER {
                return Rank::Stalled(waited);
            }
            return Rank::Ready(self.load.in_flight.load(Ordering::Relaxed));
        }
        let until = self.load.backoff_until.lock().ok().and_then(|u| *u);
        match until.map(|u| u.saturating_duration_since(Instant::now())) {
            Some(left) if !left.is_zero() => Rank::BackingOff(left),
            _ => Rank::Idle,
        }
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
        let backstop = backstop(self.connect_timeout, timeout);
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
    /// The connection broke; reconnect on the next request. `hung_up_on`: the broker
    /// closed it while this request (the oldest unanswered, the one it was reading)
    /// waited for its answer.
    Broken { hung_up_on: Option<(ApiKey, i16)> },
    /// Every handle is gone; stop the task.
    Shutdown,
    /// Nothing went over the connection for `connections.max.idle.ms`: it was closed,
    /// and the next request opens a new one, at once.
    Idle,
    /// The SASL session is ending and the pipeline has drained: re-authenticate, then
    /// serve these waiting commands.
    Reauthenticate(VecDeque<Command>),
}

/// An open, negotiated (and authenticated) connection.
struct Connected {
    stream: BrokerStream,
    codec: Codec,
    table: Arc<VersionTable>,
    /// When to re-authenticate (KIP-368), if the broker gave a session lifetime.
    reauth_at: Option<Instant>,
}

struct Task {
    address: Arc<str>,
    load: Arc<Load>,
    settings: Arc<ConnectionSettings>,
    rx: mpsc::Receiver<Command>,
    versions_tx: watch::Sender<Option<Arc<VersionTable>>>,
    failures: u32,
    connect_not_before: Option<Instant>,
    backoff: Backoff,
    /// A TLS or authentication failure, and until when it answers every command
    /// without a new attempt.
    refused: Option<(RequestError, Instant)>,
    /// Per API: the version the broker last hung up on, and how many times in a row.
    /// An answer to the API clears it.
    hangups: HashMap<ApiKey, (i16, u32)>,
    /// Versions stepped down to after repeated hang-ups, applied to every negotiation
    /// with this broker.
    caps: HashMap<ApiKey, i16>,
}

/// One waiting caller of a request on the wire.
struct Waiter {
    correlation_id: i32,
    api: ApiKey,
    version: i16,
    timeout: Duration,
    deadline: Instant,
    /// When it was put on the wire.
    written: Instant,
    respond: oneshot::Sender<Result<ResponseFrame, RequestError>>,
}

impl Task {
    async fn run(mut self) {
        // Commands carried over from a connection that is being replaced.
        let mut carried: VecDeque<Command> = VecDeque::new();
        loop {
            let mut queue = if carried.is_empty() {
                // Disconnected: connect only when someone needs the connection.
                let Some(first) = self.rx.recv().await else {
                    return;
                };
                VecDeque::from([first])
            } else {
                std::mem::take(&mut carried)
            };
            // A security failure stands until its backoff ends: answer at once with it.
            if let Some((err, until)) = &self.refused {
                if Instant::now() < *until {
                    for cmd in queue {
                        fail_command(cmd, err.clone());
                    }
                    continue;
                }
            }
            if let Some(at) = self.connect_not_before {
                tokio::time::sleep_until(at).await;
            }
            match self.connect().await {
                Ok(Connected {
                    mut stream,
                    mut codec,
                    table,
                    mut reauth_at,
                }) => {
                    self.failures = 0;
                    self.refused = None;
                    self.set_ready(None);
                    self.settings.alarm.clear(&self.address);
                    self.versions_tx.send_replace(Some(table.clone()));
                    let end = loop {
                        let end = self
                            .serve(&mut stream, &mut codec, &table, queue, reauth_at)
                            .await;
                        let End::Reauthenticate(waiting) = end else {
                            break end;
                        };
                        queue = waiting;
                        match self.reauthenticate(&mut stream, &mut codec, &table).await {
                            Ok(next) => {
                                debug!(broker = %self.address, "re-authenticated");
                                reauth_at = next;
                            }
                            Err(err) => {
                                // Some brokers announce a session lifetime but refuse a
                                // second handshake: a fresh connection does the same job.
                                info!(broker = %self.address, error = %err, "re-authentication failed; reconnecting");
                                break End::Reauthenticate(queue);
                            }
                        }
                    };
                    match end {
                        End::Shutdown => {
                            self.load.ready.store(false, Ordering::Relaxed);
                            return;
                        }
                        End::Reauthenticate(waiting) => {
                            carried = waiting;
                            self.connect_not_before = None;
                        }
                        End::Idle => {
                            // Not a failure: no backoff, and no attempt until a request
                            // needs the broker.
                            self.connect_not_before = None;
                            self.set_ready_state(false, None);
                        }
                        End::Broken { hung_up_on } => {
                            if let Some((api, version)) = hung_up_on {
                                self.hung_up(&table, api, version);
                            }
                            // Back off after a broken connection too, so a broker that
                            // accepts and drops connections is not hammered.
                            self.failures = 1;
                            self.connect_not_before = Some(Instant::now() + self.backoff());
                            self.set_ready(self.connect_not_before);
                        }
                    }
                }
                Err(err) => {
                    self.failures = self.failures.saturating_add(1);
                    let backoff = if err.is_security() {
                        // Configuration, not a passing fault: wait the longest backoff,
                        // and answer everyone meanwhile with the error.
                        let wait = self.settings.reconnect_backoff_max;
                        self.refused = Some((err.clone(), Instant::now() + wait));
                        self.settings.alarm.raise(&self.address, &err);
                        wait
                    } else {
                        self.backoff()
                    };
                    warn!(broker = %self.address, error = %err, ?backoff, "connect failed");
                    self.connect_not_before = Some(Instant::now() + backoff);
                    self.set_ready(self.connect_not_before);
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

    /// Counts a hang-up on `api` at `version`; the [`HANGUPS_BEFORE_DIAGNOSIS`]th in a
    /// row is reported and steps the API down for this broker.
    fn hung_up(&mut self, table: &VersionTable, api: ApiKey, version: i16) {
        let count = match self.hangups.get(&api) {
            Some((v, n)) if *v == version => n + 1,
            _ => 1,
        };
        if count < HANGUPS_BEFORE_DIAGNOSIS {
            self.hangups.insert(api, (version, count));
            return;
        }
        self.hangups.remove(&api);
        // The table as capped one version lower, if that is still common to both.
        let stepped_down_to = version
            .checked_sub(1)
            .and_then(|below| table.clone().cap(api, below));
        if let Some(v) = stepped_down_to {
            self.caps.insert(api, v);
        }
        let report = BrokerHangUp {
            broker: self.address.to_string(),
            api,
            version,
            hangups: count,
            stepped_down_to,
        };
        warn!(broker = %self.address, api = ?api, version, hangups = count, stepped_down_to = ?stepped_down_to,
            "{report}: the broker most likely advertises a version it cannot parse");
        self.settings.hangups.raise(report);
    }

    /// Ready (`None`), or down until `backoff_until`.
    fn set_ready(&self, backoff_until: Option<Instant>) {
        self.set_ready_state(backoff_until.is_none(), backoff_until);
    }

    fn set_ready_state(&self, ready: bool, backoff_until: Option<Instant>) {
        self.load.ready.store(ready, Ordering::Relaxed);
        self.load.in_flight.store(0, Ordering::Relaxed);
        if let Ok(mut until) = self.load.backoff_until.lock() {
            *until = backoff_until;
        }
    }

    /// The reconnect delay after `failures` consecutive failures:
    /// `reconnect.backoff.ms * 2^(failures-1)`, capped, with ±20% jitter.
    fn backoff(&mut self) -> Duration {
        self.backoff.delay(self.failures)
    }

    /// TCP connect, the TLS handshake, ApiVersions negotiation and SASL authentication,
    /// all within `connect_timeout`.
    async fn connect(&mut self) -> Result<Connected, RequestError> {
        let connect_err = |reason: String| RequestError::Connect {
            broker: self.address.to_string(),
            reason,
        };
        let deadline = Instant::now() + self.settings.connect_timeout;
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
                let mut stream = self.open(deadline).await?;
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
                    let result = exchange.await;
                    // A plaintext request answered by a TLS record: the listener speaks
                    // TLS, whatever else went wrong with the bytes.
                    if result.is_err() {
                        if let Some(kind) = listener::tls_record(&rbuf) {
                            if let Some(err) = self.wrong_protocol(Evidence::TlsRecord(kind)) {
                                return Err(err);
                            }
                        }
                    }
                    let frame = match result {
                        Ok(frame) => frame,
                        Err(ReadError::Io(e)) if self.tls_failure(&e).is_some() => {
                            return Err(self.tls_error(
                                self.tls_failure(&e)
                                    .unwrap_or(TlsFailure::Protocol(e.to_string())),
                            ));
                        }
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
                            let mut table = negotiate(&response, &self.settings.required).map_err(
                                |source| RequestError::Negotiation {
                                    broker: self.address.to_string(),
                                    source,
                                },
                            )?;
                            for (api, max) in &self.caps {
                                table.cap(*api, *max);
                            }
                            let mut lifetime = None;
                            if let Some(auth) = self.settings.sasl.clone() {
                                let mut wire = Wire {
                                    broker: &self.address,
                                    stream: &mut stream,
                                    codec: &mut codec,
                                    rbuf: &mut rbuf,
                                };
                                lifetime = authenticate(&mut wire, &auth, &table).await?;
                            }
                            debug!(broker = %self.address, api_versions = version, "connected");
                            crate::telemetry::connected(&self.address);
                            let connected = Connected {
                                stream,
                                codec,
                                table: Arc::new(table),
                                reauth_at: None,
                            };
                            return Ok((connected, lifetime));
                        }
                        Err(e) => return Err(connect_err(e.to_string())),
                    }
                }
            }
            Err(self
                .wrong_protocol(Evidence::ClosedDuringApiVersions)
                .unwrap_or_else(|| {
                    connect_err("broker kept closing the connection during ApiVersions".into())
                }))
        };
        // A little past the deadline, so that a TLS handshake that never ends reports
        // itself (see `open`).
        let (mut connected, lifetime) =
            match tokio::time::timeout_at(deadline + HANDSHAKE_GRACE, attempt).await {
                Ok(result) => result?,
                Err(_) => {
                    return Err(connect_err(format!(
                        "no connection within {:?}",
                        self.settings.connect_timeout
                    )));
                }
            };
        connected.reauth_at = lifetime.map(|l| self.reauth_point(l));
        Ok(connected)
    }

    /// TCP connect, then the TLS handshake when the protocol asks for it. A handshake
    /// unanswered by `deadline` is a TLS error: the port is most likely not a TLS
    /// listener, which waits for a Kafka request instead.
    async fn open(&self, deadline: Instant) -> Result<BrokerStream, RequestError> {
        #[cfg(feature = "tls-core")]
        let started = Instant::now();
        let tcp = TcpStream::connect(&*self.address)
            .await
            .map_err(|e| RequestError::Connect {
                broker: self.address.to_string(),
                reason: e.to_string(),
            })?;
        let _ = tcp.set_nodelay(true);
        if self.settings.keepalive {
            if let Err(e) = socket2::SockRef::from(&tcp).set_keepalive(true) {
                warn!(broker = %self.address, error = %e, "socket.keepalive.enable: SO_KEEPALIVE could not be set");
            }
        }
        #[cfg(feature = "tls-core")]
        if let Some(tls) = &self.settings.tls {
            let handshake = tls.connect(host_of(&self.address), tcp);
            let stream = match tokio::time::timeout_at(deadline, handshake).await {
                Ok(result) => {
                    let stream = result.map_err(|reason| self.tls_error(reason))?;
                    trace!(broker = %self.address, took = ?started.elapsed(), "TCP connected and TLS handshake done");
                    stream
                }
                Err(_) => {
                    return Err(self.tls_error(TlsFailure::Protocol(format!(
                        "no answer to the TLS handshake within {:?}",
                        self.settings.connect_timeout
                    ))));
                }
            };
            return Ok(BrokerStream::Tls(Box::new(stream)));
        }
        let _ = deadline;
        Ok(BrokerStream::Plain(tcp))
    }

    /// The TLS failure carried by an I/O error on a TLS stream, if any.
    fn tls_failure(&self, e: &std::io::Error) -> Option<TlsFailure> {
        #[cfg(feature = "tls-core")]
        if self.settings.tls.is_some() {
            return super::tls::classify_io(e, host_of(&self.address));
        }
        let _ = e;
        None
    }

    /// The advice for what this connection saw about the listener's security protocol
    /// ([`listener::diagnose`]), as an error; `None` when it says nothing.
    fn wrong_protocol(&self, evidence: Evidence) -> Option<RequestError> {
        let configured = self.settings.security_protocol;
        let settings = Configured {
            tls: configured.uses_tls(),
            sasl: configured.uses_sasl(),
        };
        let diagnosis = listener::diagnose(evidence, settings)?;
        Some(RequestError::WrongSecurityProtocol {
            broker: self.address.to_string(),
            configured,
            suggested: diagnosis.suggested,
            certain: diagnosis.certain,
            evidence: diagnosis.evidence,
        })
    }

    fn tls_error(&self, reason: TlsFailure) -> RequestError {
        RequestError::Tls {
            broker: self.address.to_string(),
            setting: reason.setting(),
            reason,
        }
    }

    /// When to re-authenticate a session of `lifetime` ([`reauth_point`]).
    fn reauth_point(&mut self, lifetime: Duration) -> Instant {
        let unit = self.backoff.unit();
        Instant::from_std(reauth_point(Instant::now().into_std(), lifetime, unit))
    }

    /// KIP-368 re-authentication on the open connection (the pipeline is empty).
    async fn reauthenticate(
        &mut self,
        stream: &mut BrokerStream,
        codec: &mut Codec,
        table: &VersionTable,
    ) -> Result<Option<Instant>, RequestError> {
        let Some(auth) = self.settings.sasl.clone() else {
            return Ok(None);
        };
        let mut rbuf = BytesMut::new();
        let mut wire = Wire {
            broker: &self.address,
            stream,
            codec,
            rbuf: &mut rbuf,
        };
        let exchange = authenticate(&mut wire, &auth, table);
        let lifetime = match tokio::time::timeout(self.settings.request_timeout, exchange).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(RequestError::Timeout {
                    broker: self.address.to_string(),
                    api: ApiKey::SaslAuthenticate,
                    after: self.settings.request_timeout,
                });
            }
        };
        Ok(lifetime.map(|l| self.reauth_point(l)))
    }

    /// Runs one established connection until it breaks or every handle is dropped.
    async fn serve(
        &mut self,
        stream: &mut BrokerStream,
        codec: &mut Codec,
        table: &Arc<VersionTable>,
        mut queue: VecDeque<Command>,
        reauth_at: Option<Instant>,
    ) -> End {
        let broker = self.address.to_string();
        let (mut rd, mut wr) = tokio::io::split(stream);
        let mut rbuf = BytesMut::with_capacity(64 * 1024);
        let mut wbuf = BytesMut::new();
        let mut waiting: VecDeque<Waiter> = VecDeque::new();
        let cap = self.settings.max_in_flight;
        let mut abort = self.load.abort.subscribe();
        let mut channel_open = true;
        // Whether the broker has sent anything on this connection since ApiVersions: a
        // close before that, on the first Metadata, is how a SASL listener treats a
        // client that does not authenticate.
        let mut heard = false;
        let mut idle = IdleClock::new(Instant::now().into_std(), self.settings.max_idle);

        // Fails every waiter and reports why the connection ended.
        let fail_all =
            |waiting: &mut VecDeque<Waiter>, queue: &mut VecDeque<Command>, err: RequestError| {
                for w in waiting.drain(..) {
                    crate::telemetry::request_failed(w.api);
                    let _ = w.respond.send(Err(err.clone()));
                }
                for cmd in queue.drain(..) {
                    fail_command(cmd, err.clone());
                }
            };

        loop {
            // A session about to end stops new writes; once the answers to what is on
            // the wire are in, the connection re-authenticates.
            let reauth_due = reauth_at.is_some_and(|at| Instant::now() >= at);
            if reauth_due && waiting.is_empty() && wbuf.is_empty() && channel_open {
                return End::Reauthenticate(queue);
            }
            // Move queued commands onto the wire while the pipeline has room.
            while !reauth_due && waiting.len() < cap {
                let Some(cmd) = queue.pop_front() else { break };
                match cmd {
                    Command::Negotiate { respond } => {
                        let _ = respond.send(Ok(Arc::clone(table)));
                    }
                    Command::Request(p) => {
                        if let Err(err) = check_version(&broker, table, p.api, p.version) {
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
                                idle.handle_activity(Instant::now().into_std());
                                trace!(broker = %broker, api = ?p.api, version = p.version, correlation_id = id.0, "request queued");
                                if p.expects_response {
                                    let deadline = (Instant::now() + p.timeout).min(p.deadline);
                                    waiting.push_back(Waiter {
                                        correlation_id: id.0,
                                        api: p.api,
                                        version: p.version,
                                        timeout: p.timeout,
                                        deadline,
                                        written: Instant::now(),
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
            self.load
                .in_flight
                .store(waiting.len() + queue.len(), Ordering::Relaxed);
            let oldest = waiting.front().map_or(0, |w| {
                let ms = w
                    .written
                    .saturating_duration_since(self.load.since)
                    .as_millis();
                u64::try_from(ms).unwrap_or(u64::MAX - 1) + 1
            });
            self.load.oldest.store(oldest, Ordering::Relaxed);
            let next_deadline = waiting.iter().map(|w| w.deadline).min();
            let accept = channel_open && waiting.len() < cap && queue.is_empty();
            let reauth_wake = reauth_at.filter(|_| !reauth_due);
            // Only a connection with nothing in flight, queued or unwritten can be idle.
            let busy = !waiting.is_empty() || !queue.is_empty() || !wbuf.is_empty();
            let idle_wake = idle.poll_timeout().filter(|_| !busy).map(Instant::from_std);

            tokio::select! {
                read = rd.read_buf(&mut rbuf) => {
                    let got = matches!(read, Ok(n) if n > 0);
                    let unheard_metadata = !heard && waiting.front().is_some_and(|w| w.api == ApiKey::Metadata);
                    let hint = || unheard_metadata.then(|| self.wrong_protocol(Evidence::ClosedAfterApiVersions)).flatten();
                    let (failure, hung_up) = match read {
                        Ok(0) => (Some(hint().unwrap_or_else(|| RequestError::Disconnected { broker: broker.clone(), reason: "closed by broker".into() })), true),
                        Err(e) => (Some(hint().unwrap_or_else(|| RequestError::Disconnected { broker: broker.clone(), reason: e.to_string() })), true),
                        Ok(_) => (deliver_frames(codec, &mut rbuf, &mut waiting, &mut self.hangups)
                            .err()
                            .map(|source| RequestError::Wire { broker: broker.clone(), source }), false),
                    };
                    heard |= got;
                    if got {
                        idle.handle_activity(Instant::now().into_std());
                    }
                    if let Some(err) = failure {
                        // Worth a warning only if someone still waits for an answer;
                        // a client shutting down leaves requests nobody reads.
                        let waited_for = waiting.iter().filter(|w| !w.respond.is_closed()).count();
                        if waited_for > 0 {
                            warn!(broker = %broker, error = %err, pending = waited_for, "connection dropped");
                        } else {
                            debug!(broker = %broker, error = %err, "connection dropped with no caller waiting");
                        }
                        let hung_up_on = waiting.front().filter(|_| hung_up).map(|w| (w.api, w.version));
                        fail_all(&mut waiting, &mut queue, err);
                        return End::Broken { hung_up_on };
                    }
                }
                written = wr.write_buf(&mut wbuf), if !wbuf.is_empty() => {
                    if let Err(e) = written {
                        let err = RequestError::Disconnected { broker: broker.clone(), reason: e.to_string() };
                        warn!(broker = %broker, error = %err, "write failed");
                        fail_all(&mut waiting, &mut queue, err);
                        return End::Broken { hung_up_on: None };
                    }
                }
                cmd = self.rx.recv(), if accept => {
                    match cmd {
                        Some(cmd) => queue.push_back(cmd),
                        None => channel_open = false,
                    }
                }
                Ok(()) = abort.changed() => {
                    let err = RequestError::Disconnected { broker: broker.clone(), reason: "closed by the client".into() };
                    debug!(broker = %broker, pending = waiting.len(), "connection closed on request");
                    fail_all(&mut waiting, &mut queue, err);
                    return End::Broken { hung_up_on: None };
                }
                _ = super::sleep_until(reauth_wake), if reauth_wake.is_some() => {}
                _ = super::sleep_until(idle_wake), if idle_wake.is_some() => {
                    if idle.expired(Instant::now().into_std(), busy) {
                        debug!(broker = %broker, max_idle = ?self.settings.max_idle, "closing the idle connection (connections.max.idle.ms)");
                        return End::Idle;
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
                        crate::telemetry::request_failed(w.api);
                        let err = if w.deadline <= now {
                            RequestError::Timeout { broker: broker.clone(), api: w.api, after: w.timeout }
                        } else {
                            RequestError::Disconnected { broker: broker.clone(), reason: reason.clone() }
                        };
                        let _ = w.respond.send(Err(err));
                    }
                    fail_all(&mut waiting, &mut queue, RequestError::Disconnected { broker: broker.clone(), reason });
                    return End::Broken { hung_up_on: None };
                }
            }
        }
    }
}

/// Hands every complete response in `rbuf` to its waiter. The codec matches each
/// response to the oldest in-flight request, which is the front waiter by construction.
/// An answer clears its API's hang-up count.
fn deliver_frames(
    codec: &mut Codec,
    rbuf: &mut BytesMut,
    waiting: &mut VecDeque<Waiter>,
    hangups: &mut HashMap<ApiKey, (i16, u32)>,
) -> Result<(), WireError> {
    while let Some(frame) = codec.decode_frame(rbuf)? {
        let Some(w) = waiting.pop_front() else {
            return Err(WireError::Unsolicited {
                correlation_id: frame.request.correlation_id.0,
            });
        };
        debug_assert_eq!(w.correlation_id, frame.request.correlation_id.0);
        crate::telemetry::request_answered(w.api, w.written.elapsed());
        hangups.remove(&w.api);
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

async fn read_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
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

/// The host of a `host:port` address (brackets of an IPv6 literal removed).
#[cfg_attr(not(feature = "tls-core"), allow(dead_code))]
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// One connection's stream and codec, for the exchanges that run before (or between)
/// the pipelined requests: SASL.
struct Wire<'a> {
    broker: &'a str,
    stream: &'a mut BrokerStream,
    codec: &'a mut Codec,
    rbuf: &'a mut BytesMut,
}

impl Wire<'_> {
    /// Sends `request` at `version` and reads its response.
    async fn roundtrip<R: Request>(
        &mut self,
        request: &R,
        version: i16,
    ) -> Result<R::Response, RequestError> {
        let api = api_of::<R>();
        let wire = |source| RequestError::Wire {
            broker: self.broker.to_string(),
            source,
        };
        let mut out = BytesMut::new();
        self.codec
            .encode_request(api, version, request, true, &mut out)
            .map_err(wire)?;
        trace!(broker = %self.broker, api = ?api, version, bytes = out.len(), "connection setup request");
        let exchange = async {
            self.stream.write_all(&out).await?;
            read_frame(self.stream, self.codec, self.rbuf).await
        };
        let frame = exchange.await.map_err(|e| match e {
            ReadError::Wire(source) => RequestError::Wire {
                broker: self.broker.to_string(),
                source,
            },
            other => RequestError::Disconnected {
                broker: self.broker.to_string(),
                reason: other.to_string(),
            },
        })?;
        decode_response::<R::Response>(api, version, frame.body).map_err(|source| {
            RequestError::Wire {
                broker: self.broker.to_string(),
                source,
            }
        })
    }

    /// A SASL token without Kafka framing (SaslHandshake v0, before KIP-152): a 4-byte
    /// length and the bytes, both ways.
    async fn raw_token(&mut self, token: &[u8]) -> Result<Vec<u8>, RequestError> {
        let len = i32::try_from(token.len()).unwrap_or(i32::MAX);
        let io = |e: std::io::Error| RequestError::Disconnected {
            broker: self.broker.to_string(),
            reason: e.to_string(),
        };
        let mut out = Vec::with_capacity(4 + token.len());
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(token);
        self.stream.write_all(&out).await.map_err(io)?;
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).await.map_err(io)?;
        let len = i32::from_be_bytes(len);
        let max = self.codec.max_frame_size();
        let size = usize::try_from(len)
            .ok()
            .filter(|n| *n <= max)
            .ok_or_else(|| RequestError::Wire {
                broker: self.broker.to_string(),
                source: WireError::InvalidFrameLength { length: len },
            })?;
        let mut body = vec![0u8; size];
        self.stream.read_exact(&mut body).await.map_err(io)?;
        Ok(body)
    }
}

/// The SASL exchange (KIP-43, KIP-152): SaslHandshake names the mechanism, then
/// SaslAuthenticate carries the mechanism's messages until it is done. Returns the
/// session lifetime the broker gave, if any (KIP-368).
///
/// Against a broker without SaslAuthenticate (before Kafka 1.0), the handshake is sent
/// at v0 and the mechanism's messages travel as bare length-prefixed tokens.
async fn authenticate(
    wire: &mut Wire<'_>,
    auth: &Authenticator,
    table: &VersionTable,
) -> Result<Option<Duration>, RequestError> {
    let mechanism = auth.mechanism();
    let fail = |source: AuthError| RequestError::Authentication {
        broker: wire.broker.to_string(),
        mechanism: mechanism.name(),
        source,
    };
    let framed = table.version(ApiKey::SaslAuthenticate);
    let Some(handshake_version) = table.version(ApiKey::SaslHandshake) else {
        return Err(fail(AuthError::Protocol(
            "the broker offers no SaslHandshake: is this a SASL listener? (security.protocol)"
                .into(),
        )));
    };
    let handshake_version = if framed.is_some() {
        handshake_version
    } else {
        0
    };
    let handshake =
        SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism.name()));
    let response: SaslHandshakeResponse = match wire.roundtrip(&handshake, handshake_version).await
    {
        Ok(r) => r,
        // Kafka answers UNSUPPORTED_SASL_MECHANISM with the list; some brokers (tansu
        // for a mechanism it was built without) hang up instead.
        Err(RequestError::Disconnected { reason, .. }) => {
            return Err(fail(AuthError::Protocol(format!(
                "the broker closed the connection at SaslHandshake ({reason}): it most likely does not enable {mechanism} (sasl.mechanism)"
            ))));
        }
        Err(e) => return Err(e),
    };
    if response.error_code != 0 {
        let enabled: Vec<String> = response.mechanisms.iter().map(|m| m.to_string()).collect();
        if response.error_code == UNSUPPORTED_SASL_MECHANISM {
            return Err(fail(AuthError::MechanismNotEnabled {
                wanted: mechanism.name(),
                enabled,
            }));
        }
        return Err(fail(rejected(response.error_code, None)));
    }
    let mut client = auth.client().await.map_err(fail)?;
    let mut message = client
        .initial_response()
        .map_err(|e| fail(AuthError::Exchange(e)))?;
    loop {
        let (challenge, lifetime) = match framed {
            Some(version) => {
                let request =
                    SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(message));
                let response: SaslAuthenticateResponse = match wire
                    .roundtrip(&request, version)
                    .await
                {
                    Ok(r) => r,
                    // Some brokers (tansu for an unknown user) hang up instead of
                    // answering SASL_AUTHENTICATION_FAILED.
                    Err(RequestError::Disconnected { reason, .. }) => {
                        return Err(fail(AuthError::Protocol(format!(
                            "the broker closed the connection during authentication ({reason}): most likely it refused the credentials (an unknown user?)"
                        ))));
                    }
                    Err(e) => return Err(e),
                };
                if response.error_code != 0 {
                    // OAUTHBEARER: the broker's JSON status came in the challenge
                    // before, and says more than Kafka's generic final message.
                    let detail = client
                        .server_error()
                        .map(|status| format!("the server's OAUTHBEARER status: {status}"));
                    let message = match (response.error_message.as_ref(), detail) {
                        (Some(m), Some(d)) => Some(format!("{m}; {d}")),
                        (m, d) => m.map(|m| m.to_string()).or(d),
                    };
                    return Err(fail(rejected(response.error_code, message)));
                }
                let lifetime = u64::try_from(response.session_lifetime_ms)
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis);
                (response.auth_bytes.to_vec(), lifetime)
            }
            None => match wire.raw_token(&message).await {
                Ok(token) => (token, None),
                // Before KIP-152 a broker says "wrong password" by hanging up.
                Err(RequestError::Disconnected { reason, .. }) => {
                    return Err(fail(AuthError::Protocol(format!(
                        "the broker closed the connection during authentication ({reason}): most likely the credentials were refused"
                    ))));
                }
                Err(e) => return Err(e),
            },
        };
        match client
            .handle_challenge(&challenge)
            .map_err(|e| fail(AuthError::Exchange(e)))?
        {
            Step::Send(next) => message = next,
            Step::Done => return Ok(lifetime),
        }
    }
}

/// SASL_AUTHENTICATION_FAILED and friends, with the broker's message.
fn rejected(code: i16, message: Option<String>) -> AuthError {
    AuthError::Rejected {
        code,
        name: crate::proto::error_name(code),
        message: message.unwrap_or_else(|| "no message".into()),
    }
}

/// UNSUPPORTED_SASL_MECHANISM.
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;

/// A small, stable hash so each connection's jitter differs but stays replayable.
fn fxhash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(version: i16) -> BrokerHangUp {
        BrokerHangUp {
            broker: "b:1".into(),
            api: ApiKey::JoinGroup,
            version,
            hangups: HANGUPS_BEFORE_DIAGNOSIS,
            stepped_down_to: None,
        }
    }

    #[test]
    fn hang_up_reports_are_bounded_and_read_once() {
        let reports = HangUpReports::default();
        let mut seen = 0;
        reports.raise(report(0));
        assert_eq!(reports.since(&mut seen), vec![report(0)]);
        assert!(reports.since(&mut seen).is_empty());
        // A reader that falls behind gets the latest ones kept, and the log stays
        // bounded however long a broker keeps hanging up.
        for v in 1..=200 {
            reports.raise(report(v));
        }
        let got = reports.since(&mut seen);
        assert_eq!(got.len(), HANGUP_REPORTS_KEPT);
        assert_eq!(got.last(), Some(&report(200)));
        assert_eq!(
            got.first(),
            Some(&report(200 - HANGUP_REPORTS_KEPT as i16 + 1))
        );
        reports.raise(report(201));
        assert_eq!(reports.since(&mut seen), vec![report(201)]);
        assert_eq!(reports.read(|log| log.recent.len()), HANGUP_REPORTS_KEPT);
    }
}
