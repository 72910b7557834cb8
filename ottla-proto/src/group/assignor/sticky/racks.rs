//! The sticky assignment with racks (KIP-881), in the index form of [`super`], near-
//! linear in the number of partitions like the rack-less one (issue 36).
//!
//! Racks become numbers too: the racks members name are `0..R`, and a partition's
//! *rack set* is the set of those racks holding one of its replicas (racks no member
//! is in cannot matter). Clusters have few racks, so partitions have few distinct rack
//! sets. A topic group and a rack set make a *class*: its partitions are
//! interchangeable for balance and for locality, and its *local* members are the
//! subscribers of the group whose rack is in the set.
//!
//! [`assign`]:
//!
//! 1. previous owners keep their partitions; not a partition whose owner's rack holds
//!    no replica of it while another subscriber's rack does: rack locality comes
//!    before stickiness, as in Java, whose builders' `assignOwnedPartitions` drop every
//!    owned partition that `RackInfo.racksMismatch`. Unlike Java, an owner keeps a
//!    misaligned partition no subscriber could read locally, since moving it would
//!    gain nothing; and in a cooperative round, every misaligned partition where
//!    taking them gains no locality overall (see [`assign`]), so that the group
//!    settles;
//! 2. the unowned partitions of a class with local members go to its least loaded
//!    local members, the classes with the fewest local members first (Java:
//!    `sortPartitionsByRackConsumers`, then the rack-matching first pass of
//!    `assignRackAwareRoundRobin` / `balance`), water-filled class by class (in
//!    sixteen turns, as the groups of the rack-less assignment; at equal loads, members
//!    of the racks that fewer waiting partitions can go to first);
//! 3. the rest to the least loaded subscribers of their group, as without racks;
//! 4. balance: while a member holds a partition that a subscriber with two or more
//!    fewer could take, partitions move, from the most loaded member that has such a
//!    move. Of its moves, those that gain rack locality go first, then those that keep
//!    it (to a local receiver, else one without a rack, else any, each the least
//!    loaded of its kind); among equals, partitions the member did not own before (as
//!    many at once as keep it at or above the receiver), else one it owned. Each move
//!    lowers the sum of squared loads, so this ends, where Java's `isBalanced` holds;
//! 5. with several topic groups, chains of moves too ([`Balance::chain`]), which make the loads
//!    optimal, so that rack awareness never costs balance: the loads are at least as
//!    even as the rack-less assignment's;
//! 6. an owner that lost a partition but was given one its new holder could take as
//!    well takes its own back in exchange, where that costs no locality and keeps the
//!    balance ([`give_back`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use super::{Claims, Groups, Held, INTERLEAVE, Index, NOBODY, collect, deal, water_fill};
use crate::group::assignor::PartitionRacks;
use crate::group::consumer_protocol::TopicPartition;

/// The rack of a member that named none.
const NO_RACK: u32 = u32::MAX;

/// How many of the last distinct replica rack sets [`Racks::new`] compares with (and
/// up to how many rack names it compares rather than hashes).
const RECENT: usize = 8;

/// The racks of the group in index form.
pub(in crate::group::assignor) struct Racks {
    /// Per member, its rack, or [`NO_RACK`].
    member: Vec<u32>,
    /// Per partition, its rack set.
    set_of: Vec<u32>,
    /// Per rack set, the racks in it, ascending.
    sets: Vec<Vec<u32>>,
}

