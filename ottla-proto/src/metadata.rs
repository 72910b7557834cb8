//! Cluster metadata as the client sees it: brokers, topics, partitions, leaders and
//! leader epochs, built from Metadata responses.

use std::collections::BTreeMap;
use std::fmt;

use kafka_protocol::messages::MetadataResponse;
use uuid::Uuid;

/// A broker's node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub i32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A partition leader's epoch (KIP-320). `-1` when the broker does not report one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaderEpoch(pub i32);

/// One broker of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    /// Its node id.
    pub node: NodeId,
    /// Advertised host.
    pub host: String,
    /// Advertised port.
    pub port: u16,
    /// Rack, if configured.
    pub rack: Option<String>,
}

impl Broker {
    /// `host:port`.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// One partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMetadata {
    /// The partition index.
    pub partition: i32,
    /// The leader, or `None` while there is none (LEADER_NOT_AVAILABLE, election).
    pub leader: Option<NodeId>,
    /// The leader's epoch.
    pub leader_epoch: LeaderEpoch,
    /// Replicas.
    pub replicas: Vec<NodeId>,
    /// In-sync replicas.
    pub isr: Vec<NodeId>,
    /// The partition-level error code the broker reported (0 for none).
    pub error: i16,
}

/// One topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    /// The topic name.
    pub name: String,
    /// The topic id (nil before Metadata v10, or if the broker has none).
    pub id: Uuid,
    /// Whether the topic is internal (`__consumer_offsets`).
    pub internal: bool,
    /// Partitions, sorted by index.
    pub partitions: Vec<PartitionMetadata>,
    /// The topic-level error code (0 for none).
    pub error: i16,
}

/// A snapshot of cluster metadata. Each refresh builds a new snapshot; readers hold
/// an `Arc` of the one they looked at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterMetadata {
    /// The cluster id, if reported.
    pub cluster_id: Option<String>,
    /// The controller, if reported.
    pub controller: Option<NodeId>,
    /// Brokers by node id.
    pub brokers: BTreeMap<NodeId, Broker>,
    /// Topics by name.
    pub topics: BTreeMap<String, TopicMetadata>,
}

impl ClusterMetadata {
    /// Builds a snapshot from a Metadata response.
    ///
    /// Topics are merged over `previous`: a response that names only some topics keeps
    /// what was known about the others. Topics that come back with an error keep their
    /// previous partitions (if any) so one failed lookup does not erase leaders.
    pub fn from_response(previous: Option<&ClusterMetadata>, response: &MetadataResponse) -> Self {
        let brokers = response
            .brokers
            .iter()
            .filter_map(|b| {
                Some((
                    NodeId(b.node_id.0),
                    Broker {
                        node: NodeId(b.node_id.0),
                        host: b.host.to_string(),
                        port: u16::try_from(b.port).ok()?,
                        rack: b.rack.as_ref().map(|r| r.to_string()),
                    },
                ))
            })
            .collect();
        let mut topics = previous.map(|p| p.topics.clone()).unwrap_or_default();
        for t in &response.topics {
            let Some(name) = t.name.as_ref().map(|n| n.0.to_string()) else {
                continue;
            };
            let mut partitions: Vec<PartitionMetadata> = t
                .partitions
                .iter()
                .map(|p| PartitionMetadata {
                    partition: p.partition_index,
                    leader: (p.leader_id.0 >= 0).then_some(NodeId(p.leader_id.0)),
                    leader_epoch: LeaderEpoch(p.leader_epoch),
                    replicas: p.replica_nodes.iter().map(|n| NodeId(n.0)).collect(),
                    isr: p.isr_nodes.iter().map(|n| NodeId(n.0)).collect(),
                    error: p.error_code,
                })
                .collect();
            partitions.sort_by_key(|p| p.partition);
            if t.error_code != 0 && partitions.is_empty() {
                if let Some(existing) = topics.get_mut(&name) {
                    existing.error = t.error_code;
                    continue;
                }
            }
            topics.insert(
                name.clone(),
                TopicMetadata {
                    name,
                    id: t.topic_id,
                    internal: t.is_internal,
                    partitions,
                    error: t.error_code,
                },
            );
        }
        ClusterMetadata {
            cluster_id: response.cluster_id.as_ref().map(|c| c.to_string()),
            controller: (response.controller_id.0 >= 0).then_some(NodeId(response.controller_id.0)),
            brokers,
            topics,
        }
    }

