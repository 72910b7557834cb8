//! `RetryPolicy`: how long to wait before the next attempt, as a pure function of the
//! retry count and a jitter sample. The defaults and names are those of the seed
//! practice (`max_retries` 3, `initial_retry_delay_ms` 1000, `max_retry_delay_ms`
//! 30000, `retry_backoff_multiplier` 2.0, `retry_jitter` true).

use std::time::Duration;

use super::classify::{ErrorClass, ProcessError};

/// Retry settings for one class of errors.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryBackoff {
    /// `max_retries`: attempts after the first.
    pub max_retries: u32,
    /// `initial_retry_delay_ms`.
    pub initial: Duration,
    /// `max_retry_delay_ms`.
    pub max: Duration,
    /// `retry_backoff_multiplier`.
    pub multiplier: f64,
    /// `retry_jitter`: add a random 0-10% of the delay.
    pub jitter: bool,
    /// `retry_min_delay_ms`: a floor for rate-limited downstreams.
    pub min_delay: Duration,
}

impl Default for RetryBackoff {
    fn default() -> Self {
        Self {
            max_retries: 3,
            initial: Duration::from_millis(1000),
            max: Duration::from_millis(30_000),
            multiplier: 2.0,
            jitter: true,
            min_delay: Duration::ZERO,
        }
    }
}

impl RetryBackoff {
    /// The delay before retry number `retry` (0 for the first retry), given a jitter
    /// sample in `[0, 1)`: `max(min(initial x multiplier^retry, max) + jitter, floor)`.
    pub fn delay(&self, retry: u32, jitter_sample: f64) -> Duration {
        let exp = self
            .multiplier
            .powi(i32::try_from(retry).unwrap_or(i32::MAX));
        let base_ms =
            (self.initial.as_secs_f64() * 1000.0 * exp).min(self.max.as_secs_f64() * 1000.0);
        let base_ms = if base_ms.is_finite() {
            base_ms.max(0.0)
        } else {
            self.max.as_secs_f64() * 1000.0
        };
        let jitter_ms = if self.jitter {
            base_ms * 0.1 * jitter_sample.clamp(0.0, 1.0)
        } else {
            0.0
        };
        Duration::from_secs_f64((base_ms + jitter_ms) / 1000.0).max(self.min_delay)
    }

    /// The longest the retries of one record can wait in all.
    pub fn worst_case_total(&self) -> Duration {
        (0..self.max_retries).map(|r| self.delay(r, 1.0)).sum()
    }
}

/// The retry policy: a default and optional overrides per error class and per error
/// type.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RetryPolicy {
    /// Used for transient and unclassified errors.
    pub default: RetryBackoff,
    /// Overrides for a class (permanent errors are never retried whatever this says).
    pub transient: Option<RetryBackoff>,
    /// Overrides for retryable errors of one type ([`ProcessError::kind`], for example
    /// `Http429` with a long rate floor, or `Timeout` with more retries). They win over
    /// the class overrides; permanent errors are still never retried.
    pub by_type: Vec<(String, RetryBackoff)>,
}

/// A setting that failed validation; the message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {setting}: {message}")]
pub struct ConfigError {
    /// The setting (its environment-variable name).
    pub setting: &'static str,
    /// What is wrong and what to change.
    pub message: String,
}

impl RetryPolicy {
    /// The backoff for an error of `class`; `None` when it must not be retried.
    pub fn backoff_for(&self, class: Option<ErrorClass>) -> Option<&RetryBackoff> {
        match class {
            Some(ErrorClass::Permanent) => None,
            Some(ErrorClass::Transient) => Some(self.transient.as_ref().unwrap_or(&self.default)),
            None => Some(&self.default),
        }
    }

    /// The backoff for `error` once classified as `class`: its type's override if
    /// there is one, else its class's; `None` when it must not be retried.
    pub fn backoff_for_error(
        &self,
        error: &ProcessError,
        class: Option<ErrorClass>,
    ) -> Option<&RetryBackoff> {
        if class == Some(ErrorClass::Permanent) {
            return None;
        }
        self.by_type
            .iter()
            .find(|(kind, _)| *kind == error.kind)
            .map(|(_, b)| b)
            .or_else(|| self.backoff_for(class))
    }

    /// Adds an override for errors of type `kind`.
    pub fn with_type_override(mut self, kind: impl Into<String>, backoff: RetryBackoff) -> Self {
        self.by_type.push((kind.into(), backoff));
        self
    }

    fn all(&self) -> impl Iterator<Item = &RetryBackoff> {
        std::iter::once(&self.default)
            .chain(self.transient.as_ref())
            .chain(self.by_type.iter().map(|(_, b)| b))
    }

