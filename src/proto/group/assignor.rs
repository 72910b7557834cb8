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
//! Custom assignors implement [`Assignor`].

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::consumer_protocol::{Assignment, Subscription, TopicPartition};

/// How partitions move in a rebalance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// An assignment that cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssignError {
    /// Two members share an id.
    #[error("duplicate member id {0}")]
    DuplicateMember(String),
}

/// A partition assignor. The leader calls [`Assignor::assign`]; every member calls
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

fn subscribes(m: &MemberSubscription, topic: &str) -> bool {
    m.subscription.topics.iter().any(|t| t == topic)
}

/// `range`: per topic, members (in Java's order) get contiguous ranges.
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
        let sorted = sorted_members(members)?;
        let mut result = empty_result(members);
        for (topic, &n) in partitions_per_topic {
            let consumers: Vec<&&MemberSubscription> =
                sorted.iter().filter(|m| subscribes(m, topic)).collect();
            if consumers.is_empty() || n <= 0 {
                continue;
            }
            let m = consumers.len() as i32;
            let (per, extra) = (n / m, n % m);
            for (i, c) in consumers.iter().enumerate() {
                let i = i as i32;
                let start = per * i + i.min(extra);
                let len = per + i32::from(i < extra);
                if let Some(list) = result.get_mut(&c.member_id) {
                    list.extend(
                        (start..start + len).map(|p| TopicPartition::new(topic.clone(), p)),
                    );
                }
            }
        }
        Ok(finish(result))
    }
}

/// `roundrobin`: every partition, topics in order, dealt round the members, skipping
/// members not subscribed to the partition's topic.
#[derive(Debug, Clone, Copy, Default)]
pub struct RoundRobinAssignor;

impl Assignor for RoundRobinAssignor {
    fn name(&self) -> &'static str {
        "roundrobin"
    }

    fn protocol(&self) -> RebalanceProtocol {
        RebalanceProtocol::Eager
    }

    fn assign(
        &self,
        partitions_per_topic: &BTreeMap<String, i32>,
        members: &[MemberSubscription],
    ) -> Result<BTreeMap<String, Assignment>, AssignError> {
        let sorted = sorted_members(members)?;
        let mut result = empty_result(members);
        if sorted.is_empty() {
            return Ok(finish(result));
        }
        let subscribed: BTreeSet<&str> = sorted
            .iter()
            .flat_map(|m| m.subscription.topics.iter().map(String::as_str))
            .collect();
        let mut cursor = 0usize;
        for (topic, &n) in partitions_per_topic
            .iter()
            .filter(|(t, _)| subscribed.contains(t.as_str()))
        {
            for p in 0..n.max(0) {
                // Advance round the circle to the next member subscribed to this topic.
                for _ in 0..sorted.len() {
                    let m = sorted[cursor % sorted.len()];
                    cursor = (cursor + 1) % sorted.len();
                    if subscribes(m, topic) {
                        if let Some(list) = result.get_mut(&m.member_id) {
                            list.push(TopicPartition::new(topic.clone(), p));
                        }
                        break;
                    }
                }
            }
        }
        Ok(finish(result))
    }
}

/// `sticky` (eager): balanced, keeping previous owners where balance allows. The
/// previous assignment travels in the user data, in the Java `StickyAssignor` layout.
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
        // Eager: every member gave everything back before joining, so nothing is held
        // back (Java's `StickyAssignor` has no `adjustAssignment`).
        let (result, _) = sticky_assign(partitions_per_topic, members)?;
        Ok(finish(result))
    }
}

