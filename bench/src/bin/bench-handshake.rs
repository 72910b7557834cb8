//! Connection setup cost with and without TLS: ottla beside confluent-kafka (Python,
//! librdkafka with OpenSSL), against the same brokers in one run.
//!
//! `cargo run --release -p protocol-tests --no-default-features --bin bench-handshake [-- --runs 30]`
//!
//! Three tansu brokers from the wheel: one plaintext, one behind stunnel (TLS), one
//! behind stunnel requiring a client certificate (mTLS, an EC P-256 key in PKCS#8).
//! stunnel logs at level 3 here (the test suites' level 7 costs it ~35 ms a
//! connection). One setup is a new
//! client's first useful answer: TCP connect, the TLS handshake if any, ApiVersions and
//! a Metadata request for one topic, from a client made for it and then dropped. For
//! ottla that is `driver::Cluster::connect`; for confluent-kafka, a new `AdminClient`
//! and `list_topics(topic)`, timed inside one Python process per block (interpreter
//! start and imports are not counted, the client's construction is). The modes and the
//! clients are interleaved in blocks; the program prints medians and 90th percentiles
//! in milliseconds, and the ratios.

use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ottla::ClientConfig;
use ottla::driver::{Cluster, TopicScope};
use ottla::security::{Pem, SecurityProtocol, TlsConfig};
use ottla_bench::arg;
use protocol_tests::pyclient::python_command;
use protocol_tests::tansu::Tansu;
use protocol_tests::tls::{KeyFormat, TestPki, TlsTansu, TlsTansuOptions};

const TOPIC: &str = "handshake";

/// One setup, timed inside a Python process: `conf` (JSON), runs, topic.
const PY: &str = r#"
import json, sys, time
from confluent_kafka.admin import AdminClient
conf = json.loads(sys.argv[1]); runs = int(sys.argv[2]); topic = sys.argv[3]
for _ in range(runs):
    start = time.perf_counter()
    client = AdminClient(conf)
    md = client.list_topics(topic=topic, timeout=10)
    if md.topics[topic].error is not None:
        raise SystemExit("metadata error: %s" % md.topics[topic].error)
    print("%.4f" % ((time.perf_counter() - start) * 1000.0), flush=True)
    del client
"#;

struct Mode {
    name: &'static str,
    ottla: ClientConfig,
    confluent: Vec<(&'static str, String)>,
}

fn median_p90(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(i).copied().unwrap_or(f64::NAN)
    };
    (at(0.5), at(0.9))
}

async fn ottla_setups(config: &ClientConfig, runs: usize) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let cluster =
            Cluster::connect(config, TopicScope::Topics([TOPIC.to_string()].into()), &[]).await?;
        out.push(start.elapsed().as_secs_f64() * 1000.0);
        drop(cluster);
        // Let the connection task see its handle go and close the socket.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(out)
}

