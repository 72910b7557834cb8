//! The librdkafka mock cluster (librdkafka 2.12.1 through `rdkafka-sys` 4.10), in
//! process, driven through its raw C API.
//!
//! `rdkafka::mocking::MockCluster` hides its raw pointer, and several of the calls a
//! test needs (request tracking, per-broker error stacks with delays, the initial
//! rebalance delay, advertised API versions) are only in the C API, so
//! [`MockCluster`] owns both the librdkafka handle that hosts the mock and the mock
//! itself. Its brokers listen on real loopback ports, so any client in the process (or
//! outside it) can connect to [`MockCluster::bootstrap`].
//!
//! # Quirks
//!
//! The mock is librdkafka's test double, checked mostly against librdkafka. Seen from
//! other clients (ottla, kafka-python, sarama, the Java-faithful ones):
//!
//! - **Group APIs advertised but not parseable.** It advertises JoinGroup up to v6 and
//!   SyncGroup, Heartbeat and LeaveGroup up to v4, but cannot parse the flexible
//!   forms of JoinGroup and SyncGroup and drops the connection; it reads every
//!   LeaveGroup as v0. [`MockCluster::cap_group_apis`] caps them at what it parses
//!   (JoinGroup ≤ 5, SyncGroup ≤ 3, Heartbeat ≤ 3, LeaveGroup ≤ 2); call it (or
//!   [`MockClusterBuilder::cap_group_apis`]) for any client but librdkafka.
//! - **Malformed ApiVersions error reply.** To an ApiVersions version above the ones it
//!   knows (v3) it answers UNSUPPORTED_VERSION with a flexible array count where the
//!   protocol mandates the v0 body. A client should read the error code (first in both
//!   layouts), ignore the rest, and retry at a version the reply allows.
//! - **Small retention.** 5 MiB or 100,000 messages per partition; older data silently
//!   disappears. Keep datasets within that.
//! - **SyncGroup race.** A follower's SyncGroup that arrives before the leader's can
//!   get INVALID_REQUEST (42); a short delay before the leader's SyncGroup avoids it.
//! - **Commits refused during a rebalance.** OffsetCommit gets REBALANCE_IN_PROGRESS
//!   while the group is joining or syncing (Kafka accepts commits of the current
//!   generation before the rejoin). A commit made at revocation after the rejoin is
//!   lost on the mock: make it before, or retry.
//! - **Initial rebalance delay.** A new classic group waits 3 s for more members
//!   before its first rebalance; [`MockCluster::set_group_initial_rebalance_delay`]
//!   shortens it.
//! - **KIP-848.** It implements ConsumerGroupHeartbeat, but in 2.12.1 its handler
//!   asserts, aborting the whole test process, for a subscription with topic names and
//!   a null regex, and for an empty subscription on leave.
//! - **Tracked requests** are only those with a version the broker accepts.
//!
//! # Threads
//!
//! Every method takes `&self` and the type is `Send + Sync`: the mock's own thread
//! serves the brokers, and the calls here either take its lock or wait for its thread.

use std::ffi::{CStr, CString, c_char, c_int};
use std::ptr::NonNull;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use rdkafka_sys::bindings as rd;
use rdkafka_sys::bindings::rd_kafka_resp_err_t;

use crate::codes::ErrorCode;
use crate::codes::api_key::{HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, SYNC_GROUP};

/// An in-process librdkafka mock cluster with `n` brokers (ids `1..=n`) listening on
/// loopback ports. Dropping it shuts the brokers down.
///
/// ```
/// use std::time::Duration;
/// use ottla_testkit::{ErrorCode, MockCluster, api_key};
///
/// let mock = MockCluster::builder(3)
///     .cap_group_apis()
///     .initial_rebalance_delay(Duration::from_millis(100))
///     .topic("orders", 6)
///     .start()?;
/// assert_eq!(mock.broker_ids(), [1, 2, 3]);
/// assert_eq!(mock.bootstrap().split(',').count(), 3);
///
/// // Move group "billing" to broker 2, take broker 1 down and up again.
/// mock.set_group_coordinator("billing", 2)?;
/// mock.broker_down(1)?;
/// mock.broker_up(1)?;
///
/// // The next two JoinGroups, on any broker, fail; the next Heartbeat on broker 2
/// // waits 50 ms and gets REBALANCE_IN_PROGRESS (27, given as a number).
/// let loading = ErrorCode::named("COORDINATOR_LOAD_IN_PROGRESS")?;
/// mock.push_request_errors(api_key::JOIN_GROUP, &[loading, ErrorCode::NOT_COORDINATOR]);
/// let rebalancing = (27, Duration::from_millis(50));
/// mock.push_broker_request_errors(2, api_key::HEARTBEAT, &[rebalancing])?;
///
/// mock.start_request_tracking();
/// // ... run the client under test against mock.bootstrap(), then:
/// let joins = mock.requests().iter().filter(|r| r.api_key == api_key::JOIN_GROUP).count();
/// # assert_eq!(joins, 0);
/// # Ok::<(), anyhow::Error>(())
/// ```
pub struct MockCluster {
    /// The mock; destroyed before `handle`.
    cluster: NonNull<rd::rd_kafka_mock_cluster_t>,
    /// The librdkafka producer handle that hosts the mock's thread.
    handle: NonNull<rd::rd_kafka_t>,
    brokers: i32,
    bootstrap: String,
}

