//! Secure connections against real peers.
//!
//! - TLS: stunnel (OpenSSL, an implementation independent of the rustls ottla uses)
//!   terminates TLS in front of tansu, which advertises stunnel's port. Certificates are
//!   made at test time by the `openssl` CLI (`protocol_tests::tls::TestPki`).
//! - SASL SCRAM-SHA-256/512: tansu 0.6.0 built from source with `libsql` storage
//!   (`scripts/install-peers.sh` builds it once into a cache outside the clone), over
//!   SASL_PLAINTEXT and, through stunnel, SASL_SSL.
//!
//! PLAIN, OAUTHBEARER and in-band KIP-368 re-authentication have no real server here;
//! the tests at the end run them against `protocol_tests::sasl_responder`, a responder
//! of ours in front of tansu.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ottla::consumer::{ConsumerEvent, OffsetReset, TopicPartition};
use ottla::producer::ProducerRecord;
use ottla::security::{Pem, SaslConfig, SecurityProtocol, TlsConfig};
use ottla::{AuthError, ClientConfig, Consumer, Error, Producer, RequestError, TlsFailure};
use protocol_tests::tansu::{
    SaslTansu, SaslTansuOptions, ScramMechanism, Tansu, TansuOptions, free_port,
};
use protocol_tests::tls::{
    KeyFormat, ServerCert, Stunnel, StunnelConfig, TestPki, TlsTansu, TlsTansuOptions,
};

/// How fast a configuration error must reach the caller.
const PROMPT: Duration = Duration::from_secs(2);

fn base(bootstrap: &str) -> ClientConfig {
    ClientConfig::new(bootstrap)
        .with_request_timeout(Duration::from_secs(10))
        .with_reconnect_backoff(Duration::from_millis(50), Duration::from_secs(1))
}

fn tls(bootstrap: &str, pki: &TestPki) -> ClientConfig {
    base(bootstrap)
        .with_security_protocol(SecurityProtocol::Ssl)
        .with_tls(TlsConfig::new().ca(Pem::file(pki.ca())))
}

fn mtls(bootstrap: &str, pki: &TestPki, format: KeyFormat) -> ClientConfig {
    let (cert, key) = pki.client_cert(format);
    base(bootstrap)
        .with_security_protocol(SecurityProtocol::Ssl)
        .with_tls(
            TlsConfig::new()
                .ca(Pem::file(pki.ca()))
                .client_certificate(Pem::file(cert), Pem::file(key)),
        )
}

async fn timed<T>(f: impl Future<Output = T>) -> (T, Duration) {
    let start = Instant::now();
    let out = f.await;
    (out, start.elapsed())
}

/// Writes `n` records (values `0..n`) and returns where each landed.
async fn produce(config: &ClientConfig, topic: &str, n: u64) -> BTreeSet<(i32, i64)> {
    let producer = Producer::builder("")
        .client_config(config.clone())
        .build()
        .await
        .expect("producer");
    let mut deliveries = Vec::new();
    for i in 0..n {
        let record = ProducerRecord::new(topic)
            .key(format!("k{}", i % 17))
            .value(i.to_string());
        deliveries.push(producer.send(record).await.expect("send"));
    }
    let mut written = BTreeSet::new();
    for d in deliveries {
        let m = d.await.expect("delivered");
        written.insert((m.partition, m.offset));
    }
    producer.close().await;
    written
}

/// Where records were written: (partition, offset).
type Written = BTreeSet<(i32, i64)>;

/// What the members of a group read, and the group events they saw.
#[derive(Debug, Default)]
struct Tally {
    /// (partition, offset) -> how many times it was read.
    reads: BTreeMap<(i32, i64), u32>,
    /// Member -> (time, event) of every assignment change.
    changes: BTreeMap<usize, Vec<(Instant, String)>>,
}

/// Runs `configs.len()` consumers of `group` (one config each) until `expect` is read
/// (or `deadline`), committing as they go; returns what they read.
async fn group_read(
    configs: Vec<ClientConfig>,
    group: &str,
    topic: &str,
    expect: &BTreeSet<(i32, i64)>,
    deadline: Duration,
) -> Tally {
    group_read_until(configs, group, topic, || Some(expect.clone()), deadline).await
}

/// Like [`group_read`], for a set of records known only once `expect` returns it.
async fn group_read_until(
    configs: Vec<ClientConfig>,
    group: &str,
    topic: &str,
    expect: impl Fn() -> Option<BTreeSet<(i32, i64)>>,
    deadline: Duration,
) -> Tally {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut consumers = Vec::new();
    for (m, config) in configs.into_iter().enumerate() {
        let consumer = Consumer::builder("")
            .client_config(config)
            .group_id(group)
            .topics([topic])
            .offset_reset(OffsetReset::Earliest)
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_secs(1))
            .auto_commit(Some(Duration::from_millis(500)))
            .client_id(format!("secure-{m}"))
            .build()
            .await
            .expect("consumer");
        consumers.push((m, consumer));
    }
    let mut tasks = Vec::new();
    for (m, mut consumer) in consumers {
        let tally = tally.clone();
        tasks.push(tokio::spawn(async move {
            let mut events = consumer.take_events();
            loop {
                tokio::select! {
                    Some(event) = events.recv() => {
                        if let e @ (ConsumerEvent::Assigned { .. } | ConsumerEvent::RevokeRequested { .. } | ConsumerEvent::Lost { .. }) = event {
                            tally.lock().unwrap().changes.entry(m).or_default().push((Instant::now(), format!("{e:?}")));
                        }
                    }
                    batch = consumer.recv_batch(500) => {
                        let Ok(batch) = batch else { continue };
                        let mut t = tally.lock().unwrap();
                        for r in batch {
                            *t.reads.entry((r.partition(), r.offset())).or_default() += 1;
                        }
                    }
                }
            }
        }));
    }
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        let done = expect().is_some_and(|expect| {
            let t = tally.lock().unwrap();
            expect.iter().all(|k| t.reads.contains_key(k))
        });
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Duplicates would show up now.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    Arc::try_unwrap(tally)
        .map(|m| m.into_inner().unwrap())
        .unwrap_or_default()
}

fn assert_exactly_once(tally: &Tally, expect: &BTreeSet<(i32, i64)>) {
    let missing: Vec<_> = expect
        .iter()
        .filter(|k| !tally.reads.contains_key(k))
        .collect();
    assert!(
        missing.is_empty(),
        "{} records never read, e.g. {:?}",
        missing.len(),
        missing.first()
    );
    let twice: Vec<_> = tally.reads.iter().filter(|(_, n)| **n > 1).collect();
    // Per partition, the first and last offset read twice: where a rebalance or a lost
    // commit sent a reader back.
    let mut spans: BTreeMap<i32, (i64, i64, usize)> = BTreeMap::new();
    for ((p, o), _) in &twice {
        let e = spans.entry(*p).or_insert((*o, *o, 0));
        e.0 = e.0.min(*o);
        e.1 = e.1.max(*o);
        e.2 += 1;
    }
    assert!(
        twice.is_empty(),
        "{} records read twice, e.g. {:?}; per partition (first, last, count): {spans:?}; group events: {:#?}",
        twice.len(),
        twice.first(),
        tally.changes
    );
}

