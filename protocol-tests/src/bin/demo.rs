//! The README's main job: seed 003's order mix through ottla's `Processor`, on an
//! embedded cluster, with nothing set up by hand.
//!
//! `cargo run --release -p protocol-tests --bin demo [-- --messages N --transient-pct P
//! --permanent-pct P --max-retries N --base-backoff-ms MS --seed N --processors N]`
//!
//! 1. starts an embedded librdkafka mock cluster (3 brokers, in this process);
//! 2. creates `brew.orders.v1` and `brew.orders.dlq`;
//! 3. writes the orders with ottla's producer: ok, transient (the inventory service
//!    times out twice, then answers), permanent (a business rule rejects the order)
//!    and malformed JSON, in the given shares;
//! 4. runs `Processor`s in one group, printing each attempt and the progress;
//! 5. prints the counters;
//! 6. lists the dead-letter topic with its headers;
//! 7. prints a summary read back from ottla's named metrics (a `metrics` recorder
//!    installed here; protocol-tests' default `metrics` feature): records consumed,
//!    processed by status, retries by attempt, dead letters by error type, commits,
//!    rebalances and the final lag.
//!
//! It exits non-zero unless every order ended handled or dead-lettered as its kind
//! says, and the group's committed offsets (read back with librdkafka, not ottla)
//! equal each partition's end. The knobs also come from the seed's variables
//! `SEED_MESSAGES`, `TRANSIENT_PCT`, `PERMANENT_PCT`, `MAX_RETRIES` and `BASE_BACKOFF`
//! (milliseconds); flags win.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ottla::ClientConfig;
use ottla::processor::{Metric, ProcessError, Processor, RetryBackoff, RetryPolicy};
use ottla::producer::{Producer, ProducerRecord};
use ottla::stats::ProcessorStats as Stats;
use protocol_tests::mock::MockCluster;
use tokio::sync::watch;

const TOPIC: &str = "brew.orders.v1";
const DLQ: &str = "brew.orders.dlq";
const GROUP: &str = "kitchen";
/// A transient order's inventory call fails this many times, then answers.
const TRANSIENT_FAILS: u32 = 2;

#[derive(Debug, Clone)]
struct Args {
    messages: u32,
    transient_pct: u32,
    permanent_pct: u32,
    max_retries: u32,
    base_backoff_ms: u64,
    seed: u64,
    partitions: i32,
    processors: usize,
    /// A cluster of the user's instead of the embedded one.
    bootstrap: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let env = |name: &str| std::env::var(name).ok();
    let num = |name: &str, v: String| -> Result<u64, String> {
        v.trim()
            .parse()
            .map_err(|_| format!("{name}: {v:?} is not a whole number"))
    };
    let mut a = Args {
        messages: 30,
        transient_pct: 30,
        permanent_pct: 20,
        max_retries: 3,
        base_backoff_ms: 200,
        seed: 3,
        partitions: 3,
        processors: 2,
        bootstrap: None,
    };
    for (var, slot) in [
        ("SEED_MESSAGES", &mut a.messages),
        ("TRANSIENT_PCT", &mut a.transient_pct),
        ("PERMANENT_PCT", &mut a.permanent_pct),
        ("MAX_RETRIES", &mut a.max_retries),
    ] {
        if let Some(v) = env(var) {
            *slot = u32::try_from(num(var, v)?).map_err(|e| format!("{var}: {e}"))?;
        }
    }
    if let Some(v) = env("BASE_BACKOFF") {
        a.base_backoff_ms = num("BASE_BACKOFF", v)?;
    }
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or(format!("{flag} needs a value"))
                .and_then(|v| num(&flag, v))
        };
        let small = |v: u64| u32::try_from(v).map_err(|e| e.to_string());
        match flag.as_str() {
            "--messages" => a.messages = small(value()?)?,
            "--transient-pct" => a.transient_pct = small(value()?)?,
            "--permanent-pct" => a.permanent_pct = small(value()?)?,
            "--max-retries" => a.max_retries = small(value()?)?,
            "--base-backoff-ms" => a.base_backoff_ms = value()?,
            "--seed" => a.seed = value()?,
            "--partitions" => a.partitions = i32::try_from(value()?).map_err(|e| e.to_string())?,
            "--processors" => a.processors = value()? as usize,
            "--bootstrap" => a.bootstrap = Some(it.next().ok_or("--bootstrap needs HOST:PORT")?),
            "-h" | "--help" => {
                println!(
                    "usage: demo [--messages N] [--transient-pct P] [--permanent-pct P] \
                     [--max-retries N] [--base-backoff-ms MS] [--seed N] [--partitions N] \
                     [--processors N] [--bootstrap HOST:PORT]\n\n\
                     --bootstrap runs on your cluster instead of an embedded one; it must \
                     hold brew.orders.v1 (--partitions partitions) and brew.orders.dlq (1), \
                     both empty, and the group `kitchen` must be new (a fresh \
                     `mock-cluster --topic brew.orders.v1:3 --topic brew.orders.dlq:1` does)"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag {other} (try --help)")),
        }
    }
    if a.transient_pct + a.permanent_pct > 100 {
        return Err("--transient-pct plus --permanent-pct must be at most 100".into());
    }
    if a.messages == 0 || a.partitions < 1 || a.processors < 1 {
        return Err("--messages, --partitions and --processors must be at least 1".into());
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> ExitCode {
    // The demo prints its own lines; the library's structured logs (retries at WARN,
    // dead letters at INFO, ...) show with RUST_LOG=ottla=info.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("ottla::processor=off,error"));
    // Colours only on a terminal, so piped logs stay greppable.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .init();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("demo: {e}");
            return ExitCode::from(2);
        }
    };
    // Before any client is built: ottla registers its metric handles then.
    summary::install();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ndemo FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Ok,
    Transient,
    Permanent,
    Malformed,
}

