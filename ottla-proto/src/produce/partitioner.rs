//! Choosing a partition: an explicit partition wins; then a custom [`Partitioner`] if
//! one is set; then the [`BuiltInPartitioner`], by librdkafka's names. The default,
//! `murmur2_random`, is the Java client's: a keyed record goes where murmur2 of its key
//! puts it, an unkeyed record to the topic's current sticky partition, which moves on
//! after `batch.size` bytes (KIP-794). The others place keys exactly as librdkafka's
//! partitioners of the same names do, so that a producer moved from librdkafka keeps
//! every key on its partition.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

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

/// CRC-32 (IEEE 802.3, the zlib one), as librdkafka's `rd_crc32` computes it for the
/// `consistent` partitioners.
pub fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut bit = 0;
            while bit < 8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                bit += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc ^ 0xffff_ffff
}

/// FNV-1a (32 bits), as librdkafka's `rd_fnv1a` computes it for the `fnv1a`
/// partitioners: the hash taken as a signed number and made positive (Sarama's
/// `NewHashPartitioner`), where `i32::MIN` stays `2^31`.
pub fn fnv1a(data: &[u8]) -> u32 {
    const PRIME: u32 = 0x0100_0193;
    const OFFSET: u32 = 0x811c_9dc5;
    let mut h = OFFSET;
    for &b in data {
        h ^= u32::from(b);
        h = h.wrapping_mul(PRIME);
    }
    (h as i32).wrapping_abs() as u32
}

/// Where a [`BuiltInPartitioner`] puts a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On this partition.
    Partition(i32),
    /// On the topic's current sticky partition (the records librdkafka leaves to
    /// `sticky.partitioning.linger.ms`, and Java to its built-in sticky partitioner).
    Sticky,
    /// On a partition chosen at random for this record alone.
    Random,
}

/// The built-in partitioners, by librdkafka's names (the `partitioner` setting).
/// Each places a key exactly as librdkafka's partitioner of the same name does; a
/// record without a key goes to the sticky partition, as in librdkafka (whose
/// `sticky.partitioning.linger.ms` is on by default) and Java, except under the three
/// names without `random`, which hash the missing key as an empty one.
///
/// | name | no key | empty key | other key |
/// |---|---|---|---|
/// | `random` | sticky | random | random |
/// | `consistent` | CRC-32 of nothing: partition 0 | partition 0 | CRC-32 |
/// | `consistent_random` | sticky | sticky | CRC-32 |
/// | `murmur2` | murmur2 of nothing | murmur2 of nothing | murmur2 |
/// | `murmur2_random` (default; Java's) | sticky | murmur2 of nothing | murmur2 |
/// | `fnv1a` | FNV-1a of nothing | FNV-1a of nothing | FNV-1a |
/// | `fnv1a_random` | sticky | FNV-1a of nothing | FNV-1a |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum BuiltInPartitioner {
    /// `random`: every keyed record to a random partition.
    Random,
    /// `consistent`: CRC-32 of the key.
    Consistent,
    /// `consistent_random`: CRC-32 of a non-empty key; librdkafka's default.
    ConsistentRandom,
    /// `murmur2`: murmur2 of the key, a missing one hashed as empty.
    Murmur2,
    /// `murmur2_random`: murmur2 of the key; the Java client's default and ottla's.
    #[default]
    Murmur2Random,
    /// `fnv1a`: FNV-1a of the key, a missing one hashed as empty (Sarama's hash
    /// partitioner).
    Fnv1a,
    /// `fnv1a_random`: FNV-1a of the key.
    Fnv1aRandom,
}

impl BuiltInPartitioner {
    /// Every built-in partitioner.
    pub const ALL: [BuiltInPartitioner; 7] = [
        Self::Random,
        Self::Consistent,
        Self::ConsistentRandom,
        Self::Murmur2,
        Self::Murmur2Random,
        Self::Fnv1a,
        Self::Fnv1aRandom,
    ];

    /// Its librdkafka name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::Consistent => "consistent",
            Self::ConsistentRandom => "consistent_random",
            Self::Murmur2 => "murmur2",
            Self::Murmur2Random => "murmur2_random",
            Self::Fnv1a => "fnv1a",
            Self::Fnv1aRandom => "fnv1a_random",
        }
    }

    /// Where a record with `key` goes among `partitions` (at least 1).
    pub fn place(self, key: Option<&[u8]>, partitions: i32) -> Placement {
        if partitions <= 1 {
            return Placement::Partition(0);
        }
        let n = partitions as u32;
        let crc = |k: &[u8]| Placement::Partition((crc32(k) % n) as i32);
        let murmur = |k: &[u8]| Placement::Partition(partition_for_key(k, partitions));
        let fnv = |k: &[u8]| Placement::Partition((fnv1a(k) % n) as i32);
        match (self, key) {
            (Self::Random, None) => Placement::Sticky,
            (Self::Random, Some(_)) => Placement::Random,
            (Self::Consistent, k) => crc(k.unwrap_or_default()),
            (Self::ConsistentRandom, Some(k)) if !k.is_empty() => crc(k),
            (Self::ConsistentRandom, _) => Placement::Sticky,
            (Self::Murmur2, k) => murmur(k.unwrap_or_default()),
            (Self::Murmur2Random, None) | (Self::Fnv1aRandom, None) => Placement::Sticky,
            (Self::Murmur2Random, Some(k)) => murmur(k),
            (Self::Fnv1a, k) => fnv(k.unwrap_or_default()),
            (Self::Fnv1aRandom, Some(k)) => fnv(k),
        }
    }
}

