//! Request headers, correlation ids and the in-flight queue of one connection.

use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use super::frame::FrameDecoder;
use crate::wire::WireError;

/// The correlation id of one request on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CorrelationId(pub i32);

/// A request written to the connection whose response has not arrived yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    /// The id the response must carry.
    pub correlation_id: CorrelationId,
    /// The API of the request.
    pub api: ApiKey,
    /// The version it was encoded with; the response uses the same version.
    pub version: i16,
}

/// A response matched to its request, with the header stripped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseFrame {
    /// The request it answers.
    pub request: InFlight,
    /// The response body, to be decoded at `request.version` with [`decode_response`].
    pub body: Bytes,
}

/// One connection's protocol state: the next correlation id, the queue of requests
/// awaiting responses, and the frame decoder.
///
/// Kafka answers requests on a connection strictly in order, so a response must answer
/// the oldest in-flight request; anything else is a desync and poisons the connection.
///
/// One exception is tolerated: an answer to a request sent without expecting one
/// (Produce with `acks = 0`). Kafka never sends it, but some Kafka-compatible brokers do
/// (tansu 0.6 answers every Produce). Such an answer is recognised by its correlation
/// id and dropped; treating it as a desync would drop the connection and, with it, every
/// `acks = 0` request the broker had not read yet.
#[derive(Debug)]
pub struct Codec {
    client_id: Option<StrBytes>,
    next_correlation_id: i32,
    in_flight: VecDeque<InFlight>,
    /// Requests sent without expecting an answer, oldest first, at most
    /// [`UNANSWERED_REMEMBERED`]; they are forgotten once a later request is answered.
    unanswered: VecDeque<CorrelationId>,
    /// Answers to `unanswered` requests that arrived and were dropped.
    dropped_answers: u64,
    frames: FrameDecoder,
}

/// How many requests sent without expecting an answer a codec remembers, so that a
/// broker answering them anyway is not taken for a desync. A broker that does answer
/// them answers in order, long before this many are outstanding.
pub const UNANSWERED_REMEMBERED: usize = 1024;

/// Whether correlation id `a` was handed out before `b` (ids wrap at 2^31).
fn sent_before(a: i32, b: i32) -> bool {
    let distance = b.wrapping_sub(a) & i32::MAX;
    distance != 0 && distance < 1 << 30
}

impl Codec {
    /// A codec that sends `client_id` in every request header and refuses response frames
    /// over `max_frame_size` bytes.
    pub fn new(client_id: Option<&str>, max_frame_size: usize) -> Self {
        Self {
            client_id: client_id.map(|c| StrBytes::from_string(c.to_string())),
            next_correlation_id: 0,
            in_flight: VecDeque::new(),
            unanswered: VecDeque::new(),
            dropped_answers: 0,
            frames: FrameDecoder::new(max_frame_size),
        }
    }

    /// The largest response frame accepted.
    pub fn max_frame_size(&self) -> usize {
        self.frames.max_frame_size()
    }

    /// How many requests await a response.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The oldest request awaiting a response.
    pub fn oldest(&self) -> Option<&InFlight> {
        self.in_flight.front()
    }

    /// How many answers to requests sent without expecting one (`acks = 0`) arrived
    /// and were dropped.
    pub fn dropped_answers(&self) -> u64 {
        self.dropped_answers
    }