// SAFETY: the mock cluster API is thread-safe: every mutating call either takes the
// cluster's mutex (error stacks, request tracking) or is sent as an op to the mock
// cluster's own thread and waited for (`rd_kafka_op_req`). The bootstrap string is
// copied out once at creation. The handle is only used to destroy it, after the mock.
unsafe impl Send for MockCluster {}
// SAFETY: as above; no method relies on exclusive access.
unsafe impl Sync for MockCluster {}

/// One request the mock received while tracking was on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedRequest {
    /// The broker that received it.
    pub broker: i32,
    /// The request's API key.
    pub api_key: i16,
    /// When it arrived, in microseconds of librdkafka's monotonic clock.
    pub timestamp_us: i64,
}

/// `Ok` for `NO_ERROR`, else an error naming the call and the librdkafka error.
fn check(err: rd_kafka_resp_err_t, what: impl FnOnce() -> String) -> anyhow::Result<()> {
    if err == rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Ok(());
    }
    // SAFETY: both return pointers to static, NUL-terminated strings, for any value.
    let (name, desc) = unsafe {
        (
            CStr::from_ptr(rd::rd_kafka_err2name(err)).to_string_lossy(),
            CStr::from_ptr(rd::rd_kafka_err2str(err)).to_string_lossy(),
        )
    };
    bail!("{}: {name} ({}): {desc}", what(), err as i32)
}

fn c_string(s: &str) -> anyhow::Result<CString> {
    CString::new(s).with_context(|| format!("{s:?} contains a NUL byte"))
}

fn millis(d: Duration) -> anyhow::Result<c_int> {
    c_int::try_from(d.as_millis())
        .with_context(|| format!("{d:?} does not fit in an int of milliseconds"))
}

