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
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use assignor::PartitionRacks;
use consumer_member::ConsumerGroupMember;
use member::{
    AssignmentDone, AssignmentJob, CommitError, Event, Failure, GroupConfig, GroupMember,
    GroupProtocol, Membership, Outgoing, RequestId, StateKind,
};
use messages::{CommitOffset, GroupResponse};

use crate::proto::metadata::NodeId;

/// A group member of either protocol, chosen by [`GroupConfig::protocol`]: the two
/// machines share one contract, so a driver runs either the same way.
#[derive(Debug)]
// One per group task, moved once into it: the size difference costs nothing, and a box
// would only add an indirection to every call.
#[allow(clippy::large_enum_variant)]
pub enum Member {
    /// The classic protocol.
    Classic(GroupMember),
    /// KIP-848's consumer protocol.
    Consumer(ConsumerGroupMember),
}

macro_rules! both {
    ($self:ident, $m:ident => $e:expr) => {
        match $self {
            Member::Classic($m) => $e,
            Member::Consumer($m) => $e,
        }
    };
}

impl Member {
    /// A member of the protocol `config.protocol` names. `entropy` makes the consumer
    /// protocol's client-generated member id (KIP-1082); the classic protocol's id
    /// comes from the broker.
    pub fn new(config: GroupConfig, entropy: [u8; 16], now: Instant) -> Self {
        match config.protocol {
            GroupProtocol::Classic => Member::Classic(GroupMember::new(config, now)),
            GroupProtocol::Consumer => {
                let id = consumer_member::new_member_id(entropy);
                Member::Consumer(ConsumerGroupMember::new(config, id, now))
            }
        }
    }

    /// The lifecycle state.
    pub fn state(&self) -> StateKind {
        both!(self, m => m.state())
    }

    /// The coordinator, if known.
    pub fn coordinator(&self) -> Option<NodeId> {
        both!(self, m => m.coordinator())
    }

    /// Whether the driver closes the connection to a coordinator the member gave up
    /// on. The classic member's does, as Java's classic `markCoordinatorUnknown`: what
    /// waits on a host gone silent fails at once. The consumer protocol's does not, as
    /// Java's `CoordinatorRequestManager`: the group's state is the broker's, the
    /// heartbeat has its own deadline, and the librdkafka mock takes a closed
    /// connection for a member that released its partitions.
    pub fn disconnects_lost_coordinator(&self) -> bool {
        matches!(self, Member::Classic(_))
    }

    /// The member id.
    pub fn member_id(&self) -> &str {
        both!(self, m => m.member_id())
    }

    /// The next request to send.
    #[must_use]
    pub fn poll_request(&mut self) -> Option<Outgoing> {
        both!(self, m => m.poll_request())
    }

    /// The next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        both!(self, m => m.poll_event())
    }

    /// When `handle_timeout` is next due.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        both!(self, m => m.poll_timeout())
    }

    /// A response arrived.
    pub fn handle_response(&mut self, now: Instant, id: RequestId, response: GroupResponse) {
        both!(self, m => m.handle_response(now, id, response))
    }

    /// The leader's assignment to compute off the member's task (the classic
    /// protocol's; the consumer protocol's is the broker's): see [`AssignmentJob`].
    pub fn poll_assignment(&mut self) -> Option<AssignmentJob> {
        match self {
            Member::Classic(m) => m.poll_assignment(),
            Member::Consumer(_) => None,
        }
    }

    /// The assignment [`Member::poll_assignment`] gave was computed.
    pub fn assignment_done(&mut self, now: Instant, done: AssignmentDone) {
        if let Member::Classic(m) = self {
            m.assignment_done(now, done);
        }
    }

    /// Runs a pending assignment on the caller's thread (tests, simulations).
    pub fn assign_inline(&mut self, now: Instant) {
        if let Member::Classic(m) = self {
            m.assign_inline(now);
        }
    }

    /// A request failed without a response.
    pub fn handle_failure(&mut self, now: Instant, id: RequestId, failure: Failure) {
        both!(self, m => m.handle_failure(now, id, failure))
    }

    /// The clock moved.
    pub fn handle_timeout(&mut self, now: Instant) {
        both!(self, m => m.handle_timeout(now))
    }

    /// Commits `offsets` with the live generation or epoch.
    pub fn commit(
        &mut self,
        now: Instant,
        offsets: Vec<CommitOffset>,
    ) -> Result<RequestId, CommitError> {
        both!(self, m => m.commit(now, offsets))
    }

    /// The application finished the revocation asked for with `generation`.
    pub fn complete_revocation(&mut self, now: Instant, generation: i32) {
        both!(self, m => m.complete_revocation(now, generation))
    }

    /// The application came back for records.
    pub fn note_progress(&mut self, now: Instant) {
        both!(self, m => m.note_progress(now))
    }

    /// Leaves (or stays, as `membership` says) and closes.
    pub fn leave_with(&mut self, now: Instant, membership: Membership) {
        both!(self, m => m.leave_with(now, membership))
    }

    /// See [`GroupMember::prepare_to_close`]. The consumer protocol's member rejoins
    /// only through its heartbeat, which its leave replaces; nothing to do there.
    pub fn prepare_to_close(&mut self) {
        if let Member::Classic(m) = self {
            m.prepare_to_close();
        }
    }

    /// What one metadata answer tells the member: partition counts and replica racks
    /// (the classic leader assigns with them), topic names by id (the consumer
    /// protocol's assignments name topics by id).
    pub fn set_metadata(
        &mut self,
        now: Instant,
        counts: BTreeMap<String, i32>,
        racks: PartitionRacks,
        names: BTreeMap<Uuid, String>,
    ) {
        match self {
            Member::Classic(m) => {
                m.set_partition_racks(racks);
                m.set_topic_partitions(now, counts);
            }
            Member::Consumer(m) => m.set_topic_ids(now, names),
        }
    }
}
