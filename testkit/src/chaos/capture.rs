//! Counts ottla's own tracing events per member incarnation for the report.
//!
//! Every member runs on its own thread (a current-thread runtime), so the thread tells
//! which member logged an event: the member thread sets a thread-local naming its
//! incarnation, and this layer reports warnings, errors and a few debug messages
//! (joins, coordinator changes) to the journal. Generations come from the Processor's
//! metrics hook (`Metric::Joined`), not from here.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use super::journal::Journal;

/// Debug and info messages of member threads counted in the report; every warning and
/// error is counted too.
const COUNTED: &[&str] = &[
    "synced",
    "joining",
    "coordinator found",
    "coordinator unknown; rediscovering",
    "rebalance request failed",
    // The consumer protocol (KIP-848): fenced, or a revocation timed out.
    "rejoining with epoch 0",
];

thread_local! {
    static MEMBER: RefCell<Option<(Arc<Journal>, usize)>> = const { RefCell::new(None) };
}

/// Marks this thread as member incarnation `inc` of `journal`.
pub fn enter_member(journal: Arc<Journal>, inc: usize) {
    MEMBER.with(|m| *m.borrow_mut() = Some((journal, inc)));
}

/// Installs the process-wide subscriber once: the capture layer (ottla's debug events,
/// for member threads only) and a formatter for `RUST_LOG` (default: nothing) on
/// stderr, with thread names (`chaos-m<slot>.<incarnation>`) and time since start.
/// Returns whether the capture is active; it is not when another subscriber was
/// installed first.
pub fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("off"));
        let fmt = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_thread_names(true)
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .with_filter(env);
        let capture = Capture.with_filter(Targets::new().with_target("ottla", Level::DEBUG));
        tracing_subscriber::registry()
            .with(fmt)
            .with(capture)
            .try_init()
            .is_ok()
    })
}

struct Capture;

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        MEMBER.with(|m| {
            let member = m.borrow();
            let Some((journal, inc)) = member.as_ref() else {
                return;
            };
            let mut fields = Fields::default();
            event.record(&mut fields);
            let level = *event.metadata().level();
            if level > Level::WARN && !COUNTED.contains(&fields.message.as_str()) {
                return;
            }
            journal.member_log(*inc, fields.message, None);
        });
    }
}

#[derive(Default)]
struct Fields {
    message: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}
