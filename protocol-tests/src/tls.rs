//! TLS test peers: a throw-away PKI made with the `openssl` CLI ([`TestPki`]), stunnel
//! as a TLS terminator ([`Stunnel`]), and tansu behind stunnel ([`TlsTansu`]), with or
//! without mTLS and SASL.
//!
//! tansu 0.6 has no working TLS of its own (`PEERS.md`), so TLS is stunnel's: tansu
//! listens on `127.0.0.1:P` and advertises `127.0.0.1:S`, and stunnel accepts TLS on
//! `S` and forwards the plain bytes to `P`. The certificates come from OpenSSL, an
//! implementation independent of the client's rustls. `openssl` and `stunnel4` are
//! Debian packages that `bash scripts/install-peers.sh` installs when missing.
//!
//! [`confluent_produce`] and [`confluent_create_topic`] run confluent-kafka (Python)
//! with any librdkafka security settings, as a reference client.

use std::ffi::OsString;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::tansu::{
    SaslTansu, SaslTansuOptions, Tansu, TansuOptions, free_port, log_tail, unique_log_path,
};
pub use ottla_testkit::process::TempDir;

/// How long a stunnel start waits for its port to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
const STUNNEL_HINT: &str = "install it with `apt-get install stunnel4` (`bash \
     scripts/install-peers.sh` does, as root), or set STUNNEL_BIN";
const OPENSSL_HINT: &str = "install it with `apt-get install openssl` (`bash \
     scripts/install-peers.sh` does, as root), or set OPENSSL_BIN";

fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// `$<var>` if set, else the first of `names` on `PATH` (then in `/usr/bin` and
/// `/usr/sbin`, which a minimal `PATH` may lack).
fn find_program(var: &str, names: &[&str], hint: &str) -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        if is_executable_file(&bin) {
            return Ok(bin);
        }
        bail!("{var}={} is not an executable file; {hint}", bin.display());
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")]);
    for name in names {
        if let Some(bin) = dirs
            .iter()
            .map(|d| d.join(name))
            .find(|p| is_executable_file(p))
        {
            return Ok(bin);
        }
    }
    bail!("{} not found on PATH; {hint}", names.join(" or "))
}

/// The stunnel binary: `$STUNNEL_BIN`, else `stunnel4` or `stunnel` on `PATH`.
pub fn find_stunnel() -> anyhow::Result<PathBuf> {
    find_program("STUNNEL_BIN", &["stunnel4", "stunnel"], STUNNEL_HINT)
}

/// The `openssl` command: `$OPENSSL_BIN`, else `openssl` on `PATH`.
pub fn find_openssl() -> anyhow::Result<PathBuf> {
    find_program("OPENSSL_BIN", &["openssl"], OPENSSL_HINT)
}

/// The PEM encoding of a client certificate's private key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyFormat {
    /// PKCS#8, `-----BEGIN PRIVATE KEY-----` (an EC P-256 key).
    Pkcs8,
    /// PKCS#1, `-----BEGIN RSA PRIVATE KEY-----` (RSA 2048).
    Rsa,
    /// SEC1, `-----BEGIN EC PRIVATE KEY-----` (EC P-256).
    Sec1,
}

impl KeyFormat {
    /// All three.
    pub const ALL: [KeyFormat; 3] = [KeyFormat::Pkcs8, KeyFormat::Rsa, KeyFormat::Sec1];

    /// The PEM header the key file starts with.
    pub fn pem_header(self) -> &'static str {
        match self {
            KeyFormat::Pkcs8 => "-----BEGIN PRIVATE KEY-----",
            KeyFormat::Rsa => "-----BEGIN RSA PRIVATE KEY-----",
            KeyFormat::Sec1 => "-----BEGIN EC PRIVATE KEY-----",
        }
    }

    fn file_stem(self) -> &'static str {
        match self {
            KeyFormat::Pkcs8 => "client-pkcs8",
            KeyFormat::Rsa => "client-rsa",
            KeyFormat::Sec1 => "client-sec1",
        }
    }
}

/// Which server certificate stunnel presents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ServerCert {
    /// SAN `IP:127.0.0.1, DNS:localhost`, signed by the CA, valid now (`server.pem`).
    #[default]
    Good,
    /// The same SANs and CA, but valid only from 2020-01-01 to 2020-01-02
    /// (`server-expired.pem`).
    Expired,
    /// Signed by the CA, valid, but for `DNS:wrong.example` only
    /// (`server-wrong-name.pem`).
    WrongName,
    /// The good SANs, valid, but signed by the unrelated `other-ca.pem`
    /// (`server-other-ca.pem`): an unknown issuer.
    OtherCa,
}

