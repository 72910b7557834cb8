//! What the consumer tells the application besides records: its own event type, mapped
//! from the group member's and the fetcher's.
//!
//! The machines' events are the driver's vocabulary (a coordinator found, metadata
//! needed, the offsets an OffsetFetch read, a request id to route a commit's answer).
//! The application sees what changes its partitions, what went wrong, and what a
//! commit did; nothing a driver consumes.

use std::time::Duration;

use crate::driver::BrokerHangUp;
use crate::proto::fetch::fetcher::{FetchError, FetcherEvent, ResetReason};
use crate::proto::group::consumer_protocol::TopicPartition;
use crate::proto::group::member::{CommitError, Event, GroupError, LostReason};
use crate::proto::group::messages::CommitOffset;

/// What the consumer tells the application besides records
/// ([`Consumer::next_event`](super::Consumer::next_event),
/// [`Consumer::take_events`](super::Consumer::take_events)).
///
/// New variants and fields may come in minor releases: match with `..` and a
/// catch-all arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumerEvent {
    /// This member joined a generation of its group (the classic protocol: after
    /// SyncGroup; the consumer protocol: when the broker gave it an epoch).
    #[non_exhaustive]
    Joined {
        /// The generation (the member epoch under the consumer protocol).
        generation: i32,
        /// This member's id.
        member_id: String,
        /// Whether this member computed the assignment.
        leader: bool,
        /// The assignor the group chose.
        assignor: String,
    },
    /// Partitions were added to this member; their records follow.
    #[non_exhaustive]
    Assigned {
        /// The generation.
        generation: i32,
        /// The partitions added.
        added: Vec<TopicPartition>,
        /// Everything this member owns now.
        assignment: Vec<TopicPartition>,
    },
    /// The group asks for these partitions back. Their records stop coming; what was
    /// delivered before is committed (with automatic commits on) when the application
    /// next comes back for records, or when it calls
    /// [`Consumer::complete_revocation`](super::Consumer::complete_revocation) with
    /// [`ConsumerBuilder::manual_revocation`](super::ConsumerBuilder::manual_revocation).
    #[non_exhaustive]
    RevokeRequested {
        /// The generation the partitions belong to.
        generation: i32,
        /// The partitions to give back.
        partitions: Vec<TopicPartition>,
    },
    /// Partitions were taken away without a chance to commit (the session lapsed, the
    /// member was fenced): drop the work in flight on them; their next owner starts at
    /// the last committed offset.
    #[non_exhaustive]
    Lost {
        /// The partitions.
        partitions: Vec<TopicPartition>,
        /// Why.
        reason: LostReason,
    },
    /// A commit finished: an automatic one, one made at a revocation or on close, or
    /// one the application asked for.
    #[non_exhaustive]
    CommitCompleted {
        /// What was committed, or why not.
        result: Result<Vec<CommitOffset>, CommitError>,
    },
    /// The application did not come back for records within `max.poll.interval.ms`;
    /// the member left the group and rejoins on the next poll.
    #[non_exhaustive]
    ProgressTimeout {
        /// The configured interval.
        max_poll_interval: Duration,
    },
    /// A position was set by `auto.offset.reset` (no committed offset, or it was out
    /// of range).
    #[non_exhaustive]
    OffsetReset {
        /// The partition.
        partition: TopicPartition,
        /// Why.
        reason: ResetReason,
        /// The new position.
        offset: i64,
    },
    /// A partition stopped until the application seeks it; the same error also comes
    /// once from `recv`.
    PartitionStopped(FetchError),
    /// The group refused this member in a way the application must hear of, while the
    /// member keeps retrying (a missing group or topic ACL); it goes on by itself once
    /// the refusal ends. The Java client throws these from `poll` and keeps going too.
    GroupRetrying(GroupError),
    /// The member left the group; no group event follows.
    Left,
    /// The group failed for good; `recv` returns the same error.
    Fatal(GroupError),
    /// A broker kept closing the connection on one request at one version (most
    /// likely it advertises a version it cannot parse); ottla steps down to a lower
    /// version when both sides have one. Also logged at WARN.
    BrokerHangUp(BrokerHangUp),
}

