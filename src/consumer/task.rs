//! The consumer's background task: a `select!` loop that runs the fetches, the
//! ListOffsets resets, the group member's events and the session's actions
//! ([`ConsumerSession`]: automatic commits, metadata refreshes), and finishes the
//! revocations the application hands back.

use super::*;
use crate::driver::{BrokerConnection, failure};
use crate::proto::Failure;
use crate::proto::fetch::fetcher::FetcherRequest;

pub(super) struct Driver {
    pub(super) cluster: Cluster,
    pub(super) shared: Arc<Shared>,
    pub(super) group: Option<GroupHandle>,
    pub(super) commander: Option<GroupCommander>,
    pub(super) commands: mpsc::UnboundedReceiver<Command>,
    pub(super) events: super::queue::EventSender,
    /// When to commit automatically and refresh metadata (sans-IO).
    pub(super) session: ConsumerSession,
    /// With a group: its configuration, from which the commit at a revocation takes
    /// its bound ([`RevocationCommit`]).
    pub(super) group_config: Option<Arc<GroupConfig>>,
    /// When the member last asked for partitions back (the revocation commit's clock
    /// starts there).
    pub(super) revoke_requested_at: Option<Instant>,
    /// Which of the partitions asked back are still the revocation's when the
    /// application finishes it.
    pub(super) revocation: PendingRevocation,
}

/// The commit of the partitions being revoked, retried as [`RevocationCommit`] says
/// (the rule and its bound live there, sans-IO). Tried once, a revocation overlapping a
/// coordinator move handed partitions over at an older offset, and up to a commit
/// interval of records was processed twice.
async fn commit_before_revocation(
    group: &GroupCommander,
    shared: &Shared,
    positions: Vec<(TopicPartition, i64, i32)>,
    mut retry: RevocationCommit,
) {
    loop {
        let ticket = commit_ticket(shared);
        let err = match group.start_commit(to_commit(positions.clone())).await {
            Ok(done) => return remember_committed(shared, &done, ticket),
            Err(e) => e,
        };
        match retry.handle_failure(Instant::now().into_std(), &err) {
            RevocationStep::GiveUp { attempts } => {
                warn!(error = %err, attempts, "commit before revocation failed; the next owner starts at the last committed offset");
                return;
            }
            RevocationStep::Retry { after } => {
                debug!(error = %err, ?after, "commit before revocation failed; retrying");
                tokio::time::sleep(after).await;
            }
        }
    }
}

enum Done {
    Io,
    /// An automatic commit finished (either way).
    AutoCommitted,
    Metadata(bool),
    Revoked,
}

