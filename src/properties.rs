//! Configuration by Java and librdkafka property names: the one table of the names
//! ottla understands, the names it knows but ignores, the suggestion for a misspelt
//! name, and the mapping from environment variables.
//!
//! The typed builders stay the primary API. This module lets configuration people
//! already have work as it is: `set("session.timeout.ms", "45000")` on
//! [`ClientConfig`](crate::ClientConfig), [`ConsumerBuilder`](crate::ConsumerBuilder),
//! [`ProducerBuilder`](crate::ProducerBuilder) and
//! [`ProcessorBuilder`](crate::processor::ProcessorBuilder), `from_properties(pairs)`,
//! and `from_env("OTTLA_")` / `from_env_vars(prefix, vars)` on each.
//!
//! # What happens to a key
//!
//! - **Understood** ([`PROPERTIES`]): the value is parsed and set. A value that does not
//!   parse is [`PropertyError::InvalidValue`], naming the key and the value (a secret's
//!   value is never repeated). Names are case-sensitive, as in Java and librdkafka.
//! - **Understood by another component**: a producer setting given to a consumer (a
//!   shared properties file) is ignored there, as both Java and librdkafka do, and
//!   reported like the next case. A [`ClientConfig`](crate::ClientConfig) holds only the
//!   connection settings, so it reports every consumer, producer and Processor setting
//!   this way.
//! - **Known but meaningless to ottla** ([`IGNORED`]): `set` logs a tracing warning and
//!   records the key with the reason; each builder's `ignored_properties()` returns
//!   them (an [`IgnoredProperty`] per key, in the order first given), so a caller that
//!   wants strictness checks that it is empty. Nothing is silently accepted.
//! - **Known but not supported** (the OAUTHBEARER JWT-bearer grant's
//!   `sasl.oauthbearer.assertion.*`): refused with [`PropertyError::Unsupported`],
//!   because ignoring it would change what the application relies on (how it
//!   authenticates).
//! - **Unknown**: refused with [`PropertyError::Unknown`], which suggests the closest
//!   known name by edit distance (`sesion.timeout.ms`: "did you mean
//!   session.timeout.ms?").
//!
//! # Names
//!
//! The first name is Java's where Java has one; the names in parentheses are the
//! librdkafka spellings accepted as well. *Partly* marks what ottla takes only in part.
//!
//! Connection settings (every builder):
//!
//! | property | builder method | partly |
//! |---|---|---|
//! | `bootstrap.servers` (`metadata.broker.list`) | `ClientConfig::new` | |
//! | `client.id` | `client_id` | |
//! | `client.rack` | `client_rack` | |
//! | `request.timeout.ms` (`socket.timeout.ms`) | `with_request_timeout` | |
//! | `metadata.max.age.ms` (`topic.metadata.refresh.interval.ms`) | `metadata_max_age` | librdkafka's interval is read as the maximum age |
//! | `socket.connection.setup.timeout.ms` | `with_connect_timeout` | |
//! | `reconnect.backoff.ms`, `reconnect.backoff.max.ms` | `with_reconnect_backoff` | |
//! | `retry.backoff.ms`, `retry.backoff.max.ms` | `retry_backoff`, `retry_backoff_max` | |
//! | `max.in.flight.requests.per.connection` (`max.in.flight`) | `with_max_in_flight` | |
//! | `receive.message.max.bytes` | `with_max_frame_size` | |
//! | `connections.max.idle.ms` | `with_connections_max_idle` | |
//! | `socket.keepalive.enable` | `with_socket_keepalive` | |
//! | `security.protocol` | `with_security_protocol` | |
//! | `ssl.ca.location`, `ssl.ca.pem`, `ssl.truststore.location`, `ssl.truststore.certificates`, `ssl.truststore.type` | `TlsConfig` roots | PEM stores only |
//! | `ssl.certificate.location`, `ssl.key.location`, `ssl.certificate.pem`, `ssl.key.pem`, `ssl.keystore.location`, `ssl.keystore.certificate.chain`, `ssl.keystore.key`, `ssl.keystore.type` | `TlsConfig` client certificate | PEM only |
//! | `ssl.key.password`, `ssl.keystore.password` | (none) | only empty: encrypted keys are not read |
//! | `ssl.endpoint.identification.algorithm` | `TlsConfig::danger_disable_hostname_verification` | |
//! | `sasl.mechanism` (`sasl.mechanisms`) | `SaslConfig` | PLAIN, SCRAM-SHA-256/512, OAUTHBEARER |
//! | `sasl.username`, `sasl.password` | `SaslConfig` | |
//! | `sasl.jaas.config` | `SaslConfig` | PlainLoginModule, ScramLoginModule, and OAuthBearerLoginModule's `clientId`, `clientSecret`, `scope` and `extension_*` |
//! | `sasl.oauthbearer.config`, `enable.sasl.oauthbearer.unsecure.jwt` | `SaslConfig::oauth_bearer_unsecured_jwt` | |
//! | `sasl.oauthbearer.method` | `SaslConfig::oauth_bearer_oidc` (`oidc`, with the `oauthbearer-oidc` feature) | |
//! | `sasl.oauthbearer.token.endpoint.url`, `sasl.oauthbearer.client.credentials.client.id` (`sasl.oauthbearer.client.id`), `sasl.oauthbearer.client.credentials.client.secret` (`sasl.oauthbearer.client.secret`) | `OidcConfig::new` | |
//! | `sasl.oauthbearer.scope`, `sasl.oauthbearer.extensions`, `sasl.oauthbearer.sub.claim.name` | `OidcConfig::scope`, `extension`, `sub_claim_name` | |
//! | `sasl.oauthbearer.grant.type` | `OidcConfig` (the grant) | `client_credentials` only |
//! | `https.ca.location`, `https.ca.pem` | `OidcConfig::tls` | |
//!
//! Consumer settings ([`ConsumerBuilder`](crate::ConsumerBuilder), and the Processor's
//! consumer):
//!
//! | property | builder method | partly |
//! |---|---|---|
//! | `group.id` | `group_id` | |
//! | `group.instance.id` | `instance_id` | |
//! | `group.protocol`, `group.remote.assignor` | `group_protocol`, `group_remote_assignor` | |
//! | `session.timeout.ms`, `heartbeat.interval.ms`, `max.poll.interval.ms` | `session_timeout`, `heartbeat_interval`, `max_poll_interval` | |
//! | `auto.offset.reset` | `offset_reset` | `earliest`/`smallest`/`beginning`, `latest`/`largest`/`end`, `none`/`error`; not Java's `by_duration:` |
//! | `enable.auto.commit` (`auto.commit.enable`), `auto.commit.interval.ms` | `auto_commit` | off unless set: Java and librdkafka default to on |
//! | `partition.assignment.strategy` | `assignors` | the four built-in assignors, by librdkafka name or Java class name; no custom classes |
//! | `isolation.level` | `isolation` | |
//! | `fetch.min.bytes` | `fetch_min_bytes` | |
//! | `fetch.max.wait.ms` (`fetch.wait.max.ms`) | `fetch_max_wait` | |
//! | `fetch.max.bytes` | `fetch_max_bytes` | |
//! | `max.partition.fetch.bytes` (`fetch.message.max.bytes`) | `max_partition_fetch_bytes` | |
//! | `queued.max.messages.kbytes` | `buffer_max_bytes` (× 1024) | |
//! | `check.crcs` | `check_crcs` | |
//! | `ottla.topics` | `topics` (comma-separated) | |
//! | `ottla.topic.regex` | `topic_regex` | |
//! | `ottla.fetch.sessions` | `fetch_sessions` | |
//! | `ottla.cooperative.upgrade.ms` | `cooperative_upgrade` (`-1`: never) | |
//!
//! Producer settings ([`ProducerBuilder`](crate::ProducerBuilder), and the Processor's
//! dead-letter producer):
//!
//! | property | builder method | partly |
//! |---|---|---|
//! | `acks` (`request.required.acks`) | `acks` | |
//! | `linger.ms` (`queue.buffering.max.ms`) | `linger` | |
//! | `batch.size` | `batch_size` | |
//! | `compression.type` (`compression.codec`) | `compression` | no `compression.level` |
//! | `enable.idempotence` | `idempotence` | |
//! | `buffer.memory` | `buffer_memory` | |
//! | `queue.buffering.max.kbytes` | `buffer_memory` (× 1024) | |
//! | `delivery.timeout.ms` (`message.timeout.ms`) | `delivery_timeout` | |
//! | `max.block.ms` | `max_block` | |
//! | `partitioner` | `partitioner` | librdkafka's seven names; unkeyed records stick by `batch.size`, not `sticky.partitioning.linger.ms` |
//! | `partitioner.ignore.keys` | `partitioner_ignore_keys` | |
//! | `max.request.size` (`message.max.bytes`) | `max_request_size` | the largest record, not the largest request |
//! | `transactional.id` | `transactional_id` | |
//! | `transaction.timeout.ms` | `transaction_timeout` | |
//!
//! Processor settings ([`ProcessorBuilder`](crate::processor::ProcessorBuilder)). The
//! Processor has settings Kafka has no name for; those that are plain values get an
//! `ottla.` name (the retry ones mirror the environment variables of
//! [`RetryPolicy::from_vars`](crate::processor::RetryPolicy::from_vars), with dots).
//! The ones that take code or structure stay typed-only: `classifier`, `dlq_topic`,
//! `dlq_format`, `dlq_timestamp`, `metrics`, and the per-class and per-type retry
//! overrides of `retry_policy`. On a Processor, `group.id`, the three group timeouts
//! and `ottla.topics` are the Processor's own; `enable.auto.commit` and
//! `auto.commit.interval.ms` are ignored (it commits finished records itself, on
//! `ottla.commit.interval.ms`).
//!
//! | property | builder method |
//! |---|---|
//! | `ottla.concurrency` | `concurrency` |
//! | `ottla.processing.order` | `ordering` (`partition`, `key` or `unordered`) |
//! | `ottla.commit.interval.ms` | `commit_interval` (`0`: after every record) |
//! | `ottla.processing.budget.ms` | `processing_budget` |
//! | `ottla.shutdown.timeout.ms` | `shutdown_timeout` |
//! | `ottla.acquiesce.share` | `acquiesce_share` |
//! | `ottla.check.topics` | `check_topics` |
//! | `processing.guarantee` (Kafka Streams' name) | `processing_guarantee` (`at_least_once`, or `exactly_once` / `exactly_once_v2`, which needs `transactional.id`) |
//! | `ottla.dlq.suffix` | `dlq_suffix` |
//! | `ottla.retry.topics` | `retry_topics` (comma-separated milliseconds) |
//! | `ottla.max.retries`, `ottla.initial.retry.delay.ms`, `ottla.max.retry.delay.ms`, `ottla.retry.backoff.multiplier`, `ottla.retry.jitter`, `ottla.retry.min.delay.ms` | `retry_policy`'s default backoff |
//!
//! # Environment variables
//!
//! [`env_key`] maps a variable to a property name: the prefix is removed (it must match
//! exactly, case included), the rest is lower-cased, a single `_` becomes `.` and a
//! double `__` stands for a literal `_`. So with the prefix `OTTLA_`:
//! `OTTLA_SESSION_TIMEOUT_MS` is `session.timeout.ms`, `OTTLA_OTTLA_TOPICS` is
//! `ottla.topics`, and `OTTLA_LOG__LEVEL` is librdkafka's `log_level`. Every variable
//! with the prefix is read and validated like any other property: one ottla does not
//! know is an error, so keep the prefix for ottla's configuration alone.

