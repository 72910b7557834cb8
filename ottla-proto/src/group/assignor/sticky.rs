//! `sticky` and `cooperative-sticky`: the two assignors, the Java `StickyAssignor`
//! user data, and their engine.
//!
//! The sticky assignors' engine in index form, near-linear in the number of partitions
//! (issue 36).
//!
//! Topics and members become numbers: a partition is its position in the list of
//! every partition of the subscribed topics (topics in name order), a member its
//! position in Java's member order. Topics with the same subscribers form a *topic
//! group*: the partitions of one group are interchangeable for balance, so the
//! assignor reasons per group, and per partition only when it hands partitions out.
//!
//! [`assign`] is the rack-less sticky assignment:
//!
//! 1. previous owners keep their partitions ([`Claims::sticky`]);
//! 2. the partitions left go, group by group (the groups with the fewest subscribers
//!    first, since they have the least choice; with several groups, in sixteen turns
//!    of a sixteenth of each group), to the least loaded subscribers of their group:
//!    the count is poured over the subscribers' loads like water ([`water_fill`]),
//!    then the partitions are dealt round the members that take some, so that each
//!    member's share spreads over the topics;
//! 3. balance: while some member holds a partition that a subscriber of its topic with
//!    two or more fewer partitions could take, partitions move, from the most loaded
//!    member that has such a move to the least loaded subscriber of that topic group:
//!    first partitions the member did not own before, as many at once as keep it at or
//!    above the receiver (they cost no stickiness wherever they go); else one it
//!    owned. Each move lowers the sum of squared loads, so this ends, where Java's
//!    `isBalanced` holds. A move looks at one ordered set of members per topic group
//!    the giver holds partitions of, and updates those of the two members' groups:
//!    O(groups × log members).
//!
//! With every member subscribing to the same topics (one group), step 2 alone leaves
//! the loads within one of each other, and step 3 moves only what must move: the
//! partitions over a member's share when members join.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{
    AssignError, Assignor, MemberSubscription, PartitionRacks, RebalanceProtocol, empty_result,
    finish, sorted_members,
};
use crate::group::consumer_protocol::{Assignment, TopicPartition};

mod racks;

use racks::{Racks, assign as assign_with_racks};

/// `sticky` (eager): balanced, keeping previous owners where balance allows. The
/// previous assignment travels in the user data, in the Java `StickyAssignor` layout.
///
/// With racks (KIP-881): balance first, then rack locality, then stickiness. A member
/// gives up a partition its rack holds no replica of if another subscriber's rack
/// does, and new partitions go to a subscriber in a rack with a replica where balance
/// allows; the loads are then as balanced as can be, never less than without racks.
#[derive(Debug, Clone, Copy, Default)]
pub struct StickyAssignor;

impl Assignor for StickyAssignor {
    fn name(&self) -> &'static str {
        "sticky"
    }

    fn protocol(&self) -> RebalanceProtocol {
        RebalanceProtocol::Eager
    }

    fn subscription_user_data(
        &self,
        previous: &[TopicPartition],
        generation: i32,
    ) -> Option<Bytes> {
        Some(encode_sticky_user_data(previous, generation))
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
        // Eager: every member gave everything back before joining, so nothing is held
        // back (Java's `StickyAssignor` has no `adjustAssignment`).
        let result = sticky_assign(partitions_per_topic, partition_racks, members, false)?;
        Ok(finish(result))
    }
}

/// `cooperative-sticky` (KIP-429): as `sticky` (racks included), but a partition whose
/// owner changes is left unassigned in this round; its old owner revokes it and
/// rejoins, and the follow-up rebalance hands it to the new owner. So is a partition
/// two members claim in the same generation, or whose holder left its topic.
#[derive(Debug, Clone, Copy, Default)]
pub struct CooperativeStickyAssignor;

