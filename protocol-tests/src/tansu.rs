//! The tansu broker: [`ottla_testkit::tansu`] (whose documentation says how to get the
//! binaries and lists tansu's quirks) and the kit's process helpers, re-exported so the
//! suites keep their `protocol_tests::tansu` paths, plus [`behind_a_front`] for the
//! suites that put a proxy of their own in front of it. For TLS in front of tansu, see
//! [`crate::tls`].

pub use ottla_testkit::process::{free_port, log_dir, log_tail, terminate, unique_log_path};
pub use ottla_testkit::tansu::*;

/// tansu behind a front of the test's making (a proxy, a SASL responder): a listener on
/// a free local port, and tansu advertising it, with `topic` of `partitions` created.
/// Whatever serves the listener forwards to the returned address, tansu's own.
pub async fn behind_a_front(
    topic: &str,
    partitions: i32,
) -> anyhow::Result<(tokio::net::TcpListener, Tansu, std::net::SocketAddr)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let tansu =
        Tansu::start_with(&TansuOptions::default().advertised(&format!("127.0.0.1:{port}")))?;
    tansu.create_topic(topic, partitions)?;
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], tansu.port()));
    Ok((listener, tansu, upstream))
}