    /// The topic called `name`.
    pub fn topic(&self, name: &str) -> Option<&TopicMetadata> {
        self.topics.get(name)
    }

    /// The topic with id `id`.
    pub fn topic_by_id(&self, id: Uuid) -> Option<&TopicMetadata> {
        if id.is_nil() {
            return None;
        }
        self.topics.values().find(|t| t.id == id)
    }

    /// The leader of `topic`/`partition`, with its epoch.
    pub fn leader(&self, topic: &str, partition: i32) -> Option<(NodeId, LeaderEpoch)> {
        let p = self
            .topic(topic)?
            .partitions
            .iter()
            .find(|p| p.partition == partition)?;
        Some((p.leader?, p.leader_epoch))
    }

    /// The broker with node id `node`.
    pub fn broker(&self, node: NodeId) -> Option<&Broker> {
        self.brokers.get(&node)
    }
}

/// When a metadata refresh may start: one at a time, requests made meanwhile
/// coalesced into the next, and the next not before `retry.backoff.ms` after the last
/// one ended, doubling with each failure in a row up to `retry.backoff.max.ms` (the
/// Java client's `Metadata.timeToAllowUpdate`, KIP-580). The one pace of the
/// consumer, the producer and the group task: a topic the cluster does not have yet,
/// asked for again at every turn, must not spin, and a broker that refuses metadata
/// is not asked again and again.
///
/// Contract: [`RefreshPace::request`] when a refresh is wanted;
/// [`RefreshPace::poll_start`] on every turn, and a refresh starts when it says so;
/// [`RefreshPace::handle_done`] when that refresh ends; [`RefreshPace::poll_timeout`]
/// for when to look again.
#[derive(Debug, Clone)]
pub struct RefreshPace {
    backoff: crate::backoff::Backoff,
    wanted: bool,
    running: bool,
    /// Failed refreshes in a row.
    failures: u32,
    /// No refresh starts before this.
    not_before: Option<std::time::Instant>,
}

impl RefreshPace {
    /// A pace from `retry.backoff.ms` up to `retry.backoff.max.ms`, jittered from
    /// `seed`. Nothing is wanted yet.
    pub fn new(initial: std::time::Duration, max: std::time::Duration, seed: u64) -> Self {
        Self {
            backoff: crate::backoff::Backoff::new(initial, max, seed),
            wanted: false,
            running: false,
            failures: 0,
            not_before: None,
        }
    }

    /// A refresh is wanted (coalesced with any already wanted or running).
    pub fn request(&mut self) {
        self.wanted = true;
    }

    /// Whether a refresh is wanted and not yet started.
    pub fn is_wanted(&self) -> bool {
        self.wanted
    }

    /// Whether a refresh should start now; if so it counts as running.
    #[must_use]
    pub fn poll_start(&mut self, now: std::time::Instant) -> bool {
        if !self.wanted || self.running || self.not_before.is_some_and(|t| now < t) {
            return false;
        }
        self.wanted = false;
        self.running = true;
        true
    }

    /// The running refresh ended at `now`; `ok` whether it brought metadata. A
    /// failed one is wanted again, after the backoff.
    pub fn handle_done(&mut self, now: std::time::Instant, ok: bool) {
        self.running = false;
        if ok {
            self.failures = 0;
        } else {
            self.failures = self.failures.saturating_add(1);
            self.wanted = true;
        }
        // Java's refresh backoff after `attempts` failures is `retry.backoff.ms *
        // 2^attempts`: the first step after a success, the second after one failure.
        self.not_before = Some(now + self.backoff.delay(self.failures + 1));
    }

