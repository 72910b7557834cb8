//! The `consumer` embedded protocol: subscriptions (JoinGroup metadata) and
//! assignments (SyncGroup bytes), byte-compatible with the Java client's
//! `ConsumerProtocol`, so ottla members can share a group with other clients.
//!
//! Every encoding starts with an `i16` version. Readers accept any version: a version
//! above the highest known is read with the highest known schema, because later versions
//! only append fields (the Java client does the same), and bytes after the known fields
//! are ignored.

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as WireAssigned;
use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition as WireOwned;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

/// The highest ConsumerProtocol version ottla knows.
pub const MAX_VERSION: i16 = 3;

/// A topic partition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    /// The topic.
    pub topic: String,
    /// The partition index.
    pub partition: i32,
}

impl TopicPartition {
    /// `topic`/`partition`.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// A member's subscription, sent in JoinGroup.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Subscription {
    /// Subscribed topics.
    pub topics: Vec<String>,
    /// Assignor-specific data.
    pub user_data: Option<Bytes>,
    /// Partitions owned now (v1+, for cooperative assignors).
    pub owned_partitions: Vec<TopicPartition>,
    /// The generation the owned partitions belong to (v2+), `-1` if none.
    pub generation_id: i32,
    /// The member's rack (v3+).
    pub rack_id: Option<String>,
}

/// A member's assignment, received in SyncGroup.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Assignment {
    /// The assigned partitions.
    pub partitions: Vec<TopicPartition>,
    /// Assignor-specific data.
    pub user_data: Option<Bytes>,
}

/// A subscription or assignment that could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerProtocolError {
    /// Fewer than two bytes: no version.
    #[error("consumer protocol data of {len} bytes has no version")]
    NoVersion {
        /// The length seen.
        len: usize,
    },
    /// A negative version.
    #[error("consumer protocol version {version} is invalid")]
    BadVersion {
        /// The version read.
        version: i16,
    },
    /// The body did not decode, or could not be encoded.
    #[error("consumer protocol {what} v{version}: {message}")]
    Body {
        /// `subscription` or `assignment`.
        what: &'static str,
        /// The version.
        version: i16,
        /// What the codec said.
        message: String,
    },
}

/// Encodes `s` at `version` (0..=3), writing only the fields the version has.
pub fn encode_subscription(s: &Subscription, version: i16) -> Result<Bytes, ConsumerProtocolError> {
    check_version(version)?;
    let mut wire = ConsumerProtocolSubscription::default()
        .with_topics(
            s.topics
                .iter()
                .map(|t| StrBytes::from_string(t.clone()))
                .collect(),
        )
        .with_user_data(s.user_data.clone());
    if version >= 1 {
        wire = wire.with_owned_partitions(group_owned(&s.owned_partitions));
    }
    if version >= 2 {
        wire = wire.with_generation_id(s.generation_id);
    }
    if version >= 3 {
        wire = wire.with_rack_id(s.rack_id.clone().map(StrBytes::from_string));
    }
    encode_versioned("subscription", &wire, version)
}

/// Decodes a subscription of any version.
pub fn decode_subscription(bytes: Bytes) -> Result<Subscription, ConsumerProtocolError> {
    let (version, mut body) = split_version(bytes)?;
    let read = version.min(MAX_VERSION);
    let wire = ConsumerProtocolSubscription::decode(&mut body, read)
        .map_err(|e| body_error("subscription", version, e))?;
    Ok(Subscription {
        topics: wire.topics.iter().map(|t| t.to_string()).collect(),
        user_data: wire.user_data,
        owned_partitions: wire
            .owned_partitions
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| TopicPartition::new(t.topic.0.to_string(), *p))
            })
            .collect(),
        generation_id: if read >= 2 { wire.generation_id } else { -1 },
        rack_id: wire.rack_id.map(|r| r.to_string()),
    })
}

/// Encodes `a` at `version` (0..=3).
pub fn encode_assignment(a: &Assignment, version: i16) -> Result<Bytes, ConsumerProtocolError> {
    check_version(version)?;
    let wire = ConsumerProtocolAssignment::default()
        .with_assigned_partitions(group_assigned(&a.partitions))
        .with_user_data(a.user_data.clone());
    encode_versioned("assignment", &wire, version)
}

/// Decodes an assignment of any version. Empty bytes are an empty assignment: brokers
/// send them to members the leader gave nothing.
pub fn decode_assignment(bytes: Bytes) -> Result<Assignment, ConsumerProtocolError> {
    if bytes.is_empty() {
        return Ok(Assignment::default());
    }
    let (version, mut body) = split_version(bytes)?;
    let wire = ConsumerProtocolAssignment::decode(&mut body, version.min(MAX_VERSION))
        .map_err(|e| body_error("assignment", version, e))?;
    Ok(Assignment {
        partitions: wire
            .assigned_partitions
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| TopicPartition::new(t.topic.0.to_string(), *p))
            })
            .collect(),
        user_data: wire.user_data,
    })
}

/// The version of encoded subscription or assignment bytes, if readable.
pub fn version_of(bytes: &[u8]) -> Option<i16> {
    let v = bytes.get(..2)?;
    Some(i16::from_be_bytes([v[0], v[1]]))
}

fn check_version(version: i16) -> Result<(), ConsumerProtocolError> {
    if (0..=MAX_VERSION).contains(&version) {
        Ok(())
    } else {
        Err(ConsumerProtocolError::BadVersion { version })
    }
}

