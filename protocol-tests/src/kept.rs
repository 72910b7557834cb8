//! A `metrics` recorder that keeps every value until it is read, as an exporter's
//! scrape sees them (metrics-util's `DebuggingRecorder` resets each value it reports,
//! so a gauge read twice reads 0 the second time). The metrics suite and the demo's
//! summary read ottla's named metrics through it.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};

/// Every value: (name, labels sorted) -> a counter's or gauge's value, or the number of
/// a histogram's samples.
pub type Values = BTreeMap<(String, Vec<(String, String)>), f64>;

/// The recorder.
#[derive(Debug)]
pub struct Kept(Registry<Key, AtomicStorage>);

impl Recorder for Kept {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

impl Kept {
    /// The process's recorder, installed by the first caller; `None` if a recorder of
    /// another kind was installed first.
    pub fn install() -> Option<&'static Kept> {
        static KEPT: OnceLock<Option<&'static Kept>> = OnceLock::new();
        *KEPT.get_or_init(|| {
            let kept: &'static Kept = Box::leak(Box::new(Kept(Registry::atomic())));
            metrics::set_global_recorder(kept).ok().map(|()| kept)
        })
    }

    /// Every value kept so far.
    pub fn values(&self) -> Values {
        let id = |key: &Key| {
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            (key.name().to_string(), labels)
        };
        let mut out = Values::new();
        for (key, c) in self.0.get_counter_handles() {
            out.insert(id(&key), c.load(Ordering::SeqCst) as f64);
        }
        for (key, g) in self.0.get_gauge_handles() {
            out.insert(id(&key), f64::from_bits(g.load(Ordering::SeqCst)));
        }
        for (key, h) in self.0.get_histogram_handles() {
            out.insert(id(&key), h.data().len() as f64);
        }
        out
    }
}
