//! Hostile brokers (issue 7, §4): a proxy in front of the librdkafka mock cluster
//! ([`HostileProxy`]) answers chosen requests with frames claiming huge sizes, arrays
//! with absurd counts, responses to requests never sent, and frames cut off mid-body.
//! ottla must fail the connection (or, for a bad body in a good frame, just the request)
//! with a precise error, allocate nothing out of proportion, and recover once the
//! broker behaves.
//!
//! Memory is measured by a counting global allocator. The proxy runs on a runtime of its
//! own whose thread is not counted, so the figures are ottla's (and the test's); the
//! mock cluster allocates through C `malloc` and is not counted either. Every test
//! asserts two bounds over its hostile phase: no single allocation above
//! [`LARGEST_ALLOCATION_LIMIT`], and live memory never more than [`PEAK_LIMIT`] above
//! where it stood when the phase began.
//!
//! Every wait is bounded by `tokio::time::timeout`.
//!
//! Each assertion was seen to trip against a deliberately broken ottla (in a scratch
//! copy): reserving a frame before checking its length, no maximum frame size, accepting
//! any correlation id, ignoring EOF, never reconnecting, and kafka-protocol's earlier
//! array bound (element count only) each fail at least one test here.

use std::collections::BTreeSet;
use std::future::Future;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::time::timeout;

use kafka_protocol::messages::{ApiKey, MetadataRequest};
use ottla::consumer::{Consumer, ConsumerBuilder, FetchError, OffsetReset, TopicPartition};
use ottla::driver::{BrokerConnection, Cluster, TopicScope};
use ottla::{ClientConfig, RequestError, WireError};
use ottla_proto::fetch::batch::BatchErrorKind;
use protocol_tests::alloc::{Counting, MemoryWindow, mib};
use protocol_tests::data::{index_of, matches, produce};
use protocol_tests::hostile::{HostileProxy, Misbehaviour};
use protocol_tests::mock::MockCluster;

// ---------------------------------------------------------------------------------
// Memory accounting.

/// No single allocation may exceed this while a peer misbehaves. The largest legitimate
/// one is the 1 MiB padded frame of the absurd-array tests (ottla reserves a buffer of a
/// large frame's exact size). Measured: 1.00 MiB there, 64 KiB (a connection's read
/// buffer) everywhere else.
const LARGEST_ALLOCATION_LIMIT: usize = 2 << 20;

/// Live memory may grow at most this much over the hostile phase of a test. Measured:
/// at most 2.00 MiB (the absurd-array tests), under 0.2 MiB everywhere else.
const PEAK_LIMIT: usize = 8 << 20;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Prints a phase's figures and asserts both bounds.
trait Bounded {
    fn assert_bounded(&self, what: &str);
}

impl Bounded for MemoryWindow {
    /// Prints the figures and asserts both bounds.
    fn assert_bounded(&self, what: &str) {
        let (peak, largest) = (self.peak_growth(), self.largest());
        println!(
            "memory [{what}]: peak growth {:.2} MiB, largest allocation {:.2} MiB",
            mib(peak),
            mib(largest)
        );
        assert!(
            largest <= LARGEST_ALLOCATION_LIMIT,
            "{what}: an allocation of {largest} bytes (limit {LARGEST_ALLOCATION_LIMIT})"
        );
        assert!(
            peak <= PEAK_LIMIT,
            "{what}: live memory grew by {peak} bytes (limit {PEAK_LIMIT})"
        );
    }
}

// ---------------------------------------------------------------------------------
// Log capture: reconnects and dropped connections are only visible in the logs.

static LOGS: Mutex<String> = Mutex::new(String::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        eprint!("{text}");
        lock(&LOGS).push_str(&text);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures ottla's logs at debug level (and clears what earlier tests left).
fn capture_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "warn,ottla=debug,protocol_tests=debug",
        ))
        .with_ansi(false)
        .with_writer(|| LogWriter)
        .try_init();
    lock(&LOGS).clear();
}

