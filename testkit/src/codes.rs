//! Kafka error codes and API keys, by name or by number, for
//! [`MockCluster`](crate::MockCluster)'s error injection and request tracking.

use std::ffi::{CStr, c_int};
use std::fmt;
use std::str::FromStr;

use anyhow::bail;
use rdkafka_sys::bindings as rd;

/// A Kafka error code to inject: a broker error (`16`, `NOT_COORDINATOR`) or one of
/// librdkafka's internal codes, which are negative (`-195`, `_TRANSPORT`: the broker
/// closes the connection instead of answering).
///
/// Give it as a number (`ErrorCode::from(16)`, or a bare `i16` wherever a method takes
/// `impl Into<ErrorCode>`), as a constant ([`ErrorCode::NOT_COORDINATOR`]), or by name
/// ([`ErrorCode::named`], or `"NOT_COORDINATOR".parse()`). The names are Kafka's for
/// broker errors (`UNKNOWN_TOPIC_OR_PARTITION`; librdkafka's older spellings such as
/// `UNKNOWN_TOPIC_OR_PART` are accepted too) and librdkafka's underscore-prefixed ones
/// for its internal codes (`_TRANSPORT`).
///
/// ```
/// use ottla_testkit::ErrorCode;
///
/// assert_eq!(ErrorCode::named("NOT_COORDINATOR")?, ErrorCode::from(16));
/// assert_eq!("rebalance_in_progress".parse::<ErrorCode>()?.code(), 27);
/// assert_eq!(ErrorCode::named("_TRANSPORT")?, ErrorCode::TRANSPORT);
/// assert_eq!(ErrorCode::from(25).name(), "UNKNOWN_MEMBER_ID");
/// assert!(ErrorCode::named("NO_SUCH_ERROR").is_err());
/// # Ok::<(), anyhow::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrorCode(pub i16);

impl ErrorCode {
    /// `-195`, librdkafka's `_TRANSPORT`: the broker closes the connection instead of
    /// answering the request.
    pub const TRANSPORT: ErrorCode = ErrorCode(-195);
    /// `0`: no error. Injected, it lets one request through before the next error.
    pub const NONE: ErrorCode = ErrorCode(0);
    /// `3`: the topic or partition is not on this broker.
    pub const UNKNOWN_TOPIC_OR_PARTITION: ErrorCode = ErrorCode(3);
    /// `6`: this broker does not lead the partition.
    pub const NOT_LEADER_OR_FOLLOWER: ErrorCode = ErrorCode(6);
    /// `7`: the request timed out on the broker.
    pub const REQUEST_TIMED_OUT: ErrorCode = ErrorCode(7);
    /// `14`: the group coordinator is still loading the group.
    pub const COORDINATOR_LOAD_IN_PROGRESS: ErrorCode = ErrorCode(14);
    /// `15`: there is no coordinator for the group.
    pub const COORDINATOR_NOT_AVAILABLE: ErrorCode = ErrorCode(15);
    /// `16`: this broker is not the group's coordinator.
    pub const NOT_COORDINATOR: ErrorCode = ErrorCode(16);
    /// `22`: the request's generation is not the group's.
    pub const ILLEGAL_GENERATION: ErrorCode = ErrorCode(22);
    /// `25`: the coordinator does not know the member id.
    pub const UNKNOWN_MEMBER_ID: ErrorCode = ErrorCode(25);
    /// `27`: the group is rebalancing; the member must rejoin.
    pub const REBALANCE_IN_PROGRESS: ErrorCode = ErrorCode(27);
    /// `29`: the client may not use the topic.
    pub const TOPIC_AUTHORIZATION_FAILED: ErrorCode = ErrorCode(29);
    /// `30`: the client may not use the group.
    pub const GROUP_AUTHORIZATION_FAILED: ErrorCode = ErrorCode(30);
    /// `82`: a static member's instance id is used by a newer member.
    pub const FENCED_INSTANCE_ID: ErrorCode = ErrorCode(82);
    /// `110`: the member's epoch is not the group's (KIP-848).
    pub const FENCED_MEMBER_EPOCH: ErrorCode = ErrorCode(110);

    /// The code named `name`, in any case: Kafka's name, or librdkafka's with or
    /// without its `RD_KAFKA_RESP_ERR_` prefix (`NOT_COORDINATOR`,
    /// `rebalance_in_progress`, `UNKNOWN_TOPIC_OR_PART`, `_TRANSPORT`). Fails for a name
    /// neither knows.
    pub fn named(name: &str) -> anyhow::Result<ErrorCode> {
        let wanted = name.trim();
        let wanted = wanted.strip_prefix("RD_KAFKA_RESP_ERR_").unwrap_or(wanted);
        let kafka = KAFKA_NAMES
            .iter()
            .find(|(_, known)| known.eq_ignore_ascii_case(wanted))
            .map(|&(code, _)| (code, String::new()));
        let found =
            kafka.or_else(|| error_descs().find(|(_, known)| known.eq_ignore_ascii_case(wanted)));
        match found {
            Some((code, _)) => Ok(ErrorCode(code)),
            None => bail!(
                "{name:?} is not an error name librdkafka knows (e.g. NOT_COORDINATOR, \
                 _TRANSPORT); give the code as a number instead"
            ),
        }
    }