    /// Appends `[length][header][body]` for `body` at `version` to `out`.
    ///
    /// `expects_response` is false only for a Produce with `acks = 0`, which Kafka never
    /// answers (an answer that comes anyway is dropped, see [`Codec`]). On error, `out`
    /// is left as it was.
    pub fn encode_request<R: Encodable>(
        &mut self,
        api: ApiKey,
        version: i16,
        body: &R,
        expects_response: bool,
        out: &mut BytesMut,
    ) -> Result<CorrelationId, WireError> {
        let start = out.len();
        let result = self.encode_into(api, version, expects_response, out, |out| {
            body.encode(out, version)
        });
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    /// Like [`Codec::encode_request`] for a body already encoded at `version`
    /// (see [`encode_body`]).
    pub fn encode_raw(
        &mut self,
        api: ApiKey,
        version: i16,
        body: &[u8],
        expects_response: bool,
        out: &mut BytesMut,
    ) -> Result<CorrelationId, WireError> {
        let start = out.len();
        let result = self.encode_into(api, version, expects_response, out, |out| {
            out.put_slice(body);
            Ok(())
        });
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    /// Takes the next complete response off the front of `buf`, if there is one, and
    /// matches it to the oldest in-flight request.
    ///
    /// Any error means the stream is out of step: drop the connection and fail every
    /// request still in flight ([`Codec::take_in_flight`]).
    pub fn decode_frame(&mut self, buf: &mut BytesMut) -> Result<Option<ResponseFrame>, WireError> {
        while let Some(frame) = self.frames.decode(buf)? {
            if let Some(response) = self.handle_frame(frame)? {
                return Ok(Some(response));
            }
        }
        Ok(None)
    }

    /// Matches one response frame (without its length prefix) to the oldest in-flight
    /// request and strips its header. `None`: the frame answered a request sent without
    /// expecting an answer, and was dropped.
    pub fn handle_frame(&mut self, mut frame: Bytes) -> Result<Option<ResponseFrame>, WireError> {
        // The correlation id is the first field of every response header version.
        if frame.len() < 4 {
            return Err(WireError::InvalidFrameLength {
                length: frame.len() as i32,
            });
        }
        let got = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
        if self.in_flight.front().map(|o| o.correlation_id.0) != Some(got) {
            if let Some(at) = self.unanswered.iter().position(|c| c.0 == got) {
                // Earlier unanswered requests will not be answered now: answers come
                // in order.
                self.unanswered.drain(..=at);
                self.dropped_answers += 1;
                return Ok(None);
            }
        }
        let Some(oldest) = self.in_flight.front() else {
            return Err(WireError::Unsolicited {
                correlation_id: got,
            });
        };
        if oldest.correlation_id.0 != got {
            return Err(WireError::CorrelationMismatch {
                expected: oldest.correlation_id.0,
                got,
                api: oldest.api,
            });
        }
        let header_version = oldest.api.response_header_version(oldest.version);
        ResponseHeader::decode(&mut frame, header_version).map_err(|e| WireError::Decode {
            api: oldest.api,
            version: oldest.version,
            message: format!("response header: {e}"),
        })?;
        let request = self.in_flight.pop_front().ok_or(WireError::Unsolicited {
            correlation_id: got,
        })?;
        while self
            .unanswered
            .front()
            .is_some_and(|c| sent_before(c.0, got))
        {
            self.unanswered.pop_front();
        }
        Ok(Some(ResponseFrame {
            request,
            body: frame,
        }))
    }

    /// Removes and returns every in-flight request, oldest first, so the driver can fail
    /// them when the connection is dropped.
    pub fn take_in_flight(&mut self) -> Vec<InFlight> {
        self.in_flight.drain(..).collect()
    }

    fn encode_into(
        &mut self,
        api: ApiKey,
        version: i16,
        expects_response: bool,
        out: &mut BytesMut,
        body: impl FnOnce(&mut BytesMut) -> anyhow::Result<()>,
    ) -> Result<CorrelationId, WireError> {
        let encode_err = |e: anyhow::Error| WireError::Encode {
            api,
            version,
            message: e.to_string(),
        };
        let correlation_id = CorrelationId(self.next_correlation_id);
        let header = RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id.0)
            .with_client_id(self.client_id.clone());
        let start = out.len();
        out.put_i32(0); // length, patched below
        header
            .encode(out, api.request_header_version(version))
            .map_err(encode_err)?;
        body(out).map_err(encode_err)?;
        let length = out.len() - start - 4;
        let length = i32::try_from(length).map_err(|_| WireError::Encode {
            api,
            version,
            message: format!("request of {length} bytes does not fit a frame"),
        })?;
        out[start..start + 4].copy_from_slice(&length.to_be_bytes());

        // Correlation ids stay non-negative and wrap; a connection never has 2^31
        // requests in flight, so a wrapped id cannot collide with a live one.
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1) & i32::MAX;
        if expects_response {
            self.in_flight.push_back(InFlight {
                correlation_id,
                api,
                version,
            });
        } else {
            if self.unanswered.len() == UNANSWERED_REMEMBERED {
                self.unanswered.pop_front();
            }
            self.unanswered.push_back(correlation_id);
        }
        Ok(correlation_id)
    }
}

/// Encodes a request body (no header) at `version`.
pub fn encode_body<R: Encodable>(api: ApiKey, body: &R, version: i16) -> Result<Bytes, WireError> {
    let mut out = BytesMut::new();
    body.encode(&mut out, version)
        .map_err(|e| WireError::Encode {
            api,
            version,
            message: e.to_string(),
        })?;
    Ok(out.freeze())
}

/// Decodes a response body at `version`. The body must be consumed exactly: trailing
/// bytes mean the two sides disagree on the schema, which is an error, not noise.
pub fn decode_response<R: Decodable>(
    api: ApiKey,
    version: i16,
    mut body: Bytes,
) -> Result<R, WireError> {
    let response = R::decode(&mut body, version).map_err(|e| WireError::Decode {
        api,
        version,
        message: e.to_string(),
    })?;
    // The librdkafka mock cluster ends flexible Metadata responses with one extra empty
    // tagged-field block (a single 0x00). It carries no data, so it is accepted; any
    // other leftover is a schema disagreement.
    if body.remaining() == 1 && body[0] == 0 && is_flexible_response(api, version) {
        tracing::trace!(
            ?api,
            version,
            "ignored one trailing empty tagged-field block"
        );
        return Ok(response);
    }
    if body.has_remaining() {
        return Err(WireError::TrailingBytes {
            api,
            version,
            remaining: body.remaining(),
        });
    }
    Ok(response)
}

