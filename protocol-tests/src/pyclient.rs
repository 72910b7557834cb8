//! Consumer-group members of other clients, for mixed groups: confluent-kafka
//! (librdkafka) and kafka-python, each in its own `python3` process running
//! `peers/py_member.py`.
//!
//! The script reports on stdout, one line per event (`ready`, `assigned t:0,t:1`,
//! `revoked ...`, `lost ...`, `error ...`, `closed`, and with
//! [`PyMemberBuilder::report_records`] `record t:3:17`); a background thread reads them
//! into a shared state that [`PyMember`] waits on. The packages come from `bash
//! scripts/install-peers.sh`, which installs them into `<workspace>/.peers/python`;
//! that directory is put first on the child's `PYTHONPATH`. `PEERS.md` lists the
//! clients' quirks (kafka-python needs `api_version` 2.0.0 on the librdkafka mock).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

const INSTALL_HINT: &str = "install the client peers with `bash scripts/install-peers.sh`";
/// How long [`PyMember::close`] waits for the script to leave the group and exit.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(20);
/// At most this many stderr lines are kept (librdkafka logs there).
const MAX_STDERR_LINES: usize = 2000;

/// Which Python client a [`PyMember`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PyClient {
    /// confluent-kafka 2.16.1, which bundles librdkafka 2.16.0. Strategies `range`,
    /// `roundrobin`, `cooperative-sticky`.
    Confluent,
    /// kafka-python 3.0.12. Strategies `range`, `roundrobin`, `cooperative-sticky`
    /// (its KIP-429 assignor). Needs [`PyMemberBuilder::api_version`] `"2.0.0"` on the
    /// librdkafka mock.
    KafkaPython,
    /// aiokafka 0.14.0: strategies `range`, `roundrobin` (no cooperative one), or
    /// `default` (its own: `roundrobin`). No static membership.
    Aiokafka,
}

impl PyClient {
    /// The script's `--client` value.
    pub fn as_arg(self) -> &'static str {
        match self {
            PyClient::Confluent => "confluent",
            PyClient::KafkaPython => "kafka-python",
            PyClient::Aiokafka => "aiokafka",
        }
    }
}

impl fmt::Display for PyClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_arg())
    }
}

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// `peers/py_member.py` in this crate.
pub fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("peers")
        .join("py_member.py")
}

/// A command running the peers' Python (`$OTTLA_PYTHON`, else `python3`) with
/// `.peers/python` on its path, for benchmark and test scripts of their own.
pub fn python_command() -> Command {
    let mut command = Command::new(python());
    command.env("PYTHONPATH", python_path());
    command
}