/// `cooperative-sticky` (KIP-429): as `sticky`, but a partition whose owner changes is
/// left unassigned in this round; its old owner revokes it and rejoins, and the
/// follow-up rebalance hands it to the new owner.
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
        let (mut result, claims) = sticky_assign(partitions_per_topic, members)?;
        // KIP-429: a partition someone else still holds is left out until its holders
        // have revoked it (Java: `CooperativeStickyAssignor.adjustAssignment` removes the
        // "partitions transferring ownership"). That covers a partition moving to a new
        // owner, one held by a member that left its topic, and one two members claim in
        // the same generation: none of its claimants keeps it either, so both revoke it
        // (Java: `ConstrainedAssignmentBuilder.assignNewPartition` marks every partition
        // of `partitionsWithMultiplePreviousOwners` as transferring). Java's general case
        // (`computePartitionsTransferringOwnership`) would let one of two such claimants
        // keep it if the balance happened to pick it; we never do.
        for (member, list) in result.iter_mut() {
            list.retain(|p| claims.may_have(member, p));
        }
        Ok(finish(result))
    }
}

/// Who held each partition when the members joined, resolved as the Java client does.
#[derive(Debug, Default)]
struct Claims {
    /// The previous owner a partition sticks to: its only claimant from the newest
    /// generation that claimed it, if that member still subscribes to the topic.
    sticky: BTreeMap<TopicPartition, String>,
    /// Every partition some member claims, with the one member that may keep it in a
    /// cooperative round (`None`: nobody may have it this round).
    held: BTreeMap<TopicPartition, Option<String>>,
}

impl Claims {
    /// Reads the claims of `sorted` (owned partitions from the subscription, else the
    /// eager sticky user data) on the partitions of `partitions_per_topic`.
    ///
    /// As the Java client (`AbstractStickyAssignor.allSubscriptionsEqual`), the claim
    /// from the newest generation wins and two claims from that same generation cancel
    /// each other out (`partitionsWithMultiplePreviousOwners`). A claim on a topic its
    /// member no longer subscribes to takes part in that contest but never makes the
    /// member a sticky owner (`GeneralAssignmentBuilder.assignOwnedPartitions` drops it).
    fn read(partitions_per_topic: &BTreeMap<String, i32>, sorted: &[&MemberSubscription]) -> Self {
        let exists = |p: &TopicPartition| {
            partitions_per_topic
                .get(&p.topic)
                .is_some_and(|&n| p.partition >= 0 && p.partition < n)
        };
        // partition -> (newest generation, its only claimant, if only one)
        let mut newest: BTreeMap<TopicPartition, (i32, Option<&MemberSubscription>)> =
            BTreeMap::new();
        for &m in sorted {
            let s = &m.subscription;
            let (owned, generation) = if !s.owned_partitions.is_empty() {
                (s.owned_partitions.clone(), s.generation_id)
            } else {
                match s
                    .user_data
                    .as_ref()
                    .and_then(|d| decode_sticky_user_data(d.clone()))
                {
                    Some((previous, g)) => (previous, g.unwrap_or(s.generation_id)),
                    None => (Vec::new(), s.generation_id),
                }
            };
            for p in owned.into_iter().filter(|p| exists(p)) {
                match newest.get(&p) {
                    Some((g, _)) if *g > generation => {}
                    Some((g, Some(other)))
                        if *g == generation && other.member_id != m.member_id =>
                    {
                        newest.insert(p, (generation, None));
                    }
                    Some((g, None)) if *g == generation => {}
                    _ => {
                        newest.insert(p, (generation, Some(m)));
                    }
                }
            }
        }
        let mut claims = Claims::default();
        for (p, (_, owner)) in newest {
            let owner = owner.filter(|m| subscribes(m, &p.topic));
            if let Some(m) = owner {
                claims.sticky.insert(p.clone(), m.member_id.clone());
            }
            claims.held.insert(p, owner.map(|m| m.member_id.clone()));
        }
        claims
    }

    /// Whether `member` may have `p` in a cooperative round: nobody holds it, or
    /// `member` holds it and nobody contests that.
    fn may_have(&self, member: &str, p: &TopicPartition) -> bool {
        match self.held.get(p) {
            None => true,
            Some(keeper) => keeper.as_deref() == Some(member),
        }
    }
}

