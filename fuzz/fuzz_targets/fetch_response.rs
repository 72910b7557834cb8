//! The fetch response path: arbitrary bytes decoded as a Fetch response at a version
//! ottla negotiates, handed to a fetcher that asked for two partitions, and drained.
//! Nothing may panic, and the fetcher's positions never move backwards.
#![no_main]

use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, FetchResponse};
use libfuzzer_sys::fuzz_target;
use ottla::proto::fetch::fetcher::{Fetcher, FetcherConfig};
use ottla::proto::group::consumer_protocol::TopicPartition;
use ottla::proto::metadata::{
    ClusterMetadata, LeaderEpoch, NodeId, PartitionMetadata, TopicMetadata,
};
use ottla::proto::wire::decode_response;
use uuid::Uuid;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let version = 4 + i16::from(selector) % 13;
    let Ok(response) =
        decode_response::<FetchResponse>(ApiKey::Fetch, version, Bytes::copy_from_slice(body))
    else {
        return;
    };
    let now = Instant::now();
    let mut config = FetcherConfig::default();
    config.batch.check_crcs = selector & 0x80 == 0;
    config.batch.max_decompressed = 1 << 20;
    let mut fetcher = Fetcher::new(config);
    let tps = [TopicPartition::new("t", 0), TopicPartition::new("t", 1)];
    fetcher.assign(&tps, true);
    for tp in &tps {
        fetcher.set_committed(tp, 0, -1);
    }
    let mut metadata = ClusterMetadata::default();
    metadata.topics.insert(
        "t".into(),
        TopicMetadata {
            name: "t".into(),
            id: Uuid::from_u128(1),
            internal: false,
            partitions: (0..2)
                .map(|p| PartitionMetadata {
                    partition: p,
                    leader: Some(NodeId(1)),
                    leader_epoch: LeaderEpoch(0),
                    replicas: vec![],
                    isr: vec![],
                    error: 0,
                })
                .collect(),
            error: 0,
        },
    );
    fetcher.update_metadata(&metadata);
    fetcher.claim_fetches(now);
    let Some((_, token)) = fetcher.build_fetch(now, NodeId(1), version) else {
        return;
    };
    fetcher.handle_fetch(now, token, response);
    let mut last = [0i64; 2];
    while let Some(item) = fetcher.next_record() {
        if let Ok(r) = item {
            let p = usize::try_from(r.partition).unwrap_or(0) % 2;
            assert!(r.offset >= last[p], "records go forward");
            last[p] = r.offset;
        }
    }
    for tp in &tps {
        if let Some((offset, _)) = fetcher.position(tp) {
            assert!(offset >= 0, "a position never goes below the start");
        }
    }
});
