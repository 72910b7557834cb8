//! A fake broker for the downstream check: it answers ApiVersions honestly and every
//! Metadata request with a response whose broker array claims an absurd count.

use std::net::SocketAddr;

use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse, api_versions_response::ApiVersion};
use kafka_protocol::protocol::Encodable;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the Metadata response lies.
#[derive(Debug, Clone, Copy)]
pub struct Lie {
    /// The highest Metadata version advertised: 8 and below encode the array count as an
    /// `i32`; 9 and above are flexible and encode it as the unsigned varint `count + 1`.
    pub metadata_max_version: i16,
    /// The broker count claimed.
    pub count: i32,
    /// Bytes of `0xff` after the count.
    pub padding: usize,
}

/// The response body bytes of a Metadata response at `version` whose broker array claims
/// `count` elements, followed by `padding` bytes of `0xff`.
pub fn metadata_body(version: i16, count: i32, padding: usize) -> Vec<u8> {
    let mut body = BytesMut::new();
    if version >= 3 {
        body.put_i32(0); // throttle_time_ms
    }
    if version >= 9 {
        // Compact array: the unsigned varint count + 1 (a count of -2 claims 2^32 - 2).
        let mut v = (count as u32).wrapping_add(1);
        while v >= 0x80 {
            body.put_u8((v as u8) | 0x80);
            v >>= 7;
        }
        body.put_u8(v as u8);
    } else {
        body.put_i32(count);
    }
    body.put_bytes(0xff, padding);
    body.to_vec()
}

/// A listener that plays the lying broker until dropped.
pub struct LyingBroker {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl LyingBroker {
    /// Starts it on a loopback port.
    pub async fn start(lie: Lie) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, lie));
            }
        });
        Ok(LyingBroker { addr, task })
    }

    /// Its address, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for LyingBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut socket: TcpStream, lie: Lie) {
    loop {
        let Ok(size) = socket.read_i32().await else {
            return;
        };
        let Ok(size) = usize::try_from(size) else {
            return;
        };
        let mut frame = vec![0u8; size];
        if socket.read_exact(&mut frame).await.is_err() || frame.len() < 8 {
            return;
        }
        let api_key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let mut out = BytesMut::new();
        out.put_i32(correlation);
        if api_key == ApiKey::ApiVersions as i16 {
            // ApiVersions responses always carry header v0.
            let mut response = ApiVersionsResponse::default();
            response.api_keys = advertised(lie.metadata_max_version);
            if response.encode(&mut out, version.min(3)).is_err() {
                return;
            }
        } else if api_key == ApiKey::Metadata as i16 {
            if version >= 9 {
                out.put_u8(0); // the flexible response header's empty tagged fields
            }
            out.extend_from_slice(&metadata_body(version, lie.count, lie.padding));
        } else {
            return; // nothing else is asked before metadata
        }
        let mut framed = BytesMut::with_capacity(out.len() + 4);
        framed.put_i32(out.len() as i32);
        framed.extend_from_slice(&out);
        if socket.write_all(&framed).await.is_err() {
            return;
        }
    }
}

/// What a Kafka 3.x broker advertises, with Metadata capped as asked.
fn advertised(metadata_max: i16) -> Vec<ApiVersion> {
    [
        (ApiKey::Produce, 3, 9),
        (ApiKey::Fetch, 4, 13),
        (ApiKey::ListOffsets, 1, 7),
        (ApiKey::Metadata, 1, metadata_max),
        (ApiKey::OffsetCommit, 2, 8),
        (ApiKey::OffsetFetch, 1, 8),
        (ApiKey::FindCoordinator, 0, 4),
        (ApiKey::JoinGroup, 0, 7),
        (ApiKey::Heartbeat, 0, 4),
        (ApiKey::LeaveGroup, 0, 4),
        (ApiKey::SyncGroup, 0, 5),
        (ApiKey::ApiVersions, 0, 3),
        (ApiKey::InitProducerId, 0, 4),
    ]
    .into_iter()
    .map(|(key, min, max)| {
        let mut v = ApiVersion::default();
        v.api_key = key as i16;
        v.min_version = min;
        v.max_version = max;
        v
    })
    .collect()
}

/// The handler this crate chaos-tests (`tests/chaos.rs`), as a user's crate would its
/// own: it keeps a tally of the bytes of every record it takes, per key, and takes a
/// record only when its value is UTF-8 (anything else is permanent: dead-lettered).
pub mod tally {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use ottla::ConsumerRecord;
    use ottla::processor::ProcessError;

    /// Bytes taken per key.
    #[derive(Debug, Clone, Default)]
    pub struct Tally(Arc<Mutex<HashMap<Vec<u8>, u64>>>);

    impl Tally {
        /// Takes `record`: its value's length is added to its key's total.
        pub async fn take(&self, record: &ConsumerRecord) -> Result<(), ProcessError> {
            let value = record.value().unwrap_or_default();
            if std::str::from_utf8(value).is_err() {
                return Err(ProcessError::permanent("NotUtf8", "the value is not UTF-8"));
            }
            // Some I/O of the real handler would be here.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            let key = record.key().unwrap_or_default().to_vec();
            let mut totals = self.0.lock().unwrap_or_else(|e| e.into_inner());
            *totals.entry(key).or_default() += value.len() as u64;
            Ok(())
        }

        /// Keys seen.
        pub fn keys(&self) -> usize {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
        }
    }
}