impl Assignor for CooperativeStickyAssignor {
    fn name(&self) -> &'static str {
        "cooperative-sticky"
    }

    fn protocol(&self) -> RebalanceProtocol {
        RebalanceProtocol::Cooperative
    }

    fn subscription_user_data(
        &self,
        _previous: &[TopicPartition],
        generation: i32,
    ) -> Option<Bytes> {
        // Java's CooperativeStickyAssignor sends only the generation (owned partitions
        // travel in the subscription itself).
        let mut out = BytesMut::with_capacity(4);
        out.put_i32(generation);
        Some(out.freeze())
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
        // KIP-429: a partition someone else still holds is left out until its holders
        // have revoked it (Java: `CooperativeStickyAssignor.adjustAssignment` removes the
        // "partitions transferring ownership"). That covers a partition moving to a new
        // owner (for balance or rack locality), one held by a member that left its
        // topic (Java: `computePartitionsTransferringOwnership` compares with the raw
        // `ownedPartitions`, whatever the topic), and one two members claim in
        // the same generation: none of its claimants keeps it either, so both revoke it
        // (Java: `ConstrainedAssignmentBuilder.assignNewPartition` marks every partition
        // of `partitionsWithMultiplePreviousOwners` as transferring). Java's general case
        // (`computePartitionsTransferringOwnership`) would let one of two such claimants
        // keep it if the balance happened to pick it; we never do.
        let result = sticky_assign(partitions_per_topic, partition_racks, members, true)?;
        Ok(finish(result))
    }
}

/// The balanced sticky assignment, per member (every member has an entry), with the
/// partitions a cooperative round must hold back already left out when `cooperative`.
///
/// Claims are resolved as the Java client does ([`Claims::read`]). Without
/// racks (or where racks cannot help, [`Racks::new`]) the assignment is
/// [`assign`]'s: owners keep what they own, the rest goes to the least loaded
/// subscribers, then moves balance it in Java's sense. With racks,
/// [`assign_with_racks`]: the same with rack locality before stickiness (in a
/// cooperative round, only where that gains locality, so that the group settles). Both
/// are near-linear in the number of partitions.
pub(super) fn sticky_assign(
    partitions_per_topic: &BTreeMap<String, i32>,
    partition_racks: &PartitionRacks,
    members: &[MemberSubscription],
    cooperative: bool,
) -> Result<BTreeMap<String, Vec<TopicPartition>>, AssignError> {
    let sorted = sorted_members(members)?;
    let index = Index::new(partitions_per_topic, sorted);
    let claims = Claims::read(&index);
    let assigned = match Racks::new(&index, partition_racks) {
        Some(racks) => assign_with_racks(&index, &claims, &racks, cooperative),
        None => assign(&index, &claims),
    };
    let mut result = empty_result(members);
    for (m, partitions) in assigned.into_iter().enumerate() {
        let m = m as u32;
        let list = index.names(
            partitions
                .into_iter()
                .filter(|&p| !cooperative || claims.may_have(m, p)),
        );
        result.insert(index.members[m as usize].member_id.clone(), list);
    }
    Ok(result)
}

/// Java `StickyAssignor` user data (v1): `[topic, [partition]]` then the generation.
pub(super) fn encode_sticky_user_data(previous: &[TopicPartition], generation: i32) -> Bytes {
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for p in previous {
        by_topic.entry(&p.topic).or_default().push(p.partition);
    }
    let mut out = BytesMut::new();
    out.put_i32(by_topic.len() as i32);
    for (topic, partitions) in by_topic {
        out.put_i16(topic.len() as i16);
        out.put_slice(topic.as_bytes());
        out.put_i32(partitions.len() as i32);
        for p in partitions {
            out.put_i32(p);
        }
    }
    out.put_i32(generation);
    out.freeze()
}

/// Reads [`encode_sticky_user_data`]'s layout (the generation is absent in v0).
#[cfg(test)]
pub(super) fn decode_sticky_user_data(b: Bytes) -> Option<(Vec<TopicPartition>, Option<i32>)> {
    let mut out = Vec::new();
    let generation = decode_sticky_user_data_with(&b, |t, p| out.push(TopicPartition::new(t, p)))?;
    Some((out, generation))
}

