//! A librdkafka mock cluster as a process, for trying ottla (or any client) by hand.
//!
//! `cargo run -p protocol-tests --bin mock-cluster -- [--brokers N] [--topic NAME:PARTITIONS]... [--no-cap-group-apis]`
//!
//! The mock advertises JoinGroup v6 and SyncGroup, Heartbeat and LeaveGroup v4 but
//! cannot parse their flexible forms, so by default it advertises JoinGroup up to v5,
//! SyncGroup and Heartbeat up to v3 and LeaveGroup up to v2 (librdkafka clients lose
//! nothing by it). `--no-cap-group-apis` keeps the mock's own ranges, to see how a
//! client copes with a broker that hangs up on a version it advertises.
//!
//! Prints the bootstrap address as the first line of stdout, then reads control
//! commands from stdin, one per line, and answers each with `ok` or `error: ...` on
//! stdout (`help` lists them). On end of input it keeps serving until SIGINT or
//! SIGTERM, so it can run in the background with `</dev/null`.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use protocol_tests::mock::{ErrorCode, MockCluster};

const USAGE: &str =
    "usage: mock-cluster [--brokers N] [--topic NAME:PARTITIONS]... [--no-cap-group-apis]";

const COMMANDS: &str = "\
commands (one per line on stdin; each answered `ok` or `error: ...`):
  topic NAME PARTS                 create a topic (replication 1)
  coordinator GROUP BROKER         move a group's coordinator
  down BROKER | up BROKER          take a broker down / bring it back
  rtt BROKER MS                    delay a broker's responses
  leader TOPIC PART BROKER         move a partition's leadership
  errors APIKEY CODE[,CODE...]     push errors on the cluster-wide stack of an API; a CODE is a
                                   number or a name (16 or NOT_COORDINATOR; -195 or _TRANSPORT = disconnect)
  broker-errors BROKER APIKEY CODE[:MS][,...]   push errors (with delays) on one broker's stack
  clear-errors APIKEY              empty the cluster-wide stack of an API
  apiversion APIKEY MIN MAX        set the advertised version range of an API
  cap-group-apis                   JoinGroup <= 5, SyncGroup/Heartbeat <= 3, LeaveGroup <= 2
  rebalance-delay MS               initial rebalance delay of new groups
  track on|off                     start (and reset) / stop request tracking
  requests                         `broker=.. api_key=.. ts_us=..` lines, then `end`
  quit";

struct Args {
    brokers: i32,
    topics: Vec<(String, i32)>,
    cap_group_apis: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        brokers: 3,
        topics: Vec::new(),
        cap_group_apis: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--brokers" => {
                let v = it.next().ok_or("--brokers needs a value")?;
                args.brokers = v.parse().map_err(|e| format!("--brokers {v}: {e}"))?;
                if args.brokers < 1 {
                    return Err("--brokers must be at least 1".into());
                }
            }
            "--topic" => {
                let v = it.next().ok_or("--topic needs NAME:PARTITIONS")?;
                let (name, parts) = v
                    .rsplit_once(':')
                    .ok_or(format!("--topic {v}: expected NAME:PARTITIONS"))?;
                let parts = parts.parse().map_err(|e| format!("--topic {v}: {e}"))?;
                args.topics.push((name.to_string(), parts));
            }
            // The default; still accepted.
            "--cap-group-apis" => args.cap_group_apis = true,
            "--no-cap-group-apis" => args.cap_group_apis = false,
            "-h" | "--help" => {
                println!("{USAGE}\n\n{COMMANDS}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn num<T: std::str::FromStr>(word: Option<&str>, what: &str) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    let w = word.with_context(|| format!("missing {what}"))?;
    w.parse().map_err(|e| anyhow::anyhow!("{what} {w:?}: {e}"))
}

fn text<'a>(word: Option<&'a str>, what: &str) -> anyhow::Result<&'a str> {
    word.with_context(|| format!("missing {what}"))
}

/// An error code as a number (`16`, `-195`) or a librdkafka name (`NOT_COORDINATOR`,
/// `_TRANSPORT`).
fn code(word: &str) -> anyhow::Result<ErrorCode> {
    word.parse::<ErrorCode>()
        .with_context(|| format!("error code {word:?}"))
}

fn codes(word: Option<&str>) -> anyhow::Result<Vec<ErrorCode>> {
    text(word, "CODE[,CODE...]")?.split(',').map(code).collect()
}

/// How many arguments each command takes.
fn arity(cmd: &str) -> Option<usize> {
    Some(match cmd {
        "cap-group-apis" | "requests" | "help" => 0,
        "down" | "up" | "clear-errors" | "rebalance-delay" | "track" => 1,
        "topic" | "coordinator" | "rtt" | "errors" => 2,
        "leader" | "broker-errors" | "apiversion" => 3,
        _ => return None,
    })
}

