//! The harness's builder: a chaos run of your application in a test.

use std::collections::BTreeMap;
use std::time::Duration;

use ottla::consumer::GroupProtocol;
use ottla::processor::ProcessingOrder;

use super::member::Fates;
use super::schedule::FaultKind;
use super::{App, BrokerKind, Config, Report, parse_duration, run_app};

/// Which faults a run injects, in events per minute of each [`FaultKind`].
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    rates: BTreeMap<FaultKind, f64>,
}

impl Default for Faults {
    /// [`Faults::brief`].
    fn default() -> Self {
        Faults::brief()
    }
}

impl Faults {
    /// Every kind, often enough that a run of 20 to 30 s meets each of them:
    /// coordinator moves (12 a minute), a silent coordinator (6), brokers down (6),
    /// round-trip spikes (6), injected request errors (12), member kills (6) and
    /// crashes (4), joins (4) and leaves (4).
    pub fn brief() -> Faults {
        Faults::none()
            .rate(FaultKind::Move, 12.0)
            .rate(FaultKind::Silent, 6.0)
            .rate(FaultKind::Down, 6.0)
            .rate(FaultKind::Rtt, 6.0)
            .rate(FaultKind::Error, 12.0)
            .rate(FaultKind::Kill, 6.0)
            .rate(FaultKind::Crash, 4.0)
            .rate(FaultKind::Join, 4.0)
            .rate(FaultKind::Leave, 4.0)
    }

    /// The `chaos` program's rates, for long runs ([`FaultKind::default_rate`]).
    pub fn soak() -> Faults {
        Faults {
            rates: FaultKind::ALL
                .into_iter()
                .map(|k| (k, k.default_rate()))
                .collect(),
        }
    }

    /// No fault at all (a baseline run).
    pub fn none() -> Faults {
        Faults {
            rates: FaultKind::ALL.into_iter().map(|k| (k, 0.0)).collect(),
        }
    }

    /// `kind` at `per_minute` events a minute (0: never).
    pub fn rate(mut self, kind: FaultKind, per_minute: f64) -> Faults {
        self.rates.insert(kind, per_minute.max(0.0));
        self
    }
}

/// A chaos run of your application: members running it, a producer of keyed records,
/// a seeded fault schedule, and the checks.
///
/// ```no_run
/// # async fn example() {
/// use std::time::Duration;
/// use ottla::consumer::GroupProtocol;
/// use ottla_testkit::chaos::{App, Chaos, Faults};
///
/// let app = App::processor(|b| b, |_record, _cancel| async { Ok(()) });
/// let report = Chaos::new(GroupProtocol::Classic)
///     .members(3)
///     .duration(Duration::from_secs(20))
///     .faults(Faults::brief())
///     .run(app)
///     .await;
/// println!("{}", report.summary());
/// # }
/// ```
///
/// The seed is fresh each run unless [`Chaos::seed`] fixes it; `OTTLA_CHAOS_SEED`
/// replays one (it wins over `seed`), and `OTTLA_CHAOS_DURATION` (`90s`, `10m`) makes
/// the run longer or shorter (a soak).
#[derive(Debug, Clone)]
pub struct Chaos {
    config: Config,
    faults: Faults,
    /// The test that made it (libtest names a test's thread after the test).
    test: Option<String>,
}

impl Chaos {
    /// A run on the librdkafka mock cluster (3 brokers) whose members speak
    /// `protocol`, with the defaults: 3 members, 20 s of faults ([`Faults::brief`]),
    /// 6 partitions, 100 records a second, a fresh seed, records processed by
    /// partition. A passing run takes about half a minute.
    pub fn new(protocol: GroupProtocol) -> Chaos {
        let config = Config {
            duration: Duration::from_secs(20),
            group_protocol: protocol,
            produce_rate: 100.0,
            fates: Fates::NONE,
            progress: None,
            drain_timeout: Duration::from_secs(60),
            ..Config::default()
        };
        Chaos {
            config,
            faults: Faults::brief(),
            test: std::thread::current()
                .name()
                .filter(|n| *n != "main")
                .map(str::to_string),
        }
    }

    /// Members at the start (joins and leaves change it during the run).
    pub fn members(mut self, n: usize) -> Chaos {
        self.config.members = n.max(1);
        self
    }

    /// How long records are produced and faults injected (the drain comes after).
    pub fn duration(mut self, d: Duration) -> Chaos {
        self.config.duration = d;
        self
    }

    /// The faults.
    pub fn faults(mut self, faults: Faults) -> Chaos {
        self.faults = faults;
        self
    }

    /// The seed the faults are drawn from.
    pub fn seed(mut self, seed: u64) -> Chaos {
        self.config.seed = seed;
        self
    }

    /// Records produced per second.
    pub fn rate(mut self, per_second: f64) -> Chaos {
        self.config.produce_rate = per_second;
        self
    }

    /// Partitions of the topic.
    pub fn partitions(mut self, n: i32) -> Chaos {
        self.config.partitions = n.max(1);
        self
    }

    /// The order the members process in. [`ProcessingOrder::Key`] keys each
    /// partition's records with a few keys and checks that a member runs one record
    /// of a key at a time, in offset order (a `Processor` app gets this ordering;
    /// your `configure` closure may override it).
    pub fn ordering(mut self, order: ProcessingOrder) -> Chaos {
        self.config.ordering = order;
        self
    }

