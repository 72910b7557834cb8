//! Helpers for fixtures that run a peer as a child process (tansu here; a TLS proxy or
//! another broker in your own kit): free ports, log files, termination, temporary
//! directories.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

/// How much of a log [`log_tail`] returns.
const LOG_TAIL_BYTES: u64 = 4096;

/// A loopback port that was free a moment ago (someone else may take it before it is
/// used: starts that bind it retry where they can).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .context("binding 127.0.0.1:0 to find a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Where peer logs go: `<target>/peer-logs`, where `<target>` is `$CARGO_TARGET_DIR`,
/// else the cargo target directory the running test binary is in (the ancestor with
/// cargo's `CACHEDIR.TAG`); else the temp dir.
pub fn log_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(cargo_target_of_current_exe);
    if let Some(target) = target {
        let dir = target.join("peer-logs");
        if std::fs::create_dir_all(&dir).is_ok() {
            return dir;
        }
    }
    std::env::temp_dir()
}

/// The cargo target directory holding the running executable (`target/debug/deps/...`).
fn cargo_target_of_current_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
}

/// A log file name in [`log_dir`] that no other peer of this process uses:
/// `<kind>-<port>-<pid>-<n>.<ext>`.
pub fn unique_log_path(kind: &str, port: u16, ext: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    log_dir().join(format!("{kind}-{port}-{}-{n}.{ext}", std::process::id()))
}

/// The last 4 KiB of a log file, for error messages (a note if it cannot be read).
pub fn log_tail(path: &Path) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Sends SIGTERM, waits up to `timeout` for the child to exit, then kills it. Returns
/// at once if it has exited already.
pub fn terminate(child: &mut Child, timeout: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on our own child's pid, which `child` has not reaped yet.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A directory under [`std::env::temp_dir`] with a unique name, removed (with its
/// contents) on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<temp>/<prefix>-<pid>-<time>-<n>`.
    pub fn new(prefix: &str) -> anyhow::Result<TempDir> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        for _ in 0..100 {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("{prefix}-{}-{nanos:x}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(
                        anyhow::Error::new(e).context(format!("creating {}", path.display()))
                    );
                }
            }
        }
        bail!("no unused directory name under {}", base.display())
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logs go to `<target>/peer-logs`: `$CARGO_TARGET_DIR`'s, or the one holding this
    /// test binary.
    #[test]
    fn log_dir_is_in_the_target_dir() -> anyhow::Result<()> {
        let dir = log_dir();
        assert!(dir.ends_with("peer-logs"), "{}", dir.display());
        assert!(dir.is_dir());
        let target = dir.parent().context("peer-logs has a parent")?;
        match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
            Some(t) => assert_eq!(target, Path::new(&t)),
            None => assert!(std::env::current_exe()?.starts_with(target)),
        }
        let (a, b) = (
            unique_log_path("x", 1, "log"),
            unique_log_path("x", 1, "log"),
        );
        assert_ne!(a, b);
        assert!(log_tail(&a).starts_with("(no log at"));
        Ok(())
    }

    /// A temporary directory is removed with its contents on drop.
    #[test]
    fn temp_dir_is_removed_on_drop() -> anyhow::Result<()> {
        let dir = TempDir::new("ottla-testkit-unit")?;
        let path = dir.path().to_path_buf();
        std::fs::write(path.join("file"), b"x")?;
        drop(dir);
        assert!(!path.exists());
        Ok(())
    }

    /// SIGTERM ends a child that does not trap it, well before the kill deadline.
    #[test]
    fn terminate_stops_a_child() -> anyhow::Result<()> {
        let mut child = std::process::Command::new("sleep").arg("30").spawn()?;
        let started = Instant::now();
        terminate(&mut child, Duration::from_secs(10));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(child.try_wait()?.is_some());
        Ok(())
    }
}
