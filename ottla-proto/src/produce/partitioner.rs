//! Choosing a partition: an explicit partition wins; a keyed record goes where the Java
//! client would put it (murmur2 of the key); an unkeyed record goes to the topic's
//! current sticky partition, which moves on after `batch.size` bytes (KIP-794).

use std::collections::HashMap;

/// Kafka's murmur2, exactly as `org.apache.kafka.common.utils.Utils.murmur2` computes
/// it (signed result).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        if let Some(&b) = rest.get(2) {
            h ^= u32::from(b) << 16;
        }
        if let Some(&b) = rest.get(1) {
            h ^= u32::from(b) << 8;
        }
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `key` among `partitions`, as the Java client's default
/// partitioner computes it: `(murmur2(key) & 0x7fffffff) % partitions`.
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    if partitions <= 0 {
        return 0;
    }
    (murmur2(key) & 0x7fff_ffff) % partitions
}

/// The sticky partitioner for unkeyed records.
#[derive(Debug, Clone)]
pub struct StickyPartitioner {
    batch_size: usize,
    rng: u64,
    /// topic -> (partition, bytes sent to it since it was chosen).
    current: HashMap<String, (i32, usize)>,
}

impl StickyPartitioner {
    /// Moves on after `batch_size` bytes; `seed` makes the choices replayable.
    pub fn new(batch_size: usize, seed: u64) -> Self {
        Self {
            batch_size: batch_size.max(1),
            rng: seed | 1,
            current: HashMap::new(),
        }
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// The partition for an unkeyed record of `size` bytes to `topic`.
    pub fn partition(&mut self, topic: &str, partitions: i32, size: usize) -> i32 {
        if partitions <= 1 {
            return 0;
        }
        let pick = |me: &mut Self, avoid: Option<i32>| loop {
            let p = (me.next_random() % partitions as u64) as i32;
            if Some(p) != avoid {
                return p;
            }
        };
        let (partition, sent) = match self.current.get(topic).copied() {
            Some((p, sent)) if p < partitions && sent < self.batch_size => (p, sent),
            Some((p, _)) => (pick(self, Some(p)), 0),
            None => (pick(self, None), 0),
        };
        self.current
            .insert(topic.to_string(), (partition, sent + size));
        partition
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's `UtilsTest.testMurmur2`.
    #[test]
    fn murmur2_matches_the_java_client() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, hash) in cases {
            assert_eq!(murmur2(key), hash, "{}", String::from_utf8_lossy(key));
        }
        // toPositive(-790332482) = 1357151166; 1357151166 % 10 = 6.
        assert_eq!(partition_for_key(b"foobar", 10), 6);
    }

    #[test]
    fn sticky_moves_on_after_a_batch_and_spreads_over_partitions() {
        let mut s = StickyPartitioner::new(1000, 7);
        let first = s.partition("t", 6, 100);
        for _ in 0..9 {
            assert_eq!(s.partition("t", 6, 100), first, "sticks within a batch");
        }
        let next = s.partition("t", 6, 100);
        assert_ne!(next, first, "moves on after batch.size bytes");
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..1000 {
            seen.insert(s.partition("t", 6, 500));
        }
        assert_eq!(seen.len(), 6, "every partition gets batches");
        assert_eq!(s.partition("one", 1, 10), 0);
    }
}
