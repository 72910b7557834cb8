//! The admin client: topics, partitions, groups, their offsets, the cluster, and offsets
//! by time.
//!
//! ```no_run
//! # async fn demo() -> ottla::Result<()> {
//! use ottla::admin::{AdminClient, NewTopic, OffsetSpec};
//! use ottla::consumer::TopicPartition;
//!
//! let admin = AdminClient::builder("127.0.0.1:9092").build().await?;
//! let created = admin.create_topics(&[NewTopic::new("orders", 6, 3)], false).await?;
//! for (topic, result) in &created {
//!     println!("{topic}: {result:?}");
//! }
//! let ends = admin
//!     .list_offsets(&[(TopicPartition::new("orders", 0), OffsetSpec::Latest)])
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Each call goes where Kafka wants it: CreateTopics, DeleteTopics and CreatePartitions
//! to the controller, group calls to the group's coordinator (found with
//! FindCoordinator), ListOffsets to each partition's leader. NOT_CONTROLLER,
//! NOT_COORDINATOR (and COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE) and
//! NOT_LEADER_OR_FOLLOWER (and the other leadership errors) refresh what the client
//! knows and send again, until `request.timeout.ms` has passed since the call began;
//! so do lost connections.
//!
//! A call about several items (topics, partitions, groups) returns one result per
//! item, as the Java admin's per-item futures: an error code the broker gave one item
//! is that item's [`Error::Broker`], naming the API, the code and the item. The call
//! itself fails only when nothing could be asked: no broker reachable, or a broker
//! that does not implement the API (a [`RequestError::Negotiation`] naming it).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    ApiKey, CreatePartitionsRequest, DeleteTopicsRequest, DescribeConfigsRequest,
    DescribeGroupsRequest, FindCoordinatorRequest, GroupId, ListGroupsRequest, ListOffsetsRequest,
    MetadataRequest, OffsetCommitRequest, OffsetDeleteRequest, OffsetFetchRequest,
};
use kafka_protocol::protocol::{Request, StrBytes};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::ClientConfig;
use crate::driver::{BrokerConnection, Cluster, TopicScope};
use crate::error::{Error, NegotiationError, RequestError, Result};
pub use crate::proto::admin::{
    CommittedOffset, ConfigEntry, GroupDescription, GroupListing, ListedOffset, MemberDescription,
    NewTopic, OffsetSpec,
};
use crate::proto::admin::{
    ItemResult, PartitionOutcome, Reroute, alter_offsets_request, coordinator_of,
    create_partitions_request, create_partitions_results, create_topics_request,
    create_topics_results, delete_topics_request, delete_topics_results,
    describe_topic_configs_request, describe_topic_configs_results, find_coordinator_request,
    group_description, list_offsets_request, list_offsets_results, offset_commit_results,
    offset_delete_request, offset_delete_results, offset_fetch_request, offset_fetch_results,
    reroute,
};
pub use crate::proto::fetch::request::IsolationLevel;
use crate::proto::group::consumer_protocol::TopicPartition;
pub use crate::proto::metadata::{Broker, LeaderEpoch, PartitionMetadata};
use crate::proto::metadata::{ClusterMetadata, NodeId};

/// One result per item of a batch call.
pub type ItemResults<K, T = ()> = BTreeMap<K, Result<T>>;

/// Builds an [`AdminClient`]. Settings carry the Java client's names and defaults.
#[derive(Debug, Clone)]
pub struct AdminClientBuilder {
    client: ClientConfig,
}

impl AdminClientBuilder {
    /// A builder for the given bootstrap servers (`host:port,...`).
    pub fn new(bootstrap_servers: &str) -> Self {
        AdminClientBuilder {
            client: ClientConfig::new(bootstrap_servers),
        }
    }

    /// Replaces the client configuration (bootstrap servers, TLS, SASL, timeouts).
    pub fn client_config(mut self, config: ClientConfig) -> Self {
        self.client = config;
        self
    }

    /// Sets a client setting by its Java name (`request.timeout.ms`,
    /// `security.protocol`, ...), as [`ClientConfig::set`].
    pub fn set(mut self, key: &str, value: &str) -> Result<Self> {
        self.client = self.client.set(key, value)?;
        Ok(self)
    }