/// Runs one command; any output goes to `out` before the `ok`.
fn run_command(mock: &MockCluster, line: &str, out: &mut impl Write) -> anyhow::Result<()> {
    let mut words = line.split_whitespace();
    let Some(cmd) = words.next() else {
        return Ok(());
    };
    let want = arity(cmd).with_context(|| format!("unknown command {cmd:?} (try `help`)"))?;
    let got = words.clone().count();
    if got != want {
        bail!("{cmd} takes {want} argument(s), got {got} (try `help`)");
    }
    match cmd {
        "topic" => {
            let name = text(words.next(), "NAME")?;
            mock.create_topic(name, num(words.next(), "PARTS")?, 1)?;
        }
        "coordinator" => {
            let group = text(words.next(), "GROUP")?;
            mock.set_group_coordinator(group, num(words.next(), "BROKER")?)?;
        }
        "down" => mock.broker_down(num(words.next(), "BROKER")?)?,
        "up" => mock.broker_up(num(words.next(), "BROKER")?)?,
        "rtt" => {
            let broker = num(words.next(), "BROKER")?;
            mock.set_rtt(broker, Duration::from_millis(num(words.next(), "MS")?))?;
        }
        "leader" => {
            let topic = text(words.next(), "TOPIC")?;
            let part = num(words.next(), "PART")?;
            mock.partition_set_leader(topic, part, num(words.next(), "BROKER")?)?;
        }
        "errors" => {
            let api = num(words.next(), "APIKEY")?;
            mock.push_request_errors(api, &codes(words.next())?);
        }
        "broker-errors" => {
            let broker = num(words.next(), "BROKER")?;
            let api = num(words.next(), "APIKEY")?;
            let pairs = text(words.next(), "CODE[:MS][,...]")?
                .split(',')
                .map(|p| {
                    let (code, ms) = p.split_once(':').unwrap_or((p, "0"));
                    Ok((
                        self::code(code)?,
                        Duration::from_millis(num(Some(ms), "MS")?),
                    ))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            mock.push_broker_request_errors(broker, api, &pairs)?;
        }
        "clear-errors" => mock.clear_request_errors(num(words.next(), "APIKEY")?),
        "apiversion" => {
            let api = num(words.next(), "APIKEY")?;
            let min = num(words.next(), "MIN")?;
            mock.set_api_version(api, min, num(words.next(), "MAX")?)?;
        }
        "cap-group-apis" => mock.cap_group_apis()?,
        "rebalance-delay" => {
            mock.set_group_initial_rebalance_delay(Duration::from_millis(num(words.next(), "MS")?))
        }
        "track" => match text(words.next(), "on|off")? {
            "on" => mock.start_request_tracking(),
            "off" => mock.stop_request_tracking(),
            other => bail!("track {other}: expected on or off"),
        },
        "requests" => {
            for r in mock.requests() {
                writeln!(
                    out,
                    "broker={} api_key={} ts_us={}",
                    r.broker, r.api_key, r.timestamp_us
                )?;
            }
            writeln!(out, "end")?;
        }
        "help" => {
            for l in COMMANDS.lines() {
                writeln!(out, "# {l}")?;
            }
        }
        other => bail!("unknown command {other:?} (try `help`)"),
    }
    Ok(())
}

/// Reads commands until `quit` (returns true) or end of input (returns false).
fn command_loop(mock: &MockCluster) -> bool {
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        if line == "quit" {
            let _ = writeln!(out, "ok");
            let _ = out.flush();
            return true;
        }
        let answer = run_command(mock, line, &mut out);
        let _ = match answer {
            Ok(()) => writeln!(out, "ok"),
            Err(e) => writeln!(out, "error: {e:#}"),
        };
        let _ = out.flush();
    }
    false
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT"),
        _ = term.recv() => Ok(()),
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the signal runtime")?;
    let mock = Arc::new(MockCluster::new(args.brokers)?);
    if args.cap_group_apis {
        mock.cap_group_apis()?;
    }
    for (name, parts) in &args.topics {
        mock.create_topic(name, *parts, 1)?;
    }
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", mock.bootstrap())?;
        out.flush()?;
    }
    eprintln!(
        "mock-cluster: {} broker(s); commands on stdin (`help`), `quit` or SIGINT/SIGTERM to stop",
        args.brokers
    );

    let (quit_tx, quit_rx) = tokio::sync::oneshot::channel::<()>();
    let reader_mock = Arc::clone(&mock);
    // A plain thread: a read blocked on stdin must not hold the process open at exit.
    std::thread::spawn(move || {
        if command_loop(&reader_mock) {
            let _ = quit_tx.send(());
        } else {
            // End of input: keep serving until a signal. Dropping the sender would
            // wake the receiver, so keep it alive for good.
            std::mem::forget(quit_tx);
        }
    });
    runtime.block_on(async {
        tokio::select! {
            _ = quit_rx => Ok(()),
            r = shutdown_signal() => r,
        }
    })?;
    drop(runtime);
    eprintln!("mock-cluster: stopping");
    // The reader thread may still hold a clone while blocked on stdin; the cluster is
    // destroyed when the process exits in that case.
    drop(mock);
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mock-cluster: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mock-cluster: {e:#}");
            ExitCode::FAILURE
        }
    }
}
