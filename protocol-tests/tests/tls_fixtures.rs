//! Checks of the TLS and SASL test peers themselves ([`protocol_tests::tls`],
//! [`protocol_tests::tansu::SaslTansu`]), with independent clients: the `openssl` CLI
//! (`x509`, `verify`, `s_client`) and confluent-kafka (librdkafka) in Python.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use protocol_tests::tansu::{SaslTansu, SaslTansuOptions, ScramMechanism, Tansu};
use protocol_tests::tls::{
    KeyFormat, ServerCert, Stunnel, StunnelConfig, TempDir, TestPki, TlsTansu, TlsTansuOptions,
    confluent_create_topic, confluent_produce, find_openssl,
};

/// How long a producer that should fail is given.
const FAIL_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a producer that should succeed is given.
const OK_TIMEOUT: Duration = Duration::from_secs(10);

fn openssl(args: &[&str]) -> anyhow::Result<std::process::Output> {
    Command::new(find_openssl()?)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running openssl {}", args.join(" ")))
}

fn p(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// `openssl verify`: Ok(()) or the error text.
fn verify(ca: &Path, cert: &Path, extra: &[&str]) -> anyhow::Result<Result<(), String>> {
    let mut args = vec!["verify", "-CAfile", p(ca)];
    args.extend_from_slice(extra);
    args.push(p(cert));
    let out = openssl(&args)?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(if out.status.success() {
        Ok(())
    } else {
        Err(text)
    })
}

/// The public key of a certificate or of a private key, PEM.
fn public_key(path: &Path, is_cert: bool) -> anyhow::Result<String> {
    let out = if is_cert {
        openssl(&["x509", "-noout", "-pubkey", "-in", p(path)])?
    } else {
        openssl(&["pkey", "-pubout", "-in", p(path)])?
    };
    if !out.status.success() {
        bail!(
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A TLS handshake with `openssl s_client`, verifying the chain against `ca` and the
/// name against IP 127.0.0.1. Ok(()) or the output.
fn s_client(addr: &str, ca: &Path) -> anyhow::Result<Result<(), String>> {
    let out = openssl(&[
        "s_client",
        "-connect",
        addr,
        "-CAfile",
        p(ca),
        "-verify_return_error",
        "-verify_ip",
        "127.0.0.1",
        "-brief",
    ])?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(if out.status.success() {
        Ok(())
    } else {
        Err(text)
    })
}

fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn pki_files_parse_and_chain_as_named() -> anyhow::Result<()> {
    let started = Instant::now();
    let pki = TestPki::generate()?;
    eprintln!(
        "PKI generated in {:?} at {}",
        started.elapsed(),
        pki.dir().display()
    );
    let (ca, other) = (pki.ca(), pki.other_ca());
    for cert in [&ca, &other] {
        let out = openssl(&["x509", "-noout", "-in", p(cert)])?;
        assert!(out.status.success(), "{} does not parse", cert.display());
    }
    for which in ServerCert::ALL {
        let (cert, key) = pki.server_cert(which);
        assert_eq!(
            public_key(&cert, true)?,
            public_key(&key, false)?,
            "{which:?}"
        );
        let result = verify(&ca, &cert, &["-purpose", "sslserver"])?;
        match which {
            ServerCert::Good | ServerCert::WrongName => {
                assert_eq!(result, Ok(()), "{which:?}")
            }
            ServerCert::Expired => {
                let e = result.expect_err("expired verifies");
                assert!(e.contains("certificate has expired"), "{e}");
            }
            ServerCert::OtherCa => {
                let e = result.expect_err("other-CA cert verifies against ca.pem");
                assert!(e.contains("unable to get local issuer certificate"), "{e}");
                verify(&other, &cert, &[])?.expect("other-CA cert against other-ca.pem");
            }
        }
        let named = verify(&ca, &cert, &["-verify_ip", "127.0.0.1"])?;
        assert_eq!(
            named.is_ok(),
            which == ServerCert::Good,
            "{which:?} for IP 127.0.0.1: {named:?}"
        );
    }
    let (wrong, _) = pki.server_cert(ServerCert::WrongName);
    let e = verify(&ca, &wrong, &["-verify_hostname", "localhost"])?.expect_err("wrong name");
    assert!(e.contains("hostname mismatch"), "{e}");
    verify(
        &ca,
        &pki.server_cert(ServerCert::Good).0,
        &["-verify_hostname", "localhost"],
    )?
    .expect("good cert for localhost");

    for format in KeyFormat::ALL {
        let (cert, key) = pki.client_cert(format);
        let pem = std::fs::read_to_string(&key)?;
        assert!(
            pem.starts_with(format.pem_header()),
            "{format:?}: {pem:.40}"
        );
        assert_eq!(
            public_key(&cert, true)?,
            public_key(&key, false)?,
            "{format:?}"
        );
        verify(&ca, &cert, &["-purpose", "sslclient"])?.expect("client cert");
    }
    let (untrusted, key) = pki.untrusted_client_cert();
    assert_eq!(public_key(&untrusted, true)?, public_key(&key, false)?);
    assert!(verify(&ca, &untrusted, &[])?.is_err());
    verify(&other, &untrusted, &["-purpose", "sslclient"])?.expect("untrusted vs other CA");

    let dir = pki.dir().to_path_buf();
    drop(pki);
    assert!(!dir.exists(), "the PKI directory outlives the TestPki");

    let own = TempDir::new("tls-fixtures")?;
    drop(TestPki::generate_in(own.path())?);
    assert!(
        own.path().join("ca.pem").exists(),
        "generate_in removed its files"
    );
    Ok(())
}

#[test]
fn stunnel_presents_each_server_cert_and_counts_connections() -> anyhow::Result<()> {
    let pki = TestPki::generate()?;
    let tansu = Tansu::start()?;
    let connect = ([127, 0, 0, 1], tansu.port()).into();
    for which in ServerCert::ALL {
        let (cert, key) = pki.server_cert(which);
        let stunnel = Stunnel::start(StunnelConfig::new(cert, key, connect))?;
        assert_eq!(
            stunnel.accepted_connections(),
            0,
            "{which:?}: the probe counted"
        );
        let result = s_client(&stunnel.address(), &pki.ca())?;
        match which {
            ServerCert::Good => result.map_err(anyhow::Error::msg)?,
            _ => {
                let e = result.expect_err("a bad certificate passed s_client");
                let expected = match which {
                    ServerCert::Expired => "certificate has expired",
                    ServerCert::WrongName => "IP address mismatch",
                    _ => "unable to get local issuer certificate",
                };
                assert!(e.contains(expected), "{which:?}: {e}");
            }
        }
        // The accept line is written as the connection comes in; give it a moment.
        let deadline = Instant::now() + Duration::from_secs(2);
        while stunnel.accepted_connections() < 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            stunnel.accepted_connections(),
            1,
            "{which:?}; log {}",
            stunnel.log_path().display()
        );
    }
    Ok(())
}

#[test]
fn confluent_produces_over_tls_to_tansu_behind_stunnel() -> anyhow::Result<()> {
    let tls = TlsTansu::start()?;
    tls.create_topic("tls-topic", 2)?;
    let outcome = confluent_produce(
        &tls.bootstrap(),
        "tls-topic",
        &tls.librdkafka_config(),
        5,
        OK_TIMEOUT,
    )?;
    assert!(outcome.all_delivered(5), "{outcome:?}");
    Ok(())
}

#[test]
fn mtls_takes_every_key_format_and_refuses_others() -> anyhow::Result<()> {
    let tls = TlsTansu::start_with(TlsTansuOptions::default().mtls(true))?;
    tls.create_topic("mtls-topic", 1)?;
    let pki = tls.pki().clone();
    let base = kv(&[
        ("security.protocol", "SSL"),
        ("ssl.ca.location", p(&pki.ca())),
    ]);
    for format in KeyFormat::ALL {
        let (cert, key) = pki.client_cert(format);
        let mut config = base.clone();
        config.extend(kv(&[
            ("ssl.certificate.location", p(&cert)),
            ("ssl.key.location", p(&key)),
        ]));
        let outcome = confluent_produce(&tls.bootstrap(), "mtls-topic", &config, 2, OK_TIMEOUT)?;
        assert!(outcome.all_delivered(2), "{format:?}: {outcome:?}");
    }
    let (cert, key) = pki.untrusted_client_cert();
    let mut untrusted = base.clone();
    untrusted.extend(kv(&[
        ("ssl.certificate.location", p(&cert)),
        ("ssl.key.location", p(&key)),
    ]));
    for (what, config) in [
        ("no certificate", &base),
        ("an untrusted certificate", &untrusted),
    ] {
        let before = tls.stunnel().accepted_connections();
        let outcome = confluent_produce(&tls.bootstrap(), "mtls-topic", config, 1, FAIL_TIMEOUT)?;
        assert_eq!(outcome.delivered, 0, "{what}: {outcome:?}");
        assert!(!outcome.errors.is_empty(), "{what}: {outcome:?}");
        assert!(
            tls.stunnel().accepted_connections() > before,
            "{what}: stunnel saw no attempt"
        );
    }
    // librdkafka does not even present a certificate whose issuer is not among the
    // CAs the server names; `openssl s_client` does, and stunnel rejects it.
    let out = openssl(&[
        "s_client",
        "-connect",
        &tls.bootstrap(),
        "-CAfile",
        p(&pki.ca()),
        "-cert",
        p(&cert),
        "-key",
        p(&key),
        "-brief",
    ])?;
    let rejected = "Rejected by CERT at depth=0: CN=ottla-client-untrusted";
    let deadline = Instant::now() + Duration::from_secs(2);
    while !tls.stunnel().log().contains(rejected) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        tls.stunnel().log().contains(rejected),
        "s_client: {}{}; log {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        tls.stunnel().log_path().display()
    );
    Ok(())
}

#[test]
fn sasl_tansu_takes_scram_and_refuses_a_wrong_password() -> anyhow::Result<()> {
    let started = Instant::now();
    let options = SaslTansuOptions::users(&[
        ("alice", "alice-secret", ScramMechanism::Scram256),
        ("bob", "bob-secret", ScramMechanism::Scram512),
    ])
    .topic("sasl-topic", 2);
    let sasl = SaslTansu::start_with(&options)?;
    eprintln!("SASL tansu ready in {:?}", started.elapsed());
    let bootstrap = sasl.bootstrap();
    let plaintext = kv(&[("security.protocol", "SASL_PLAINTEXT")]);
    for user in sasl.users() {
        let mut config = plaintext.clone();
        config.extend(user.librdkafka_config());
        let outcome = confluent_produce(&bootstrap, "sasl-topic", &config, 3, OK_TIMEOUT)?;
        assert!(outcome.all_delivered(3), "{}: {outcome:?}", user.name);
    }

    let alice = sasl.user("alice").expect("alice").clone();
    let mut wrong = plaintext.clone();
    wrong.extend(kv(&[
        ("sasl.mechanism", "SCRAM-SHA-256"),
        ("sasl.username", "alice"),
        ("sasl.password", "not-her-password"),
    ]));
    let outcome = confluent_produce(&bootstrap, "sasl-topic", &wrong, 1, FAIL_TIMEOUT)?;
    assert_eq!(outcome.delivered, 0, "{outcome:?}");
    assert!(
        outcome.errors.iter().any(|e| e.contains("invalid-proof")),
        "{outcome:?}"
    );
    // alice's credential is stored for SCRAM-SHA-256 only.
    let mut other_mechanism = plaintext.clone();
    other_mechanism.extend(alice.librdkafka_config());
    other_mechanism.push(("sasl.mechanism".into(), "SCRAM-SHA-512".into()));
    let outcome = confluent_produce(&bootstrap, "sasl-topic", &other_mechanism, 1, FAIL_TIMEOUT)?;
    assert_eq!(outcome.delivered, 0, "{outcome:?}");

    // Topics after authentication is on: the CLI cannot authenticate, an
    // authenticated CreateTopics works.
    let cli = sasl.tansu().create_topic("cli-topic", 1);
    assert!(
        cli.is_err(),
        "tansu topic create worked under --authentication"
    );
    let mut admin = plaintext.clone();
    admin.extend(alice.librdkafka_config());
    confluent_create_topic(&bootstrap, &admin, "late-topic", 3, OK_TIMEOUT)?;
    let outcome = confluent_produce(&bootstrap, "late-topic", &admin, 2, OK_TIMEOUT)?;
    assert!(outcome.all_delivered(2), "{outcome:?}");
    Ok(())
}

#[test]
fn sasl_ssl_and_mtls_through_stunnel() -> anyhow::Result<()> {
    let pki = Arc::new(TestPki::generate()?);
    let sasl = SaslTansuOptions::users(&[("carol", "carol-secret", ScramMechanism::Scram512)])
        .topic("sasl-ssl-topic", 1);
    let tls = TlsTansu::start_with(
        TlsTansuOptions::default()
            .mtls(true)
            .sasl(sasl)
            .pki(pki.clone()),
    )?;
    let carol = tls.sasl().expect("a SASL broker").users()[0].clone();
    let mut config = tls.librdkafka_config();
    assert!(config.contains(&("security.protocol".into(), "SASL_SSL".into())));
    config.extend(carol.librdkafka_config());
    let outcome = confluent_produce(&tls.bootstrap(), "sasl-ssl-topic", &config, 3, OK_TIMEOUT)?;
    assert!(outcome.all_delivered(3), "{outcome:?}");

    let mut wrong = config.clone();
    wrong.push(("sasl.password".into(), "wrong".into()));
    let outcome = confluent_produce(&tls.bootstrap(), "sasl-ssl-topic", &wrong, 1, FAIL_TIMEOUT)?;
    assert_eq!(outcome.delivered, 0, "{outcome:?}");
    assert!(
        outcome.errors.iter().any(|e| e.contains("invalid-proof")),
        "{outcome:?}"
    );
    Ok(())
}

/// The quirks `PEERS.md` and [`SaslTansu`] describe, seen on the wire with a tiny
/// stdlib-only Python SCRAM client: a second SaslHandshake on an authenticated
/// connection gets UNSUPPORTED_SASL_MECHANISM (33) and leaves the connection
/// unauthenticated (the next Metadata closes it); SaslAuthenticate announces a 60 s
/// session lifetime; a request before authentication closes the connection.
#[test]
fn sasl_tansu_rehandshake_and_session_lifetime() -> anyhow::Result<()> {
    let sasl = SaslTansu::start(&[("dave", "dave-secret", ScramMechanism::Scram256)], None)?;
    let out = Command::new("python3")
        .args(["-c", RAW_SCRAM_PY, "127.0.0.1"])
        .arg(sasl.port().to_string())
        .args(["dave", "dave-secret"])
        .stdin(Stdio::null())
        .output()
        .context("running python3")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expect = [
        "unauthenticated metadata -> closed",
        "handshake -> 0",
        "authenticate -> 0 lifetime 60000",
        "metadata -> answered",
        "second handshake -> 33",
        "metadata after second handshake -> closed",
    ];
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, expect, "{stdout}");
    Ok(())
}

/// SCRAM-SHA-256 over SaslHandshake v1 / SaslAuthenticate v1, and Metadata v1, on
/// raw sockets. Arguments: host port user password.
const RAW_SCRAM_PY: &str = r#"
import base64, hashlib, hmac, os, socket, struct, sys
host, port, user, pw = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def connect():
    s = socket.create_connection((host, port)); s.settimeout(10); return s
cid = [0]
def call(s, key, ver, body):
    cid[0] += 1
    msg = struct.pack(">hhih", key, ver, cid[0], 5) + b"ottla" + body
    s.sendall(struct.pack(">i", len(msg)) + msg)
    head = s.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    size = struct.unpack(">i", head)[0]
    data = s.recv(size, socket.MSG_WAITALL)
    return data[4:] if len(data) == size else None
def metadata(s):
    try:
        return "answered" if call(s, 3, 1, struct.pack(">i", -1)) is not None else "closed"
    except ConnectionResetError:
        return "closed"
def handshake(s, mech):
    r = call(s, 17, 1, struct.pack(">h", len(mech)) + mech.encode())
    return struct.unpack(">h", r[:2])[0]
def authenticate(s, data):
    r = call(s, 36, 1, struct.pack(">i", len(data)) + data)
    err, mlen = struct.unpack(">hh", r[:4]); off = 4 + max(mlen, 0)
    alen = struct.unpack(">i", r[off:off + 4])[0]; off += 4
    auth = r[off:off + alen]; off += alen
    return err, auth, struct.unpack(">q", r[off:off + 8])[0]
s = connect()
print("unauthenticated metadata ->", metadata(s))
s = connect()
print("handshake ->", handshake(s, "SCRAM-SHA-256"))
nonce = base64.b64encode(os.urandom(18)).decode()
bare = "n=%s,r=%s" % (user, nonce)
err, first, life = authenticate(s, ("n,," + bare).encode())
first = first.decode()
f = dict(kv.split("=", 1) for kv in first.split(","))
salted = hashlib.pbkdf2_hmac("sha256", pw.encode(), base64.b64decode(f["s"]), int(f["i"]))
ckey = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
without_proof = "c=biws,r=" + f["r"]
sig = hmac.new(hashlib.sha256(ckey).digest(), ("%s,%s,%s" % (bare, first, without_proof)).encode(), hashlib.sha256).digest()
proof = base64.b64encode(bytes(a ^ b for a, b in zip(ckey, sig))).decode()
err, final, life = authenticate(s, ("%s,p=%s" % (without_proof, proof)).encode())
print("authenticate ->", err, "lifetime", life)
print("metadata ->", metadata(s))
print("second handshake ->", handshake(s, "SCRAM-SHA-256"))
print("metadata after second handshake ->", metadata(s))
"#;