    /// `request.timeout.ms`: how long one call may take, retries included (30 s).
    pub fn request_timeout(mut self, t: Duration) -> Self {
        self.client.request_timeout = t;
        self
    }

    /// Connects to the cluster.
    pub async fn build(self) -> Result<AdminClient> {
        AdminClient::new(self.client).await
    }
}

/// A topic as [`AdminClient::describe_topics`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDescription {
    /// The topic's name.
    pub name: String,
    /// The topic id (nil when the broker reports none).
    pub id: Uuid,
    /// Whether the topic is internal (`__consumer_offsets`).
    pub internal: bool,
    /// Its partitions, by index, with leader, replicas and in-sync replicas.
    pub partitions: Vec<PartitionMetadata>,
    /// Its configs by name, from DescribeConfigs; the error DescribeConfigs gave (a
    /// broker without the API included) when they could not be read.
    pub configs: Result<BTreeMap<String, ConfigEntry>>,
}

/// The cluster as [`AdminClient::describe_cluster`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDescription {
    /// The cluster id, if the brokers report one.
    pub cluster_id: Option<String>,
    /// The controller, if reported.
    pub controller: Option<NodeId>,
    /// The brokers.
    pub brokers: Vec<Broker>,
}

/// An admin client. Cheap to clone; every clone shares the connections.
#[derive(Debug, Clone)]
pub struct AdminClient {
    cluster: Cluster,
    timeout: Duration,
    backoff: Duration,
}

impl AdminClient {
    /// A builder for the given bootstrap servers.
    pub fn builder(bootstrap_servers: &str) -> AdminClientBuilder {
        AdminClientBuilder::new(bootstrap_servers)
    }

    /// Connects with `config`. Only Metadata is required of the brokers; a call whose
    /// API a broker lacks fails with [`RequestError::Negotiation`] naming it.
    pub async fn new(config: ClientConfig) -> Result<AdminClient> {
        let cluster = Cluster::connect(
            &config,
            TopicScope::Topics(BTreeSet::new()),
            &[ApiKey::Metadata],
        )
        .await?;
        Ok(AdminClient {
            cluster,
            timeout: config.request_timeout,
            backoff: config.retry_backoff,
        })
    }

    /// Creates topics on the controller. `validate_only`: the broker checks the
    /// request and creates nothing. Each topic's result: `Ok`, or the broker's error
    /// (TOPIC_ALREADY_EXISTS, INVALID_REPLICATION_FACTOR, POLICY_VIOLATION, ...).
    pub async fn create_topics(
        &self,
        topics: &[NewTopic],
        validate_only: bool,
    ) -> Result<ItemResults<String>> {
        let timeout_ms = self.timeout_ms();
        let by_name: BTreeMap<String, NewTopic> =
            topics.iter().map(|t| (t.name.clone(), t.clone())).collect();
        self.controller_batch(
            ApiKey::CreateTopics,
            by_name.keys().cloned().collect(),
            |names, _| {
                let chosen: Vec<NewTopic> = names
                    .iter()
                    .filter_map(|n| by_name.get(n).cloned())
                    .collect();
                create_topics_request(&chosen, timeout_ms, validate_only)
            },
            create_topics_results,
        )
        .await
    }

    /// Deletes topics on the controller. Each topic's result: `Ok`, or the broker's
    /// error (UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist, ...).
    pub async fn delete_topics(&self, names: &[&str]) -> Result<ItemResults<String>> {
        let timeout_ms = self.timeout_ms();
        self.controller_batch::<DeleteTopicsRequest, _, _>(
            ApiKey::DeleteTopics,
            names.iter().map(|n| n.to_string()).collect(),
            |names, version| delete_topics_request(names, timeout_ms, version),
            delete_topics_results,
        )
        .await
    }

    /// Grows each topic to the given partition count, on the controller. Each topic's
    /// result: `Ok`, or the broker's error (INVALID_PARTITIONS when the count is not
    /// larger than the current one, ...).
    pub async fn create_partitions(
        &self,
        counts: &[(&str, i32)],
        validate_only: bool,
    ) -> Result<ItemResults<String>> {
        let timeout_ms = self.timeout_ms();
        let counts: BTreeMap<String, i32> =
            counts.iter().map(|(t, c)| (t.to_string(), *c)).collect();
        self.controller_batch::<CreatePartitionsRequest, _, _>(
            ApiKey::CreatePartitions,
            counts.keys().cloned().collect(),
            |names, _| {
                let chosen: Vec<(String, i32)> = names
                    .iter()
                    .filter_map(|n| counts.get(n).map(|c| (n.clone(), *c)))
                    .collect();
                create_partitions_request(&chosen, timeout_ms, validate_only)
            },
            create_partitions_results,
        )
        .await
    }

