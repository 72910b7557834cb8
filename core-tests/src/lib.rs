//! The harness of ottla's suites that need no broker: the simulated group coordinator
//! ([`sim`]) and the one seeded generator ([`rng`]) that it, the chaos runner and the
//! Processor's crash test draw from. The suites beside it (`tests/`) are the request
//! and response round trips, the record-batch reader against `kafka-protocol`'s encoder,
//! and the simulation; they build without librdkafka or any peer.
//!
//! `protocol-tests` (the suites against real peers) re-exports [`rng`] and
//! [`env_number`], so a seed or a knob means the same thing in every suite.

pub mod rng;
pub mod sim;

/// The number in the environment variable `name` (a test's length or size knob, e.g.
/// `OTTLA_SIM_SCHEDULES`), or `default` when it is unset or not a number.
pub fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}