impl MockCluster {
    /// Starts a mock cluster with `brokers` brokers, with the mock's defaults
    /// (uncapped group APIs, a 3 s initial rebalance delay). See also
    /// [`MockCluster::builder`].
    pub fn new(brokers: i32) -> anyhow::Result<Self> {
        ensure!(
            brokers >= 1,
            "a mock cluster needs at least one broker, not {brokers}"
        );
        let mut errstr: [c_char; 512] = [0; 512];
        // SAFETY: `rd_kafka_conf_new` returns a fresh conf; `rd_kafka_conf_set` copies
        // its arguments; `rd_kafka_new` takes ownership of the conf on success only.
        let handle = unsafe {
            let conf = rd::rd_kafka_conf_new();
            ensure!(!conf.is_null(), "rd_kafka_conf_new returned NULL");
            for (key, value) in [("client.id", "ottla-mock-cluster"), ("log_level", "4")] {
                let (k, v) = (c_string(key)?, c_string(value)?);
                let res = rd::rd_kafka_conf_set(
                    conf,
                    k.as_ptr(),
                    v.as_ptr(),
                    errstr.as_mut_ptr(),
                    errstr.len(),
                );
                if res != rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK {
                    rd::rd_kafka_conf_destroy(conf);
                    bail!(
                        "rd_kafka_conf_set {key}: {}",
                        CStr::from_ptr(errstr.as_ptr()).to_string_lossy()
                    );
                }
            }
            let rk = rd::rd_kafka_new(
                rd::rd_kafka_type_t::RD_KAFKA_PRODUCER,
                conf,
                errstr.as_mut_ptr(),
                errstr.len(),
            );
            match NonNull::new(rk) {
                Some(rk) => rk,
                None => {
                    rd::rd_kafka_conf_destroy(conf);
                    bail!(
                        "rd_kafka_new: {}",
                        CStr::from_ptr(errstr.as_ptr()).to_string_lossy()
                    );
                }
            }
        };
        // SAFETY: `handle` is a live handle; on failure it is destroyed here and not used again.
        let cluster = unsafe {
            match NonNull::new(rd::rd_kafka_mock_cluster_new(handle.as_ptr(), brokers)) {
                Some(c) => c,
                None => {
                    rd::rd_kafka_destroy(handle.as_ptr());
                    bail!("rd_kafka_mock_cluster_new({brokers}) failed");
                }
            }
        };
        // SAFETY: the cluster is live; the string it returns lives as long as the
        // cluster and is copied here.
        let bootstrap = unsafe {
            let p = rd::rd_kafka_mock_cluster_bootstraps(cluster.as_ptr());
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        let mock = MockCluster {
            cluster,
            handle,
            brokers,
            bootstrap,
        };
        ensure!(
            !mock.bootstrap.is_empty(),
            "the mock cluster has no bootstrap address"
        );
        Ok(mock)
    }

    /// A builder for a cluster of `brokers` brokers with topics and settings applied
    /// before the first client connects.
    pub fn builder(brokers: i32) -> MockClusterBuilder {
        MockClusterBuilder {
            brokers,
            cap_group_apis: false,
            initial_rebalance_delay: None,
            topics: Vec::new(),
        }
    }

    fn ptr(&self) -> *mut rd::rd_kafka_mock_cluster_t {
        self.cluster.as_ptr()
    }

    /// `host:port,...` of every broker, in broker-id order.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    /// `host:port` of one broker, or `None` for an id that is not in
    /// [`MockCluster::broker_ids`].
    pub fn broker_address(&self, broker: i32) -> Option<String> {
        let index = usize::try_from(broker.checked_sub(1)?).ok()?;
        self.bootstrap.split(',').nth(index).map(str::to_string)
    }

    /// The broker ids, `1..=n`.
    pub fn broker_ids(&self) -> Vec<i32> {
        (1..=self.brokers).collect()
    }

    /// Creates a topic. Fails with `TOPIC_ALREADY_EXISTS` if it exists.
    pub fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication: i32,
    ) -> anyhow::Result<()> {
        ensure!(
            partitions >= 1 && replication >= 1,
            "topic {name}: partitions and replication must be at least 1"
        );
        let topic = c_string(name)?;
        // SAFETY: live cluster; the call copies the name.
        let err = unsafe {
            rd::rd_kafka_mock_topic_create(self.ptr(), topic.as_ptr(), partitions, replication)
        };
        check(err, || {
            format!("create topic {name} ({partitions} partitions, replication {replication})")
        })
    }

    /// Makes `broker` the coordinator of consumer group `group` (a coordinator move:
    /// the old coordinator answers the group's requests with NOT_COORDINATOR).
    pub fn set_group_coordinator(&self, group: &str, broker: i32) -> anyhow::Result<()> {
        let (kind, key) = (c_string("group")?, c_string(group)?);
        // SAFETY: live cluster; the call copies both strings.
        let err = unsafe {
            rd::rd_kafka_mock_coordinator_set(self.ptr(), kind.as_ptr(), key.as_ptr(), broker)
        };
        check(err, || {
            format!("set coordinator of group {group} to broker {broker}")
        })
    }

    /// Makes `broker` the transaction coordinator of `transactional_id` (a coordinator
    /// move: the old coordinator answers the id's InitProducerId, AddPartitionsToTxn,
    /// AddOffsetsToTxn and EndTxn with NOT_COORDINATOR).
    pub fn set_transaction_coordinator(
        &self,
        transactional_id: &str,
        broker: i32,
    ) -> anyhow::Result<()> {
        let (kind, key) = (c_string("transaction")?, c_string(transactional_id)?);
        // SAFETY: live cluster; the call copies both strings.
        let err = unsafe {
            rd::rd_kafka_mock_coordinator_set(self.ptr(), kind.as_ptr(), key.as_ptr(), broker)
        };
        check(err, || {
            format!("set coordinator of transactional id {transactional_id} to broker {broker}")
        })
    }

    /// Takes a broker down: closes its listener and its connections. It keeps its port.
    pub fn broker_down(&self, broker: i32) -> anyhow::Result<()> {
        // SAFETY: live cluster.
        let err = unsafe { rd::rd_kafka_mock_broker_set_down(self.ptr(), broker) };
        check(err, || format!("broker {broker} down"))
    }