impl Racks {
    /// The racks of `index`'s members and partitions, or `None` where racks cannot
    /// change the assignment (Java `AbstractPartitionAssignor.useRackAwareAssignment`):
    /// no member names a rack, no replica is in a member's rack, or every partition is
    /// on the same racks (then where one goes cannot matter). An empty `rack_id` is no
    /// rack, as in Java.
    pub fn new(index: &Index, partition_racks: &PartitionRacks) -> Option<Self> {
        // Member racks first, so that they are 0..R; other racks named by replicas after.
        let mut names = Names::default();
        let member: Vec<u32> = index
            .members
            .iter()
            .map(|m| match m.subscription.rack_id.as_deref() {
                None | Some("") => NO_RACK,
                Some(r) => names.id(r),
            })
            .collect();
        let member_racks = names.list.len() as u32;
        if member_racks == 0 {
            return None;
        }
        // Every partition's racks, member racks or not (needed to tell whether all
        // partitions are on the same racks), as rack numbers in name order. Set 0: none
        // (partitions missing from the map too).
        let mut full: Vec<Vec<u32>> = vec![Vec::new()];
        let mut full_ids: HashMap<Vec<u32>, u32> = HashMap::from([(Vec::new(), 0)]);
        let mut used = vec![false];
        // The last few sets seen: replicas are laid out in patterns, so comparing with
        // these is cheaper than hashing.
        let mut recent: Vec<u32> = Vec::with_capacity(RECENT);
        let mut ids: Vec<u32> = Vec::new();
        let mut full_of = vec![0u32; index.partitions()];
        let mut listed = 0usize;
        // Topic by topic, a range of the map: its keys' names need no comparing.
        let ranges = index.topics.iter().enumerate().flat_map(|(t, name)| {
            let (start, end) = (index.offsets[t], index.offsets[t + 1]);
            let bounds =
                TopicPartition::new(*name, 0)..TopicPartition::new(*name, (end - start) as i32);
            partition_racks
                .range(bounds)
                .filter_map(move |(tp, racks)| {
                    let q = u32::try_from(tp.partition)
                        .ok()
                        .filter(|&q| q < end - start)?;
                    Some((start + q, racks))
                })
        });
        for (p, racks) in ranges {
            ids.clear();
            ids.extend(racks.iter().map(|r| names.id(r)));
            let cached = recent.iter().copied().find(|&f| full[f as usize] == ids);
            let id = match cached.or_else(|| full_ids.get(&ids).copied()) {
                Some(id) => id,
                None => {
                    full.push(ids.clone());
                    used.push(false);
                    let id = full.len() as u32 - 1;
                    full_ids.insert(ids.clone(), id);
                    id
                }
            };
            if cached.is_none() {
                if recent.len() == RECENT {
                    recent.remove(0);
                }
                recent.push(id);
            }
            full_of[p as usize] = id;
            used[id as usize] = true;
            listed += 1;
        }
        if listed < index.partitions() {
            used[0] = true;
        }
        let used: Vec<&[u32]> = full
            .iter()
            .zip(&used)
            .filter(|(_, u)| **u)
            .map(|(s, _)| s.as_slice())
            .collect();
        let all: BTreeSet<u32> = used.iter().flat_map(|s| s.iter().copied()).collect();
        if !all.iter().any(|&r| r < member_racks) || used.iter().all(|s| s.len() == all.len()) {
            return None;
        }
        // Per full set, its rack set: the member racks in it.
        let mut sets: Vec<Vec<u32>> = Vec::new();
        let mut set_ids: HashMap<Vec<u32>, u32> = HashMap::new();
        let set_of_full: Vec<u32> = full
            .iter()
            .map(|ids| {
                let mut set: Vec<u32> = ids.iter().copied().filter(|&r| r < member_racks).collect();
                set.sort_unstable();
                *set_ids.entry(set).or_insert_with_key(|set| {
                    sets.push(set.clone());
                    sets.len() as u32 - 1
                })
            })
            .collect();
        let set_of = full_of.iter().map(|&f| set_of_full[f as usize]).collect();
        Some(Self {
            member,
            set_of,
            sets,
        })
    }

    /// How many of the partitions of `assigned` (per member, partition indices) are on
    /// a member whose rack holds a replica.
    fn local(&self, assigned: &[Vec<u32>]) -> usize {
        assigned
            .iter()
            .enumerate()
            .map(|(m, ps)| {
                ps.iter()
                    .filter(|&&p| self.score(m as u32, self.set_of[p as usize]) == 2)
                    .count()
            })
            .sum()
    }

    /// How well member `m` is placed to read the partitions of rack set `s`: 2 in a rack
    /// with a replica, 1 without a rack (unknown), 0 in a rack without one.
    fn score(&self, m: u32, s: u32) -> i32 {
        match self.member[m as usize] {
            NO_RACK => 1,
            r if self.sets[s as usize].binary_search(&r).is_ok() => 2,
            _ => 0,
        }
    }
}

/// Rack names to numbers, in the order they are first seen.
#[derive(Default)]
struct Names<'a> {
    list: Vec<&'a str>,
    map: HashMap<&'a str, u32>,
}

