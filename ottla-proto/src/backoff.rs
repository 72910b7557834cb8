//! Exponential backoff with jitter, deterministic from a seed.

use std::time::Duration;

/// `retry.backoff.ms`'s default (the Java client's): set in `ClientConfig`, copied into
/// each machine's configuration.
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// `retry.backoff.max.ms`'s default (the Java client's).
pub const DEFAULT_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A seeded jittered exponential backoff: `initial * 2^(failures-1)`, capped at `max`,
/// times a factor in `[0.8, 1.2)` (the Java client's ±20%), and never above `max`.
///
/// The jitter comes from an xorshift64* generator seeded by the caller, so a run with
/// the same seed and the same failures replays the same delays.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    rng: u64,
}

impl Backoff {
    /// A backoff from `initial` up to `max`, jittered from `seed`.
    pub fn new(initial: Duration, max: Duration, seed: u64) -> Self {
        Self {
            initial,
            max,
            // xorshift must not start at zero.
            rng: seed | 1,
        }
    }

    /// The delay after `failures` consecutive failures (1 for the first).
    pub fn delay(&mut self, failures: u32) -> Duration {
        let base = self.initial.as_secs_f64();
        let max = self.max.as_secs_f64();
        let exp = failures.saturating_sub(1).min(30) as i32;
        let raw = (base * 2f64.powi(exp)).min(max);
        let unit = self.unit();
        Duration::from_secs_f64((raw * (0.8 + 0.4 * unit)).min(max))
    }

    /// The next draw of the generator, uniform in `[0, 1)`: jitter for other timers of
    /// the same owner (the re-authentication point of a SASL session).
    pub fn unit(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_within_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 7);
        for (failures, nominal) in [(1u32, 100u64), (2, 200), (3, 400), (4, 800)] {
            let d = b.delay(failures).as_millis() as u64;
            assert!(
                d >= nominal * 8 / 10 && d < nominal * 12 / 10 + 1,
                "{failures}: {d} ms"
            );
        }
        for failures in [5, 10, 100, u32::MAX] {
            assert!(b.delay(failures) <= Duration::from_secs(1));
        }
    }

    #[test]
    fn the_same_seed_replays() {
        let mut a = Backoff::new(Duration::from_millis(50), Duration::from_secs(1), 42);
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_secs(1), 42);
        for f in 1..10 {
            assert_eq!(a.delay(f), b.delay(f));
        }
    }
}
