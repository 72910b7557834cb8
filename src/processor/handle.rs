//! [`ProcessorHandle`]: what another task may do to a running Processor (pause,
//! resume, read its lag and stats).

use super::*;

/// Controls a [`Processor`] from another task, or from inside a handler (clone it into
/// the closure): pause and resume partitions, for a circuit breaker in front of a
/// downstream that is failing, and read the lag.
///
/// ```no_run
/// # async fn demo() -> ottla::Result<()> {
/// use ottla::processor::{ProcessError, Processor};
///
/// let processor = Processor::builder("127.0.0.1:9092", "billing", ["orders"]).build().await?;
/// let breaker = processor.handle();
/// let watch = processor.handle();
/// tokio::spawn(async move {
///     loop {
///         tokio::time::sleep(std::time::Duration::from_secs(10)).await;
///         println!("lag: {:?}", watch.lag());
///     }
/// });
/// processor
///     .run(
///         move |_record, _cancel| {
///             let breaker = breaker.clone();
///             async move {
///                 let downstream_is_down = false; // ... your call here ...
///                 if downstream_is_down {
///                     // Stop calling it; something else resumes later.
///                     breaker.pause_all();
///                     return Err(ProcessError::transient("Unavailable", "downstream is down"));
///                 }
///                 Ok(())
///             }
///         },
///         tokio::time::sleep(std::time::Duration::from_secs(3600)),
///     )
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ProcessorHandle {
    pub(super) control: mpsc::UnboundedSender<Control>,
    pub(super) holds: Arc<Holds>,
    pub(super) live: Arc<Mutex<ProcessorStats>>,
    pub(super) view: ConsumerView,
}

/// The pauses asked through handles, read by [`Processor::run`]'s tasks between
/// records, so a handler that trips a breaker is the last call of its task: the
/// lanes learn of the pause through the control channel, a moment later.
#[derive(Debug, Default)]
pub(super) struct Holds {
    pub(super) all: AtomicBool,
    /// How many partitions are in `partitions`: the tasks' check costs one load while
    /// nothing is paused.
    pub(super) some: AtomicUsize,
    pub(super) partitions: Mutex<std::collections::BTreeSet<TopicPartition>>,
}

impl Holds {
    #[inline]
    pub(super) fn holds(&self, topic: &str, partition: i32) -> bool {
        if self.all.load(Ordering::Acquire) {
            return true;
        }
        self.some.load(Ordering::Acquire) > 0 && self.holds_one(topic, partition)
    }

    fn holds_one(&self, topic: &str, partition: i32) -> bool {
        self.partitions.lock().is_ok_and(|p| {
            p.iter()
                .any(|tp| tp.partition == partition && tp.topic == topic)
        })
    }

    fn set(&self, partitions: Option<&[TopicPartition]>, on: bool) {
        match partitions {
            None if on => self.all.store(true, Ordering::Release),
            None => {
                self.all.store(false, Ordering::Release);
                if let Ok(mut p) = self.partitions.lock() {
                    p.clear();
                    self.some.store(0, Ordering::Release);
                }
            }
            Some(ps) => {
                if let Ok(mut p) = self.partitions.lock() {
                    for tp in ps {
                        if on {
                            p.insert(tp.clone());
                        } else {
                            p.remove(tp);
                        }
                    }
                    self.some.store(p.len(), Ordering::Release);
                }
            }
        }
    }
}

#[derive(Debug)]
pub(super) enum Control {
    Pause(Option<Vec<TopicPartition>>),
    Resume(Option<Vec<TopicPartition>>),
}

impl ProcessorHandle {
    /// Pauses `partitions`: no handler call starts on them (a retry whose time comes
    /// waits too) and they are not fetched, until [`ProcessorHandle::resume`]. Calls
    /// running finish; the group membership and the commits of finished records go
    /// on. Does nothing once the processor has stopped.
    pub fn pause(&self, partitions: &[TopicPartition]) {
        self.holds.set(Some(partitions), true);
        let _ = self.control.send(Control::Pause(Some(partitions.to_vec())));
    }

    /// Pauses every partition, those assigned later included.
    pub fn pause_all(&self) {
        self.holds.set(None, true);
        let _ = self.control.send(Control::Pause(None));
    }

    /// Resumes `partitions`.
    pub fn resume(&self, partitions: &[TopicPartition]) {
        self.holds.set(Some(partitions), false);
        let _ = self
            .control
            .send(Control::Resume(Some(partitions.to_vec())));
    }

    /// Lifts every pause: [`ProcessorHandle::pause_all`]'s and each partition's.
    pub fn resume_all(&self) {
        self.holds.set(None, false);
        let _ = self.control.send(Control::Resume(None));
    }

    /// Per assigned partition, the records not yet committed: the log end (the last
    /// stable offset under `read_committed`) minus the committed offset, as
    /// `kafka-consumer-groups` reports it; before the first commit is known, the end
    /// minus the fetch position. A partition whose end is not known yet is left out.
    pub fn lag(&self) -> BTreeMap<TopicPartition, i64> {
        self.view.lag()
    }

    /// The running processor's counters (records succeeded, retried, dead-lettered,
    /// commits, ...), as of its last turn: what [`Processor::run`] returns at the end,
    /// readable while it runs, without a metrics backend. All zero before `run`
    /// starts. The `metrics` feature reports the same figures
    /// (docs/observability.md).
    pub fn stats(&self) -> ProcessorStats {
        lock(&self.live).clone()
    }
}