impl ServerCert {
    /// All four.
    pub const ALL: [ServerCert; 4] = [
        ServerCert::Good,
        ServerCert::Expired,
        ServerCert::WrongName,
        ServerCert::OtherCa,
    ];

    fn file_name(self) -> &'static str {
        match self {
            ServerCert::Good => "server.pem",
            ServerCert::Expired => "server-expired.pem",
            ServerCert::WrongName => "server-wrong-name.pem",
            ServerCert::OtherCa => "server-other-ca.pem",
        }
    }
}

/// The OpenSSL configuration for the CAs and the certificates' extensions. Paths are
/// relative to the PKI directory, where every `openssl` command runs.
const OPENSSL_CNF: &str = "\
[req]
distinguished_name = req_dn
[req_dn]

[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash

[ca]
default_ca = ca_main

[ca_main]
database = ca-db/index.txt
new_certs_dir = ca-db
serial = ca-db/serial
certificate = ca.pem
private_key = ca.key
default_md = sha256
policy = policy_any
unique_subject = no
copy_extensions = none
email_in_dn = no

[ca_other]
database = other-ca-db/index.txt
new_certs_dir = other-ca-db
serial = other-ca-db/serial
certificate = other-ca.pem
private_key = other-ca.key
default_md = sha256
policy = policy_any
unique_subject = no
copy_extensions = none
email_in_dn = no

[policy_any]
commonName = supplied

[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = IP:127.0.0.1,DNS:localhost

[wrong_name_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = DNS:wrong.example

[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// A throw-away PKI in its own temporary directory (removed on drop), made with the
/// `openssl` CLI:
/// - `ca.pem` (the CA clients should trust) and `other-ca.pem` (an unrelated CA);
/// - server certificates ([`ServerCert`]), all with the key `server.key` (EC P-256,
///   PKCS#8);
/// - client certificates signed by the CA, one per [`KeyFormat`], and one signed by
///   `other-ca.pem` ([`TestPki::untrusted_client_cert`]), all with `extendedKeyUsage =
///   clientAuth`.
///
/// Nothing is cached: each call of [`TestPki::generate`] makes new keys (about 0.5 s,
/// most of it the RSA key).
#[derive(Debug)]
pub struct TestPki {
    dir: PathBuf,
    /// The directory, when this PKI owns it ([`TestPki::generate`]).
    _temp: Option<TempDir>,
}

impl TestPki {
    /// Generates a fresh PKI in a new temporary directory, removed on drop.
    pub fn generate() -> anyhow::Result<TestPki> {
        let temp = TempDir::new("ottla-pki")?;
        let pki = TestPki {
            dir: temp.path().to_path_buf(),
            _temp: Some(temp),
        };
        pki.build()
            .with_context(|| format!("generating a test PKI in {}", pki.dir().display()))?;
        Ok(pki)
    }

    /// Generates a fresh PKI in `dir`, an existing directory without earlier PKI files,
    /// which stays after drop.
    pub fn generate_in(dir: &Path) -> anyhow::Result<TestPki> {
        let pki = TestPki {
            dir: dir.to_path_buf(),
            _temp: None,
        };
        pki.build()
            .with_context(|| format!("generating a test PKI in {}", dir.display()))?;
        Ok(pki)
    }

    fn build(&self) -> anyhow::Result<()> {
        let openssl = find_openssl()?;
        let dir = self.dir();
        std::fs::write(dir.join("openssl.cnf"), OPENSSL_CNF)?;
        let tag = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let run = |args: &[&str]| run_openssl(&openssl, dir, args);

        // The two CAs.
        for (name, db, cn) in [
            ("ca", "ca-db", format!("ottla test CA {tag}")),
            (
                "other-ca",
                "other-ca-db",
                format!("ottla unrelated CA {tag}"),
            ),
        ] {
            std::fs::create_dir(dir.join(db))?;
            std::fs::write(dir.join(db).join("index.txt"), "")?;
            std::fs::write(dir.join(db).join("serial"), "1000\n")?;
            let key = format!("{name}.key");
            gen_ec_pkcs8(&run, &key)?;
            run(&[
                "req",
                "-config",
                "openssl.cnf",
                "-new",
                "-x509",
                "-key",
                &key,
                "-subj",
                &format!("/CN={cn}"),
                "-days",
                "3650",
                "-extensions",
                "ca_ext",
                "-out",
                &format!("{name}.pem"),
            ])?;
        }

        // Server certificates, all on one key.
        gen_ec_pkcs8(&run, "server.key")?;
        run(&csr_args("server.key", "/CN=localhost", "server.csr"))?;
        run(&csr_args(
            "server.key",
            "/CN=wrong.example",
            "server-wrong.csr",
        ))?;
        let sign = |ca: &str, csr: &str, ext: &str, out: &str, validity: &[&str]| {
            let mut args = vec![
                "ca",
                "-batch",
                "-config",
                "openssl.cnf",
                "-name",
                ca,
                "-notext",
                "-in",
                csr,
                "-out",
                out,
                "-extensions",
                ext,
            ];
            args.extend_from_slice(validity);
            run(&args)
        };
        let valid: &[&str] = &["-days", "365"];
        sign("ca_main", "server.csr", "server_ext", "server.pem", valid)?;
        sign(
            "ca_main",
            "server.csr",
            "server_ext",
            "server-expired.pem",
            &[
                "-startdate",
                "20200101000000Z",
                "-enddate",
                "20200102000000Z",
            ],
        )?;
        sign(
            "ca_main",
            "server-wrong.csr",
            "wrong_name_ext",
            "server-wrong-name.pem",
            valid,
        )?;
        sign(
            "ca_other",
            "server.csr",
            "server_ext",
            "server-other-ca.pem",
            valid,
        )?;

        // Client certificates, one per key format, and one from the other CA.
        for format in KeyFormat::ALL {
            let stem = format.file_stem();
            let key = format!("{stem}.key");
            match format {
                KeyFormat::Pkcs8 => gen_ec_pkcs8(&run, &key)?,
                KeyFormat::Rsa => run(&["genrsa", "-traditional", "-out", &key, "2048"])?,
                KeyFormat::Sec1 => run(&[
                    "ecparam",
                    "-name",
                    "prime256v1",
                    "-genkey",
                    "-noout",
                    "-out",
                    &key,
                ])?,
            }
            let pem = std::fs::read_to_string(dir.join(&key))?;
            if !pem.trim_start().starts_with(format.pem_header()) {
                bail!(
                    "{key} does not start with {}: this openssl writes another format",
                    format.pem_header()
                );
            }
            let csr = format!("{stem}.csr");
            run(&csr_args(&key, &format!("/CN=ottla-{stem}"), &csr))?;
            sign("ca_main", &csr, "client_ext", &format!("{stem}.pem"), valid)?;
        }
        gen_ec_pkcs8(&run, "client-untrusted.key")?;
        run(&csr_args(
            "client-untrusted.key",
            "/CN=ottla-client-untrusted",
            "client-untrusted.csr",
        ))?;
        sign(
            "ca_other",
            "client-untrusted.csr",
            "client_ext",
            "client-untrusted.pem",
            valid,
        )?;
        Ok(())
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `ca.pem`: the CA that signed the server and client certificates (but
    /// [`ServerCert::OtherCa`] and the untrusted client).
    pub fn ca(&self) -> PathBuf {
        self.dir().join("ca.pem")
    }

    /// `other-ca.pem`: an unrelated CA.
    pub fn other_ca(&self) -> PathBuf {
        self.dir().join("other-ca.pem")
    }

    /// A server certificate and its key `(cert, key)`.
    pub fn server_cert(&self, which: ServerCert) -> (PathBuf, PathBuf) {
        (
            self.dir().join(which.file_name()),
            self.dir().join("server.key"),
        )
    }

    /// A client certificate signed by the CA, with its key in `format`: `(cert, key)`.
    pub fn client_cert(&self, format: KeyFormat) -> (PathBuf, PathBuf) {
        let stem = format.file_stem();
        (
            self.dir().join(format!("{stem}.pem")),
            self.dir().join(format!("{stem}.key")),
        )
    }

    /// A client certificate signed by `other-ca.pem` (PKCS#8 EC key), which a server
    /// trusting only `ca.pem` refuses: `(cert, key)`.
    pub fn untrusted_client_cert(&self) -> (PathBuf, PathBuf) {
        (
            self.dir().join("client-untrusted.pem"),
            self.dir().join("client-untrusted.key"),
        )
    }
}

fn csr_args<'a>(key: &'a str, subject: &'a str, out: &'a str) -> [&'a str; 10] {
    [
        "req",
        "-config",
        "openssl.cnf",
        "-new",
        "-key",
        key,
        "-subj",
        subject,
        "-out",
        out,
    ]
}

fn gen_ec_pkcs8(run: &impl Fn(&[&str]) -> anyhow::Result<()>, out: &str) -> anyhow::Result<()> {
    run(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        out,
    ])
}

fn run_openssl(openssl: &Path, dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(openssl)
        .args(args)
        .current_dir(dir)
        // Never pick up the machine's own configuration by accident.
        .env("OPENSSL_CONF", dir.join("openssl.cnf"))
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} {}", openssl.display(), args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "openssl {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(())
}

/// How to start a [`Stunnel`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StunnelConfig {
    /// The server certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// Where the decrypted bytes go.
    pub connect: SocketAddr,
    /// The port to accept TLS on (`127.0.0.1`); `None`: a free one.
    pub accept_port: Option<u16>,
    /// mTLS: the CA client certificates must chain to (`CAfile`, `verify = 2`: a
    /// client without a valid certificate is refused during the handshake).
    pub client_ca: Option<PathBuf>,
    /// stunnel's `debug` level: 5 (notice) logs one "accepted connection" line per
    /// connection, which [`Stunnel::accepted_connections`] counts; 7 adds the TLS
    /// details. Default 7.
    pub debug_level: u8,
}

impl StunnelConfig {
    /// TLS with `cert`/`key` in front of `connect`, on a free port, without mTLS.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>, connect: SocketAddr) -> Self {
        StunnelConfig {
            cert: cert.into(),
            key: key.into(),
            connect,
            accept_port: None,
            client_ca: None,
            debug_level: 7,
        }
    }

    /// Sets [`StunnelConfig::accept_port`].
    pub fn accept_port(mut self, port: u16) -> Self {
        self.accept_port = Some(port);
        self
    }

    /// Sets [`StunnelConfig::client_ca`] (mTLS).
    pub fn client_ca(mut self, ca: impl Into<PathBuf>) -> Self {
        self.client_ca = Some(ca.into());
        self
    }
}

/// A running stunnel (the Debian `stunnel4` package) terminating TLS on
/// `127.0.0.1:port` and forwarding to a plain TCP address; killed on drop. Its config
/// file and log (stderr, in the foreground) are in `<target>/peer-logs`.
#[derive(Debug)]
pub struct Stunnel {
    child: Child,
    port: u16,
    log: PathBuf,
    conf: PathBuf,
    /// Local ports of the readiness probes' connections, left out of
    /// [`Stunnel::accepted_connections`].
    probes: Vec<u16>,
}

/// Why one start attempt failed.
enum StartError {
    /// stunnel exited before it was ready: most likely the port was taken meanwhile.
    Exited(anyhow::Error),
    Other(anyhow::Error),
}

impl Stunnel {
    /// Starts stunnel and waits until its port accepts connections. On a free port, a
    /// start that fails because stunnel exits is tried once more on another.
    pub fn start(config: StunnelConfig) -> anyhow::Result<Stunnel> {
        let bin = find_stunnel()?;
        match Self::start_once(&bin, &config) {
            Ok(s) => Ok(s),
            Err(StartError::Exited(first)) if config.accept_port.is_none() => {
                match Self::start_once(&bin, &config) {
                    Ok(s) => Ok(s),
                    Err(StartError::Exited(e) | StartError::Other(e)) => Err(e.context(format!(
                        "stunnel failed to start twice; the first time: {first:#}"
                    ))),
                }
            }
            Err(StartError::Exited(e) | StartError::Other(e)) => Err(e),
        }
    }

    fn start_once(bin: &Path, config: &StunnelConfig) -> Result<Stunnel, StartError> {
        let port = match config.accept_port {
            Some(port) => port,
            None => free_port().map_err(StartError::Other)?,
        };
        let log = unique_log_path("stunnel", port, "log");
        let conf = log.with_extension("conf");
        let mut text = format!(
            "; ottla protocol-tests: TLS on 127.0.0.1:{port} -> {connect}\n\
             foreground = yes\n\
             pid =\n\
             debug = {debug}\n\
             socket = l:TCP_NODELAY=1\n\
             socket = r:TCP_NODELAY=1\n\
             \n\
             [kafka]\n\
             accept = 127.0.0.1:{port}\n\
             connect = {connect}\n\
             cert = {cert}\n\
             key = {key}\n",
            connect = config.connect,
            debug = config.debug_level,
            cert = config.cert.display(),
            key = config.key.display(),
        );
        if let Some(ca) = &config.client_ca {
            text.push_str(&format!("CAfile = {}\nverify = 2\n", ca.display()));
        }
        std::fs::write(&conf, text)
            .with_context(|| format!("writing {}", conf.display()))
            .map_err(StartError::Other)?;
        let file = File::create(&log)
            .with_context(|| format!("creating {}", log.display()))
            .map_err(StartError::Other)?;
        let err_file = file
            .try_clone()
            .context("duplicating the log file handle")
            .map_err(StartError::Other)?;
        let child = Command::new(bin)
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err_file)
            .spawn()
            .with_context(|| format!("spawning {} {}", bin.display(), conf.display()))
            .map_err(StartError::Other)?;
        let mut stunnel = Stunnel {
            child,
            port,
            log,
            conf,
            probes: Vec::new(),
        };
        stunnel.wait_ready()?;
        Ok(stunnel)
    }

    fn wait_ready(&mut self) -> Result<(), StartError> {
        let addr = self.socket_addr();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    return Err(StartError::Exited(anyhow::anyhow!(
                        "stunnel exited during start-up ({status}) on port {}; config {}, log {}:\n{}",
                        self.port,
                        self.conf.display(),
                        self.log.display(),
                        log_tail(&self.log)
                    )));
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(StartError::Other(
                        anyhow::Error::new(e).context("waiting for stunnel"),
                    ));
                }
            }
            if let Ok(probe) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                if let Ok(local) = probe.local_addr() {
                    self.probes.push(local.port());
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StartError::Other(anyhow::anyhow!(
                    "stunnel did not accept connections on {addr} within {READY_TIMEOUT:?}; log {}:\n{}",
                    self.log.display(),
                    log_tail(&self.log)
                )));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The port it accepts TLS on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// Its log file (kept after it stops).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Its configuration file.
    pub fn config_path(&self) -> &Path {
        &self.conf
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// How many TCP connections it has accepted so far, not counting its own readiness
    /// probe: the log's `Service [kafka] accepted connection from 127.0.0.1:PORT` lines
    /// (at `debug` 5 or more). A TLS handshake that then fails still counts, so this is
    /// the number of connection attempts clients made. The line is written right after
    /// the accept: allow some milliseconds after a client's attempt.
    pub fn accepted_connections(&self) -> usize {
        self.log()
            .lines()
            .filter_map(|line| line.split_once("accepted connection from ").map(|(_, a)| a))
            .filter(|peer| {
                let port = peer.trim().rsplit(':').next().and_then(|p| p.parse().ok());
                !port.is_some_and(|p: u16| self.probes.contains(&p))
            })
            .count()
    }
}

impl Drop for Stunnel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How to start a [`TlsTansu`]; [`Default`]: the wheel's tansu (in memory, no SASL)
/// behind the good certificate, without mTLS, with a fresh PKI.
#[derive(Debug, Clone, Default)]
pub struct TlsTansuOptions {
    /// The certificate stunnel presents.
    pub server_cert: ServerCert,
    /// mTLS: stunnel requires a client certificate chaining to the PKI's CA.
    pub mtls: bool,
    /// `Some`: the SASL-capable tansu ([`SaslTansu`]) with these users and topics (its
    /// `advertised` and `port` are set by [`TlsTansu`]); `None`: the wheel's tansu.
    pub sasl: Option<SaslTansuOptions>,
    /// The PKI to use; `None`: a fresh [`TestPki`].
    pub pki: Option<Arc<TestPki>>,
    /// stunnel's `debug` level; `None`: [`StunnelConfig`]'s 7. Level 7 costs stunnel
    /// about 35 ms per connection in logging; benchmarks use 3.
    pub stunnel_debug: Option<u8>,
}

impl TlsTansuOptions {
    /// Sets [`TlsTansuOptions::server_cert`].
    pub fn server_cert(mut self, which: ServerCert) -> Self {
        self.server_cert = which;
        self
    }

    /// Sets [`TlsTansuOptions::stunnel_debug`].
    pub fn stunnel_debug(mut self, level: u8) -> Self {
        self.stunnel_debug = Some(level);
        self
    }

    /// Sets [`TlsTansuOptions::mtls`].
    pub fn mtls(mut self, on: bool) -> Self {
        self.mtls = on;
        self
    }

    /// Sets [`TlsTansuOptions::sasl`].
    pub fn sasl(mut self, sasl: SaslTansuOptions) -> Self {
        self.sasl = Some(sasl);
        self
    }

    /// Sets [`TlsTansuOptions::pki`].
    pub fn pki(mut self, pki: Arc<TestPki>) -> Self {
        self.pki = Some(pki);
        self
    }
}

/// The broker behind a [`TlsTansu`].
#[derive(Debug)]
pub enum TlsBackend {
    /// The wheel's tansu: in memory, no authentication.
    Plain(Tansu),
    /// The `libsql` tansu with SCRAM users.
    Sasl(SaslTansu),
}

impl TlsBackend {
    /// The tansu process.
    pub fn tansu(&self) -> &Tansu {
        match self {
            TlsBackend::Plain(t) => t,
            TlsBackend::Sasl(s) => s.tansu(),
        }
    }
}

/// tansu on `127.0.0.1:P` advertising `127.0.0.1:S`, behind stunnel accepting TLS on
/// `S`: clients bootstrap from [`TlsTansu::bootstrap`] and are sent back to it by
/// Metadata and FindCoordinator. Stopped (both processes) on drop.
#[derive(Debug)]
pub struct TlsTansu {
    // Field order is drop order: stunnel first, then the broker, then the PKI.
    stunnel: Stunnel,
    backend: TlsBackend,
    pki: Arc<TestPki>,
    options: TlsTansuOptions,
}

impl TlsTansu {
    /// The wheel's tansu behind stunnel with the good certificate, no mTLS.
    pub fn start() -> anyhow::Result<TlsTansu> {
        Self::start_with(TlsTansuOptions::default())
    }

    /// Starts as `options` say. A lost race for the stunnel port (chosen before tansu
    /// starts, as tansu must advertise it) is retried once with new ports.
    pub fn start_with(mut options: TlsTansuOptions) -> anyhow::Result<TlsTansu> {
        let pki = match options.pki.take() {
            Some(pki) => pki,
            None => Arc::new(TestPki::generate()?),
        };
        options.pki = Some(pki.clone());
        match Self::start_once(&pki, &options) {
            Ok(t) => Ok(t),
            Err(first) => Self::start_once(&pki, &options).map_err(|e| {
                e.context(format!(
                    "TLS tansu failed to start twice; the first time: {first:#}"
                ))
            }),
        }
    }

    fn start_once(pki: &Arc<TestPki>, options: &TlsTansuOptions) -> anyhow::Result<TlsTansu> {
        let tls_port = free_port()?;
        let advertised = format!("127.0.0.1:{tls_port}");
        let backend = match &options.sasl {
            None => TlsBackend::Plain(Tansu::start_with(
                &TansuOptions::default().advertised(&advertised),
            )?),
            Some(sasl) => {
                let mut sasl = sasl.clone();
                sasl.advertised = Some(advertised.clone());
                sasl.port = None;
                TlsBackend::Sasl(SaslTansu::start_with(&sasl)?)
            }
        };
        let (cert, key) = pki.server_cert(options.server_cert);
        let connect = SocketAddr::from((Ipv4Addr::LOCALHOST, backend.tansu().port()));
        let mut config = StunnelConfig::new(cert, key, connect).accept_port(tls_port);
        if let Some(level) = options.stunnel_debug {
            config.debug_level = level;
        }
        if options.mtls {
            config = config.client_ca(pki.ca());
        }
        let stunnel = Stunnel::start(config)?;
        Ok(TlsTansu {
            stunnel,
            backend,
            pki: pki.clone(),
            options: options.clone(),
        })
    }

    /// `127.0.0.1:S`: stunnel's TLS port, which tansu advertises.
    pub fn bootstrap(&self) -> String {
        self.stunnel.address()
    }

    /// The TLS terminator.
    pub fn stunnel(&self) -> &Stunnel {
        &self.stunnel
    }

    /// The broker.
    pub fn backend(&self) -> &TlsBackend {
        &self.backend
    }

    /// The tansu process (plain TCP on [`Tansu::bootstrap`]).
    pub fn tansu(&self) -> &Tansu {
        self.backend.tansu()
    }

    /// The SASL broker, if it is one.
    pub fn sasl(&self) -> Option<&SaslTansu> {
        match &self.backend {
            TlsBackend::Sasl(s) => Some(s),
            TlsBackend::Plain(_) => None,
        }
    }

    /// The PKI its certificates come from.
    pub fn pki(&self) -> &Arc<TestPki> {
        &self.pki
    }

    /// The options it was started with (with the PKI filled in).
    pub fn options(&self) -> &TlsTansuOptions {
        &self.options
    }

    /// Creates a topic with `tansu topic create` on tansu's plain port. Fails on a
    /// SASL broker: pass its topics in [`SaslTansuOptions::topics`] instead, or use
    /// [`confluent_create_topic`] with credentials.
    pub fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        self.tansu().create_topic(name, partitions)
    }

    /// librdkafka settings for a client of this broker: `security.protocol`
    /// (`SSL`/`SASL_SSL`), `ssl.ca.location`, and with mTLS the PKCS#8 client
    /// certificate; add the SASL user's settings ([`crate::tansu::SaslUser::librdkafka_config`]).
    pub fn librdkafka_config(&self) -> Vec<(String, String)> {
        let protocol = if self.sasl().is_some() {
            "SASL_SSL"
        } else {
            "SSL"
        };
        let mut config = vec![
            ("security.protocol".to_string(), protocol.to_string()),
            (
                "ssl.ca.location".to_string(),
                self.pki.ca().display().to_string(),
            ),
        ];
        if self.options.mtls {
            let (cert, key) = self.pki.client_cert(KeyFormat::Pkcs8);
            config.push((
                "ssl.certificate.location".to_string(),
                cert.display().to_string(),
            ));
            config.push(("ssl.key.location".to_string(), key.display().to_string()));
        }
        config
    }
}

