//! The records finished past a partition's committed offset, written into the commit's
//! metadata so that the partition's next owner skips them (issue 35; Parallel
//! Consumer keeps the same in its commits' metadata, as a run-length or bitset string).
//!
//! Under key or unordered processing, records after an unfinished one finish too, and
//! the commit cannot pass the unfinished one. Without this, a rebalance or a crash
//! makes the next owner handle all of them again.
//!
//! The format: `ottla.f1:` and then, from the committed offset, the lengths of
//! alternating runs: records not finished (or not known to be), then finished, then
//! not, and so on, each in base 36, separated by `,`. `ottla.f1:0,5,2,3` after a commit
//! of 100 says 100 to 104 and 107 to 109 finished. What does not fit in the budget is
//! left out: those records are handled again, as they would be without it.

use std::ops::Range;

const PREFIX: &str = "ottla.f1:";

/// Kafka's default `offset.metadata.max.bytes` is 4,096: a commit whose metadata is
/// longer is refused whole.
pub const MAX_LEN: usize = 4000;

/// The metadata for a commit of `committed`, saying `finished` (absolute, sorted,
/// disjoint ranges past `committed`) finished; `None` when nothing past it did.
pub fn encode(committed: i64, finished: &[Range<i64>], max_len: usize) -> Option<String> {
    let mut out = String::from(PREFIX);
    let mut at = committed;
    let mut wrote = false;
    for r in finished {
        if r.end <= at || r.is_empty() {
            continue;
        }
        let start = r.start.max(at);
        let pair = format!(
            "{}{},{}",
            if wrote { "," } else { "" },
            base36(start - at),
            base36(r.end - start)
        );
        if out.len() + pair.len() > max_len {
            break;
        }
        out.push_str(&pair);
        wrote = true;
        at = r.end;
    }
    wrote.then_some(out)
}

/// The finished ranges `metadata` names past `committed`; empty when it is not ours,
/// or malformed (nothing is skipped then).
pub fn decode(committed: i64, metadata: &str) -> Vec<Range<i64>> {
    let Some(body) = metadata.strip_prefix(PREFIX) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut at = committed;
    let mut lengths = body.split(',');
    while let (Some(gap), Some(run)) = (lengths.next(), lengths.next()) {
        let (Some(gap), Some(run)) = (from_base36(gap), from_base36(run)) else {
            return Vec::new();
        };
        let Some(start) = at.checked_add(gap) else {
            return Vec::new();
        };
        let Some(end) = start.checked_add(run) else {
            return Vec::new();
        };
        if run > 0 {
            out.push(start..end);
        }
        at = end;
    }
    out
}

fn base36(mut n: i64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    if n <= 0 {
        return "0".into();
    }
    let mut s = Vec::new();
    while n > 0 {
        let d = usize::try_from(n % 36).unwrap_or(0);
        s.push(DIGITS.get(d).copied().unwrap_or(b'0'));
        n /= 36;
    }
    s.reverse();
    String::from_utf8(s).unwrap_or_default()
}

fn from_base36(s: &str) -> Option<i64> {
    if s.is_empty() || s.len() > 12 {
        return None;
    }
    i64::from_str_radix(s, 36).ok().filter(|n| *n >= 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn runs_past_the_commit_round_trip_and_others_are_ignored() {
        let m = encode(100, &[100..105, 107..110], MAX_LEN);
        assert_eq!(m.as_deref(), Some("ottla.f1:0,5,2,3"));
        assert_eq!(decode(100, "ottla.f1:0,5,2,3"), vec![100..105, 107..110]);
        // Before the commit: nothing; none at all: no metadata.
        assert_eq!(encode(100, &[90..95], MAX_LEN), None);
        assert_eq!(encode(100, &[], MAX_LEN), None);
        assert_eq!(
            encode(100, &[95..102], MAX_LEN).as_deref(),
            Some("ottla.f1:0,2")
        );
        // Someone else's metadata, or a broken one, skips nothing.
        assert!(decode(0, "").is_empty());
        assert!(decode(0, "app-v1").is_empty());
        assert!(decode(0, "ottla.f1:0,-5").is_empty());
        assert!(decode(0, "ottla.f1:zzzzzzzzzzzzz,1").is_empty());
        assert!(decode(i64::MAX - 1, "ottla.f1:5,5").is_empty());
    }

    #[test]
    fn what_does_not_fit_is_left_out_whole() {
        let every_other: Vec<Range<i64>> = (0..2000).map(|i| (2 * i + 1)..(2 * i + 2)).collect();
        let m = encode(0, &every_other, 100).unwrap_or_default();
        assert!(m.len() <= 100, "{}", m.len());
        let back = decode(0, &m);
        assert!(!back.is_empty());
        assert_eq!(back.as_slice(), &every_other[..back.len()]);
    }

    proptest! {
        /// Whatever the ranges, what comes back is finished: a subset of what went in.
        #[test]
        fn decoded_ranges_are_a_prefix_of_those_encoded(
            committed in 0i64..1_000_000,
            lens in proptest::collection::vec((0i64..50, 1i64..50), 0..300),
            budget in 20usize..4000,
        ) {
            let mut at = committed;
            let mut ranges = Vec::new();
            for (gap, run) in lens {
                ranges.push((at + gap)..(at + gap + run));
                at += gap + run;
            }
            let back = encode(committed, &ranges, budget)
                .map(|m| {
                    assert!(m.len() <= budget.max(PREFIX.len()));
                    decode(committed, &m)
                })
                .unwrap_or_default();
            prop_assert!(back.len() <= ranges.len());
            // Touching ranges may come back as they went in: compare offsets.
            let flat = |rs: &[Range<i64>]| rs.iter().flat_map(|r| r.clone()).collect::<Vec<_>>();
            let (went, came) = (flat(&ranges), flat(&back));
            prop_assert_eq!(&went[..came.len()], &came[..]);
        }
    }
}
