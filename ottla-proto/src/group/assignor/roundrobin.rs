//! `roundrobin`: every partition dealt round the members.

use std::collections::{BTreeMap, HashMap};

use super::{
    AssignError, Assignor, MemberSubscription, RebalanceProtocol, empty_result, finish,
    sorted_members,
};
use crate::group::consumer_protocol::{Assignment, TopicPartition};

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
        // Per topic, its subscribers' positions in `sorted`, ascending; per member, the
        // partitions it gets.
        let mut subscribers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, m) in sorted.iter().enumerate() {
            for t in &m.subscription.topics {
                let list = subscribers.entry(t.as_str()).or_default();
                if list.last() != Some(&i) {
                    list.push(i);
                }
            }
        }
        let mut given: Vec<Vec<TopicPartition>> = vec![Vec::new(); sorted.len()];
        let mut cursor = 0usize;
        for (topic, &n) in partitions_per_topic {
            let Some(list) = subscribers.get(topic.as_str()) else {
                continue;
            };
            for p in 0..n.max(0) {
                // Round the circle from the cursor to the next member subscribed to this
                // topic: the first subscriber at or after it, else the first of all.
                let at = list.partition_point(|&i| i < cursor);
                let Some(&m) = list.get(at).or_else(|| list.first()) else {
                    break;
                };
                given[m].push(TopicPartition::new(topic.clone(), p));
                cursor = (m + 1) % sorted.len();
            }
        }
        for (m, list) in sorted.iter().zip(given) {
            result.insert(m.member_id.clone(), list);
        }
        Ok(finish(result))
    }
}
