//! Error classes: a handler's error says whether retrying can help. Helpers cover the
//! common cases; anything unclassified counts as transient until retries run out.

use std::fmt;

/// Whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// Retrying may succeed (timeouts, I/O, 429/5xx, transient broker or database errors).
    Transient,
    /// Retrying cannot succeed (bad payload, schema, validation, 4xx, business rule).
    Permanent,
}

impl ErrorClass {
    /// `retryable` / `non-retryable`, the seed's `error_classification` values.
    pub fn label(self) -> &'static str {
        match self {
            ErrorClass::Transient => "retryable",
            ErrorClass::Permanent => "non-retryable",
        }
    }
}

/// A handler's error: its class (if known), a type name and a message, and what
/// caused it ([`ProcessError::caused_by`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessError {
    /// The class; `None`: unclassified (retried like a transient error).
    pub class: Option<ErrorClass>,
    /// A type name (`error_type` in logs, metrics and DLQ headers).
    pub kind: String,
    /// What went wrong.
    pub message: String,
    /// The error underneath, if one was given.
    pub cause: Option<ErrorCause>,
    /// What the processor does with the record: retry and dead-letter it by its
    /// class (the default), skip it, or leave it to the next owner.
    pub disposition: Disposition,
}

/// What the processor does with a record whose handler returned a [`ProcessError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Disposition {
    /// Retried by its class, then dead-lettered (or sent to a retry topic).
    #[default]
    Failed,
    /// Skipped: committed without being processed, neither retried nor dead-lettered,
    /// and counted (`Metric::Skipped`). Seed 003's first strategy, for records whose
    /// loss the business accepts ([`ProcessError::skip`]).
    Skipped,
    /// The handler stopped on cancellation: neither committed nor retried nor
    /// dead-lettered ([`ProcessError::cancelled`]).
    Cancelled,
}

/// The error underneath a [`ProcessError`]: its type name and the messages of its
/// `source()` chain, outermost first. Spring's dead-letter headers carry them
/// (`kafka_dlt-exception-cause-fqcn`, `kafka_dlt-exception-stacktrace`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorCause {
    /// The cause's Rust type name.
    pub kind: String,
    /// The cause's message, then each `source()`'s.
    pub chain: Vec<String>,
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for ProcessError {}

impl ProcessError {
    /// The handler stopped because its `Cancel` said so (the partition is being
    /// revoked, or the processor shuts down), without finishing the record: it is
    /// neither committed nor retried nor dead-lettered, and the partition's next owner
    /// handles it. Returning `Ok(())` instead says the record is done, and commits it.
    /// Returned when no cancellation was asked for, it counts as a transient error.
    pub fn cancelled() -> Self {
        Self {
            class: None,
            kind: "Cancelled".into(),
            message: "the handler stopped when cancelled".into(),
            cause: None,
            disposition: Disposition::Cancelled,
        }
    }

    /// Skip the record, of error type `kind`, because `message`: it is committed
    /// without being processed, neither retried nor dead-lettered, and counted by type
    /// (`Metric::Skipped`, `Stats::skipped`). For records whose loss is acceptable
    /// (seed 003's "skip": click tracking, low-priority analytics).
    pub fn skip(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            class: Some(ErrorClass::Permanent),
            kind: kind.into(),
            message: message.into(),
            cause: None,
            disposition: Disposition::Skipped,
        }
    }

    /// This error, caused by `cause`: its type name and `source()` chain are kept for
    /// the dead-letter headers.
    pub fn caused_by<E: std::error::Error + 'static>(mut self, cause: &E) -> Self {
        let mut chain = vec![cause.to_string()];
        let mut next = cause.source();
        // Bounded: a cyclic or absurdly deep chain must not stall the handler.
        while let Some(e) = next.filter(|_| chain.len() < 32) {
            chain.push(e.to_string());
            next = e.source();
        }
        self.cause = Some(ErrorCause {
            kind: std::any::type_name::<E>().to_string(),
            chain,
        });
        self
    }

    /// A transient error.
    pub fn transient(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            class: Some(ErrorClass::Transient),
            kind: kind.into(),
            message: message.into(),
            cause: None,
            disposition: Disposition::Failed,
        }
    }

    /// A permanent error.
    pub fn permanent(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            class: Some(ErrorClass::Permanent),
            kind: kind.into(),
            message: message.into(),
            cause: None,
            disposition: Disposition::Failed,
        }
    }

    /// An error of unknown class.
    pub fn unclassified(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            class: None,
            kind: kind.into(),
            message: message.into(),
            cause: None,
            disposition: Disposition::Failed,
        }
    }

    /// A payload that could not be parsed (a poison pill): permanent.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::permanent("DeserializationError", message)
    }

    /// An I/O error: transient, except for kinds that describe the input itself.
    pub fn from_io(e: &std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        let class = match e.kind() {
            InvalidData | InvalidInput | Unsupported | PermissionDenied => ErrorClass::Permanent,
            _ => ErrorClass::Transient,
        };
        Self {
            class: Some(class),
            kind: format!("io::{:?}", e.kind()),
            message: e.to_string(),
            cause: None,
            disposition: Disposition::Failed,
        }
        .caused_by(e)
    }

    /// An HTTP status from a downstream call, classified by [`HttpClassifier`]'s
    /// defaults.
    pub fn from_http_status(status: u16, message: impl Into<String>) -> Self {
        let class = HttpClassifier::default().classify(status);
        Self {
            class,
            kind: format!("Http{status}"),
            message: message.into(),
            cause: None,
            disposition: Disposition::Failed,
        }
    }
}

