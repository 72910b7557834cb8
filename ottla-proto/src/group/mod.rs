//! The consumer-group protocols: the ConsumerProtocol encodings, the assignors, the
//! version-independent group messages and their wire codec, and the group member as a
//! state machine, one per protocol ([`member::GroupMember`] for the classic protocol,
//! [`consumer_member::ConsumerGroupMember`] for KIP-848's), behind one [`Member`].

use std::collections::BTreeMap;
use std::time::Instant;

use uuid::Uuid;

pub mod assignor;
pub mod codec;
mod common;
pub mod consumer_member;
pub mod consumer_protocol;
pub mod member;
pub mod messages;
pub mod subscription;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod types;

use assignor::PartitionRacks;
use consumer_member::ConsumerGroupMember;
use member::{
    AssignmentDone, AssignmentJob, CommitError, Event, Failure, GroupConfig, GroupMember,
    GroupProtocol, Membership, Outgoing, RequestId, StateKind,
};
use messages::{CommitOffset, GroupResponse};

use crate::metadata::NodeId;

/// The contract both group members keep ([`GroupMember`] for the classic protocol,
/// [`ConsumerGroupMember`] for KIP-848's), written once: a driver (the group task,
/// the test harness, the simulation) runs either through it.
///
/// Inputs come in as `handle_*` (`now` first) and application commands as plain verbs;
/// after each, drain [`GroupMachine::poll_request`], [`GroupMachine::poll_assignment`]
/// and [`GroupMachine::poll_event`] until `None`, then sleep until
/// [`GroupMachine::poll_timeout`].
pub trait GroupMachine: std::fmt::Debug + Send {
    /// The lifecycle state.
    fn state(&self) -> StateKind;
    /// The member id (empty for a classic member before its first JoinGroup).
    fn member_id(&self) -> &str;
    /// The coordinator, if known.
    fn coordinator(&self) -> Option<NodeId>;
    /// Whether the driver closes the connection to a coordinator the member gave up
    /// on. The classic member's does, as Java's classic `markCoordinatorUnknown`: what
    /// waits on a host gone silent fails at once. The consumer protocol's does not, as
    /// Java's `CoordinatorRequestManager`: the group's state is the broker's, the
    /// heartbeat has its own deadline, and the librdkafka mock takes a closed
    /// connection for a member that released its partitions.
    fn disconnects_lost_coordinator(&self) -> bool;

    /// The next request to send.
    fn poll_request(&mut self) -> Option<Outgoing>;
    /// The next event.
    fn poll_event(&mut self) -> Option<Event>;
    /// When `handle_timeout` is next due.
    fn poll_timeout(&self) -> Option<Instant>;
    /// The leader's assignment to compute off the member's task (the classic
    /// protocol's; the consumer protocol's is the broker's): see [`AssignmentJob`].
    fn poll_assignment(&mut self) -> Option<AssignmentJob> {
        None
    }

    /// A response to request `id` arrived.
    fn handle_response(&mut self, now: Instant, id: RequestId, response: GroupResponse);
    /// Request `id` failed without a response.
    fn handle_failure(&mut self, now: Instant, id: RequestId, failure: Failure);
    /// The clock moved.
    fn handle_timeout(&mut self, now: Instant);
    /// The assignment [`GroupMachine::poll_assignment`] gave was computed.
    fn assignment_done(&mut self, _now: Instant, _done: AssignmentDone) {}
    /// Runs a pending assignment on the caller's thread (tests, simulations).
    fn assign_inline(&mut self, _now: Instant) {}
    /// What one metadata answer tells the member: partition counts and replica racks
    /// (the classic leader assigns with them), topic names by id (the consumer
    /// protocol's assignments name topics by id).
    fn set_metadata(
        &mut self,
        now: Instant,
        counts: BTreeMap<String, i32>,
        racks: PartitionRacks,
        names: BTreeMap<Uuid, String>,
    );

    /// Commits `offsets` with the live generation or epoch.
    fn commit(
        &mut self,
        now: Instant,
        offsets: Vec<CommitOffset>,
    ) -> Result<RequestId, CommitError>;
    /// The application finished the revocation asked for with `generation`.
    fn complete_revocation(&mut self, now: Instant, generation: i32);
    /// The application came back for records.
    fn note_progress(&mut self, now: Instant);
    /// The application changed what it subscribes to: topic names, and a regex the
    /// broker matches (the consumer protocol's; the classic member is given the
    /// topics a pattern matches, by its driver, and ignores `regex`).
    fn set_subscription(&mut self, now: Instant, topics: Vec<String>, regex: Option<String>);
    /// The application is about to close: see [`GroupMember::prepare_to_close`]. The
    /// consumer protocol's member rejoins only through its heartbeat, which its leave
    /// replaces; nothing to do there.
    fn prepare_to_close(&mut self) {}
    /// Leaves (or stays, as `membership` says) and closes.
    fn leave_with(&mut self, now: Instant, membership: Membership);
}

