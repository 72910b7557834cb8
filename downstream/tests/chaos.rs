//! This crate's handler (`tally`) chaos-tested through ottla-testkit's published
//! surface, as a user's crate does: three Processors running it with this crate's
//! retry policy and dead-letter topic, 30 s of every fault kind on the mock cluster
//! (coordinator moves and silences, brokers down, round-trip spikes, injected errors,
//! kills, crashes, joins, leaves), then the checks. `OTTLA_CHAOS_SEED` replays a seed,
//! `OTTLA_CHAOS_DURATION` soaks.
//!
//! The members speak the consumer protocol (KIP-848): under the classic protocol, kills
//! and crashes on the librdkafka mock can trip the mock's own assertion on a reused
//! member id and abort the test process (docs/peers.md), with nothing wrong on the
//! client's side. The seed is fixed, so that the test command meets the same faults.

use std::time::Duration;

use ottla::consumer::GroupProtocol;
use ottla::processor::{RetryBackoff, RetryPolicy};
use ottla_downstream_check::tally::Tally;
use ottla_testkit::chaos::{App, Chaos, Faults};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tally_handler_survives_chaos() {
    let tally = Tally::default();
    let handler_tally = tally.clone();
    let app = App::processor(
        |processor| {
            processor
                .retry_policy(RetryPolicy {
                    default: RetryBackoff {
                        max_retries: 3,
                        initial: Duration::from_millis(10),
                        max: Duration::from_millis(100),
                        multiplier: 2.0,
                        jitter: true,
                        min_delay: Duration::ZERO,
                    },
                    ..RetryPolicy::default()
                })
                .dlq_suffix(".dlq")
        },
        move |record, _cancel| {
            let tally = handler_tally.clone();
            let record = record.clone();
            async move { tally.take(&record).await }
        },
    );
    let report = Chaos::new(GroupProtocol::Consumer)
        .seed(11)
        .members(3)
        .duration(Duration::from_secs(30))
        .faults(Faults::brief())
        .run(app)
        .await;
    assert!(report.analysis.produced > 1000);
    assert!(tally.keys() > 1000);
}