/// A batch handler's error: which record failed (`index` into the batch) and why.
///
/// With an index, the records before it count as handled, the failing record goes
/// through the retry policy and the dead-letter topic on its own, and the records
/// after it are handed over again. Without one (or with an index outside the batch),
/// the batch is replayed one record at a time, so each record gets its own outcome;
/// records the handler already applied are applied again (at-least-once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchError {
    /// The failing record's index in the batch, if the handler knows it.
    pub index: Option<usize>,
    /// What went wrong.
    pub error: ProcessError,
}

impl BatchError {
    /// Record `index` of the batch failed with `error`.
    pub fn at(index: usize, error: ProcessError) -> Self {
        Self {
            index: Some(index),
            error,
        }
    }

    /// The batch failed, and the handler cannot say because of which record.
    pub fn whole(error: ProcessError) -> Self {
        Self { index: None, error }
    }
}

impl From<ProcessError> for BatchError {
    fn from(error: ProcessError) -> Self {
        Self::whole(error)
    }
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "record {i} of the batch: {}", self.error),
            None => write!(f, "the batch: {}", self.error),
        }
    }
}

impl std::error::Error for BatchError {}

/// Which HTTP statuses are transient and which permanent (configurable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpClassifier {
    /// Transient statuses (default 408, 425, 429, 500, 502, 503, 504).
    pub transient: Vec<u16>,
    /// Permanent statuses (default 400, 401, 403, 404, 405, 409, 410, 413, 415, 422).
    pub permanent: Vec<u16>,
}

impl Default for HttpClassifier {
    fn default() -> Self {
        Self {
            transient: vec![408, 425, 429, 500, 502, 503, 504],
            permanent: vec![400, 401, 403, 404, 405, 409, 410, 413, 415, 422],
        }
    }
}

impl HttpClassifier {
    /// The class of `status`; `None` for statuses in neither list.
    pub fn classify(&self, status: u16) -> Option<ErrorClass> {
        if self.transient.contains(&status) {
            Some(ErrorClass::Transient)
        } else if self.permanent.contains(&status) {
            Some(ErrorClass::Permanent)
        } else {
            None
        }
    }
}

/// A user's classifier: may refine the class of any error before the policy applies.
pub trait Classifier: Send + Sync {
    /// The class to use for `error`.
    fn classify(&self, error: &ProcessError) -> Option<ErrorClass>;
}

/// Keeps the class the handler gave.
#[derive(Debug, Clone, Copy, Default)]
pub struct AsGiven;

impl Classifier for AsGiven {
    fn classify(&self, error: &ProcessError) -> Option<ErrorClass> {
        error.class
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_cases_are_classified() {
        let t = Some(ErrorClass::Transient);
        let p = Some(ErrorClass::Permanent);
        for s in [429, 502, 503, 504] {
            assert_eq!(ProcessError::from_http_status(s, "").class, t, "{s}");
        }
        for s in [400, 401, 403, 404] {
            assert_eq!(ProcessError::from_http_status(s, "").class, p, "{s}");
        }
        assert_eq!(ProcessError::from_http_status(302, "").class, None);
        let timeout = std::io::Error::new(std::io::ErrorKind::TimedOut, "slow");
        assert_eq!(ProcessError::from_io(&timeout).class, t);
        let bad = std::io::Error::new(std::io::ErrorKind::InvalidData, "garbage");
        assert_eq!(ProcessError::from_io(&bad).class, p);
        assert_eq!(ProcessError::malformed("not json").class, p);
        // 404 made transient by configuration (an eventually consistent store).
        let mut c = HttpClassifier::default();
        c.permanent.retain(|s| *s != 404);
        c.transient.push(404);
        assert_eq!(c.classify(404), t);
    }
}
