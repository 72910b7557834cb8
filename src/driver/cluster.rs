//! The cluster: bootstrap, one connection per broker, and metadata refreshes that
//! coalesce.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{ApiKey, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, warn};

use super::connection::{BrokerConnection, BrokerHangUp, ConnectionSettings, Rank};
use crate::config::ClientConfig;
use crate::error::{Error, RequestError, Result};
use crate::proto::metadata::{ClusterMetadata, NodeId};
use crate::proto::needs_metadata_refresh;

/// Which topics a metadata refresh asks about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicScope {
    /// Every topic in the cluster.
    All,
    /// Only these topics (possibly none: brokers only).
    Topics(BTreeSet<String>),
}

/// A handle to the cluster: connections to its brokers and its metadata. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Cluster {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    bootstrap: Vec<String>,
    settings: Arc<ConnectionSettings>,
    /// Connections by `host:port`; bootstrap and broker connections share this map.
    connections: Mutex<HashMap<String, BrokerConnection>>,
    metadata: RwLock<Arc<ClusterMetadata>>,
    scope: Mutex<TopicScope>,
    /// Serialises refreshes; a caller that waited for it reuses the result it waited for.
    refresh_lock: tokio::sync::Mutex<()>,
    /// Bumped by every completed refresh.
    refreshes: AtomicU64,
    /// Told of every completed refresh (the group member compares partition counts).
    updates: tokio::sync::watch::Sender<u64>,
    /// Round-robin cursor over brokers for metadata requests.
    cursor: AtomicUsize,
}

impl Cluster {
    /// Connects to the first reachable bootstrap server and loads metadata for `scope`.
    ///
    /// Fails when no bootstrap server answers, or when a broker lacks an API in
    /// `required` (the error names the API and both version ranges).
    pub async fn connect(
        config: &ClientConfig,
        scope: TopicScope,
        required: &[ApiKey],
    ) -> Result<Self> {
        config.validate()?;
        let mut required = required.to_vec();
        if !required.contains(&ApiKey::Metadata) {
            required.push(ApiKey::Metadata);
        }
        let cluster = Cluster {
            inner: Arc::new(Inner {
                bootstrap: config.bootstrap_servers.clone(),
                settings: Arc::new(ConnectionSettings::from_config(config, required)?),
                connections: Mutex::new(HashMap::new()),
                metadata: RwLock::new(Arc::new(ClusterMetadata::default())),
                scope: Mutex::new(scope),
                refresh_lock: tokio::sync::Mutex::new(()),
                refreshes: AtomicU64::new(0),
                updates: tokio::sync::watch::Sender::new(0),
                cursor: AtomicUsize::new(0),
            }),
        };
        cluster.refresh_metadata().await?;
        Ok(cluster)
    }

    /// A TLS or authentication failure standing on some broker's connection (the last
    /// attempt failed that way), if any.
    pub fn security_failure(&self) -> Option<RequestError> {
        self.inner.settings.alarm.any()
    }

    /// A receiver that changes whenever a connection of this cluster fails TLS or
    /// authentication.
    pub(crate) fn security_failures(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.settings.alarm.subscribe()
    }

    /// A receiver that changes whenever a connection of this cluster reports a broker
    /// that keeps hanging up on one request ([`BrokerHangUp`]).
    pub(crate) fn hang_up_reports(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.settings.hangups.subscribe()
    }

    /// The hang-up reports from the `seen`-th on; `seen` moves past them.
    pub(crate) fn hang_ups_since(&self, seen: &mut usize) -> Vec<BrokerHangUp> {
        self.inner.settings.hangups.since(seen)
    }

    /// The latest metadata snapshot.
    pub fn metadata(&self) -> Arc<ClusterMetadata> {
        self.inner
            .metadata
            .read()
            .map(|m| m.clone())
            .unwrap_or_default()
    }

    /// How many metadata refreshes have completed.
    pub fn refresh_count(&self) -> u64 {
        self.inner.refreshes.load(Ordering::SeqCst)
    }

