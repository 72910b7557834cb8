//! The chaos harness on applications: a correct `Processor` and a correct `Consumer`
//! loop pass a brief run, and each deliberately broken application is caught by the
//! check that matches its bug, its failure naming the seed and the command that
//! replays it:
//!
//! - one that acknowledges before finishing (its handler spawns the work and returns):
//!   `unfinished_commits`;
//! - one that drops records (returns `Ok` without doing the work): `lost`;
//! - one that keeps handling after losing its partitions (work that starts after the
//!   handler returned): `handled_after_release`.
//!
//! The broken runs are short and fault-free (only joins and leaves where a rebalance is
//! the point): the bug, not the faults, must be what fails them.

use std::time::Duration;

use ottla::ConsumerRecord;
use ottla::consumer::GroupProtocol;
use ottla::processor::ProcessError;
use ottla_testkit::chaos::journal::Check;
use ottla_testkit::chaos::schedule::{self, FaultKind};
use ottla_testkit::chaos::{self, App, Chaos, Faults, Report};

/// The panic message of a failing `Chaos::run`.
async fn failure_of(chaos: Chaos, app: App) -> String {
    let joined = tokio::spawn(chaos.run(app)).await;
    let Err(e) = joined else {
        panic!("the broken application passed the chaos run");
    };
    let payload = e.into_panic();
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn count(report: &Report, check: Check) -> u64 {
    report.analysis.checks.get(&check).copied().unwrap_or(0)
}

/// Asserts that the failure names the seed and a replay command with it.
fn assert_replayable(message: &str, seed: u64) {
    assert!(
        message.contains(&format!("seed {seed}")),
        "the failure does not name the seed {seed}: {message}"
    );
    assert!(
        message.contains(&format!("replay with: OTTLA_CHAOS_SEED={seed} cargo test")),
        "the failure does not give the replay command: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correct_processor_passes_every_fault_kind_under_the_consumer_protocol() {
    let app = App::processor(
        |b| b.dlq_suffix(".dlq"),
        |record: &ConsumerRecord, _cancel| {
            // A record the handler can never take (one in 64): dead-lettered.
            let poisoned = record.value().is_some_and(|v| v.len() % 64 == 63);
            async move {
                if poisoned {
                    return Err(ProcessError::permanent("Poison", "cannot be handled"));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok(())
            }
        },
    );
    // The consumer protocol: the classic one's kills and crashes can trip the mock's own
    // assertion on a reused member id (docs/peers.md); ottla-chaos's suite runs both.
    let report = Chaos::new(GroupProtocol::Consumer)
        .seed(41)
        .duration(Duration::from_secs(20))
        .run(app)
        .await;
    let a = &report.analysis;
    assert!(a.produced > 1000, "too little was produced: {}", a.produced);
    assert!(a.dead_lettered > 0, "nothing was dead-lettered");
    assert!(
        report.fault_total() > 10,
        "too few faults: {:?}",
        report.faults
    );
    assert!(report.drained);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correct_consumer_loop_passes_under_the_consumer_protocol() {
    let app = App::consumer(|seat| async move {
        let mut consumer = seat.consumer().build().await?;
        let mut events = consumer.take_events();
        let witness = seat.witness().clone();
        let mut every = tokio::time::interval(Duration::from_millis(200));
        loop {
            // Events first: an assignment is shown before its partitions' records.
            tokio::select! {
                biased;
                _ = seat.left() => break,
                Some(event) = events.recv() => seat.observe(&event),
                // Everything delivered is handled (below, before the next record):
                // the positions are safe to commit.
                _ = every.tick() => drop(consumer.commit_async()),
                next = consumer.recv() => match next {
                    Some(Ok(record)) => {
                        if let Some(effect) = witness.begin(&record) {
                            effect.done();
                        }
                    }
                    Some(Err(_)) => {}
                    None => break,
                },
            }
        }
        // A last commit may meet a moving coordinator; the group redoes what it missed.
        let _ = consumer.commit().await;
        consumer.close().await?;
        Ok(())
    });
    let report = Chaos::new(GroupProtocol::Consumer)
        .seed(42)
        .duration(Duration::from_secs(15))
        .faults(
            Faults::none()
                .rate(FaultKind::Move, 12.0)
                .rate(FaultKind::Kill, 8.0)
                .rate(FaultKind::Join, 8.0)
                .rate(FaultKind::Leave, 8.0),
        )
        .run(app)
        .await;
    assert!(report.analysis.produced > 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_that_acknowledges_before_finishing_is_caught() {
    // The handler spawns the work and returns: the Processor commits past records
    // whose work is still running.
    let app = App::processor_witnessed(
        |b| b,
        |witness| {
            move |record: &ConsumerRecord, _cancel| {
                let effect = witness.begin(record);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    if let Some(e) = effect {
                        e.done();
                    }
                });
                async { Ok::<(), ProcessError>(()) }
            }
        },
    );
    let chaos = || {
        Chaos::new(GroupProtocol::Classic)
            .seed(43)
            .duration(Duration::from_secs(6))
            .faults(Faults::none())
            .drain_timeout(Duration::from_secs(20))
    };
    let message = failure_of(chaos(), app).await;
    assert!(message.contains(" unfinished_commits="), "{message}");
    assert_replayable(&message, 43);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_that_drops_records_is_caught() {
    // Every tenth record is acknowledged without its work being done.
    let app = App::processor_witnessed(
        |b| b,
        |witness| {
            move |record: &ConsumerRecord, _cancel| {
                if let Some(effect) = witness.begin(record) {
                    if effect.seq() % 10 != 3 {
                        effect.done();
                    }
                }
                async { Ok::<(), ProcessError>(()) }
            }
        },
    );
    let report = Chaos::new(GroupProtocol::Consumer)
        .seed(44)
        .duration(Duration::from_secs(6))
        .faults(Faults::none())
        .drain_timeout(Duration::from_secs(20))
        .try_run(app)
        .await
        .expect("the run starts");
    assert!(!report.passed());
    assert!(
        report.analysis.lost >= report.analysis.produced / 20,
        "the dropped records were not found lost: {}",
        report.summary()
    );
    assert!(report.summary().contains("seed=44"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_that_keeps_handling_after_losing_its_partitions_is_caught() {
    // The handler hands the record to work of the member that starts half a second
    // later, and returns: the work goes on after a rebalance took the partition away
    // (records flow all the time, so every rebalance that moves a partition leaves
    // some of its work to start after the member gave it back).
    let app = App::processor_witnessed(
        |b| b,
        |witness| {
            move |record: &ConsumerRecord, _cancel| {
                let (witness, record) = (witness.clone(), record.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if let Some(effect) = witness.begin(&record) {
                        effect.done();
                    }
                });
                async { Ok::<(), ProcessError>(()) }
            }
        },
    );
    let chaos = Chaos::new(GroupProtocol::Classic)
        .seed(45)
        .duration(Duration::from_secs(12))
        .rate(150.0)
        .faults(Faults::none().rate(FaultKind::Join, 20.0))
        .drain_timeout(Duration::from_secs(15));
    // The seed's plan has a member join while records flow, so a rebalance moves
    // partitions away from members that stay.
    let config = chaos.config().expect("the configuration");
    let plan = schedule::plan(&config.plan_input(vec![1, 2, 3]));
    println!("plan: {plan:?}");
    assert!(
        plan.iter().any(|(at, a)| a.kind() == Some(FaultKind::Join)
            && *at > Duration::from_secs(1)
            && *at < Duration::from_secs(9)),
        "the plan has no join between 1 s and 9 s: {plan:?}"
    );
    let report = chaos.try_run(app).await.expect("the run starts");
    assert!(
        count(&report, Check::AfterRelease) > 0,
        "no work after a release was found: {}",
        report.summary()
    );
    assert!(report.summary().contains("seed=45"));
}

/// Exactly-once mode on the mock (ottla's workspace patches it to write transaction
/// markers and keep transactional offsets; tansu loses offsets when producers'
/// transactions overlap, docs/peers.md): a Processor that copies each record to the
/// output topic in its transactions, under every fault kind (members killed and
/// crashed: each restart, on the same `transactional.id`, fences the one before and
/// aborts what it left open), leaves every input in the output exactly once for a
/// `read_committed` reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_processor_copies_each_record_once_under_every_fault_kind() {
    let app = App::processor(
        |b| b.dlq_suffix(".dlq"),
        |record: &ConsumerRecord, cancel: ottla::processor::Cancel| {
            let poisoned = record.value().is_some_and(|v| v.len() % 64 == 63);
            if !poisoned {
                cancel.send(chaos::copy_of(record));
            }
            async move {
                if poisoned {
                    Err(ProcessError::permanent("Poison", "never taken"))
                } else {
                    Ok(())
                }
            }
        },
    );
    let report = Chaos::new(GroupProtocol::Classic)
        .exactly_once()
        .seed(45)
        .duration(Duration::from_secs(20))
        .faults(
            Faults::brief()
                .rate(FaultKind::Kill, 6.0)
                .rate(FaultKind::Crash, 6.0),
        )
        .run(app)
        .await;
    let e = report
        .exactly_once
        .as_ref()
        .expect("an exactly-once report");
    assert!(e.holds(), "{}", report.summary());
    // At least one copy per input (more where the run's producer wrote an input
    // twice: each copy is an input of its own).
    assert!(e.read >= report.analysis.produced, "{}", report.summary());
    assert!(
        report.summary().contains(" duplicates=0 "),
        "{}",
        report.summary()
    );
}

/// The exactly-once check catches an application that writes some outputs twice
/// (outside the one copy the transaction carries), with no fault at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_run_catches_outputs_written_twice() {
    let app = App::processor(
        |b| b,
        |record: &ConsumerRecord, cancel: ottla::processor::Cancel| {
            cancel.send(chaos::copy_of(record));
            if ottla_testkit::chaos::member::seq_of(record).is_some_and(|s| s % 10 == 3) {
                cancel.send(chaos::copy_of(record));
            }
            async { Ok::<(), ProcessError>(()) }
        },
    );
    let report = Chaos::new(GroupProtocol::Classic)
        .tansu()
        .exactly_once()
        .seed(46)
        .duration(Duration::from_secs(6))
        .faults(Faults::none())
        .try_run(app)
        .await
        .expect("the run starts");
    assert!(!report.passed(), "{}", report.summary());
    let e = report
        .exactly_once
        .as_ref()
        .expect("an exactly-once report");
    assert!(
        e.duplicates >= report.analysis.produced / 20,
        "the doubled outputs were not found: {}",
        report.summary()
    );
    assert!(report.summary().contains("exactly_once=BROKEN"));
}
