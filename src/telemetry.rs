//! Named metrics through the [`metrics`](https://docs.rs/metrics) facade (the `metrics`
//! feature), for Prometheus, OpenTelemetry or any other `metrics` recorder.
//!
//! Every name ottla emits is a constant in [`names`], written once; docs/observability.md
//! lists each with its meaning, unit and labels, and a test checks that the two agree.
//! Without the feature the types here are empty and every call is an empty inline
//! function, so instrumented code has no `cfg` of its own.
//!
//! Handles are registered once, when their labels are first known, and kept: the hot
//! paths (a record processed, a request answered) touch a cached handle, never the
//! recorder's registry.

use std::time::Duration;

use kafka_protocol::messages::ApiKey;

use crate::proto::group::consumer_protocol::TopicPartition;
use crate::proto::process::lanes::{Metric, Stats};
use crate::proto::produce::accumulator::ProduceError;
use crate::stats::CommitResult;

/// The metric names. Dots separate the parts; a Prometheus exporter turns them into
/// underscores (`ottla.consumer.records` is scraped as `ottla_consumer_records`).
pub mod names {
    /// Records handed to the application, by `group`, `topic`, `partition`.
    pub const CONSUMER_RECORDS: &str = "ottla.consumer.records";
    /// Key and value bytes of those records, by `group`, `topic`, `partition`.
    pub const CONSUMER_BYTES: &str = "ottla.consumer.bytes";
    /// Records between the position and the end of the log, by `group`, `topic`,
    /// `partition`, as of the last fetch.
    pub const CONSUMER_LAG: &str = "ottla.consumer.lag";
    /// Partitions assigned, by `group`.
    pub const CONSUMER_ASSIGNED: &str = "ottla.consumer.partitions.assigned";
    /// Generations joined (each JoinGroup/SyncGroup round that ended with an
    /// assignment), by `group`.
    pub const CONSUMER_REBALANCES: &str = "ottla.consumer.rebalances";
    /// Partitions taken away without a chance to commit, by `group`.
    pub const CONSUMER_PARTITIONS_LOST: &str = "ottla.consumer.partitions.lost";
    /// OffsetCommit outcomes, by `group` and `result` (`ok`, or the error's name).
    pub const CONSUMER_COMMITS: &str = "ottla.consumer.commits";

    /// Requests answered, by `api` (its Kafka name, e.g. `Fetch`).
    pub const REQUESTS: &str = "ottla.requests";
    /// Seconds from a request's submission to its answer, by `api`.
    pub const REQUEST_DURATION: &str = "ottla.request.duration";
    /// Requests that failed without an answer (timeout, disconnect), by `api`.
    pub const REQUEST_FAILURES: &str = "ottla.request.failures";
    /// Connections established (after ApiVersions and authentication), by `broker`.
    pub const CONNECTIONS: &str = "ottla.connections";

    /// Records the broker acknowledged (or, with `acks = 0`, that were written), by
    /// `topic`.
    pub const PRODUCER_RECORDS: &str = "ottla.producer.records";
    /// Records that failed for good, by `topic` and `error` (the error's name).
    pub const PRODUCER_ERRORS: &str = "ottla.producer.errors";

    /// The Processor's names follow seed 004 §6: `{prefix}.{suffix}`, where the prefix
    /// is `ProcessorBuilder::metrics_prefix` (`ottla.processor` unless set; the seed's
    /// `{domain}.{entity}`). Records finished, by `group` and `status`
    /// (`success`/`failure`).
    pub const PROCESSED: &str = "processed";
    /// Seconds of handler time per record, by `group`: one observation per handler
    /// call (a `run` task handles up to 256 records of a lane in a row, a `run_batch`
    /// call one batch), its time divided by the records it was called on.
    pub const PROCESSING_DURATION: &str = "processing.duration";
    /// Retries scheduled, by `group` and `retry_attempt` (1 for the first).
    pub const RETRY_COUNT: &str = "retry.count";
    /// Seconds of delay before each retry, by `group` and `retry_attempt`.
    pub const RETRY_DELAY: &str = "retry.delay";
    /// Records dead-lettered (the write acknowledged), by `group`, `error_type` and
    /// `error_classification` (`retryable`/`non-retryable`).
    pub const DLQ_COUNT: &str = "dlq.count";
    /// Handler failures, by `group`, `error_type` and `error_classification`.
    pub const ERROR_COUNT: &str = "error.count";
    /// Records skipped (`ProcessError::skip`), by `group` and `error_type`.
    pub const SKIPPED: &str = "skipped";
    /// Records sent on to a retry topic, by `group` and `hop`.
    pub const RETRY_TOPIC_COUNT: &str = "retry_topic.count";
    /// Refusals the group member keeps retrying through (a missing topic or group
    /// ACL, `Metric::GroupRetrying`), by `group` and `api`.
    pub const GROUP_REFUSED: &str = "group.refused";
    /// Partition offsets committed (one per partition per commit; a commit of two
    /// partitions counts 2), by `group`.
    pub const COMMITS: &str = "commits";
    /// Exactly once: transactions ended, by `outcome` (`committed` or `aborted`).
    pub const TRANSACTIONS: &str = "transactions";
    /// Partitions halted because the dead-letter topic cannot be written, by `group`.
    pub const PARTITIONS_HALTED: &str = "partitions.halted";

