//! A minimal application around ottla's group member for tests: it acknowledges
//! revocations at once, reports progress, and records what it owns and every event.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ottla::ClientConfig;
use ottla::driver::{Cluster, GroupHandle, TopicScope};
use ottla_proto::group::assignor::{Assignor, builtin};
use ottla_proto::group::consumer_protocol::TopicPartition;
use ottla_proto::group::member::{Event, GroupConfig, Membership};
use tokio::sync::oneshot;

/// What a test member has seen.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Partitions owned now.
    pub owned: BTreeSet<TopicPartition>,
    /// The generation last joined.
    pub generation: Option<i32>,
    /// Every event with the time it arrived.
    pub events: Vec<(Instant, Event)>,
    /// Whether the member stopped (left, fatal).
    pub stopped: bool,
}

/// One group member run by a background task.
pub struct TestMember {
    seen: Arc<Mutex<Seen>>,
    stop: Option<oneshot::Sender<Membership>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Settings for [`TestMember::start`].
#[derive(Debug, Clone)]
pub struct MemberOptions {
    /// The assignor.
    pub assignor: &'static str,
    /// Session timeout.
    pub session_timeout: Duration,
    /// Heartbeat interval.
    pub heartbeat_interval: Duration,
    /// Rebalance timeout / max poll interval.
    pub max_poll_interval: Duration,
    /// Static membership.
    pub instance_id: Option<String>,
    /// The leader's SyncGroup delay: the librdkafka mock refuses followers' SyncGroups
    /// that arrive after the leader's (see `GroupConfig::leader_sync_delay`).
    pub leader_sync_delay: Duration,
    /// `client.rack`, for rack-aware assignment (KIP-881).
    pub rack: Option<String>,
    /// More assignors offered after `assignor`, in preference order.
    pub more_assignors: &'static [&'static str],
    /// `GroupConfig::cooperative_upgrade`: the second bounce's hold.
    pub cooperative_upgrade: Option<Duration>,
}

impl Default for MemberOptions {
    fn default() -> Self {
        Self {
            assignor: "range",
            session_timeout: Duration::from_secs(6),
            heartbeat_interval: Duration::from_millis(500),
            max_poll_interval: Duration::from_secs(20),
            instance_id: None,
            leader_sync_delay: Duration::from_millis(50),
            rack: None,
            more_assignors: &[],
            cooperative_upgrade: None,
        }
    }
}

impl TestMember {
    /// Connects to `bootstrap` and joins `group` subscribed to `topics`.
    pub async fn start(
        bootstrap: &str,
        group: &str,
        topics: &[&str],
        options: MemberOptions,
    ) -> anyhow::Result<Self> {
        crate::init_tracing();
        let config = ClientConfig::new(bootstrap)
            .with_client_id("ottla-test")
            .with_request_timeout(Duration::from_secs(10))
            .with_reconnect_backoff(Duration::from_millis(20), Duration::from_millis(500));
        let scope = TopicScope::Topics(topics.iter().map(|t| t.to_string()).collect());
        let cluster = Cluster::connect(&config, scope, &[]).await?;
        let assignor: Arc<dyn Assignor> = Arc::from(
            builtin(options.assignor)
                .ok_or_else(|| anyhow::anyhow!("no assignor {}", options.assignor))?,
        );
        let mut assignors = vec![assignor];
        for name in options.more_assignors {
            assignors.push(Arc::from(
                builtin(name).ok_or_else(|| anyhow::anyhow!("no assignor {name}"))?,
            ));
        }
        let mut gc = GroupConfig::new(
            group,
            topics.iter().map(|t| t.to_string()).collect(),
            assignors,
        );
        gc.cooperative_upgrade = options.cooperative_upgrade;
        gc.session_timeout = options.session_timeout;
        gc.heartbeat_interval = options.heartbeat_interval;
        gc.max_poll_interval = options.max_poll_interval;
        gc.instance_id = options.instance_id;
        gc.leader_sync_delay = options.leader_sync_delay;
        gc.rack = options.rack;
        let mut handle = GroupHandle::spawn(cluster, gc);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (stop_tx, mut stop_rx) = oneshot::channel();
        let state = seen.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tokio::select! {
                    membership = &mut stop_rx => {
                        handle.leave_with(membership.unwrap_or_default()).await;
                        if let Ok(mut s) = state.lock() { s.stopped = true; s.owned.clear(); }
                        return;
                    }
                    _ = tick.tick() => handle.progress().await,
                    event = handle.next_event() => {
                        let Some(event) = event else {
                            if let Ok(mut s) = state.lock() { s.stopped = true; }
                            return;
                        };
                        let mut ack = None;
                        if let Ok(mut s) = state.lock() {
                            match &event {
                                Event::Joined { generation, .. } => s.generation = Some(*generation),
                                Event::Assigned { added, .. } => s.owned.extend(added.iter().cloned()),
                                Event::RevokeRequested { generation, partitions } => {
                                    for p in partitions { s.owned.remove(p); }
                                    ack = Some(*generation);
                                }
                                Event::Lost { partitions, .. } => for p in partitions { s.owned.remove(p); },
                                Event::Left | Event::Fatal(_) => s.stopped = true,
                                _ => {}
                            }
                            s.events.push((Instant::now(), event));
                        }
                        if let Some(g) = ack {
                            handle.complete_revocation(g).await;
                        }
                    }
                }
            }
        });
        Ok(Self {
            seen,
            stop: Some(stop_tx),
            task: Some(task),
        })
    }

    /// A snapshot of what the member has seen.
    pub fn seen(&self) -> Seen {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Partitions owned now.
    pub fn owned(&self) -> BTreeSet<TopicPartition> {
        self.seen().owned
    }

    /// Leaves the group (or, for a static member, just stops) and waits for it.
    pub async fn stop(self) {
        self.stop_with(Membership::Default).await
    }

    /// Stops the member, leaving the group or not as `membership` says (the Java
    /// client's `CloseOptions`).
    pub async fn stop_with(mut self, membership: Membership) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(membership);
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }

    /// Stops the task without leaving: the process "crashed".
    pub fn kill(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl Drop for TestMember {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// All partitions `0..n` of `topic`.
pub fn partitions(topic: &str, n: i32) -> BTreeSet<TopicPartition> {
    (0..n)
        .map(|p| TopicPartition {
            topic: topic.to_string(),
            partition: p,
        })
        .collect()
}

/// Whether `members` own `all` exactly once between them, in one generation.
pub fn owned_exactly_once(
    members: &[&TestMember],
    all: &BTreeSet<TopicPartition>,
) -> Result<(), String> {
    let mut union = BTreeSet::new();
    let mut generations = BTreeSet::new();
    for (i, m) in members.iter().enumerate() {
        let s = m.seen();
        generations.insert(s.generation);
        for p in s.owned {
            if !union.insert(p.clone()) {
                return Err(format!("{p} owned twice (second by member {i})"));
            }
        }
    }
    if &union != all {
        return Err(format!("owned {} of {} partitions", union.len(), all.len()));
    }
    if generations.len() != 1 {
        return Err(format!("members in different generations: {generations:?}"));
    }
    Ok(())
}

/// Polls `check` until it passes or `timeout` runs out.
pub async fn eventually<F: FnMut() -> Result<(), String>>(
    timeout: Duration,
    mut check: F,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