    /// Brings a broker back up on its old port.
    pub fn broker_up(&self, broker: i32) -> anyhow::Result<()> {
        // SAFETY: live cluster.
        let err = unsafe { rd::rd_kafka_mock_broker_set_up(self.ptr(), broker) };
        check(err, || format!("broker {broker} up"))
    }

    /// Delays every response of `broker` by `rtt` (millisecond resolution).
    pub fn set_rtt(&self, broker: i32, rtt: Duration) -> anyhow::Result<()> {
        let ms = millis(rtt)?;
        // SAFETY: live cluster.
        let err = unsafe { rd::rd_kafka_mock_broker_set_rtt(self.ptr(), broker, ms) };
        check(err, || format!("set rtt of broker {broker} to {ms} ms"))
    }

    /// Puts `broker` in rack `rack`: Metadata responses carry it as the broker's
    /// `rack`, so each partition's replica racks follow from its replicas' brokers
    /// (what rack-aware assignment, KIP-881, matches against the members' `client.rack`).
    pub fn set_broker_rack(&self, broker: i32, rack: &str) -> anyhow::Result<()> {
        let r = c_string(rack)?;
        // SAFETY: live cluster; the call copies the rack name.
        let err = unsafe { rd::rd_kafka_mock_broker_set_rack(self.ptr(), broker, r.as_ptr()) };
        check(err, || format!("set rack of broker {broker} to {rack}"))
    }

    /// Moves the leadership of one partition (bumping its leader epoch).
    pub fn partition_set_leader(
        &self,
        topic: &str,
        partition: i32,
        broker: i32,
    ) -> anyhow::Result<()> {
        let t = c_string(topic)?;
        // SAFETY: live cluster; the call copies the name.
        let err = unsafe {
            rd::rd_kafka_mock_partition_set_leader(self.ptr(), t.as_ptr(), partition, broker)
        };
        check(err, || {
            format!("set leader of {topic}-{partition} to broker {broker}")
        })
    }

    /// Makes `broker` the partition's preferred read replica (KIP-392): the leader
    /// answers a Fetch v11+ of the partition with no records and this broker as
    /// `preferred_read_replica`, whatever the client's rack, and `broker` serves Fetches
    /// of it within the follower's watermarks. `-1` sends fetches back to the leader.
    pub fn partition_set_follower(
        &self,
        topic: &str,
        partition: i32,
        broker: i32,
    ) -> anyhow::Result<()> {
        let t = c_string(topic)?;
        // SAFETY: live cluster; the call copies the name.
        let err = unsafe {
            rd::rd_kafka_mock_partition_set_follower(self.ptr(), t.as_ptr(), partition, broker)
        };
        check(err, || {
            format!("set follower of {topic}-{partition} to broker {broker}")
        })
    }

    /// Sets the follower's log start and end offsets of a partition (a follower that
    /// lags, or is truncated): a Fetch of the follower outside them is answered with
    /// OFFSET_OUT_OF_RANGE. `-1` follows the leader's again.
    pub fn partition_set_follower_watermarks(
        &self,
        topic: &str,
        partition: i32,
        low: i64,
        high: i64,
    ) -> anyhow::Result<()> {
        let t = c_string(topic)?;
        // SAFETY: live cluster; the call copies the name.
        let err = unsafe {
            rd::rd_kafka_mock_partition_set_follower_wmarks(
                self.ptr(),
                t.as_ptr(),
                partition,
                low,
                high,
            )
        };
        check(err, || {
            format!("set follower watermarks of {topic}-{partition} to {low}..{high}")
        })
    }

    /// Appends errors to the cluster-wide stack for `api_key`: the next requests of that
    /// API, on any broker, get these error codes, one each, in order. The codes are
    /// numbers (`&[16, 27]`) or [`ErrorCode`]s (named ones included). A
    /// librdkafka-internal code such as [`ErrorCode::TRANSPORT`] (`-195`) makes the
    /// broker close the connection instead.
    pub fn push_request_errors<E: Into<ErrorCode> + Copy>(&self, api_key: i16, errors: &[E]) {
        if errors.is_empty() {
            return;
        }
        // The C side reads an array of C enums, i.e. of `int`. The codes stay plain
        // integers on the Rust side (any code, even one librdkafka has no name for).
        let codes: Vec<c_int> = errors
            .iter()
            .map(|&e| c_int::from(e.into().code()))
            .collect();
        // SAFETY: live cluster; `codes` holds `errors.len()` ints, read and copied by
        // the call. The pointer cast never makes Rust read the ints as the enum.
        unsafe {
            rd::rd_kafka_mock_push_request_errors_array(
                self.ptr(),
                api_key,
                codes.len(),
                codes.as_ptr().cast::<rd_kafka_resp_err_t>(),
            )
        }
    }

