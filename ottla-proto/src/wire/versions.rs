//! ApiVersions negotiation: what ottla implements, what the broker offers, and the
//! version chosen for each API on one connection.

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::StrBytes;

use super::codec::decode_response;
use super::{NegotiationError, WireError};

/// The versions of each API that ottla's code implements, ordered by API key.
///
/// A version appears here only when every field ottla sends or reads at that version
/// is handled. Negotiation never picks a version outside these ranges.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    // The group APIs (`proto::group::codec::GROUP_APIS`).
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::FindCoordinator, 0, 6),
    // v1 adds the rebalance timeout, which ottla always sends.
    (ApiKey::JoinGroup, 1, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    // KIP-848's consumer group protocol; v1 is the first where the client makes its
    // member id (KIP-1082) and the first with the regex subscription.
    (ApiKey::ConsumerGroupHeartbeat, 1, 1),
    // kafka-protocol starts at v4; from v13 topics are named by id; v17 only adds
    // follower fields.
    (ApiKey::Fetch, 4, 16),
    // v1 answers one offset per partition; v4 adds the leader epoch both ways.
    (ApiKey::ListOffsets, 1, 9),
    // v3 is the first with v2 record batches; v13 names topics by id.
    (ApiKey::Produce, 3, 12),
    // v0 is enough for an idempotent producer; v3 adds epoch bumps (KIP-360).
    (ApiKey::InitProducerId, 0, 4),
    // v1 is the first where a null topic list means "all topics".
    (ApiKey::Metadata, 1, 13),
    // SASL (KIP-43): v1 of the handshake frames the mechanism's messages in
    // SaslAuthenticate (KIP-152), whose v1 adds the session lifetime (KIP-368). v0 of
    // the handshake is the fallback for brokers without SaslAuthenticate.
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    // v4 has the v3 schema; asking for it first exercises the UNSUPPORTED_VERSION
    // fallback on brokers that stop at v3.
    (ApiKey::ApiVersions, 0, 4),
    // The admin client, last: the fuzz seeds select an API by its index here
    // (fuzz/src/response.rs), and appending keeps the committed seeds' meaning.
    // The admin client (`ottla::admin`, `ottla_proto::admin`). CreateTopics starts at v2 in
    // kafka-protocol (v1 adds validate_only, which ottla sends); DeleteTopics names
    // topics in `topics` from v6; DescribeConfigs v1 is the first with config sources.
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::CreatePartitions, 0, 3),
    // ListGroups v4 adds the group's state to each listing.
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::OffsetDelete, 0, 0),
    // The transactional producer (`ottla_proto::produce::transaction`). A client
    // sends AddPartitionsToTxn at v3 or below (v4 batches transactions, for brokers
    // verifying KIP-890). TxnOffsetCommit starts at v3, the first that carries the
    // group metadata (KIP-447, Kafka 2.5), which ottla always sends: Java refuses
    // older versions with group metadata too. AddOffsetsToTxn, TxnOffsetCommit and
    // EndTxn stop before v4 and v5, which announce KIP-890's TRANSACTION_ABORTABLE and
    // the epoch bump on every commit.
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 3, 3),
    (ApiKey::EndTxn, 0, 3),
];

/// An inclusive range of versions, printed as `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRangeDisplay {
    /// Lowest version.
    pub min: i16,
    /// Highest version.
    pub max: i16,
}

impl fmt::Display for VersionRangeDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}..=v{}", self.min, self.max)
    }
}

/// The outcome of negotiation with one broker: the version chosen per API, next to
/// ottla's and the broker's ranges.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VersionTable {
    entries: BTreeMap<i16, Entry>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    ours: VersionRangeDisplay,
    broker: Option<VersionRangeDisplay>,
    chosen: Option<i16>,
}

/// One row of a [`VersionTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRow {
    /// The API.
    pub api: ApiKey,
    /// What ottla implements.
    pub ours: VersionRangeDisplay,
    /// What the broker offers, if anything.
    pub broker: Option<VersionRangeDisplay>,
    /// The highest common version, if any.
    pub chosen: Option<i16>,
}

impl VersionTable {
    /// The version to use for `api`, if the two sides share one.
    pub fn version(&self, api: ApiKey) -> Option<i16> {
        self.entries.get(&(api as i16)).and_then(|e| e.chosen)
    }

    /// Chooses at most `max` for `api`, if that is a version both sides support; then
    /// returns the version chosen now. Otherwise the table is left as it is and `None`
    /// returned. For a broker that advertises a version it cannot parse (it hangs up on
    /// every request at that version; `driver::connection` counts them).
    pub fn cap(&mut self, api: ApiKey, max: i16) -> Option<i16> {
        let entry = self.entries.get_mut(&(api as i16))?;
        let (chosen, broker) = (entry.chosen?, entry.broker?);
        let capped = chosen.min(max);
        if capped < entry.ours.min.max(broker.min) {
            return None;
        }
        entry.chosen = Some(capped);
        Some(capped)
    }

