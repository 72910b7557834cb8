//! A group coordinator whose host goes silent: it accepts the member's bytes and never
//! answers, and never closes the connection (no RST, no FIN: the case a dead host or a
//! dropped route gives, which no error code reports). A proxy in front of tansu turns
//! the member's coordinator connection into such a black hole at one request (see
//! [`CorruptingProxy::silencing`]); the fetch connection, and every connection opened
//! later, keep working, as when only the coordinator's host is gone. For each state the
//! member can be in when that happens, the time it takes to be a working member again
//! is measured and bounded by the Java client's figure for that state plus the time a
//! rejoin takes on tansu:
//!
//! | state   | the silenced request | Java gives up after |
//! |---------|----------------------|---------------------|
//! | Joining | JoinGroup            | `max.poll.interval.ms` + 5 s (the JoinGroup timeout) |
//! | Syncing | SyncGroup            | `request.timeout.ms` |
//! | Stable  | Heartbeat            | min(`request.timeout.ms` + `heartbeat.interval.ms`, `session.timeout.ms`) |
//!
//! Timers: session 6 s, heartbeat 1 s, request 5 s, max.poll.interval 10 s. With them
//! the two Stable figures coincide (5 s + 1 s = 6 s), so one more Stable test takes a
//! request timeout of 15 s, where only the session clock can bound the recovery. Each
//! test prints its measurement in one line, to be quoted.

use std::time::{Duration, Instant};

use kafka_protocol::messages::ApiKey;
use ottla::consumer::{Consumer, ConsumerBuilder, ConsumerEvent, Events, OffsetReset};
use protocol_tests::data::produce;
use protocol_tests::proxy::CorruptingProxy;
use protocol_tests::tansu::{Tansu, behind_a_front};

const SESSION: Duration = Duration::from_secs(6);
const HEARTBEAT: Duration = Duration::from_secs(1);
const REQUEST: Duration = Duration::from_secs(5);
const MAX_POLL: Duration = Duration::from_secs(10);
const PARTITIONS: i32 = 3;
/// Records written before the member starts, read once it is assigned.
const RECORDS: u64 = 30;
/// What a rejoin costs after the member has given up on the silent connection: tansu
/// holds every JoinGroup for half the session (3 s), and before and around it come a
/// FindCoordinator, a fresh connection, the MEMBER_ID_REQUIRED round (a new member),
/// a SyncGroup and the retry backoff (100 ms to 1 s); 3 s more for those on a noisy
/// two-core machine that also runs the broker.
const REJOIN: Duration = Duration::from_secs(6);

/// tansu advertising a proxy that silences the first connection to send `api` once
/// armed, with a topic of [`PARTITIONS`] partitions holding [`RECORDS`] records.
struct Setup {
    _tansu: Tansu,
    proxy: CorruptingProxy,
    topic: &'static str,
    /// The member's `request.timeout.ms`.
    request: Duration,
}

impl Setup {
    async fn start(topic: &'static str, api: ApiKey) -> Setup {
        Setup::with_request_timeout(topic, api, REQUEST).await
    }

    async fn with_request_timeout(topic: &'static str, api: ApiKey, request: Duration) -> Setup {
        protocol_tests::init_tracing();
        let (listener, tansu, upstream) = behind_a_front(topic, PARTITIONS).await.expect("tansu");
        let proxy = CorruptingProxy::silencing(listener, upstream, api as i16);
        produce(&proxy.address(), topic, PARTITIONS, 0, RECORDS, "none")
            .await
            .expect("produce");
        Setup {
            _tansu: tansu,
            proxy,
            topic,
            request,
        }
    }

    fn member(&self) -> ConsumerBuilder {
        Consumer::builder(&self.proxy.address())
            .group_id(format!("{}-group", self.topic))
            .topics([self.topic])
            .offset_reset(OffsetReset::Earliest)
            .session_timeout(SESSION)
            .heartbeat_interval(HEARTBEAT)
            .max_poll_interval(MAX_POLL)
            .set("request.timeout.ms", &self.request.as_millis().to_string())
            .expect("request.timeout.ms")
            .client_id("silent")
    }
}

/// One member read the way an application reads it: records and events, each group
/// event stamped with the moment the test saw it.
struct Member {
    consumer: Consumer,
    events: Events,
    seen: Vec<(Instant, ConsumerEvent)>,
    records: u64,
}

impl Member {
    async fn start(setup: &Setup) -> Member {
        let mut consumer = setup.member().build().await.expect("consumer");
        let events = consumer.take_events();
        Member {
            consumer,
            events,
            seen: Vec::new(),
            records: 0,
        }
    }