/// The Python interpreter: `$OTTLA_PYTHON`, else `python3`.
fn python() -> OsString {
    std::env::var_os("OTTLA_PYTHON")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// `<workspace>/.peers/python` first, then any `PYTHONPATH` already set.
fn python_path() -> OsString {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let peers = manifest
        .parent()
        .unwrap_or(manifest)
        .join(".peers")
        .join("python");
    let mut path = OsString::from(peers);
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|v| !v.is_empty()) {
        path.push(":");
        path.push(old);
    }
    path
}

/// A confluent-kafka producer run with librdkafka settings `KEY=VALUE` as arguments.
/// Prints `delivered N`, then one `error ...` line per error callback and per failed
/// delivery.
const PRODUCE_PY: &str = r#"
import sys, time
import confluent_kafka as ck
bootstrap, topic, count, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
conf = {"bootstrap.servers": bootstrap, "message.timeout.ms": int(timeout * 1000)}
conf.update(a.split("=", 1) for a in sys.argv[5:])
errors, delivered = [], [0]
def on_delivery(err, msg):
    if err is None:
        delivered[0] += 1
    else:
        errors.append("delivery: " + str(err))
p = ck.Producer(conf, error_cb=lambda e: errors.append(str(e)))
for i in range(count):
    p.produce(topic, value=b"ottla-%d" % i, key=b"k", on_delivery=on_delivery)