pub(super) async fn drive(mut d: Driver) {
    let mut tasks: JoinSet<Done> = JoinSet::new();
    let mut security = d.cluster.security_failures();
    let mut hang_ups = d.cluster.hang_up_reports();
    let mut hang_ups_seen = 0;
    loop {
        let now = Instant::now();
        let wakeup = {
            let mut f = lock(&d.shared.fetcher);
            let std_now = now.into_std();
            for node in f.claim_fetches(std_now) {
                let span = tracing::debug_span!(target: "ottla::fetch", parent: None, "ottla.fetch", broker = node.0);
                tasks
                    .spawn(fetch_round(d.cluster.clone(), d.shared.clone(), node).instrument(span));
            }
            for node in f.resets_due(std_now) {
                tasks.spawn(reset_round(d.cluster.clone(), d.shared.clone(), node));
            }
            // One pass, after everything this turn did: the claims above can raise
            // events too (a partition without a leader asks for metadata), and each
            // one is either acted on or reported, none dropped.
            while let Some(event) = f.poll_event() {
                match event {
                    FetcherEvent::MetadataNeeded => d.session.metadata_needed(),
                    other => {
                        if let Some(event) = ConsumerEvent::from_fetch(other) {
                            d.events.send(event);
                        }
                    }
                }
            }
            f.poll_timeout().map(Instant::from_std)
        };
        d.session.handle_timeout(now.into_std());
        while let Some(action) = d.session.poll_action() {
            match action {
                SessionAction::RefreshMetadata => {
                    let (cluster, shared) = (d.cluster.clone(), d.shared.clone());
                    tasks.spawn(async move {
                        match cluster.refresh_metadata().await {
                            Ok(m) => {
                                lock(&shared.fetcher).update_metadata(&m);
                                Done::Metadata(true)
                            }
                            Err(e) => {
                                warn!(error = %e, "metadata refresh failed");
                                Done::Metadata(false)
                            }
                        }
                    });
                }
                SessionAction::AutoCommit => {
                    let positions = lock(&d.shared.fetcher).consumed(None);
                    let Some(group) = d.commander.clone().filter(|_| !positions.is_empty()) else {
                        d.session.auto_commit_done();
                        continue;
                    };
                    // Queued now, so it keeps its place among the commits.
                    let ticket = commit_ticket(&d.shared);
                    let pending = group.start_commit(to_commit(positions));
                    let shared = d.shared.clone();
                    tasks.spawn(async move {
                        if let Ok(done) = pending.await {
                            remember_committed(&shared, &done, ticket);
                        }
                        Done::AutoCommitted
                    });
                }
            }
        }
        let deadline = [wakeup, d.session.poll_timeout().map(Instant::from_std)]
            .into_iter()
            .flatten()
            .min();
        tokio::select! {
            event = next_group_event(&mut d.group) => match event {
                Some(event) => on_group_event(&mut d, &mut tasks, event),
                // The member stopped (it failed, and said so in its last event).
                None => d.group = None,
            },
            _ = d.shared.wake_driver.notified() => {}
            // A connection refused TLS or SASL: tell the application through recv(),
            // as the Java client throws from poll(); the connections keep trying.
            Ok(()) = security.changed() => {
                if let Some(e) = d.cluster.security_failure() {
                    lock(&d.shared.app).security = Some(e.into());
                    d.shared.wake_app();
                }
            }
            // A broker keeps hanging up on one request: say why nothing arrives.
            Ok(()) = hang_ups.changed() => {
                for report in d.cluster.hang_ups_since(&mut hang_ups_seen) {
                    d.events.send(ConsumerEvent::BrokerHangUp(report));
                }
            }
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                match done {
                    Ok(Done::Metadata(ok)) => {
                        d.session.metadata_refreshed(Instant::now().into_std(), ok);
                    }
                    Ok(Done::Io) | Ok(Done::Revoked) => {}
                    Ok(Done::AutoCommitted) => d.session.auto_commit_done(),
                    Err(e) => warn!(error = %e, "consumer task failed"),
                }
                d.shared.wake_app();
            }
            command = d.commands.recv() => match command {
                Some(Command::RevocationReady { generation, partitions }) => {
                    // Only what is still this revocation's: a partition lost and assigned
                    // again meanwhile is the new assignment's.
                    let partitions = d.revocation.ready(generation, &partitions);
                    let (shared, commander, auto) = (d.shared.clone(), d.commander.clone(), d.session.auto_commits());
                    let asked_at = d.revoke_requested_at.take().unwrap_or_else(Instant::now);
                    let retry = d.group_config.as_ref().map(|c| RevocationCommit::new(c, asked_at.into_std()));
                    tasks.spawn(async move {
                        let positions = {
                            let mut f = lock(&shared.fetcher);
                            f.mark_consumed();
                            f.consumed(Some(&partitions))
                        };
                        if let Some(group) = commander {
                            if let Some(retry) = retry.filter(|_| auto && !positions.is_empty()) {
                                commit_before_revocation(&group, &shared, positions, retry).await;
                            }
                            lock(&shared.fetcher).unassign(&partitions);
                            group.complete_revocation(generation).await;
                        }
                        Done::Revoked
                    });
                }
                Some(Command::Close(membership, done)) => {
                    if let Some(group) = d.group.take() {
                        group.leave_with(membership).await;
                    }
                    let _ = done.send(());
                    break;
                }
                None => break,
            },
            // The session's timers are looked at on the next turn.
            _ = sleep_until(deadline), if deadline.is_some() => {}
        }
    }
    lock(&d.shared.app).stopped = true;
    d.shared.wake_app();
    debug!("consumer task stopped");
}

async fn next_group_event(group: &mut Option<GroupHandle>) -> Option<Event> {
    match group {
        Some(g) => g.next_event().await,
        None => std::future::pending().await,
    }
}