use std::time::Duration;

use tracing::{debug, warn};

/// Which component understands a property.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scope {
    /// A connection setting, understood by every builder ([`crate::ClientConfig`]).
    Client,
    /// A consumer setting ([`crate::ConsumerBuilder`]).
    Consumer,
    /// A producer setting ([`crate::ProducerBuilder`]).
    Producer,
    /// A Processor setting ([`crate::processor::ProcessorBuilder`]).
    Processor,
}

/// A property ottla understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Property {
    /// The name ottla uses (Java's where Java has one).
    pub name: &'static str,
    /// Other spellings with the same meaning (librdkafka's).
    pub aliases: &'static [&'static str],
    /// The component that understands it.
    pub scope: Scope,
    /// What ottla does not take of it, if it takes it only in part.
    pub partly: Option<&'static str>,
}

const fn p(name: &'static str, scope: Scope) -> Property {
    Property {
        name,
        aliases: &[],
        scope,
        partly: None,
    }
}

const fn alias(name: &'static str, aliases: &'static [&'static str], scope: Scope) -> Property {
    Property {
        name,
        aliases,
        scope,
        partly: None,
    }
}

const fn partly(
    name: &'static str,
    aliases: &'static [&'static str],
    scope: Scope,
    what: &'static str,
) -> Property {
    Property {
        name,
        aliases,
        scope,
        partly: Some(what),
    }
}