/// Walks [`encode_sticky_user_data`]'s layout, calling `f(topic, partition)` for each
/// partition, and returns the generation (absent in v0); `None` if the data is
/// malformed, possibly after some calls of `f` (validate with a no-op `f` first).
fn decode_sticky_user_data_with(b: &Bytes, mut f: impl FnMut(&str, i32)) -> Option<Option<i32>> {
    let mut b: &[u8] = b;
    let topics = usize::try_from(get_i32(&mut b)?).ok()?;
    for _ in 0..topics {
        let len = usize::try_from(get_i16(&mut b)?).ok()?;
        if b.remaining() < len {
            return None;
        }
        let topic = std::str::from_utf8(&b[..len]).ok()?;
        b.advance(len);
        let n = usize::try_from(get_i32(&mut b)?).ok()?;
        if b.remaining() < n.checked_mul(4)? {
            return None;
        }
        for _ in 0..n {
            f(topic, b.get_i32());
        }
    }
    Some(get_i32(&mut b))
}

fn get_i32(b: &mut &[u8]) -> Option<i32> {
    (b.remaining() >= 4).then(|| b.get_i32())
}

fn get_i16(b: &mut &[u8]) -> Option<i16> {
    (b.remaining() >= 2).then(|| b.get_i16())
}

/// No member (an unclaimed partition in [`Claims`], no sticky owner).
pub(super) const NOBODY: u32 = u32::MAX;
/// A partition some member claims that no member may have this round.
const CONTESTED: u32 = u32::MAX - 1;

/// The group in index form.
pub(super) struct Index<'a> {
    /// The members in Java's order: member `i` is `members[i]`.
    pub members: Vec<&'a MemberSubscription>,
    /// The topics some member subscribes to that have partitions, in name order.
    pub topics: Vec<&'a str>,
    /// Topic `t`'s partitions are `offsets[t]..offsets[t + 1]`.
    pub offsets: Vec<u32>,
    by_name: HashMap<&'a str, u32>,
    /// Per topic, the members subscribing to it, ascending.
    pub subscribers: Vec<Vec<u32>>,
    /// Per member, `words` words: bit `t` set when the member subscribes to topic `t`.
    subscribed: Vec<u64>,
    words: usize,
}

impl<'a> Index<'a> {
    pub fn new(
        partitions_per_topic: &'a BTreeMap<String, i32>,
        members: Vec<&'a MemberSubscription>,
    ) -> Self {
        // Every topic with partitions gets a provisional number (name order); those
        // nobody subscribes to are dropped below.
        let known: HashMap<&str, u32> = partitions_per_topic
            .iter()
            .filter(|(_, n)| **n > 0)
            .enumerate()
            .map(|(i, (t, _))| (t.as_str(), i as u32))
            .collect();
        let counts: Vec<(&str, i32)> = partitions_per_topic
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(t, n)| (t.as_str(), *n))
            .collect();
        let mut subscribers: Vec<Vec<u32>> = vec![Vec::new(); counts.len()];
        for (i, m) in members.iter().enumerate() {
            for t in &m.subscription.topics {
                if let Some(&k) = known.get(t.as_str()) {
                    let list = &mut subscribers[k as usize];
                    // Members come in order, so a repeated topic repeats the last entry.
                    if list.last() != Some(&(i as u32)) {
                        list.push(i as u32);
                    }
                }
            }
        }
        let mut topics = Vec::new();
        let mut offsets = vec![0u32];
        let mut by_name = HashMap::new();
        let mut kept = Vec::new();
        for ((name, n), subs) in counts.into_iter().zip(subscribers) {
            if subs.is_empty() {
                continue;
            }
            by_name.insert(name, topics.len() as u32);
            topics.push(name);
            offsets.push(offsets[offsets.len() - 1] + n as u32);
            kept.push(subs);
        }
        let words = topics.len().div_ceil(64);
        let mut subscribed = vec![0u64; members.len() * words];
        for (t, subs) in kept.iter().enumerate() {
            for &m in subs {
                subscribed[m as usize * words + t / 64] |= 1 << (t % 64);
            }
        }
        Self {
            members,
            topics,
            offsets,
            by_name,
            subscribers: kept,
            subscribed,
            words,
        }
    }

    /// The number of partitions of the subscribed topics.
    pub fn partitions(&self) -> usize {
        self.offsets[self.offsets.len() - 1] as usize
    }

    pub fn subscribes(&self, member: u32, topic: u32) -> bool {
        let t = topic as usize;
        self.subscribed[member as usize * self.words + t / 64] & (1 << (t % 64)) != 0
    }

    /// The topic number of `topic`, if some member subscribes to it.
    pub fn topic(&self, topic: &str) -> Option<u32> {
        self.by_name.get(topic).copied()
    }

    /// The index of `partition` of topic `t`, if it exists.
    pub fn partition(&self, t: u32, partition: i32) -> Option<u32> {
        let (start, end) = (self.offsets[t as usize], self.offsets[t as usize + 1]);
        let p = u32::try_from(partition).ok()?;
        (p < end - start).then_some(start + p)
    }

    /// Ascending partition indices by name.
    pub fn names(&self, sorted: impl IntoIterator<Item = u32>) -> Vec<TopicPartition> {
        let mut t = 0usize;
        sorted
            .into_iter()
            .map(|p| {
                while self.offsets[t + 1] <= p {
                    t += 1;
                }
                TopicPartition::new(self.topics[t], (p - self.offsets[t]) as i32)
            })
            .collect()
    }
}

