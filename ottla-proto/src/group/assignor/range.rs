//! `range`: per topic, contiguous ranges, with rack matching (KIP-881).

use std::collections::{BTreeMap, BTreeSet};

use super::{
    AssignError, Assignor, MemberSubscription, PartitionRacks, RebalanceProtocol, empty_result,
    finish, sorted_members, subscribers_by_topic,
};
use crate::group::consumer_protocol::{Assignment, TopicPartition};

/// `range`: per topic, members (in Java's order) get contiguous ranges.
///
/// With racks (Java `RangeAssignor.assignPartitions`, KIP-881), each member first takes,
/// within its share of the topic, the partitions with a replica in its rack; topics with
/// the same subscribers and partition count stay co-partitioned (partition `i` of each
/// goes to one member). The partitions left are then dealt in ranges as without racks.
/// Every member gets as many partitions of each topic as without racks.
#[derive(Debug, Clone, Copy, Default)]
pub struct RangeAssignor;

impl Assignor for RangeAssignor {
    fn name(&self) -> &'static str {
        "range"
    }

    fn protocol(&self) -> RebalanceProtocol {
        RebalanceProtocol::Eager
    }

    fn assign(
        &self,
        partitions_per_topic: &BTreeMap<String, i32>,
        members: &[MemberSubscription],
    ) -> Result<BTreeMap<String, Assignment>, AssignError> {
        self.assign_with_racks(partitions_per_topic, &PartitionRacks::new(), members)
    }

    fn assign_with_racks(
        &self,
        partitions_per_topic: &BTreeMap<String, i32>,
        partition_racks: &PartitionRacks,
        members: &[MemberSubscription],
    ) -> Result<BTreeMap<String, Assignment>, AssignError> {
        let sorted = sorted_members(members)?;
        let racks = RackView::new(partition_racks, &sorted);
        let mut subscribers = subscribers_by_topic(&sorted);
        let mut topics: Vec<RangeTopic> = partitions_per_topic
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(topic, &n)| {
                let consumers = subscribers.remove(topic.as_str()).unwrap_or_default();
                RangeTopic::new(topic, n, consumers, &racks)
            })
            .collect();
        let mut result = empty_result(members);
        if topics.iter().any(|t| t.rack_aware) {
            // Java `assignWithRackMatching`: group the topics by subscribers, then by
            // partition count; a group of several is assigned co-partitioned.
            let mut groups: BTreeMap<(Vec<&str>, i32), Vec<usize>> = BTreeMap::new();
            for (i, t) in topics.iter().enumerate() {
                // Racks can change nothing where no subscriber has one.
                if t.consumers
                    .iter()
                    .all(|m| racks.rack(&m.member_id).is_none())
                {
                    continue;
                }
                let ids = t.consumers.iter().map(|m| m.member_id.as_str()).collect();
                groups.entry((ids, t.n)).or_default().push(i);
            }
            for group in groups.values() {
                match group.as_slice() {
                    [one] if topics[*one].rack_aware => {
                        let t = &mut topics[*one];
                        t.assign_ranges(&mut result, |t, c, p| t.racks_match(c, p));
                    }
                    [_] => {}
                    several => assign_co_partitioned(&mut topics, several, &mut result),
                }
            }
        }
        for t in &mut topics {
            t.assign_ranges(&mut result, |_, _, _| true);
        }
        Ok(finish(result))
    }
}

/// One topic's share-out in the range assignor (Java `RangeAssignor.TopicAssignmentState`).
struct RangeTopic<'a> {
    topic: &'a str,
    n: i32,
    /// Its subscribers, in Java's member order.
    consumers: Vec<&'a MemberSubscription>,
    racks: &'a RackView<'a>,
    /// Whether racks can make a difference for this topic (Java `needsRackAwareAssignment`).
    rack_aware: bool,
    unassigned: BTreeSet<i32>,
    /// Partitions given so far, per consumer (same index as `consumers`).
    given: Vec<i32>,
    /// Every consumer gets `per` partitions, and `extra` of them one more.
    per: i32,
    extra: i32,
}

impl<'a> RangeTopic<'a> {
    /// `consumers`: the topic's subscribers, in Java's member order.
    fn new(
        topic: &'a str,
        n: i32,
        consumers: Vec<&'a MemberSubscription>,
        racks: &'a RackView<'a>,
    ) -> Self {
        let m = consumers.len() as i32;
        let rack_aware = racks.applies(
            consumers.iter().copied(),
            (0..n).map(|p| TopicPartition::new(topic, p)),
        );
        Self {
            topic,
            n,
            rack_aware,
            racks,
            unassigned: (0..n).collect(),
            given: vec![0; consumers.len()],
            per: if m == 0 { 0 } else { n / m },
            extra: if m == 0 { 0 } else { n % m },
            consumers,
        }
    }

    /// How many more partitions consumer `c` may take.
    fn room(&self, c: usize) -> i32 {
        (self.per + i32::from(self.extra > 0) - self.given[c]).max(0)
    }