    /// Failed refreshes in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// When a wanted refresh may start, if one waits for its time.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<std::time::Instant> {
        if self.wanted && !self.running {
            self.not_before
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::messages::{BrokerId, TopicName};
    use kafka_protocol::protocol::StrBytes;

    use super::*;

    fn topic(name: &str, error: i16, leaders: &[(i32, i32, i32)]) -> MetadataResponseTopic {
        MetadataResponseTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(name.into()))))
            .with_error_code(error)
            .with_partitions(
                leaders
                    .iter()
                    .map(|&(p, leader, epoch)| {
                        MetadataResponsePartition::default()
                            .with_partition_index(p)
                            .with_leader_id(BrokerId(leader))
                            .with_leader_epoch(epoch)
                    })
                    .collect(),
            )
    }

    #[test]
    fn leaders_and_epochs_are_tracked_and_merged() {
        let first = MetadataResponse::default()
            .with_brokers(vec![
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(1))
                    .with_host(StrBytes::from_static_str("h"))
                    .with_port(9092),
            ])
            .with_topics(vec![
                topic("a", 0, &[(1, 1, 5), (0, 1, 4)]),
                topic("b", 0, &[(0, -1, 0)]),
            ]);
        let md = ClusterMetadata::from_response(None, &first);
        assert_eq!(md.leader("a", 1), Some((NodeId(1), LeaderEpoch(5))));
        assert_eq!(md.topic("a").unwrap().partitions[0].partition, 0, "sorted");
        assert_eq!(md.leader("b", 0), None, "no leader during election");
        assert_eq!(md.broker(NodeId(1)).unwrap().address(), "h:9092");

        // A later response about "b" only, failing, keeps "a" and b's partitions.
        let second = MetadataResponse::default().with_topics(vec![topic("b", 5, &[])]);
        let md2 = ClusterMetadata::from_response(Some(&md), &second);
        assert_eq!(md2.leader("a", 1), Some((NodeId(1), LeaderEpoch(5))));
        assert_eq!(md2.topic("b").unwrap().error, 5);
        assert_eq!(md2.topic("b").unwrap().partitions.len(), 1);
    }

    fn ms(d: std::time::Duration) -> u64 {
        d.as_millis() as u64
    }

    #[test]
    fn refresh_pace_one_at_a_time_and_requests_made_meanwhile_coalesce() {
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let mut pace = RefreshPace::new(Duration::from_millis(100), Duration::from_secs(1), 3);
        assert!(!pace.poll_start(t0), "nothing wanted");
        pace.request();
        assert!(pace.poll_start(t0));
        pace.request();
        pace.request();
        assert!(!pace.poll_start(t0), "one running");
        assert_eq!(
            pace.poll_timeout(),
            None,
            "woken by the end of the running one"
        );
        pace.handle_done(t0, true);
        // Wanted while it ran: one more, not before `retry.backoff.ms` (±20%).
        let at = pace
            .poll_timeout()
            .expect("a wanted refresh waits for its time");
        assert!((80..120).contains(&ms(at - t0)), "{:?}", at - t0);
        assert!(!pace.poll_start(at - Duration::from_millis(1)));
        assert!(pace.poll_start(at));
        pace.handle_done(at, true);
        assert!(
            !pace.poll_start(at + Duration::from_secs(5)),
            "nothing wanted"
        );
    }

    #[test]
    fn refresh_pace_failures_double_the_wait_up_to_the_cap_and_a_success_resets_it() {
        use std::time::{Duration, Instant};
        let mut now = Instant::now();
        let mut pace = RefreshPace::new(Duration::from_millis(100), Duration::from_secs(1), 9);
        pace.request();
        let mut waits = Vec::new();
        for _ in 0..6 {
            assert!(pace.poll_start(now));
            pace.handle_done(now, false);
            let at = pace
                .poll_timeout()
                .expect("a failed refresh is wanted again");
            waits.push(ms(at - now));
            now = at;
        }
        // 200, 400, 800, then 1000 (the cap), each within the ±20% jitter.
        for (wait, nominal) in waits.iter().zip([200u64, 400, 800, 1000, 1000, 1000]) {
            assert!(
                *wait >= nominal * 8 / 10 && *wait <= nominal.min(1000) * 12 / 10,
                "{waits:?}"
            );
            assert!(*wait <= 1000, "{waits:?}");
        }
        assert_eq!(pace.failures(), 6);
        assert!(pace.poll_start(now));
        pace.handle_done(now, true);
        assert_eq!(pace.failures(), 0);
        pace.request();
        let at = pace.poll_timeout().unwrap();
        assert!(
            (80..120).contains(&ms(at - now)),
            "back to the first step: {:?}",
            at - now
        );
    }
}