/// The interpreter: `$OTTLA_PYTHON`, else `python3`.
fn python() -> OsString {
    std::env::var_os("OTTLA_PYTHON")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// Options of one member; [`PyMemberBuilder::spawn`] starts it.
#[derive(Debug, Clone)]
pub struct PyMemberBuilder {
    client: PyClient,
    bootstrap: String,
    group: String,
    topics: Vec<String>,
    /// The classic protocol's assignor; `None` with the consumer protocol.
    strategy: Option<String>,
    session_timeout: Option<Duration>,
    heartbeat: Option<Duration>,
    instance_id: Option<String>,
    client_id: Option<String>,
    api_version: Option<String>,
    assign_delay: Option<Duration>,
    log_level: Option<String>,
    properties: Vec<(String, String)>,
    records: bool,
}

impl PyMemberBuilder {
    /// confluent-kafka only: one more librdkafka property, e.g. `security.protocol`,
    /// `ssl.ca.location` or `sasl.password`.
    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.properties.push((key.to_string(), value.to_string()));
        self
    }

    /// confluent-kafka only: report every record the application receives
    /// ([`PyMember::records`]), and commit the position of every partition given back,
    /// synchronously in the revocation callback (also when closing), so the next owner
    /// starts right after the last record reported. Without it records are ignored and
    /// nothing is committed.
    pub fn report_records(mut self) -> Self {
        self.records = true;
        self
    }

    /// `session.timeout.ms` (the client's default otherwise: 45 s). Classic protocol
    /// only: librdkafka refuses it with `group.protocol=consumer`.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = Some(timeout);
        self
    }

    /// `heartbeat.interval.ms` (3 s by default). A short one makes the member notice
    /// a rebalance sooner. Classic protocol only, as [`PyMemberBuilder::session_timeout`].
    pub fn heartbeat(mut self, interval: Duration) -> Self {
        self.heartbeat = Some(interval);
        self
    }

    /// `group.instance.id`: a static member, which does not leave the group on close.
    pub fn instance_id(mut self, id: &str) -> Self {
        self.instance_id = Some(id.to_string());
        self
    }

    /// `client.id`, to tell members apart in broker logs.
    pub fn client_id(mut self, id: &str) -> Self {
        self.client_id = Some(id.to_string());
        self
    }

    /// kafka-python's `api_version`, e.g. `"2.0.0"` (needed on the librdkafka mock).
    /// The script refuses it for confluent-kafka.
    pub fn api_version(mut self, version: &str) -> Self {
        self.api_version = Some(version.to_string());
        self
    }

    /// kafka-python only: as the group's leader, wait this long before computing the
    /// assignment. On the librdkafka mock a follower whose SyncGroup arrives after the
    /// leader's gets INVALID_REQUEST and rejoins, and the mock then waits session
    /// timeout - 1 s before the next generation; kafka-python's leader loses that race
    /// again and again without a pause (150 ms is plenty). Harmless on a real broker.
    pub fn assign_delay(mut self, delay: Duration) -> Self {
        self.assign_delay = Some(delay);
        self
    }

    /// Client logs on stderr (kept in [`PyMember::lines`]): a Python logging level for
    /// kafka-python (`INFO`, `DEBUG`); for confluent-kafka, `DEBUG` turns on
    /// librdkafka's `cgrp` debug log. Default: `$PYMEMBER_LOG`, else none.
    pub fn log_level(mut self, level: &str) -> Self {
        self.log_level = Some(level.to_string());
        self
    }

    fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--client".to_string(),
            self.client.as_arg().to_string(),
            "--bootstrap".to_string(),
            self.bootstrap.clone(),
            "--group".to_string(),
            self.group.clone(),
        ];
        match &self.strategy {
            Some(strategy) => args.extend(["--strategy".to_string(), strategy.clone()]),
            None => args.extend(["--group-protocol".to_string(), "consumer".to_string()]),
        }
        if self.records {
            args.push("--records".to_string());
        }
        for topic in &self.topics {
            args.extend(["--topic".to_string(), topic.clone()]);
        }
        let ms = |d: Duration| d.as_millis().to_string();
        let options = [
            ("--session-timeout-ms", self.session_timeout.map(ms)),
            ("--heartbeat-ms", self.heartbeat.map(ms)),
            ("--instance-id", self.instance_id.clone()),
            ("--client-id", self.client_id.clone()),
            ("--api-version", self.api_version.clone()),
            ("--assign-delay-ms", self.assign_delay.map(ms)),
            ("--log-level", self.log_level.clone()),
        ];
        for (flag, value) in options {
            if let Some(value) = value {
                args.extend([flag.to_string(), value]);
            }
        }
        for (key, value) in &self.properties {
            args.extend(["--set".to_string(), format!("{key}={value}")]);
        }
        args
    }

    /// Starts the member. It subscribes at once; see [`PyMember::wait_ready`].
    pub fn spawn(self) -> anyhow::Result<PyMember> {
        if self.topics.is_empty() {
            bail!("a {} member needs at least one topic", self.client);
        }
        let script = script_path();
        let pythonpath = python_path();
        let python = python();
        let mut child = Command::new(&python)
            .arg(&script)
            .args(self.args())
            .env("PYTHONPATH", pythonpath)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| {
                format!(
                    "spawning {} {}: is Python 3 installed? Then {INSTALL_HINT}",
                    python.to_string_lossy(),
                    script.display()
                )
            })?;
        let stdin = child.stdin.take();
        let shared = Arc::new(Shared::default());
        // Both pipes are read to the end so the child never blocks on a full pipe.
        if let Some(out) = child.stdout.take() {
            let shared = Arc::clone(&shared);
            thread::spawn(move || read_stdout(out, &shared));
        }
        if let Some(err) = child.stderr.take() {
            let shared = Arc::clone(&shared);
            thread::spawn(move || read_stderr(err, &shared));
        }
        Ok(PyMember {
            name: format!("{} member of {}", self.client, self.group),
            child,
            stdin,
            shared,
        })
    }
}

