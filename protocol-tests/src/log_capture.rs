//! Every `tracing` line a test process writes, kept in memory for assertions: the
//! secrets-never-leak test reads them all at TRACE level, the re-authentication test
//! counts the connection task's reports.

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::MakeWriter;

/// The captured log of this process. Install it once, first thing in a test
/// (nextest runs each test in a process of its own).
#[derive(Clone, Debug, Default)]
pub struct LogCapture {
    buf: Arc<Mutex<Vec<u8>>>,
}

impl LogCapture {
    /// Installs the capture as the global subscriber with `filter` (an `EnvFilter`
    /// string, e.g. `"trace"`). Fails if a subscriber is already installed.
    pub fn install(filter: &str) -> anyhow::Result<LogCapture> {
        let capture = LogCapture::default();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_ansi(false)
            .with_writer(capture.clone())
            .try_init()
            .map_err(|e| anyhow::anyhow!("installing the log capture: {e}"))?;
        Ok(capture)
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        let buf = self.buf.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// How many lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }
}

impl Write for LogCapture {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.buf.lock() {
            b.extend_from_slice(data);
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