use Scope::{Client, Consumer, Processor, Producer};

/// Every property ottla understands, with its librdkafka spellings. Each builder's
/// `set` matches on [`Property::name`] only.
pub const PROPERTIES: &[Property] = &[
    // Connection settings.
    alias("bootstrap.servers", &["metadata.broker.list"], Client),
    p("client.id", Client),
    p("client.rack", Client),
    alias("request.timeout.ms", &["socket.timeout.ms"], Client),
    partly(
        "metadata.max.age.ms",
        &["topic.metadata.refresh.interval.ms"],
        Client,
        "librdkafka's refresh interval is read as the maximum age of metadata",
    ),
    p("socket.connection.setup.timeout.ms", Client),
    p("reconnect.backoff.ms", Client),
    p("reconnect.backoff.max.ms", Client),
    p("retry.backoff.ms", Client),
    p("retry.backoff.max.ms", Client),
    alias(
        "max.in.flight.requests.per.connection",
        &["max.in.flight"],
        Client,
    ),
    p("receive.message.max.bytes", Client),
    p("connections.max.idle.ms", Client),
    p("socket.keepalive.enable", Client),
    p("security.protocol", Client),
    p("ssl.ca.location", Client),
    p("ssl.ca.pem", Client),
    partly("ssl.truststore.location", &[], Client, "PEM files only"),
    p("ssl.truststore.certificates", Client),
    partly("ssl.truststore.type", &[], Client, "PEM only"),
    p("ssl.certificate.location", Client),
    p("ssl.key.location", Client),
    p("ssl.certificate.pem", Client),
    p("ssl.key.pem", Client),
    partly("ssl.keystore.location", &[], Client, "PEM files only"),
    p("ssl.keystore.certificate.chain", Client),
    p("ssl.keystore.key", Client),
    partly("ssl.keystore.type", &[], Client, "PEM only"),
    partly(
        "ssl.key.password",
        &[],
        Client,
        "only empty: encrypted private keys are not read",
    ),
    partly(
        "ssl.keystore.password",
        &[],
        Client,
        "only empty: encrypted stores are not read",
    ),
    p("ssl.endpoint.identification.algorithm", Client),
    partly(
        "sasl.mechanism",
        &["sasl.mechanisms"],
        Client,
        "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER; no GSSAPI",
    ),
    p("sasl.username", Client),
    p("sasl.password", Client),
    partly(
        "sasl.jaas.config",
        &[],
        Client,
        "PlainLoginModule and ScramLoginModule entries, and OAuthBearerLoginModule's clientId, clientSecret, scope and extension_*",
    ),
    p("sasl.oauthbearer.config", Client),
    p("enable.sasl.oauthbearer.unsecure.jwt", Client),
    // OIDC client credentials (KIP-768): librdkafka's names, and Java's where they
    // differ (the client id and secret, KIP-1139).
    p("sasl.oauthbearer.method", Client),
    p("sasl.oauthbearer.token.endpoint.url", Client),
    alias(
        "sasl.oauthbearer.client.credentials.client.id",
        &["sasl.oauthbearer.client.id"],
        Client,
    ),
    alias(
        "sasl.oauthbearer.client.credentials.client.secret",
        &["sasl.oauthbearer.client.secret"],
        Client,
    ),
    p("sasl.oauthbearer.scope", Client),
    p("sasl.oauthbearer.extensions", Client),
    p("sasl.oauthbearer.sub.claim.name", Client),
    partly(
        "sasl.oauthbearer.grant.type",
        &[],
        Client,
        "client_credentials only",
    ),
    p("https.ca.location", Client),
    p("https.ca.pem", Client),
    // Consumer settings.
    p("group.id", Consumer),
    p("group.instance.id", Consumer),
    p("group.protocol", Consumer),
    p("group.remote.assignor", Consumer),
    p("session.timeout.ms", Consumer),
    p("heartbeat.interval.ms", Consumer),
    p("max.poll.interval.ms", Consumer),
    partly(
        "auto.offset.reset",
        &[],
        Consumer,
        "not Java's by_duration: form",
    ),
    partly(
        "enable.auto.commit",
        &["auto.commit.enable"],
        Consumer,
        "off unless set (Java and librdkafka default to on)",
    ),
    p("auto.commit.interval.ms", Consumer),
    partly(
        "partition.assignment.strategy",
        &[],
        Consumer,
        "the built-in range, roundrobin, sticky and cooperative-sticky assignors only",
    ),
    p("isolation.level", Consumer),
    p("fetch.min.bytes", Consumer),
    alias("fetch.max.wait.ms", &["fetch.wait.max.ms"], Consumer),
    p("fetch.max.bytes", Consumer),
    alias(
        "max.partition.fetch.bytes",
        &["fetch.message.max.bytes"],
        Consumer,
    ),
    p("queued.max.messages.kbytes", Consumer),
    p("check.crcs", Consumer),
    p("ottla.topics", Consumer),
    p("ottla.topic.regex", Consumer),
    p("ottla.fetch.sessions", Consumer),
    p("ottla.cooperative.upgrade.ms", Consumer),
    // Producer settings.
    alias("acks", &["request.required.acks"], Producer),
    alias("linger.ms", &["queue.buffering.max.ms"], Producer),
    p("batch.size", Producer),
    partly(
        "compression.type",
        &["compression.codec"],
        Producer,
        "the codec only, at its default level",
    ),
    p("enable.idempotence", Producer),
    p("buffer.memory", Producer),
    p("queue.buffering.max.kbytes", Producer),
    alias("delivery.timeout.ms", &["message.timeout.ms"], Producer),
    p("max.block.ms", Producer),
    partly(
        "partitioner",
        &[],
        Producer,
        "librdkafka's seven by name; records without a key stick by batch.size, not sticky.partitioning.linger.ms",
    ),
    p("partitioner.ignore.keys", Producer),
    partly(
        "max.request.size",
        &["message.max.bytes"],
        Producer,
        "the largest record accepted, not the largest request",
    ),
    p("transactional.id", Producer),
    p("transaction.timeout.ms", Producer),
    // Processor settings.
    p("ottla.concurrency", Processor),
    p("ottla.processing.order", Processor),
    p("ottla.commit.interval.ms", Processor),
    p("ottla.processing.budget.ms", Processor),
    p("ottla.shutdown.timeout.ms", Processor),
    p("ottla.acquiesce.share", Processor),
    p("ottla.check.topics", Processor),
    p("processing.guarantee", Processor),
    p("ottla.dlq.suffix", Processor),
    p("ottla.retry.topics", Processor),
    p("ottla.max.retries", Processor),
    p("ottla.initial.retry.delay.ms", Processor),
    p("ottla.max.retry.delay.ms", Processor),
    p("ottla.retry.backoff.multiplier", Processor),
    p("ottla.retry.jitter", Processor),
    p("ottla.retry.min.delay.ms", Processor),
];