#[derive(Debug, Default)]
struct State {
    /// stdout lines, in order.
    lines: Vec<String>,
    /// stderr lines (at most [`MAX_STDERR_LINES`]).
    stderr: Vec<String>,
    assignment: BTreeSet<(String, i32)>,
    /// `record` lines, in order (kept out of `lines`: there are many).
    records: Vec<(String, i32, i64)>,
    /// How many `assigned` lines have been seen.
    assignments: usize,
    ready: bool,
    closed: bool,
    /// stdout reached its end: the script has exited (or closed stdout).
    eof: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a reader thread panicked; the state is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `t:0,t:3` (or empty) as a set. Topic names cannot contain `:`.
fn parse_partitions(list: &str) -> Result<BTreeSet<(String, i32)>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (topic, partition) = item
                .rsplit_once(':')
                .ok_or_else(|| format!("{item:?} is not topic:partition"))?;
            let partition = partition
                .parse()
                .map_err(|e| format!("{item:?}: bad partition: {e}"))?;
            Ok((topic.to_string(), partition))
        })
        .collect()
}

/// `t:3:17` as `(topic, partition, offset)`.
fn parse_record(item: &str) -> Result<(String, i32, i64), String> {
    let (rest, offset) = item
        .trim()
        .rsplit_once(':')
        .ok_or_else(|| format!("{item:?} is not topic:partition:offset"))?;
    let offset = offset
        .parse()
        .map_err(|e| format!("{item:?}: bad offset: {e}"))?;
    let (topic, partition) = parse_partitions(rest)?
        .pop_first()
        .ok_or_else(|| format!("{item:?}: no partition"))?;
    Ok((topic, partition, offset))
}

fn read_stdout(out: impl Read, shared: &Shared) {
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        let mut state = shared.lock();
        let (word, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match word {
            "ready" => state.ready = true,
            "closed" => state.closed = true,
            "record" => {
                match parse_record(rest) {
                    Ok(record) => state.records.push(record),
                    Err(e) => state.stderr.push(format!("pyclient: unparsable line: {e}")),
                }
                continue;
            }
            "assigned" => match parse_partitions(rest) {
                Ok(set) => {
                    state.assignment = set;
                    state.assignments += 1;
                }
                Err(e) => state.stderr.push(format!("pyclient: unparsable line: {e}")),
            },
            _ => {}
        }
        state.lines.push(line);
        drop(state);
        shared.changed.notify_all();
    }
    shared.lock().eof = true;
    shared.changed.notify_all();
}

fn read_stderr(err: impl Read, shared: &Shared) {
    for line in BufReader::new(err).lines() {
        let Ok(line) = line else { break };
        let mut state = shared.lock();
        if state.stderr.len() < MAX_STDERR_LINES {
            state.stderr.push(line);
        }
    }
}

/// A running member of another client, killed on drop.
pub struct PyMember {
    name: String,
    child: Child,
    /// Taken (closed) by [`PyMember::close`].
    stdin: Option<ChildStdin>,
    shared: Arc<Shared>,
}

impl fmt::Debug for PyMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PyMember")
            .field("name", &self.name)
            .field("pid", &self.child.id())
            .field("assignment", &self.assignment())
            .finish_non_exhaustive()
    }
}

impl PyMember {
    /// A member with the client's defaults; see [`PyMember::builder`] for more options.
    /// `strategy`: `range`, `roundrobin`, `cooperative-sticky`, or `default` (the client's own
    /// default list; confluent-kafka and aiokafka).
    pub fn spawn(
        client: PyClient,
        bootstrap: &str,
        group: &str,
        topics: &[&str],
        strategy: &str,
    ) -> anyhow::Result<PyMember> {
        Self::builder(client, bootstrap, group, topics, strategy).spawn()
    }

    /// Options beyond [`PyMember::spawn`]'s: session timeout, heartbeat, static
    /// membership, kafka-python's `api_version`.
    pub fn builder(
        client: PyClient,
        bootstrap: &str,
        group: &str,
        topics: &[&str],
        strategy: &str,
    ) -> PyMemberBuilder {
        let mut builder = Self::consumer_protocol_builder(client, bootstrap, group, topics);
        builder.strategy = Some(strategy.to_string());
        builder
    }