    /// Exactly-once mode: each member's Processor runs `exactly_once` with a
    /// `transactional.id` of its slot (your `configure` closure runs after, so do not
    /// unset it), and your handler copies each record it finishes with
    /// `cancel.send(chaos::copy_of(record))`. At the end a `read_committed` reader
    /// must find every input in the output or dead-letter topic exactly once; the
    /// report's `exactly_once` says what it found.
    ///
    /// The peer matters. The librdkafka mock as published writes no transaction
    /// markers (its `read_committed` readers see aborted records) and drops
    /// transactional offsets; ottla's workspace builds it with a test-only patch that
    /// does both as Kafka does (`vendor/rdkafka-sys/OTTLA-PATCH.md` in ottla's
    /// repository). tansu 0.6.0 loses a transaction's offsets when another
    /// producer's transaction is open and then fenced, so a run with member crashes
    /// fails there whatever the client does.
    pub fn exactly_once(mut self) -> Chaos {
        self.config.exactly_once = true;
        self
    }

    /// Runs on a tansu child process instead of the mock (the tansu binary:
    /// `TANSU_BIN` or `find_tansu`). Only member faults apply there (kills, crashes,
    /// joins, leaves).
    pub fn tansu(mut self) -> Chaos {
        self.config.broker = BrokerKind::Tansu;
        self
    }

    /// The members' session timeout (default 3 s).
    pub fn session_timeout(mut self, d: Duration) -> Chaos {
        self.config.session_timeout = d;
        self
    }

    /// How long the committed offsets may take to reach the log end once the faults
    /// stop (default 60 s).
    pub fn drain_timeout(mut self, d: Duration) -> Chaos {
        self.config.drain_timeout = d;
        self
    }

    /// Print every fault as it is applied, and a progress line every 10 s.
    pub fn verbose(mut self) -> Chaos {
        self.config.verbose = true;
        self.config.progress = Some(Duration::from_secs(10));
        self
    }

    /// The run's settings, with `OTTLA_CHAOS_SEED` and `OTTLA_CHAOS_DURATION` applied.
    pub fn config(&self) -> anyhow::Result<Config> {
        self.config_from(|k| std::env::var(k).ok())
    }

    fn config_from(&self, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Config> {
        let mut config = self.config.clone();
        config.rates = self.faults.rates.clone();
        if let Some(seed) = env("OTTLA_CHAOS_SEED") {
            config.seed = seed
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("OTTLA_CHAOS_SEED={seed}: not a number"))?;
        }
        if let Some(d) = env("OTTLA_CHAOS_DURATION") {
            config.duration = parse_duration(d.trim())?;
        }
        config.replay = Some(replay_command(&config, self.test.as_deref()));
        Ok(config)
    }

    /// Runs `app` and returns the report; panics when a record was lost or a check
    /// failed, with the report, the seed and the command that replays the run.
    pub async fn run(self, app: App) -> Report {
        let report = match self.try_run(app).await {
            Ok(r) => r,
            Err(e) => panic!("the chaos run could not be set up: {e:#}"),
        };
        if !report.passed() {
            panic!(
                "the chaos run failed (seed {}):\n{report}\n{}\nreplay with: {}",
                report.seed,
                report.summary(),
                report.replay
            );
        }
        report
    }

    /// Runs `app` and returns the report, passing or not (see [`Report::passed`]);
    /// prints it and its summary line. `Err` only when the run could not be set up.
    pub async fn try_run(self, app: App) -> anyhow::Result<Report> {
        let config = self.config()?;
        let report = run_app(config, app).await?;
        println!("{report}");
        if let Some(line) = report.replay_line() {
            println!("{line}");
        }
        println!("{}", report.summary());
        Ok(report)
    }
}

/// The command that replays a harness run: the test that ran it, with its seed (and
/// its duration when `OTTLA_CHAOS_DURATION` set it).
fn replay_command(config: &Config, test: Option<&str>) -> String {
    let test = test.map(|n| format!(" {n} -- --exact")).unwrap_or_default();
    let duration = std::env::var("OTTLA_CHAOS_DURATION")
        .map(|d| format!("OTTLA_CHAOS_DURATION={d} "))
        .unwrap_or_default();
    format!(
        "{duration}OTTLA_CHAOS_SEED={} cargo test{test}",
        config.seed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_replays_a_seed_and_sets_the_duration() {
        let chaos = Chaos::new(GroupProtocol::Classic).seed(5);
        let none = |_: &str| None;
        let c = chaos.config_from(none).unwrap();
        assert_eq!((c.seed, c.duration), (5, Duration::from_secs(20)));
        assert!(
            c.replay
                .as_deref()
                .is_some_and(|r| r.contains("OTTLA_CHAOS_SEED=5 "))
        );
        let env = |k: &str| match k {
            "OTTLA_CHAOS_SEED" => Some("77".to_string()),
            "OTTLA_CHAOS_DURATION" => Some("2m".to_string()),
            _ => None,
        };
        let c = chaos.config_from(env).unwrap();
        assert_eq!((c.seed, c.duration), (77, Duration::from_secs(120)));
        let bad = |k: &str| (k == "OTTLA_CHAOS_SEED").then(|| "x".to_string());
        assert!(chaos.config_from(bad).is_err());
    }

    #[test]
    fn brief_faults_have_every_kind_and_none_has_none() {
        let brief = Faults::brief();
        assert!(FaultKind::ALL.iter().all(|k| brief.rates[k] > 0.0));
        let none = Faults::none();
        assert!(FaultKind::ALL.iter().all(|k| none.rates[k] == 0.0));
        assert_eq!(
            Faults::none().rate(FaultKind::Kill, 3.0).rates[&FaultKind::Kill],
            3.0
        );
    }
}
