//! The parent side: brokers, data, children, rusage.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use protocol_tests::peer::Peer;

use super::table::{Row, Sample};
use super::{Cell, Client, produce};

/// What the command line asked for.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `mock`, `tansu`, or both.
    pub brokers: Vec<String>,
    /// Cells per broker, before the mock's cap.
    pub cells: Vec<Cell>,
    /// Clients, in round order.
    pub clients: Vec<Client>,
    /// Rounds (each client once per round).
    pub runs: u64,
    /// Per-child time limit; `None`: from the record count.
    pub timeout: Option<u64>,
    /// Records per partition the mock may hold; `None`: from the record size.
    pub mock_cap: Option<u64>,
    /// Brokers of the mock cluster.
    pub mock_brokers: i32,
    /// Run the clients known not to work on a broker too.
    pub try_all: bool,
    /// Where to keep each child's stderr (with `RUST_LOG` set, its log), if anywhere.
    pub child_logs: Option<std::path::PathBuf>,
}

/// The mock cluster keeps 5 MiB per partition (by batch bytes, after compression) and
/// drops older batches without a word: keep a cell within 4.5 MiB per partition,
/// counting records uncompressed.
pub fn mock_cap_per_partition(cell: &Cell) -> u64 {
    (9 * 1024 * 1024 / 2 / cell.record_wire_bytes()) as u64
}

/// The broker a plan names: `mock` (`mock_brokers` brokers, no initial rebalance
/// delay) or `tansu`.
pub fn start_peer(broker: &str, mock_brokers: i32) -> anyhow::Result<Peer> {
    Ok(match broker {
        "mock" => {
            let peer = Peer::mock(mock_brokers)?;
            if let Peer::Mock(m) = &peer {
                // The mock delays a new group's first rebalance by 3 s by default.
                m.set_group_initial_rebalance_delay(Duration::ZERO);
            }
            peer
        }
        "tansu" => Peer::tansu()?,
        other => bail!("unknown broker {other} (mock, tansu or both)"),
    })
}

/// Runs the plan, printing a table per cell as it completes. Returns every row.
pub fn run(plan: &Plan) -> anyhow::Result<Vec<Row>> {
    let exe = std::env::current_exe().context("finding this program")?;
    let runtime = tokio::runtime::Runtime::new().context("building a runtime")?;
    let mut rows = Vec::new();
    for broker in &plan.brokers {
        let peer = start_peer(broker, plan.mock_brokers)?;
        let bootstrap = peer.bootstrap();
        for base in &plan.cells {
            let mut cell = *base;
            let mut note = String::new();
            if peer.name() == "mock" {
                let cap = plan
                    .mock_cap
                    .unwrap_or_else(|| mock_cap_per_partition(&cell))
                    * cell.partitions as u64;
                if cell.records > cap {
                    note = format!(
                        "capped from {} to {cap} records: the mock keeps 5 MiB per partition",
                        cell.records
                    );
                    cell.records = cap;
                }
            }
            eprintln!(
                "[{}] {}: writing {} records{}",
                peer.name(),
                cell.label(),
                cell.records,
                if note.is_empty() {
                    String::new()
                } else {
                    format!(" ({note})")
                }
            );
            let started = Instant::now();
            let prepared = peer
                .create_topic(&cell.topic(), cell.partitions)
                .and_then(|()| runtime.block_on(produce::produce(&bootstrap, &cell)))
                .and_then(|()| produce::verify(&bootstrap, &cell, peer.name() == "mock"));
            if let Err(e) = prepared {
                eprintln!("[{}] {}: {e:#}", peer.name(), cell.label());
                let reason = format!("n/a: data not written: {e:#}");
                let cell_rows: Vec<Row> = plan
                    .clients
                    .iter()
                    .map(|&client| Row::failed(peer.name(), cell, client, &reason, &note))
                    .collect();
                super::table::print(&cell_rows);
                rows.extend(cell_rows);
                continue;
            }
            eprintln!(
                "[{}] {}: written in {:.1} s",
                peer.name(),
                cell.label(),
                started.elapsed().as_secs_f64()
            );
            let cell_rows = consume_cell(&exe, plan, peer.name(), &bootstrap, cell, &note);
            super::table::print(&cell_rows);
            rows.extend(cell_rows);
        }
    }
    Ok(rows)
}