impl<'a> Names<'a> {
    fn id(&mut self, name: &'a str) -> u32 {
        // A few racks are found faster by comparing than by hashing.
        let known = if self.list.len() <= RECENT {
            self.list.iter().position(|n| *n == name).map(|i| i as u32)
        } else {
            self.map.get(name).copied()
        };
        known.unwrap_or_else(|| {
            let id = self.list.len() as u32;
            self.list.push(name);
            self.map.insert(name, id);
            id
        })
    }
}

/// A topic group and a rack set.
struct Class {
    group: u32,
    set: u32,
    /// The subscribers of the group in a rack of the set, ascending.
    local: Vec<u32>,
    /// Its unowned partitions, if it has local members.
    unowned: Vec<u32>,
}

/// The rack-aware sticky assignment (see the module documentation): per member, the
/// partition indices it gets, ascending.
///
/// For a cooperative round (`cooperative`), rack locality comes before stickiness only
/// where that pays: the assignment that drops misaligned owned partitions (step 1) is
/// kept only if it places strictly more partitions on a member whose rack holds a
/// replica ([`Racks::local`]) than the assignment that keeps every owned partition;
/// else the latter. In a cooperative group (KIP-429) every partition that changes
/// owner is held back for a second round, and the leader asks for rounds until nothing
/// is: balancing can force a member that gave up its misaligned partitions to take
/// others its rack misses, and the next round would drop those again, so that one
/// partition was on its way somewhere in every round, for ever. With the rule, a round
/// that moves partitions for locality must gain locality, and the count of local
/// placements is bounded by the number of partitions; the rounds that keep every owned
/// partition settle as the rack-less assignment does (only balance moves what is
/// owned).
pub(in crate::group::assignor) fn assign(
    index: &Index,
    claims: &Claims,
    racks: &Racks,
    cooperative: bool,
) -> Vec<Vec<u32>> {
    let (aligned, dropped) = assign_owned(index, claims, racks, Owned::LocalFirst);
    if !cooperative || !dropped {
        return aligned;
    }
    let (kept, _) = assign_owned(index, claims, racks, Owned::Kept);
    if racks.local(&aligned) > racks.local(&kept) {
        aligned
    } else {
        kept
    }
}

/// What step 1 does with an owned partition whose owner's rack holds no replica while
/// another subscriber's rack does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owned {
    /// It goes to a local member (KIP-881, as Java).
    LocalFirst,
    /// Its owner keeps it.
    Kept,
}

