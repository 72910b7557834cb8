//! A consumer whose application only calls `recv()` never reads the event stream. With
//! automatic commits every few milliseconds, each commit's `CommitCompleted` used to
//! pile up in an unbounded channel: 7.7 MB to 50.5 MB RSS in 60 s on tansu (issue 16).
//! Here 40,000 automatic commits (`OTTLA_AUTO_COMMITS`) go through the librdkafka mock
//! with nobody reading events, and live memory must stay flat. (Unbounded, the events
//! of the 36,000 commits measured would take about 8 MB, four times the limit; 100,000
//! took 160 to 220 s of a 2-core CI run's debug build, near nextest's 300 s cut-off.)

use std::time::{Duration, Instant};

use ottla::consumer::{Consumer, OffsetReset};
use protocol_tests::alloc::{Counting, MemoryWindow, mib};
use protocol_tests::data::produce;
use protocol_tests::mock::MockCluster;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// OffsetCommit's API key.
const OFFSET_COMMIT: i16 = 8;

/// Live memory may grow at most this much between the first tenth of the commits and
/// the end (unbounded, the events alone took about 20 MB for 90,000 commits).
const GROWTH_LIMIT: i64 = 2 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tens_of_thousands_of_automatic_commits_nobody_reads_keep_memory_flat() {
    protocol_tests::init_tracing();
    let target = protocol_tests::env_number("OTTLA_AUTO_COMMITS", 40_000) as usize;
    let mock = MockCluster::new(1).expect("mock");
    mock.cap_group_apis().expect("caps");
    mock.set_group_initial_rebalance_delay(Duration::from_millis(100));
    mock.create_topic("unread", 1, 1).expect("topic");
    produce(&mock.bootstrap(), "unread", 1, 0, 10, "none")
        .await
        .expect("produce");
    // One automatic commit at a time, back to back: as fast as the mock answers.
    let mut consumer = Consumer::builder(&mock.bootstrap())
        .group_id("unread")
        .topics(["unread"])
        .offset_reset(OffsetReset::Earliest)
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .auto_commit(Some(Duration::from_micros(50)))
        .build()
        .await
        .expect("consumer");
    for _ in 0..10 {
        let record = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .expect("a record within 30 s")
            .expect("the consumer runs");
        record.expect("a record");
    }
    mock.start_request_tracking();
    let commits = || {
        mock.requests()
            .iter()
            .filter(|r| r.api_key == OFFSET_COMMIT)
            .count()
    };
    let started = Instant::now();
    let mut window = None;
    loop {
        // The application keeps calling recv(), as one that only reads records does.
        let _ = tokio::time::timeout(Duration::from_millis(500), consumer.recv()).await;
        let done = commits();
        if window.is_none() && done >= target / 10 {
            window = Some((MemoryWindow::open(), done));
        }
        if done >= target {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "only {done} automatic commits in 300 s"
        );
    }
    let (window, from) = window.expect("a tenth of the commits");
    let (growth, peak) = (window.growth(), window.peak_growth());
    let done = commits();
    println!(
        "{} automatic commits in {:?} with nobody reading events; live memory from commit {from} on: {:+.2} MiB now, {:.2} MiB at the peak",
        done,
        started.elapsed(),
        growth as f64 / (1024.0 * 1024.0),
        mib(peak)
    );
    assert!(
        growth <= GROWTH_LIMIT,
        "live memory grew by {growth} bytes over {} commits",
        done - from
    );
    consumer.close().await.expect("close");
}