/// The balanced sticky assignment, and the claims it started from.
fn sticky_assign(
    partitions_per_topic: &BTreeMap<String, i32>,
    members: &[MemberSubscription],
) -> Result<(BTreeMap<String, Vec<TopicPartition>>, Claims), AssignError> {
    let sorted = sorted_members(members)?;
    let claims = Claims::read(partitions_per_topic, &sorted);
    let previous = &claims.sticky;

    let mut result = empty_result(members);
    for (p, owner) in previous {
        if let Some(list) = result.get_mut(owner) {
            list.push(p.clone());
        }
    }
    // Unowned partitions go to the least loaded eligible member.
    for (topic, &n) in partitions_per_topic {
        for partition in 0..n.max(0) {
            let p = TopicPartition::new(topic.clone(), partition);
            if previous.contains_key(&p) {
                continue;
            }
            let target = sorted
                .iter()
                .filter(|m| subscribes(m, topic))
                .min_by_key(|m| result.get(&m.member_id).map_or(0, Vec::len))
                .map(|m| m.member_id.clone());
            if let Some(t) = target {
                if let Some(list) = result.get_mut(&t) {
                    list.push(p);
                }
            }
        }
    }
    // Balance: move a partition from a member that has two or more than an eligible
    // member. Each move lowers the sum of squared loads, so this ends.
    loop {
        let mut moved = false;
        let mut order: Vec<String> = sorted.iter().map(|m| m.member_id.clone()).collect();
        order.sort_by_key(|m| std::cmp::Reverse(result.get(m).map_or(0, Vec::len)));
        'outer: for from in &order {
            let from_len = result.get(from).map_or(0, Vec::len);
            let candidates: Vec<TopicPartition> = result.get(from).cloned().unwrap_or_default();
            // Prefer moving partitions that were not this member's before.
            let mut candidates = candidates;
            candidates.sort_by_key(|p| previous.get(p) == Some(from));
            for p in candidates {
                let to = sorted
                    .iter()
                    .filter(|m| m.member_id != *from && subscribes(m, &p.topic))
                    .min_by_key(|m| result.get(&m.member_id).map_or(0, Vec::len))
                    .map(|m| m.member_id.clone());
                let Some(to) = to else { continue };
                if result.get(&to).map_or(0, Vec::len) + 1 < from_len {
                    if let Some(list) = result.get_mut(from) {
                        list.retain(|q| q != &p);
                    }
                    if let Some(list) = result.get_mut(&to) {
                        list.push(p);
                    }
                    moved = true;
                    break 'outer;
                }
            }
        }
        if !moved {
            break;
        }
    }
    Ok((result, claims))
}

