//! A TCP proxy between a client and one broker that injects faults on the wire. It
//! reads the client's request headers to learn which API each response answers, then
//! either flips one byte inside the records of Fetch responses (corruption must end as
//! a typed error naming the partition and offset), or swallows every n-th Produce
//! response and drops the connection: the broker wrote the batch, the client never
//! hears of it and retries, as when a network fails after the write.

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
/// Produce's API key.
const PRODUCE: i16 = 0;

/// What the proxy does to responses.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Flip the byte `from_end` bytes before the end of Fetch responses over `min_len`.
    CorruptFetch { min_len: usize, from_end: usize },
    /// Swallow every `every`-th Produce response and close the connection.
    DropProduce { every: u64 },
}

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
        Self::with_fault(
            listener,
            upstream,
            Fault::CorruptFetch { min_len, from_end },
        )
    }

    /// Listens on `listener` and forwards to `upstream`, but swallows every `every`-th
    /// Produce response (counted across connections) and closes that connection.
    pub fn dropping_produce_responses(
        listener: TcpListener,
        upstream: SocketAddr,
        every: u64,
    ) -> Self {
        Self::with_fault(
            listener,
            upstream,
            Fault::DropProduce {
                every: every.max(1),
            },
        )
    }

    fn with_fault(listener: TcpListener, upstream: SocketAddr, fault: Fault) -> Self {
        let address = listener.local_addr().unwrap_or(upstream);
        let corrupted = Arc::new(AtomicU64::new(0));
        let count = corrupted.clone();
        let seen = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (count, seen) = (count.clone(), seen.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, fault, count, seen).await;
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

    /// How many responses were corrupted or swallowed so far.
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
    fault: Fault,
    count: Arc<AtomicU64>,
    seen: Arc<AtomicU64>,
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
            match fault {
                Fault::CorruptFetch { min_len, from_end }
                    if api == Some(FETCH) && frame.len() > min_len && frame.len() > from_end =>
                {
                    let at = frame.len() - from_end;
                    frame[at] ^= 0x5a;
                    count.fetch_add(1, Ordering::SeqCst);
                }
                Fault::DropProduce { every }
                    if api == Some(PRODUCE)
                        && (seen.fetch_add(1, Ordering::SeqCst) + 1).is_multiple_of(every) =>
                {
                    count.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                _ => {}
            }
        }
        if cw.write_all(&frame).await.is_err() {
            break;
        }
    }
    up.abort();
}