/// [`assign`] with step 1 as `owned` says; also whether step 1 took any owned partition
/// from its owner.
fn assign_owned(
    index: &Index,
    claims: &Claims,
    racks: &Racks,
    owned: Owned,
) -> (Vec<Vec<u32>>, bool) {
    let members = index.members.len();
    if members == 0 {
        return (Vec::new(), false);
    }
    let mut dropped = false;
    let groups = Groups::new(index);

    // 1. Owners keep what they own, unless a local member could have it.
    let mut classes: Vec<Class> = Vec::new();
    let mut class_ids: HashMap<(u32, u32), u32> = HashMap::new();
    let mut class_of = vec![0u32; index.partitions()];
    let mut load = vec![0u32; members];
    let mut held: Vec<BTreeMap<u32, Held>> = (0..members).map(|_| BTreeMap::new()).collect();
    let mut rest: Vec<Vec<u32>> = vec![Vec::new(); groups.len()];
    for (t, &g) in groups.of_topic.iter().enumerate() {
        for p in index.offsets[t]..index.offsets[t + 1] {
            let s = racks.set_of[p as usize];
            let c = *class_ids.entry((g, s)).or_insert_with(|| {
                let rack_set = &racks.sets[s as usize];
                let local = groups.subscribers[g as usize]
                    .iter()
                    .copied()
                    .filter(|&m| rack_set.binary_search(&racks.member[m as usize]).is_ok())
                    .collect();
                classes.push(Class {
                    group: g,
                    set: s,
                    local,
                    unowned: Vec::new(),
                });
                classes.len() as u32 - 1
            });
            class_of[p as usize] = c;
            let class = &mut classes[c as usize];
            let owner = claims.sticky[p as usize];
            let keeps =
                || owned == Owned::Kept || racks.score(owner, s) > 0 || class.local.is_empty();
            if owner != NOBODY && keeps() {
                held[owner as usize].entry(c).or_default().sticky.push(p);
                load[owner as usize] += 1;
                continue;
            }
            dropped |= owner != NOBODY;
            if class.local.is_empty() {
                rest[g as usize].push(p);
            } else {
                class.unowned.push(p);
            }
        }
    }
    let reach = super::reach(index);

    // 2. To the least loaded local members, the classes with the fewest first.
    let mut order: Vec<u32> = (0..classes.len() as u32)
        .filter(|&c| !classes[c as usize].unowned.is_empty())
        .collect();
    order.sort_by_key(|&c| (classes[c as usize].local.len(), c));
    // Per rack, how many partitions still wait in the classes it is local to: at equal
    // loads, members of the racks that fewer waiting partitions need go first (the
    // others are kept for the classes only they can read locally).
    let mut waiting: HashMap<u32, u64> = HashMap::new();
    for &c in &order {
        let class = &classes[c as usize];
        for &r in &racks.sets[class.set as usize] {
            *waiting.entry(r).or_default() += class.unowned.len() as u64;
        }
    }
    let rounds = if order.len() > 1 { INTERLEAVE } else { 1 };
    for r in 0..rounds {
        for &c in &order {
            let class = &classes[c as usize];
            let all = &class.unowned;
            let partitions = &all[r * all.len() / rounds..(r + 1) * all.len() / rounds];
            if partitions.is_empty() {
                continue;
            }
            let chances = |m: u32| {
                let rack = racks.member[m as usize];
                (waiting.get(&rack).copied().unwrap_or(0), reach[m as usize])
            };
            let shares = water_fill(&class.local, &load, chances, partitions.len());
            deal(partitions, &shares, |m, p| {
                held[m as usize].entry(c).or_default().fresh.push(p);
            });
            for (m, n) in shares {
                load[m as usize] += n;
            }
            for &r in &racks.sets[class.set as usize] {
                if let Some(w) = waiting.get_mut(&r) {
                    *w = w.saturating_sub(partitions.len() as u64);
                }
            }
        }
    }

    // 3. The rest to the least loaded subscribers of their group.
    let order: Vec<u32> = groups
        .by_choice()
        .into_iter()
        .filter(|&g| !rest[g as usize].is_empty())
        .collect();
    let rounds = if order.len() > 1 { INTERLEAVE } else { 1 };
    for r in 0..rounds {
        for &g in &order {
            let all = &rest[g as usize];
            let partitions = &all[r * all.len() / rounds..(r + 1) * all.len() / rounds];
            if partitions.is_empty() {
                continue;
            }
            let shares = water_fill(
                groups.subscribers[g as usize],
                &load,
                |m| reach[m as usize],
                partitions.len(),
            );
            deal(partitions, &shares, |m, p| {
                let c = class_of[p as usize];
                held[m as usize].entry(c).or_default().fresh.push(p);
            });
            for (m, n) in shares {
                load[m as usize] += n;
            }
        }
    }

    // 4. and 5. Balance.
    let (least, most) = (
        load.iter().copied().min().unwrap_or(0),
        load.iter().copied().max().unwrap_or(0),
    );
    if most >= least + 2 {
        Balance::new(&groups, racks, &classes, load, &mut held).run();
    }
    give_back(&groups, racks, claims, &classes, &class_of, &mut held);
    (collect(held), dropped)
}