    /// Seconds from a rebalance's first JoinGroup (or the revocation that starts it)
    /// to the assignment, by `group`.
    pub const CONSUMER_REBALANCE_DURATION: &str = "ottla.consumer.rebalance.duration";
    /// Seconds a broker asked the client to wait (`throttle_time_ms`, quotas), by
    /// `api` (Fetch and Produce answers).
    pub const REQUEST_THROTTLE: &str = "ottla.request.throttle";
    /// Bytes of each record batch sent in a Produce request (compressed), every topic.
    pub const PRODUCER_BATCH_SIZE: &str = "ottla.producer.batch.size";
    /// Record batches sent again after a failed or refused attempt.
    pub const PRODUCER_RETRIES: &str = "ottla.producer.retries";
    /// Records fetched and waiting in the lanes for their handler call, by `group`.
    pub const QUEUE_DEPTH: &str = "queue.depth";
    /// Seconds a record waited behind an earlier record of its key before its handler
    /// call (key ordering; only records that arrived while their key was busy), by
    /// `group`.
    pub const KEY_WAIT: &str = "key.wait";

    /// Every name outside the Processor.
    pub const CLIENT: &[&str] = &[
        CONSUMER_RECORDS,
        CONSUMER_BYTES,
        CONSUMER_LAG,
        CONSUMER_ASSIGNED,
        CONSUMER_REBALANCES,
        CONSUMER_PARTITIONS_LOST,
        CONSUMER_COMMITS,
        CONSUMER_REBALANCE_DURATION,
        REQUESTS,
        REQUEST_DURATION,
        REQUEST_FAILURES,
        REQUEST_THROTTLE,
        CONNECTIONS,
        PRODUCER_RECORDS,
        PRODUCER_ERRORS,
        PRODUCER_BATCH_SIZE,
        PRODUCER_RETRIES,
    ];

    /// Every Processor suffix.
    pub const PROCESSOR: &[&str] = &[
        PROCESSED,
        PROCESSING_DURATION,
        RETRY_COUNT,
        RETRY_DELAY,
        DLQ_COUNT,
        ERROR_COUNT,
        SKIPPED,
        RETRY_TOPIC_COUNT,
        GROUP_REFUSED,
        COMMITS,
        TRANSACTIONS,
        PARTITIONS_HALTED,
        QUEUE_DEPTH,
        KEY_WAIT,
    ];
}

/// The Processor's prefix unless `ProcessorBuilder::metrics_prefix` sets one.
pub const DEFAULT_PROCESSOR_PREFIX: &str = "ottla.processor";

#[cfg(feature = "metrics")]
mod on {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::{Mutex, OnceLock};

    use metrics::{Counter, Gauge, Histogram, Label, counter, gauge, histogram};

    use super::*;
    use crate::proto::group::member::GroupError;
    use crate::sync::lock;