    /// A member on KIP-848's consumer group protocol (`group.protocol=consumer`,
    /// confluent-kafka only): the broker assigns, so there is no strategy, and the
    /// session timeout and heartbeat interval are the broker's (librdkafka refuses
    /// [`PyMemberBuilder::session_timeout`] and [`PyMemberBuilder::heartbeat`] here).
    /// Assignments are reported as increments add up, as under `cooperative-sticky`.
    pub fn consumer_protocol_builder(
        client: PyClient,
        bootstrap: &str,
        group: &str,
        topics: &[&str],
    ) -> PyMemberBuilder {
        PyMemberBuilder {
            client,
            bootstrap: bootstrap.to_string(),
            group: group.to_string(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            strategy: None,
            session_timeout: None,
            heartbeat: None,
            instance_id: None,
            client_id: None,
            api_version: None,
            assign_delay: None,
            log_level: std::env::var("PYMEMBER_LOG").ok().filter(|v| !v.is_empty()),
            properties: Vec::new(),
            records: false,
        }
    }

    /// The member's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The assignment it last reported (empty before the first one).
    pub fn assignment(&self) -> BTreeSet<(String, i32)> {
        self.shared.lock().assignment.clone()
    }

    /// How many assignments it has reported so far (each `assigned` line, including
    /// the ones after a revocation).
    pub fn assignments_seen(&self) -> usize {
        self.shared.lock().assignments
    }

    /// The records it reported so far, as `(topic, partition, offset)` in the order it
    /// received them (only with [`PyMemberBuilder::report_records`]).
    pub fn records(&self) -> Vec<(String, i32, i64)> {
        self.shared.lock().records.clone()
    }

    /// Everything it printed on stdout so far (but `record` lines), then its stderr lines prefixed with
    /// `stderr: `, for diagnostics.
    pub fn lines(&self) -> Vec<String> {
        let state = self.shared.lock();
        let stderr = state.stderr.iter().map(|l| format!("stderr: {l}"));
        state.lines.iter().cloned().chain(stderr).collect()
    }

    /// The `error ...` lines it printed so far (many are transient: the client retries).
    pub fn errors(&self) -> Vec<String> {
        let state = self.shared.lock();
        let errors = state.lines.iter().filter(|l| l.starts_with("error"));
        errors.cloned().collect()
    }

    /// Waits until it has subscribed.
    pub fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        self.wait_state(timeout, "to subscribe", |s| s.ready)
    }