fn split_version(mut bytes: Bytes) -> Result<(i16, Bytes), ConsumerProtocolError> {
    if bytes.len() < 2 {
        return Err(ConsumerProtocolError::NoVersion { len: bytes.len() });
    }
    let version = bytes.get_i16();
    if version < 0 {
        return Err(ConsumerProtocolError::BadVersion { version });
    }
    Ok((version, bytes))
}

fn encode_versioned<T: Encodable>(
    what: &'static str,
    wire: &T,
    version: i16,
) -> Result<Bytes, ConsumerProtocolError> {
    let mut out = BytesMut::new();
    out.put_i16(version);
    wire.encode(&mut out, version)
        .map_err(|e| body_error(what, version, e))?;
    Ok(out.freeze())
}

fn body_error(what: &'static str, version: i16, e: anyhow::Error) -> ConsumerProtocolError {
    ConsumerProtocolError::Body {
        what,
        version,
        message: e.to_string(),
    }
}

/// Groups partitions by topic, topics and partitions sorted, as the Java client writes.
pub(crate) fn by_topic(partitions: &[TopicPartition]) -> Vec<(String, Vec<i32>)> {
    let mut map: std::collections::BTreeMap<&str, Vec<i32>> = std::collections::BTreeMap::new();
    for p in partitions {
        map.entry(&p.topic).or_default().push(p.partition);
    }
    map.into_iter()
        .map(|(t, mut ps)| {
            ps.sort_unstable();
            (t.to_string(), ps)
        })
        .collect()
}

fn group_owned(partitions: &[TopicPartition]) -> Vec<WireOwned> {
    by_topic(partitions)
        .into_iter()
        .map(|(t, ps)| {
            WireOwned::default()
                .with_topic(TopicName(StrBytes::from_string(t)))
                .with_partitions(ps)
        })
        .collect()
}

fn group_assigned(partitions: &[TopicPartition]) -> Vec<WireAssigned> {
    by_topic(partitions)
        .into_iter()
        .map(|(t, ps)| {
            WireAssigned::default()
                .with_topic(TopicName(StrBytes::from_string(t)))
                .with_partitions(ps)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample() -> Subscription {
        Subscription {
            topics: vec!["t1".into(), "t2".into()],
            user_data: Some(Bytes::from_static(b"ud")),
            owned_partitions: vec![TopicPartition::new("t1", 1), TopicPartition::new("t1", 0)],
            generation_id: 9,
            rack_id: Some("r1".into()),
        }
    }

    #[test]
    fn subscriptions_round_trip_at_every_version_keeping_what_the_version_has() {
        for v in 0..=MAX_VERSION {
            let bytes = encode_subscription(&sample(), v).unwrap();
            assert_eq!(version_of(&bytes), Some(v));
            let back = decode_subscription(bytes).unwrap();
            assert_eq!(back.topics, sample().topics);
            assert_eq!(back.user_data, sample().user_data);
            let owned = if v >= 1 {
                vec![TopicPartition::new("t1", 0), TopicPartition::new("t1", 1)]
            } else {
                vec![]
            };
            assert_eq!(back.owned_partitions, owned, "v{v}");
            assert_eq!(back.generation_id, if v >= 2 { 9 } else { -1 });
            assert_eq!(
                back.rack_id.as_deref(),
                if v >= 3 { Some("r1") } else { None }
            );
        }
    }

    #[test]
    fn java_v0_subscription_bytes_decode() {
        // version 0, topics ["t1","t2"], user data null: as Java's ConsumerProtocol writes it.
        let bytes = Bytes::from_static(&[
            0, 0, 0, 0, 0, 2, 0, 2, b't', b'1', 0, 2, b't', b'2', 0xff, 0xff, 0xff, 0xff,
        ]);
        let s = decode_subscription(bytes).unwrap();
        assert_eq!(s.topics, vec!["t1", "t2"]);
        assert_eq!(s.user_data, None);
        assert!(s.owned_partitions.is_empty());
    }

    #[test]
    fn java_v1_assignment_bytes_decode() {
        // version 1, [t1: [0, 2]], user data null.
        let bytes = Bytes::from_static(&[
            0, 1, 0, 0, 0, 1, 0, 2, b't', b'1', 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 2, 0xff, 0xff,
            0xff, 0xff,
        ]);
        let a = decode_assignment(bytes).unwrap();
        assert_eq!(
            a.partitions,
            vec![TopicPartition::new("t1", 0), TopicPartition::new("t1", 2)]
        );
    }

    #[test]
    fn a_higher_version_decodes_with_the_highest_known_schema() {
        let mut bytes = BytesMut::from(&encode_subscription(&sample(), 3).unwrap()[..]);
        bytes[..2].copy_from_slice(&7i16.to_be_bytes());
        bytes.extend_from_slice(&[1, 2, 3]); // a field of a future version
        let s = decode_subscription(bytes.freeze()).unwrap();
        assert_eq!(s.rack_id.as_deref(), Some("r1"));
    }

    #[test]
    fn empty_assignment_bytes_are_an_empty_assignment() {
        assert_eq!(
            decode_assignment(Bytes::new()).unwrap(),
            Assignment::default()
        );
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_subscription(Bytes::from(bytes.clone()));
            let _ = decode_assignment(Bytes::from(bytes));
        }

        #[test]
        fn assignments_round_trip(ps in proptest::collection::btree_set(("[a-c]", 0i32..20), 0..30), v in 0i16..=3) {
            let partitions: Vec<TopicPartition> = ps.into_iter().map(|(t, p)| TopicPartition::new(t, p)).collect();
            let a = Assignment { partitions, user_data: None };
            prop_assert_eq!(decode_assignment(encode_assignment(&a, v).unwrap()).unwrap(), a);
        }
    }
}