/// Java and librdkafka properties that mean nothing to ottla, with the reason: `set`
/// records them as ignored (with a warning) instead of refusing them.
pub const IGNORED: &[(&str, &str)] = &[
    // Serialisation and plug-ins: ottla hands out bytes and takes code as Rust values.
    ("key.deserializer", "ottla hands out keys as bytes"),
    ("value.deserializer", "ottla hands out values as bytes"),
    ("key.serializer", "ottla takes keys as bytes"),
    ("value.serializer", "ottla takes values as bytes"),
    (
        "interceptor.classes",
        "Java classes; wrap the handler instead",
    ),
    (
        "metric.reporters",
        "Java classes; use the Processor's metrics hook",
    ),
    (
        "partitioner.class",
        "a Java class; give ProducerBuilder::custom_partitioner",
    ),
    (
        "partitioner.adaptive.partitioning.enable",
        "ottla's sticky partitioner moves on by batch.size, not by broker load",
    ),
    (
        "partitioner.availability.timeout.ms",
        "ottla's sticky partitioner moves on by batch.size, not by broker load",
    ),
    (
        "sticky.partitioning.linger.ms",
        "ottla's sticky partitioner switches on a full batch",
    ),
    ("security.providers", "Java classes"),
    ("sasl.login.class", "Java classes; give a TokenProvider"),
    (
        "sasl.login.callback.handler.class",
        "Java classes; give a TokenProvider",
    ),
    (
        "sasl.client.callback.handler.class",
        "Java classes; give a TokenProvider",
    ),
    (
        "sasl.oauthbearer.scope.claim.name",
        "the token's scope is the broker's to check; ottla sends the token as it came",
    ),
    (
        "sasl.login.refresh.window.factor",
        "OAUTHBEARER tokens are refreshed at 80% of their lifetime",
    ),
    (
        "sasl.login.refresh.window.jitter",
        "OAUTHBEARER tokens are refreshed at 80% of their lifetime",
    ),
    (
        "sasl.login.refresh.min.period.seconds",
        "OAUTHBEARER tokens are refreshed at 80% of their lifetime",
    ),
    (
        "sasl.login.refresh.buffer.seconds",
        "OAUTHBEARER tokens are refreshed at 80% of their lifetime",
    ),
    (
        "sasl.login.connect.timeout.ms",
        "an OIDC token request may take 20 s in all",
    ),
    (
        "sasl.login.read.timeout.ms",
        "an OIDC token request may take 20 s in all",
    ),
    (
        "sasl.login.retry.backoff.ms",
        "a failed token request is made again by the next connection, after the reconnect backoff",
    ),
    (
        "sasl.login.retry.backoff.max.ms",
        "a failed token request is made again by the next connection, after the reconnect backoff",
    ),
    ("ssl.engine.factory.class", "Java classes"),
    (
        "ssl.keymanager.algorithm",
        "a Java security provider setting",
    ),
    (
        "ssl.trustmanager.algorithm",
        "a Java security provider setting",
    ),
    (
        "ssl.secure.random.implementation",
        "a Java security provider setting",
    ),
    ("ssl.provider", "a Java security provider setting"),
    ("ssl.protocol", "rustls negotiates TLS 1.2 or 1.3"),
    ("ssl.enabled.protocols", "rustls negotiates TLS 1.2 or 1.3"),
    ("ssl.cipher.suites", "rustls chooses among its safe suites"),
    ("ssl.curves.list", "rustls chooses among its safe groups"),
    (
        "ssl.sigalgs.list",
        "rustls chooses among its safe algorithms",
    ),
    (
        "enable.ssl.certificate.verification",
        "ottla always verifies the broker's certificate",
    ),
    ("sasl.kerberos.service.name", "GSSAPI is not supported"),
    // Sockets and the runtime.
    ("socket.nagle.disable", "ottla always turns Nagle off"),
    (
        "socket.send.buffer.bytes",
        "the operating system's defaults are kept",
    ),
    (
        "socket.receive.buffer.bytes",
        "the operating system's defaults are kept",
    ),
    (
        "send.buffer.bytes",
        "the operating system's defaults are kept",
    ),
    (
        "receive.buffer.bytes",
        "the operating system's defaults are kept",
    ),
    (
        "socket.max.fails",
        "a failed connection is always reconnected with backoff",
    ),
    ("client.dns.lookup", "every address of a host name is tried"),
    (
        "broker.address.family",
        "every address of a host name is tried",
    ),
    (
        "api.version.request",
        "ottla always negotiates versions with ApiVersions",
    ),
    (
        "api.version.fallback.ms",
        "ottla always negotiates versions with ApiVersions",
    ),
    (
        "broker.version.fallback",
        "ottla always negotiates versions with ApiVersions",
    ),
    ("default.api.timeout.ms", "each call takes its own timeout"),
    // Logging and metrics: ottla logs through tracing.
    ("statistics.interval.ms", "use the Processor's metrics hook"),
    ("debug", "ottla logs through tracing; set RUST_LOG"),
    ("log_level", "ottla logs through tracing; set RUST_LOG"),
    ("log.connection.close", "ottla logs through tracing"),
    ("log.queue", "ottla logs through tracing"),
    ("log.thread.name", "ottla logs through tracing"),
    (
        "metrics.sample.window.ms",
        "use the Processor's metrics hook",
    ),
    ("metrics.num.samples", "use the Processor's metrics hook"),
    (
        "metrics.recording.level",
        "use the Processor's metrics hook",
    ),
    ("auto.include.jmx.reporter", "there is no JMX"),
    (
        "enable.metrics.push",
        "client metrics (KIP-714) are not pushed",
    ),
    // Consumer.
    (
        "enable.partition.eof",
        "the consumer emits no end-of-partition events",
    ),
    (
        "queued.min.messages",
        "prefetching is bounded by queued.max.messages.kbytes alone",
    ),
    (
        "fetch.queue.backoff.ms",
        "fetching resumes as soon as the buffer has room",
    ),
    (
        "fetch.error.backoff.ms",
        "fetch errors back off by retry.backoff.ms",
    ),
    (
        "enable.auto.offset.store",
        "the consumer stores the position of every record returned",
    ),
    (
        "max.poll.records",
        "records are delivered one at a time or per batch by the caller's limit",
    ),
    (
        "exclude.internal.topics",
        "ottla subscribes only to the topics named",
    ),
    (
        "allow.auto.create.topics",
        "ottla never asks the broker to create topics",
    ),
    (
        "coordinator.query.interval.ms",
        "the coordinator is looked up again when it moves",
    ),
    (
        "internal.leave.group.on.close",
        "a dynamic member always leaves on close",
    ),
    (
        "topic.metadata.refresh.sparse",
        "metadata is fetched for the topics in use only",
    ),
    (
        "topic.metadata.propagation.max.ms",
        "missing topics are retried until metadata.max.age.ms",
    ),
    // Producer.
    ("retries", "records are retried until delivery.timeout.ms"),
    (
        "message.send.max.retries",
        "records are retried until delivery.timeout.ms",
    ),
    (
        "batch.num.messages",
        "batches are bounded by batch.size alone",
    ),
    (
        "queue.buffering.max.messages",
        "the buffer is bounded by buffer.memory alone",
    ),
    ("compression.level", "each codec runs at its default level"),
    // librdkafka's own, with nothing to set in ottla (the table in docs/migrating.md
    // lists every librdkafka property; protocol-tests/tests/librdkafka_properties.rs).
    (
        "builtin.features",
        "librdkafka's build features; ottla's are cargo features",
    ),
    (
        "message.copy.max.bytes",
        "records are reference-counted bytes, never copied into the batch",
    ),
    (
        "metadata.recovery.strategy",
        "ottla goes back to the bootstrap list when no known broker answers",
    ),
    (
        "metadata.recovery.rebootstrap.trigger.ms",
        "ottla goes back to the bootstrap list when no known broker answers",
    ),
    (
        "topic.metadata.refresh.fast.interval.ms",
        "a failed refresh is retried after retry.backoff.ms, doubling to retry.backoff.max.ms",
    ),
    (
        "topic.metadata.refresh.fast.cnt",
        "a failed refresh is retried after retry.backoff.ms, doubling to retry.backoff.max.ms",
    ),
    (
        "socket.blocking.max.ms",
        "librdkafka's I/O thread setting; ottla runs on tokio",
    ),
    (
        "broker.address.ttl",
        "ottla resolves a broker's host name at every connection",
    ),
    (
        "reconnect.backoff.jitter.ms",
        "reconnects back off by reconnect.backoff.ms doubling to reconnect.backoff.max.ms",
    ),
    (
        "enable.random.seed",
        "ottla keeps no process-wide random state",
    ),
    (
        "internal.termination.signal",
        "librdkafka's thread wake-up; ottla runs on tokio",
    ),
    (
        "api.version.request.timeout.ms",
        "ApiVersions is part of the connection, bounded by socket.connection.setup.timeout.ms",
    ),
    (
        "ssl.ca.certificate.stores",
        "Windows certificate stores; give ssl.ca.location or the tls-webpki-roots feature",
    ),
    (
        "ssl.providers",
        "OpenSSL 3 providers; rustls is ottla's TLS",
    ),
    ("sasl.kerberos.principal", "GSSAPI is not supported"),
    ("sasl.kerberos.kinit.cmd", "GSSAPI is not supported"),
    ("sasl.kerberos.keytab", "GSSAPI is not supported"),
    (
        "sasl.kerberos.min.time.before.relogin",
        "GSSAPI is not supported",
    ),
    (
        "plugin.library.paths",
        "librdkafka's C plug-ins; wrap the handler instead",
    ),
    (
        "group.protocol.type",
        "the classic protocol's type is always consumer",
    ),
    (
        "offset.store.method",
        "offsets are always stored in the group, at the broker",
    ),
    (
        "offset.store.path",
        "offsets are always stored in the group, at the broker",
    ),
    (
        "offset.store.sync.interval.ms",
        "offsets are always stored in the group, at the broker",
    ),
    (
        "consume.callback.max.messages",
        "librdkafka's callback consumer; recv_batch takes a count",
    ),
    (
        "queue.buffering.backpressure.threshold",
        "batches are sent by batch.size and linger.ms alone",
    ),
    (
        "delivery.report.only.error",
        "each record's send has its own delivery future",
    ),
    (
        "queuing.strategy",
        "records are sent in the order they were sent in (librdkafka's fifo)",
    ),
    ("produce.offset.report", "each delivery reports its offset"),
];

