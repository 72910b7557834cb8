//! The test kit (`ottla-testkit`) through its public API, as a user of ottla gets it:
//! the README's example test, the builder's topics and error injection by name, and
//! the tansu fixture's start, topic and stop. (`fixtures.rs` checks the mock's other
//! calls, through `protocol_tests::mock`, which re-exports the kit.)

use std::time::Duration;

use anyhow::Context;
use ottla::consumer::{Consumer, OffsetReset};
use ottla::producer::{Producer, ProducerRecord};
use ottla_testkit::{ErrorCode, MockCluster, Tansu, api_key};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};

// ----- the README's example ("Testing your application"), verbatim -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_are_consumed_from_the_moved_coordinator() -> anyhow::Result<()> {
    // Three brokers in this process. The group APIs are capped at the versions the
    // mock parses, and a new group rebalances after 100 ms instead of 3 s.
    let mock = MockCluster::builder(3)
        .cap_group_apis()
        .initial_rebalance_delay(Duration::from_millis(100))
        .topic("orders", 3)
        .start()?;

    let producer = Producer::builder(&mock.bootstrap()).build().await?;
    for i in 0..10 {
        let delivery = producer
            .send(
                ProducerRecord::new("orders")
                    .key(format!("order-{i}"))
                    .value("{}"),
            )
            .await?;
        delivery.await?;
    }

    // Broker 2 coordinates the group, and the first FindCoordinator fails.
    mock.set_group_coordinator("billing", 2)?;
    mock.push_request_errors(
        api_key::FIND_COORDINATOR,
        &[ErrorCode::named("COORDINATOR_NOT_AVAILABLE")?],
    );
    mock.start_request_tracking();

    let mut consumer = Consumer::builder(&mock.bootstrap())
        .group_id("billing")
        .topics(["orders"])
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await?;
    for _ in 0..10 {
        let next = tokio::time::timeout(Duration::from_secs(30), consumer.recv()).await?;
        let Some(record) = next else {
            anyhow::bail!("the consumer stopped");
        };
        assert_eq!(record?.topic(), "orders");
    }
    consumer.close().await?;

    // The failed FindCoordinator was asked again, and every JoinGroup went to the
    // coordinator.
    let requests = mock.requests();
    let of = |api| requests.iter().filter(move |r| r.api_key == api);
    assert!(of(api_key::FIND_COORDINATOR).count() >= 2);
    let joins: Vec<_> = of(api_key::JOIN_GROUP).collect();
    assert!(!joins.is_empty());
    assert!(joins.iter().all(|r| r.broker == 2), "{joins:?}");
    Ok(())
}

/// The Rust block of a README section: the lines between the first ```` ```rust ````
/// fence after `heading` and its closing fence, without rustdoc's hidden (`# `) lines.
fn rust_block(readme: &str, heading: &str) -> anyhow::Result<String> {
    let section = readme
        .split_once(heading)
        .with_context(|| format!("no {heading:?}"))?
        .1;
    let start = section.find("```rust").context("no rust block")?;
    let body = section[start..]
        .split_once('\n')
        .context("an empty fence")?
        .1;
    let end = body.find("\n```").context("no closing fence")?;
    Ok(body[..end]
        .lines()
        .filter(|l| !l.starts_with("# ") && *l != "#")
        .map(|l| format!("{l}\n"))
        .collect())
}

/// The example in the root README and in the kit's README is the test above, so the
/// example users copy is one that runs.
#[test]
fn readme_examples_are_this_suites_test() -> anyhow::Result<()> {
    let root = include_str!("../../README.md");
    let kit = include_str!("../../testkit/README.md");
    let this = include_str!("testkit.rs");
    let in_root = rust_block(root, "## Testing your application")?;
    let in_kit = rust_block(kit, "## A test against the mock cluster")?;
    assert_eq!(in_root, in_kit, "the two READMEs show different examples");
    // The suite's copy sits after its own `use` lines; compare from the test on.
    let test = in_root
        .split_once("#[tokio::test")
        .context("no test in the README's example")?
        .1;
    assert!(
        this.contains(test),
        "the README's example test is not this suite's:\n{test}"
    );
    Ok(())
}

// ----- the mock through the kit -----

