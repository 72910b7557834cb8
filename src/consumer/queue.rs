//! The `Consumer`'s event stream: bounded, and loss-free for the events that change
//! what the application owns.
//!
//! An application that only calls `recv()` never reads events, and a consumer that
//! commits every few milliseconds makes a `CommitCompleted` each time: an unbounded
//! channel grew for as long as the service ran (7.7 MB to 50.5 MB RSS in 60 s on tansu).
//! This queue holds at most [`CAPACITY`] events. When it is full, the oldest event that
//! only informs (a commit result, offsets read, a coordinator found, a fetcher notice)
//! makes room; an event that changes what the application owns (joined, assigned,
//! revoke requested, lost, left, fatal) is dropped only when the queue holds nothing
//! else, which takes [`CAPACITY`] unread rebalances. Every drop is counted
//! ([`Events::dropped`]) and the first is logged.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::sync::mpsc::error::TryRecvError;
use tracing::warn;

use super::ConsumerEvent;

/// How many events the stream holds unread.
pub const CAPACITY: usize = 1024;

#[derive(Debug, Default)]
struct State {
    events: VecDeque<ConsumerEvent>,
    dropped: u64,
    closed: bool,
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    notify: Notify,
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The driver's end; dropping it ends the stream once it is drained.
#[derive(Debug)]
pub(crate) struct EventSender {
    inner: Arc<Inner>,
}

/// A connected pair.
pub(crate) fn channel() -> (EventSender, Events) {
    let inner = Arc::new(Inner::default());
    (
        EventSender {
            inner: inner.clone(),
        },
        Events { inner },
    )
}

impl EventSender {
    /// Queues `event`, making room first if the queue is full (see the module docs).
    pub(crate) fn send(&self, event: ConsumerEvent) {
        let mut state = self.inner.lock();
        if state.events.len() >= CAPACITY {
            let at = state
                .events
                .iter()
                .position(|e| !e.changes_ownership())
                .unwrap_or(0);
            state.events.remove(at);
            state.dropped += 1;
            if state.dropped == 1 {
                warn!(
                    capacity = CAPACITY,
                    "the consumer's event stream is full (nobody reads it); dropping its oldest informational events"
                );
            }
        }
        state.events.push_back(event);
        drop(state);
        self.inner.notify.notify_one();
    }
}

impl Drop for EventSender {
    fn drop(&mut self) {
        self.inner.lock().closed = true;
        self.inner.notify.notify_one();
    }
}

/// The consumer's events ([`Consumer::take_events`](crate::Consumer::take_events)):
/// at most [`CAPACITY`] unread, the ones that change ownership kept longest.
#[derive(Debug)]
pub struct Events {
    inner: Arc<Inner>,
}

impl Events {
    /// A stream that has ended.
    pub(crate) fn ended() -> Self {
        let inner = Arc::new(Inner::default());
        inner.lock().closed = true;
        Self { inner }
    }

    /// The next event, waiting for one; `None` once the consumer has stopped and every
    /// event was read.
    pub async fn recv(&mut self) -> Option<ConsumerEvent> {
        loop {
            {
                let mut state = self.inner.lock();
                if let Some(event) = state.events.pop_front() {
                    return Some(event);
                }
                if state.closed {
                    return None;
                }
            }
            // `notify_one` leaves a permit when nobody waits, so an event queued
            // between the check above and this wait is not missed.
            self.inner.notify.notified().await;
        }
    }

    /// An event if one is ready: `Empty` if none is, `Disconnected` once the consumer
    /// has stopped and every event was read.
    pub fn try_recv(&mut self) -> Result<ConsumerEvent, TryRecvError> {
        let mut state = self.inner.lock();
        match state.events.pop_front() {
            Some(event) => Ok(event),
            None if state.closed => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// How many events were dropped because the stream was full.
    pub fn dropped(&self) -> u64 {
        self.inner.lock().dropped
    }

    /// How many events wait unread.
    pub fn len(&self) -> usize {
        self.inner.lock().events.len()
    }

    /// Whether no event waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::group::member::CommitError;

    fn commit_done(i: u64) -> ConsumerEvent {
        ConsumerEvent::CommitCompleted {
            result: Err(CommitError::Request(
                crate::proto::group::member::Failure::Protocol(i.to_string()),
            )),
        }
    }

    fn lost(generation: i32) -> ConsumerEvent {
        ConsumerEvent::Lost {
            partitions: vec![crate::proto::group::consumer_protocol::TopicPartition::new(
                "t", generation,
            )],
            reason: crate::proto::group::member::LostReason::UnknownMember,
        }
    }

    #[test]
    fn a_full_stream_drops_informational_events_first_and_keeps_ownership_changes() {
        let (tx, mut rx) = channel();
        let commits = CAPACITY as u64 * 10;
        tx.send(lost(1));
        for i in 0..commits {
            tx.send(commit_done(i));
        }
        tx.send(lost(2));
        assert_eq!(rx.len(), CAPACITY);
        assert_eq!(rx.dropped(), commits + 2 - CAPACITY as u64);
        assert_eq!(rx.try_recv(), Ok(lost(1)));
        let rest: Vec<ConsumerEvent> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(rest.last(), Some(&lost(2)));
        // The newest commit results are the ones kept, beside the two losses.
        let kept = CAPACITY as u64 - 2;
        assert_eq!(rest.first(), Some(&commit_done(commits - kept)));
        drop(tx);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }

    #[test]
    fn ownership_changes_are_dropped_only_when_nothing_else_is_left() {
        let (tx, mut rx) = channel();
        for g in 0..(CAPACITY as i32 + 5) {
            tx.send(lost(g));
        }
        assert_eq!(rx.len(), CAPACITY);
        assert_eq!(rx.dropped(), 5);
        assert_eq!(rx.try_recv(), Ok(lost(5)));
    }

    #[tokio::test]
    async fn recv_waits_for_an_event_and_ends_after_the_sender() {
        let (tx, mut rx) = channel();
        let reader = tokio::spawn(async move {
            let first = rx.recv().await;
            let end = rx.recv().await;
            (first, end)
        });
        tokio::task::yield_now().await;
        tx.send(lost(7));
        drop(tx);
        let (first, end) = reader.await.expect("reader");
        assert_eq!(first, Some(lost(7)));
        assert_eq!(end, None);
    }
}