/// Java and librdkafka properties that ottla refuses, because ignoring them would
/// change what the application relies on.
const UNSUPPORTED: &[(&str, &str)] = &[
    // librdkafka's own settings that would change what the application relies on.
    (
        "topic.blacklist",
        "ottla has no topic blacklist; narrow the topic list or regex instead",
    ),
    (
        "ssl.crl.location",
        "ottla checks no certificate revocation lists; ignoring this would trust revoked certificates",
    ),
    (
        "ssl.engine.location",
        "OpenSSL engines (keys in hardware); rustls takes the key from ssl.key.location or ssl.key.pem",
    ),
    (
        "ssl.engine.id",
        "OpenSSL engines (keys in hardware); rustls takes the key from ssl.key.location or ssl.key.pem",
    ),
    (
        "enable.gapless.guarantee",
        "a record that fails is reported by its own delivery future and later records still go",
    ),
    (
        "interceptors",
        "librdkafka's C interceptors; wrap the handler instead",
    ),
    // The OIDC JWT-bearer grant (librdkafka 2.11, KIP-1139), and Azure's IMDS tokens.
    (
        "sasl.oauthbearer.assertion.algorithm",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.assertion.private.key.file",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.assertion.private.key.pem",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.assertion.file",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.assertion.claim.aud",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.assertion.claim.exp.seconds",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.assertion.claim.iss",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.assertion.claim.jti.include",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.assertion.claim.nbf.seconds",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.assertion.claim.sub",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.assertion.jwt.template.file",
        "no JWT-bearer grant; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "sasl.oauthbearer.metadata.authentication.type",
        "no Azure IMDS tokens; give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    // librdkafka's C API: callbacks and pointers, which a string cannot set; the row
    // says what takes their place.
    (
        "error_cb",
        "a C callback: ottla returns errors from the call that failed and as consumer events",
    ),
    (
        "throttle_cb",
        "a C callback: throttles are the ottla.request.throttle metric",
    ),
    ("stats_cb", "a C callback: read stats() or the metrics"),
    ("log_cb", "a C callback: ottla logs through tracing"),
    (
        "background_event_cb",
        "librdkafka's event API: ottla's events come from recv and the event streams",
    ),
    (
        "enabled_events",
        "librdkafka's event API: ottla's events come from recv and the event streams",
    ),
    (
        "socket_cb",
        "a C callback: ottla opens its sockets with tokio",
    ),
    (
        "connect_cb",
        "a C callback: ottla opens its sockets with tokio",
    ),
    (
        "closesocket_cb",
        "a C callback: ottla opens its sockets with tokio",
    ),
    (
        "open_cb",
        "a C callback: ottla opens its sockets with tokio",
    ),
    (
        "resolve_cb",
        "a C callback: ottla resolves host names with tokio",
    ),
    (
        "opaque",
        "a C pointer: capture what you need in your closures",
    ),
    (
        "default_topic_conf",
        "a C pointer: ottla has no topic configuration objects",
    ),
    ("ssl_key", "a C pointer: give ssl.key.pem or TlsConfig"),
    (
        "ssl_certificate",
        "a C pointer: give ssl.certificate.pem or TlsConfig",
    ),
    ("ssl_ca", "a C pointer: give ssl.ca.pem or TlsConfig"),
    (
        "ssl_engine_callback_data",
        "a C pointer for OpenSSL engines",
    ),
    (
        "ssl.certificate.verify_cb",
        "a C callback: rustls verifies the broker's certificate against the CAs given",
    ),
    (
        "oauthbearer_token_refresh_cb",
        "a C callback: give an OAUTHBEARER TokenProvider (SaslConfig::oauth_bearer)",
    ),
    (
        "consume_cb",
        "a C callback: recv and recv_batch hand out records",
    ),
    (
        "rebalance_cb",
        "a C callback: rebalances are consumer events (ConsumerEvent), and the Processor's revocation hooks",
    ),
    (
        "offset_commit_cb",
        "a C callback: commits return their result, and auto-commits are consumer events",
    ),
    ("dr_cb", "a C callback: each send returns a DeliveryFuture"),
    (
        "dr_msg_cb",
        "a C callback: each send returns a DeliveryFuture",
    ),
    (
        "partitioner_cb",
        "a C callback: give ProducerBuilder::custom_partitioner",
    ),
    (
        "msg_order_cmp",
        "a C callback: records are sent in the order they were sent in",
    ),
];

/// A property that was given but ignored, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredProperty {
    /// The key as given.
    pub key: String,
    /// Why ottla ignores it.
    pub reason: &'static str,
}