deadline = time.time() + timeout + 2
while len(p) > 0 and time.time() < deadline:
    p.poll(0.05)
print("delivered", delivered[0], flush=True)
seen = set()
for e in errors:
    if e not in seen:
        seen.add(e)
        print("error", e.replace("\n", " "), flush=True)
"#;

/// A confluent-kafka admin client creating one topic.
const CREATE_TOPIC_PY: &str = r#"
import sys
import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap, topic, partitions, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
conf = {"bootstrap.servers": bootstrap}
conf.update(a.split("=", 1) for a in sys.argv[5:])
admin = AdminClient(conf)
futures = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=timeout, request_timeout=timeout)
try:
    futures[topic].result(timeout=timeout)
    print("created", flush=True)
except Exception as e:
    print("error", str(e).replace("\n", " "), flush=True)
    sys.exit(1)
"#;

/// What [`confluent_produce`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProduceOutcome {
    /// Messages acknowledged.
    pub delivered: usize,
    /// Distinct errors: error callbacks (`_AUTHENTICATION`, `_SSL`, ...) and failed
    /// deliveries.
    pub errors: Vec<String>,
}

impl ProduceOutcome {
    /// Every message delivered.
    pub fn all_delivered(&self, count: usize) -> bool {
        self.delivered == count
    }
}

