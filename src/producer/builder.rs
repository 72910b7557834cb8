//! [`ProducerBuilder`]: the producer's settings, by method or by Java and librdkafka
//! property names, and `build`.

use super::*;

/// Builds a [`Producer`].
#[derive(Debug, Clone)]
pub struct ProducerBuilder {
    client: ClientConfig,
    config: ProducerConfig,
    max_block: Duration,
    /// `transaction.timeout.ms`.
    transaction_timeout: Duration,
}

crate::properties::by_name_entry_points!(
    ProducerBuilder,
    ProducerBuilder::new(""),
    "`bootstrap.servers` must be among them.",
    "`OTTLA_LINGER_MS` with prefix `OTTLA_` is `linger.ms`"
);

impl ProducerBuilder {
    /// A builder for the given bootstrap servers.
    pub fn new(bootstrap_servers: &str) -> Self {
        Self {
            client: ClientConfig::new(bootstrap_servers),
            config: ProducerConfig::default(),
            max_block: Duration::from_secs(60),
            transaction_timeout: Duration::from_secs(60),
        }
    }

    /// The client configuration so far.
    #[cfg(test)]
    pub(crate) fn client(&self) -> &ClientConfig {
        &self.client
    }

    /// Replaces the connection settings.
    pub fn client_config(mut self, config: ClientConfig) -> Self {
        self.client = config;
        self
    }

    /// `security.protocol`: TLS, SASL or both on every connection.
    pub fn security_protocol(mut self, protocol: crate::security::SecurityProtocol) -> Self {
        self.client.security_protocol = protocol;
        self
    }

    /// The TLS settings (with `SSL` and `SASL_SSL`).
    pub fn tls(mut self, tls: crate::security::TlsConfig) -> Self {
        self.client.tls = tls;
        self
    }

    /// The SASL settings (with `SASL_PLAINTEXT` and `SASL_SSL`).
    pub fn sasl(mut self, sasl: crate::security::SaslConfig) -> Self {
        self.client.sasl = Some(sasl);
        self
    }

    /// A setting by its Java or librdkafka property name ([`crate::properties`] lists
    /// them): the producer's own (`acks`, `linger.ms`, `compression.type`, ...) and the
    /// connection settings of [`ClientConfig::set`]. A consumer or Processor setting,
    /// or a Java or librdkafka property that means nothing to ottla, is logged and
    /// recorded in [`ProducerBuilder::ignored_properties`]. An unknown key or a bad
    /// value is an error naming it.
    pub fn set(mut self, key: &str, value: &str) -> crate::Result<Self> {
        use crate::properties::{Route, Scope};
        match crate::properties::route(key, &[Scope::Client, Scope::Producer])? {
            Route::Apply(p) if p.scope == Scope::Client => self.client.apply(p, key, value)?,
            Route::Apply(p) => self.apply(p.name, key, value)?,
            Route::Ignore(reason) => self.client.ignore(key, reason),
        }
        Ok(self)
    }

    /// The properties given to `set` that were ignored, with the reason, in the order
    /// first given.
    pub fn ignored_properties(&self) -> &[crate::properties::IgnoredProperty] {
        self.client.ignored_properties()
    }

    /// Applies a producer property; `key` is the name as given (for errors).
    fn apply(
        &mut self,
        name: &'static str,
        key: &str,
        value: &str,
    ) -> std::result::Result<(), crate::properties::PropertyError> {
        use crate::properties::{flag, invalid, kibibytes, millis, number};
        let key = key.trim();
        let value = value.trim();
        match name {
            "acks" => {
                self.config.acks = match value.to_ascii_lowercase().as_str() {
                    "all" | "-1" => Acks::All,
                    "1" => Acks::Leader,
                    "0" => Acks::None,
                    _ => return Err(invalid(key, value, "all (-1), 1 or 0")),
                };
            }
            "linger.ms" => self.config.linger = millis(key, value)?,
            "batch.size" => self.config.batch_size = number(key, value, "a number of bytes")?,
            "compression.type" => {
                self.config.compression = match value.to_ascii_lowercase().as_str() {
                    "none" => Compression::None,
                    "gzip" => Compression::Gzip,
                    "snappy" => Compression::Snappy,
                    "lz4" => Compression::Lz4,
                    "zstd" => Compression::Zstd,
                    _ => return Err(invalid(key, value, "none, gzip, snappy, lz4 or zstd")),
                };
            }
            "enable.idempotence" => self.config.idempotence = flag(key, value)?,
            "buffer.memory" => {
                self.config.buffer_memory = number(key, value, "a number of bytes")?;
            }
            "queue.buffering.max.kbytes" => self.config.buffer_memory = kibibytes(key, value)?,
            "delivery.timeout.ms" => self.config.delivery_timeout = millis(key, value)?,
            "max.block.ms" => self.max_block = millis(key, value)?,
            "partitioner" => {
                self.config.partitioner = value.parse().map_err(|_| {
                    invalid(
                        key,
                        value,
                        "random, consistent, consistent_random, murmur2, murmur2_random, fnv1a or fnv1a_random",
                    )
                })?;
            }
            "partitioner.ignore.keys" => self.config.ignore_keys = flag(key, value)?,
            "max.request.size" => {
                self.config.max_request_size = number(key, value, "a number of bytes")?;
            }
            "transactional.id" => {
                self.config.transactional_id = Some(value.to_string()).filter(|v| !v.is_empty());
            }
            "transaction.timeout.ms" => self.transaction_timeout = millis(key, value)?,
            _ => return Err(crate::properties::not_here(key)),
        }
        Ok(())
    }