/// A group member of either protocol, chosen by [`GroupConfig::protocol`], driven
/// through [`GroupMachine`] (it dereferences to one).
#[derive(Debug)]
pub struct Member(Box<dyn GroupMachine>);

impl Member {
    /// A member of the protocol `config.protocol` names. `entropy` makes the consumer
    /// protocol's client-generated member id (KIP-1082); the classic protocol's id
    /// comes from the broker.
    pub fn new(config: GroupConfig, entropy: [u8; 16], now: Instant) -> Self {
        Member(match config.protocol {
            GroupProtocol::Classic => Box::new(GroupMember::new(config, now)),
            GroupProtocol::Consumer => {
                let id = consumer_member::new_member_id(entropy);
                Box::new(ConsumerGroupMember::new(config, id, now))
            }
        })
    }
}

impl std::ops::Deref for Member {
    type Target = dyn GroupMachine;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl std::ops::DerefMut for Member {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut *self.0
    }
}

/// The trait's methods both members implement alike, as their inherent ones (shared
/// through `common::member_surface!`).
macro_rules! group_machine {
    ($t:ty) => {
        fn state(&self) -> StateKind {
            <$t>::state(self)
        }
        fn member_id(&self) -> &str {
            <$t>::member_id(self)
        }
        fn coordinator(&self) -> Option<NodeId> {
            <$t>::coordinator(self)
        }
        fn poll_request(&mut self) -> Option<Outgoing> {
            <$t>::poll_request(self)
        }
        fn poll_event(&mut self) -> Option<Event> {
            <$t>::poll_event(self)
        }
        fn poll_timeout(&self) -> Option<Instant> {
            <$t>::poll_timeout(self)
        }
        fn handle_response(&mut self, now: Instant, id: RequestId, response: GroupResponse) {
            <$t>::handle_response(self, now, id, response)
        }
        fn handle_failure(&mut self, now: Instant, id: RequestId, failure: Failure) {
            <$t>::handle_failure(self, now, id, failure)
        }
        fn handle_timeout(&mut self, now: Instant) {
            <$t>::handle_timeout(self, now)
        }
        fn commit(
            &mut self,
            now: Instant,
            offsets: Vec<CommitOffset>,
        ) -> Result<RequestId, CommitError> {
            <$t>::commit(self, now, offsets)
        }
        fn complete_revocation(&mut self, now: Instant, generation: i32) {
            <$t>::complete_revocation(self, now, generation)
        }
        fn note_progress(&mut self, now: Instant) {
            <$t>::note_progress(self, now)
        }
        fn leave_with(&mut self, now: Instant, membership: Membership) {
            <$t>::leave_with(self, now, membership)
        }
    };
}

impl GroupMachine for GroupMember {
    group_machine!(GroupMember);

    fn set_subscription(&mut self, now: Instant, topics: Vec<String>, _regex: Option<String>) {
        GroupMember::set_subscription(self, now, topics)
    }

    fn disconnects_lost_coordinator(&self) -> bool {
        true
    }
    fn poll_assignment(&mut self) -> Option<AssignmentJob> {
        GroupMember::poll_assignment(self)
    }
    fn assignment_done(&mut self, now: Instant, done: AssignmentDone) {
        GroupMember::assignment_done(self, now, done)
    }
    fn assign_inline(&mut self, now: Instant) {
        GroupMember::assign_inline(self, now)
    }
    fn set_metadata(
        &mut self,
        now: Instant,
        counts: BTreeMap<String, i32>,
        racks: PartitionRacks,
        _names: BTreeMap<Uuid, String>,
    ) {
        self.set_partition_racks(racks);
        self.set_topic_partitions(now, counts);
    }
    fn prepare_to_close(&mut self) {
        GroupMember::prepare_to_close(self)
    }
}

impl GroupMachine for ConsumerGroupMember {
    group_machine!(ConsumerGroupMember);

    fn set_subscription(&mut self, now: Instant, topics: Vec<String>, regex: Option<String>) {
        ConsumerGroupMember::set_subscription(self, now, topics, regex)
    }

    fn disconnects_lost_coordinator(&self) -> bool {
        false
    }
    fn set_metadata(
        &mut self,
        now: Instant,
        _counts: BTreeMap<String, i32>,
        _racks: PartitionRacks,
        names: BTreeMap<Uuid, String>,
    ) {
        self.set_topic_ids(now, names)
    }
}