    fn labels(group: &str, more: &[(&'static str, String)]) -> Vec<Label> {
        let mut out = vec![Label::new("group", group.to_string())];
        out.extend(more.iter().map(|(k, v)| Label::new(*k, v.clone())));
        out
    }

    /// A Processor's metrics, fed from its [`Metric`] events.
    #[derive(Debug)]
    pub(crate) struct ProcessorMetrics {
        prefix: String,
        group: String,
        succeeded: Counter,
        failed: Counter,
        duration: Histogram,
        commits: Counter,
        halted: Gauge,
        queued: Gauge,
        /// The succeeded and dead-lettered totals the counters have been told.
        told: (AtomicU64, AtomicU64),
        /// Handles whose labels vary (attempt, error type, hop), registered on first
        /// use. Only failures reach them.
        counters: Mutex<HashMap<(&'static str, Vec<Label>), Counter>>,
        histograms: Mutex<HashMap<(&'static str, Vec<Label>), Histogram>>,
    }

    /// The handle for `{prefix}.{suffix}` with `labels`, from `cache` or registered
    /// there by `register`.
    fn cached<H: Clone>(
        cache: &Mutex<HashMap<(&'static str, Vec<Label>), H>>,
        prefix: &str,
        suffix: &'static str,
        labels: Vec<Label>,
        register: impl FnOnce(String, Vec<Label>) -> H,
    ) -> H {
        lock(cache)
            .entry((suffix, labels))
            .or_insert_with_key(|(suffix, labels)| {
                register(format!("{prefix}.{suffix}"), labels.clone())
            })
            .clone()
    }

    impl ProcessorMetrics {
        pub(crate) fn new(prefix: &str, group: &str) -> Self {
            let name = |suffix: &str| format!("{prefix}.{suffix}");
            let status = |s: &str| labels(group, &[("status", s.to_string())]);
            Self {
                prefix: prefix.to_string(),
                group: group.to_string(),
                succeeded: counter!(name(names::PROCESSED), status("success")),
                failed: counter!(name(names::PROCESSED), status("failure")),
                duration: histogram!(name(names::PROCESSING_DURATION), labels(group, &[])),
                commits: counter!(name(names::COMMITS), labels(group, &[])),
                halted: gauge!(name(names::PARTITIONS_HALTED), labels(group, &[])),
                queued: gauge!(name(names::QUEUE_DEPTH), labels(group, &[])),
                told: (AtomicU64::new(0), AtomicU64::new(0)),
                counters: Mutex::new(HashMap::new()),
                histograms: Mutex::new(HashMap::new()),
            }
        }

        fn count(&self, suffix: &'static str, more: &[(&'static str, String)]) {
            let labels = labels(&self.group, more);
            cached(&self.counters, &self.prefix, suffix, labels, |n, l| {
                counter!(n, l)
            })
            .increment(1);
        }

        fn time(&self, suffix: &'static str, more: &[(&'static str, String)], d: Duration) {
            let labels = labels(&self.group, more);
            cached(&self.histograms, &self.prefix, suffix, labels, |n, l| {
                histogram!(n, l)
            })
            .record(d.as_secs_f64());
        }

        /// The finished records so far, from the lanes' counters: nothing is counted
        /// per record. The counters are told what was added since the last call, not
        /// the totals: two Processors of one group in one process share a counter,
        /// which `absolute` would set to the larger of their totals, not their sum.
        pub(crate) fn publish(&self, stats: &Stats, queued: usize) {
            self.queued.set(queued as f64);
            let since = |told: &AtomicU64, now: u64| now.saturating_sub(told.swap(now, Relaxed));
            self.succeeded
                .increment(since(&self.told.0, stats.succeeded));
            self.failed
                .increment(since(&self.told.1, stats.dead_lettered));
        }

        /// A handler call took `took` for `records` records: one observation, the
        /// time per record. One per record (`record_many`) is a push per record
        /// into the recorder's bucket, and cost the Processor a fifth more CPU.
        pub(crate) fn handled(&self, records: usize, took: Duration) {
            if let Ok(n) = u32::try_from(records) {
                if n > 0 {
                    self.duration.record((took / n).as_secs_f64());
                }
            }
        }

        pub(crate) fn observe(&self, m: &Metric) {
            match m {
                // Counted by `publish` and timed by `handled`.
                Metric::Processed { .. } => {}
                Metric::Retry { attempt, delay } => {
                    let attempt = [("retry_attempt", attempt.to_string())];
                    self.count(names::RETRY_COUNT, &attempt);
                    self.time(names::RETRY_DELAY, &attempt, *delay);
                }
                Metric::Skipped { error_type } => {
                    self.count(names::SKIPPED, &[("error_type", error_type.clone())]);
                }
                Metric::Error { error_type, class } => self.count(
                    names::ERROR_COUNT,
                    &[
                        ("error_type", error_type.clone()),
                        ("error_classification", class.label().to_string()),
                    ],
                ),
                Metric::DeadLettered {
                    error_type, class, ..
                } => self.count(
                    names::DLQ_COUNT,
                    &[
                        ("error_type", error_type.clone()),
                        ("error_classification", class.label().to_string()),
                    ],
                ),
                Metric::RetryTopic { hop, .. } => {
                    self.count(names::RETRY_TOPIC_COUNT, &[("hop", hop.to_string())]);
                }
                Metric::GroupRetrying { error } => {
                    let api = match error {
                        GroupError::Broker { api, .. }
                        | GroupError::TopicAuthorization { api, .. } => *api,
                        _ => "other",
                    };
                    self.count(names::GROUP_REFUSED, &[("api", api.to_string())]);
                }
                Metric::Committed { .. } => self.commits.increment(1),
                Metric::Transaction { committed, .. } => {
                    let outcome = if *committed { "committed" } else { "aborted" };
                    self.count(names::TRANSACTIONS, &[("outcome", outcome.to_string())]);
                }
                Metric::Halted { partitions } => self.halted.set(*partitions as f64),
                Metric::KeyWait { waited } => self.time(names::KEY_WAIT, &[], *waited),
                // The consumer under the Processor reports its group's rebalances,
                // assignment and losses.
                Metric::Joined { .. }
                | Metric::Assigned { .. }
                | Metric::RevokeRequested { .. }
                | Metric::Revoked { .. }
                | Metric::Lost { .. } => {}
                // A metric named here later: nothing recorded until it is.
                _ => {}
            }
        }
    }

    /// One partition's handles, kept with its delivery counts
    /// ([`DeliveryCounts`](crate::stats::DeliveryCounts)).
    #[derive(Debug)]
    pub(crate) struct PartitionMetrics {
        tp: TopicPartition,
        records: Counter,
        bytes: Counter,
        lag: Gauge,
    }

    impl PartitionMetrics {
        pub(crate) fn new(group: &str, topic: &str, partition: i32) -> Self {
            let l = labels(
                group,
                &[
                    ("topic", topic.to_string()),
                    ("partition", partition.to_string()),
                ],
            );
            Self {
                tp: TopicPartition {
                    topic: topic.to_string(),
                    partition,
                },
                records: counter!(names::CONSUMER_RECORDS, l.clone()),
                bytes: counter!(names::CONSUMER_BYTES, l.clone()),
                lag: gauge!(names::CONSUMER_LAG, l),
            }
        }

        /// `records` records of `bytes` bytes were handed over; `lag` gives the
        /// partition's lag after them, when known.
        pub(crate) fn delivered(
            &self,
            records: u64,
            bytes: u64,
            lag: impl FnOnce(&TopicPartition) -> Option<i64>,
        ) {
            self.records.increment(records);
            self.bytes.increment(bytes);
            if let Some(lag) = lag(&self.tp) {
                self.lag.set(lag as f64);
            }
        }
    }

    /// A consumer's group handles, kept with its group counts
    /// ([`GroupCounts`](crate::stats::GroupCounts)).
    #[derive(Debug)]
    pub(crate) struct GroupMetrics {
        group: String,
        assigned: Gauge,
        rebalances: Counter,
        rebalance_duration: Histogram,
        lost: Counter,
        commits: HashMap<&'static str, Counter>,
    }

    impl GroupMetrics {
        pub(crate) fn new(group: &str) -> Self {
            Self {
                assigned: gauge!(names::CONSUMER_ASSIGNED, labels(group, &[])),
                rebalances: counter!(names::CONSUMER_REBALANCES, labels(group, &[])),
                rebalance_duration: histogram!(
                    names::CONSUMER_REBALANCE_DURATION,
                    labels(group, &[])
                ),
                lost: counter!(names::CONSUMER_PARTITIONS_LOST, labels(group, &[])),
                commits: HashMap::new(),
                group: group.to_string(),
            }
        }

        pub(crate) fn joined(&self) {
            self.rebalances.increment(1);
        }

        pub(crate) fn rebalanced(&self, took: Duration) {
            self.rebalance_duration.record(took.as_secs_f64());
        }

        pub(crate) fn assigned(&self, owned: u64) {
            self.assigned.set(owned as f64);
        }

        pub(crate) fn lost(&self, partitions: u64) {
            self.lost.increment(partitions);
        }

        pub(crate) fn committed(&mut self, result: CommitResult) {
            let group = &self.group;
            let result = result.label();
            self.commits
                .entry(result)
                .or_insert_with(|| {
                    counter!(
                        names::CONSUMER_COMMITS,
                        labels(group, &[("result", result.to_string())])
                    )
                })
                .increment(1);
        }
    }

    /// One topic's producer handles, kept with its counts
    /// ([`ProduceCounts`](crate::stats::ProduceCounts)).
    #[derive(Debug)]
    pub(crate) struct TopicMetrics {
        topic: String,
        records: Counter,
    }

    impl TopicMetrics {
        pub(crate) fn new(topic: &str) -> Self {
            Self {
                topic: topic.to_string(),
                records: counter!(names::PRODUCER_RECORDS, "topic" => topic.to_string()),
            }
        }

        pub(crate) fn acknowledged(&self, records: u64) {
            self.records.increment(records);
        }

        /// A record failed for good with the error labelled `error`.
        pub(crate) fn failed(&self, error: &str) {
            counter!(names::PRODUCER_ERRORS, "topic" => self.topic.clone(), "error" => error.to_string())
                .increment(1);
        }
    }

    /// One API's request handles.
    #[derive(Debug)]
    struct ApiMetrics {
        answered: Counter,
        duration: Histogram,
        failed: Counter,
        throttle: Histogram,
    }

    impl ApiMetrics {
        fn register(api: ApiKey) -> Self {
            let name = format!("{api:?}");
            ApiMetrics {
                answered: counter!(names::REQUESTS, "api" => name.clone()),
                duration: histogram!(names::REQUEST_DURATION, "api" => name.clone()),
                failed: counter!(names::REQUEST_FAILURES, "api" => name.clone()),
                throttle: histogram!(names::REQUEST_THROTTLE, "api" => name),
            }
        }
    }

    /// One slot per API key, above every key Kafka has assigned.
    const API_SLOTS: usize = 128;

    /// Request handles by API key, registered on first use, for the whole process:
    /// every connection task reports each answer, so the lookup takes no lock.
    fn with_api(api: ApiKey, f: impl FnOnce(&ApiMetrics)) {
        static APIS: [OnceLock<ApiMetrics>; API_SLOTS] = [const { OnceLock::new() }; API_SLOTS];
        match usize::try_from(api as i16).ok().and_then(|i| APIS.get(i)) {
            Some(slot) => f(slot.get_or_init(|| ApiMetrics::register(api))),
            // A key past the table: registered each time, uncached.
            None => f(&ApiMetrics::register(api)),
        }
    }

    /// A request was answered `took` after it was written.
    pub(crate) fn request_answered(key: ApiKey, took: Duration) {
        with_api(key, |m| {
            m.answered.increment(1);
            m.duration.record(took.as_secs_f64());
        });
    }

    /// A request failed without an answer.
    pub(crate) fn request_failed(key: ApiKey) {
        with_api(key, |m| m.failed.increment(1));
    }

    pub(crate) fn connected(broker: &str) {
        counter!(names::CONNECTIONS, "broker" => broker.to_string()).increment(1);
    }

    /// A broker's answer asked for `throttle_ms` of quiet.
    pub(crate) fn throttled(key: ApiKey, throttle_ms: i32) {
        with_api(key, |m| {
            m.throttle.record(f64::from(throttle_ms.max(0)) / 1000.0);
        });
    }

    /// A Produce request went out with batches of these sizes, and the producer has
    /// sent `retries` batches again so far.
    pub(crate) fn produce_sent(batch_bytes: impl Iterator<Item = usize>, retries: u64) {
        static HANDLES: OnceLock<(Histogram, Counter)> = OnceLock::new();
        let (size, sent_again) = HANDLES.get_or_init(|| {
            (
                histogram!(names::PRODUCER_BATCH_SIZE),
                counter!(names::PRODUCER_RETRIES),
            )
        });
        for b in batch_bytes {
            size.record(b as f64);
        }
        // Producers in one process share the counter: each adds its own increase.
        if retries > 0 {
            sent_again.increment(retries);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod on {
    use super::*;

    /// Without the `metrics` feature: nothing.
    #[derive(Debug)]
    pub(crate) struct ProcessorMetrics;

    impl ProcessorMetrics {
        #[inline(always)]
        pub(crate) fn new(_prefix: &str, _group: &str) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn observe(&self, _m: &Metric) {}
        #[inline(always)]
        pub(crate) fn publish(&self, _stats: &Stats, _queued: usize) {}
        #[inline(always)]
        pub(crate) fn handled(&self, _records: usize, _took: Duration) {}
    }

    /// Without the `metrics` feature: nothing.
    #[derive(Debug)]
    pub(crate) struct PartitionMetrics;

    impl PartitionMetrics {
        #[inline(always)]
        pub(crate) fn new(_group: &str, _topic: &str, _partition: i32) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn delivered(
            &self,
            _records: u64,
            _bytes: u64,
            _lag: impl FnOnce(&TopicPartition) -> Option<i64>,
        ) {
        }
    }

    /// Without the `metrics` feature: nothing.
    #[derive(Debug)]
    pub(crate) struct GroupMetrics;

    impl GroupMetrics {
        #[inline(always)]
        pub(crate) fn new(_group: &str) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn joined(&self) {}

        pub(crate) fn rebalanced(&self, _took: Duration) {}
        #[inline(always)]
        pub(crate) fn assigned(&self, _owned: u64) {}
        #[inline(always)]
        pub(crate) fn lost(&self, _partitions: u64) {}
        #[inline(always)]
        pub(crate) fn committed(&mut self, _result: CommitResult) {}
    }

    /// Without the `metrics` feature: nothing.
    #[derive(Debug)]
    pub(crate) struct TopicMetrics;

    impl TopicMetrics {
        #[inline(always)]
        pub(crate) fn new(_topic: &str) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn acknowledged(&self, _records: u64) {}
        #[inline(always)]
        pub(crate) fn failed(&self, _error: &str) {}
    }

    #[inline(always)]
    pub(crate) fn request_answered(_api: ApiKey, _took: Duration) {}
    #[inline(always)]
    pub(crate) fn request_failed(_api: ApiKey) {}

    pub(crate) fn throttled(_api: ApiKey, _throttle_ms: i32) {}

    pub(crate) fn produce_sent(_batch_bytes: impl Iterator<Item = usize>, _retries: u64) {}
    #[inline(always)]
    pub(crate) fn connected(_broker: &str) {}
}

pub(crate) use on::*;

/// The `error` label of a record that failed: the broker's error name, or the kind of
/// failure. [`ProducerStats`](crate::stats::ProducerStats) counts by it too.
pub(crate) fn produce_error_label(e: &ProduceError) -> String {
    match e {
        ProduceError::Broker { code, .. } => crate::proto::error_name(*code),
        ProduceError::Timeout { .. } => "delivery_timeout".into(),
        ProduceError::Encode(_) => "encode".into(),
        ProduceError::Closed => "closed".into(),
        ProduceError::Connection(_) => "connection".into(),
        _ => "other".into(),
    }
}

/// Whether the named metrics are compiled in (the `metrics` feature). The Processor
/// then times every handler call, as it does for a `metrics` hook; ottla's benchmark
/// programs refuse to run with it, so that their figures are the default build's.
pub const ENABLED: bool = cfg!(feature = "metrics");

#[cfg(test)]
mod tests {
    use super::names;

    const DOC: &str = include_str!("../docs/observability.md");

    /// The first cell of every table row of docs/observability.md that names a metric
    /// (its second cell is the type: the spans' table has rows of the same shape).
    fn documented() -> Vec<&'static str> {
        DOC.lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter(|l| {
                l.split('|').nth(1).is_some_and(|kind| {
                    let kind = kind.trim();
                    ["counter", "gauge", "histogram"]
                        .iter()
                        .any(|k| kind.starts_with(k))
                })
            })
            .filter_map(|l| l.split('`').next())
            .collect()
    }

    #[test]
    fn every_metric_is_documented_and_every_documented_metric_exists() {
        let documented = documented();
        for name in names::CLIENT.iter().chain(names::PROCESSOR) {
            assert!(
                documented.contains(name),
                "{name} is missing from docs/observability.md"
            );
        }
        for name in &documented {
            assert!(
                names::CLIENT.contains(name) || names::PROCESSOR.contains(name),
                "docs/observability.md lists {name}, which ottla does not emit"
            );
        }
        assert_eq!(
            documented.len(),
            names::CLIENT.len() + names::PROCESSOR.len()
        );
    }
}