fn confluent_setups(conf: &[(&'static str, String)], runs: usize) -> anyhow::Result<Vec<f64>> {
    let json = format!(
        "{{{}}}",
        conf.iter()
            .map(|(k, v)| format!("{k:?}: {v:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let output = python_command()
        .args(["-c", PY, &json, &runs.to_string(), TOPIC])
        .stderr(Stdio::inherit())
        .output()?;
    if !output.status.success() {
        anyhow::bail!("confluent-kafka setups failed: {}", output.status);
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| Ok(l.trim().parse::<f64>()?))
        .collect()
}

fn main() -> ExitCode {
    if let Some(refused) = ottla_bench::refuse_metrics_build("bench-handshake") {
        return refused;
    }
    // RUST_LOG=ottla=trace shows where a setup's time goes.
    if std::env::var_os("RUST_LOG").is_some() {
        protocol_tests::init_tracing();
    }
    let runs = arg("--runs", 30).max(3) as usize;
    let blocks = 3;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench-handshake: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(runs, blocks)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-handshake: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(runs: usize, blocks: usize) -> anyhow::Result<()> {
    let pki = Arc::new(TestPki::generate()?);
    let plain = Tansu::start()?;
    plain.create_topic(TOPIC, 1)?;
    // stunnel logging at its test level (7) costs it ~35 ms a connection; 3 is what a
    // production terminator logs.
    let quiet = || TlsTansuOptions::default().pki(pki.clone()).stunnel_debug(3);
    let tls = TlsTansu::start_with(quiet())?;
    tls.create_topic(TOPIC, 1)?;
    let mtls = TlsTansu::start_with(quiet().mtls(true))?;
    mtls.create_topic(TOPIC, 1)?;
    let ca = pki.ca();
    let (cert, key) = pki.client_cert(KeyFormat::Pkcs8);
    let base = |bootstrap: &str| {
        ClientConfig::new(bootstrap).with_request_timeout(Duration::from_secs(10))
    };
    let modes = [
        Mode {
            name: "plaintext",
            ottla: base(&plain.bootstrap()),
            confluent: vec![("bootstrap.servers", plain.bootstrap())],
        },
        Mode {
            name: "TLS (stunnel)",
            ottla: base(&tls.bootstrap())
                .with_security_protocol(SecurityProtocol::Ssl)
                .with_tls(TlsConfig::new().ca(Pem::file(&ca))),
            confluent: vec![
                ("bootstrap.servers", tls.bootstrap()),
                ("security.protocol", "SSL".into()),
                ("ssl.ca.location", ca.display().to_string()),
            ],
        },
        Mode {
            name: "mTLS (stunnel, P-256)",
            ottla: base(&mtls.bootstrap())
                .with_security_protocol(SecurityProtocol::Ssl)
                .with_tls(
                    TlsConfig::new()
                        .ca(Pem::file(&ca))
                        .client_certificate(Pem::file(&cert), Pem::file(&key)),
                ),
            confluent: vec![
                ("bootstrap.servers", mtls.bootstrap()),
                ("security.protocol", "SSL".into()),
                ("ssl.ca.location", ca.display().to_string()),
                ("ssl.certificate.location", cert.display().to_string()),
                ("ssl.key.location", key.display().to_string()),
            ],
        },
    ];
    let per_block = runs.div_ceil(blocks);
    let mut samples: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); modes.len()];
    // One warm-up setup each (page cache, the broker's first connection).
    for mode in &modes {
        ottla_setups(&mode.ottla, 1).await?;
        confluent_setups(&mode.confluent, 1)?;
    }
    for _ in 0..blocks {
        for (mode, (o, c)) in modes.iter().zip(samples.iter_mut()) {
            o.extend(ottla_setups(&mode.ottla, per_block).await?);
            c.extend(confluent_setups(&mode.confluent, per_block)?);
        }
    }
    println!(
        "connection setup (connect, TLS, ApiVersions, Metadata), {} runs each, ms",
        per_block * blocks
    );
    println!(
        "{:<24} {:>13} {:>10} {:>17} {:>10} {:>16}",
        "mode", "ottla median", "ottla p90", "confluent median", "conf. p90", "ottla/confluent"
    );
    let mut medians = Vec::new();
    for (mode, (o, c)) in modes.iter().zip(samples.iter_mut()) {
        let (om, op) = median_p90(o);
        let (cm, cp) = median_p90(c);
        medians.push((om, cm));
        println!(
            "{:<24} {om:>13.2} {op:>10.2} {cm:>17.2} {cp:>10.2} {:>16.2}",
            mode.name,
            om / cm
        );
    }
    let (plain_o, plain_c) = medians[0];
    for (mode, (o, c)) in modes.iter().zip(&medians).skip(1) {
        println!(
            "{} over plaintext: ottla +{:.2} ms ({:.2}x), confluent-kafka +{:.2} ms ({:.2}x)",
            mode.name,
            o - plain_o,
            o / plain_o,
            c - plain_c,
            c / plain_c
        );
    }
    Ok(())
}