fn run_python(
    script: &str,
    args: &[String],
    timeout: Duration,
) -> anyhow::Result<(bool, String, String)> {
    let mut child = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .env("PYTHONPATH", python_path())
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context(
            "spawning python3 for confluent-kafka; install the peers with `bash scripts/install-peers.sh`",
        )?;
    // Read both pipes on threads so a chatty librdkafka cannot block the child.
    let mut stdout = child.stdout.take().context("child stdout")?;
    let mut stderr = child.stderr.take().context("child stderr")?;
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let deadline = Instant::now() + timeout + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let Some(status) = status else {
        bail!(
            "the confluent-kafka script did not finish in time; stderr:\n{}",
            tail(&stderr)
        );
    };
    if stderr.contains("ModuleNotFoundError") {
        bail!(
            "confluent-kafka is not importable; install it with `bash scripts/install-peers.sh`:\n{}",
            tail(&stderr)
        );
    }
    Ok((status.success(), stdout, stderr))
}

fn tail(s: &str) -> &str {
    let start = s.len().saturating_sub(3000);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    &s[start..]
}

fn config_args(config: &[(String, String)]) -> Vec<String> {
    config.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// Produces `count` small messages to `topic` with confluent-kafka 2.16.1 (librdkafka
/// 2.16.0), in a `python3` child, with these extra librdkafka settings (e.g. from
/// [`TlsTansu::librdkafka_config`] and [`crate::tansu::SaslUser::librdkafka_config`]).
/// Waits up to `timeout` (`message.timeout.ms`) for the acknowledgements. Fails only if
/// the script cannot run; refusals (TLS, SASL) are in [`ProduceOutcome::errors`].
pub fn confluent_produce(
    bootstrap: &str,
    topic: &str,
    config: &[(String, String)],
    count: usize,
    timeout: Duration,
) -> anyhow::Result<ProduceOutcome> {
    let mut args = vec![
        bootstrap.to_string(),
        topic.to_string(),
        count.to_string(),
        format!("{:.3}", timeout.as_secs_f64()),
    ];
    args.extend(config_args(config));
    let (_, stdout, stderr) = run_python(PRODUCE_PY, &args, timeout)?;
    let mut outcome = ProduceOutcome::default();
    let mut saw_summary = false;
    for line in stdout.lines() {
        if let Some(n) = line.strip_prefix("delivered ") {
            outcome.delivered = n.trim().parse().unwrap_or(0);
            saw_summary = true;
        } else if let Some(e) = line.strip_prefix("error ") {
            outcome.errors.push(e.to_string());
        }
    }
    if !saw_summary {
        bail!(
            "the confluent-kafka producer script failed; stdout:\n{}\nstderr:\n{}",
            tail(&stdout),
            tail(&stderr)
        );
    }
    Ok(outcome)
}

/// Creates a topic with confluent-kafka's admin client (CreateTopics), with these
/// extra librdkafka settings: the way to create a topic on a broker that requires
/// SASL.
pub fn confluent_create_topic(
    bootstrap: &str,
    config: &[(String, String)],
    name: &str,
    partitions: i32,
    timeout: Duration,
) -> anyhow::Result<()> {
    let mut args = vec![
        bootstrap.to_string(),
        name.to_string(),
        partitions.to_string(),
        format!("{:.3}", timeout.as_secs_f64()),
    ];
    args.extend(config_args(config));
    let (ok, stdout, stderr) = run_python(CREATE_TOPIC_PY, &args, timeout)?;
    if !ok || !stdout.lines().any(|l| l == "created") {
        bail!(
            "confluent-kafka CreateTopics {name} ({partitions}) on {bootstrap} failed: {}\nstderr:\n{}",
            stdout.trim(),
            tail(&stderr)
        );
    }
    Ok(())
}

/// A TLS listener of rustls's, in process: it accepts connections, runs the server
/// side of the handshake with the PKI's good certificate, and hangs up. A plaintext
/// client meets here what it meets at Kafka's own TLS listener: rustls, like Java's
/// JSSE that Kafka uses (`15 03 03 00 02 02 0a`), answers bytes that are not TLS with
/// a fatal alert, where stunnel (OpenSSL) closes the connection without a word.
pub struct RustlsListener {
    address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl RustlsListener {
    /// Listens on a free loopback port.
    pub async fn start(pki: &TestPki) -> anyhow::Result<RustlsListener> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let (cert, key) = pki.server_cert(ServerCert::Good);
        let certs = CertificateDer::pem_file_iter(&cert)
            .with_context(|| format!("reading {}", cert.display()))?
            .collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_file(&key)
            .with_context(|| format!("reading {}", key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let address = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // The handshake fails on a plaintext client; tokio-rustls writes
                    // rustls's alert before it gives up.
                    let _ = acceptor.accept(tcp).await;
                });
            }
        });
        Ok(RustlsListener { address, task })
    }

    /// `127.0.0.1:port`.
    pub fn address(&self) -> String {
        self.address.to_string()
    }
}

impl Drop for RustlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}