/// Resolves topic names to numbers, remembering the last one (a member's owned
/// partitions come topic by topic).
struct Lookup<'i, 'a> {
    index: &'i Index<'a>,
    last: Option<(&'i str, Option<u32>)>,
}

impl<'i, 'a> Lookup<'i, 'a> {
    fn partition(&mut self, topic: &str, partition: i32) -> Option<u32> {
        let t = match self.last {
            Some((name, t)) if name == topic => t,
            _ => {
                let t = self.index.topic(topic);
                // Keep the index's own copy of the name, which outlives `topic`.
                let name = t.map_or("", |t| self.index.topics[t as usize]);
                if t.is_some() {
                    self.last = Some((name, t));
                }
                t
            }
        }?;
        self.index.partition(t, partition)
    }
}

/// Who held each partition when the members joined, resolved as the Java client does.
pub(super) struct Claims {
    /// Per partition, the previous owner it sticks to ([`NOBODY`] if none): its only
    /// claimant from the newest generation that claimed it, if that member still
    /// subscribes to the topic.
    pub sticky: Vec<u32>,
    /// Per partition, [`NOBODY`] when no member claims it, else the one member that may
    /// keep it in a cooperative round, or [`CONTESTED`] when nobody may have it.
    held: Vec<u32>,
}

impl Claims {
    /// Reads the members' claims (owned partitions from the subscription, else the
    /// eager sticky user data).
    ///
    /// As the Java client (`AbstractStickyAssignor.allSubscriptionsEqual`), the claim
    /// from the newest generation wins and two claims from that same generation cancel
    /// each other out (`partitionsWithMultiplePreviousOwners`). A claim on a topic its
    /// member no longer subscribes to takes part in that contest but never makes the
    /// member a sticky owner (`GeneralAssignmentBuilder.assignOwnedPartitions` drops it).
    /// Claims on partitions of topics nobody subscribes to change nothing and are
    /// skipped.
    pub fn read(index: &Index) -> Self {
        let n = index.partitions();
        let mut generation = vec![i32::MIN; n];
        let mut claimant = vec![NOBODY; n];
        let mut claim = |p: u32, m: u32, g: i32| {
            let p = p as usize;
            let current = claimant[p];
            if current == NOBODY || generation[p] < g {
                claimant[p] = m;
                generation[p] = g;
            } else if generation[p] == g && current != m && current != CONTESTED {
                claimant[p] = CONTESTED;
            }
        };
        let mut lookup = Lookup { index, last: None };
        for (m, member) in index.members.iter().enumerate() {
            let m = m as u32;
            let s = &member.subscription;
            if !s.owned_partitions.is_empty() {
                for tp in &s.owned_partitions {
                    if let Some(p) = lookup.partition(&tp.topic, tp.partition) {
                        claim(p, m, s.generation_id);
                    }
                }
            } else if let Some(data) = &s.user_data {
                // Malformed user data claims nothing (validated before any claim).
                let Some(g) = decode_sticky_user_data_with(data, |_, _| {}) else {
                    continue;
                };
                let g = g.unwrap_or(s.generation_id);
                decode_sticky_user_data_with(data, |topic, partition| {
                    if let Some(p) = lookup.partition(topic, partition) {
                        claim(p, m, g);
                    }
                });
            }
        }
        let mut sticky = vec![NOBODY; n];
        let mut held = vec![NOBODY; n];
        for t in 0..index.topics.len() {
            for p in index.offsets[t]..index.offsets[t + 1] {
                let c = claimant[p as usize];
                if c == NOBODY {
                    continue;
                }
                if c != CONTESTED && index.subscribes(c, t as u32) {
                    sticky[p as usize] = c;
                    held[p as usize] = c;
                } else {
                    held[p as usize] = CONTESTED;
                }
            }
        }
        Self { sticky, held }
    }

