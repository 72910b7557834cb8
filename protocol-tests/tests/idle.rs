//! Connection settings against tansu, seen from a proxy in front of it
//! (`protocol_tests::hostile::HostileProxy`, unarmed: it relays honestly and counts
//! connections, and which of them the client closed):
//!
//! - `connections.max.idle.ms`: a connection that carried no request for longer is
//!   closed by the client, quietly, and the next request opens a new one;
//! - `socket.keepalive.enable`: the client's sockets have `SO_KEEPALIVE`, read from
//!   the kernel's socket table (`/proc/net/tcp`: a keepalive timer is pending on an
//!   idle socket only with it).
//!
//! Timing is asserted loosely, for a busy machine: the close happens eventually, and
//! nothing fails; no bound on when.

use std::future::Future;
use std::time::{Duration, Instant};

use ottla::producer::ProducerRecord;
use ottla::{ClientConfig, Producer};
use protocol_tests::hostile::HostileProxy;
use protocol_tests::tansu::Tansu;

const TOPIC: &str = "idle";

fn config(bootstrap: &str) -> ClientConfig {
    ClientConfig::new(bootstrap)
        .with_request_timeout(Duration::from_secs(10))
        .with_reconnect_backoff(Duration::from_millis(50), Duration::from_secs(1))
}

async fn within<F: Future>(what: &str, limit: Duration, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: no result within {limit:?}"),
    }
}

async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends one record and waits for its delivery: any error fails the test.
async fn send_one(producer: &Producer, value: &str) {
    let delivery = producer
        .send(ProducerRecord::new(TOPIC).value(value.to_string()))
        .await
        .expect("send");
    within("delivery", Duration::from_secs(30), delivery)
        .await
        .expect("delivered");
}

/// A producer that has written and then idles past `connections.max.idle.ms` (1 s,
/// given by its property name) has its connections closed by the client itself; it
/// opens none while idle (no reconnect loop), and its next record goes out on a new
/// connection without an error. A producer beside it with the default (9 min) keeps
/// its connection all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_by_the_client_and_reopened_for_the_next_request() {
    protocol_tests::init_tracing();
    let tansu = Tansu::start().expect("tansu");
    tansu.create_topic(TOPIC, 1).expect("topic");
    let idle_proxy = HostileProxy::start(&tansu.bootstrap())
        .await
        .expect("proxy");
    let kept_proxy = HostileProxy::start(&tansu.bootstrap())
        .await
        .expect("proxy");

    let idling = config(&idle_proxy.bootstrap())
        .set("connections.max.idle.ms", "1000")
        .expect("property");
    assert_eq!(idling.connections_max_idle, Some(Duration::from_secs(1)));
    let idling = within(
        "build",
        Duration::from_secs(30),
        Producer::builder("").client_config(idling).build(),
    )
    .await
    .expect("producer");
    let keeping = within(
        "build",
        Duration::from_secs(30),
        Producer::builder("")
            .client_config(config(&kept_proxy.bootstrap()))
            .build(),
    )
    .await
    .expect("producer");
    send_one(&idling, "first").await;
    send_one(&keeping, "first").await;
    let opened = idle_proxy.connections();
    assert!(opened >= 1);
    assert_eq!(idle_proxy.client_hangups(), 0, "closed while in use");

    // Idle now: every connection it opened is closed, by the client.
    let idle_since = Instant::now();
    eventually(
        "the client closing its idle connections",
        Duration::from_secs(60),
        || idle_proxy.client_hangups() >= opened,
    )
    .await;
    let closed_after = idle_since.elapsed();
    // Still idle: nothing reconnects by itself.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        idle_proxy.connections(),
        opened,
        "the producer reconnected while idle"
    );

    // The next record opens a connection again, and is delivered.
    send_one(&idling, "second").await;
    assert!(
        idle_proxy.connections() > opened,
        "no new connection: {} accepted",
        idle_proxy.connections()
    );
    // The producer with the default limit kept its connection meanwhile.
    send_one(&keeping, "second").await;
    assert_eq!(kept_proxy.client_hangups(), 0);
    let kept_opened = kept_proxy.connections();
    assert!(kept_opened >= 1);
    tracing::info!(
        ?closed_after,
        opened,
        kept_opened,
        "idle connections closed by the client"
    );
    idling.close().await;
    keeping.close().await;
}

/// The kernel's keepalive timer on the client's end of each connection through
/// `proxy`: `Some(true)` when one is pending (`SO_KEEPALIVE` set; the `tr` field of
/// `/proc/net/tcp` is 2), `Some(false)` when no timer is (0), `None` while another
/// is (a retransmission: not idle yet) or the socket is not listed.
fn keepalive_timers(proxy: &HostileProxy) -> Vec<Option<bool>> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    proxy
        .client_ports()
        .into_iter()
        .map(|port| {
            // The client's end: local 127.0.0.1:port, in the kernel's hex.
            let local = format!("0100007F:{port:04X}");
            table.lines().find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if fields.get(1) != Some(&local.as_str()) || fields.get(3) != Some(&"01") {
                    return None;
                }
                match fields.get(5)?.split(':').next()? {
                    "02" => Some(true),
                    "00" => Some(false),
                    _ => None,
                }
            })
        })
        .collect()
}

/// `socket.keepalive.enable=true` sets `SO_KEEPALIVE` on the client's sockets, and only
/// then: the kernel holds a keepalive timer for them and not for a client without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_keepalive_enable_sets_so_keepalive() {
    protocol_tests::init_tracing();
    let tansu = Tansu::start().expect("tansu");
    tansu.create_topic(TOPIC, 1).expect("topic");
    let on_proxy = HostileProxy::start(&tansu.bootstrap())
        .await
        .expect("proxy");
    let off_proxy = HostileProxy::start(&tansu.bootstrap())
        .await
        .expect("proxy");
    let on = config(&on_proxy.bootstrap())
        .set("socket.keepalive.enable", "true")
        .expect("property");
    assert!(on.socket_keepalive);
    let on = Producer::builder("")
        .client_config(on)
        .build()
        .await
        .expect("producer");
    let off = Producer::builder("")
        .client_config(config(&off_proxy.bootstrap()))
        .build()
        .await
        .expect("producer");
    send_one(&on, "x").await;
    send_one(&off, "x").await;
    // Once the sockets are quiet (their data acknowledged), the timers tell.
    eventually(
        "a keepalive timer on every socket",
        Duration::from_secs(30),
        || {
            let timers = keepalive_timers(&on_proxy);
            !timers.is_empty() && timers.iter().all(|t| *t == Some(true))
        },
    )
    .await;
    eventually(
        "no timer on the other client's sockets",
        Duration::from_secs(30),
        || {
            let timers = keepalive_timers(&off_proxy);
            !timers.is_empty() && timers.iter().all(|t| *t == Some(false))
        },
    )
    .await;
    on.close().await;
    off.close().await;
}