    /// Describes topics: partitions with leader, replicas and in-sync replicas (from
    /// Metadata, asked without creating anything), and configs (from DescribeConfigs).
    /// A topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION.
    pub async fn describe_topics(
        &self,
        names: &[&str],
    ) -> Result<ItemResults<String, TopicDescription>> {
        let scope = TopicScope::Topics(names.iter().map(|n| n.to_string()).collect());
        let metadata = self.metadata(&scope).await?;
        let mut out = BTreeMap::new();
        let mut found = Vec::new();
        for name in names {
            let result = match metadata.topics.get(*name) {
                Some(t) if t.error != 0 => Err(item_error(ApiKey::Metadata, name, t.error, None)),
                Some(t) => {
                    found.push(name.to_string());
                    Ok(TopicDescription {
                        name: t.name.clone(),
                        id: t.id,
                        internal: t.internal,
                        partitions: t.partitions.clone(),
                        configs: Ok(BTreeMap::new()),
                    })
                }
                None => Err(item_error(
                    ApiKey::Metadata,
                    name,
                    ResponseError::UnknownTopicOrPartition.code(),
                    None,
                )),
            };
            out.insert(name.to_string(), result);
        }
        if found.is_empty() {
            return Ok(out);
        }
        let configs = self.describe_topic_configs(&found).await;
        for name in &found {
            let Some(Ok(d)) = out.get_mut(name) else {
                continue;
            };
            d.configs = match &configs {
                Err(e) => Err(e.clone()),
                Ok(all) => all.get(name).cloned().unwrap_or_else(|| {
                    Err(item_error(
                        ApiKey::DescribeConfigs,
                        name,
                        ResponseError::UnknownTopicOrPartition.code(),
                        Some("no result for the topic"),
                    ))
                }),
            };
        }
        Ok(out)
    }

    /// Describes the cluster: its brokers, controller and id (from Metadata).
    pub async fn describe_cluster(&self) -> Result<ClusterDescription> {
        let m = self.metadata(&TopicScope::Topics(BTreeSet::new())).await?;
        Ok(ClusterDescription {
            cluster_id: m.cluster_id.clone(),
            controller: m.controller,
            brokers: m.brokers.values().cloned().collect(),
        })
    }

