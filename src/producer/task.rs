//! The producer's background task: a `select!` loop that does what the accumulator
//! says (claims, InitProducerId, Produce rounds) and paces the metadata refreshes it
//! asks for ([`RefreshPace`]).

use super::txn;
use super::*;

pub(super) async fn drive(cluster: Cluster, shared: Arc<Shared>) {
    let mut tasks: JoinSet<Done> = JoinSet::new();
    // The accumulator decides what to send and when to retry; this paces the metadata
    // refreshes it asks for (a record for a topic the cluster does not have keeps
    // asking until `max.block.ms`, and must not spin).
    let mut metadata = {
        let s = lock(&shared.state);
        let c = s.acc.config();
        RefreshPace::new(c.retry_backoff, c.retry_backoff_max, c.seed.rotate_left(29))
    };
    loop {
        let now = Instant::now();
        let (nodes, refresh, pid, wakeup, done, txn_request) = {
            let mut s = lock(&shared.state);
            let std_now = now.into_std();
            s.acc.handle_timeout(std_now);
            let txn_request = txn::step(&mut s, std_now);
            let pid = s.acc.claim_producer_id(std_now);
            let nodes = {
                let State { acc, txn, .. } = &mut *s;
                // A transactional producer's partition waits until the coordinator
                // added it to the transaction.
                acc.claim_ready_gated(std_now, |tp| txn.as_ref().is_none_or(|t| t.may_send(tp)))
            };
            while let Some(event) = s.acc.poll_event() {
                match event {
                    AccumulatorEvent::MetadataNeeded => metadata.request(),
                }
            }
            let refresh = metadata.poll_start(std_now);
            let done = s.closed && s.acc.is_idle();
            let txn_timeout = s.txn.as_ref().and_then(|t| t.poll_timeout());
            let wakeup = [s.acc.poll_timeout(), metadata.poll_timeout(), txn_timeout]
                .into_iter()
                .flatten()
                .min();
            (nodes, refresh, pid, wakeup, done, txn_request)
        };
        if let Some((destination, body, token)) = txn_request {
            let (cluster, shared) = (cluster.clone(), shared.clone());
            tasks.spawn(async move {
                txn::send(cluster, shared, destination, body, token).await;
                Done::Other
            });
        }
        shared.dispatch();
        if done && tasks.is_empty() {
            break;
        }
        if pid {
            let (cluster, shared) = (cluster.clone(), shared.clone());
            tasks.spawn(async move {
                let result = init_producer_id(&cluster).await;
                if let Err(Error::Request(e)) = &result {
                    if e.is_security() {
                        // Nothing can be sent without a producer id: fail the records
                        // now rather than at delivery.timeout.ms.
                        lock(&shared.state)
                            .acc
                            .fail_all(&ConnectionFailure::new(e.clone()));
                    }
                }
                if let Err(e) = &result {
                    warn!(error = %e, "InitProducerId failed; retrying after a backoff");
                }
                // The accumulator paces the next attempt (`retry.backoff.ms`, doubling).
                lock(&shared.state)
                    .acc
                    .set_producer_id(Instant::now().into_std(), result.map_err(|_| ()));
                Done::Other
            });
        }
        if refresh {
            let (cluster, shared) = (cluster.clone(), shared.clone());
            tasks.spawn(async move {
                match cluster.refresh_metadata().await {
                    Ok(m) => {
                        lock(&shared.state).acc.update_metadata(&m);
                        shared.room.notify_waiters();
                        Done::Metadata(true)
                    }
                    Err(e) => {
                        debug!(error = %e, "metadata refresh failed");
                        lock(&shared.state).acc.metadata_failed();
                        Done::Metadata(false)
                    }
                }
            });
        }
        for node in nodes {
            let span = tracing::debug_span!(target: "ottla::produce", parent: None, "ottla.produce", broker = node.0);
            let (cluster, shared) = (cluster.clone(), shared.clone());
            tasks.spawn(
                async move {
                    produce_round(cluster, shared, node).await;
                    Done::Other
                }
                .instrument(span),
            );
        }
        let deadline = wakeup.map(Instant::from_std);
        tokio::select! {
            _ = shared.wake_driver.notified() => {}
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => match joined {
                Ok(Done::Metadata(ok)) => metadata.handle_done(Instant::now().into_std(), ok),
                Ok(Done::Other) => {}
                Err(e) => warn!(error = %e, "producer task failed"),
            },
            _ = sleep_until(deadline), if deadline.is_some() => {}
        }
    }
    debug!("producer task stopped");
}

