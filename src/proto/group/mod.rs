//! The classic consumer-group protocol: the ConsumerProtocol encodings, the assignors,
//! the version-independent group messages and their wire codec, and the group member
//! as a state machine.

pub mod assignor;
pub mod codec;
pub mod consumer_member;
pub mod consumer_protocol;
pub mod member;
pub mod messages;