fn payload(id: u32, kind: Kind) -> String {
    let mode = match kind {
        Kind::Ok => "ok",
        Kind::Transient => "transient",
        Kind::Permanent => "permanent",
        Kind::Malformed => return format!("{{\"id\":{id},\"drink\":\"flat white\",\"total\":"),
    };
    format!(
        "{{\"id\":{id},\"drink\":\"flat white\",\"total\":{}.50,\"mode\":\"{mode}\"}}",
        3 + id % 4
    )
}

/// The seed's mix: each order is transient, permanent or ok by the percentages;
/// half of the permanent share is malformed JSON.
fn plan(a: &Args) -> Vec<Kind> {
    let mut state = a.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut permanent = 0u32;
    (0..a.messages)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let roll = (state % 100) as u32;
            if roll < a.transient_pct {
                Kind::Transient
            } else if roll < a.transient_pct + a.permanent_pct {
                permanent += 1;
                if permanent.is_multiple_of(2) {
                    Kind::Malformed
                } else {
                    Kind::Permanent
                }
            } else {
                Kind::Ok
            }
        })
        .collect()
}

/// What the demo's handlers saw.
#[derive(Default)]
struct Seen {
    attempts: HashMap<u32, u32>,
    succeeded: BTreeSet<u32>,
    dead_lettered: usize,
    committed: BTreeMap<i32, i64>,
}