    /// Appends `(error, delay)` pairs to `broker`'s own stack for `api_key`: the next
    /// requests of that API on that broker get these codes after these delays. The codes
    /// are numbers or [`ErrorCode`]s, as for [`MockCluster::push_request_errors`].
    pub fn push_broker_request_errors<E: Into<ErrorCode> + Copy>(
        &self,
        broker: i32,
        api_key: i16,
        errors: &[(E, Duration)],
    ) -> anyhow::Result<()> {
        for &(code, delay) in errors {
            let code = code.into().code();
            let ms = millis(delay)?;
            // The C function is variadic (`cnt` pairs of `int` error, `int` ms), so push
            // one pair per call; each call appends, so the order is kept.
            // SAFETY: live cluster; exactly `cnt` = 1 pair of ints follows.
            let err = unsafe {
                rd::rd_kafka_mock_broker_push_request_error_rtts(
                    self.ptr(),
                    broker,
                    api_key,
                    1,
                    c_int::from(code),
                    ms,
                )
            };
            check(err, || {
                format!("push error {code} (after {ms} ms) for API {api_key} on broker {broker}")
            })?;
        }
        Ok(())
    }

    /// Empties the cluster-wide error stack of `api_key`.
    pub fn clear_request_errors(&self, api_key: i16) {
        // SAFETY: live cluster.
        unsafe { rd::rd_kafka_mock_clear_request_errors(self.ptr(), api_key) }
    }

    /// Sets the version range the brokers advertise (in ApiVersions) and accept for
    /// `api_key`. A request outside it makes the broker close the connection.
    pub fn set_api_version(&self, api_key: i16, min: i16, max: i16) -> anyhow::Result<()> {
        // SAFETY: live cluster.
        let err = unsafe { rd::rd_kafka_mock_set_apiversion(self.ptr(), api_key, min, max) };
        check(err, || {
            format!("set versions of API {api_key} to {min}..={max}")
        })
    }

    /// Caps the classic group APIs at the versions the mock really parses and answers:
    /// JoinGroup ≤ 5, SyncGroup ≤ 3, Heartbeat ≤ 3, LeaveGroup ≤ 2.
    ///
    /// It advertises JoinGroup v6 and SyncGroup v4 (flexible) but reads their arrays
    /// with the non-flexible layout and drops the connection. It advertises LeaveGroup
    /// up to v4 but reads every version as v0 (one member id, where v3+ send a member
    /// array) and answers without the v3+ members array. Heartbeat v4 works; it is
    /// capped with the others anyway. (ottla's `protocol-tests/tests/fixtures.rs` checks
    /// all of this with a raw client.)
    pub fn cap_group_apis(&self) -> anyhow::Result<()> {
        self.set_api_version(JOIN_GROUP, 0, 5)?;
        self.set_api_version(SYNC_GROUP, 0, 3)?;
        self.set_api_version(HEARTBEAT, 0, 3)?;
        self.set_api_version(LEAVE_GROUP, 0, 2)
    }