/// A producer writes to `topic` every `pause` for `secs` while a 3-member group reads
/// it; returns what was written once the group has read all of it (or given up).
async fn write_while_a_group_reads(
    config: &ClientConfig,
    topic: &'static str,
    group: &'static str,
    secs: u64,
    pause: Duration,
) -> (Written, Tally) {
    let producer = Producer::builder("")
        .client_config(config.clone())
        .build()
        .await
        .expect("producer");
    let written = Arc::new(Mutex::new(BTreeSet::new()));
    let writer = {
        let written = written.clone();
        tokio::spawn(async move {
            let end = Instant::now() + Duration::from_secs(secs);
            let mut i = 0u64;
            while Instant::now() < end {
                let record = ProducerRecord::new(topic)
                    .key(format!("k{}", i % 13))
                    .value(i.to_string());
                let m = producer
                    .send(record)
                    .await
                    .expect("send")
                    .await
                    .expect("every record is delivered through the session renewals");
                written.lock().unwrap().insert((m.partition, m.offset));
                i += 1;
                tokio::time::sleep(pause).await;
            }
            producer.close().await;
        })
    };
    let done: Arc<Mutex<Option<Written>>> = Arc::default();
    let reader = {
        let done = done.clone();
        let configs = vec![config.clone(), config.clone(), config.clone()];
        tokio::spawn(async move {
            let expect = move || done.lock().unwrap().clone();
            group_read_until(
                configs,
                group,
                topic,
                expect,
                Duration::from_secs(secs + 60),
            )
            .await
        })
    };
    writer.await.expect("writer");
    let expect = written.lock().unwrap().clone();
    done.lock().unwrap().replace(expect.clone());
    let tally = reader.await.expect("reader");
    (expect, tally)
}

/// No member saw an assignment change more than 15 s after the last one got its first.
fn assert_no_rebalance_once_settled(tally: &Tally) {
    let settled = tally
        .changes
        .values()
        .filter_map(|c| c.first().map(|(t, _)| *t))
        .max()
        .expect("members were assigned");
    let later: Vec<_> = tally
        .changes
        .values()
        .flatten()
        .filter(|(t, _)| *t > settled + Duration::from_secs(15))
        .collect();
    assert!(later.is_empty(), "the group rebalanced: {later:?}");
}