/// The kitchen's handler: parse the order, call the inventory service, apply the
/// business rules. Prints one line per attempt when `verbose`.
fn prepare(
    record: &ottla::ConsumerRecord,
    seen: &Mutex<Seen>,
    max_retries: u32,
    verbose: bool,
) -> Result<(), ProcessError> {
    let at = format!("p{}@{:<3}", record.partition(), record.offset());
    let key = String::from_utf8_lossy(record.key().unwrap_or_default()).into_owned();
    let value = record.value_bytes().unwrap_or_default();
    let say = |tag: &str, text: String| {
        if verbose {
            println!("  {tag:<6} {at} {key:<10} {text}");
        }
    };
    let text = std::str::from_utf8(&value).map_err(|e| ProcessError::malformed(e.to_string()))?;
    // A poison pill: the JSON ends early. No backoff will fix it.
    let Some(id) = text.strip_suffix('}').and_then(|body| {
        body.split("\"id\":")
            .nth(1)?
            .split(',')
            .next()?
            .parse::<u32>()
            .ok()
    }) else {
        say("POISON", "invalid JSON -> DLQ at once".into());
        return Err(ProcessError::malformed(format!(
            "invalid json: unexpected end of input: {text}"
        )));
    };
    let n = {
        let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
        let n = s.attempts.entry(id).or_insert(0);
        *n += 1;
        *n
    };
    if text.contains("\"mode\":\"transient\"") && n <= TRANSIENT_FAILS {
        if n > max_retries {
            say(
                "EXH",
                format!("attempt {n}: inventory-service timed out; retries exhausted -> DLQ"),
            );
        } else {
            say(
                "RETRY",
                format!("attempt {n}: inventory-service timed out; retrying"),
            );
        }
        return Err(ProcessError::transient(
            "Timeout",
            format!("inventory-service timed out (attempt {n})"),
        ));
    }
    if text.contains("\"mode\":\"permanent\"") {
        say("PERM", "drink pulled from the menu -> DLQ at once".into());
        return Err(ProcessError::permanent(
            "BusinessRuleRejection",
            "drink pulled from the menu",
        ));
    }
    say(
        "OK",
        if n > 1 {
            format!("prepared on attempt {n}")
        } else {
            "prepared".into()
        },
    );
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .succeeded
        .insert(id);
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let verbose = args.messages <= 200;
    println!("ottla demo: seed 003's order mix through the Processor, on an embedded cluster\n");

    // 1-2. The cluster and the topics (or the user's, which has them).
    let _mock;
    let bootstrap = match &args.bootstrap {
        Some(bootstrap) => {
            println!("  cluster    {bootstrap} (--bootstrap)");
            bootstrap.clone()
        }
        None => {
            let mock = MockCluster::new(3)?;
            // The mock misreads the flexible group API versions it advertises (PEERS.md).
            mock.cap_group_apis()?;
            mock.set_group_initial_rebalance_delay(Duration::from_millis(300));
            mock.create_topic(TOPIC, args.partitions, 1)?;
            mock.create_topic(DLQ, 1, 1)?;
            let bootstrap = mock.bootstrap();
            println!("  cluster    librdkafka mock, 3 brokers, {bootstrap}");
            _mock = mock;
            bootstrap
        }
    };
    println!(
        "  topics     {TOPIC} ({} partitions), {DLQ} (1)",
        args.partitions
    );

    // 3. The orders.
    let kinds = plan(&args);
    let count = |k: Kind| kinds.iter().filter(|x| **x == k).count();
    println!(
        "  orders     {} (seed {}): {} ok, {} transient, {} permanent, {} malformed JSON",
        args.messages,
        args.seed,
        count(Kind::Ok),
        count(Kind::Transient),
        count(Kind::Permanent),
        count(Kind::Malformed)
    );
    let producer = Producer::builder(&bootstrap).build().await?;
    let mut deliveries = Vec::with_capacity(kinds.len());
    for (id, kind) in kinds.iter().enumerate() {
        let id = id as u32;
        let record = ProducerRecord::new(TOPIC)
            .key(format!("order-{id}"))
            .value(payload(id, *kind))
            .header("source", Some(bytes::Bytes::from_static(b"till-7")));
        deliveries.push(producer.send(record).await?);
    }
    let mut ends: BTreeMap<i32, i64> = (0..args.partitions).map(|p| (p, 0)).collect();
    for d in deliveries {
        let m = d.await?;
        let end = ends.entry(m.partition).or_default();
        *end = (*end).max(m.offset + 1);
    }
    producer.close().await;

    // 4. The processors.
    let policy = RetryPolicy {
        default: RetryBackoff {
            max_retries: args.max_retries,
            initial: Duration::from_millis(args.base_backoff_ms),
            max: Duration::from_millis(args.base_backoff_ms.max(1) * 8),
            multiplier: 2.0,
            jitter: true,
            min_delay: Duration::ZERO,
        },
        ..RetryPolicy::default()
    };
    println!(
        "  policy     max_retries {}, backoff {} ms x 2^retry (+0-10% jitter), up to {} ms",
        args.max_retries,
        args.base_backoff_ms,
        policy.default.max.as_millis()
    );
    println!(
        "  group      {GROUP}: {} processors, cooperative-sticky, commits every 200 ms\n",
        args.processors
    );
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut runs = Vec::new();
    for i in 0..args.processors {
        let hook = {
            let seen = seen.clone();
            move |m: Metric| {
                let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
                match m {
                    Metric::DeadLettered { .. } => s.dead_lettered += 1,
                    Metric::Committed { partition, offset } => {
                        let c = s.committed.entry(partition.partition).or_default();
                        *c = (*c).max(offset);
                    }
                    _ => {}
                }
            }
        };
        let processor = Processor::builder(&bootstrap, GROUP, [TOPIC])
            .retry_policy(policy.clone())
            .dlq_topic(|t| t.replace(".v1", ".dlq"))
            .commit_interval(Some(Duration::from_millis(200)))
            .timeouts(
                Duration::from_secs(6),
                Duration::from_millis(500),
                Duration::from_secs(60),
            )
            .processing_budget(Duration::from_secs(5))
            .metrics(hook)
            .consumer(|c| {
                c.client_id(format!("kitchen-{i}"))
                    .offset_reset(ottla::consumer::OffsetReset::Earliest)
                    .assignors(["cooperative-sticky"])
                    .map(|c| c.tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50)))
                    .unwrap_or_else(|_| unreachable!("cooperative-sticky is built in"))
            })
            .build()
            .await?;
        let (seen, max_retries) = (seen.clone(), args.max_retries);
        let mut stop = stop_rx.clone();
        runs.push(tokio::spawn(processor.run(
            move |record, _cancel| {
                let outcome = prepare(record, &seen, max_retries, verbose);
                async move { outcome }
            },
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        )));
    }

    // Progress, until every order is finished and committed (or 25 s pass).
    let deadline = Instant::now() + Duration::from_secs(25);
    let mut last = String::new();
    let mut next_line = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (ok, dlq, committed_all) = {
            let s = seen.lock().unwrap_or_else(|e| e.into_inner());
            let committed_all = ends
                .iter()
                .all(|(p, end)| s.committed.get(p).copied().unwrap_or(0) >= *end);
            (s.succeeded.len(), s.dead_lettered, committed_all)
        };
        let line = format!(
            "  progress   handled {ok}, dead-lettered {dlq}, of {}{}",
            args.messages,
            if committed_all { ", all committed" } else { "" }
        );
        if line != last && (Instant::now() >= next_line || committed_all) {
            println!("{line}  ({:.1?})", started.elapsed());
            last = line;
            next_line = Instant::now() + Duration::from_millis(500);
        }
        if ok + dlq >= args.messages as usize && committed_all {
            break;
        }
        if Instant::now() > deadline {
            println!("  (giving up after 25 s)");
            break;
        }
    }
    let _ = stop_tx.send(true);
    let mut stats = Stats::default();
    for r in runs {
        let s = r.await??;
        stats.succeeded += s.succeeded;
        stats.retries += s.retries;
        stats.dead_lettered += s.dead_lettered;
        stats.dlq_failures += s.dlq_failures;
        stats.commits += s.commits;
        stats.panics += s.panics;
    }

    // 5. Counters.
    let (succeeded, healed) = {
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        let healed = seen
            .succeeded
            .iter()
            .filter(|id| seen.attempts.get(id).copied().unwrap_or(0) > 1)
            .count();
        (seen.succeeded.clone(), healed)
    };
    println!("\ncounters");
    println!(
        "  handled         {:>5}  ({} on the first attempt, {healed} after retries)",
        stats.succeeded,
        stats.succeeded as usize - healed
    );
    println!("  retries         {:>5}", stats.retries);
    println!("  dead-lettered   {:>5}", stats.dead_lettered);
    println!("  DLQ failures    {:>5}", stats.dlq_failures);
    println!("  commits         {:>5}", stats.commits);

    // The committed offsets, read back by another client.
    let committed = committed_offsets(&bootstrap, args.partitions).await?;
    let shown: Vec<String> = ends
        .iter()
        .map(|(p, end)| format!("p{p} {}/{end}", committed.get(p).copied().unwrap_or(-1)))
        .collect();
    println!(
        "  committed       {}  (read back with librdkafka)",
        shown.join(", ")
    );

    // 6. The dead-letter topic.
    let config = ClientConfig::new(&bootstrap).with_client_id("ottla-demo-dlq");
    let entries = ottla::dlq::inspect(&config, DLQ).await?;
    println!("\ndead-letter topic {DLQ}: {} records", entries.len());
    for ((class, kind), n) in ottla::dlq::summary(&entries) {
        println!("  {n:>3} x {class} / {kind}");
    }
    let shown_entries = if verbose { entries.len() } else { 3 };
    for e in entries.iter().take(shown_entries) {
        let r = &e.record;
        println!(
            "\n  {DLQ}/{}@{}  key {}  from {}",
            r.partition(),
            r.offset(),
            String::from_utf8_lossy(r.key().unwrap_or_default()),
            e.origin_id().unwrap_or_else(|| "?".into())
        );
        println!(
            "    value  {}",
            String::from_utf8_lossy(r.value().unwrap_or_default())
        );
        for (k, v) in &r.headers_owned() {
            let v = v
                .as_deref()
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_else(|| "(null)".into());
            println!("    {:<28} {v}", String::from_utf8_lossy(k));
        }
    }
    if entries.len() > shown_entries {
        println!("\n  ... and {} more", entries.len() - shown_entries);
    }

    // The end state.
    let will_heal = args.max_retries >= TRANSIENT_FAILS;
    let want_ok: BTreeSet<u32> = kinds
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == Kind::Ok || (**k == Kind::Transient && will_heal))
        .map(|(i, _)| i as u32)
        .collect();
    let want_dlq: BTreeSet<String> = (0..args.messages)
        .filter(|i| !want_ok.contains(i))
        .map(|i| format!("order-{i}"))
        .collect();
    let got_dlq: BTreeSet<String> = entries
        .iter()
        .map(|e| String::from_utf8_lossy(e.record.key().unwrap_or_default()).into_owned())
        .collect();
    let mut problems = Vec::new();
    // The first few of a list, and how many there are.
    fn some<T: std::fmt::Debug>(items: Vec<T>) -> String {
        let n = items.len();
        let head: Vec<_> = items.into_iter().take(8).collect();
        if n > head.len() {
            format!("{n}, first {head:?}")
        } else {
            format!("{n} {head:?}")
        }
    }
    if succeeded != want_ok {
        let missing: Vec<_> = want_ok.difference(&succeeded).collect();
        problems.push(format!("orders not handled: {}", some(missing)));
    }
    if got_dlq != want_dlq {
        let missing: Vec<_> = want_dlq.difference(&got_dlq).collect();
        let extra: Vec<_> = got_dlq.difference(&want_dlq).collect();
        problems.push(format!(
            "dead-letter topic: missing {}, unexpected {}",
            some(missing),
            some(extra)
        ));
    }
    for (p, end) in &ends {
        let c = committed.get(p).copied().unwrap_or(-1);
        if c != *end {
            problems.push(format!("partition {p}: committed {c}, end {end}"));
        }
    }
    // 7. What the named metrics say.
    summary::print(GROUP, TOPIC);
    if !problems.is_empty() {
        anyhow::bail!("{}", problems.join("; "));
    }
    println!(
        "\nresult: every order handled or dead-lettered, committed offsets at each partition's end ({:.1?})",
        started.elapsed()
    );
    Ok(())
}