/// Step 6: an owner that lost a partition it held (for locality in step 1, or in
/// balancing) but was given another that its new holder could take as well, takes its
/// own back in exchange, where that costs no rack locality and keeps the balance: the
/// loads stay, and fewer partitions move.
///
/// Without this, a cooperative group might never settle: balancing can make an owner
/// give up a partition and take an unowned one every round, and each round would hold
/// back the partition on its way to its new holder.
fn give_back(
    groups: &Groups,
    racks: &Racks,
    claims: &Claims,
    classes: &[Class],
    class_of: &[u32],
    held: &mut [BTreeMap<u32, Held>],
) {
    // Where each partition that left its owner is: (member, position in its `fresh`).
    let mut at: BTreeMap<u32, (u32, usize)> = BTreeMap::new();
    for (m, classes) in held.iter().enumerate() {
        for h in classes.values() {
            for (i, &p) in h.fresh.iter().enumerate() {
                let owner = claims.sticky[p as usize];
                if owner != NOBODY && owner != m as u32 {
                    at.insert(p, (m as u32, i));
                }
            }
        }
    }
    if at.is_empty() {
        return;
    }
    let load: Vec<u32> = held
        .iter()
        .map(|classes| {
            classes
                .values()
                .map(|h| (h.fresh.len() + h.sticky.len()) as u32)
                .sum()
        })
        .collect();
    // Per topic group, its least loaded subscriber's load: an exchange must leave no
    // member with a partition a subscriber with two or more fewer could take.
    let least: Vec<u32> = groups
        .subscribers
        .iter()
        .map(|subs| subs.iter().map(|&m| load[m as usize]).min().unwrap_or(0))
        .collect();
    let lost: Vec<u32> = at.keys().copied().collect();
    for p in lost {
        let Some(&(holder, i)) = at.get(&p) else {
            continue;
        };
        let owner = claims.sticky[p as usize];
        if owner == holder {
            // An exchange below brought it back.
            continue;
        }
        let cp = class_of[p as usize];
        let (gp, sp) = (classes[cp as usize].group, classes[cp as usize].set);
        let here = racks.score(owner, sp) - racks.score(holder, sp);
        // The owner's class the holder could take one of instead: no locality lost, the
        // most gained first.
        let best = held[owner as usize]
            .iter()
            .filter(|(_, h)| !h.fresh.is_empty())
            .filter_map(|(&c, _)| {
                let class = &classes[c as usize];
                let g = class.group;
                groups.subscribers[g as usize].binary_search(&holder).ok()?;
                let balanced = g == gp
                    || (least[gp as usize] + 2 > load[owner as usize]
                        && least[g as usize] + 2 > load[holder as usize]);
                let gain = here + racks.score(holder, class.set) - racks.score(owner, class.set);
                (balanced && gain >= 0).then_some((std::cmp::Reverse(gain), c))
            })
            .min();
        let Some((_, cq)) = best else {
            continue;
        };
        let q = held[owner as usize]
            .get(&cq)
            .and_then(|h| h.fresh.last().copied());
        let Some(q) = q.filter(|&q| claims.sticky[q as usize] != owner) else {
            continue;
        };
        if held[holder as usize].get(&cp).and_then(|h| h.fresh.get(i)) != Some(&p) {
            continue;
        }
        // Take `p` out of the holder's list (the last one there takes its place) and `q`
        // off the end of the owner's.
        if let Some(list) = held[holder as usize].get_mut(&cp).map(|h| &mut h.fresh) {
            list.swap_remove(i);
            if let Some(&moved) = list.get(i) {
                if let Some(e) = at.get_mut(&moved) {
                    e.1 = i;
                }
            }
        }
        if let Some(h) = held[owner as usize].get_mut(&cq) {
            h.fresh.pop();
        }
        at.remove(&p);
        held[owner as usize].entry(cp).or_default().sticky.push(p);
        let list = &mut held[holder as usize].entry(cq).or_default().fresh;
        list.push(q);
        if let Some(e) = at.get_mut(&q) {
            *e = (holder, list.len() - 1);
        }
    }
}

/// Steps 4 and 5: the members ordered by load, overall, per topic group, and per
/// topic group and rack.
struct Balance<'a, 'g> {
    groups: &'a Groups<'g>,
    racks: &'a Racks,
    classes: &'a [Class],
    load: Vec<u32>,
    held: &'a mut [BTreeMap<u32, Held>],
    /// Ordered sets of `(load, member)`: every member (set 0), then the subscribers of
    /// each group (set `1 + g`), then those of a group in one rack (or in none).
    ordered: Vec<BTreeSet<(u32, u32)>>,
    /// Per member, the ordered sets it is in.
    sets_of: Vec<Vec<u32>>,
    /// Per class, the ordered sets of its local members, then that of its group's
    /// members without a rack, if any.
    receivers: Vec<(Vec<u32>, Option<u32>)>,
}

/// A move's cost: the rack locality it loses (-2 to 2), and whether the partition was
/// its giver's before this round.
type Cost = (i32, bool);