/// The error of a build that must fail: returned within [`PROMPT`].
async fn build_error(config: ClientConfig) -> RequestError {
    let builder = Consumer::builder("")
        .client_config(config)
        .assign([TopicPartition::new("any", 0)]);
    let (result, took) = timed(builder.build()).await;
    let err = match result {
        Ok(_) => panic!("the consumer connected"),
        Err(e) => e,
    };
    assert!(took <= PROMPT, "the error took {took:?}: {err}");
    match err {
        Error::Request(e) => e,
        Error::Bootstrap { ref last, .. } => {
            panic!("a bootstrap error, not the security failure: {last:?}")
        }
        other => panic!("unexpected error: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_produce_consume_a_three_member_group_and_commits() {
    protocol_tests::init_tracing();
    let broker = TlsTansu::start().expect("TLS tansu");
    broker.create_topic("tls-orders", 6).expect("topic");
    let config = tls(&broker.bootstrap(), broker.pki());
    let written = produce(&config, "tls-orders", 600).await;
    assert_eq!(written.len(), 600);
    let tally = group_read(
        vec![config.clone(), config.clone(), config.clone()],
        "tls-group",
        "tls-orders",
        &written,
        Duration::from_secs(60),
    )
    .await;
    assert_exactly_once(&tally, &written);
    // The commits went through the TLS coordinator connection: a new member of the
    // group starts where they ended and reads nothing old.
    let mut late = Consumer::builder("")
        .client_config(config.clone())
        .group_id("tls-group")
        .topics(["tls-orders"])
        .offset_reset(OffsetReset::Earliest)
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_secs(1))
        .build()
        .await
        .expect("late consumer");
    let got = tokio::time::timeout(Duration::from_secs(8), late.recv()).await;
    assert!(got.is_err(), "a committed record came again: {got:?}");
    late.close().await.expect("close");
    assert!(
        broker.stunnel().accepted_connections() >= 3,
        "the clients did not go through stunnel"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_with_pkcs8_rsa_and_ec_keys() {
    protocol_tests::init_tracing();
    let broker = TlsTansu::start_with(TlsTansuOptions::default().mtls(true)).expect("mTLS tansu");
    broker.create_topic("mtls", 3).expect("topic");
    let bootstrap = broker.bootstrap();
    let pki = broker.pki().clone();
    // Each key format writes, and the three read as one group.
    let mut written = BTreeSet::new();
    for format in KeyFormat::ALL {
        written.extend(produce(&mtls(&bootstrap, &pki, format), "mtls", 50).await);
    }
    // Keys in memory (Pem::inline) work as files do.
    let (cert, key) = pki.client_cert(KeyFormat::Sec1);
    let inline = base(&bootstrap)
        .with_security_protocol(SecurityProtocol::Ssl)
        .with_tls(TlsConfig::new().ca(Pem::file(pki.ca())).client_certificate(
            Pem::inline(std::fs::read_to_string(cert).unwrap()),
            Pem::inline(std::fs::read_to_string(key).unwrap()),
        ));
    written.extend(produce(&inline, "mtls", 50).await);
    assert_eq!(written.len(), 200);
    let configs = KeyFormat::ALL
        .iter()
        .map(|f| mtls(&bootstrap, &pki, *f))
        .collect();
    let tally = group_read(
        configs,
        "mtls-group",
        "mtls",
        &written,
        Duration::from_secs(60),
    )
    .await;
    assert_exactly_once(&tally, &written);

    // Under `verify = 2`, no client certificate, or one from another CA, is refused.
    for config in [tls(&bootstrap, &pki), {
        let (cert, key) = pki.untrusted_client_cert();
        base(&bootstrap)
            .with_security_protocol(SecurityProtocol::Ssl)
            .with_tls(
                TlsConfig::new()
                    .ca(Pem::file(pki.ca()))
                    .client_certificate(Pem::file(cert), Pem::file(key)),
            )
    }] {
        let err = build_error(config).await;
        assert!(
            matches!(
                &err,
                RequestError::Tls {
                    reason: TlsFailure::HandshakeRefused(_),
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("ssl.certificate.location"),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_failures_are_typed_and_prompt() {
    protocol_tests::init_tracing();
    let pki = Arc::new(TestPki::generate().expect("pki"));
    let cases = [
        (ServerCert::Expired, "expired"),
        (ServerCert::WrongName, "not valid for 127.0.0.1"),
        (ServerCert::OtherCa, "unknown issuer"),
    ];
    for (cert, says) in cases {
        let broker = TlsTansu::start_with(
            TlsTansuOptions::default()
                .server_cert(cert)
                .pki(pki.clone()),
        )
        .expect("TLS tansu");
        let err = build_error(tls(&broker.bootstrap(), &pki)).await;
        let reason = match &err {
            RequestError::Tls {
                reason, broker: b, ..
            } => {
                assert_eq!(b, &broker.bootstrap(), "{err}");
                reason.clone()
            }
            other => panic!("{cert:?}: not a TLS error: {other:?}"),
        };
        match cert {
            ServerCert::Expired => assert_eq!(reason, TlsFailure::Expired),
            ServerCert::WrongName => assert!(matches!(reason, TlsFailure::NameMismatch { .. })),
            _ => assert_eq!(reason, TlsFailure::UnknownIssuer),
        }
        assert!(err.to_string().contains(says), "{cert:?}: {err}");
        assert!(err.to_string().contains("check"), "no setting named: {err}");
        // Turning host-name checks off (loudly) accepts the wrong name, and only that.
        let relaxed = base(&broker.bootstrap())
            .with_security_protocol(SecurityProtocol::Ssl)
            .with_tls(
                TlsConfig::new()
                    .ca(Pem::file(pki.ca()))
                    .danger_disable_hostname_verification(),
            );
        let built = Consumer::builder("")
            .client_config(relaxed)
            .assign([TopicPartition::new("any", 0)])
            .build()
            .await;
        assert_eq!(
            built.is_ok(),
            cert == ServerCert::WrongName,
            "{cert:?}: {built:?}"
        );
    }
    // A plaintext port waits for a Kafka request and never answers the handshake: a
    // typed error once the connect timeout (1 s here) has passed.
    let plain = Tansu::start().expect("tansu");
    let config = tls(&plain.bootstrap(), &pki).with_connect_timeout(Duration::from_secs(1));
    let err = build_error(config).await;
    assert!(
        matches!(
            &err,
            RequestError::Tls {
                reason: TlsFailure::Protocol(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("security.protocol"), "{err}");
}

/// The advice a consumer's build gives against a listener that speaks another security
/// protocol, within [`PROMPT`]: as the build's own error when the broker's bytes prove
/// it (a configuration error), inside the bootstrap failure when only a close hints at
/// it (retried as any lost connection). Returns the error and the message the user sees.
async fn wrong_protocol_error(config: ClientConfig) -> (RequestError, String) {
    let builder = Consumer::builder("")
        .client_config(config)
        .assign([TopicPartition::new("any", 0)]);
    let (result, took) = timed(builder.build()).await;
    let Err(err) = result else {
        panic!("the consumer connected");
    };
    assert!(took <= PROMPT, "the error took {took:?}: {err}");
    let shown = err.to_string();
    let request = match err {
        Error::Request(e) => e,
        Error::Bootstrap { last: Some(e), .. } => e,
        other => panic!("unexpected error: {other:?}"),
    };
    assert!(
        matches!(request, RequestError::WrongSecurityProtocol { .. }),
        "{request:?}"
    );
    assert!(shown.contains("security.protocol"), "{shown}");
    (request, shown)
}

/// A client on the wrong `security.protocol` is told which value the listener likely
/// wants: PLAINTEXT against a TLS listener that answers with an alert (rustls, as Kafka's
/// JSSE does: certain), against stunnel, which resets the connection (only likely),
/// (a SASL_PLAINTEXT client there is pointed at SASL_SSL), and against tansu's SASL
/// listener, which answers ApiVersions and hangs up on Metadata (only likely); and TLS
/// against a plaintext port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_security_protocol_is_named_with_the_likely_value() {
    protocol_tests::init_tracing();
    let pki = Arc::new(TestPki::generate().expect("pki"));

    let alerting = protocol_tests::tls::RustlsListener::start(&pki)
        .await
        .expect("rustls listener");
    let (err, shown) = wrong_protocol_error(base(&alerting.address())).await;
    let RequestError::WrongSecurityProtocol {
        certain, suggested, ..
    } = &err
    else {
        unreachable!()
    };
    assert!(*certain, "a TLS alert is proof: {err:?}");
    assert!(err.is_security() && !err.is_retriable(), "{err:?}");
    assert!(suggested.starts_with("SSL"), "{err:?}");
    assert!(shown.contains("TLS alert"), "{shown}");
    assert!(shown.contains("set security.protocol to SSL"), "{shown}");

    let stunnel =
        TlsTansu::start_with(TlsTansuOptions::default().pki(pki.clone())).expect("TLS tansu");
    let (err, shown) = wrong_protocol_error(base(&stunnel.bootstrap())).await;
    let RequestError::WrongSecurityProtocol {
        certain, suggested, ..
    } = &err
    else {
        unreachable!()
    };
    assert!(!*certain, "a hang-up is only a clue: {err:?}");
    assert!(err.is_retriable(), "{err:?}");
    assert!(suggested.starts_with("SSL"), "{err:?}");
    assert!(
        shown.contains("may not speak security.protocol=PLAINTEXT"),
        "{shown}"
    );
    assert!(shown.contains("likely SSL"), "{shown}");
    // A SASL client keeps its SASL: SASL_SSL is the value to try.
    let sasl_client = scram(
        &stunnel.bootstrap(),
        SecurityProtocol::SaslPlaintext,
        SaslConfig::scram_sha256(ALICE.0, ALICE.1),
    );
    let (err, shown) = wrong_protocol_error(sasl_client).await;
    assert!(
        matches!(
            &err,
            RequestError::WrongSecurityProtocol {
                suggested: "SASL_SSL",
                certain: false,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        shown.contains("security.protocol=SASL_PLAINTEXT"),
        "{shown}"
    );
    // The same client on SSL gets through the same listener.
    assert!(
        Consumer::builder("")
            .client_config(tls(&stunnel.bootstrap(), &pki))
            .assign([TopicPartition::new("any", 0)])
            .build()
            .await
            .is_ok()
    );

    let sasl = SaslTansu::start_with(&scram_users()).expect("SASL tansu");
    let (err, shown) = wrong_protocol_error(base(&sasl.bootstrap())).await;
    let RequestError::WrongSecurityProtocol {
        certain, suggested, ..
    } = &err
    else {
        unreachable!()
    };
    assert!(!*certain, "{err:?}");
    assert!(suggested.starts_with("SASL_PLAINTEXT"), "{err:?}");
    assert!(shown.contains("likely SASL_PLAINTEXT"), "{shown}");
    // With SCRAM it reads the cluster.
    let scram_config = scram(
        &sasl.bootstrap(),
        SecurityProtocol::SaslPlaintext,
        SaslConfig::scram_sha256(ALICE.0, ALICE.1),
    );
    assert!(
        Consumer::builder("")
            .client_config(scram_config)
            .assign([TopicPartition::new("any", 0)])
            .build()
            .await
            .is_ok()
    );

    // The reverse: TLS against tansu's plaintext port, which waits for a Kafka request
    // and never answers the ClientHello.
    let plain = Tansu::start().expect("tansu");
    let config = tls(&plain.bootstrap(), &pki).with_connect_timeout(Duration::from_secs(1));
    let err = build_error(config).await;
    assert!(
        matches!(
            &err,
            RequestError::Tls {
                reason: TlsFailure::Protocol(_),
                ..
            }
        ),
        "{err:?}"
    );
    let shown = err.to_string();
    assert!(
        shown.contains("may not speak TLS: try PLAINTEXT"),
        "{shown}"
    );
}

/// Whether a TLS failure is the one a case expects.
type IsReason = fn(&TlsFailure) -> bool;

/// A running client whose broker refuses TLS: bootstrap goes through a good stunnel,
/// but tansu advertises a second one, with the `bad` certificate (or requiring a client
/// certificate the client lacks). recv() reports the typed error within 2 s, and in
/// 10 s the connection makes at most as many attempts as `reconnect.backoff.max.ms`
/// (1 s) allows. Returns the running fixtures and the client's configuration.
async fn bad_broker_is_reported_and_not_hammered(
    pki: &TestPki,
    bad: ServerCert,
    require_client_cert: bool,
    expected: IsReason,
) -> (Tansu, Stunnel, Stunnel, ClientConfig) {
    let case = format!("{bad:?}, client certificate required: {require_client_cert}");
    let bad_port = free_port().expect("port");
    let tansu =
        Tansu::start_with(&TansuOptions::default().advertised(&format!("127.0.0.1:{bad_port}")))
            .expect("tansu");
    tansu.create_topic("bad-cert", 2).expect("topic");
    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, tansu.port()));
    let (good_cert, good_key) = pki.server_cert(ServerCert::Good);
    let good = Stunnel::start(StunnelConfig::new(good_cert, good_key, upstream)).expect("stunnel");
    let (bad_cert, bad_key) = pki.server_cert(bad);
    let mut bad_config = StunnelConfig::new(bad_cert, bad_key, upstream).accept_port(bad_port);
    if require_client_cert {
        bad_config = bad_config.client_ca(pki.ca());
    }
    let bad = Stunnel::start(bad_config).expect("stunnel");

    let config = tls(&good.address(), pki);
    let mut consumer = Consumer::builder("")
        .client_config(config.clone())
        .assign([
            TopicPartition::new("bad-cert", 0),
            TopicPartition::new("bad-cert", 1),
        ])
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await
        .expect("metadata comes through the good stunnel");
    let start = Instant::now();
    let first = tokio::time::timeout(PROMPT, consumer.recv()).await;
    let Ok(Some(Err(Error::Request(err)))) = first else {
        panic!("{case}: recv() did not report the TLS failure within {PROMPT:?}: {first:?}");
    };
    let RequestError::Tls { reason, .. } = &err else {
        panic!("{case}: not a TLS error: {err:?}");
    };
    assert!(expected(reason), "{case}: {err:?}");
    let before = bad.accepted_connections();
    let window = Duration::from_secs(10);
    let mut reported = 1;
    while start.elapsed() < window {
        if let Ok(Some(Err(_))) =
            tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await
        {
            reported += 1;
        }
    }
    let attempts = bad.accepted_connections();
    // One attempt per reconnect.backoff.max.ms at most, plus the one in progress.
    let bound = (window.as_millis() / 1000) as usize + 1;
    assert!(
        attempts <= bound,
        "{case}: {attempts} attempts in {window:?} (bound {bound}; {before} by the first report)"
    );
    assert!(
        reported >= 2,
        "{case}: recv() reported the failure once only"
    );
    drop(consumer);
    (tansu, good, bad, config)
}

/// Every TLS failure of a broker learnt from metadata (an expired certificate, one for
/// another name, one from an unknown CA, a client certificate required and missing)
/// reaches recv() typed and promptly, and is not retried in a loop; the producer's
/// deliveries fail with the same error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_certificate_is_reported_by_recv_and_not_retried_in_a_loop() {
    protocol_tests::init_tracing();
    let pki = TestPki::generate().expect("pki");
    let cases: [(ServerCert, bool, IsReason); 4] = [
        (ServerCert::Expired, false, |r| *r == TlsFailure::Expired),
        (ServerCert::WrongName, false, |r| {
            matches!(r, TlsFailure::NameMismatch { .. })
        }),
        (ServerCert::OtherCa, false, |r| {
            *r == TlsFailure::UnknownIssuer
        }),
        (ServerCert::Good, true, |r| {
            matches!(r, TlsFailure::HandshakeRefused(_))
        }),
    ];
    for (i, (bad, require_client_cert, expected)) in cases.into_iter().enumerate() {
        let (_tansu, _good, _bad, config) =
            bad_broker_is_reported_and_not_hammered(&pki, bad, require_client_cert, expected).await;
        if i > 0 {
            continue;
        }
        // The producer: its deliveries fail with the same typed error, promptly.
        let producer = Producer::builder("").client_config(config).build().await;
        let err = match producer {
            // InitProducerId goes to a known broker: the bad one.
            Err(Error::Request(e)) => e,
            Ok(p) => {
                let (delivery, took) = timed(async {
                    p.send(ProducerRecord::new("bad-cert").value("x"))
                        .await
                        .expect("send")
                        .await
                })
                .await;
                assert!(took <= PROMPT, "took {took:?}");
                match delivery {
                    Err(Error::Request(e)) => e,
                    other => panic!("{other:?}"),
                }
            }
            Err(other) => panic!("{other:?}"),
        };
        assert!(matches!(err, RequestError::Tls { .. }), "{err:?}");
    }
}

fn scram(bootstrap: &str, protocol: SecurityProtocol, sasl: SaslConfig) -> ClientConfig {
    base(bootstrap)
        .with_security_protocol(protocol)
        .with_sasl(sasl)
}

const ALICE: (&str, &str) = ("alice", "alice-Pa55-word");
const BOB: (&str, &str) = ("bob", "bob-Pa55-word");

fn scram_users() -> SaslTansuOptions {
    SaslTansuOptions::users(&[
        (ALICE.0, ALICE.1, ScramMechanism::Scram256),
        (BOB.0, BOB.1, ScramMechanism::Scram512),
    ])
}

/// SCRAM against tansu: each mechanism writes and reads; a wrong password and a
/// mechanism the broker does not enable are typed errors from build(), within 2 s.
async fn scram_cases(
    bootstrap: &str,
    protocol: SecurityProtocol,
    pki: Option<&TestPki>,
    topic: &str,
) {
    let with_tls = |c: ClientConfig| match pki {
        Some(pki) => c.with_tls(TlsConfig::new().ca(Pem::file(pki.ca()))),
        None => c,
    };
    let alice = with_tls(scram(
        bootstrap,
        protocol,
        SaslConfig::scram_sha256(ALICE.0, ALICE.1),
    ));
    let bob = with_tls(scram(
        bootstrap,
        protocol,
        SaslConfig::scram_sha512(BOB.0, BOB.1),
    ));
    let mut written = produce(&alice, topic, 100).await;
    written.extend(produce(&bob, topic, 100).await);
    assert_eq!(written.len(), 200);
    let tally = group_read(
        vec![alice.clone(), bob.clone()],
        &format!("{topic}-group"),
        topic,
        &written,
        Duration::from_secs(60),
    )
    .await;
    assert_exactly_once(&tally, &written);

    let wrong = with_tls(scram(
        bootstrap,
        protocol,
        SaslConfig::scram_sha256(ALICE.0, "not-her-password"),
    ));
    let err = build_error(wrong).await;
    let RequestError::Authentication {
        mechanism, source, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*mechanism, "SCRAM-SHA-256");
    // tansu refuses inside SCRAM (`e=invalid-proof` in the server-final message);
    // Kafka answers SASL_AUTHENTICATION_FAILED. Either way the broker's words show.
    assert!(
        matches!(source, AuthError::Rejected { .. } | AuthError::Exchange(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains("invalid-proof"), "{err}");
    assert!(!err.to_string().contains("not-her-password"), "{err}");
    let unknown = with_tls(scram(
        bootstrap,
        protocol,
        SaslConfig::scram_sha512("mallory", "x"),
    ));
    let err = build_error(unknown).await;
    assert!(
        matches!(err, RequestError::Authentication { .. }),
        "{err:?}"
    );

    // tansu is built without PLAIN and hangs up on the handshake instead of listing
    // what it enables (sasl_responder.rs checks the list against a responder that
    // answers as Kafka does).
    let plain = with_tls(scram(
        bootstrap,
        protocol,
        SaslConfig::plain(ALICE.0, ALICE.1),
    ));
    let err = build_error(plain).await;
    assert!(
        matches!(err, RequestError::Authentication { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("sasl.mechanism"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_over_sasl_plaintext_against_tansu() {
    protocol_tests::init_tracing();
    let broker = SaslTansu::start_with(&scram_users().topic("scram-plain", 3)).expect("SASL tansu");
    scram_cases(
        &broker.bootstrap(),
        SecurityProtocol::SaslPlaintext,
        None,
        "scram-plain",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_over_sasl_ssl_through_stunnel() {
    protocol_tests::init_tracing();
    let broker =
        TlsTansu::start_with(TlsTansuOptions::default().sasl(scram_users().topic("scram-ssl", 3)))
            .expect("SASL_SSL tansu");
    let pki = broker.pki().clone();
    scram_cases(
        &broker.bootstrap(),
        SecurityProtocol::SaslSsl,
        Some(&pki),
        "scram-ssl",
    )
    .await;
}

/// KIP-368 against tansu: it gives a 60 s session lifetime and refuses a second
/// handshake, so each connection re-authenticates at 85-95% of it, is refused, and is
/// rebuilt with its waiting requests carried over. A 3-member group consumes through
/// at least three such rounds per connection (`OTTLA_REAUTH_SECS`, default 180 s) with
/// no rebalance and every record read exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_sessions_are_renewed_without_a_rebalance() {
    let logs =
        protocol_tests::log_capture::LogCapture::install("warn,ottla::driver::connection=info,ottla_proto::group=info,ottla::driver::group=info,ottla::consumer=info")
            .expect("log capture");
    let secs = protocol_tests::env_number("OTTLA_REAUTH_SECS", 180);
    let broker = SaslTansu::start_with(&scram_users().topic("renewed", 6)).expect("SASL tansu");
    let config = scram(
        &broker.bootstrap(),
        SecurityProtocol::SaslPlaintext,
        SaslConfig::scram_sha256(ALICE.0, ALICE.1),
    );
    // Written while the group reads: 20 records a second for the whole run.
    let (expect, tally) = write_while_a_group_reads(
        &config,
        "renewed",
        "renewed-group",
        secs,
        Duration::from_millis(50),
    )
    .await;
    assert!(
        expect.len() as u64 >= secs * 10,
        "only {} records written",
        expect.len()
    );
    if tally.reads.values().any(|n| *n > 1) {
        // What the members said while it went wrong (warnings and the connections).
        eprintln!("{}", logs.text());
    }
    assert_exactly_once(&tally, &expect);
    assert_no_rebalance_once_settled(&tally);

    let refused = logs.count("re-authentication failed; reconnecting");
    let renewed = logs.count("re-authenticated");
    let rounds = secs / 60;
    // Each member has at least a coordinator and a fetch connection.
    assert!(
        refused + renewed >= (rounds as usize) * 6,
        "{refused} connections rebuilt and {renewed} re-authenticated in {secs} s"
    );
    eprintln!(
        "KIP-368 on tansu over {secs} s: {refused} connections rebuilt after a refused re-authentication, {renewed} re-authenticated in place, {} records read once each",
        expect.len()
    );
}

/// Every log line at TRACE during a SASL run and a TLS run (a wrong password and a
/// refused key included, and an OIDC client with a right and a wrong client secret), and
/// every error's `Display` and `Debug`, are free of the
/// passwords, the private key and the configuration's secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_leak() {
    let logs = protocol_tests::log_capture::LogCapture::install("trace").expect("log capture");
    const PASSWORD: &str = "Zx9-secret-PASSWORD-q7";
    const WRONG: &str = "Wr0ng-secret-PASSWORD-k3";
    let mut said: Vec<String> = Vec::new();
    let mut note = |e: &dyn std::fmt::Debug, d: String| {
        said.push(format!("{e:?}"));
        said.push(d);
    };

    // SASL: both SCRAM mechanisms write and read; a wrong password is refused.
    let broker = SaslTansu::start_with(
        &SaslTansuOptions::users(&[
            ("carol", PASSWORD, ScramMechanism::Scram256),
            ("carol", PASSWORD, ScramMechanism::Scram512),
        ])
        .topic("quiet", 2),
    )
    .expect("SASL tansu");
    let carol256 = scram(
        &broker.bootstrap(),
        SecurityProtocol::SaslPlaintext,
        SaslConfig::scram_sha256("carol", PASSWORD),
    );
    let carol512 = scram(
        &broker.bootstrap(),
        SecurityProtocol::SaslPlaintext,
        SaslConfig::scram_sha512("carol", PASSWORD),
    );
    let written = produce(&carol256, "quiet", 20).await;
    let tally = group_read(
        vec![carol512.clone()],
        "quiet-group",
        "quiet",
        &written,
        Duration::from_secs(40),
    )
    .await;
    assert_exactly_once(&tally, &written);
    let wrong = scram(
        &broker.bootstrap(),
        SecurityProtocol::SaslPlaintext,
        SaslConfig::scram_sha512("carol", WRONG),
    );
    let err = build_error(wrong.clone()).await;
    note(&err, err.to_string());
    note(&carol256, String::new());
    note(&wrong, String::new());

    // TLS: a client key given in memory; then the same key with another certificate.
    let tls_broker =
        TlsTansu::start_with(TlsTansuOptions::default().mtls(true)).expect("mTLS tansu");
    tls_broker.create_topic("quiet-tls", 1).expect("topic");
    let pki = tls_broker.pki().clone();
    let (cert, key_path) = pki.client_cert(KeyFormat::Rsa);
    let key = std::fs::read_to_string(&key_path).expect("key");
    let inline = base(&tls_broker.bootstrap())
        .with_security_protocol(SecurityProtocol::Ssl)
        .with_tls(
            TlsConfig::new()
                .ca(Pem::file(pki.ca()))
                .client_certificate(Pem::file(&cert), Pem::inline(key.clone())),
        );
    let written = produce(&inline, "quiet-tls", 5).await;
    assert_eq!(written.len(), 5);
    note(&inline, String::new());
    let (other_cert, _) = pki.client_cert(KeyFormat::Sec1);
    let mismatched = base(&tls_broker.bootstrap())
        .with_security_protocol(SecurityProtocol::Ssl)
        .with_tls(
            TlsConfig::new()
                .ca(Pem::file(pki.ca()))
                .client_certificate(Pem::file(other_cert), Pem::inline(key.clone())),
        );
    match Consumer::builder("")
        .client_config(mismatched)
        .assign([TopicPartition::new("quiet-tls", 0)])
        .build()
        .await
    {
        Ok(_) => panic!("a key that does not fit its certificate was accepted"),
        Err(e) => note(&e, e.to_string()),
    }
    let garbage = ClientConfig::new("h:1")
        .set(
            "ssl.key.pem",
            &format!("-----BEGIN PRIVATE KEY-----\n{PASSWORD}\n"),
        )
        .expect("set");
    note(&garbage, String::new());
    let jaas = ClientConfig::new("h:1")
        .set("sasl.jaas.config", &format!(r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="carol" password="{PASSWORD}";"#))
        .expect("jaas");
    note(&jaas, String::new());
    let oauth = SaslConfig::oauth_bearer_unsecured_jwt("principal=carol").expect("jwt");
    note(&oauth, String::new());

    // OIDC client credentials: a producer with the right client secret, a build with a
    // wrong one; neither secret nor any token issued may appear.
    let (server, _oidc_tansu, front) = oidc_setup(Duration::from_secs(60), "quiet-oidc").await;
    let oidc = ClientConfig::from_properties(oidc_properties(
        &front.address(),
        &server.token_url(),
        OIDC_CLIENT.1,
    ))
    .expect("properties");
    let written = produce(&oidc, "quiet-oidc", 5).await;
    assert_eq!(written.len(), 5);
    note(&oidc, String::new());
    let wrong_oidc = ClientConfig::from_properties(oidc_properties(
        &front.address(),
        &server.token_url(),
        WRONG,
    ))
    .expect("properties");
    let err = build_error(wrong_oidc.clone()).await;
    note(&err, err.to_string());
    note(&wrong_oidc, String::new());
    let signatures = server.signatures();
    assert!(!signatures.is_empty(), "{:?}", server.lines());

    let key_lines: Vec<&str> = key
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .collect();
    assert!(key_lines.len() > 5, "the key has a body");
    let text = logs.text();
    assert!(
        // What was captured must cover the authentication, a produce and a fetch (a line
        // count alone dropped under 100 once metadata refreshes were paced).
        logs.count("TRACE") > 20
            && text.lines().count() > 50
            && text.contains("SaslAuthenticate")
            && text.contains("api=Produce")
            && text.contains("fetched partition"),
        "the capture saw too little to prove anything ({} lines, {} at TRACE):\n{text}",
        text.lines().count(),
        logs.count("TRACE")
    );
    for (what, haystack) in std::iter::once(("the logs", text.as_str()))
        .chain(said.iter().map(|s| ("an error or config", s.as_str())))
    {
        let oidc_secrets = [OIDC_CLIENT.1]
            .into_iter()
            .chain(signatures.iter().map(String::as_str));
        for secret in [PASSWORD, WRONG]
            .into_iter()
            .chain(key_lines.iter().copied())
            .chain(oidc_secrets)
        {
            assert!(
                !haystack.contains(secret),
                "{what} carries a secret: {}",
                &haystack[..haystack.len().min(300)]
            );
        }
    }
}

/// Waits until an ottla member and a confluent-kafka (librdkafka) member of one group
/// each own partitions of `topic`, together all `partitions` of them, none twice.
async fn share_with_confluent(
    config: ClientConfig,
    python: protocol_tests::pyclient::PyMemberBuilder,
    group: &str,
    topic: &str,
    partitions: i32,
) {
    let mut ottla = Consumer::builder("")
        .client_config(config)
        .group_id(group)
        .topics([topic])
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .build()
        .await
        .expect("ottla member");
    let python = python
        .session_timeout(Duration::from_secs(6))
        .heartbeat(Duration::from_millis(500))
        .spawn()
        .expect("confluent-kafka member");
    let all: BTreeSet<(String, i32)> = (0..partitions).map(|p| (topic.to_string(), p)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let _ = tokio::time::timeout(Duration::from_millis(200), ottla.recv()).await;
        let mine: BTreeSet<(String, i32)> = ottla
            .assignment()
            .into_iter()
            .map(|tp| (tp.topic, tp.partition))
            .collect();
        let theirs = python.assignment();
        let split = !mine.is_empty()
            && !theirs.is_empty()
            && mine.is_disjoint(&theirs)
            && mine.union(&theirs).cloned().collect::<BTreeSet<_>>() == all;
        if split {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no split in 60 s: ottla {mine:?}, confluent-kafka {theirs:?}; its errors: {:?}",
            python.errors()
        );
    }
    assert!(
        python.errors().is_empty(),
        "confluent-kafka: {:?}",
        python.errors()
    );
    ottla.close().await.expect("close");
    python.close().expect("confluent-kafka member closes");
}

/// A mixed group over TLS: an ottla member and a confluent-kafka (librdkafka, OpenSSL)
/// member share a group through stunnel, over SSL and then over SASL_SSL with
/// SCRAM-SHA-256 on the source-built tansu.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_group_with_confluent_kafka_over_ssl_and_sasl_ssl() {
    protocol_tests::init_tracing();
    use protocol_tests::pyclient::{PyClient, PyMember};
    let strategy = "cooperative-sticky";

    let broker = TlsTansu::start().expect("TLS tansu");
    broker.create_topic("mixed-tls", 6).expect("topic");
    let ca = broker.pki().ca();
    let group = format!("mixed-ssl-{}", std::process::id());
    let python = PyMember::builder(
        PyClient::Confluent,
        &broker.bootstrap(),
        &group,
        &["mixed-tls"],
        strategy,
    )
    .client_id("py-ssl")
    .set("security.protocol", "SSL")
    .set("ssl.ca.location", &ca.display().to_string());
    share_with_confluent(
        tls(&broker.bootstrap(), broker.pki()),
        python,
        &group,
        "mixed-tls",
        6,
    )
    .await;

    let broker =
        TlsTansu::start_with(TlsTansuOptions::default().sasl(scram_users().topic("mixed-sasl", 6)))
            .expect("SASL_SSL tansu");
    let ca = broker.pki().ca();
    let group = format!("mixed-sasl-ssl-{}", std::process::id());
    let python = PyMember::builder(
        PyClient::Confluent,
        &broker.bootstrap(),
        &group,
        &["mixed-sasl"],
        strategy,
    )
    .client_id("py-sasl-ssl")
    .set("security.protocol", "SASL_SSL")
    .set("ssl.ca.location", &ca.display().to_string())
    .set("sasl.mechanism", "SCRAM-SHA-256")
    .set("sasl.username", ALICE.0)
    .set("sasl.password", ALICE.1);
    let config = scram(
        &broker.bootstrap(),
        SecurityProtocol::SaslSsl,
        SaslConfig::scram_sha256(ALICE.0, ALICE.1),
    )
    .with_tls(TlsConfig::new().ca(Pem::file(broker.pki().ca())));
    share_with_confluent(config, python, &group, "mixed-sasl", 6).await;
}

// ---- PLAIN, OAUTHBEARER and in-band KIP-368, against the responder in test code ----
//
// No server on these machines serves PLAIN or OAUTHBEARER, or accepts an in-band
// re-authentication (tansu refuses it). `SaslResponder` answers the SASL requests itself
// by the RFC formats and forwards the rest to tansu; it is ottla's own reading of the
// specifications, not an independent peer.

const CAROL: (&str, &str) = ("carol", "carol-Pa55-word");

/// tansu advertising the responder's port, with `topic`, and the responder in front.
async fn responder(
    options: protocol_tests::sasl_responder::ResponderOptions,
    topic: &str,
    partitions: i32,
) -> (Tansu, protocol_tests::sasl_responder::SaslResponder) {
    let (listener, tansu, upstream) = protocol_tests::tansu::behind_a_front(topic, partitions)
        .await
        .expect("tansu");
    let front = protocol_tests::sasl_responder::SaslResponder::start(listener, upstream, options);
    (tansu, front)
}

fn responder_options(
    lifetime: Option<Duration>,
) -> protocol_tests::sasl_responder::ResponderOptions {
    protocol_tests::sasl_responder::ResponderOptions {
        users: vec![(CAROL.0.to_string(), CAROL.1.to_string())],
        oauth_principal: Some("svc-orders".to_string()),
        session_lifetime: lifetime,
        ..Default::default()
    }
}

/// PLAIN and OAUTHBEARER write and read through a group; a wrong password, a refused
/// token and a mechanism the server does not enable are typed errors from build(),
/// within 2 s, with the server's message or its list of mechanisms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_oauthbearer_against_the_responder() {
    protocol_tests::init_tracing();
    let (_tansu, front) = responder(responder_options(None), "responder", 3).await;
    let bootstrap = front.address();
    let plain = scram(
        &bootstrap,
        SecurityProtocol::SaslPlaintext,
        SaslConfig::plain(CAROL.0, CAROL.1),
    );
    let oauth = scram(
        &bootstrap,
        SecurityProtocol::SaslPlaintext,
        SaslConfig::oauth_bearer_unsecured_jwt("principal=svc-orders lifeSeconds=600")
            .expect("jwt config"),
    );
    let mut written = produce(&plain, "responder", 90).await;
    written.extend(produce(&oauth, "responder", 90).await);
    assert_eq!(written.len(), 180);
    let tally = group_read(
        vec![plain.clone(), oauth.clone()],
        "responder-group",
        "responder",
        &written,
        Duration::from_secs(60),
    )
    .await;
    assert_exactly_once(&tally, &written);
    let stats = front.stats();
    assert!(
        stats.authentications.iter().any(|m| m == "PLAIN")
            && stats.authentications.iter().any(|m| m == "OAUTHBEARER"),
        "{stats:?}"
    );

    let wrong = build_error(scram(
        &bootstrap,
        SecurityProtocol::SaslPlaintext,
        SaslConfig::plain(CAROL.0, "not-the-password"),
    ))
    .await;
    let RequestError::Authentication {
        mechanism: "PLAIN",
        source: AuthError::Rejected {
            code: 58, message, ..
        },
        ..
    } = &wrong
    else {
        panic!("not a PLAIN rejection: {wrong:?}");
    };
    assert!(message.contains("Invalid username or password"), "{wrong}");

    let intruder = build_error(scram(
        &bootstrap,
        SecurityProtocol::SaslPlaintext,
        SaslConfig::oauth_bearer_unsecured_jwt("principal=intruder").expect("jwt config"),
    ))
    .await;
    assert!(
        matches!(
            &intruder,
            RequestError::Authentication {
                mechanism: "OAUTHBEARER",
                source: AuthError::Rejected { code: 58, .. },
                ..
            }
        ),
        "{intruder:?}"
    );
    assert!(intruder.to_string().contains("invalid_token"), "{intruder}");

    let unknown = build_error(scram(
        &bootstrap,
        SecurityProtocol::SaslPlaintext,
        SaslConfig::scram_sha512(CAROL.0, CAROL.1),
    ))
    .await;
    let RequestError::Authentication {
        source: AuthError::MechanismNotEnabled { enabled, .. },
        ..
    } = &unknown
    else {
        panic!("not a mechanism error: {unknown:?}");
    };
    assert_eq!(enabled, &["PLAIN", "OAUTHBEARER"]);
    assert!(
        unknown.to_string().contains("PLAIN, OAUTHBEARER"),
        "{unknown}"
    );
    let stats = front.stats();
    assert!(stats.violations.is_empty(), "{:?}", stats.violations);
    assert_eq!(stats.reauthentications, 0, "no session lifetime was given");
}

/// KIP-368 in band: the responder gives 3 s sessions and accepts re-authentication. A
/// 3-member group and a producer run over PLAIN for `OTTLA_REAUTH_INBAND_SECS` (20 s by
/// default); every connection re-authenticates in place again and again, no request is
/// sent during a re-authentication or after a session ended (the responder would close
/// the connection and record it), the group never rebalances once settled, and every
/// record is delivered and read exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_band_reauthentication_loses_and_reorders_nothing() {
    protocol_tests::init_tracing();
    let secs = protocol_tests::env_number("OTTLA_REAUTH_INBAND_SECS", 20);
    let lifetime = Duration::from_secs(3);
    let (_tansu, front) = responder(responder_options(Some(lifetime)), "inband", 6).await;
    let config = scram(
        &front.address(),
        SecurityProtocol::SaslPlaintext,
        SaslConfig::plain(CAROL.0, CAROL.1),
    );
    let (expect, tally) = write_while_a_group_reads(
        &config,
        "inband",
        "inband-group",
        secs,
        Duration::from_millis(20),
    )
    .await;
    assert_exactly_once(&tally, &expect);
    assert_no_rebalance_once_settled(&tally);

    let stats = front.stats();
    assert!(stats.violations.is_empty(), "{:?}", stats.violations);
    assert!(stats.refused.is_empty(), "{:?}", stats.refused);
    // At least the producer's, and each member's coordinator and fetch connections,
    // renewed at 85-95% of 3 s for the whole run.
    let rounds = (secs as f64 / lifetime.as_secs_f64()) as usize;
    assert!(
        stats.reauthentications >= 7 * rounds.saturating_sub(2),
        "{} re-authentications over {} connections in {secs} s",
        stats.reauthentications,
        stats.connections
    );
    eprintln!(
        "KIP-368 in band: {} connections, {} re-authentications in {secs} s, {} records read once each, {} requests forwarded",
        stats.connections,
        stats.reauthentications,
        expect.len(),
        stats.forwarded
    );
}

/// An OAUTHBEARER token provider whose tokens live 4 s: the responder ends each session
/// at the token's expiry, so connections re-authenticate with a token fetched again
/// before the old one expires. The consumer reads throughout; no expired token is ever
/// presented (the responder would refuse it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauthbearer_tokens_are_refreshed_before_they_expire() {
    use ottla::security::{OAuthToken, Secret, TokenError, TokenFuture, TokenProvider};
    use ottla_proto::sasl::UnsecuredJwtConfig;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::SystemTime;

    struct Short {
        calls: AtomicUsize,
        jwt: UnsecuredJwtConfig,
    }
    impl TokenProvider for Short {
        fn token(&self) -> TokenFuture<'_> {
            Box::pin(async move {
                self.calls.fetch_add(1, Ordering::SeqCst);
                let now = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_err(|e| TokenError(e.to_string()))?;
                let (token, exp_ms) = self.jwt.token(now.as_millis() as i64);
                Ok(OAuthToken {
                    value: Secret::new(token),
                    expires_at: SystemTime::UNIX_EPOCH + Duration::from_millis(exp_ms as u64),
                    extensions: Vec::new(),
                })
            })
        }
    }
    protocol_tests::init_tracing();
    let provider = Arc::new(Short {
        calls: AtomicUsize::new(0),
        jwt: UnsecuredJwtConfig::parse("principal=svc-orders lifeSeconds=4").expect("jwt"),
    });
    // The responder's own lifetime is long: the token's expiry is what ends sessions.
    let (_tansu, front) = responder(
        responder_options(Some(Duration::from_secs(600))),
        "tokens",
        2,
    )
    .await;
    let config = scram(
        &front.address(),
        SecurityProtocol::SaslPlaintext,
        SaslConfig::oauth_bearer(provider.clone()),
    );
    let written = produce(&config, "tokens", 40).await;
    let mut consumer = Consumer::builder("")
        .client_config(config.clone())
        .assign([
            TopicPartition::new("tokens", 0),
            TopicPartition::new("tokens", 1),
        ])
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await
        .expect("consumer");
    let mut read = BTreeSet::new();
    let end = Instant::now() + Duration::from_secs(14);
    while Instant::now() < end {
        if let Ok(Some(r)) = tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await
        {
            let r = r.expect("no error while tokens rotate");
            read.insert((r.partition(), r.offset()));
        }
    }
    assert_eq!(read, written);
    let stats = front.stats();
    assert!(stats.violations.is_empty(), "{:?}", stats.violations);
    assert!(
        stats.refused.is_empty(),
        "an expired token: {:?}",
        stats.refused
    );
    let calls = provider.calls.load(Ordering::SeqCst);
    // 14 s of 3-4 s sessions: at least three renewals, each with a fresh token.
    assert!(stats.reauthentications >= 3, "{stats:?}");
    assert!(calls >= 4, "the provider was called {calls} times");
}

// OAUTHBEARER with OIDC client credentials (KIP-768) against a real OAuth 2.0 server:
// oauth2-mock-server (npm; `protocol_tests::oauth_server`) issues RS256 JWTs, and the
// responder checks their signatures with the server's public keys, their `sub` and
// their `exp`, as a broker configured with the identity provider's JWKS would.

const OIDC_CLIENT: (&str, &str) = ("svc-orders", "cl1ent-S3cret-oidc-7Q");

/// The properties a librdkafka user writes for OIDC, and nothing else.
fn oidc_properties(bootstrap: &str, token_url: &str, secret: &str) -> Vec<(String, String)> {
    [
        ("bootstrap.servers", bootstrap),
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanism", "OAUTHBEARER"),
        ("sasl.oauthbearer.method", "oidc"),
        ("sasl.oauthbearer.token.endpoint.url", token_url),
        ("sasl.oauthbearer.client.id", OIDC_CLIENT.0),
        ("sasl.oauthbearer.client.secret", secret),
        ("sasl.oauthbearer.scope", "kafka.read kafka.write"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The OAuth server (tokens living `ttl`), tansu, and the responder in front checking
/// the server's signatures.
async fn oidc_setup(
    ttl: Duration,
    topic: &str,
) -> (
    protocol_tests::oauth_server::OAuthServer,
    Tansu,
    protocol_tests::sasl_responder::SaslResponder,
) {
    let server =
        protocol_tests::oauth_server::OAuthServer::start(OIDC_CLIENT.0, OIDC_CLIENT.1, ttl)
            .expect("oauth2-mock-server (scripts/install-peers.sh installs it)");
    let options = protocol_tests::sasl_responder::ResponderOptions {
        oauth_principal: Some(OIDC_CLIENT.0.to_string()),
        oauth_rsa_keys: server.rsa_keys().expect("the server's keys"),
        // The token's expiry is what ends sessions.
        session_lifetime: Some(Duration::from_secs(600)),
        ..Default::default()
    };
    let (tansu, front) = responder(options, topic, 2).await;
    (server, tansu, front)
}

/// A producer and a consumer group member configured by property names only
/// (`sasl.oauthbearer.method=oidc` and its settings) fetch their tokens from
/// oauth2-mock-server with the client-credentials grant (HTTP Basic, form body, the
/// scope). Tokens live 4 s: over 14 s of reading, tokens are fetched again before they
/// expire and the connections re-authenticate with them (KIP-368); the responder never
/// refuses a token or sees a rule broken, no error reaches the application, and every
/// record is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_client_credentials_by_property_names_with_refresh() {
    protocol_tests::init_tracing();
    let (server, _tansu, front) = oidc_setup(Duration::from_secs(4), "oidc").await;
    let props = oidc_properties(&front.address(), &server.token_url(), OIDC_CLIENT.1);
    let config = ClientConfig::from_properties(props.clone()).expect("client properties");
    let written = produce(&config, "oidc", 40).await;
    assert_eq!(written.len(), 40);
    let mut consumer_props = props;
    for (k, v) in [
        ("group.id", "oidc-group"),
        ("ottla.topics", "oidc"),
        ("auto.offset.reset", "earliest"),
        ("session.timeout.ms", "6000"),
        ("heartbeat.interval.ms", "1000"),
    ] {
        consumer_props.push((k.to_string(), v.to_string()));
    }
    let mut consumer = ottla::ConsumerBuilder::from_properties(consumer_props)
        .expect("consumer properties")
        .build()
        .await
        .expect("consumer");
    let mut read = BTreeSet::new();
    let end = Instant::now() + Duration::from_secs(14);
    while Instant::now() < end {
        if let Ok(Some(r)) = tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await
        {
            let r = r.expect("no error while tokens rotate");
            read.insert((r.partition(), r.offset()));
        }
    }
    assert_eq!(read, written);
    consumer.close().await.expect("close");

    let stats = front.stats();
    assert!(stats.violations.is_empty(), "{:?}", stats.violations);
    assert!(
        stats.refused.is_empty(),
        "a token refused: {:?}",
        stats.refused
    );
    assert!(
        stats.authentications.iter().all(|m| m == "OAUTHBEARER")
            && !stats.authentications.is_empty(),
        "{stats:?}"
    );
    let issued = server.tokens_issued();
    assert!(server.refusals().is_empty(), "{:?}", server.refusals());
    for line in &issued {
        assert_eq!(
            line,
            "token svc-orders scope=kafka.read kafka.write grant=client_credentials content-type=application/x-www-form-urlencoded"
        );
    }
    // The producer's token, then the consumer's first and, over 14 s of 4 s tokens
    // refreshed at 80%, at least three more; each renewed session used a new one.
    assert!(
        issued.len() >= 5,
        "{} tokens issued: {issued:?}",
        issued.len()
    );
    assert!(stats.reauthentications >= 3, "{stats:?}");
    eprintln!(
        "OIDC: {} tokens issued by oauth2-mock-server, {} connections, {} first authentications, {} re-authentications, {} records read",
        issued.len(),
        stats.connections,
        stats.authentications.len(),
        stats.reauthentications,
        read.len()
    );
}

/// A wrong client secret is the endpoint's HTTP 401 with its `error` and
/// `error_description`, naming the settings to check, from build() within 2 s and
/// without the secret; an endpoint nobody listens on and a URL that is not a token
/// endpoint are named too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_refusals_are_typed_and_name_the_setting() {
    protocol_tests::init_tracing();
    let (server, _tansu, front) = oidc_setup(Duration::from_secs(60), "oidc-refused").await;
    let token_error = |e: RequestError| match e {
        RequestError::Authentication {
            mechanism: "OAUTHBEARER",
            source: AuthError::Token(message),
            ..
        } => message,
        other => panic!("not a token error: {other:?}"),
    };
    const WRONG: &str = "wr0ng-S3cret-oidc-5K";
    let config = ClientConfig::from_properties(oidc_properties(
        &front.address(),
        &server.token_url(),
        WRONG,
    ))
    .expect("properties");
    let message = token_error(build_error(config).await);
    assert!(
        message.contains("HTTP 401: invalid_client (Client authentication failed)")
            && message.contains("sasl.oauthbearer.client.secret"),
        "{message}"
    );
    assert!(!message.contains(WRONG), "{message}");
    assert_eq!(server.refusals().len(), 1, "{:?}", server.lines());

    let closed = format!("http://127.0.0.1:{}/token", free_port().expect("port"));
    let config =
        ClientConfig::from_properties(oidc_properties(&front.address(), &closed, OIDC_CLIENT.1))
            .expect("properties");
    let message = token_error(build_error(config).await);
    assert!(
        message.starts_with("sasl.oauthbearer.token.endpoint.url: cannot connect to 127.0.0.1:"),
        "{message}"
    );

    // The server's JWKS URL is no token endpoint: it answers a POST with 404.
    let config = ClientConfig::from_properties(oidc_properties(
        &front.address(),
        &server.jwks_url(),
        OIDC_CLIENT.1,
    ))
    .expect("properties");
    let message = token_error(build_error(config).await);
    assert!(message.contains("HTTP 404"), "{message}");

    let stats = front.stats();
    assert!(stats.authentications.is_empty(), "{stats:?}");
    assert!(server.tokens_issued().is_empty(), "{:?}", server.lines());
}

/// The token endpoint over https (oauth2-mock-server with the test PKI's server
/// certificate): with the endpoint's CA given by `https.ca.location` the client
/// authenticates and writes; without it (the platform's roots) the TLS failure names
/// the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_over_https_with_the_endpoints_ca() {
    protocol_tests::init_tracing();
    let pki = TestPki::generate().expect("pki");
    let (cert, key) = pki.server_cert(ServerCert::Good);
    let server = protocol_tests::oauth_server::OAuthServer::start_https(
        OIDC_CLIENT.0,
        OIDC_CLIENT.1,
        Duration::from_secs(60),
        &cert,
        &key,
    )
    .expect("oauth2-mock-server over https");
    assert!(server.token_url().starts_with("https://"));
    let options = protocol_tests::sasl_responder::ResponderOptions {
        oauth_principal: Some(OIDC_CLIENT.0.to_string()),
        oauth_rsa_keys: server.rsa_keys().expect("the server's keys"),
        ..Default::default()
    };
    let (_tansu, front) = responder(options, "oidc-https", 1).await;
    let mut props = oidc_properties(&front.address(), &server.token_url(), OIDC_CLIENT.1);
    let untrusted = ClientConfig::from_properties(props.clone()).expect("properties");
    props.push((
        "https.ca.location".to_string(),
        pki.ca().display().to_string(),
    ));
    let trusted = ClientConfig::from_properties(props).expect("properties");
    let written = produce(&trusted, "oidc-https", 5).await;
    assert_eq!(written.len(), 5);
    assert_eq!(server.tokens_issued().len(), 1, "{:?}", server.lines());

    let message = match build_error(untrusted).await {
        RequestError::Authentication {
            source: AuthError::Token(message),
            ..
        } => message,
        other => panic!("not a token error: {other:?}"),
    };
    assert!(
        message.starts_with("sasl.oauthbearer.token.endpoint.url: TLS with localhost:")
            && message.contains("unknown issuer")
            && message.contains("https.ca.location"),
        "{message}"
    );
    assert_eq!(server.tokens_issued().len(), 1);
}

/// Amazon MSK IAM through the responder, which checks each token as IAM would: a
/// presigned `kafka-cluster:Connect` URL for its region, signed with the access key's
/// secret, not expired. A producer and a consumer authenticate with
/// `SaslConfig::aws_msk_iam` and every record is read; a wrong secret is refused by the
/// server, and the error says the signature does not verify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msk_iam_tokens_are_accepted_by_a_sigv4_checking_server() {
    use ottla::security::AwsCredentials;
    use protocol_tests::sasl_responder::{MskIam, ResponderOptions};
    protocol_tests::init_tracing();
    const KEY: &str = "AKIAIOSFODNN7EXAMPLE";
    const SECRET: &str = "msk-Secret-Access-KEY-4Rz";
    let options = ResponderOptions {
        msk_iam: Some(MskIam {
            region: "eu-west-1".into(),
            access_key_id: KEY.into(),
            secret_access_key: SECRET.into(),
        }),
        session_lifetime: Some(Duration::from_secs(600)),
        ..Default::default()
    };
    let (_tansu, front) = responder(options, "msk", 2).await;
    let sasl =
        SaslConfig::aws_msk_iam("eu-west-1", AwsCredentials::new(KEY, SECRET)).expect("MSK IAM");
    let config = scram(&front.address(), SecurityProtocol::SaslPlaintext, sasl);
    let written = produce(&config, "msk", 30).await;
    let tally = group_read(
        vec![config.clone()],
        "msk-group",
        "msk",
        &written,
        Duration::from_secs(40),
    )
    .await;
    assert_exactly_once(&tally, &written);
    let stats = front.stats();
    assert!(stats.refused.is_empty(), "{:?}", stats.refused);
    assert!(stats.violations.is_empty(), "{:?}", stats.violations);
    assert!(
        !stats.authentications.is_empty()
            && stats.authentications.iter().all(|m| m == "OAUTHBEARER"),
        "{stats:?}"
    );

    let wrong = SaslConfig::aws_msk_iam("eu-west-1", AwsCredentials::new(KEY, "not-the-secret"))
        .expect("MSK IAM");
    let err = build_error(scram(
        &front.address(),
        SecurityProtocol::SaslPlaintext,
        wrong,
    ))
    .await;
    assert!(
        matches!(
            &err,
            RequestError::Authentication {
                mechanism: "OAUTHBEARER",
                source: AuthError::Rejected { code: 58, .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("signature does not verify"),
        "{err}"
    );
    let wrong_region =
        SaslConfig::aws_msk_iam("us-east-1", AwsCredentials::new(KEY, SECRET)).expect("MSK IAM");
    let err = build_error(scram(
        &front.address(),
        SecurityProtocol::SaslPlaintext,
        wrong_region,
    ))
    .await;
    assert!(
        err.to_string().contains("not a URL of kafka.eu-west-1"),
        "{err}"
    );
}
