//! The librdkafka mock cluster (librdkafka 2.12.1 through `rdkafka-sys` 4.10), driven
//! through its raw C API.
//!
//! `rdkafka::mocking::MockCluster` hides its raw pointer, and several of the calls the
//! suites need (request tracking, per-broker error stacks with delays, the initial
//! rebalance delay, advertised API versions) are only in the C API, so this wrapper
//! owns both the librdkafka handle that hosts the mock and the mock itself.
//!
//! See `PEERS.md` for the mock's quirks. The one that matters most to a non-librdkafka
//! client is that it advertises flexible versions of the classic group APIs that it
//! cannot parse; [`MockCluster::cap_group_apis`] caps them.

use std::ffi::{CStr, CString, c_char, c_int};
use std::ptr::NonNull;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use rdkafka_sys::bindings as rd;
use rdkafka_sys::bindings::rd_kafka_resp_err_t;

/// Kafka API keys used by [`MockCluster::cap_group_apis`].
const JOIN_GROUP: i16 = 11;
const HEARTBEAT: i16 = 12;
const LEAVE_GROUP: i16 = 13;
const SYNC_GROUP: i16 = 14;

/// An in-process librdkafka mock cluster with `n` brokers (ids `1..=n`) listening on
/// loopback ports. Dropping it shuts the brokers down.
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
    /// Starts a mock cluster with `brokers` brokers.
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

    fn ptr(&self) -> *mut rd::rd_kafka_mock_cluster_t {
        self.cluster.as_ptr()
    }

    /// `host:port,...` of every broker, in broker-id order.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
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

    /// Makes `broker` the coordinator of consumer group `group`.
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

    /// Appends errors to the cluster-wide stack for `api_key`: the next requests of that
    /// API, on any broker, get these error codes, one each, in order. A librdkafka-internal
    /// code such as `-195` (`__TRANSPORT`) makes the broker close the connection instead.
    pub fn push_request_errors(&self, api_key: i16, errors: &[i16]) {
        if errors.is_empty() {
            return;
        }
        // The C side reads an array of C enums, i.e. of `int`. The codes stay plain
        // integers on the Rust side (any code, even one librdkafka has no name for).
        let codes: Vec<c_int> = errors.iter().map(|&e| c_int::from(e)).collect();
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
    /// requests of that API on that broker get these codes after these delays.
    pub fn push_broker_request_errors(
        &self,
        broker: i32,
        api_key: i16,
        errors: &[(i16, Duration)],
    ) -> anyhow::Result<()> {
        for &(code, delay) in errors {
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

    /// Sets the version range the brokers advertise and accept for `api_key`. A
    /// request outside it makes the broker close the connection.
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
    /// capped with the others anyway. (`tests/fixtures.rs` checks all of this.)
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