fn on_group_event(d: &mut Driver, _tasks: &mut JoinSet<Done>, event: Event) {
    match &event {
        // Here, just before the event is queued: `Consumer::group_metadata` never names
        // a generation whose earlier events (a loss) are not yet in the queue.
        Event::Joined {
            generation,
            member_id,
            ..
        } => {
            if let Some(g) = &d.group {
                g.counters().set_member(*generation, Some(member_id));
            }
        }
        Event::MemberEpoch { epoch } => {
            if let Some(g) = &d.group {
                g.counters().set_member(*epoch, None);
            }
        }
        Event::Assigned { added, .. } => {
            d.revocation.assigned(added);
            lock(&d.shared.fetcher).assign(added, true);
        }
        Event::CommittedOffsets {
            offsets, metadata, ..
        } => {
            let mut f = lock(&d.shared.fetcher);
            let mut app = lock(&d.shared.app);
            for (tp, _, _) in offsets {
                app.committed_metadata.remove(tp);
            }
            for (tp, m) in metadata {
                if let Some((_, offset, _)) = offsets.iter().find(|(o, _, _)| o == tp) {
                    app.committed_metadata
                        .insert(tp.clone(), (*offset, m.clone()));
                }
            }
            for (tp, offset, epoch) in offsets {
                f.set_committed(tp, *offset, *epoch);
                if *offset >= 0 {
                    let ticket = app.commit_ticket;
                    app.committed.insert(tp.clone(), (*offset, ticket));
                }
            }
        }
        Event::RevokeRequested {
            generation,
            partitions,
        } => {
            {
                let mut f = lock(&d.shared.fetcher);
                let now = Instant::now().into_std();
                for tp in partitions {
                    f.pause(now, tp);
                    f.discard_buffered(tp);
                }
            }
            d.revoke_requested_at = Some(Instant::now());
            d.revocation.asked(*generation, partitions);
            lock(&d.shared.app).revoking = Some((*generation, partitions.clone()));
            d.shared.revoke_pending.store(true, Ordering::Release);
            d.shared.wake_app();
        }
        Event::Lost { partitions, .. } => {
            d.revocation.lost(partitions);
            lock(&d.shared.fetcher).unassign(partitions);
        }
        Event::Fatal(e) => {
            lock(&d.shared.app).fatal = Some(Error::Group(e.clone()));
            d.shared.wake_app();
        }
        Event::Error(e) => {
            lock(&d.shared.app).group_retrying = Some(Error::GroupRetrying(e.clone()));
            d.shared.wake_app();
        }
        _ => {}
    }
    if let Some(event) = ConsumerEvent::from_group(event) {
        d.events.send(event);
    }
}

/// One Fetch to `node`: negotiate (once per connection), build, send, hand back.
async fn fetch_round(cluster: Cluster, shared: Arc<Shared>, node: NodeId) -> Done {
    let fail = |shared: &Shared, failure: Failure| {
        let request = FetcherRequest::Fetch(node);
        lock(&shared.fetcher).handle_failure(Instant::now().into_std(), request, failure);
    };
    let conn = match cluster.broker(node) {
        Ok(c) => c,
        // No address for the node (it left the metadata): as a lost connection.
        Err(_) => {
            fail(&shared, Failure::Disconnected);
            return Done::Io;
        }
    };
    let version = match negotiated(&conn, ApiKey::Fetch).await {
        Ok(v) => v,
        Err(f) => {
            fail(&shared, f);
            return Done::Io;
        }
    };
    let built = lock(&shared.fetcher).build_fetch(Instant::now().into_std(), node, version);
    let Some((request, token)) = built else {
        return Done::Io;
    };
    match conn
        .send_version::<FetchRequest>(&request, token.version())
        .await
    {
        Ok(response) => {
            crate::telemetry::throttled(ApiKey::Fetch, response.throttle_time_ms);
            lock(&shared.fetcher).handle_fetch(Instant::now().into_std(), token, response);
        }
        Err(e) => {
            debug!(node = node.0, error = %e, "fetch failed");
            fail(&shared, failure(e));
        }
    }
    shared.wake_app();
    Done::Io
}

/// One ListOffsets to `node` for the partitions it leads that need a reset.
async fn reset_round(cluster: Cluster, shared: Arc<Shared>, node: NodeId) -> Done {
    let fail = |shared: &Shared, failure: Failure| {
        let request = FetcherRequest::ListOffsets(node);
        lock(&shared.fetcher).handle_failure(Instant::now().into_std(), request, failure);
    };
    let conn = match cluster.broker(node) {
        Ok(c) => c,
        // No address for the node (it left the metadata): as a lost connection.
        Err(_) => {
            fail(&shared, Failure::Disconnected);
            return Done::Io;
        }
    };
    let version = match negotiated(&conn, ApiKey::ListOffsets).await {
        Ok(v) => v,
        Err(f) => {
            fail(&shared, f);
            return Done::Io;
        }
    };
    let request: Option<ListOffsetsRequest> =
        lock(&shared.fetcher).build_list_offsets(Instant::now().into_std(), node, version);
    let Some(request) = request else {
        return Done::Io;
    };
    match conn.send_version(&request, version).await {
        Ok(response) => {
            lock(&shared.fetcher).handle_list_offsets(Instant::now().into_std(), node, response)
        }
        Err(e) => {
            debug!(node = node.0, error = %e, "ListOffsets failed");
            fail(&shared, failure(e));
        }
    }
    Done::Io
}

/// The version of `api` negotiated with `conn`'s broker, or why there is none.
async fn negotiated(conn: &BrokerConnection, api: ApiKey) -> Result<i16, Failure> {
    match conn.versions().await {
        Ok(t) => t.version(api).ok_or_else(|| {
            Failure::Unsupported(format!(
                "{} offers no usable {api:?} version",
                conn.address()
            ))
        }),
        Err(e) => Err(failure(e)),
    }
}
