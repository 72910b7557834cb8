//! Partition assignors, with the Java client's protocol names and semantics so ottla
//! members can share a group with other clients:
//!
//! | name | protocol | what it does |
//! |---|---|---|
//! | `range` | eager | per topic, contiguous ranges; the first `n % m` members get one more |
//! | `roundrobin` | eager | all partitions in order, dealt round the members |
//! | `sticky` | eager | balanced, keeping previous owners where balance allows |
//! | `cooperative-sticky` | cooperative | as `sticky`, but a partition that changes owner is left out for one round (KIP-429) |
//!
//! Given the racks of the partitions' replicas ([`Assignor::assign_with_racks`]),
//! `range`, `sticky` and `cooperative-sticky` prefer to give a member whose
//! subscription names a rack the partitions with a replica in that rack, without
//! giving up balance (KIP-881); `cooperative-sticky` moves an owned partition for
//! that only where the round gains locality overall, so that the group settles.
//! Custom assignors implement [`Assignor`].

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;

use super::consumer_protocol::{Assignment, Subscription, TopicPartition};

mod range;
mod roundrobin;
mod sticky;

pub use range::RangeAssignor;
pub use roundrobin::RoundRobinAssignor;
pub use sticky::{CooperativeStickyAssignor, StickyAssignor};

/// How partitions move in a rebalance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RebalanceProtocol {
    /// Every member gives back everything before the rebalance.
    Eager,
    /// Members keep what they own; only moved partitions are revoked (KIP-429).
    Cooperative,
}

/// One member's subscription, as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSubscription {
    /// The member id.
    pub member_id: String,
    /// `group.instance.id`, for static members.
    pub instance_id: Option<String>,
    /// The decoded subscription.
    pub subscription: Subscription,
}

/// The racks holding a replica of each partition (KIP-881), from the brokers' `rack` in
/// Metadata. A partition missing from the map, or with no racks, has no known rack.
pub type PartitionRacks = BTreeMap<TopicPartition, BTreeSet<String>>;

/// An assignment that cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssignError {
    /// Two members share an id.
    #[error("duplicate member id {0}")]
    DuplicateMember(String),
    /// The assignor panicked (the message, when it was a string).
    #[error("the assignor panicked: {0}")]
    Panicked(String),
}

/// A partition assignor. The leader calls [`Assignor::assign_with_racks`] (or
/// [`Assignor::assign`] when it knows no racks); every member calls
/// [`Assignor::subscription_user_data`] when it joins.
pub trait Assignor: Send + Sync + std::fmt::Debug {
    /// The protocol name in JoinGroup (`range`, `roundrobin`, ...).
    fn name(&self) -> &'static str;
    /// Eager or cooperative.
    fn protocol(&self) -> RebalanceProtocol;
    /// Assignor data for this member's subscription. `previous` is the member's last
    /// assignment (even if already revoked), from `generation`.
    fn subscription_user_data(
        &self,
        previous: &[TopicPartition],
        generation: i32,
    ) -> Option<Bytes> {
        let _ = (previous, generation);
        None
    }
    /// Assigns the partitions of `partitions_per_topic` to `members`. Every member gets
    /// an entry, possibly empty; topics missing from `partitions_per_topic` are skipped.
    fn assign(
        &self,
        partitions_per_topic: &BTreeMap<String, i32>,
        members: &[MemberSubscription],
    ) -> Result<BTreeMap<String, Assignment>, AssignError>;
    /// As [`Assignor::assign`], knowing where each partition's replicas live, so that
    /// members whose subscription names a rack (`client.rack`) can be given partitions
    /// with a replica in that rack (KIP-881, so they can fetch from it, KIP-392).
    /// `partition_racks` needs only the partitions of `partitions_per_topic`. The
    /// default ignores the racks, so an assignor that implements only `assign` keeps
    /// working.
    fn assign_with_racks(
        &self,
        partitions_per_topic: &BTreeMap<String, i32>,
        partition_racks: &PartitionRacks,
        members: &[MemberSubscription],
    ) -> Result<BTreeMap<String, Assignment>, AssignError> {
        let _ = partition_racks;
        self.assign(partitions_per_topic, members)
    }
}

/// The built-in assignor called `name`.
pub fn builtin(name: &str) -> Option<Box<dyn Assignor>> {
    match name {
        "range" => Some(Box::new(RangeAssignor)),
        "roundrobin" => Some(Box::new(RoundRobinAssignor)),
        "sticky" => Some(Box::new(StickyAssignor)),
        "cooperative-sticky" => Some(Box::new(CooperativeStickyAssignor)),
        _ => None,
    }
}

/// Java's member order: static members by instance id first, then dynamic members by id.
fn member_order(a: &MemberSubscription, b: &MemberSubscription) -> Ordering {
    match (&a.instance_id, &b.instance_id) {
        (Some(x), Some(y)) => x.cmp(y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.member_id.cmp(&b.member_id),
    }
}

fn sorted_members(members: &[MemberSubscription]) -> Result<Vec<&MemberSubscription>, AssignError> {
    let mut seen = BTreeSet::new();
    for m in members {
        if !seen.insert(&m.member_id) {
            return Err(AssignError::DuplicateMember(m.member_id.clone()));
        }
    }
    let mut sorted: Vec<&MemberSubscription> = members.iter().collect();
    sorted.sort_by(|a, b| member_order(a, b));
    Ok(sorted)
}

fn empty_result(members: &[MemberSubscription]) -> BTreeMap<String, Vec<TopicPartition>> {
    members
        .iter()
        .map(|m| (m.member_id.clone(), Vec::new()))
        .collect()
}

fn finish(result: BTreeMap<String, Vec<TopicPartition>>) -> BTreeMap<String, Assignment> {
    result
        .into_iter()
        .map(|(m, mut partitions)| {
            partitions.sort();
            (
                m,
                Assignment {
                    partitions,
                    user_data: None,
                },
            )
        })
        .collect()
}

/// Each subscribed topic's members, in the order of `sorted`, each once: one pass over
/// the subscriptions (asking per topic and member whether it subscribes is quadratic
/// in large groups).
fn subscribers_by_topic<'a>(
    sorted: &[&'a MemberSubscription],
) -> HashMap<&'a str, Vec<&'a MemberSubscription>> {
    let mut by_topic: HashMap<&str, Vec<&MemberSubscription>> = HashMap::new();
    for &m in sorted {
        for t in &m.subscription.topics {
            let list = by_topic.entry(t.as_str()).or_default();
            // A topic a member names twice: members come in order, so it is the last.
            if !list.last().is_some_and(|last| std::ptr::eq(*last, m)) {
                list.push(m);
            }
        }
    }
    by_topic
}

#[cfg(test)]
mod tests;
