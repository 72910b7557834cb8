//! Client configuration shared by every component: bootstrap servers, identity, and
//! the connection settings, with the Java client's names and defaults.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::proto::wire::DEFAULT_MAX_FRAME_SIZE;

/// Connection-level configuration.
///
/// | setting | Java name | default |
/// |---|---|---|
/// | `bootstrap_servers` | `bootstrap.servers` | (required) |
/// | `client_id` | `client.id` | `ottla` |
/// | `request_timeout` | `request.timeout.ms` | 30 s |
/// | `connect_timeout` | `socket.connection.setup.timeout.ms` | 10 s |
/// | `reconnect_backoff` | `reconnect.backoff.ms` | 50 ms |
/// | `reconnect_backoff_max` | `reconnect.backoff.max.ms` | 1 s |
/// | `max_in_flight` | `max.in.flight.requests.per.connection` | 5 |
/// | `max_frame_size` | (none; the broker's `socket.request.max.bytes`) | 100 MiB |
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// `host:port` addresses used to discover the cluster.
    pub bootstrap_servers: Vec<String>,
    /// Sent in every request header.
    pub client_id: String,
    /// How long a request may wait for its response before the connection is dropped.
    pub request_timeout: Duration,
    /// How long TCP connect plus ApiVersions negotiation may take.
    pub connect_timeout: Duration,
    /// The first delay before reconnecting to a broker after a failure.
    pub reconnect_backoff: Duration,
    /// The cap of the exponential reconnect backoff.
    pub reconnect_backoff_max: Duration,
    /// Requests pipelined on one connection before further ones wait.
    pub max_in_flight: usize,
    /// The largest response frame accepted; larger ones poison the connection.
    pub max_frame_size: usize,
    /// Seed for reconnect jitter, so runs can be replayed.
    pub jitter_seed: u64,
}

impl ClientConfig {
    /// A configuration with defaults for the given bootstrap servers
    /// (comma-separated `host:port` list).
    pub fn new(bootstrap_servers: &str) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            client_id: "ottla".into(),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            reconnect_backoff: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(1),
            max_in_flight: 5,
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            jitter_seed: 0x006f_7474_6c61,
        }
    }

    /// Sets `client.id`.
    pub fn with_client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }

    /// Sets `request.timeout.ms`.
    pub fn with_request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// Sets `socket.connection.setup.timeout.ms`.
    pub fn with_connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Sets `reconnect.backoff.ms` and `reconnect.backoff.max.ms`.
    pub fn with_reconnect_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.reconnect_backoff = initial;
        self.reconnect_backoff_max = max;
        self
    }

    /// Sets `max.in.flight.requests.per.connection`.
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Sets the largest response frame accepted.
    pub fn with_max_frame_size(mut self, bytes: usize) -> Self {
        self.max_frame_size = bytes;
        self
    }

    /// Checks every setting; the error names the one at fault.
    pub fn validate(&self) -> Result<()> {
        let bad = |setting, message: &str| {
            Err(Error::Config {
                setting,
                message: message.to_string(),
            })
        };
        if self.bootstrap_servers.is_empty() {
            return bad("bootstrap.servers", "give at least one host:port");
        }
        for s in &self.bootstrap_servers {
            let port_ok = s
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !port_ok {
                return Err(Error::Config {
                    setting: "bootstrap.servers",
                    message: format!("{s:?} is not host:port"),
                });
            }
        }
        if self.max_in_flight == 0 {
            return bad(
                "max.in.flight.requests.per.connection",
                "must be at least 1",
            );
        }
        if self.request_timeout.is_zero() {
            return bad("request.timeout.ms", "must be positive");
        }
        if self.connect_timeout.is_zero() {
            return bad("socket.connection.setup.timeout.ms", "must be positive");
        }
        if self.reconnect_backoff_max < self.reconnect_backoff {
            return bad(
                "reconnect.backoff.max.ms",
                "must be at least reconnect.backoff.ms",
            );
        }
        if self.max_frame_size < 1024 {
            return bad("max_frame_size", "must be at least 1024 bytes");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_setting() {
        let err = ClientConfig::new("").validate().unwrap_err();
        assert!(err.to_string().contains("bootstrap.servers"), "{err}");
        let err = ClientConfig::new("localhost").validate().unwrap_err();
        assert!(err.to_string().contains("not host:port"), "{err}");
        let err = ClientConfig::new("h:1")
            .with_max_in_flight(0)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("max.in.flight"), "{err}");
        ClientConfig::new("a:1, b:2").validate().unwrap();
    }
}