    /// A receiver that changes whenever a metadata refresh completes, whoever asked.
    pub(crate) fn metadata_updates(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.updates.subscribe()
    }

    /// Changes which topics later refreshes ask about.
    pub fn set_scope(&self, scope: TopicScope) {
        if let Ok(mut s) = self.inner.scope.lock() {
            *s = scope;
        }
    }

    /// Adds topics to the refresh scope (no effect under [`TopicScope::All`]).
    pub fn add_topics<I: IntoIterator<Item = String>>(&self, topics: I) {
        if let Ok(mut s) = self.inner.scope.lock() {
            if let TopicScope::Topics(set) = &mut *s {
                set.extend(topics);
            }
        }
    }

    /// Refreshes metadata now.
    ///
    /// Concurrent calls coalesce: while one refresh is in flight, other callers wait for
    /// it and return its result instead of sending their own request.
    pub async fn refresh_metadata(&self) -> Result<Arc<ClusterMetadata>> {
        let seen = self.inner.refreshes.load(Ordering::SeqCst);
        let _guard = self.inner.refresh_lock.lock().await;
        if self.inner.refreshes.load(Ordering::SeqCst) != seen {
            // Someone refreshed while this caller waited: that answer is fresh enough.
            return Ok(self.metadata());
        }
        let response = self.fetch_metadata().await?;
        let previous = self.metadata();
        let next = Arc::new(ClusterMetadata::from_response(Some(&previous), &response));
        if let Ok(mut m) = self.inner.metadata.write() {
            *m = next.clone();
        }
        let done = self.inner.refreshes.fetch_add(1, Ordering::SeqCst) + 1;
        self.inner.updates.send_replace(done);
        debug!(
            brokers = next.brokers.len(),
            topics = next.topics.len(),
            "metadata refreshed"
        );
        Ok(next)
    }

    /// Refreshes metadata if `code` is a leadership error (NOT_LEADER_OR_FOLLOWER,
    /// LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH, ...).
    /// Returns whether a refresh was done.
    pub async fn refresh_on_error(&self, code: i16) -> Result<bool> {
        if !needs_metadata_refresh(code) {
            return Ok(false);
        }
        self.refresh_metadata().await?;
        Ok(true)
    }

    /// The connection to broker `node`, as named in the latest metadata.
    pub fn broker(&self, node: NodeId) -> Result<BrokerConnection> {
        let metadata = self.metadata();
        let broker = metadata
            .broker(node)
            .ok_or(Error::UnknownBroker { node: node.0 })?;
        Ok(self.connection(&broker.address()))
    }

    /// The connection to `address` (`host:port`), started if needed.
    pub fn connection(&self, address: &str) -> BrokerConnection {
        self.keyed_connection(address.to_string(), address)
    }

    /// A connection to the group coordinator at `address`, separate from the one that
    /// carries fetches (as the Java client does): a broker answers one connection's
    /// requests in order, so a Fetch held for `fetch.max.wait.ms` would delay a
    /// heartbeat, and a JoinGroup held for the rebalance would stall fetching.
    pub fn coordinator_connection(&self, address: &str) -> BrokerConnection {
        self.keyed_connection(format!("coordinator/{address}"), address)
    }