/// Whether `api` at `version` uses the flexible (tagged-field) encoding. ApiVersions
/// keeps response header v0 for bootstrapping but its body is flexible from v3.
fn is_flexible_response(api: ApiKey, version: i16) -> bool {
    api.response_header_version(version) >= 1 || (api == ApiKey::ApiVersions && version >= 3)
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};

    use super::*;

    fn response_bytes(correlation_id: i32, body: &MetadataResponse, version: i16) -> BytesMut {
        let mut inner = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(correlation_id)
            .encode(
                &mut inner,
                ApiKey::Metadata.response_header_version(version),
            )
            .unwrap();
        body.encode(&mut inner, version).unwrap();
        let mut out = BytesMut::new();
        out.put_i32(inner.len() as i32);
        out.extend_from_slice(&inner);
        out
    }

    #[test]
    fn request_frame_carries_header_and_length() {
        let mut codec = Codec::new(Some("ottla-test"), 1 << 20);
        let mut out = BytesMut::new();
        let id = codec
            .encode_request(
                ApiKey::Metadata,
                12,
                &MetadataRequest::default(),
                true,
                &mut out,
            )
            .unwrap();
        assert_eq!(id, CorrelationId(0));
        let mut frame = out.clone();
        let length = frame.get_i32() as usize;
        assert_eq!(length, frame.len());
        let header =
            kafka_protocol::protocol::decode_request_header_from_buffer(&mut frame).unwrap();
        assert_eq!(header.request_api_key, 3);
        assert_eq!(header.request_api_version, 12);
        assert_eq!(header.client_id.as_deref(), Some("ottla-test"));
        assert_eq!(codec.in_flight(), 1);
    }

    #[test]
    fn responses_match_in_order_and_mismatch_is_typed() {
        let mut codec = Codec::new(None, 1 << 20);
        let mut out = BytesMut::new();
        for _ in 0..2 {
            codec
                .encode_request(
                    ApiKey::Metadata,
                    9,
                    &MetadataRequest::default(),
                    true,
                    &mut out,
                )
                .unwrap();
        }
        let mut input = response_bytes(0, &MetadataResponse::default(), 9);
        let frame = codec.decode_frame(&mut input).unwrap().unwrap();
        assert_eq!(frame.request.correlation_id, CorrelationId(0));
        let _: MetadataResponse = decode_response(ApiKey::Metadata, 9, frame.body).unwrap();

        let mut wrong = response_bytes(7, &MetadataResponse::default(), 9);
        assert_eq!(
            codec.decode_frame(&mut wrong).unwrap_err(),
            WireError::CorrelationMismatch {
                expected: 1,
                got: 7,
                api: ApiKey::Metadata
            }
        );
    }

    /// Encodes one Metadata request; `answered = false` stands for a Produce with
    /// `acks = 0` (the codec only looks at the flag).
    fn send(codec: &mut Codec, answered: bool) -> i32 {
        codec
            .encode_request(
                ApiKey::Metadata,
                9,
                &MetadataRequest::default(),
                answered,
                &mut BytesMut::new(),
            )
            .unwrap()
            .0
    }

    /// tansu 0.6 answers every Produce, `acks = 0` included. Those answers used to be
    /// "unsolicited", which dropped the connection and lost the `acks = 0` requests the
    /// broker had not read yet.
    #[test]
    fn answers_to_unanswered_requests_are_dropped_and_the_stream_stays_in_step() {
        let mut codec = Codec::new(None, 1 << 20);
        let silent = send(&mut codec, false);
        let asked = send(&mut codec, true);
        let silent_again = send(&mut codec, false);
        let mut input = BytesMut::new();
        for id in [silent, asked, silent_again] {
            input.extend_from_slice(&response_bytes(id, &MetadataResponse::default(), 9));
        }
        let frame = codec.decode_frame(&mut input).unwrap().unwrap();
        assert_eq!(frame.request.correlation_id, CorrelationId(asked));
        assert_eq!(codec.decode_frame(&mut input).unwrap(), None);
        assert!(input.is_empty());
        assert_eq!(codec.dropped_answers(), 2);
        assert!(codec.unanswered.is_empty());
        // A request that was asked for still has to be answered in order.
        let next = send(&mut codec, true);
        let mut wrong = response_bytes(next + 5, &MetadataResponse::default(), 9);
        assert_eq!(
            codec.decode_frame(&mut wrong).unwrap_err(),
            WireError::CorrelationMismatch {
                expected: next,
                got: next + 5,
                api: ApiKey::Metadata
            }
        );
    }

    /// Kafka never answers `acks = 0`: an answered request later in the stream makes
    /// the codec forget the silent ones before it, and a late "answer" to one of them is
    /// a desync again.
    #[test]
    fn silent_requests_are_forgotten_once_a_later_request_is_answered() {
        let mut codec = Codec::new(None, 1 << 20);
        let silent = send(&mut codec, false);
        let asked = send(&mut codec, true);
        let mut input = response_bytes(asked, &MetadataResponse::default(), 9);
        assert!(codec.decode_frame(&mut input).unwrap().is_some());
        assert!(codec.unanswered.is_empty());
        let mut late = response_bytes(silent, &MetadataResponse::default(), 9);
        assert_eq!(
            codec.decode_frame(&mut late).unwrap_err(),
            WireError::Unsolicited {
                correlation_id: silent
            }
        );
    }

    #[test]
    fn silent_requests_are_remembered_within_a_bound() {
        let mut codec = Codec::new(None, 1 << 20);
        let ids: Vec<i32> = (0..3 * UNANSWERED_REMEMBERED)
            .map(|_| send(&mut codec, false))
            .collect();
        assert_eq!(codec.unanswered.len(), UNANSWERED_REMEMBERED);
        let newest = *ids.last().unwrap();
        let mut input = response_bytes(newest, &MetadataResponse::default(), 9);
        assert_eq!(codec.decode_frame(&mut input).unwrap(), None);
        assert_eq!(codec.dropped_answers(), 1);
    }

    #[test]
    fn sent_before_follows_wrapping_ids() {
        assert!(sent_before(1, 2));
        assert!(!sent_before(2, 1));
        assert!(!sent_before(5, 5));
        assert!(sent_before(i32::MAX, 0));
        assert!(!sent_before(0, i32::MAX));
    }

    #[test]
    fn unsolicited_response_is_typed() {
        let mut codec = Codec::new(None, 1 << 20);
        let mut input = response_bytes(3, &MetadataResponse::default(), 9);
        assert_eq!(
            codec.decode_frame(&mut input).unwrap_err(),
            WireError::Unsolicited { correlation_id: 3 }
        );
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        let mut body = BytesMut::new();
        MetadataResponse::default().encode(&mut body, 9).unwrap();
        body.put_u8(0xff); // non-zero: never tolerated
        let err =
            decode_response::<MetadataResponse>(ApiKey::Metadata, 9, body.freeze()).unwrap_err();
        assert_eq!(
            err,
            WireError::TrailingBytes {
                api: ApiKey::Metadata,
                version: 9,
                remaining: 1
            }
        );
    }

    #[test]
    fn one_trailing_empty_tag_block_is_tolerated_on_flexible_versions_only() {
        // Seen from the librdkafka mock cluster on Metadata v9+.
        let mut body = BytesMut::new();
        MetadataResponse::default().encode(&mut body, 12).unwrap();
        body.put_u8(0);
        decode_response::<MetadataResponse>(ApiKey::Metadata, 12, body.clone().freeze()).unwrap();
        body.put_u8(0);
        assert!(matches!(
            decode_response::<MetadataResponse>(ApiKey::Metadata, 12, body.freeze()),
            Err(WireError::TrailingBytes { remaining: 2, .. })
        ));
        // Metadata v8 is not flexible: a trailing zero is an error there.
        let mut body = BytesMut::new();
        MetadataResponse::default().encode(&mut body, 8).unwrap();
        body.put_u8(0);
        assert!(decode_response::<MetadataResponse>(ApiKey::Metadata, 8, body.freeze()).is_err());
    }

    #[test]
    fn failed_encode_leaves_no_partial_frame_and_no_in_flight() {
        let mut codec = Codec::new(None, 1 << 20);
        let mut out = BytesMut::from(&b"keep"[..]);
        // `allow_auto_topic_creation` does not exist before Metadata v4, so only its
        // default (true) can be encoded there.
        let req = MetadataRequest::default().with_allow_auto_topic_creation(false);
        let err = codec
            .encode_request(ApiKey::Metadata, 1, &req, true, &mut out)
            .unwrap_err();
        assert!(matches!(err, WireError::Encode { .. }), "{err:?}");
        assert_eq!(&out[..], b"keep");
        assert_eq!(codec.in_flight(), 0);
    }

    #[test]
    fn acks_zero_requests_are_not_awaited() {
        let mut codec = Codec::new(None, 1 << 20);
        let mut out = BytesMut::new();
        codec
            .encode_request(
                ApiKey::Metadata,
                9,
                &MetadataRequest::default(),
                false,
                &mut out,
            )
            .unwrap();
        assert_eq!(codec.in_flight(), 0);
    }
}