/// The summary read back from ottla's named metrics, through a recorder of the demo's
/// own: what an exporter (Prometheus, ...) would scrape.
#[cfg(feature = "metrics")]
mod summary {
    use std::collections::BTreeMap;
    use std::sync::OnceLock;

    use ottla::telemetry::{DEFAULT_PROCESSOR_PREFIX, names};
    use protocol_tests::kept::Kept;

    static KEPT: OnceLock<&'static Kept> = OnceLock::new();

    pub fn install() {
        if let Some(kept) = Kept::install() {
            let _ = KEPT.set(kept);
        }
    }

    /// Counters and gauges named `name` (histograms: their sample counts), by their
    /// labels.
    fn read(kept: &Kept, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        kept.values()
            .into_iter()
            .filter(|((n, _), _)| n == name)
            .map(|((_, labels), v)| (labels.into_iter().collect(), v))
            .collect()
    }

    pub fn print(group: &str, topic: &str) {
        let Some(kept) = KEPT.get() else {
            println!("\nmetrics: another recorder was installed; no summary");
            return;
        };
        let processor = |suffix: &str| format!("{DEFAULT_PROCESSOR_PREFIX}.{suffix}");
        // The values of `name` for this group (and this topic, where it has one),
        // summed by the value of `by` ("" sums them all).
        let sum_by = |name: &str, by: &[&str]| -> BTreeMap<Vec<String>, f64> {
            let mut out = BTreeMap::new();
            for (labels, v) in read(kept, name) {
                let ours = labels.get("group").is_none_or(|g| g == group)
                    && labels.get("topic").is_none_or(|t| t == topic);
                if ours {
                    let key = by
                        .iter()
                        .map(|l| labels.get(*l).cloned().unwrap_or_default())
                        .collect();
                    *out.entry(key).or_insert(0.0) += v;
                }
            }
            out
        };
        let total = |name: &str| sum_by(name, &[]).values().sum::<f64>();
        let of = |m: &BTreeMap<Vec<String>, f64>, key: &[&str]| {
            let key: Vec<String> = key.iter().map(|k| k.to_string()).collect();
            m.get(&key).copied().unwrap_or(0.0)
        };
        println!("\nmetrics (read back from ottla's named metrics, group {group})");
        println!(
            "  consumed        {:>5} records, {} bytes  ({}, {})",
            total(names::CONSUMER_RECORDS),
            total(names::CONSUMER_BYTES),
            names::CONSUMER_RECORDS,
            names::CONSUMER_BYTES
        );
        let processed = sum_by(&processor(names::PROCESSED), &["status"]);
        println!(
            "  processed       success {}, failure {}  ({})",
            of(&processed, &["success"]),
            of(&processed, &["failure"]),
            processor(names::PROCESSED)
        );
        let retries = sum_by(&processor(names::RETRY_COUNT), &["retry_attempt"]);
        let mut attempts: Vec<(u32, f64)> = retries
            .iter()
            .map(|(k, v)| (k.concat().parse().unwrap_or(0), *v))
            .collect();
        attempts.sort_by_key(|(attempt, _)| *attempt);
        let shown: Vec<String> = attempts
            .iter()
            .map(|(a, n)| format!("attempt {a}: {n}"))
            .collect();
        println!(
            "  retries         {}  ({})",
            if shown.is_empty() {
                "none".into()
            } else {
                shown.join(", ")
            },
            processor(names::RETRY_COUNT)
        );
        let dlq = sum_by(
            &processor(names::DLQ_COUNT),
            &["error_type", "error_classification"],
        );
        let shown: Vec<String> = dlq
            .iter()
            .map(|(k, n)| {
                format!(
                    "{n} {} ({})",
                    k.first().map_or("", |s| s),
                    k.get(1).map_or("", |s| s)
                )
            })
            .collect();
        println!(
            "  dead-lettered   {:>5}: {}  ({})",
            dlq.values().sum::<f64>(),
            if shown.is_empty() {
                "none".into()
            } else {
                shown.join(", ")
            },
            processor(names::DLQ_COUNT)
        );
        let commits = sum_by(names::CONSUMER_COMMITS, &["result"]);
        println!(
            "  commits         {} partition offsets, {} OffsetCommits ok, {} failed  ({}, {})",
            total(&processor(names::COMMITS)),
            of(&commits, &["ok"]),
            commits.values().sum::<f64>() - of(&commits, &["ok"]),
            processor(names::COMMITS),
            names::CONSUMER_COMMITS
        );
        println!(
            "  rebalances      {:>5}  ({}, both members)",
            total(names::CONSUMER_REBALANCES),
            names::CONSUMER_REBALANCES
        );
        println!(
            "  final lag       {:>5}  ({}, summed over the partitions)",
            total(names::CONSUMER_LAG),
            names::CONSUMER_LAG
        );
    }
}

/// Built without protocol-tests' `metrics` feature: no recorder, no summary.
#[cfg(not(feature = "metrics"))]
mod summary {
    pub fn install() {}

    pub fn print(_group: &str, _topic: &str) {
        println!("\nmetrics: not compiled in (built without protocol-tests' `metrics` feature)");
    }
}

/// The group's committed offsets, through librdkafka (an OffsetFetch, no join).
async fn committed_offsets(bootstrap: &str, partitions: i32) -> anyhow::Result<BTreeMap<i32, i64>> {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::{Offset, TopicPartitionList};
    let bootstrap = bootstrap.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", GROUP)
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(TOPIC, p);
        }
        let got = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
        Ok(got
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect())
    })
    .await?
}