    /// Reads `max_retries`, `initial_retry_delay_ms`, `max_retry_delay_ms`,
    /// `retry_backoff_multiplier`, `retry_jitter` and `retry_min_delay_ms` through
    /// `get` (for example `std::env::var`), over the defaults.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut b = RetryBackoff::default();
        let bad = |setting: &'static str, value: &str, want: &str| ConfigError {
            setting,
            message: format!("{value:?} is not {want}"),
        };
        if let Some(v) = get("max_retries") {
            b.max_retries = v
                .trim()
                .parse()
                .map_err(|_| bad("max_retries", &v, "a whole number"))?;
        }
        for (name, slot) in [
            ("initial_retry_delay_ms", &mut b.initial),
            ("max_retry_delay_ms", &mut b.max),
            ("retry_min_delay_ms", &mut b.min_delay),
        ] {
            if let Some(v) = get(name) {
                let ms: u64 = v
                    .trim()
                    .parse()
                    .map_err(|_| bad(name, &v, "milliseconds"))?;
                *slot = Duration::from_millis(ms);
            }
        }
        if let Some(v) = get("retry_backoff_multiplier") {
            b.multiplier = v
                .trim()
                .parse()
                .map_err(|_| bad("retry_backoff_multiplier", &v, "a number"))?;
        }
        if let Some(v) = get("retry_jitter") {
            b.jitter = match v.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => true,
                "false" | "0" | "no" => false,
                _ => return Err(bad("retry_jitter", &v, "true or false")),
            };
        }
        let policy = RetryPolicy {
            default: b,
            ..RetryPolicy::default()
        };
        policy.validate()?;
        Ok(policy)
    }

    /// Checks the settings themselves.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for b in self.all() {
            if !(b.multiplier.is_finite() && b.multiplier >= 1.0) {
                return Err(ConfigError {
                    setting: "retry_backoff_multiplier",
                    message: format!("{} must be a finite number of at least 1.0", b.multiplier),
                });
            }
            if b.max < b.initial {
                return Err(ConfigError {
                    setting: "max_retry_delay_ms",
                    message: format!(
                        "{} ms is below initial_retry_delay_ms ({} ms); raise it",
                        b.max.as_millis(),
                        b.initial.as_millis()
                    ),
                });
            }
        }
        Ok(())
    }

    /// The longest any record's retries can wait in all.
    pub fn worst_case_total(&self) -> Duration {
        self.all()
            .map(RetryBackoff::worst_case_total)
            .max()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_follow_the_seed_formula() {
        let b = RetryBackoff {
            jitter: false,
            ..RetryBackoff::default()
        };
        let ms: Vec<u128> = (0..7).map(|r| b.delay(r, 0.0).as_millis()).collect();
        assert_eq!(ms, [1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        let j = RetryBackoff::default();
        assert_eq!(j.delay(0, 0.0), Duration::from_millis(1000));
        assert_eq!(
            j.delay(0, 0.999_999).as_millis(),
            1099,
            "jitter adds up to 10%"
        );
        assert_eq!(
            j.delay(10, 1.0),
            Duration::from_millis(33_000),
            "cap, then jitter"
        );
        let floor = RetryBackoff {
            min_delay: Duration::from_secs(12),
            jitter: false,
            ..RetryBackoff::default()
        };
        assert_eq!(floor.delay(0, 0.0), Duration::from_secs(12), "rate floor");
        assert_eq!(floor.delay(4, 0.0), Duration::from_secs(16));
        assert_eq!(b.worst_case_total(), Duration::from_millis(7000));
    }

    #[test]
    fn permanent_errors_are_never_retried() {
        let p = RetryPolicy::default();
        assert!(p.backoff_for(Some(ErrorClass::Permanent)).is_none());
        assert_eq!(p.backoff_for(None), Some(&p.default));
    }

    #[test]
    fn type_overrides_win_over_class_overrides_but_never_retry_permanent_errors() {
        let slow = RetryBackoff {
            min_delay: Duration::from_secs(60),
            max: Duration::from_secs(120),
            ..RetryBackoff::default()
        };
        let transient = RetryBackoff {
            max_retries: 9,
            ..RetryBackoff::default()
        };
        let p = RetryPolicy {
            transient: Some(transient.clone()),
            ..RetryPolicy::default()
        }
        .with_type_override("Http429", slow.clone());
        let limited = ProcessError::from_http_status(429, "slow down");
        assert_eq!(p.backoff_for_error(&limited, limited.class), Some(&slow));
        let timeout = ProcessError::transient("Timeout", "");
        assert_eq!(
            p.backoff_for_error(&timeout, timeout.class),
            Some(&transient)
        );
        let other = ProcessError::unclassified("Weird", "");
        assert_eq!(p.backoff_for_error(&other, None), Some(&p.default));
        // A classifier that calls a 429 permanent wins over its type's override.
        assert_eq!(
            p.backoff_for_error(&limited, Some(ErrorClass::Permanent)),
            None
        );
        // The override takes part in validation and in the worst case.
        assert!(p.worst_case_total() >= slow.worst_case_total());
        let bad = RetryPolicy::default().with_type_override(
            "X",
            RetryBackoff {
                multiplier: 0.1,
                ..RetryBackoff::default()
            },
        );
        assert_eq!(
            bad.validate().map_err(|e| e.setting),
            Err("retry_backoff_multiplier")
        );
    }

    #[test]
    fn settings_come_from_variables_and_bad_ones_are_named() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let p = RetryPolicy::from_vars(vars(&[
            ("max_retries", "5"),
            ("initial_retry_delay_ms", "200"),
            ("retry_jitter", "false"),
        ]))
        .unwrap();
        assert_eq!(p.default.max_retries, 5);
        assert_eq!(p.default.initial, Duration::from_millis(200));
        assert!(!p.default.jitter);
        let e = RetryPolicy::from_vars(vars(&[("retry_backoff_multiplier", "0.5")])).unwrap_err();
        assert_eq!(e.setting, "retry_backoff_multiplier");
        let e = RetryPolicy::from_vars(vars(&[("max_retry_delay_ms", "10")])).unwrap_err();
        assert!(e.to_string().contains("max_retry_delay_ms"), "{e}");
        let e = RetryPolicy::from_vars(vars(&[("max_retries", "three")])).unwrap_err();
        assert_eq!(e.setting, "max_retries");
    }
}