/// Every client on one cell, `runs` rounds, interleaved.
fn consume_cell(
    exe: &Path,
    plan: &Plan,
    broker: &'static str,
    bootstrap: &str,
    cell: Cell,
    note: &str,
) -> Vec<Row> {
    let mut rows: Vec<Row> = plan
        .clients
        .iter()
        .map(|&client| Row::new(broker, cell, client, note))
        .collect();
    let counts = cell
        .per_partition()
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let timeout = plan.timeout.unwrap_or(60 + cell.records / 10_000);
    if !plan.try_all {
        for row in rows.iter_mut() {
            if let Some(reason) = row.client.known_blocker(broker) {
                row.failure = Some(format!("n/a: {reason} (not run; --try-all runs it)"));
            }
        }
    }
    for run in 1..=plan.runs {
        for row in rows.iter_mut() {
            if row.failure.is_some() {
                continue;
            }
            let group = format!(
                "bench-{}-{}-{run}-{}",
                row.client.name(),
                cell.topic(),
                std::process::id()
            );
            let args = [
                "--child",
                row.client.name(),
                "--bootstrap",
                bootstrap,
                "--topic",
                &cell.topic(),
                "--counts",
                &counts,
                "--group",
                &group,
                "--timeout",
                &timeout.to_string(),
            ];
            let log = plan.child_logs.as_ref().map(|dir| {
                dir.join(format!(
                    "{broker}-{}-{}-{run}.log",
                    cell.topic(),
                    row.client.name()
                ))
            });
            match run_child(
                exe,
                &args,
                Duration::from_secs(timeout + 30),
                log.as_deref(),
            ) {
                Ok(sample) => {
                    eprintln!(
                        "[{broker}] {} run {run} {:<18} {:>10.0} rec/s {:>7.1} MB/s {:>6.3} CPU s/M {:>6.1} MiB  first record at {:.2} s{}",
                        cell.label(),
                        row.client.name(),
                        sample.records_per_sec(),
                        sample.mb_per_sec(),
                        sample.cpu_per_million(),
                        sample.rss_mib,
                        sample.first,
                        if sample.bad > 0 {
                            format!("  {} BAD (duplicates, gaps or extra)", sample.bad)
                        } else {
                            String::new()
                        }
                    );
                    if sample.records != cell.records || sample.bad > 0 {
                        row.failure = Some(format!(
                            "n/a: counted {} of {} records, {} duplicated/missing",
                            sample.records, cell.records, sample.bad
                        ));
                    }
                    row.samples.push(sample);
                }
                Err(e) => {
                    let reason = format!("{e:#}");
                    eprintln!(
                        "[{broker}] {} run {run} {:<18} failed: {reason}",
                        cell.label(),
                        row.client.name()
                    );
                    row.failure = Some(match row.client.known_blocker(broker) {
                        Some(known) => format!("n/a: {known} [{}]", one_line(&reason)),
                        None => format!("n/a: {}", one_line(&reason)),
                    });
                }
            }
        }
    }
    rows
}

/// `s` on one line, without terminal colours, cut at 160 characters.
fn one_line(s: &str) -> String {
    let mut plain = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
            continue;
        }
        plain.push(c);
    }
    let line = plain
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" / ");
    if line.chars().count() > 160 {
        format!("{}...", line.chars().take(157).collect::<String>())
    } else {
        line
    }
}

/// Runs one child, reaps it with `wait4` and reads its rusage (CPU time). The child
/// prints one `result records=N bytes=B first=S last=S bad=K hwm_kib=M [assigned=S]`
/// line on stdout.
pub fn run_child(
    exe: &Path,
    args: &[&str],
    limit: Duration,
    log: Option<&Path>,
) -> anyhow::Result<Sample> {
    // OTTLA_BENCH_CHILD_WRAP runs each child under a tool, for instance
    // `valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p` (then give a long
    // `--timeout`): the instructions of one client's whole consume.
    let wrap = std::env::var("OTTLA_BENCH_CHILD_WRAP").unwrap_or_default();
    let mut words = wrap.split_whitespace();
    let mut command = match words.next() {
        Some(tool) => {
            let mut c = Command::new(tool);
            c.args(words).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    let mut child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning the child")?;
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.take().context("child stdout")?;
    let mut stderr = child.stderr.take().context("child stderr")?;
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let mut killed = false;
    // SAFETY: plain C structs, zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `pid` is our own unreaped child; the pointers are to live locals.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        if r < 0 {
            bail!("wait4: {}", std::io::Error::last_os_error());
        }
        if !killed && started.elapsed() > limit {
            // Not reaped yet, so the pid is still ours.
            let _ = child.kill();
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if let Some(log) = log {
        let _ = std::fs::write(log, &stderr);
    }
    let exited_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    if !exited_ok {
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "{}: {}",
            if killed {
                "killed at the time limit".to_string()
            } else if libc::WIFEXITED(status) {
                format!("exit {}", libc::WEXITSTATUS(status))
            } else {
                format!("signal {}", libc::WTERMSIG(status))
            },
            if tail.is_empty() {
                "(no output)".to_string()
            } else {
                tail.join(" / ")
            }
        );
    }
    let line = stdout
        .lines()
        .find(|l| l.starts_with("result "))
        .with_context(|| format!("no result line; stderr: {stderr}"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("no {name} in {line:?}"))
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Sample {
        records: field("records=")? as u64,
        bytes: field("bytes=")? as u64,
        first: field("first=")?,
        last: field("last=")?,
        bad: field("bad=")? as u64,
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
        // The child's own VmHWM: `ru_maxrss` starts from the parent's size, since
        // Linux keeps it across execve (see child.rs).
        rss_mib: field("hwm_kib=")? / 1024.0,
        assigned: field("assigned=").ok(),
    })
}