    /// The range the broker advertised for `api`.
    pub fn broker_range(&self, api: ApiKey) -> Option<VersionRangeDisplay> {
        self.entries.get(&(api as i16)).and_then(|e| e.broker)
    }

    /// Every API ottla implements, with both ranges and the choice.
    pub fn rows(&self) -> impl Iterator<Item = VersionRow> + '_ {
        self.entries.iter().filter_map(|(key, e)| {
            Some(VersionRow {
                api: ApiKey::try_from(*key).ok()?,
                ours: e.ours,
                broker: e.broker,
                chosen: e.chosen,
            })
        })
    }

    /// Checks that every API in `required` has a common version.
    pub fn require(&self, required: &[ApiKey]) -> Result<(), NegotiationError> {
        for api in required {
            let Some(entry) = self.entries.get(&(*api as i16)) else {
                // An API ottla does not implement can never be required of a broker.
                return Err(NegotiationError::Missing {
                    api: *api,
                    ours: VersionRangeDisplay { min: 0, max: -1 },
                });
            };
            match (entry.broker, entry.chosen) {
                (_, Some(_)) => {}
                (None, None) => {
                    return Err(NegotiationError::Missing {
                        api: *api,
                        ours: entry.ours,
                    });
                }
                (Some(broker), None) => {
                    return Err(NegotiationError::Disjoint {
                        api: *api,
                        ours: entry.ours,
                        broker,
                    });
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for VersionTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:<18} {:<12} {:<12} chosen", "api", "ottla", "broker")?;
        for row in self.rows() {
            let broker = row
                .broker
                .map(|b| b.to_string())
                .unwrap_or_else(|| "-".into());
            let chosen = row
                .chosen
                .map(|v| format!("v{v}"))
                .unwrap_or_else(|| "none".into());
            writeln!(
                f,
                "{:<18} {:<12} {:<12} {}",
                format!("{:?}", row.api),
                row.ours.to_string(),
                broker,
                chosen
            )?;
        }
        Ok(())
    }
}

/// Picks, for each API ottla implements, the highest version both sides support, then
/// checks the `required` APIs.
pub fn negotiate(
    broker: &ApiVersionsResponse,
    required: &[ApiKey],
) -> Result<VersionTable, NegotiationError> {
    let offered: BTreeMap<i16, VersionRangeDisplay> = broker
        .api_keys
        .iter()
        .map(|k| {
            (
                k.api_key,
                VersionRangeDisplay {
                    min: k.min_version,
                    max: k.max_version,
                },
            )
        })
        .collect();
    let mut table = VersionTable::default();
    for &(api, min, max) in SUPPORTED {
        let ours = VersionRangeDisplay { min, max };
        let broker = offered.get(&(api as i16)).copied();
        let chosen = broker.and_then(|b| {
            let hi = b.max.min(max);
            (hi >= b.min.max(min)).then_some(hi)
        });
        table.entries.insert(
            api as i16,
            Entry {
                ours,
                broker,
                chosen,
            },
        );
    }
    table.require(required)?;
    Ok(table)
}

/// The ApiVersions request at `version`, with ottla's name and version for v3+.
pub fn api_versions_request(version: i16) -> ApiVersionsRequest {
    let mut req = ApiVersionsRequest::default();
    if version >= 3 {
        req = req
            .with_client_software_name(StrBytes::from_static_str("ottla"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
    }
    req
}

/// What to do after an ApiVersions response.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiVersionsOutcome {
    /// The broker answered; negotiate with this.
    Done(ApiVersionsResponse),
    /// The broker does not speak the version sent; ask again at this version.
    Retry {
        /// The version to send next.
        version: i16,
    },
}

const UNSUPPORTED_VERSION: i16 = 35;

/// Interprets an ApiVersions response body to a request sent at `sent`.
///
/// On UNSUPPORTED_VERSION the protocol says the broker answers with a v0 body that lists
/// its ApiVersions range. Not every broker does (the librdkafka mock cluster sends a
/// flexible array instead), so only the error code, which comes first in every layout,
/// is trusted; the range is used when the body parses as v0, else ottla falls back to v0.
/// The throttle time of an error reply is never read.
pub fn handle_api_versions_response(
    sent: i16,
    body: Bytes,
) -> Result<ApiVersionsOutcome, WireError> {
    let code = match body.get(..2) {
        Some(b) => i16::from_be_bytes([b[0], b[1]]),
        None => {
            return Err(WireError::Decode {
                api: ApiKey::ApiVersions,
                version: sent,
                message: "body shorter than an error code".into(),
            });
        }
    };
    if code == UNSUPPORTED_VERSION {
        if sent == 0 {
            return Err(WireError::Decode {
                api: ApiKey::ApiVersions,
                version: 0,
                message: "broker refuses ApiVersions v0".into(),
            });
        }
        let broker_max = v0_api_versions_max(&body).unwrap_or(0);
        return Ok(ApiVersionsOutcome::Retry {
            version: broker_max.clamp(0, sent - 1),
        });
    }
    let response = decode_response::<ApiVersionsResponse>(ApiKey::ApiVersions, sent, body)?;
    Ok(ApiVersionsOutcome::Done(response))
}

/// Reads the ApiVersions entry of a v0 ApiVersions body by hand, checking the array
/// count against the bytes present before trusting it (a garbage count must not turn
/// into a huge allocation).
fn v0_api_versions_max(body: &[u8]) -> Option<i16> {
    let count = i32::from_be_bytes(body.get(2..6)?.try_into().ok()?);
    let count = usize::try_from(count).ok()?;
    let entries = body.get(6..)?;
    if entries.len() != count.checked_mul(6)? {
        return None;
    }
    entries.chunks_exact(6).find_map(|e| {
        let key = i16::from_be_bytes([e[0], e[1]]);
        (key == ApiKey::ApiVersions as i16).then(|| i16::from_be_bytes([e[4], e[5]]))
    })
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, BytesMut};
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::protocol::Encodable;

    use super::*;

    fn broker(apis: &[(ApiKey, i16, i16)]) -> ApiVersionsResponse {
        ApiVersionsResponse::default().with_api_keys(
            apis.iter()
                .map(|&(k, min, max)| {
                    ApiVersion::default()
                        .with_api_key(k as i16)
                        .with_min_version(min)
                        .with_max_version(max)
                })
                .collect(),
        )
    }

    #[test]
    fn picks_highest_common_version() {
        let table = negotiate(
            &broker(&[(ApiKey::Metadata, 0, 9), (ApiKey::ApiVersions, 0, 3)]),
            &[ApiKey::Metadata],
        )
        .unwrap();
        assert_eq!(table.version(ApiKey::Metadata), Some(9));
        assert_eq!(table.version(ApiKey::ApiVersions), Some(3));
    }

    #[test]
    fn a_cap_holds_only_within_both_ranges() {
        let mut table = negotiate(&broker(&[(ApiKey::JoinGroup, 0, 6)]), &[]).unwrap();
        assert_eq!(table.version(ApiKey::JoinGroup), Some(6));
        assert_eq!(table.cap(ApiKey::JoinGroup, 5), Some(5));
        assert_eq!(table.version(ApiKey::JoinGroup), Some(5));
        // ottla's JoinGroup starts at v1: v0 is below what both sides share.
        assert_eq!(table.cap(ApiKey::JoinGroup, 0), None);
        assert_eq!(table.version(ApiKey::JoinGroup), Some(5));
        // A cap above the choice changes nothing; an API the broker lacks has none.
        assert_eq!(table.cap(ApiKey::JoinGroup, 9), Some(5));
        assert_eq!(table.cap(ApiKey::SyncGroup, 3), None);
    }

    #[test]
    fn missing_required_api_names_it() {
        let err =
            negotiate(&broker(&[(ApiKey::ApiVersions, 0, 3)]), &[ApiKey::Metadata]).unwrap_err();
        assert_eq!(
            err,
            NegotiationError::Missing {
                api: ApiKey::Metadata,
                ours: VersionRangeDisplay { min: 1, max: 13 }
            }
        );
        assert!(err.to_string().contains("Metadata"));
    }

    #[test]
    fn disjoint_ranges_name_both() {
        let err =
            negotiate(&broker(&[(ApiKey::Metadata, 14, 20)]), &[ApiKey::Metadata]).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("v1..=v13") && msg.contains("v14..=v20"),
            "{msg}"
        );
    }

    #[test]
    fn unsupported_version_with_v0_body_retries_at_broker_max() {
        let mut body = BytesMut::new();
        broker(&[(ApiKey::ApiVersions, 0, 2)])
            .with_error_code(UNSUPPORTED_VERSION)
            .encode(&mut body, 0)
            .unwrap();
        let outcome = handle_api_versions_response(4, body.freeze()).unwrap();
        assert_eq!(outcome, ApiVersionsOutcome::Retry { version: 2 });
    }

    #[test]
    fn unsupported_version_with_garbage_body_falls_back_to_v0() {
        // The librdkafka mock's layout: error code, then a compact array count, then
        // entries that do not parse as v0. A huge throttle time hides in there too.
        let mut body = BytesMut::new();
        body.put_i16(UNSUPPORTED_VERSION);
        body.put_u8(2);
        body.put_slice(&[0, 18, 0, 0, 0, 3, 0, 0x7f, 0xff, 0xff, 0xff]);
        let outcome = handle_api_versions_response(4, body.freeze()).unwrap();
        assert_eq!(outcome, ApiVersionsOutcome::Retry { version: 0 });
    }

    #[test]
    fn unsupported_at_v0_is_an_error_not_a_loop() {
        let mut body = BytesMut::new();
        body.put_i16(UNSUPPORTED_VERSION);
        assert!(handle_api_versions_response(0, body.freeze()).is_err());
    }
}