    /// Java `racksMatch`: a consumer without a rack matches every partition.
    fn racks_match(&self, c: usize, partition: i32) -> bool {
        let m = self.consumers[c];
        self.racks.rack(&m.member_id).is_none()
            || self
                .racks
                .same_rack(&m.member_id, &TopicPartition::new(self.topic, partition))
    }

    fn give(
        &mut self,
        c: usize,
        partitions: &[i32],
        result: &mut BTreeMap<String, Vec<TopicPartition>>,
    ) {
        let before = self.given[c];
        self.given[c] += partitions.len() as i32;
        if before <= self.per && self.given[c] > self.per {
            self.extra -= 1;
        }
        for p in partitions {
            self.unassigned.remove(p);
        }
        if let Some(list) = result.get_mut(&self.consumers[c].member_id) {
            list.extend(
                partitions
                    .iter()
                    .map(|&p| TopicPartition::new(self.topic, p)),
            );
        }
    }

    /// Java `assignRanges`: each consumer in turn takes the first unassigned partitions
    /// `may` allows, up to its share.
    fn assign_ranges(
        &mut self,
        result: &mut BTreeMap<String, Vec<TopicPartition>>,
        may: impl Fn(&Self, usize, i32) -> bool,
    ) {
        for c in 0..self.consumers.len() {
            if self.unassigned.is_empty() {
                break;
            }
            let take: Vec<i32> = self
                .unassigned
                .iter()
                .copied()
                .filter(|&p| may(self, c, p))
                .take(self.room(c) as usize)
                .collect();
            if !take.is_empty() {
                self.give(c, &take, result);
            }
        }
    }
}

/// Java `assignCoPartitionedWithRackMatching`: partition `i` of every topic of `group`
/// (same subscribers, same partition count) goes to the first consumer whose rack
/// holds all of them and who has room in every topic.
fn assign_co_partitioned(
    topics: &mut [RangeTopic],
    group: &[usize],
    result: &mut BTreeMap<String, Vec<TopicPartition>>,
) {
    let first = group[0];
    let mut remaining: Vec<usize> = (0..topics[first].consumers.len()).collect();
    for p in 0..topics[first].n {
        let found = remaining.iter().copied().find(|&c| {
            group
                .iter()
                .all(|&t| topics[t].racks_match(c, p) && topics[t].room(c) > 0)
        });
        let Some(c) = found else { continue };
        for &t in group {
            topics[t].give(c, &[p], result);
        }
        if group.iter().all(|&t| topics[t].room(c) == 0) {
            remaining.retain(|&x| x != c);
            if remaining.is_empty() {
                break;
            }
        }
    }
}

/// Members' racks and the racks of partitions' replicas (KIP-881). A member or
/// partition without a rack matches nothing.
#[derive(Debug, Default)]
struct RackView<'a> {
    /// The rack of each member that named one (an empty `rack_id` is none, as in Java).
    members: BTreeMap<&'a str, &'a str>,
    partitions: Option<&'a PartitionRacks>,
}

impl<'a> RackView<'a> {
    fn new(partitions: &'a PartitionRacks, members: &[&'a MemberSubscription]) -> Self {
        let members = members
            .iter()
            .filter_map(|m| {
                let rack = m
                    .subscription
                    .rack_id
                    .as_deref()
                    .filter(|r| !r.is_empty())?;
                Some((m.member_id.as_str(), rack))
            })
            .collect();
        Self {
            members,
            partitions: Some(partitions),
        }
    }

    /// Whether any member named a rack.
    fn knows_racks(&self) -> bool {
        !self.members.is_empty()
    }

    fn rack(&self, member: &str) -> Option<&'a str> {
        self.members.get(member).copied()
    }

    fn racks_of(&self, p: &TopicPartition) -> &'a BTreeSet<String> {
        static NONE: BTreeSet<String> = BTreeSet::new();
        self.partitions.and_then(|all| all.get(p)).unwrap_or(&NONE)
    }

    /// `member` is in a rack that holds a replica of `p`.
    fn same_rack(&self, member: &str, p: &TopicPartition) -> bool {
        self.rack(member)
            .is_some_and(|r| self.racks_of(p).contains(r))
    }

    /// Java `AbstractPartitionAssignor.useRackAwareAssignment`: racks matter only if a
    /// member names a rack, some replica of `partitions` is in a member's rack, and the
    /// partitions are not all on the same racks (then where one goes cannot matter).
    fn applies<'m>(
        &self,
        members: impl Iterator<Item = &'m MemberSubscription>,
        partitions: impl Iterator<Item = TopicPartition>,
    ) -> bool {
        if !self.knows_racks() {
            return false;
        }
        let member_racks: BTreeSet<&str> =
            members.filter_map(|m| self.rack(&m.member_id)).collect();
        if member_racks.is_empty() {
            return false;
        }
        let sets: Vec<&BTreeSet<String>> = partitions.map(|p| self.racks_of(&p)).collect();
        let all: BTreeSet<&str> = sets
            .iter()
            .flat_map(|s| s.iter().map(String::as_str))
            .collect();
        if member_racks.is_disjoint(&all) {
            return false;
        }
        // Each set is part of `all`: one as large is all of it.
        sets.iter().any(|s| s.len() != all.len())
    }
}