/// A property refused by `set`, `from_properties` or `from_env`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PropertyError {
    /// Neither ottla, Java nor librdkafka knows the key.
    #[error("unknown property {key:?}{}", suggestion.map(|s| format!("; did you mean {s}?")).unwrap_or_default())]
    Unknown {
        /// The key as given.
        key: String,
        /// The closest known name, if one is close.
        suggestion: Option<&'static str>,
    },
    /// The value does not parse, or is out of range.
    #[error("{key}: {value:?} is not valid: {expected}")]
    InvalidValue {
        /// The key as given.
        key: String,
        /// The value as given (`"(secret)"` for a password or a key).
        value: String,
        /// What the key accepts.
        expected: String,
    },
    /// The key exists in Java or librdkafka, but ottla does not support what it asks
    /// for.
    #[error("{key} is not supported: {reason}")]
    Unsupported {
        /// The key as given.
        key: String,
        /// Why, and what to do instead.
        reason: &'static str,
    },
    /// An environment variable with the prefix is not valid Unicode.
    #[error("environment variable {variable} is not valid Unicode")]
    NotUnicode {
        /// The variable's name (lossily converted).
        variable: String,
    },
}

/// What a key is to ottla.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Lookup {
    /// A property ottla understands.
    Known(&'static Property),
    /// A Java or librdkafka property ottla ignores, with the reason.
    Ignored(&'static str),
}

/// Looks a key up: understood, ignored, or an error (unsupported, or unknown with a
/// suggestion). Leading and trailing spaces are dropped; the case must match.
pub fn lookup(key: &str) -> Result<Lookup, PropertyError> {
    let key = key.trim();
    if let Some(p) = PROPERTIES
        .iter()
        .find(|p| p.name == key || p.aliases.contains(&key))
    {
        return Ok(Lookup::Known(p));
    }
    if let Some((_, reason)) = IGNORED.iter().find(|(name, _)| *name == key) {
        return Ok(Lookup::Ignored(reason));
    }
    if let Some((_, reason)) = UNSUPPORTED.iter().find(|(name, _)| *name == key) {
        return Err(PropertyError::Unsupported {
            key: key.to_string(),
            reason,
        });
    }
    Err(PropertyError::Unknown {
        key: key.to_string(),
        suggestion: suggest(key),
    })
}

/// The known name closest to `key` by edit distance (ignoring case), if it is close
/// enough to be a misspelling: at most a quarter of the name's length apart, and at
/// most 3 edits.
pub fn suggest(key: &str) -> Option<&'static str> {
    let key = key.trim().to_ascii_lowercase();
    let limit = (key.len() / 4).clamp(1, 3);
    let names = PROPERTIES
        .iter()
        .flat_map(|p| std::iter::once(p.name).chain(p.aliases.iter().copied()))
        .chain(IGNORED.iter().map(|(name, _)| *name))
        .chain(UNSUPPORTED.iter().map(|(name, _)| *name));
    names
        .map(|name| (edit_distance(&key, name), name))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, name)| name)
}

