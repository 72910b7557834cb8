//! The seeded generator of the chaos harness (splitmix64): the fault plans, the
//! handler failures and the member stalls draw from it. The same generator as
//! ottla-core-tests' `rng` (the simulated coordinator's schedules, the Processor's
//! crash test), which the published kit cannot depend on; `chaos/tests/chaos.rs` holds the
//! two to the same values, so a seed names the same run everywhere it is quoted.

/// splitmix64 of `seed` and a stream number: independent streams from one seed.
pub fn mix(seed: u64, stream: u64) -> u64 {
    let mut z = seed
        .wrapping_add(stream.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A value in `[0, 1)` from a hash.
pub fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// A small seeded generator (splitmix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0, 0)
    }

    /// In `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// In `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + unit(self.next_u64()) * (hi - lo)
    }

    /// An exponential wait for events at `rate` per second.
    pub fn exponential(&mut self, rate: f64) -> f64 {
        -(1.0 - unit(self.next_u64())).ln() / rate
    }

    /// One element, or `None` from an empty slice.
    pub fn pick<'a, T>(&mut self, from: &'a [T]) -> Option<&'a T> {
        if from.is_empty() {
            return None;
        }
        from.get(self.below(from.len() as u64) as usize)
    }
}

impl Rng {
    /// True with probability `p` percent.
    pub fn chance(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}