impl<'a, 'g> Balance<'a, 'g> {
    fn new(
        groups: &'a Groups<'g>,
        racks: &'a Racks,
        classes: &'a [Class],
        load: Vec<u32>,
        held: &'a mut [BTreeMap<u32, Held>],
    ) -> Self {
        let members = load.len();
        let mut ordered: Vec<BTreeSet<(u32, u32)>> =
            vec![(0..members as u32).map(|m| (load[m as usize], m)).collect()];
        let mut sets_of: Vec<Vec<u32>> = (0..members).map(|_| vec![0]).collect();
        let mut by_rack: HashMap<(u32, u32), u32> = HashMap::new();
        for (g, subs) in groups.subscribers.iter().enumerate() {
            ordered.push(subs.iter().map(|&m| (load[m as usize], m)).collect());
            for &m in *subs {
                sets_of[m as usize].push(g as u32 + 1);
            }
        }
        for (g, subs) in groups.subscribers.iter().enumerate() {
            for &m in *subs {
                let key = (g as u32, racks.member[m as usize]);
                let set = *by_rack.entry(key).or_insert_with(|| {
                    ordered.push(BTreeSet::new());
                    ordered.len() as u32 - 1
                });
                ordered[set as usize].insert((load[m as usize], m));
                sets_of[m as usize].push(set);
            }
        }
        let receivers = classes
            .iter()
            .map(|c| {
                let local = racks.sets[c.set as usize]
                    .iter()
                    .filter_map(|&r| by_rack.get(&(c.group, r)).copied())
                    .collect();
                (local, by_rack.get(&(c.group, NO_RACK)).copied())
            })
            .collect();
        Self {
            groups,
            racks,
            classes,
            load,
            held,
            ordered,
            sets_of,
            receivers,
        }
    }

    fn run(mut self) {
        let several = self.groups.len() > 1;
        loop {
            if let Some((from, c, to)) = self.single() {
                self.give(from, c, to);
                continue;
            }
            // With one topic group, every member can give to every other: the loads
            // are within one of each other already.
            if !several {
                return;
            }
            let Some(hops) = self.chain() else {
                return;
            };
            for (from, to, g) in hops {
                // The search saw `from` hold a partition of `g`, and nothing of it has
                // moved since: only `from`'s own hop takes from it.
                let Some(c) = self.best_class(from, to, g) else {
                    return;
                };
                if self.hand(from, c, to, 1) == 1 {
                    let (lf, lt) = (self.load[from as usize], self.load[to as usize]);
                    self.set_load(from, lf - 1);
                    self.set_load(to, lt + 1);
                }
            }
        }
    }

    /// The best single move: from the most loaded member that has one, its cheapest
    /// (`(member, class, receiver)`).
    fn single(&self) -> Option<(u32, u32, u32)> {
        let &(least, _) = self.ordered[0].first()?;
        for &(l, from) in self.ordered[0].iter().rev() {
            if l < least + 2 {
                // Neither this member nor any after it has anyone to give to.
                return None;
            }
            let mut best: Option<(Cost, u32, u32)> = None;
            for (&c, h) in self.held[from as usize].iter() {
                if h.fresh.is_empty() && h.sticky.is_empty() {
                    continue;
                }
                let Some((score, to)) = self.receiver(c, l) else {
                    continue;
                };
                let set = self.classes[c as usize].set;
                let cost = (self.racks.score(from, set) - score, h.fresh.is_empty());
                if best.is_none_or(|(b, _, _)| cost < b) {
                    best = Some((cost, c, to));
                }
            }
            if let Some((_, c, to)) = best {
                return Some((from, c, to));
            }
        }
        None
    }

    /// The best receiver of a partition of class `c` from a member with `load`
    /// partitions, with its score: the least loaded local member, else the least
    /// loaded member without a rack, else the least loaded subscriber, with two or more
    /// fewer.
    fn receiver(&self, c: u32, load: u32) -> Option<(i32, u32)> {
        let fits = |set: u32| {
            self.ordered[set as usize]
                .first()
                .filter(|&&(l, _)| l + 2 <= load)
                .copied()
        };
        let (local, no_rack) = &self.receivers[c as usize];
        if let Some((_, m)) = local.iter().filter_map(|&s| fits(s)).min() {
            return Some((2, m));
        }
        if let Some((_, m)) = no_rack.and_then(fits) {
            return Some((1, m));
        }
        let g = self.classes[c as usize].group;
        fits(g + 1).map(|(_, m)| (0, m))
    }

    /// Moves partitions of class `c` from `from` to `to`: as many it did not own
    /// before as keep it at or above `to`, else one it owned.
    fn give(&mut self, from: u32, c: u32, to: u32) {
        let (lf, lt) = (self.load[from as usize], self.load[to as usize]);
        let fresh = self.held[from as usize]
            .get(&c)
            .map_or(0, |h| h.fresh.len() as u32);
        let k = fresh.min((lf - lt) / 2).max(1);
        let k = self.hand(from, c, to, k);
        self.set_load(from, lf - k);
        self.set_load(to, lt + k);
    }