/// The property name an environment variable stands for, if it has the prefix: the
/// rest lower-cased, `_` read as `.` and `__` as a literal `_`
/// (`OTTLA_SESSION_TIMEOUT_MS` with prefix `OTTLA_` is `session.timeout.ms`,
/// `OTTLA_LOG__LEVEL` is `log_level`).
pub fn env_key(prefix: &str, variable: &str) -> Option<String> {
    let rest = variable.strip_prefix(prefix)?;
    if rest.is_empty() {
        return None;
    }
    let parts: Vec<String> = rest
        .to_ascii_lowercase()
        .split("__")
        .map(|part| part.replace('_', "."))
        .collect();
    Some(parts.join("_"))
}

/// The properties given by the variables with the prefix, in the order given, as
/// `(property, value)` pairs for `from_properties`.
pub fn env_properties<I, K, V>(prefix: &str, vars: I) -> Vec<(String, String)>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    vars.into_iter()
        .filter_map(|(k, v)| env_key(prefix, k.as_ref()).map(|key| (key, v.as_ref().to_string())))
        .collect()
}

/// The process's environment variables with the prefix, sorted by name (so that a
/// run does not depend on the environment's order).
pub fn process_env(prefix: &str) -> Result<Vec<(String, String)>, PropertyError> {
    let mut out = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name_str) = name.to_str() else {
            continue;
        };
        if !name_str.starts_with(prefix) {
            continue;
        }
        let Some(value) = value.to_str() else {
            return Err(PropertyError::NotUnicode {
                variable: name_str.to_string(),
            });
        };
        out.push((name_str.to_string(), value.to_string()));
    }
    out.sort();
    Ok(out)
}