impl ConsumerEvent {
    /// The application's view of a group member's event; `None` for the events only
    /// the driver acts on (coordinator found, metadata needed, the offsets read for new
    /// partitions).
    pub(crate) fn from_group(event: Event) -> Option<Self> {
        Some(match event {
            Event::Joined {
                generation,
                member_id,
                leader,
                protocol,
            } => ConsumerEvent::Joined {
                generation,
                member_id,
                leader,
                assignor: protocol,
            },
            Event::Assigned {
                generation,
                added,
                assignment,
            } => ConsumerEvent::Assigned {
                generation,
                added,
                assignment,
            },
            Event::RevokeRequested {
                generation,
                partitions,
            } => ConsumerEvent::RevokeRequested {
                generation,
                partitions,
            },
            Event::Lost { partitions, reason } => ConsumerEvent::Lost { partitions, reason },
            Event::CommitCompleted { result, .. } => ConsumerEvent::CommitCompleted { result },
            Event::ProgressTimeout { max_poll_interval } => {
                ConsumerEvent::ProgressTimeout { max_poll_interval }
            }
            Event::Left => ConsumerEvent::Left,
            Event::Fatal(e) => ConsumerEvent::Fatal(e),
            Event::Error(e) => ConsumerEvent::GroupRetrying(e),
            Event::CoordinatorFound { .. }
            | Event::CommittedOffsets { .. }
            | Event::MetadataNeeded { .. }
            | Event::MemberEpoch { .. } => return None,
        })
    }

    /// The application's view of a fetcher's event; `None` for a metadata request.
    pub(crate) fn from_fetch(event: FetcherEvent) -> Option<Self> {
        match event {
            FetcherEvent::MetadataNeeded => None,
            FetcherEvent::OffsetReset {
                partition,
                reason,
                offset,
            } => Some(ConsumerEvent::OffsetReset {
                partition,
                reason,
                offset,
            }),
            FetcherEvent::PartitionStopped(e) => Some(ConsumerEvent::PartitionStopped(e)),
        }
    }

    /// Whether the event changes what the application owns, or ends the consumer: the
    /// events the bounded stream keeps longest.
    pub(crate) fn changes_ownership(&self) -> bool {
        matches!(
            self,
            ConsumerEvent::Joined { .. }
                | ConsumerEvent::Assigned { .. }
                | ConsumerEvent::RevokeRequested { .. }
                | ConsumerEvent::Lost { .. }
                | ConsumerEvent::Left
                | ConsumerEvent::Fatal(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::group::member::RequestId;
    use crate::proto::metadata::NodeId;

    #[test]
    fn driver_only_events_never_reach_the_application() {
        let tp = TopicPartition::new("t", 0);
        for event in [
            Event::CoordinatorFound {
                node: NodeId(1),
                address: "h:1".into(),
            },
            Event::MetadataNeeded {
                topics: vec!["t".into()],
            },
            Event::CommittedOffsets {
                generation: 3,
                offsets: vec![(tp.clone(), 5, 0)],
                metadata: vec![],
            },
        ] {
            assert_eq!(ConsumerEvent::from_group(event.clone()), None, "{event:?}");
        }
        assert_eq!(
            ConsumerEvent::from_fetch(FetcherEvent::MetadataNeeded),
            None
        );
    }

    #[test]
    fn the_application_sees_its_partitions_change_and_commits_without_request_ids() {
        let tp = TopicPartition::new("t", 0);
        assert_eq!(
            ConsumerEvent::from_group(Event::CommitCompleted {
                id: RequestId(17),
                result: Err(CommitError::NoGeneration),
            }),
            Some(ConsumerEvent::CommitCompleted {
                result: Err(CommitError::NoGeneration)
            })
        );
        let revoke = ConsumerEvent::from_group(Event::RevokeRequested {
            generation: 4,
            partitions: vec![tp.clone()],
        })
        .expect("an application event");
        assert!(revoke.changes_ownership());
        assert_eq!(
            revoke,
            ConsumerEvent::RevokeRequested {
                generation: 4,
                partitions: vec![tp.clone()]
            }
        );
        let joined = ConsumerEvent::from_group(Event::Joined {
            generation: 2,
            member_id: "m".into(),
            leader: true,
            protocol: "range".into(),
        });
        assert!(matches!(
            joined,
            Some(ConsumerEvent::Joined { generation: 2, ref assignor, leader: true, .. }) if assignor == "range"
        ));
        let retrying = ConsumerEvent::from_group(Event::Error(GroupError::Assignment {
            group: "g".into(),
            assignor: "range".into(),
            message: "m".into(),
        }));
        assert!(matches!(retrying, Some(ConsumerEvent::GroupRetrying(_))));
        assert!(!retrying.unwrap().changes_ownership());
    }
}