    /// Closes the coordinator connection to `address`, if there is one: its requests
    /// fail at once, and the next one connects again.
    pub(crate) fn disconnect_coordinator(&self, address: &str) {
        let map = match self.inner.connections.lock() {
            Ok(map) => map,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(conn) = map.get(&format!("coordinator/{address}")) {
            conn.disconnect();
        }
    }

    fn keyed_connection(&self, key: String, address: &str) -> BrokerConnection {
        let mut map = match self.inner.connections.lock() {
            Ok(map) => map,
            Err(poisoned) => poisoned.into_inner(),
        };
        map.entry(key)
            .or_insert_with(|| BrokerConnection::spawn(address, self.inner.settings.clone()))
            .clone()
    }

    /// A connection to the least-loaded live broker, for requests any broker can
    /// answer (FindCoordinator), as the Java client's `leastLoadedNode`: a connected
    /// broker with the fewest requests in flight, else one that may connect now, else
    /// the one whose reconnect backoff ends first. A broker whose last connection
    /// failed is not asked while another can be. Ties rotate over known brokers, then
    /// the bootstrap list.
    pub fn any_connection(&self) -> BrokerConnection {
        let candidates = self.candidates();
        let address = candidates.first().cloned().unwrap_or_default();
        self.connection(&address)
    }

    /// Candidate addresses for a cluster-wide request, best first by [`Rank`]: known
    /// brokers (rotating), then the bootstrap list, within each rank.
    fn candidates(&self) -> Vec<String> {
        let mut candidates = self.rotation();
        let ranks: Vec<(Rank, String)> = {
            let map = match self.inner.connections.lock() {
                Ok(map) => map,
                Err(poisoned) => poisoned.into_inner(),
            };
            candidates
                .drain(..)
                .map(|a| (map.get(&a).map_or(Rank::Idle, BrokerConnection::rank), a))
                .collect()
        };
        let mut ranks = ranks;
        // Stable: equal ranks keep the rotation's order.
        ranks.sort_by_key(|(rank, _)| *rank);
        ranks.into_iter().map(|(_, a)| a).collect()
    }

    /// Known brokers first (rotating), then the bootstrap list.
    fn rotation(&self) -> Vec<String> {
        let metadata = self.metadata();
        let mut brokers: Vec<String> = metadata.brokers.values().map(|b| b.address()).collect();
        if !brokers.is_empty() {
            let start = self.inner.cursor.fetch_add(1, Ordering::Relaxed) % brokers.len();
            brokers.rotate_left(start);
        }
        for b in &self.inner.bootstrap {
            if !brokers.contains(b) {
                brokers.push(b.clone());
            }
        }
        brokers
    }

    async fn fetch_metadata(&self) -> Result<MetadataResponse> {
        let scope = self
            .inner
            .scope
            .lock()
            .map(|s| s.clone())
            .unwrap_or(TopicScope::All);
        let candidates = self.candidates();
        let mut last: Option<RequestError> = None;
        // A TLS or SASL failure is kept typed: it says what to change, where "no
        // bootstrap server reachable" would not.
        let mut refused: Option<RequestError> = None;
        for address in &candidates {
            let conn = self.connection(address);
            let table = match conn.versions().await {
                Ok(t) => t,
                Err(e) => {
                    warn!(broker = %address, error = %e, "metadata: broker unavailable");
                    if let RequestError::Negotiation { .. } = e {
                        return Err(e.into());
                    }
                    if e.is_security() {
                        refused = Some(e.clone());
                    }
                    last = Some(e);
                    continue;
                }
            };
            let Some(version) = table.version(ApiKey::Metadata) else {
                continue;
            };
            let request = metadata_request(&scope, version);
            match conn.send_version(&request, version).await {
                Ok(response) => {
                    if response.error_code != 0 {
                        return Err(Error::broker(ApiKey::Metadata, response.error_code, None));
                    }
                    return Ok(response);
                }
                Err(e) => {
                    warn!(broker = %address, error = %e, "metadata request failed");
                    last = Some(e);
                }
            }
        }
        if let Some(e) = refused {
            return Err(e.into());
        }
        Err(Error::Bootstrap {
            tried: candidates,
            last,
        })
    }
}

/// A Metadata request for `scope` at `version`, setting only fields the version has.
pub(crate) fn metadata_request(scope: &TopicScope, version: i16) -> MetadataRequest {
    let topics = match scope {
        TopicScope::All => None,
        TopicScope::Topics(names) => Some(
            names
                .iter()
                .map(|n| {
                    MetadataRequestTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_string(n.clone()))))
                })
                .collect(),
        ),
    };
    let mut request = MetadataRequest::default().with_topics(topics);
    // A consumer never creates topics by asking about them. The field exists from v4;
    // before that, brokers decide (and the default encodes as absent).
    request.allow_auto_topic_creation = version < 4;
    request
}