    /// Waits until `pred` holds for its current assignment.
    pub fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&BTreeSet<(String, i32)>) -> bool,
    ) -> anyhow::Result<()> {
        self.wait_state(
            timeout,
            "for an assignment that satisfies the predicate",
            |s| pred(&s.assignment),
        )
    }

    /// Waits until it reports a non-empty assignment.
    pub fn wait_assigned(&self, timeout: Duration) -> anyhow::Result<()> {
        self.wait_for(timeout, |a| !a.is_empty())
    }

    fn wait_state(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&State) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        loop {
            if done(&state) {
                return Ok(());
            }
            if state.eof {
                drop(state);
                bail!("{} exited while waiting {what}{}", self.name, self.report());
            }
            let now = Instant::now();
            if now >= deadline {
                drop(state);
                bail!(
                    "{} did not get there within {timeout:?} waiting {what}; assignment {:?}{}",
                    self.name,
                    self.assignment(),
                    self.report()
                );
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Its output, for an error message, with a hint when the packages are missing.
    fn report(&self) -> String {
        let lines = self.lines();
        let missing = lines
            .iter()
            .any(|l| l.contains("No module named") || l.contains("install-peers"));
        let hint = if missing {
            format!("\nThe Python client is missing: {INSTALL_HINT}.")
        } else {
            String::new()
        };
        format!("; its output:\n  {}{hint}", lines.join("\n  "))
    }

    /// Asks it to leave the group and exit (`quit`, then end of input) without waiting;
    /// [`PyMember::close`] then waits. Lets several members leave at once: a member
    /// that is still there sees the rebalance, and a client that closes in the middle
    /// of a join (kafka-python) waits for the join to end first.
    pub fn request_close(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            // It may have exited already; `close` reports the exit status.
            let _ = stdin.write_all(b"quit\n");
            let _ = stdin.flush();
        }
    }

    /// Asks it to leave the group and exit ([`PyMember::request_close`]), and waits up
    /// to 20 s; then kills it. Fails unless it exited cleanly after printing `closed`.
    /// kafka-python notices `quit` within 0.2 s, or, in the middle of a join, once the
    /// join is over (its polls must not time out mid-join, see `py_member.py`).
    pub fn close(mut self) -> anyhow::Result<()> {
        self.leave_and_exit()
    }

    /// [`PyMember::close`] without giving the member up, so that what it reported
    /// ([`PyMember::records`], [`PyMember::lines`]) can be read afterwards.
    pub fn leave_and_exit(&mut self) -> anyhow::Result<()> {
        self.request_close();
        let status = self.wait_exit(CLOSE_TIMEOUT)?;
        let Some(status) = status else {
            let _ = self.child.kill();
            let _ = self.child.wait();
            bail!(
                "{} did not exit within {CLOSE_TIMEOUT:?} of `quit`; killed it{}",
                self.name,
                self.report()
            );
        };
        // The reader thread sees EOF right after the exit; wait for it to have read all.
        let _ = self.wait_state(Duration::from_secs(2), "for the end of its output", |s| {
            s.eof
        });
        let closed = self.shared.lock().closed;
        if !status.success() || !closed {
            bail!(
                "{} exited with {status} ({}printed `closed`){}",
                self.name,
                if closed { "" } else { "never " },
                self.report()
            );
        }
        Ok(())
    }

    fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for the member")? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One run of `peers/py_produce.py`: `client` writes `count` numbered records to
/// `topic` (record `i` to partition `i % partitions`, key `k<i>`, value
/// `v<i>:<codec>:` plus padding, headers `idx`, `codec` and an empty `empty`).
#[derive(Debug, Clone)]
pub struct PyProduce {
    /// The client.
    pub client: PyClient,
    /// Bootstrap servers.
    pub bootstrap: String,
    /// The topic (it must exist).
    pub topic: String,
    /// Its partitions.
    pub partitions: i32,
    /// How many records.
    pub count: u64,
    /// `none`, `gzip`, `snappy`, `lz4` or `zstd`.
    pub codec: String,
    /// Write in this many transactions, aborting every third (confluent only).
    pub transactions: u32,
    /// kafka-python's `api_version`.
    pub api_version: Option<String>,
}

impl PyProduce {
    /// Runs the script to the end; returns the indexes of the aborted records.
    pub fn run(&self) -> anyhow::Result<Vec<u64>> {
        let script = script_path().with_file_name("py_produce.py");
        let mut cmd = Command::new(python());
        cmd.arg(&script)
            .args(["--client", self.client.as_arg()])
            .args(["--bootstrap", &self.bootstrap, "--topic", &self.topic])
            .args(["--partitions", &self.partitions.to_string()])
            .args(["--count", &self.count.to_string(), "--codec", &self.codec])
            .args(["--transactions", &self.transactions.to_string()])
            .env("PYTHONPATH", python_path())
            .env("PYTHONUNBUFFERED", "1");
        if let Some(v) = &self.api_version {
            cmd.args(["--api-version", v]);
        }
        let out = cmd
            .output()
            .with_context(|| format!("running {}: {INSTALL_HINT}", script.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !stdout.contains(&format!("done {}", self.count)) {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
            bail!(
                "{} producer failed ({}): {stdout}\n{}",
                self.client,
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let aborted = stdout
            .lines()
            .find_map(|l| l.strip_prefix("aborted "))
            .map(|list| {
                list.split(',')
                    .filter(|x| !x.is_empty())
                    .map(|x| x.trim().parse::<u64>())
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()
            .context("the aborted list")?
            .unwrap_or_default();
        Ok(aborted)
    }
}

/// `<workspace>/.peers/python` first, then any `PYTHONPATH` already set.
fn python_path() -> OsString {
    let peers = workspace_root().join(".peers").join("python");
    let mut pythonpath = OsString::from(&peers);
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|v| !v.is_empty()) {
        pythonpath.push(":");
        pythonpath.push(old);
    }
    pythonpath
}

impl Drop for PyMember {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_partitions, parse_record};

    #[test]
    fn parses_partition_lists() {
        assert_eq!(parse_partitions("").unwrap().len(), 0);
        let set = parse_partitions("a.b-c:3,t:0").unwrap();
        let want = [("a.b-c".to_string(), 3), ("t".to_string(), 0)];
        assert_eq!(set, want.into_iter().collect());
        assert!(parse_partitions("t").is_err());
        assert!(parse_partitions("t:x").is_err());
    }

    #[test]
    fn parses_records() {
        assert_eq!(parse_record("a.b:3:17"), Ok(("a.b".to_string(), 3, 17)));
        assert!(parse_record("t:3").is_err());
        assert!(parse_record("t:3:x").is_err());
    }
}