/// How many log lines contain every one of `needles`.
fn logged(needles: &[&str]) -> usize {
    lock(&LOGS)
        .lines()
        .filter(|line| needles.iter().all(|n| line.contains(n)))
        .count()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Under `cargo test` the tests share one process (and the counters): run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------------
// Fixture: a mock cluster, a topic, and the hostile proxy in front of it.

const TOPIC: &str = "hostile";
const PARTITIONS: i32 = 2;

struct Fixture {
    mock: MockCluster,
    proxy: HostileProxy,
    /// The proxy's runtime; its thread's allocations are not counted.
    proxy_runtime: Option<tokio::runtime::Runtime>,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl Fixture {
    async fn new() -> Self {
        let serial = SERIAL.lock().await;
        capture_logs();
        let mock = MockCluster::new(1).expect("mock cluster");
        mock.cap_group_apis().expect("cap group APIs");
        mock.set_group_initial_rebalance_delay(Duration::from_millis(100));
        mock.create_topic(TOPIC, PARTITIONS, 1).expect("topic");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .on_thread_start(protocol_tests::alloc::uncount_this_thread)
            .enable_all()
            .build()
            .expect("proxy runtime");
        let bootstrap = mock.bootstrap();
        let proxy = within(
            "starting the proxy",
            Duration::from_secs(5),
            runtime.spawn(async move { HostileProxy::start(&bootstrap).await }),
        )
        .await
        .expect("proxy task")
        .expect("proxy");
        Self {
            mock,
            proxy,
            proxy_runtime: Some(runtime),
            _serial: serial,
        }
    }

    /// The only proxy listener (the mock has one broker).
    fn address(&self) -> String {
        self.proxy.bootstrap()
    }

    fn client(&self) -> ClientConfig {
        ClientConfig::new(&self.address())
            .with_client_id("ottla-hostile")
            .with_request_timeout(Duration::from_secs(1))
            .with_connect_timeout(Duration::from_secs(2))
            .with_reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
    }

    /// A connection to the proxy, through a cluster handle that has done its bootstrap
    /// Metadata exchange (before anything is armed).
    async fn connection(&self, config: ClientConfig) -> (Cluster, BrokerConnection) {
        let cluster = within(
            "bootstrap",
            Duration::from_secs(5),
            Cluster::connect(&config, TopicScope::Topics(BTreeSet::new()), &[]),
        )
        .await
        .expect("bootstrap through the proxy");
        let conn = cluster.connection(&self.address());
        (cluster, conn)
    }

    /// Writes records `first..first + count` straight to the mock.
    async fn produce(&self, first: u64, count: u64) {
        within(
            "producing",
            Duration::from_secs(10),
            produce(
                &self.mock.bootstrap(),
                TOPIC,
                PARTITIONS,
                first,
                count,
                "none",
            ),
        )
        .await
        .expect("produce");
    }

    /// A consumer of both partitions by manual assignment, through the proxy.
    fn consumer(&self) -> ConsumerBuilder {
        Consumer::builder(&self.address())
            .client_config(self.client())
            .assign((0..PARTITIONS).map(|p| TopicPartition::new(TOPIC, p)))
            .offset_reset(OffsetReset::Earliest)
            .fetch_max_wait(Duration::from_millis(100))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(rt) = self.proxy_runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// `fut`, or a panic naming `what` after `limit`.
async fn within<F: Future>(what: &str, limit: Duration, fut: F) -> F::Output {
    match timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: no result within {limit:?}"),
    }
}

/// Waits until `cond` holds, checking every 20 ms, or panics naming `what`.
async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Metadata request for no topics, which every version can carry.
fn metadata_request() -> MetadataRequest {
    MetadataRequest::default().with_topics(Some(Vec::new()))
}

/// What a consumer has read so far, by record index.
#[derive(Default)]
struct Seen(BTreeSet<u64>);

impl Seen {
    /// Reads until every record `0..total` was seen exactly once and checked against
    /// what was written; panics on a duplicate, a stopped partition, or after `limit`.
    async fn read_up_to(&mut self, consumer: &mut Consumer, total: u64, limit: Duration) {
        let read = async {
            while (self.0.len() as u64) < total {
                let record = consumer
                    .recv()
                    .await
                    .expect("the consumer stopped")
                    .expect("a record, not an error");
                self.check(&record, total);
            }
        };
        if timeout(limit, read).await.is_err() {
            panic!(
                "read {} of {total} records within {limit:?}; missing e.g. {:?}",
                self.0.len(),
                (0..total).find(|i| !self.0.contains(i))
            );
        }
    }

    /// Reads until a partition stops with an error, checking the records before it.
    async fn read_until_error(&mut self, consumer: &mut Consumer, total: u64) -> ottla::Error {
        within("a stopped partition", Duration::from_secs(10), async {
            loop {
                match consumer.recv().await.expect("the consumer stopped") {
                    Ok(record) => self.check(&record, total),
                    Err(e) => return e,
                }
            }
        })
        .await
    }

    /// Records `record`, which must be one of `0..total`, new, and what was written.
    fn check(&mut self, record: &ottla::ConsumerRecord, total: u64) {
        let i = index_of(record.partition(), record.offset(), PARTITIONS);
        assert!(
            i < total && matches(i, record.key(), record.value(), &record.headers_owned()),
            "record {}@{} is not what was written",
            record.partition(),
            record.offset()
        );
        assert!(self.0.insert(i), "record {i} delivered twice");
    }

    /// Keeps polling the consumer (so that it keeps fetching) until `cond` holds;
    /// panics naming `what` after `limit`, or if a record arrives: all were read.
    async fn idle_until(
        &self,
        consumer: &mut Consumer,
        what: &str,
        limit: Duration,
        mut cond: impl FnMut() -> bool,
    ) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
            if let Ok(record) = timeout(Duration::from_millis(20), consumer.recv()).await {
                panic!("no more records were written, got {record:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// One request on one connection: the precise error, then a working connection.

#[tokio::test]
async fn frames_claiming_huge_or_invalid_sizes_fail_the_connection_before_any_allocation() {
    let f = Fixture::new().await;
    let (_cluster, conn) = f.connection(f.client()).await;
    let default_max = ottla_proto::wire::DEFAULT_MAX_FRAME_SIZE;
    let memory = MemoryWindow::open();
    // i32::MIN is 0x8000_0000: 2 GiB if a reader took the prefix as unsigned.
    for claimed in [i32::MAX, 0x7000_0000, 200 << 20, i32::MIN, -1, 0, 3] {
        let connections = f.proxy.connections();
        f.proxy
            .arm(ApiKey::Metadata, Misbehaviour::HugeFrame { claimed }, 1);
        let err = within(
            "hostile request",
            Duration::from_secs(5),
            conn.send(&metadata_request()),
        )
        .await
        .expect_err("a hostile frame cannot be a response");
        let RequestError::Wire { source, .. } = &err else {
            panic!("claim {claimed}: expected a wire error, got {err:?}");
        };
        match usize::try_from(claimed) {
            Ok(size) if size >= 4 => assert_eq!(
                *source,
                WireError::FrameTooLarge {
                    size,
                    max: default_max
                },
                "claim {claimed}"
            ),
            _ => assert_eq!(
                *source,
                WireError::InvalidFrameLength { length: claimed },
                "claim {claimed}"
            ),
        }
        // The connection was dropped; the next request gets a new one, and an answer.
        within(
            "next request",
            Duration::from_secs(5),
            conn.send(&metadata_request()),
        )
        .await
        .expect("the next request reconnects");
        assert_eq!(f.proxy.connections(), connections + 1, "claim {claimed}");
    }
    assert_eq!(f.proxy.injected(), 7);
    memory.assert_bounded("huge frame claims");
    // Nothing was reserved for any claim: the largest allocation is a read buffer.
    assert!(memory.largest() <= 256 << 10, "{} bytes", memory.largest());
}

#[tokio::test]
async fn a_frame_over_the_configured_maximum_is_refused_and_one_under_it_costs_at_most_the_maximum()
{
    let f = Fixture::new().await;
    let max = 1 << 20;
    let (_cluster, conn) = f.connection(f.client().with_max_frame_size(max)).await;
    let memory = MemoryWindow::open();
    for claimed in [64 << 20, (1 << 20) + 1] {
        f.proxy
            .arm(ApiKey::Metadata, Misbehaviour::HugeFrame { claimed }, 1);
        let err = within(
            "hostile request",
            Duration::from_secs(5),
            conn.send(&metadata_request()),
        )
        .await
        .expect_err("over the maximum");
        assert!(
            matches!(
                &err,
                RequestError::Wire { source: WireError::FrameTooLarge { size, max: m }, .. }
                    if *size == claimed as usize && *m == max
            ),
            "{err:?}"
        );
    }
    within(
        "honest request",
        Duration::from_secs(5),
        conn.send(&metadata_request()),
    )
    .await
    .expect("the connection comes back");
    // Exactly the maximum: accepted as a length, so ottla reserves it and waits for the
    // body, which never comes. The request times out and the connection is replaced.
    let connections = f.proxy.connections();
    f.proxy.arm(
        ApiKey::Metadata,
        Misbehaviour::HugeFrame {
            claimed: max as i32,
        },
        1,
    );
    let err = within(
        "held frame",
        Duration::from_secs(5),
        conn.send(&metadata_request()),
    )
    .await
    .expect_err("the body never comes");
    assert!(
        matches!(
            err,
            RequestError::Timeout {
                api: ApiKey::Metadata,
                ..
            }
        ),
        "{err:?}"
    );
    within(
        "next request",
        Duration::from_secs(5),
        conn.send(&metadata_request()),
    )
    .await
    .expect("the next request reconnects");
    assert_eq!(f.proxy.connections(), connections + 1);
    memory.assert_bounded("claims around a 1 MiB maximum");
    assert!(
        memory.largest() <= max + 64 * 1024,
        "{} bytes for a frame of at most {max}",
        memory.largest()
    );
}

#[tokio::test]
async fn absurd_array_counts_are_typed_decode_errors_and_the_connection_survives() {
    let f = Fixture::new().await;
    let (_cluster, conn) = f.connection(f.client()).await;
    let version = conn
        .versions()
        .await
        .expect("versions")
        .version(ApiKey::Metadata)
        .expect("Metadata negotiated");
    let connections = f.proxy.connections();
    let memory = MemoryWindow::open();
    for (count, padding) in [
        (i32::MAX, 1 << 20),
        (-2, 1 << 20),
        (i32::MAX, 0),
        (1 << 20, 1 << 20),
    ] {
        f.proxy.arm(
            ApiKey::Metadata,
            Misbehaviour::AbsurdArray { count, padding },
            1,
        );
        let err = within(
            "hostile request",
            Duration::from_secs(5),
            conn.send(&metadata_request()),
        )
        .await
        .expect_err("an absurd count cannot decode");
        assert!(
            matches!(
                &err,
                RequestError::Wire { source: WireError::Decode { api: ApiKey::Metadata, version: v, .. }, .. }
                    if *v == version
            ),
            "count {count}, padding {padding}: {err:?}"
        );
        // The frame was whole and its correlation id right: only this request failed.
        within(
            "next request",
            Duration::from_secs(5),
            conn.send(&metadata_request()),
        )
        .await
        .expect("the connection survives a bad body");
    }
    assert_eq!(
        f.proxy.connections(),
        connections,
        "no reconnect was needed"
    );
    assert_eq!(f.proxy.injected(), 4);
    memory.assert_bounded("absurd array counts");
}

#[tokio::test]
async fn a_response_with_a_wrong_correlation_id_poisons_the_connection_and_the_next_request_reconnects()
 {
    let f = Fixture::new().await;
    let (_cluster, conn) = f.connection(f.client()).await;
    let connections = f.proxy.connections();
    let memory = MemoryWindow::open();
    f.proxy.arm(
        ApiKey::Metadata,
        Misbehaviour::WrongCorrelationId { offset: 1000 },
        1,
    );
    let err = within(
        "hostile request",
        Duration::from_secs(5),
        conn.send(&metadata_request()),
    )
    .await
    .expect_err("an answer to another request");
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
    within(
        "next request",
        Duration::from_secs(5),
        conn.send(&metadata_request()),
    )
    .await
    .expect("the next request reconnects");
    assert_eq!(f.proxy.connections(), connections + 1);
    memory.assert_bounded("wrong correlation id");
}

#[tokio::test]
async fn an_answer_to_a_request_never_sent_drops_the_connection() {
    let f = Fixture::new().await;
    let (_cluster, conn) = f.connection(f.client()).await;
    let connections = f.proxy.connections();
    let memory = MemoryWindow::open();
    f.proxy.arm(ApiKey::Metadata, Misbehaviour::Duplicate, 1);
    // The first copy answers the request...
    within(
        "request",
        Duration::from_secs(5),
        conn.send(&metadata_request()),
    )
    .await
    .expect("the first copy is the answer");
    // ...the second arrives with nothing in flight, and the connection is dropped.
    eventually(
        "the unsolicited response is noticed",
        Duration::from_secs(5),
        || {
            logged(&[
                "connection dropped",
                "unsolicited response with correlation id",
            ]) == 1
        },
    )
    .await;
    within(
        "next request",
        Duration::from_secs(5),
        conn.send(&metadata_request()),
    )
    .await
    .expect("the next request reconnects");
    assert_eq!(f.proxy.connections(), connections + 1);
    memory.assert_bounded("unsolicited response");
}

#[tokio::test]
async fn a_frame_cut_off_then_closed_fails_the_request_as_disconnected() {
    let f = Fixture::new().await;
    let (_cluster, conn) = f.connection(f.client()).await;
    let connections = f.proxy.connections();
    let memory = MemoryWindow::open();
    f.proxy
        .arm(ApiKey::Metadata, Misbehaviour::CutOffThenClose, 1);
    let err = within(
        "hostile request",
        Duration::from_secs(5),
        conn.send(&metadata_request()),
    )
    .await
    .expect_err("half a frame");
    assert!(
        matches!(&err, RequestError::Disconnected { reason, .. } if reason == "closed by broker"),
        "{err:?}"
    );
    within(
        "next request",
        Duration::from_secs(5),
        conn.send(&metadata_request()),
    )
    .await
    .expect("the next request reconnects");
    assert_eq!(f.proxy.connections(), connections + 1);
    memory.assert_bounded("cut off, closed");
}

#[tokio::test]
async fn a_frame_cut_off_and_held_open_times_out_and_the_next_request_reconnects() {
    let f = Fixture::new().await;
    let (_cluster, conn) = f.connection(f.client()).await;
    let connections = f.proxy.connections();
    let memory = MemoryWindow::open();
    f.proxy
        .arm(ApiKey::Metadata, Misbehaviour::CutOffThenHold, 1);
    let started = Instant::now();
    let err = within(
        "hostile request",
        Duration::from_secs(5),
        conn.send(&metadata_request()),
    )
    .await
    .expect_err("half a frame, then silence");
    let waited = started.elapsed();
    assert!(
        matches!(
            err,
            RequestError::Timeout { api: ApiKey::Metadata, after, .. } if after == Duration::from_secs(1)
        ),
        "{err:?}"
    );
    // The request timeout is 1 s; the error comes with it, not at the caller's backstop.
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    within(
        "next request",
        Duration::from_secs(5),
        conn.send(&metadata_request()),
    )
    .await
    .expect("the next request reconnects");
    assert_eq!(f.proxy.connections(), connections + 1);
    memory.assert_bounded("cut off, held open");
}

#[tokio::test]
async fn hostile_api_versions_answers_fail_the_connect_precisely_and_the_next_connect_succeeds() {
    let f = Fixture::new().await;
    let memory = MemoryWindow::open();
    let config = f.client();
    let connect = || {
        within(
            "connect",
            Duration::from_secs(5),
            Cluster::connect(&config, TopicScope::Topics(BTreeSet::new()), &[]),
        )
    };
    for (misbehaviour, expected) in [
        (
            Misbehaviour::HugeFrame { claimed: i32::MAX },
            "frame of 2147483647 bytes exceeds the maximum of 104857600 bytes",
        ),
        (
            Misbehaviour::AbsurdArray {
                count: i32::MAX,
                padding: 1 << 20,
            },
            "exceeds the 1048576 bytes remaining",
        ),
        (
            Misbehaviour::WrongCorrelationId { offset: 1000 },
            "does not match the oldest in-flight request",
        ),
        (Misbehaviour::CutOffThenHold, "no connection within 2s"),
    ] {
        f.proxy.arm(ApiKey::ApiVersions, misbehaviour, 1);
        let err = connect()
            .await
            .expect_err("no cluster from a hostile handshake");
        match &err {
            ottla::Error::Bootstrap { tried, last } => {
                assert_eq!(tried, &vec![f.address()]);
                let last = last.as_ref().map(|e| e.to_string()).unwrap_or_default();
                assert!(
                    last.starts_with("cannot connect to") && last.contains(expected),
                    "{misbehaviour:?}: {last}"
                );
            }
            other => panic!("{misbehaviour:?}: expected a bootstrap error, got {other:?}"),
        }
        connect().await.expect("an honest handshake connects");
    }
    // Cut off and closed looks like a broker older than ApiVersions: ottla reconnects
    // one version lower within the same connect, and succeeds.
    let connections = f.proxy.connections();
    f.proxy
        .arm(ApiKey::ApiVersions, Misbehaviour::CutOffThenClose, 1);
    connect()
        .await
        .expect("a retry at a lower version connects");
    assert_eq!(f.proxy.connections(), connections + 2);
    assert_eq!(f.proxy.injected(), 5);
    memory.assert_bounded("hostile ApiVersions");
}

// ---------------------------------------------------------------------------------
// The consumer: every record read exactly once after the broker behaves again.

#[tokio::test]
async fn the_consumer_survives_fetch_responses_claiming_2_gib_and_loses_nothing() {
    let f = Fixture::new().await;
    f.produce(0, 50).await;
    let mut consumer = within("build", Duration::from_secs(10), f.consumer().build())
        .await
        .expect("consumer");
    let mut seen = Seen::default();
    seen.read_up_to(&mut consumer, 50, Duration::from_secs(10))
        .await;
    let connections = f.proxy.connections();
    let memory = MemoryWindow::open();
    f.proxy.arm(
        ApiKey::Fetch,
        Misbehaviour::HugeFrame { claimed: i32::MAX },
        3,
    );
    f.produce(50, 50).await;
    seen.read_up_to(&mut consumer, 100, Duration::from_secs(15))
        .await;
    assert_eq!(f.proxy.injected(), 3);
    // Every hostile frame cost one connection, and was reported as such.
    assert_eq!(f.proxy.connections(), connections + 3);
    assert_eq!(
        logged(&[
            "connection dropped",
            "frame of 2147483647 bytes exceeds the maximum of 104857600 bytes"
        ]),
        3
    );
    memory.assert_bounded("consumer, Fetch frames claiming 2 GiB");
}

#[tokio::test]
async fn the_consumer_survives_absurd_array_counts_in_list_offsets_and_fetch() {
    let f = Fixture::new().await;
    f.produce(0, 50).await;
    let memory = MemoryWindow::open();
    // The first two ListOffsets (the reset to earliest) get a count of 2^31-1.
    f.proxy.arm(
        ApiKey::ListOffsets,
        Misbehaviour::AbsurdArray {
            count: i32::MAX,
            padding: 1 << 20,
        },
        2,
    );
    let mut consumer = within("build", Duration::from_secs(10), f.consumer().build())
        .await
        .expect("consumer");
    let mut seen = Seen::default();
    seen.read_up_to(&mut consumer, 50, Duration::from_secs(10))
        .await;
    assert_eq!(f.proxy.injected(), 2);
    let connections = f.proxy.connections();
    f.proxy.arm(
        ApiKey::Fetch,
        Misbehaviour::AbsurdArray {
            count: -2,
            padding: 1 << 20,
        },
        2,
    );
    f.produce(50, 50).await;
    seen.read_up_to(&mut consumer, 100, Duration::from_secs(10))
        .await;
    assert_eq!(f.proxy.injected(), 4);
    assert_eq!(
        logged(&["ListOffsets failed", "cannot decode ListOffsets"]),
        2
    );
    assert_eq!(logged(&["fetch failed", "cannot decode Fetch"]), 2);
    // A bad body in a good frame fails its request, not the connection.
    assert_eq!(f.proxy.connections(), connections);
    memory.assert_bounded("consumer, absurd arrays in ListOffsets and Fetch");
}

#[tokio::test]
async fn the_consumer_survives_wrong_and_unsolicited_correlation_ids_on_fetch() {
    let f = Fixture::new().await;
    f.produce(0, 50).await;
    let mut consumer = within("build", Duration::from_secs(10), f.consumer().build())
        .await
        .expect("consumer");
    let mut seen = Seen::default();
    seen.read_up_to(&mut consumer, 50, Duration::from_secs(10))
        .await;
    let connections = f.proxy.connections();
    let memory = MemoryWindow::open();
    f.proxy.arm(
        ApiKey::Fetch,
        Misbehaviour::WrongCorrelationId { offset: 1000 },
        2,
    );
    f.produce(50, 25).await;
    seen.read_up_to(&mut consumer, 75, Duration::from_secs(10))
        .await;
    assert_eq!(f.proxy.injected(), 2);
    assert_eq!(
        logged(&[
            "connection dropped",
            "does not match the oldest in-flight request"
        ]),
        2
    );
    assert_eq!(f.proxy.connections(), connections + 2);
    // A duplicated Fetch response: a second answer to a request never sent. It meets an
    // empty in-flight queue (unsolicited) or the next Fetch (a mismatch); either way
    // the connection goes.
    f.proxy.arm(ApiKey::Fetch, Misbehaviour::Duplicate, 2);
    f.produce(75, 25).await;
    seen.read_up_to(&mut consumer, 100, Duration::from_secs(10))
        .await;
    // The second duplicate may answer a Fetch that found nothing new.
    seen.idle_until(
        &mut consumer,
        "both duplicates noticed",
        Duration::from_secs(5),
        || f.proxy.connections() == connections + 4,
    )
    .await;
    assert_eq!(f.proxy.injected(), 4);
    assert_eq!(
        logged(&["connection dropped", "unsolicited response"])
            + logged(&[
                "connection dropped",
                "does not match the oldest in-flight request"
            ]),
        4
    );
    memory.assert_bounded("consumer, wrong and unsolicited correlation ids");
}

#[tokio::test]
async fn the_consumer_survives_fetch_responses_cut_off_mid_frame() {
    let f = Fixture::new().await;
    f.produce(0, 50).await;
    let mut consumer = within("build", Duration::from_secs(10), f.consumer().build())
        .await
        .expect("consumer");
    let mut seen = Seen::default();
    seen.read_up_to(&mut consumer, 50, Duration::from_secs(10))
        .await;
    let connections = f.proxy.connections();
    let memory = MemoryWindow::open();
    f.proxy.arm(ApiKey::Fetch, Misbehaviour::CutOffThenClose, 2);
    f.produce(50, 25).await;
    seen.read_up_to(&mut consumer, 75, Duration::from_secs(10))
        .await;
    assert_eq!(f.proxy.injected(), 2);
    assert_eq!(logged(&["connection dropped", "closed by broker"]), 2);
    // Held open: only the request timeout (1 s) ends the wait.
    f.proxy.arm(ApiKey::Fetch, Misbehaviour::CutOffThenHold, 2);
    f.produce(75, 25).await;
    seen.read_up_to(&mut consumer, 100, Duration::from_secs(10))
        .await;
    assert_eq!(f.proxy.injected(), 4);
    assert_eq!(
        logged(&["request timed out; dropping the connection", "Fetch"]),
        2
    );
    assert_eq!(f.proxy.connections(), connections + 4);
    memory.assert_bounded("consumer, Fetch cut off mid-frame");
}

// `src/proto/fetch/batch.rs` once reserved `Vec::with_capacity(count)` headers,
// checking the count only against the record's bytes; a header takes 64 bytes in
// memory but can take 2 on the wire, so a 1 MiB record claiming 2^20 headers reserved
// 64 MiB (a 100 MiB frame, ~6 GiB). This test failed until the reservation was bounded.
#[tokio::test]
async fn a_record_claiming_absurd_header_counts_stops_its_partition_and_allocates_little() {
    let f = Fixture::new().await;
    f.produce(0, 50).await;
    let mut consumer = within("build", Duration::from_secs(10), f.consumer().build())
        .await
        .expect("consumer");
    let mut seen = Seen::default();
    seen.read_up_to(&mut consumer, 50, Duration::from_secs(10))
        .await;
    let connections = f.proxy.connections();
    let memory = MemoryWindow::open();
    f.produce(50, 50).await;
    // 2^31-1 headers in a record of 1 MiB; then 2^20 headers, which the bytes left
    // could hold at one byte each, followed by 0xff bytes that are no header.
    for (count, padding) in [(i32::MAX, 1 << 20), (1 << 20, 1 << 20)] {
        f.proxy.arm(
            ApiKey::Fetch,
            Misbehaviour::AbsurdRecordHeaders { count, padding },
            1,
        );
        let err = seen.read_until_error(&mut consumer, 100).await;
        let ottla::Error::Fetch(FetchError::Corrupt {
            topic,
            partition,
            offset,
            source,
        }) = &err
        else {
            panic!("count {count}: expected a corrupt batch, got {err:?}");
        };
        assert_eq!(topic, TOPIC);
        assert!(
            matches!(source.kind, BatchErrorKind::Malformed(_)),
            "count {count}: {source:?}"
        );
        // The partition stopped at the batch: nothing of it was skipped.
        let tp = TopicPartition::new(TOPIC, *partition);
        assert_eq!(consumer.position(&tp), Some(*offset), "count {count}");
        // The application decides to retry the batch; the broker now behaves.
        consumer.seek(&tp, *offset);
    }
    seen.read_up_to(&mut consumer, 100, Duration::from_secs(10))
        .await;
    assert_eq!(f.proxy.injected(), 2);
    assert_eq!(
        f.proxy.connections(),
        connections,
        "records fail, not the connection"
    );
    memory.assert_bounded("records claiming absurd header counts");
}

#[tokio::test]
async fn a_group_consumer_survives_hostile_coordinator_lookups() {
    let f = Fixture::new().await;
    f.produce(0, 50).await;
    let memory = MemoryWindow::open();
    // Bootstrap is honest; the first two FindCoordinator answers claim 2 GiB.
    f.proxy.arm(
        ApiKey::FindCoordinator,
        Misbehaviour::HugeFrame { claimed: i32::MAX },
        2,
    );
    let mut consumer = within(
        "build",
        Duration::from_secs(10),
        Consumer::builder(&f.address())
            .client_config(f.client())
            .group_id("hostile-group")
            .topics([TOPIC])
            .offset_reset(OffsetReset::Earliest)
            .fetch_max_wait(Duration::from_millis(100))
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_millis(500))
            .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
            .build(),
    )
    .await
    .expect("consumer");
    let mut seen = Seen::default();
    seen.read_up_to(&mut consumer, 50, Duration::from_secs(15))
        .await;
    assert_eq!(f.proxy.injected(), 2);
    assert!(
        logged(&["frame of 2147483647 bytes exceeds the maximum"]) >= 2,
        "the hostile FindCoordinator answers were not reported"
    );
    memory.assert_bounded("group consumer, hostile FindCoordinator");
}