    /// Whether member `m` may have partition `p` in a cooperative round: nobody holds
    /// it, or `m` holds it and nobody contests that.
    pub fn may_have(&self, m: u32, p: u32) -> bool {
        let h = self.held[p as usize];
        h == NOBODY || h == m
    }
}

/// In how many turns the topic groups take their unowned partitions (step 2).
const INTERLEAVE: usize = 16;

/// What a member holds of one topic group.
#[derive(Default)]
struct Held {
    /// Partitions it did not own before this round.
    fresh: Vec<u32>,
    /// Partitions it owned before and keeps.
    sticky: Vec<u32>,
}

/// Topics with the same subscribers: the partitions of one group are interchangeable
/// for balance.
struct Groups<'i> {
    /// Per topic, its group.
    of_topic: Vec<u32>,
    /// Per group, its subscribers, ascending.
    subscribers: Vec<&'i [u32]>,
}

impl<'i> Groups<'i> {
    fn new(index: &'i Index) -> Self {
        let mut of_topic = Vec::with_capacity(index.topics.len());
        let mut subscribers: Vec<&[u32]> = Vec::new();
        let mut numbers: HashMap<&[u32], u32> = HashMap::new();
        for subs in &index.subscribers {
            let g = *numbers.entry(subs.as_slice()).or_insert_with(|| {
                subscribers.push(subs);
                subscribers.len() as u32 - 1
            });
            of_topic.push(g);
        }
        Self {
            of_topic,
            subscribers,
        }
    }

    fn len(&self) -> usize {
        self.subscribers.len()
    }

    /// The groups in the order they take unowned partitions: the fewest subscribers
    /// (the least choice) first.
    fn by_choice(&self) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.len() as u32).collect();
        order.sort_by_key(|&g| (self.subscribers[g as usize].len(), g));
        order
    }

    /// Per member, the groups it subscribes to, ascending.
    fn of_member(&self, members: usize) -> Vec<Vec<u32>> {
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); members];
        for (g, subs) in self.subscribers.iter().enumerate() {
            for &m in *subs {
                out[m as usize].push(g as u32);
            }
        }
        out
    }
}

/// Per member, how many partitions it subscribes to (a member with fewer has fewer
/// other chances).
fn reach(index: &Index) -> Vec<u64> {
    let mut reach = vec![0u64; index.members.len()];
    for (t, subs) in index.subscribers.iter().enumerate() {
        let n = u64::from(index.offsets[t + 1] - index.offsets[t]);
        for &m in subs {
            reach[m as usize] += n;
        }
    }
    reach
}

/// Per member, the partitions of its held classes (topic groups, or topic groups and
/// rack sets with racks), ascending.
fn collect<K>(held: Vec<BTreeMap<K, Held>>) -> Vec<Vec<u32>> {
    held.into_iter()
        .map(|classes| {
            let mut out: Vec<u32> = classes
                .into_values()
                .flat_map(|h| h.fresh.into_iter().chain(h.sticky))
                .collect();
            out.sort_unstable();
            out
        })
        .collect()
}