/// Java `StickyAssignor` user data (v1): `[topic, [partition]]` then the generation.
fn encode_sticky_user_data(previous: &[TopicPartition], generation: i32) -> Bytes {
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
fn decode_sticky_user_data(mut b: Bytes) -> Option<(Vec<TopicPartition>, Option<i32>)> {
    let topics = usize::try_from(get_i32(&mut b)?).ok()?;
    let mut out = Vec::new();
    for _ in 0..topics {
        let len = usize::try_from(get_i16(&mut b)?).ok()?;
        if b.remaining() < len {
            return None;
        }
        let topic = String::from_utf8(b.split_to(len).to_vec()).ok()?;
        let n = usize::try_from(get_i32(&mut b)?).ok()?;
        if b.remaining() < n.checked_mul(4)? {
            return None;
        }
        for _ in 0..n {
            out.push(TopicPartition::new(topic.clone(), b.get_i32()));
        }
    }
    let generation = get_i32(&mut b);
    Some((out, generation))
}

fn get_i32(b: &mut Bytes) -> Option<i32> {
    (b.remaining() >= 4).then(|| b.get_i32())
}

fn get_i16(b: &mut Bytes) -> Option<i16> {
    (b.remaining() >= 2).then(|| b.get_i16())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn member(id: &str, topics: &[&str]) -> MemberSubscription {
        MemberSubscription {
            member_id: id.into(),
            instance_id: None,
            subscription: Subscription {
                topics: topics.iter().map(|t| t.to_string()).collect(),
                generation_id: -1,
                ..Subscription::default()
            },
        }
    }

    fn names(a: &Assignment) -> Vec<String> {
        a.partitions.iter().map(|p| p.to_string()).collect()
    }

    fn counts(pairs: &[(&str, i32)]) -> BTreeMap<String, i32> {
        pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    #[test]
    fn range_matches_the_java_vector() {
        // RangeAssignorTest.testTwoConsumersTwoTopicsSixPartitions
        let members = [member("c0", &["t1", "t2"]), member("c1", &["t1", "t2"])];
        let r = RangeAssignor
            .assign(&counts(&[("t1", 3), ("t2", 3)]), &members)
            .unwrap();
        assert_eq!(names(&r["c0"]), ["t1-0", "t1-1", "t2-0", "t2-1"]);
        assert_eq!(names(&r["c1"]), ["t1-2", "t2-2"]);
    }

    #[test]
    fn roundrobin_matches_the_java_vector() {
        // RoundRobinAssignorTest.testTwoConsumersTwoTopicsSixPartitions
        let members = [member("c0", &["t1", "t2"]), member("c1", &["t1", "t2"])];
        let r = RoundRobinAssignor
            .assign(&counts(&[("t1", 3), ("t2", 3)]), &members)
            .unwrap();
        assert_eq!(names(&r["c0"]), ["t1-0", "t1-2", "t2-1"]);
        assert_eq!(names(&r["c1"]), ["t1-1", "t2-0", "t2-2"]);
    }

    #[test]
    fn static_members_sort_by_instance_id_first() {
        let mut a = member("z-dynamic", &["t"]);
        let mut b = member("a-dynamic", &["t"]);
        a.instance_id = Some("i1".into());
        b.instance_id = None;
        let r = RangeAssignor.assign(&counts(&[("t", 3)]), &[b, a]).unwrap();
        assert_eq!(
            names(&r["z-dynamic"]),
            ["t-0", "t-1"],
            "the static member sorts first"
        );
    }

    #[test]
    fn sticky_user_data_round_trips() {
        let prev = vec![TopicPartition::new("a", 1), TopicPartition::new("b", 0)];
        let (back, g) = decode_sticky_user_data(encode_sticky_user_data(&prev, 5)).unwrap();
        assert_eq!(back, prev);
        assert_eq!(g, Some(5));
        assert_eq!(
            decode_sticky_user_data(Bytes::from_static(&[0, 0, 0, 9])),
            None
        );
    }

    fn owning(
        mut m: MemberSubscription,
        generation: i32,
        owned: &[(&str, i32)],
    ) -> MemberSubscription {
        m.subscription.generation_id = generation;
        m.subscription.owned_partitions = owned
            .iter()
            .map(|(t, p)| TopicPartition::new(*t, *p))
            .collect();
        m
    }

    fn holders<'a>(r: &'a BTreeMap<String, Assignment>, p: &TopicPartition) -> Vec<&'a str> {
        r.iter()
            .filter(|(_, a)| a.partitions.contains(p))
            .map(|(m, _)| m.as_str())
            .collect()
    }

    #[test]
    fn cooperative_holds_back_a_partition_two_members_claim_in_the_same_generation() {
        let members = [
            owning(member("a", &["t"]), 3, &[("t", 0)]),
            owning(member("b", &["t"]), 3, &[("t", 0), ("t", 1)]),
            member("c", &["t"]),
        ];
        let topics = counts(&[("t", 3)]);
        let t0 = TopicPartition::new("t", 0);
        let r = CooperativeStickyAssignor.assign(&topics, &members).unwrap();
        assert_eq!(
            holders(&r, &t0),
            Vec::<&str>::new(),
            "both claimants still hold t-0, so nobody may get it this round"
        );
        assert!(
            names(&r["b"]).contains(&"t-1".to_string()),
            "b keeps its uncontested t-1"
        );
        // The eager assignor has everything revoked before it runs: it hands t-0 out.
        let r = StickyAssignor.assign(&topics, &members).unwrap();
        assert_eq!(holders(&r, &t0).len(), 1);
    }

    #[test]
    fn cooperative_holds_back_partitions_whose_owner_unsubscribed() {
        let members = [
            owning(member("a", &["u"]), 2, &[("t", 0), ("t", 1)]),
            member("b", &["t"]),
        ];
        let topics = counts(&[("t", 2), ("u", 1)]);
        let r = CooperativeStickyAssignor.assign(&topics, &members).unwrap();
        assert_eq!(names(&r["a"]), ["u-0"], "a revokes t-0 and t-1");
        assert_eq!(
            names(&r["b"]),
            Vec::<String>::new(),
            "b gets t-0 and t-1 only after a has revoked them"
        );
        // The round after a revoked them, b gets them.
        let members = [
            owning(member("a", &["u"]), 3, &[("u", 0)]),
            owning(member("b", &["t"]), 3, &[]),
        ];
        let r = CooperativeStickyAssignor.assign(&topics, &members).unwrap();
        assert_eq!(names(&r["b"]), ["t-0", "t-1"]);
        // Eager: a has given them back already, b gets them at once.
        let members = [
            owning(member("a", &["u"]), 2, &[("t", 0), ("t", 1)]),
            member("b", &["t"]),
        ];
        let r = StickyAssignor.assign(&topics, &members).unwrap();
        assert_eq!(names(&r["b"]), ["t-0", "t-1"]);
    }

    #[test]
    fn cooperative_a_claim_from_an_unsubscribed_member_contests_a_claim_of_the_same_generation() {
        // a left topic t but still holds t-0, which b claims in the same generation.
        let members = [
            owning(member("a", &["u"]), 4, &[("t", 0)]),
            owning(member("b", &["t"]), 4, &[("t", 0)]),
        ];
        let topics = counts(&[("t", 1), ("u", 1)]);
        let r = CooperativeStickyAssignor.assign(&topics, &members).unwrap();
        assert_eq!(
            holders(&r, &TopicPartition::new("t", 0)),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn cooperative_the_highest_generation_claim_wins() {
        let members = [
            owning(member("a", &["t"]), 5, &[("t", 0)]),
            owning(member("b", &["t"]), 4, &[("t", 0), ("t", 1)]),
        ];
        let r = CooperativeStickyAssignor
            .assign(&counts(&[("t", 2)]), &members)
            .unwrap();
        assert_eq!(names(&r["a"]), ["t-0"], "a's claim is the newer one");
        assert_eq!(names(&r["b"]), ["t-1"]);
    }

    fn arb_group() -> impl Strategy<Value = (BTreeMap<String, i32>, Vec<MemberSubscription>)> {
        let topics = prop::collection::btree_map("[a-d]", 0i32..10, 1..4);
        (topics, 1usize..7).prop_flat_map(|(topics, n)| {
            let names: Vec<String> = topics.keys().cloned().collect();
            let subs =
                prop::collection::vec(prop::sample::subsequence(names.clone(), 1..=names.len()), n);
            (Just(topics), subs).prop_map(|(topics, subs)| {
                let members = subs
                    .into_iter()
                    .enumerate()
                    .map(|(i, ts)| MemberSubscription {
                        member_id: format!("m{i}"),
                        instance_id: None,
                        subscription: Subscription {
                            topics: ts,
                            generation_id: -1,
                            ..Subscription::default()
                        },
                    })
                    .collect();
                (topics, members)
            })
        })
    }

    fn check_exactly_once(
        topics: &BTreeMap<String, i32>,
        members: &[MemberSubscription],
        r: &BTreeMap<String, Assignment>,
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(r.len(), members.len());
        let mut seen = BTreeSet::new();
        for m in members {
            for p in &r[&m.member_id].partitions {
                prop_assert!(
                    subscribes(m, &p.topic),
                    "{} got {} without subscribing",
                    m.member_id,
                    p
                );
                prop_assert!(seen.insert(p.clone()), "{} assigned twice", p);
            }
        }
        let wanted: usize = topics
            .iter()
            .filter(|(t, _)| members.iter().any(|m| subscribes(m, t)))
            .map(|(_, n)| *n as usize)
            .sum();
        prop_assert_eq!(seen.len(), wanted);
        Ok(())
    }

    proptest! {
        #[test]
        fn eager_assignors_assign_every_partition_exactly_once((topics, members) in arb_group()) {
            for a in [builtin("range"), builtin("roundrobin"), builtin("sticky")].into_iter().flatten() {
                let r = a.assign(&topics, &members).unwrap();
                check_exactly_once(&topics, &members, &r)?;
            }
        }

        #[test]
        fn sticky_is_balanced_for_uniform_subscriptions(n in 1usize..7, parts in 0i32..30) {
            let topics = counts(&[("t", parts)]);
            let members: Vec<_> = (0..n).map(|i| member(&format!("m{i}"), &["t"])).collect();
            for a in [builtin("sticky"), builtin("roundrobin"), builtin("range")].into_iter().flatten() {
                let r = a.assign(&topics, &members).unwrap();
                let sizes: Vec<usize> = r.values().map(|a| a.partitions.len()).collect();
                let (min, max) = (sizes.iter().min().copied().unwrap_or(0), sizes.iter().max().copied().unwrap_or(0));
                prop_assert!(max - min <= 1, "{} unbalanced: {:?}", a.name(), sizes);
            }
        }

        #[test]
        fn sticky_keeps_what_members_owned_when_a_member_joins(n in 1usize..6, parts in 1i32..30) {
            let topics = counts(&[("t", parts)]);
            let mut members: Vec<_> = (0..n).map(|i| member(&format!("m{i}"), &["t"])).collect();
            let first = StickyAssignor.assign(&topics, &members).unwrap();
            for m in members.iter_mut() {
                m.subscription.owned_partitions = first[&m.member_id].partitions.clone();
                m.subscription.generation_id = 1;
            }
            members.push(member("new", &["t"]));
            let second = StickyAssignor.assign(&topics, &members).unwrap();
            // Balanced members only lose partitions, never swap them.
            for m in &members[..n] {
                let before: BTreeSet<_> = first[&m.member_id].partitions.iter().collect();
                for p in &second[&m.member_id].partitions {
                    prop_assert!(before.contains(p), "{} gained {} from someone else", m.member_id, p);
                }
            }
        }

        #[test]
        fn cooperative_never_moves_an_owned_partition_in_one_round_and_converges((topics, mut members) in arb_group()) {
            let coop = CooperativeStickyAssignor;
            // Round 1 from nothing, then owners claim it; shuffle membership by adding one.
            let r1 = coop.assign(&topics, &members).unwrap();
            for m in members.iter_mut() {
                m.subscription.owned_partitions = r1[&m.member_id].partitions.clone();
                m.subscription.generation_id = 1;
            }
            let mut extra = members[0].clone();
            extra.member_id = "late".into();
            extra.subscription.owned_partitions.clear();
            extra.subscription.generation_id = -1;
            members.push(extra);
            let r2 = coop.assign(&topics, &members).unwrap();
            let owner: BTreeMap<_, _> = members.iter().flat_map(|m| m.subscription.owned_partitions.iter().map(move |p| (p.clone(), m.member_id.clone()))).collect();
            for (m, a) in &r2 {
                for p in &a.partitions {
                    if let Some(o) = owner.get(p) {
                        prop_assert_eq!(o, m, "{} handed to {} while {} owns it", p, m, o);
                    }
                }
            }
            // Round 3: members own what round 2 gave them (moved partitions were revoked).
            for m in members.iter_mut() {
                m.subscription.owned_partitions = r2[&m.member_id].partitions.clone();
                m.subscription.generation_id = 2;
            }
            let r3 = coop.assign(&topics, &members).unwrap();
            check_exactly_once(&topics, &members, &r3)?;
        }
    }

    /// What can happen to the group between two rebalances.
    #[derive(Debug, Clone)]
    enum Step {
        Join(Vec<String>),
        Leave(usize),
        Resubscribe(usize, Vec<String>),
        /// A zombie: member `.1` also claims the first partition member `.0` owns, in
        /// the same generation.
        DoubleClaim(usize, usize),
    }

    fn arb_history() -> impl Strategy<Value = (BTreeMap<String, i32>, Vec<Vec<String>>, Vec<Step>)>
    {
        let topics = prop::collection::btree_map("[a-d]", 1i32..8, 1..4);
        topics.prop_flat_map(|topics| {
            let names: Vec<String> = topics.keys().cloned().collect();
            let sub = prop::sample::subsequence(names.clone(), 1..=names.len());
            let step = prop_oneof![
                sub.clone().prop_map(Step::Join),
                any::<usize>().prop_map(Step::Leave),
                (any::<usize>(), sub.clone()).prop_map(|(i, s)| Step::Resubscribe(i, s)),
                (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Step::DoubleClaim(a, b)),
            ];
            (
                Just(topics),
                prop::collection::vec(sub, 1..5),
                prop::collection::vec(step, 1..8),
            )
        })
    }

    /// The cooperative safety rule for one round: a member gets a partition it does not
    /// hold only if nobody holds it, and keeps one it holds only if nobody else holds it
    /// from the same or a newer generation.
    fn check_cooperative_round(
        topics: &BTreeMap<String, i32>,
        members: &[MemberSubscription],
        r: &BTreeMap<String, Assignment>,
    ) -> Result<(), TestCaseError> {
        let mut seen = BTreeSet::new();
        for m in members {
            let mine = &m.subscription;
            for p in &r[&m.member_id].partitions {
                prop_assert!(
                    subscribes(m, &p.topic),
                    "{} got {} without subscribing",
                    m.member_id,
                    p
                );
                prop_assert!(p.partition < topics[&p.topic], "{} does not exist", p);
                prop_assert!(seen.insert(p.clone()), "{} assigned twice", p);
                let kept = mine.owned_partitions.contains(p);
                for o in members.iter().filter(|o| o.member_id != m.member_id) {
                    let theirs = &o.subscription;
                    if !theirs.owned_partitions.contains(p) {
                        continue;
                    }
                    prop_assert!(
                        kept && theirs.generation_id < mine.generation_id,
                        "{} given to {} (holds it: {}, generation {}) while {} holds it from generation {}",
                        p,
                        m.member_id,
                        kept,
                        mine.generation_id,
                        o.member_id,
                        theirs.generation_id
                    );
                }
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn cooperative_never_gives_a_partition_another_member_holds((topics, initial, steps) in arb_history()) {
            let coop = CooperativeStickyAssignor;
            let mut next_id = 0;
            let mut members: Vec<MemberSubscription> = Vec::new();
            let mut join = |members: &mut Vec<MemberSubscription>, topics: Vec<String>| {
                let names: Vec<&str> = topics.iter().map(String::as_str).collect();
                members.push(member(&format!("m{next_id}"), &names));
                next_id += 1;
            };
            for s in initial {
                join(&mut members, s);
            }
            let quiet = 4;
            let mut generation = 0;
            let rounds = steps.len() + quiet;
            let mut last = BTreeMap::new();
            for round in 0..rounds {
                match steps.get(round).cloned() {
                    Some(Step::Join(s)) => join(&mut members, s),
                    Some(Step::Leave(i)) if members.len() > 1 => {
                        members.remove(i % members.len());
                    }
                    Some(Step::Resubscribe(i, s)) => {
                        let n = members.len();
                        members[i % n].subscription.topics = s;
                    }
                    Some(Step::DoubleClaim(a, b)) => {
                        let n = members.len();
                        let (a, b) = (a % n, b % n);
                        if let Some(p) = members[a].subscription.owned_partitions.first().cloned() {
                            if a != b && !members[b].subscription.owned_partitions.contains(&p) {
                                members[b].subscription.owned_partitions.push(p);
                            }
                        }
                    }
                    _ => {}
                }
                let r = coop.assign(&topics, &members).unwrap();
                check_cooperative_round(&topics, &members, &r)?;
                // Every member revokes what it was not given and takes what it was.
                generation += 1;
                for m in members.iter_mut() {
                    m.subscription.owned_partitions = r[&m.member_id].partitions.clone();
                    m.subscription.generation_id = generation;
                }
                last = r;
            }
            // After the quiet rounds everything held back has found its owner.
            check_exactly_once(&topics, &members, &last)?;
        }
    }
}