    /// Waits up to 100 ms for a record or an event. Coming back often keeps the
    /// progress guard (`max.poll.interval.ms`) quiet, as a reading application does.
    async fn step(&mut self) {
        tokio::select! {
            event = self.events.recv() => {
                if let Some(e) = event {
                    self.seen.push((Instant::now(), e));
                }
            }
            record = self.consumer.recv() => {
                if let Some(Ok(_)) = record {
                    self.records += 1;
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }

    /// When the member was first assigned every partition after `after`.
    fn fully_assigned_after(&self, after: Instant) -> Option<Instant> {
        self.seen.iter().find_map(|(at, e)| match e {
            ConsumerEvent::Assigned { assignment, .. }
                if *at >= after && assignment.len() == PARTITIONS as usize =>
            {
                Some(*at)
            }
            _ => None,
        })
    }

    /// The group events seen after `after`, by name, for the report.
    fn story_after(&self, after: Instant) -> String {
        let names: Vec<String> = self
            .seen
            .iter()
            .filter(|(at, _)| *at >= after)
            .map(|(at, e)| {
                let name = format!("{e:?}");
                let name = name.split([' ', '(', '{']).next().unwrap_or("").to_string();
                format!("{name}@{:.1}s", at.duration_since(after).as_secs_f64())
            })
            .collect();
        names.join(", ")
    }

    /// Steps until every record was read, or fails after `limit`.
    async fn read_all(&mut self, limit: Duration) {
        let start = Instant::now();
        while self.records < RECORDS {
            assert!(
                start.elapsed() < limit,
                "read {} of {RECORDS} records in {limit:?}",
                self.records
            );
            self.step().await;
        }
    }
}

/// Silences the member's coordinator connection at its first `api` request, which the
/// member sends before it owns anything, and measures the time from the silencing to
/// the member being assigned every partition: the one signal both a JoinGroup and a
/// SyncGroup failure lead to, and the first moment an application could read again.
/// Then checks it does read every record.
async fn silenced_before_assignment(
    topic: &'static str,
    api: ApiKey,
    state: &str,
    bound: Duration,
) {
    let setup = Setup::start(topic, api).await;
    setup.proxy.arm();
    let mut member = Member::start(&setup).await;
    let start = Instant::now();
    let limit = bound + REJOIN + Duration::from_secs(30);
    let assigned = loop {
        if let Some(at) = setup
            .proxy
            .silenced_at()
            .and_then(|silenced| member.fully_assigned_after(silenced))
        {
            break at;
        }
        assert!(
            start.elapsed() < limit,
            "no assignment within {limit:?}; silenced: {}; events: {}",
            setup.proxy.silenced(),
            member.story_after(start)
        );
        member.step().await;
    };
    let silenced = setup.proxy.silenced_at().expect("silenced");
    let recovered = assigned.duration_since(silenced);
    eprintln!(
        "silent coordinator while {state}: recovered in {:.1} s (Java bound {:.0} s + rejoin {:.0} s); events: {}",
        recovered.as_secs_f64(),
        bound.as_secs_f64(),
        REJOIN.as_secs_f64(),
        member.story_after(silenced)
    );
    assert_eq!(
        setup.proxy.silenced(),
        1,
        "exactly the member's first {api:?} connection went silent"
    );
    assert!(
        recovered <= bound + REJOIN,
        "while {state}: assigned {recovered:?} after the silence; Java gives up after {bound:?}, a rejoin takes up to {REJOIN:?}"
    );
    member.read_all(Duration::from_secs(15)).await;
}

/// The JoinGroup is never answered. Java's member gives up on it after the JoinGroup
/// timeout (the rebalance timeout, `max.poll.interval.ms`, plus 5 s), then finds the
/// coordinator again and rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_silent_coordinator_while_joining_is_left_within_the_join_timeout() {
    silenced_before_assignment(
        "silent-join",
        ApiKey::JoinGroup,
        "Joining",
        MAX_POLL + Duration::from_secs(5),
    )
    .await;
}

/// The SyncGroup is never answered. Java waits `request.timeout.ms` for it (a follower's
/// SyncGroup waits at the broker only for the leader's, which comes at once), then
/// rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_silent_coordinator_while_syncing_is_left_within_the_request_timeout() {
    silenced_before_assignment("silent-sync", ApiKey::SyncGroup, "Syncing", REQUEST).await;
}

/// The coordinator goes silent at a Heartbeat once the member is Stable. Java's
/// heartbeat thread gives up on the heartbeat after `request.timeout.ms` (it was sent up
/// to a heartbeat interval after the last answer), or on the session after
/// `session.timeout.ms`, whichever is first; then it finds the coordinator again.
///
/// Recovery here is the first commit after the silencing that succeeds while the member
/// owns every partition: a commit carries the member id and generation, so the
/// coordinator accepting it means the member is in the group again, whether it kept its
/// generation (a heartbeat on a new connection made it in time) or had to rejoin (the
/// session lapsed at the broker). Fetching runs on its own connection, so records alone
/// would show nothing. Commits are probed one at a time, starting once the proxy has
/// silenced the connection, so a probe lost in the black hole times out later than the
/// heartbeat and does not speed up the detection.
async fn silenced_while_stable(topic: &'static str, request: Duration) {
    let bound = (request + HEARTBEAT).min(SESSION);
    let setup = Setup::with_request_timeout(topic, ApiKey::Heartbeat, request).await;
    let began = Instant::now();
    let mut member = Member::start(&setup).await;
    member.read_all(Duration::from_secs(30)).await;
    assert!(
        member.fully_assigned_after(began).is_some(),
        "the member read every record without owning every partition"
    );
    setup.proxy.arm();
    let start = Instant::now();
    while setup.proxy.silenced() == 0 {
        assert!(
            start.elapsed() < HEARTBEAT + Duration::from_secs(5),
            "no Heartbeat within {:?} of arming",
            HEARTBEAT + Duration::from_secs(5)
        );
        member.step().await;
    }
    let silenced = setup.proxy.silenced_at().expect("silenced");
    let limit = bound + REJOIN + Duration::from_secs(30);
    let mut probe: Option<tokio::task::JoinHandle<ottla::Result<()>>> = None;
    let mut next_probe = Instant::now();
    let mut failures = Vec::new();
    let recovered = loop {
        assert!(
            silenced.elapsed() < limit,
            "no commit went through within {limit:?} of the silence; failures: {failures:?}; events: {}",
            member.story_after(silenced)
        );
        if probe.is_none() && Instant::now() >= next_probe {
            probe = Some(tokio::spawn(member.consumer.commit_async()));
        }
        if probe.as_ref().is_some_and(|p| p.is_finished()) {
            let result = probe.take().expect("probe").await.expect("probe task");
            let at = Instant::now();
            let owned = member.consumer.assignment().len();
            match result {
                Ok(()) if owned == PARTITIONS as usize => break at.duration_since(silenced),
                Ok(()) => failures.push(format!("ok owning {owned}")),
                Err(e) => failures.push(e.to_string()),
            }
            failures.dedup();
            next_probe = at + Duration::from_millis(200);
        }
        member.step().await;
    };
    eprintln!(
        "silent coordinator while Stable (request timeout {:.0} s): recovered in {:.1} s (Java bound {:.0} s + rejoin {:.0} s); events: {}; failed probes: {failures:?}",
        request.as_secs_f64(),
        recovered.as_secs_f64(),
        bound.as_secs_f64(),
        REJOIN.as_secs_f64(),
        member.story_after(silenced)
    );
    assert_eq!(setup.proxy.silenced(), 1, "one connection went silent");
    assert!(
        recovered <= bound + REJOIN,
        "while Stable (request timeout {request:?}): a commit went through {recovered:?} after the silence; Java gives up after {bound:?}, a rejoin takes up to {REJOIN:?}"
    );
    // The member still reads: records written now arrive.
    produce(
        &setup.proxy.address(),
        setup.topic,
        PARTITIONS,
        RECORDS,
        RECORDS,
        "none",
    )
    .await
    .expect("produce");
    let before = member.records;
    let start = Instant::now();
    while member.records < before + RECORDS {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "read {} of {RECORDS} records written after the recovery",
            member.records - before
        );
        member.step().await;
    }
}

/// Stable, with the timers of the table above: the heartbeat's request timeout and the
/// session end together (5 s + 1 s = 6 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_silent_coordinator_while_stable_is_left_within_the_heartbeat_bound() {
    silenced_while_stable("silent-stable", REQUEST).await;
}

/// Stable, with a request timeout (15 s) longer than the session (6 s): Java's heartbeat
/// thread gives up on the coordinator when the session lapses, and marking it unknown
/// disconnects the coordinator connection, so the heartbeat and any commit in flight
/// on it fail at once and the member goes on with the coordinator it finds next. The
/// bound is the session, not the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_silent_coordinator_while_stable_is_left_within_the_session() {
    silenced_while_stable("silent-stable-long", Duration::from_secs(15)).await;
}