    /// How long a new classic group waits for more members before its first rebalance
    /// (3 s by default). Millisecond resolution; saturates at `i32::MAX` ms.
    pub fn set_group_initial_rebalance_delay(&self, delay: Duration) {
        let ms = i32::try_from(delay.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: live cluster.
        unsafe { rd::rd_kafka_mock_group_initial_rebalance_delay_ms(self.ptr(), ms) }
    }

    /// The session timeout of consumer-protocol groups (KIP-848; 30 s by default),
    /// which the broker, not the member, decides on that protocol.
    pub fn set_group_consumer_session_timeout(&self, timeout: Duration) -> anyhow::Result<()> {
        let ms = millis(timeout)?;
        // SAFETY: live cluster.
        unsafe { rd::rd_kafka_mock_set_group_consumer_session_timeout_ms(self.ptr(), ms) };
        Ok(())
    }

    /// The heartbeat interval the mock gives consumer-protocol members (3 s by
    /// default).
    pub fn set_group_consumer_heartbeat_interval(&self, interval: Duration) -> anyhow::Result<()> {
        let ms = millis(interval)?;
        // SAFETY: live cluster.
        unsafe { rd::rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(self.ptr(), ms) };
        Ok(())
    }

    /// Starts recording every request the brokers receive (and forgets earlier ones).
    pub fn start_request_tracking(&self) {
        // SAFETY: live cluster.
        unsafe { rd::rd_kafka_mock_start_request_tracking(self.ptr()) }
    }

    /// Stops recording, and forgets what was recorded.
    pub fn stop_request_tracking(&self) {
        // SAFETY: live cluster.
        unsafe { rd::rd_kafka_mock_stop_request_tracking(self.ptr()) }
    }

    /// Forgets the recorded requests; tracking stays as it is.
    pub fn clear_requests(&self) {
        // SAFETY: live cluster.
        unsafe { rd::rd_kafka_mock_clear_requests(self.ptr()) }
    }

    /// The requests recorded since tracking started, oldest first. Only requests with a
    /// version the broker accepts are recorded.
    pub fn requests(&self) -> Vec<TrackedRequest> {
        let mut count: usize = 0;
        // SAFETY: live cluster. The call returns `count` copies (or NULL when there are
        // none), owned by us and freed by `rd_kafka_mock_request_destroy_array`.
        unsafe {
            let array = rd::rd_kafka_mock_get_requests(self.ptr(), &mut count);
            if array.is_null() {
                return Vec::new();
            }
            let out = std::slice::from_raw_parts(array, count)
                .iter()
                .map(|&r| TrackedRequest {
                    broker: rd::rd_kafka_mock_request_id(r),
                    api_key: rd::rd_kafka_mock_request_api_key(r),
                    timestamp_us: rd::rd_kafka_mock_request_timestamp(r),
                })
                .collect();
            rd::rd_kafka_mock_request_destroy_array(array, count);
            out
        }
    }
}

impl Drop for MockCluster {
    fn drop(&mut self) {
        // SAFETY: both pointers are live and owned by us; the mock runs on the handle,
        // so it is destroyed first.
        unsafe {
            rd::rd_kafka_mock_cluster_destroy(self.cluster.as_ptr());
            rd::rd_kafka_destroy(self.handle.as_ptr());
        }
    }
}

impl std::fmt::Debug for MockCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockCluster")
            .field("brokers", &self.brokers)
            .field("bootstrap", &self.bootstrap)
            .finish_non_exhaustive()
    }
}

/// Settings for a [`MockCluster`] applied before [`MockClusterBuilder::start`] returns,
/// so no client sees the cluster without them. From [`MockCluster::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct MockClusterBuilder {
    brokers: i32,
    cap_group_apis: bool,
    initial_rebalance_delay: Option<Duration>,
    topics: Vec<(String, i32, i32)>,
}

impl MockClusterBuilder {
    /// Caps the classic group APIs at the versions the mock parses
    /// ([`MockCluster::cap_group_apis`]). Needed by every client but librdkafka.
    pub fn cap_group_apis(mut self) -> Self {
        self.cap_group_apis = true;
        self
    }

    /// How long a new classic group waits for more members before its first rebalance
    /// ([`MockCluster::set_group_initial_rebalance_delay`]; 3 s unless set).
    pub fn initial_rebalance_delay(mut self, delay: Duration) -> Self {
        self.initial_rebalance_delay = Some(delay);
        self
    }

    /// Creates topic `name` with `partitions` partitions and replication 1.
    pub fn topic(self, name: &str, partitions: i32) -> Self {
        self.replicated_topic(name, partitions, 1)
    }

    /// Creates topic `name` with `partitions` partitions of `replication` replicas
    /// (at most the number of brokers).
    pub fn replicated_topic(mut self, name: &str, partitions: i32, replication: i32) -> Self {
        self.topics
            .push((name.to_string(), partitions, replication));
        self
    }

    /// Starts the cluster and applies the settings, in the order: version caps,
    /// rebalance delay, topics.
    pub fn start(self) -> anyhow::Result<MockCluster> {
        let mock = MockCluster::new(self.brokers)?;
        if self.cap_group_apis {
            mock.cap_group_apis()?;
        }
        if let Some(delay) = self.initial_rebalance_delay {
            mock.set_group_initial_rebalance_delay(delay);
        }
        for (name, partitions, replication) in &self.topics {
            mock.create_topic(name, *partitions, *replication)?;
        }
        Ok(mock)
    }
}
