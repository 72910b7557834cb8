//! A TCP proxy between a client and one broker that corrupts record data on the wire:
//! it reads the client's request headers to learn which responses answer a Fetch, and
//! flips one byte inside the records of those responses. Everything else passes
//! unchanged. Used to show that corruption arriving through the wire layer ends as a
//! typed error naming the partition and offset.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The running proxy; it stops when dropped.
#[derive(Debug)]
pub struct CorruptingProxy {
    address: SocketAddr,
    corrupted: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// Fetch's API key.
const FETCH: i16 = 1;

impl CorruptingProxy {
    /// Listens on `listener` and forwards every connection to `upstream`. Fetch
    /// responses longer than `min_len` bytes get the byte `from_end` bytes before their
    /// end flipped (for a one-partition response, that is inside its last record batch).
    pub fn start(
        listener: TcpListener,
        upstream: SocketAddr,
        min_len: usize,
        from_end: usize,
    ) -> Self {
        let address = listener.local_addr().unwrap_or(upstream);
        let corrupted = Arc::new(AtomicU64::new(0));
        let count = corrupted.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, min_len, from_end, count).await;
                    }
                });
            }
        });
        Self {
            address,
            corrupted,
            task,
        }
    }

    /// `host:port` of the proxy.
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// How many responses were corrupted so far.
    pub fn corrupted(&self) -> u64 {
        self.corrupted.load(Ordering::SeqCst)
    }
}

impl Drop for CorruptingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_frame(s: &mut tokio::net::tcp::OwnedReadHalf) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let n = usize::try_from(i32::from_be_bytes(len)).ok()?;
    let mut frame = vec![0u8; n + 4];
    frame[..4].copy_from_slice(&len);
    s.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    min_len: usize,
    from_end: usize,
    count: Arc<AtomicU64>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // correlation id -> api key of requests in flight.
    let apis: Arc<Mutex<HashMap<i32, i16>>> = Arc::default();
    let up_apis = apis.clone();
    let up = tokio::spawn(async move {
        while let Some(frame) = read_frame(&mut cr).await {
            if frame.len() >= 12 {
                let api = i16::from_be_bytes([frame[4], frame[5]]);
                let correlation = i32::from_be_bytes([frame[8], frame[9], frame[10], frame[11]]);
                up_apis.lock().unwrap().insert(correlation, api);
            }
            if sw.write_all(&frame).await.is_err() {
                break;
            }
        }
    });
    while let Some(mut frame) = read_frame(&mut sr).await {
        if frame.len() >= 8 {
            let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
            let api = apis.lock().unwrap().remove(&correlation);
            if api == Some(FETCH) && frame.len() > min_len && frame.len() > from_end {
                let at = frame.len() - from_end;
                frame[at] ^= 0x5a;
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
        if cw.write_all(&frame).await.is_err() {
            break;
        }
    }
    up.abort();
}