/// Where `set` sends a key.
pub(crate) enum Route {
    /// Apply this property (its scope is one the builder handles).
    Apply(&'static Property),
    /// Record it as ignored, with this reason.
    Ignore(&'static str),
}

/// Routes `key` for a builder that handles the properties of `scopes`: a property of
/// another component is ignored here, with a reason naming the builder it belongs to.
pub(crate) fn route(key: &str, scopes: &[Scope]) -> Result<Route, PropertyError> {
    match lookup(key)? {
        Lookup::Ignored(reason) => Ok(Route::Ignore(reason)),
        Lookup::Known(p) if scopes.contains(&p.scope) => {
            if let Some(what) = p.partly {
                debug!(
                    property = key.trim(),
                    understood = what,
                    "configuration property understood in part"
                );
            }
            Ok(Route::Apply(p))
        }
        Lookup::Known(p) => Ok(Route::Ignore(match p.scope {
            Client => "a connection setting: give it to ClientConfig or a builder",
            Consumer => "a consumer setting: give it to a ConsumerBuilder or ProcessorBuilder",
            Producer => "a producer setting: give it to a ProducerBuilder or ProcessorBuilder",
            Processor => "a Processor setting: give it to a ProcessorBuilder",
        })),
    }
}

/// Records an ignored key (once) and logs it.
pub(crate) fn record_ignored(list: &mut Vec<IgnoredProperty>, key: &str, reason: &'static str) {
    let key = key.trim();
    warn!(property = key, reason, "configuration property ignored");
    if list.iter().any(|i| i.key == key) {
        return;
    }
    list.push(IgnoredProperty {
        key: key.to_string(),
        reason,
    });
}

/// An [`PropertyError::InvalidValue`] for `key`, with the value hidden when the key
/// holds a secret.
pub(crate) fn invalid(key: &str, value: &str, expected: impl Into<String>) -> PropertyError {
    let secret = ["password", "jaas", "secret", ".pem", "keystore.key"]
        .iter()
        .any(|s| key.contains(s));
    PropertyError::InvalidValue {
        key: key.trim().to_string(),
        value: if secret {
            "(secret)".into()
        } else {
            value.to_string()
        },
        expected: expected.into(),
    }
}

/// A whole number of milliseconds.
pub(crate) fn millis(key: &str, value: &str) -> Result<Duration, PropertyError> {
    value
        .trim()
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| invalid(key, value, "a whole number of milliseconds"))
}

/// `true` or `false`, in any case.
pub(crate) fn flag(key: &str, value: &str) -> Result<bool, PropertyError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(key, value, "true or false")),
    }
}

/// A whole number of type `T` (`what` names its range in the error).
pub(crate) fn number<T: std::str::FromStr>(
    key: &str,
    value: &str,
    what: &str,
) -> Result<T, PropertyError> {
    value
        .trim()
        .parse::<T>()
        .map_err(|_| invalid(key, value, what))
}

/// A byte count for a Fetch request field: 0 to `i32::MAX`.
pub(crate) fn fetch_bytes(key: &str, value: &str) -> Result<i32, PropertyError> {
    number::<i32>(key, value, "a number of bytes from 0 to 2147483647").and_then(|n| {
        if n < 0 {
            Err(invalid(
                key,
                value,
                "a number of bytes from 0 to 2147483647",
            ))
        } else {
            Ok(n)
        }
    })
}

/// A size in KiB, as bytes.
pub(crate) fn kibibytes(key: &str, value: &str) -> Result<usize, PropertyError> {
    number::<usize>(key, value, "a whole number of kilobytes")?
        .checked_mul(1024)
        .ok_or_else(|| invalid(key, value, "a number of kilobytes that fits in memory"))
}

/// The words of a comma-separated list, trimmed, empty ones dropped.
pub(crate) fn list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// Levenshtein distance in bytes (property names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.bytes().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The error for a property that reached a builder whose `set` has no arm for it: the
/// table and the match disagree. A test walks the table so that this never ships.
pub(crate) fn not_here(key: &str) -> PropertyError {
    PropertyError::Unknown {
        key: key.trim().to_string(),
        suggestion: None,
    }
}

/// The by-name entry points that `ClientConfig` and the three builders share:
/// `from_properties`, `properties`, `from_env` and `from_env_vars`, each built on the
/// type's own `set`. `$blank` is the value `from_properties` starts from; `$needs` says
/// which properties must be among the pairs; `$env` is an example variable and the
/// property it maps to.
macro_rules! by_name_entry_points {
    ($ty:ident, $blank:expr, $needs:literal, $env:literal) => {
        impl $ty {
            #[doc = concat!("A value from `(property, value)` pairs, applied in order with [`",
                                stringify!($ty), "::set`] (a later pair wins). ", $needs)]
            pub fn from_properties<I, K, V>(properties: I) -> crate::Result<Self>
            where
                I: IntoIterator<Item = (K, V)>,
                K: AsRef<str>,
                V: AsRef<str>,
            {
                $blank.properties(properties)
            }

            #[doc = concat!("Applies `(property, value)` pairs in order with [`",
                                stringify!($ty), "::set`].")]
            pub fn properties<I, K, V>(mut self, properties: I) -> crate::Result<Self>
            where
                I: IntoIterator<Item = (K, V)>,
                K: AsRef<str>,
                V: AsRef<str>,
            {
                for (k, v) in properties {
                    self = self.set(k.as_ref(), v.as_ref())?;
                }
                Ok(self)
            }

            #[doc = concat!("A value from the environment variables that start with `prefix`, \
                mapped to property names by [`crate::properties::env_key`]: ", $env,
                                ". `__` stands for a literal `_`.")]
            pub fn from_env(prefix: &str) -> crate::Result<Self> {
                Self::from_env_vars(prefix, crate::properties::process_env(prefix)?)
            }

            #[doc = concat!("[`", stringify!($ty),
                                "::from_env`] over the given variables instead of the process's.")]
            pub fn from_env_vars<I, K, V>(prefix: &str, vars: I) -> crate::Result<Self>
            where
                I: IntoIterator<Item = (K, V)>,
                K: AsRef<str>,
                V: AsRef<str>,
            {
                Self::from_properties(crate::properties::env_properties(prefix, vars))
            }
        }
    };
}
pub(crate) use by_name_entry_points;

#[cfg(test)]
mod tests;