    /// `client.id`.
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client.client_id = id.into();
        self
    }

    /// `acks` (default all).
    pub fn acks(mut self, acks: Acks) -> Self {
        self.config.acks = acks;
        self
    }

    /// `linger.ms` (default 5 ms).
    pub fn linger(mut self, t: Duration) -> Self {
        self.config.linger = t;
        self
    }

    /// `batch.size` (default 16 KiB).
    pub fn batch_size(mut self, bytes: usize) -> Self {
        self.config.batch_size = bytes;
        self
    }

    /// `compression.type` (default none).
    pub fn compression(mut self, c: Compression) -> Self {
        self.config.compression = c;
        self
    }

    /// `enable.idempotence` (default on; only with `acks = all`).
    pub fn idempotence(mut self, on: bool) -> Self {
        self.config.idempotence = on;
        self
    }

    /// `buffer.memory` (default 32 MiB).
    pub fn buffer_memory(mut self, bytes: usize) -> Self {
        self.config.buffer_memory = bytes;
        self
    }

    /// `delivery.timeout.ms` (default 120 s).
    pub fn delivery_timeout(mut self, t: Duration) -> Self {
        self.config.delivery_timeout = t;
        self
    }

    /// `retry.backoff.ms` (default 100 ms): [`ClientConfig::retry_backoff`], which
    /// [`ProducerBuilder::client_config`] and `set("retry.backoff.ms", ..)` set too.
    pub fn retry_backoff(mut self, t: Duration) -> Self {
        self.client.retry_backoff = t;
        self
    }

    /// `partitioner` (default `murmur2_random`, the Java client's): where a record
    /// sent without a partition goes, by librdkafka's names. A producer that replaces
    /// a librdkafka one keeps every key on its partition with librdkafka's setting:
    /// `consistent_random` if it was left at librdkafka's default.
    pub fn partitioner(mut self, partitioner: BuiltInPartitioner) -> Self {
        self.config.partitioner = partitioner;
        self
    }

    /// `partitioner.ignore.keys` (default off): records sent without a partition go
    /// to the sticky partition whatever their key.
    pub fn partitioner_ignore_keys(mut self, on: bool) -> Self {
        self.config.ignore_keys = on;
        self
    }

    /// A partitioner of your own, asked first for every record sent without a
    /// partition; where it answers `None`, [`ProducerBuilder::partitioner`] decides.
    pub fn custom_partitioner(mut self, partitioner: impl Partitioner + 'static) -> Self {
        self.config.custom_partitioner = Some(Arc::new(partitioner));
        self
    }

    /// `max.block.ms`: how long `send` waits for metadata or buffer room (60 s).
    pub fn max_block(mut self, t: Duration) -> Self {
        self.max_block = t;
        self
    }

    /// `transactional.id`: makes the producer transactional (and so idempotent, with
    /// `acks = all`). Call [`Producer::init_transactions`] once, then send records
    /// between [`Producer::begin_transaction`] and [`Producer::commit_transaction`]
    /// or [`Producer::abort_transaction`]. A second producer with the same id fences
    /// this one.
    pub fn transactional_id(mut self, id: impl Into<String>) -> Self {
        self.config.transactional_id = Some(id.into());
        self
    }

    /// Whether `transactional.id` is set (the Processor's exactly-once mode needs it).
    pub(crate) fn has_transactional_id(&self) -> bool {
        self.config.transactional_id.is_some()
    }

    /// `transaction.timeout.ms` (default 60 s): the coordinator aborts a transaction
    /// left open longer, and fences its producer's epoch.
    pub fn transaction_timeout(mut self, t: Duration) -> Self {
        self.transaction_timeout = t;
        self
    }

    /// Connects and starts the background task.
    pub async fn build(self) -> Result<Producer> {
        if self.config.transactional_id.is_some()
            && (self.config.acks != Acks::All || !self.config.idempotence)
        {
            // Java's ConfigException: a transaction needs the idempotent producer.
            return Err(Error::Config {
                setting: "transactional.id",
                message: "a transactional producer needs acks = all and enable.idempotence = true"
                    .into(),
            });
        }
        if self.config.batch_size == 0 || self.config.buffer_memory < self.config.batch_size {
            return Err(Error::Config {
                setting: "buffer.memory",
                message: "must be at least batch.size, which must be positive".into(),
            });
        }
        let mut config = self.config;
        config.request_timeout = self.client.request_timeout;
        config.retry_backoff = self.client.retry_backoff;
        config.retry_backoff_max = self.client.retry_backoff_max;
        let mut required = vec![ApiKey::Produce, ApiKey::Metadata];
        let txn = config.transactional_id.clone().map(|id| {
            required.extend([
                ApiKey::FindCoordinator,
                ApiKey::InitProducerId,
                ApiKey::AddPartitionsToTxn,
                ApiKey::EndTxn,
            ]);
            let mut c = crate::proto::produce::transaction::TransactionConfig::new(id);
            c.transaction_timeout = self.transaction_timeout;
            c.retry_backoff = config.retry_backoff;
            c.retry_backoff_max = config.retry_backoff_max;
            crate::proto::produce::transaction::TransactionManager::new(c)
        });
        let cluster =
            Cluster::connect(&self.client, TopicScope::Topics(BTreeSet::new()), &required).await?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                acc: Accumulator::new(config),
                waiters: HashMap::new(),
                closed: false,
                unanswered: BTreeSet::new(),
                counts: ProduceCounts::default(),
                retries_told: 0,
                txn,
                txn_io: Default::default(),
            }),
            wake_driver: Notify::new(),
            room: Notify::new(),
        });
        let task = tokio::spawn(drive(cluster.clone(), shared.clone()));
        Ok(Producer {
            shared,
            cluster,
            max_block: self.max_block,
            task: Mutex::new(Some(task)),
        })
    }
}

#[cfg(test)]
mod tests;