impl fmt::Display for BuiltInPartitioner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `partitioner` value that names no built-in partitioner.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown partitioner {0:?}: expected random, consistent, consistent_random, murmur2, murmur2_random, fnv1a or fnv1a_random"
)]
pub struct UnknownPartitioner(pub String);

impl FromStr for BuiltInPartitioner {
    type Err = UnknownPartitioner;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownPartitioner(s.to_string()))
    }
}

/// A partitioner of your own (Java's `partitioner.class`, librdkafka's
/// `partitioner_cb`), consulted for every record sent without an explicit partition.
///
/// Return the partition, or `None` to leave the record to the built-in partitioner
/// (as a Java partitioner returning -1 does). A partition outside `0..partitions`
/// fails that record's send with `NoSuchPartition`.
pub trait Partitioner: Send + Sync + fmt::Debug {
    /// The partition of a record of `topic` with `key`, among `partitions` (at least
    /// 1; the count in the producer's latest metadata).
    fn partition(&self, topic: &str, key: Option<&[u8]>, partitions: i32) -> Option<i32>;
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

    /// A partition of `partitions` chosen at random for one record.
    pub fn random(&mut self, partitions: i32) -> i32 {
        if partitions <= 1 {
            return 0;
        }
        (self.next_random() % partitions as u64) as i32
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

    /// librdkafka's `unittest_fnv1a` and `unittest_murmur2` vectors (Go's `hash/fnv`
    /// and the Java client's results), unaligned tails included.
    #[test]
    fn fnv1a_and_murmur2_match_librdkafkas_vectors() {
        let unaligned = "PreAmbleWillBeRemoved,ThePrePartThatIs";
        let keys = [
            "kafka",
            "giberish123456789",
            "1234",
            "234",
            "34",
            "4",
            unaligned,
            &unaligned[1..],
            &unaligned[2..],
            &unaligned[3..],
            "",
        ];
        let fnv: [u32; 11] = [
            0x0d33_c4e1,
            0x77a5_8295,
            0x023b_dd03,
            0x2dea_3cd2,
            0x740f_a83e,
            0x310c_a263,
            0x65cb_d69c,
            0x6e49_c79a,
            0x69ee_d356,
            0x6abc_c023,
            0x7ee3_623b,
        ];
        let murmur: [u32; 11] = [
            0xd067_cf64,
            0x8f55_2b0c,
            0x9fc9_7b14,
            0xe7c0_09ca,
            0x8739_30da,
            0x5a4b_5ca1,
            0x7842_4f1c,
            0x4a62_b377,
            0xe0e4_e09e,
            0x62b8_b43f,
            0x106e_08d9,
        ];
        for ((key, f), m) in keys.iter().zip(fnv).zip(murmur) {
            assert_eq!(fnv1a(key.as_bytes()), f, "fnv1a {key:?}");
            assert_eq!(murmur2(key.as_bytes()) as u32, m, "murmur2 {key:?}");
        }
        // The one hash whose sign cannot be dropped stays 2^31, as in librdkafka.
        assert_eq!((i32::MIN).wrapping_abs() as u32, 1 << 31);
    }

    /// The check value of CRC-32/ISO-HDLC (zlib's), and nothing hashing to 0.
    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"a"), 0xe8b7_be43);
    }

    #[test]
    fn each_name_places_missing_empty_and_other_keys_as_librdkafka() {
        use BuiltInPartitioner as B;
        use Placement::{Partition, Random, Sticky};
        let n = 7;
        let crc = |k: &[u8]| Partition((crc32(k) % 7) as i32);
        let mm = |k: &[u8]| Partition(partition_for_key(k, 7));
        let fnv = |k: &[u8]| Partition((fnv1a(k) % 7) as i32);
        let k: &[u8] = b"order-42";
        let e: &[u8] = b"";
        let rows = [
            (B::Random, Sticky, Random, Random),
            (B::Consistent, Partition(0), Partition(0), crc(k)),
            (B::ConsistentRandom, Sticky, Sticky, crc(k)),
            (B::Murmur2, mm(e), mm(e), mm(k)),
            (B::Murmur2Random, Sticky, mm(e), mm(k)),
            (B::Fnv1a, fnv(e), fnv(e), fnv(k)),
            (B::Fnv1aRandom, Sticky, fnv(e), fnv(k)),
        ];
        for (p, none, empty, key) in rows {
            assert_eq!(p.place(None, n), none, "{p} without a key");
            assert_eq!(p.place(Some(e), n), empty, "{p} with an empty key");
            assert_eq!(p.place(Some(k), n), key, "{p} with a key");
            assert_eq!(p.place(Some(k), 1), Partition(0), "{p} on one partition");
            assert_eq!(p.name().parse::<B>(), Ok(p));
            assert_eq!(p.name().to_uppercase().parse::<B>(), Ok(p));
        }
        assert_eq!(B::default(), B::Murmur2Random);
        let err = "murmur3".parse::<B>().unwrap_err();
        assert!(err.to_string().contains("murmur2_random"), "{err}");
    }

    #[test]
    fn random_spreads_over_every_partition() {
        let mut s = StickyPartitioner::new(1000, 7);
        let seen: std::collections::BTreeSet<i32> = (0..200).map(|_| s.random(5)).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        assert_eq!(s.random(1), 0);
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
