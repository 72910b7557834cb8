//! One type for "the broker a suite runs against", so a peer-agnostic check can be
//! written once and run on the mock cluster, on tansu, and on an external broker.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rdkafka::ClientConfig as RdConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use crate::mock::MockCluster;
use crate::tansu::Tansu;

/// The environment variable that names an external cluster (`host:port,...`).
pub const BOOTSTRAP_ENV: &str = "OTTLA_BOOTSTRAP";

/// A broker (or cluster) a suite talks to.
#[derive(Debug)]
pub enum Peer {
    /// An in-process librdkafka mock cluster.
    Mock(MockCluster),
    /// A tansu child process.
    Tansu(Tansu),
    /// A cluster someone else runs, by bootstrap address (real Kafka, Redpanda, ...).
    External(String),
}

impl Peer {
    /// A mock cluster with `brokers` brokers and its classic group APIs capped at
    /// their non-flexible versions ([`MockCluster::cap_group_apis`]), which it can parse.
    pub fn mock(brokers: i32) -> anyhow::Result<Peer> {
        let mock = MockCluster::new(brokers)?;
        mock.cap_group_apis()?;
        Ok(Peer::Mock(mock))
    }

    /// A fresh tansu broker.
    pub fn tansu() -> anyhow::Result<Peer> {
        Ok(Peer::Tansu(Tansu::start()?))
    }

    /// `OTTLA_BOOTSTRAP` set (and not empty) -> `External(that)`, so the same suite can
    /// target a real Kafka or Redpanda.
    pub fn external_from_env() -> Option<Peer> {
        std::env::var(BOOTSTRAP_ENV)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .map(Peer::External)
    }

    /// `host:port[,host:port...]`.
    pub fn bootstrap(&self) -> String {
        match self {
            Peer::Mock(m) => m.bootstrap(),
            Peer::Tansu(t) => t.bootstrap(),
            Peer::External(b) => b.clone(),
        }
    }

    /// Creates a topic with replication factor 1. Blocking; callable from sync code and
    /// from inside a tokio runtime alike. On an external cluster a topic that already
    /// exists counts as created (its partition count is not checked), and the call
    /// waits until metadata shows every partition with a leader.
    pub fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        match self {
            Peer::Mock(m) => m.create_topic(name, partitions, 1),
            Peer::Tansu(t) => t.create_topic(name, partitions),
            Peer::External(bootstrap) => {
                let (bootstrap, name) = (bootstrap.clone(), name.to_string());
                std::thread::spawn(move || create_external_topic(&bootstrap, &name, partitions))
                    .join()
                    .map_err(|_| anyhow::anyhow!("the topic-creating thread panicked"))?
            }
        }
    }

    /// `mock`, `tansu` or `external`.
    pub fn name(&self) -> &'static str {
        match self {
            Peer::Mock(_) => "mock",
            Peer::Tansu(_) => "tansu",
            Peer::External(_) => "external",
        }
    }
}

/// CreateTopics through rdkafka's admin client, on this thread's own runtime.
fn create_external_topic(bootstrap: &str, name: &str, partitions: i32) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building a runtime for the admin client")?;
    let mut config = RdConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "ottla-protocol-tests");
    let admin: AdminClient<DefaultClientContext> = config
        .create()
        .context("creating an rdkafka admin client")?;
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = runtime
        .block_on(admin.create_topics([&topic], &options))
        .with_context(|| format!("CreateTopics {name} on {bootstrap}"))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => bail!("CreateTopics {topic} on {bootstrap}: {code}"),
        }
    }
    wait_for_leaders(&config, name, partitions)
}

/// Polls metadata until `topic` shows `partitions` partitions, each with a leader.
fn wait_for_leaders(config: &RdConfig, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let consumer: BaseConsumer = config
        .create()
        .context("creating an rdkafka metadata client")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::from("no metadata yet");
    while Instant::now() < deadline {
        match consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            Ok(md) => {
                let ready = md
                    .topics()
                    .iter()
                    .find(|t| t.name() == topic)
                    .is_some_and(|t| {
                        t.error().is_none()
                            && t.partitions().len() >= partitions as usize
                            && t.partitions().iter().all(|p| p.leader() >= 0)
                    });
                if ready {
                    return Ok(());
                }
                last = format!("{topic} not ready in metadata yet");
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("topic {topic} did not get {partitions} led partitions within 30 s: {last}")
}