    /// The number.
    pub fn code(self) -> i16 {
        self.0
    }

    /// The code's name: Kafka's for a broker error (`NOT_COORDINATOR`,
    /// `UNKNOWN_TOPIC_OR_PARTITION`), librdkafka's for an internal one (`_TRANSPORT`),
    /// or `ERR_<code>?` for a code neither names.
    pub fn name(self) -> String {
        if let Some((_, name)) = KAFKA_NAMES.iter().find(|&&(code, _)| code == self.0) {
            return (*name).to_string();
        }
        error_descs()
            .find(|&(code, _)| code == self.0)
            .map(|(_, name)| name)
            .unwrap_or_else(|| format!("ERR_{}?", self.0))
    }
}

impl From<i16> for ErrorCode {
    fn from(code: i16) -> ErrorCode {
        ErrorCode(code)
    }
}

impl FromStr for ErrorCode {
    type Err = anyhow::Error;

    /// A number (`"16"`, `"-195"`) or a name ([`ErrorCode::named`]).
    fn from_str(s: &str) -> anyhow::Result<ErrorCode> {
        match s.trim().parse::<i16>() {
            Ok(code) => Ok(ErrorCode(code)),
            Err(_) => ErrorCode::named(s),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Kafka's names where librdkafka's table spells them otherwise (librdkafka keeps the
/// names of older Kafka versions).
const KAFKA_NAMES: &[(i16, &str)] = &[
    (2, "CORRUPT_MESSAGE"),
    (3, "UNKNOWN_TOPIC_OR_PARTITION"),
    (4, "INVALID_FETCH_SIZE"),
    (6, "NOT_LEADER_OR_FOLLOWER"),
    (10, "MESSAGE_TOO_LARGE"),
    (11, "STALE_CONTROLLER_EPOCH"),
    (17, "INVALID_TOPIC_EXCEPTION"),
];

/// librdkafka's error table: `(code, name)` for every named entry.
fn error_descs() -> impl Iterator<Item = (i16, String)> {
    let mut descs: *const rd::rd_kafka_err_desc = std::ptr::null();
    let mut count: usize = 0;
    // SAFETY: the call stores a pointer to librdkafka's static table and its length.
    unsafe { rd::rd_kafka_get_err_descs(&mut descs, &mut count) };
    let table: &[rd::rd_kafka_err_desc] = if descs.is_null() {
        &[]
    } else {
        // SAFETY: a static array of `count` entries, never freed.
        unsafe { std::slice::from_raw_parts(descs, count) }
    };
    table.iter().filter_map(|d| {
        if d.name.is_null() {
            return None;
        }
        // The table has gaps (zeroed entries, skipped above by their NULL name). The
        // code is read as the C `int` it is, never as the Rust enum.
        // SAFETY: `d` is a live entry; `code` is a C enum, i.e. an `int`.
        let code = unsafe { std::ptr::addr_of!(d.code).cast::<c_int>().read() };
        let code = i16::try_from(code).ok()?;
        // SAFETY: a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(d.name) }
            .to_string_lossy()
            .into_owned();
        Some((code, name))
    })
}

/// Kafka API keys (the request kinds), for [`MockCluster`](crate::MockCluster)'s
/// per-API methods and for reading [`TrackedRequest::api_key`](crate::TrackedRequest).
/// Any other key works as a plain number; kafka-protocol users can also write
/// `ApiKey::JoinGroup as i16`.
pub mod api_key {
    /// Produce.
    pub const PRODUCE: i16 = 0;
    /// Fetch.
    pub const FETCH: i16 = 1;
    /// ListOffsets.
    pub const LIST_OFFSETS: i16 = 2;
    /// Metadata.
    pub const METADATA: i16 = 3;
    /// OffsetCommit.
    pub const OFFSET_COMMIT: i16 = 8;
    /// OffsetFetch.
    pub const OFFSET_FETCH: i16 = 9;
    /// FindCoordinator.
    pub const FIND_COORDINATOR: i16 = 10;
    /// JoinGroup.
    pub const JOIN_GROUP: i16 = 11;
    /// Heartbeat.
    pub const HEARTBEAT: i16 = 12;
    /// LeaveGroup.
    pub const LEAVE_GROUP: i16 = 13;
    /// SyncGroup.
    pub const SYNC_GROUP: i16 = 14;
    /// SaslHandshake.
    pub const SASL_HANDSHAKE: i16 = 17;
    /// ApiVersions.
    pub const API_VERSIONS: i16 = 18;
    /// CreateTopics.
    pub const CREATE_TOPICS: i16 = 19;
    /// InitProducerId.
    pub const INIT_PRODUCER_ID: i16 = 22;
    /// AddPartitionsToTxn.
    pub const ADD_PARTITIONS_TO_TXN: i16 = 24;
    /// AddOffsetsToTxn.
    pub const ADD_OFFSETS_TO_TXN: i16 = 25;
    /// EndTxn.
    pub const END_TXN: i16 = 26;
    /// TxnOffsetCommit.
    pub const TXN_OFFSET_COMMIT: i16 = 28;
    /// SaslAuthenticate.
    pub const SASL_AUTHENTICATE: i16 = 36;
    /// ConsumerGroupHeartbeat (KIP-848).
    pub const CONSUMER_GROUP_HEARTBEAT: i16 = 68;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every constant carries the number its name has in librdkafka's table (or in
    /// Kafka's, where librdkafka spells it otherwise), both ways.
    #[test]
    fn constants_match_their_names() -> anyhow::Result<()> {
        let constants = [
            (ErrorCode::TRANSPORT, "_TRANSPORT"),
            (ErrorCode::NONE, "NO_ERROR"),
            (
                ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                "UNKNOWN_TOPIC_OR_PARTITION",
            ),
            (ErrorCode::NOT_LEADER_OR_FOLLOWER, "NOT_LEADER_OR_FOLLOWER"),
            (ErrorCode::REQUEST_TIMED_OUT, "REQUEST_TIMED_OUT"),
            (
                ErrorCode::COORDINATOR_LOAD_IN_PROGRESS,
                "COORDINATOR_LOAD_IN_PROGRESS",
            ),
            (
                ErrorCode::COORDINATOR_NOT_AVAILABLE,
                "COORDINATOR_NOT_AVAILABLE",
            ),
            (ErrorCode::NOT_COORDINATOR, "NOT_COORDINATOR"),
            (ErrorCode::ILLEGAL_GENERATION, "ILLEGAL_GENERATION"),
            (ErrorCode::UNKNOWN_MEMBER_ID, "UNKNOWN_MEMBER_ID"),
            (ErrorCode::REBALANCE_IN_PROGRESS, "REBALANCE_IN_PROGRESS"),
            (
                ErrorCode::TOPIC_AUTHORIZATION_FAILED,
                "TOPIC_AUTHORIZATION_FAILED",
            ),
            (
                ErrorCode::GROUP_AUTHORIZATION_FAILED,
                "GROUP_AUTHORIZATION_FAILED",
            ),
            (ErrorCode::FENCED_INSTANCE_ID, "FENCED_INSTANCE_ID"),
            (ErrorCode::FENCED_MEMBER_EPOCH, "FENCED_MEMBER_EPOCH"),
        ];
        for (code, name) in constants {
            assert_eq!(code.name(), name, "{}", code.0);
            assert_eq!(ErrorCode::named(name)?, code, "{name}");
        }
        Ok(())
    }

    /// librdkafka's spellings and its prefix are accepted; Kafka's names win in
    /// `name()`; no alias names a code librdkafka gives another name to.
    #[test]
    fn librdkafka_spellings_are_accepted() -> anyhow::Result<()> {
        assert_eq!(ErrorCode::named("UNKNOWN_TOPIC_OR_PART")?.0, 3);
        assert_eq!(
            ErrorCode::named("RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION")?.0,
            6
        );
        assert_eq!(ErrorCode::named("RD_KAFKA_RESP_ERR__TRANSPORT")?.0, -195);
        assert_eq!(ErrorCode::from(10).name(), "MESSAGE_TOO_LARGE");
        for &(code, kafka) in KAFKA_NAMES {
            let other = error_descs().find(|(_, n)| n.eq_ignore_ascii_case(kafka));
            assert_eq!(other, None, "{kafka} is also librdkafka's name");
            assert!(
                error_descs().any(|(c, _)| c == code),
                "librdkafka has no entry for {code}"
            );
        }
        Ok(())
    }

    #[test]
    fn numbers_parse_and_unknown_names_fail() {
        assert_eq!("-195".parse::<ErrorCode>().ok(), Some(ErrorCode::TRANSPORT));
        assert_eq!(" 27 ".parse::<ErrorCode>().ok(), Some(ErrorCode(27)));
        assert!("NOT_A_KAFKA_ERROR".parse::<ErrorCode>().is_err());
        assert!("".parse::<ErrorCode>().is_err());
        assert_eq!(ErrorCode(9999).name(), "ERR_9999?");
        assert_eq!(ErrorCode(16).to_string(), "NOT_COORDINATOR (16)");
    }
}