/// What a task of the producer's driver did.
pub(super) enum Done {
    /// A metadata refresh ended (whether it brought metadata).
    Metadata(bool),
    Other,
}

pub(super) async fn init_producer_id(cluster: &Cluster) -> Result<(i64, i16)> {
    let conn = cluster.any_connection();
    let request = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000);
    let response = conn.send(&request).await?;
    if response.error_code != 0 {
        return Err(Error::broker(
            ApiKey::InitProducerId,
            response.error_code,
            None,
        ));
    }
    Ok((response.producer_id.0, response.producer_epoch))
}

/// One Produce to `node`.
pub(super) async fn produce_round(cluster: Cluster, shared: Arc<Shared>, node: NodeId) {
    let release = |shared: &Shared| {
        lock(&shared.state).acc.release_claim(node);
        shared.wake_driver.notify_one();
    };
    let conn = match cluster.broker(node) {
        Ok(c) => c,
        Err(_) => {
            release(&shared);
            return;
        }
    };
    let version = match conn.versions().await {
        Ok(t) => t.version(ApiKey::Produce),
        Err(e) if e.is_security() => {
            // No retry will get through: fail the waiting records now.
            lock(&shared.state)
                .acc
                .fail_node(node, &ConnectionFailure::new(e.clone()));
            release(&shared);
            return;
        }
        Err(_) => None,
    };
    let Some(version) = version else {
        release(&shared);
        return;
    };
    let built = {
        let mut s = lock(&shared.state);
        let State { acc, txn, .. } = &mut *s;
        let built = acc.build_produce_gated(Instant::now().into_std(), node, version, |tp| {
            txn.as_ref().is_none_or(|t| t.may_send(tp))
        });
        if crate::telemetry::ENABLED {
            if let Some((request, _)) = &built {
                let retries = s.acc.retries();
                let sizes = request
                    .topic_data
                    .iter()
                    .flat_map(|t| t.partition_data.iter())
                    .map(|p| p.records.as_ref().map_or(0, |r| r.len()));
                crate::telemetry::produce_sent(sizes, retries.saturating_sub(s.retries_told));
                s.retries_told = retries;
            }
        }
        built
    };
    let Some((request, token)) = built else {
        shared.dispatch();
        shared.wake_driver.notify_one();
        return;
    };
    let acks_zero = request.acks == 0;
    let result = if acks_zero {
        conn.send_raw(ApiKey::Produce, version, &request, false)
            .await
            .map(|_| None)
    } else {
        conn.send_version::<ProduceRequest>(&request, version)
            .await
            .map(Some)
    };
    {
        let mut s = lock(&shared.state);
        let now = Instant::now().into_std();
        match result {
            Ok(Some(response)) => {
                crate::telemetry::throttled(ApiKey::Produce, response.throttle_time_ms);
                s.acc.handle_produce(now, token, response);
            }
            Ok(None) => {
                s.acc.handle_unacknowledged(token);
                s.unanswered.insert(node);
            }
            Err(e) => {
                debug!(node = node.0, error = %e, "produce failed; retrying");
                s.acc.handle_failure(now, token, crate::driver::failure(e));
            }
        }
    }
    shared.dispatch();
    shared.wake_driver.notify_one();
}