    /// Lists the groups every broker coordinates (ListGroups to each broker, as the
    /// Java admin does), sorted by group id.
    pub async fn list_groups(&self) -> Result<Vec<GroupListing>> {
        let metadata = self.fresh_metadata().await?;
        let mut out = BTreeSet::new();
        let brokers: Vec<NodeId> = metadata.brokers.keys().copied().collect();
        for node in brokers {
            let deadline = self.deadline();
            loop {
                let attempt = async {
                    let conn = self.cluster.broker(node)?;
                    let version = self.version(&conn, ApiKey::ListGroups).await?;
                    let response = conn
                        .send_version(&ListGroupsRequest::default(), version)
                        .await?;
                    if response.error_code != 0 {
                        return Err(Error::broker(
                            ApiKey::ListGroups,
                            response.error_code,
                            Some(format!("broker {node}")),
                        ));
                    }
                    Ok(response
                        .groups
                        .iter()
                        .map(|g| GroupListing {
                            group: g.group_id.0.to_string(),
                            protocol_type: g.protocol_type.to_string(),
                            state: (version >= 4).then(|| g.group_state.to_string()),
                        })
                        .collect::<Vec<_>>())
                }
                .await;
                match attempt {
                    Ok(groups) => {
                        out.extend(groups);
                        break;
                    }
                    Err(e) if worth_retrying(&e) && Instant::now() < deadline => {
                        self.pause(deadline).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Describes groups, each at its coordinator: state, protocol, members with their
    /// subscriptions and assignments (decoded for consumer groups). A group that does
    /// not exist is reported by brokers as state `Dead` with no members.
    pub async fn describe_groups(
        &self,
        groups: &[&str],
    ) -> Result<ItemResults<String, GroupDescription>> {
        let mut out = BTreeMap::new();
        for group in groups {
            let result = self
                .group_call::<DescribeGroupsRequest, _, _, _>(
                    ApiKey::DescribeGroups,
                    group,
                    |_| {
                        DescribeGroupsRequest::default()
                            .with_groups(vec![GroupId(StrBytes::from_string(group.to_string()))])
                    },
                    |response, _| {
                        let Some(g) = response
                            .groups
                            .iter()
                            .find(|g| g.group_id.0.as_str() == *group)
                        else {
                            return Ok(Err(ResponseError::UnknownServerError.code()));
                        };
                        if reroute(g.error_code).is_some() {
                            return Err(g.error_code);
                        }
                        Ok(if g.error_code != 0 {
                            Err(g.error_code)
                        } else {
                            Ok(group_description(g))
                        })
                    },
                )
                .await;
            let result = match result {
                Err(e @ Error::Request(RequestError::Negotiation { .. })) => return Err(e),
                Err(e) => Err(e),
                Ok(Err(code)) => Err(item_error(ApiKey::DescribeGroups, group, code, None)),
                Ok(Ok(d)) => Ok(d),
            };
            out.insert(group.to_string(), result);
        }
        Ok(out)
    }

    /// A group's committed offsets (OffsetFetch at its coordinator): of `partitions`,
    /// or of every partition it committed (`None`). A partition the group never
    /// committed has `offset: None`; a partition-level error is that partition's.
    pub async fn list_group_offsets(
        &self,
        group: &str,
        partitions: Option<&[TopicPartition]>,
    ) -> Result<ItemResults<TopicPartition, CommittedOffset>> {
        let results = self
            .group_call::<OffsetFetchRequest, _, _, _>(
                ApiKey::OffsetFetch,
                group,
                |version| offset_fetch_request(group, partitions, version),
                |response, version| {
                    let results = offset_fetch_results(response, version)?;
                    coordinator_moved(&results)?;
                    Ok(results)
                },
            )
            .await?;
        Ok(per_partition(ApiKey::OffsetFetch, results))
    }

    /// Sets a group's committed offsets (OffsetCommit at its coordinator with
    /// generation -1 and no member id, as the Java admin's
    /// `alterConsumerGroupOffsets`). The broker accepts it only while the group has no
    /// active members: otherwise each partition fails with UNKNOWN_MEMBER_ID (or
    /// ILLEGAL_GENERATION).
    pub async fn alter_group_offsets(
        &self,
        group: &str,
        offsets: &[(TopicPartition, i64)],
    ) -> Result<ItemResults<TopicPartition>> {
        let results = self
            .group_call::<OffsetCommitRequest, _, _, _>(
                ApiKey::OffsetCommit,
                group,
                |version| alter_offsets_request(group, offsets, version),
                |response, _| {
                    let results = offset_commit_results(response);
                    coordinator_moved(&results)?;
                    Ok(results)
                },
            )
            .await?;
        Ok(per_partition(ApiKey::OffsetCommit, results))
    }

    /// Deletes a group's committed offsets for `partitions` (OffsetDelete at its
    /// coordinator). A partition the group still consumes fails with
    /// GROUP_SUBSCRIBED_TO_TOPIC; a group with members that is not a consumer group
    /// fails as a whole (NON_EMPTY_GROUP), and so does every partition then.
    pub async fn delete_group_offsets(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<ItemResults<TopicPartition>> {
        let outcome = self
            .group_call::<OffsetDeleteRequest, _, _, _>(
                ApiKey::OffsetDelete,
                group,
                |_| offset_delete_request(group, partitions),
                |response, _| match offset_delete_results(response) {
                    Err(code) if reroute(code).is_some() => Err(code),
                    Err(code) => Ok(Err(code)),
                    Ok(results) => {
                        coordinator_moved(&results)?;
                        Ok(Ok(results))
                    }
                },
            )
            .await?;
        match outcome {
            Ok(results) => Ok(per_partition(ApiKey::OffsetDelete, results)),
            Err(code) => Ok(partitions
                .iter()
                .map(|tp| {
                    (
                        tp.clone(),
                        Err(item_error(
                            ApiKey::OffsetDelete,
                            &format!("group {group}"),
                            code,
                            None,
                        )),
                    )
                })
                .collect()),
        }
    }

    /// Offsets by position or time (ListOffsets to each partition's leader,
    /// `read_uncommitted`): see [`OffsetSpec`]. A partition of a topic that does not
    /// exist is UNKNOWN_TOPIC_OR_PARTITION; [`OffsetSpec::MaxTimestamp`] asked of a
    /// broker below ListOffsets v7 is that partition's UNSUPPORTED_VERSION.
    pub async fn list_offsets(
        &self,
        specs: &[(TopicPartition, OffsetSpec)],
    ) -> Result<ItemResults<TopicPartition, ListedOffset>> {
        self.list_offsets_isolated(specs, IsolationLevel::ReadUncommitted)
            .await
    }

    /// [`AdminClient::list_offsets`] at an isolation level: under `read_committed`,
    /// [`OffsetSpec::Latest`] is the last stable offset.
    pub async fn list_offsets_isolated(
        &self,
        specs: &[(TopicPartition, OffsetSpec)],
        isolation: IsolationLevel,
    ) -> Result<ItemResults<TopicPartition, ListedOffset>> {
        list_offsets(&self.cluster, specs, isolation, self.timeout, self.backoff).await
    }

    // ----- routing and retries -----

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    fn timeout_ms(&self) -> i32 {
        i32::try_from(self.timeout.as_millis()).unwrap_or(i32::MAX)
    }

    /// Waits `retry.backoff.ms`, or until `deadline` if that comes first.
    async fn pause(&self, deadline: Instant) {
        tokio::time::sleep_until((Instant::now() + self.backoff).min(deadline)).await;
    }

    async fn version(&self, conn: &BrokerConnection, api: ApiKey) -> Result<i16> {
        negotiated(conn, api).await
    }

    async fn fresh_metadata(&self) -> Result<std::sync::Arc<ClusterMetadata>> {
        let deadline = self.deadline();
        loop {
            match self.cluster.refresh_metadata().await {
                Ok(m) => return Ok(m),
                Err(e) if worth_retrying(&e) && Instant::now() < deadline => {
                    self.pause(deadline).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A Metadata request for `scope` on any broker, read on its own (the cluster's
    /// shared snapshot merges topics over earlier answers, so a deleted topic would
    /// linger there).
    async fn metadata(&self, scope: &TopicScope) -> Result<ClusterMetadata> {
        let deadline = self.deadline();
        loop {
            match metadata_of(&self.cluster, scope).await {
                Ok(m) => return Ok(m),
                Err(e) if worth_retrying(&e) && Instant::now() < deadline => {
                    self.pause(deadline).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Every config of each topic, by topic (DescribeConfigs to any broker).
    async fn describe_topic_configs(
        &self,
        topics: &[String],
    ) -> Result<BTreeMap<String, Result<BTreeMap<String, ConfigEntry>>>> {
        let deadline = self.deadline();
        loop {
            let attempt = async {
                let conn = self.cluster.any_connection();
                let version = self.version(&conn, ApiKey::DescribeConfigs).await?;
                let request: DescribeConfigsRequest = describe_topic_configs_request(topics);
                Ok::<_, Error>(conn.send_version(&request, version).await?)
            }
            .await;
            match attempt {
                Ok(response) => {
                    return Ok(describe_topic_configs_results(&response)
                        .into_iter()
                        .map(|(name, r)| {
                            let r = r.map_err(|e| {
                                item_error(
                                    ApiKey::DescribeConfigs,
                                    &e.name,
                                    e.code,
                                    e.message.as_deref(),
                                )
                            });
                            (name, r)
                        })
                        .collect());
                }
                Err(e) if worth_retrying(&e) && Instant::now() < deadline => {
                    self.pause(deadline).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The controller's connection; any broker's when the metadata names none.
    fn controller(&self) -> Result<BrokerConnection> {
        let m = self.cluster.metadata();
        match m.controller {
            Some(node) if m.brokers.contains_key(&node) => self.cluster.broker(node),
            _ => Ok(self.cluster.any_connection()),
        }
    }

    /// Sends a per-topic request to the controller; topics answered NOT_CONTROLLER (or
    /// not answered, or lost with the connection) go again to the controller of
    /// refreshed metadata until the deadline. Every other code is its topic's result.
    async fn controller_batch<R, B, P>(
        &self,
        api: ApiKey,
        names: Vec<String>,
        build: B,
        parse: P,
    ) -> Result<ItemResults<String>>
    where
        R: Request,
        B: Fn(&[String], i16) -> R,
        P: Fn(&R::Response) -> Vec<ItemResult>,
    {
        let deadline = self.deadline();
        let mut out: ItemResults<String> = BTreeMap::new();
        let mut pending: Vec<String> = names;
        pending.sort();
        pending.dedup();
        // Why each topic still pending is pending: its error if the deadline comes.
        let mut last: BTreeMap<String, Error> = BTreeMap::new();
        let mut first = true;
        while !pending.is_empty() {
            if !first {
                if Instant::now() >= deadline {
                    for name in pending.drain(..) {
                        let e = last
                            .remove(&name)
                            .unwrap_or_else(|| timed_out(api, self.timeout));
                        out.insert(name, Err(e));
                    }
                    break;
                }
                self.pause(deadline).await;
                if let Err(e) = self.cluster.refresh_metadata().await {
                    if !worth_retrying(&e) {
                        return Err(e);
                    }
                    continue;
                }
            }
            first = false;
            let conn = self.controller()?;
            let version = match self.version(&conn, api).await {
                Ok(v) => v,
                Err(e) if worth_retrying(&e) => {
                    for name in &pending {
                        last.insert(name.clone(), e.clone());
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            let request = build(&pending, version);
            let response = match conn.send_version(&request, version).await {
                Ok(r) => r,
                Err(e) if e.is_retriable() => {
                    for name in &pending {
                        last.insert(name.clone(), e.clone().into());
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let mut next = Vec::new();
            for r in parse(&response) {
                if !pending.contains(&r.name) || out.contains_key(&r.name) {
                    continue;
                }
                let result =
                    (r.code != 0).then(|| item_error(api, &r.name, r.code, r.message.as_deref()));
                match result {
                    None => {
                        out.insert(r.name, Ok(()));
                    }
                    Some(e) if reroute(r.code) == Some(Reroute::Controller) => {
                        last.insert(r.name.clone(), e);
                        next.push(r.name);
                    }
                    Some(e) => {
                        out.insert(r.name, Err(e));
                    }
                }
            }
            for name in pending.drain(..) {
                if !out.contains_key(&name) && !next.contains(&name) {
                    next.push(name);
                }
            }
            pending = next;
        }
        Ok(out)
    }

    /// The group's coordinator (FindCoordinator to any broker).
    async fn coordinator(&self, group: &str) -> Result<BrokerConnection> {
        let conn = self.cluster.any_connection();
        let version = self.version(&conn, ApiKey::FindCoordinator).await?;
        let request: FindCoordinatorRequest = find_coordinator_request(group, version);
        let response = conn.send_version(&request, version).await?;
        match coordinator_of(&response, version) {
            Ok((_, address)) => Ok(self.cluster.connection(&address)),
            Err(code) => Err(Error::broker(
                ApiKey::FindCoordinator,
                code,
                Some(format!("group {group}")),
            )),
        }
    }

    /// Sends a group request to the group's coordinator. `parse` returns `Err(code)`
    /// for a code that means the coordinator moved (see [`reroute`]): the coordinator
    /// is found again and the request sent again, until the deadline. Lost
    /// connections are retried the same way.
    async fn group_call<R, T, B, P>(
        &self,
        api: ApiKey,
        group: &str,
        build: B,
        parse: P,
    ) -> Result<T>
    where
        R: Request,
        B: Fn(i16) -> R,
        P: Fn(&R::Response, i16) -> Result<T, i16>,
    {
        let deadline = self.deadline();
        loop {
            let attempt = async {
                let conn = self.coordinator(group).await?;
                let version = self.version(&conn, api).await?;
                let response = conn.send_version(&build(version), version).await?;
                Ok::<_, Error>(parse(&response, version))
            }
            .await;
            let e = match attempt {
                Ok(Ok(t)) => return Ok(t),
                Ok(Err(code)) => Error::broker(api, code, Some(format!("group {group}"))),
                Err(e) => e,
            };
            if !(worth_retrying(&e) && Instant::now() < deadline) {
                return Err(e);
            }
            self.pause(deadline).await;
        }
    }
}

/// The version negotiated with `conn` for `api`, or a [`RequestError::Negotiation`]
/// naming the API when the broker lacks it (or shares no version of it).
async fn negotiated(conn: &BrokerConnection, api: ApiKey) -> Result<i16> {
    let table = conn.versions().await?;
    if let Some(v) = table.version(api) {
        return Ok(v);
    }
    let source = match table.require(&[api]) {
        Err(e) => e,
        Ok(()) => NegotiationError::Broker {
            code: ResponseError::UnsupportedVersion.code(),
        },
    };
    Err(RequestError::Negotiation {
        broker: conn.address().to_string(),
        source,
    }
    .into())
}

/// Metadata for `scope`, asked of any broker and read on its own: the cluster's
/// shared snapshot merges topics over earlier answers (a deleted topic would linger
/// there), and its scope is the client's, which a one-off lookup must not widen.
async fn metadata_of(cluster: &Cluster, scope: &TopicScope) -> Result<ClusterMetadata> {
    let conn = cluster.any_connection();
    let version = negotiated(&conn, ApiKey::Metadata).await?;
    let request: MetadataRequest = crate::driver::metadata_request(scope, version);
    let response = conn.send_version(&request, version).await?;
    if response.error_code != 0 {
        return Err(Error::broker(ApiKey::Metadata, response.error_code, None));
    }
    Ok(ClusterMetadata::from_response(None, &response))
}

/// Whether sending again (after a refresh) may give another answer: a lost connection,
/// a timeout, or a broker error code that [`reroute`] sends elsewhere.
fn worth_retrying(e: &Error) -> bool {
    match e {
        Error::Request(r) => r.is_retriable(),
        Error::Broker { code, .. } => reroute(*code).is_some(),
        Error::UnknownBroker { .. } => true,
        _ => false,
    }
}

fn item_error(api: ApiKey, item: &str, code: i16, message: Option<&str>) -> Error {
    let context = match message {
        Some(m) if !m.is_empty() => format!("{item} ({m})"),
        _ => item.to_string(),
    };
    Error::broker(api, code, Some(context))
}

fn timed_out(api: ApiKey, after: Duration) -> Error {
    Error::Request(RequestError::Timeout {
        broker: "any".into(),
        api,
        after,
    })
}

/// `Err(code)` when a partition was refused because the coordinator moved: the whole
/// request goes again to the new one.
fn coordinator_moved<T>(results: &[PartitionOutcome<T>]) -> Result<(), i16> {
    match results.iter().find_map(|(_, r)| {
        r.as_ref()
            .err()
            .filter(|c| reroute(**c) == Some(Reroute::Coordinator))
    }) {
        Some(code) => Err(*code),
        None => Ok(()),
    }
}

fn per_partition<T>(
    api: ApiKey,
    results: Vec<PartitionOutcome<T>>,
) -> ItemResults<TopicPartition, T> {
    results
        .into_iter()
        .map(|(tp, r)| {
            let r = r.map_err(|code| item_error(api, &tp.to_string(), code, None));
            (tp, r)
        })
        .collect()
}

/// ListOffsets for `specs`, each partition asked of its leader (one request per
/// leader), retried after a metadata refresh on leadership errors and lost
/// connections until `timeout`. Shared by [`AdminClient::list_offsets`] and the
/// consumer's seeks.
pub(crate) async fn list_offsets(
    cluster: &Cluster,
    specs: &[(TopicPartition, OffsetSpec)],
    isolation: IsolationLevel,
    timeout: Duration,
    backoff: Duration,
) -> Result<ItemResults<TopicPartition, ListedOffset>> {
    let api = ApiKey::ListOffsets;
    let deadline = Instant::now() + timeout;
    let scope = TopicScope::Topics(specs.iter().map(|(tp, _)| tp.topic.clone()).collect());
    let mut pending: BTreeMap<TopicPartition, OffsetSpec> = specs.iter().cloned().collect();
    let mut out: ItemResults<TopicPartition, ListedOffset> = BTreeMap::new();
    let mut last: BTreeMap<TopicPartition, Error> = BTreeMap::new();
    let mut first = true;
    while !pending.is_empty() {
        if !first {
            if Instant::now() >= deadline {
                for (tp, _) in std::mem::take(&mut pending) {
                    let e = last.remove(&tp).unwrap_or_else(|| timed_out(api, timeout));
                    out.insert(tp, Err(e));
                }
                break;
            }
            tokio::time::sleep_until((Instant::now() + backoff).min(deadline)).await;
        }
        first = false;
        let metadata = match metadata_of(cluster, &scope).await {
            Ok(m) => m,
            Err(e) if worth_retrying(&e) => {
                for tp in pending.keys() {
                    last.insert(tp.clone(), e.clone());
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut by_leader: BTreeMap<NodeId, Vec<(TopicPartition, OffsetSpec, i32)>> =
            BTreeMap::new();
        let mut retry: BTreeMap<TopicPartition, OffsetSpec> = BTreeMap::new();
        for (tp, spec) in std::mem::take(&mut pending) {
            let unknown = ResponseError::UnknownTopicOrPartition.code();
            let located = match metadata.topics.get(&tp.topic) {
                None => Err(unknown),
                Some(t) if t.error != 0 && t.partitions.is_empty() => Err(t.error),
                Some(t) => match t.partitions.iter().find(|p| p.partition == tp.partition) {
                    None => Err(unknown),
                    Some(p) => match p.leader {
                        Some(leader) => Ok((leader, p.leader_epoch.0)),
                        None => Err(ResponseError::LeaderNotAvailable.code()),
                    },
                },
            };
            match located {
                Ok((leader, epoch)) => by_leader.entry(leader).or_default().push((tp, spec, epoch)),
                Err(code) => {
                    let e = item_error(api, &tp.to_string(), code, None);
                    if reroute(code).is_some() {
                        last.insert(tp.clone(), e);
                        retry.insert(tp, spec);
                    } else {
                        out.insert(tp, Err(e));
                    }
                }
            }
        }
        for (node, partitions) in by_leader {
            let again = |retry: &mut BTreeMap<_, _>, last: &mut BTreeMap<_, _>, e: &Error| {
                for (tp, spec, _) in &partitions {
                    last.insert(tp.clone(), e.clone());
                    retry.insert(tp.clone(), *spec);
                }
            };
            let Some(broker) = metadata.brokers.get(&node) else {
                again(
                    &mut retry,
                    &mut last,
                    &Error::UnknownBroker { node: node.0 },
                );
                continue;
            };
            let conn = cluster.connection(&broker.address());
            let version = match negotiated(&conn, api).await {
                Ok(v) => v,
                Err(e) if worth_retrying(&e) => {
                    again(&mut retry, &mut last, &e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            // A spec the negotiated version cannot carry is that partition's error.
            let (askable, too_new): (Vec<_>, Vec<_>) = partitions
                .iter()
                .cloned()
                .partition(|(_, spec, _)| spec.min_version() <= version);
            for (tp, spec, _) in too_new {
                let e = Error::Request(RequestError::UnsupportedVersion {
                    broker: conn.address().to_string(),
                    api,
                    version: spec.min_version(),
                    negotiated: format!("up to v{version}"),
                });
                out.insert(tp, Err(e));
            }
            if askable.is_empty() {
                continue;
            }
            let request: ListOffsetsRequest = list_offsets_request(&askable, isolation, version);
            let response = match conn.send_version(&request, version).await {
                Ok(r) => r,
                Err(e) if e.is_retriable() => {
                    again(&mut retry, &mut last, &e.into());
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let mut answered = BTreeSet::new();
            for (tp, result) in list_offsets_results(&response) {
                let Some((_, spec, _)) = askable.iter().find(|(t, _, _)| *t == tp) else {
                    continue;
                };
                answered.insert(tp.clone());
                match result {
                    Ok(listed) => {
                        out.insert(tp, Ok(listed.answering(*spec)));
                    }
                    Err(code) => {
                        let e = item_error(api, &tp.to_string(), code, None);
                        if reroute(code).is_some() {
                            last.insert(tp.clone(), e);
                            retry.insert(tp, *spec);
                        } else {
                            out.insert(tp, Err(e));
                        }
                    }
                }
            }
            for (tp, spec, _) in askable {
                if !answered.contains(&tp) && !out.contains_key(&tp) {
                    retry.insert(tp, spec);
                }
            }
        }
        pending = retry;
    }
    Ok(out)
}