/// The rack-less sticky assignment (see the module documentation): per member, the
/// partition indices it gets, ascending.
pub(super) fn assign(index: &Index, claims: &Claims) -> Vec<Vec<u32>> {
    let members = index.members.len();
    if members == 0 {
        return Vec::new();
    }
    let groups = Groups::new(index);
    let group_of_topic = &groups.of_topic;
    let group_subscribers = &groups.subscribers;
    let group_count = groups.len();

    // 1. Owners keep what they own; the rest waits per group.
    let mut load = vec![0u32; members];
    let mut held: Vec<BTreeMap<u32, Held>> = (0..members).map(|_| BTreeMap::new()).collect();
    let mut unowned: Vec<Vec<u32>> = vec![Vec::new(); group_count];
    for (t, &g) in group_of_topic.iter().enumerate() {
        for p in index.offsets[t]..index.offsets[t + 1] {
            let owner = claims.sticky[p as usize];
            if owner == NOBODY {
                unowned[g as usize].push(p);
            } else {
                held[owner as usize].entry(g).or_default().sticky.push(p);
                load[owner as usize] += 1;
            }
        }
    }

    let reach = reach(index);

    // 2. The rest to the least loaded subscribers of each group, the groups with the
    // fewest subscribers first.
    let order = groups.by_choice();
    // With several groups, the groups take turns, a sixteenth of each at a time: close
    // to handing out partition by partition to the least loaded subscriber, which leaves
    // little to balance (where every topic has subscribers of its own, 500 topics ×
    // 2,000 partitions over 2,000 members each on half the topics: 4,740 balancing moves
    // instead of 74,596 when each group goes in one piece), for sixteen sorts of each
    // group's subscribers.
    let rounds = if group_count > 1 { INTERLEAVE } else { 1 };
    for r in 0..rounds {
        for &g in &order {
            let all = &unowned[g as usize];
            let partitions = &all[r * all.len() / rounds..(r + 1) * all.len() / rounds];
            if partitions.is_empty() {
                continue;
            }
            let shares = water_fill(
                group_subscribers[g as usize],
                &load,
                |m| reach[m as usize],
                partitions.len(),
            );
            deal(partitions, &shares, |m, p| {
                held[m as usize].entry(g).or_default().fresh.push(p);
            });
            for (m, n) in shares {
                load[m as usize] += n;
            }
        }
    }

    // 3. Balance.
    let (least, most) = (
        load.iter().copied().min().unwrap_or(0),
        load.iter().copied().max().unwrap_or(0),
    );
    if most >= least + 2 {
        balance(&groups, &mut load, &mut held);
    }

    collect(held)
}

/// How many of `count` partitions each of `subscribers` gets when each goes to the
/// least loaded one: the loads rise like water to a level, and the remainder goes one
/// each to members at that level, those with the least `chances` first (without racks,
/// the member's reach: the fewest partitions they subscribe to have the fewest other
/// chances), then in member order. Only members that get some are listed, in member
/// order.
fn water_fill<K: Ord>(
    subscribers: &[u32],
    load: &[u32],
    chances: impl Fn(u32) -> K,
    count: usize,
) -> Vec<(u32, u32)> {
    let mut by_load: Vec<(u32, u32)> = subscribers.iter().map(|&m| (load[m as usize], m)).collect();
    by_load.sort_unstable();
    // The first `i` members (by load) rise to `level`; the next one is at or above it.
    let mut sum = 0u64;
    let (mut level, mut rest, mut i) = (0u64, 0u64, 0usize);
    for (k, &(l, _)) in by_load.iter().enumerate() {
        sum += u64::from(l);
        let total = count as u64 + sum;
        let n = k as u64 + 1;
        level = total / n;
        rest = total % n;
        i = k + 1;
        if by_load
            .get(k + 1)
            .is_none_or(|&(next, _)| u64::from(next) >= level)
        {
            break;
        }
    }
    let mut risen: Vec<(u32, u32)> = by_load[..i]
        .iter()
        .map(|&(l, m)| (m, (level - u64::from(l)) as u32))
        .collect();
    risen.sort_by_cached_key(|&(m, _)| (chances(m), m));
    for (_, n) in risen.iter_mut().take(rest as usize) {
        *n += 1;
    }
    risen.retain(|&(_, n)| n > 0);
    risen.sort_unstable();
    risen
}