fn metadata(bootstrap: &str) -> anyhow::Result<rdkafka::metadata::Metadata> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating an rdkafka consumer")?;
    consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .context("fetch_metadata")
}

/// The builder's topics exist, with their partitions and replicas, before `start`
/// returns; every broker id has its own address.
#[test]
fn builder_creates_topics_before_start_returns() -> anyhow::Result<()> {
    let mock = MockCluster::builder(3)
        .topic("one", 2)
        .replicated_topic("three", 4, 3)
        .start()?;
    let addresses: Vec<String> = mock
        .broker_ids()
        .into_iter()
        .map(|b| mock.broker_address(b).context("an address per broker"))
        .collect::<anyhow::Result<_>>()?;
    assert_eq!(addresses.join(","), mock.bootstrap());
    assert_eq!(mock.broker_address(0), None);
    assert_eq!(mock.broker_address(4), None);

    let md = metadata(&mock.bootstrap())?;
    assert_eq!(md.brokers().len(), 3);
    let shape = |name: &str| {
        md.topics().iter().find(|t| t.name() == name).map(|t| {
            let replicas: Vec<usize> = t.partitions().iter().map(|p| p.replicas().len()).collect();
            (t.partitions().len(), replicas)
        })
    };
    assert_eq!(shape("one"), Some((2, vec![1, 1])));
    assert_eq!(shape("three"), Some((4, vec![3, 3, 3, 3])));
    Ok(())
}

/// An error pushed by its name reaches the client as that broker error: the producer's
/// delivery fails with TOPIC_AUTHORIZATION_FAILED (not retried), and the request that
/// carried it is in the tracked requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_pushed_by_name_reach_the_client() -> anyhow::Result<()> {
    let mock = MockCluster::builder(1).topic("guarded", 1).start()?;
    let producer = Producer::builder(&mock.bootstrap()).build().await?;
    // One record through first, so the injected error meets a Produce, not set-up.
    producer
        .send(ProducerRecord::new("guarded").value("before"))
        .await?
        .await?;
    let denied: ErrorCode = "topic_authorization_failed".parse()?;
    assert_eq!(denied, ErrorCode::TOPIC_AUTHORIZATION_FAILED);
    mock.start_request_tracking();
    mock.push_request_errors(api_key::PRODUCE, &[denied]);
    let outcome = producer
        .send(ProducerRecord::new("guarded").value("denied"))
        .await?
        .await;
    let err = match outcome {
        Ok(written) => anyhow::bail!("the record was written despite the error: {written:?}"),
        Err(e) => format!("{e:#} {e:?}"),
    };
    assert!(
        err.contains("TopicAuthorizationFailed") || err.contains("TOPIC_AUTHORIZATION_FAILED"),
        "the error names the broker error: {err}"
    );
    let produces = mock
        .requests()
        .iter()
        .filter(|r| r.api_key == api_key::PRODUCE && r.broker == 1)
        .count();
    assert!(produces >= 1, "the Produce was tracked");
    // The stack is empty again: the next record goes through.
    producer
        .send(ProducerRecord::new("guarded").value("after"))
        .await?
        .await?;
    producer.close().await;
    Ok(())
}

// ----- tansu through the kit -----

/// `Tansu::start` finds the binary, the topic it creates is in the broker's metadata
/// with its partitions and tansu's node id, and after `stop` the port refuses
/// connections.
#[test]
fn tansu_starts_creates_a_topic_and_stops() -> anyhow::Result<()> {
    let tansu = Tansu::start()?;
    tansu.create_topic("kit", 3)?;
    let md = metadata(&tansu.bootstrap())?;
    let brokers: Vec<i32> = md.brokers().iter().map(|b| b.id()).collect();
    assert_eq!(brokers, [Tansu::NODE_ID]);
    let partitions = md
        .topics()
        .iter()
        .find(|t| t.name() == "kit")
        .map(|t| t.partitions().len());
    assert_eq!(partitions, Some(3));
    let err = tansu
        .create_topic("kit", 3)
        .expect_err("a second create of the same topic fails");
    assert!(format!("{err:#}").contains("kit"), "{err:#}");

    let addr: std::net::SocketAddr = tansu.bootstrap().parse()?;
    tansu.stop();
    assert!(
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(),
        "tansu still accepts connections after stop"
    );
    Ok(())
}