    /// Hands up to `k` partitions of class `c` from `from` to `to` (those `from` did not
    /// own before first), leaving the loads to the caller; returns how many.
    fn hand(&mut self, from: u32, c: u32, to: u32, k: u32) -> u32 {
        let Some(h) = self.held[from as usize].get_mut(&c) else {
            return 0;
        };
        let moved: Vec<u32> = if h.fresh.is_empty() {
            h.sticky.pop().into_iter().collect()
        } else {
            let k = h.fresh.len().min(k as usize);
            h.fresh.split_off(h.fresh.len() - k)
        };
        let k = moved.len() as u32;
        self.held[to as usize]
            .entry(c)
            .or_default()
            .fresh
            .extend(moved);
        k
    }

    fn set_load(&mut self, m: u32, to: u32) {
        let from = self.load[m as usize];
        for &s in &self.sets_of[m as usize] {
            let set = &mut self.ordered[s as usize];
            set.remove(&(from, m));
            set.insert((to, m));
        }
        self.load[m as usize] = to;
    }

    /// The class of topic group `g` whose partition `from` hands `to` best in a chain.
    fn best_class(&self, from: u32, to: u32, g: u32) -> Option<u32> {
        self.held[from as usize]
            .iter()
            .filter(|(c, h)| {
                self.classes[**c as usize].group == g
                    && !(h.fresh.is_empty() && h.sticky.is_empty())
            })
            .min_by_key(|(c, h)| {
                let set = self.classes[**c as usize].set;
                let lost = self.racks.score(from, set) - self.racks.score(to, set);
                (lost, h.fresh.is_empty())
            })
            .map(|(c, _)| *c)
    }

    /// Moves `a → b → … → z` (`(giver, receiver, topic group)`), each handing one
    /// partition of the group to a subscriber of it, that take one partition off `a` and
    /// give one to `z`, where `z` has two or more fewer than `a` (the members between
    /// keep their count): a cost-reducing path in the sense of Harvey, Ladner, Lovász
    /// and Tamir, "Semi-matchings for bipartite graphs and load balancing" (2003). Once
    /// neither a single move nor such a chain exists, the loads are optimal for every
    /// convex measure of spread (their theorem): no other assignment of these
    /// partitions to their subscribers has a lower maximum, a higher minimum or a
    /// smaller sum of squares.
    ///
    /// A breadth-first search over members and topic groups (a group is entered once:
    /// then all its subscribers are reached), from all the members of one load at a
    /// time, the most loaded first: O(members × groups) per search.
    fn chain(&self) -> Option<Vec<(u32, u32, u32)>> {
        let members = self.load.len();
        let &(least, _) = self.ordered[0].first()?;
        let mut levels: Vec<u32> = self.load.clone();
        levels.sort_unstable_by(|a, b| b.cmp(a));
        levels.dedup();
        for level in levels {
            if level < least + 2 {
                return None;
            }
            // member -> (the member it gets a partition from, the group)
            let mut parent: Vec<(u32, u32)> = vec![(NOBODY, NOBODY); members];
            let mut seen = vec![false; members];
            let mut entered = vec![false; self.groups.len()];
            let mut queue: VecDeque<u32> = VecDeque::new();
            for &(l, m) in self.ordered[0].range((level, 0)..=(level, u32::MAX)) {
                debug_assert_eq!(l, level);
                seen[m as usize] = true;
                queue.push_back(m);
            }
            while let Some(u) = queue.pop_front() {
                for (&c, h) in self.held[u as usize].iter() {
                    let g = self.classes[c as usize].group;
                    if entered[g as usize] || (h.fresh.is_empty() && h.sticky.is_empty()) {
                        continue;
                    }
                    entered[g as usize] = true;
                    for &v in self.groups.subscribers[g as usize] {
                        if seen[v as usize] {
                            continue;
                        }
                        seen[v as usize] = true;
                        parent[v as usize] = (u, g);
                        if self.load[v as usize] + 2 <= level {
                            let mut hops = Vec::new();
                            let mut at = v;
                            while let Some(&(from, g)) = parent.get(at as usize) {
                                if from == NOBODY {
                                    break;
                                }
                                hops.push((from, at, g));
                                at = from;
                            }
                            hops.reverse();
                            return Some(hops);
                        }
                        queue.push_back(v);
                    }
                }
            }
        }
        None
    }
}