/// Deals `partitions` round the members of `shares` (in order, each until it has its
/// share), calling `give(member, partition)`.
fn deal(partitions: &[u32], shares: &[(u32, u32)], mut give: impl FnMut(u32, u32)) {
    let mut active: Vec<(u32, u32)> = shares.to_vec();
    let mut next = partitions.iter().copied();
    while !active.is_empty() {
        for (m, left) in active.iter_mut() {
            let Some(p) = next.next() else { return };
            give(*m, p);
            *left -= 1;
        }
        active.retain(|&(_, left)| left > 0);
    }
}

/// Step 3: single moves from the most loaded member that has one to the least loaded
/// subscriber of the partition's group, until no member holds a partition a subscriber
/// with two or more fewer could take.
fn balance(groups: &Groups, load: &mut [u32], held: &mut [BTreeMap<u32, Held>]) {
    let group_subscribers = &groups.subscribers;
    let members = load.len();
    let groups_of = groups.of_member(members);
    let mut by_load: BTreeSet<(u32, u32)> =
        (0..members as u32).map(|m| (load[m as usize], m)).collect();
    let mut in_group: Vec<BTreeSet<(u32, u32)>> = group_subscribers
        .iter()
        .map(|subs| subs.iter().map(|&m| (load[m as usize], m)).collect())
        .collect();
    let set_load = |m: u32,
                    to: u32,
                    load: &mut [u32],
                    by_load: &mut BTreeSet<(u32, u32)>,
                    in_group: &mut [BTreeSet<(u32, u32)>]| {
        let from = load[m as usize];
        by_load.remove(&(from, m));
        by_load.insert((to, m));
        for &g in &groups_of[m as usize] {
            let set = &mut in_group[g as usize];
            set.remove(&(from, m));
            set.insert((to, m));
        }
        load[m as usize] = to;
    };
    loop {
        let Some(&(least, _)) = by_load.first() else {
            return;
        };
        // (from, group, sticky, to)
        let mut step = None;
        'members: for &(l, from) in by_load.iter().rev() {
            if l < least + 2 {
                // Neither this member nor any after it has anyone to give to.
                break;
            }
            for sticky in [false, true] {
                for (&g, h) in &held[from as usize] {
                    let list = if sticky { &h.sticky } else { &h.fresh };
                    if list.is_empty() {
                        continue;
                    }
                    let Some(&(to_load, to)) = in_group[g as usize].first() else {
                        continue;
                    };
                    if to != from && to_load + 2 <= l {
                        step = Some((from, g, sticky, to));
                        break 'members;
                    }
                }
            }
        }
        let Some((from, g, sticky, to)) = step else {
            return;
        };
        let (lf, lt) = (load[from as usize], load[to as usize]);
        // Chosen above from `held[from]`; a missing entry would end the balancing.
        let Some(h) = held[from as usize].get_mut(&g) else {
            return;
        };
        // A partition the member did not own before costs no stickiness wherever it
        // goes: move as many as keep `from` at or above `to`, in one step.
        let moved: Vec<u32> = if sticky {
            h.sticky.pop().into_iter().collect()
        } else {
            let k = h.fresh.len().min(((lf - lt) / 2) as usize);
            h.fresh.split_off(h.fresh.len() - k)
        };
        let k = moved.len() as u32;
        held[to as usize].entry(g).or_default().fresh.extend(moved);
        set_load(from, lf - k, load, &mut by_load, &mut in_group);
        set_load(to, lt + k, load, &mut by_load, &mut in_group);
    }
}
