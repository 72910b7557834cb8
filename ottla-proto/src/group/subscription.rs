//! A subscription by pattern under the classic protocol: the client matches topic
//! names itself, as the Java client's `subscribe(Pattern)` and librdkafka's `^`-topics
//! do, on every metadata refresh; the member rejoins when the matches change
//! ([`GroupMember::set_subscription`](super::GroupMember::set_subscription)). Under
//! the consumer protocol (KIP-848) the broker matches instead
//! ([`GroupConfig::topic_regex`](super::GroupConfig::topic_regex)).

use std::collections::BTreeSet;

/// A compiled topic pattern, matched against whole topic names (Java's
/// `Pattern.matcher(topic).matches()`; librdkafka anchors its `^` patterns at the start
/// only, which a pattern ending in `.*` makes the same).
#[derive(Debug, Clone)]
pub struct TopicPattern {
    source: String,
    regex: regex::Regex,
}

impl TopicPattern {
    /// Compiles `pattern`; the error says what is wrong with it.
    pub fn new(pattern: &str) -> Result<Self, String> {
        let regex = regex::Regex::new(&format!("^(?:{pattern})$"))
            .map_err(|e| format!("not a valid topic pattern {pattern:?}: {e}"))?;
        Ok(Self {
            source: pattern.to_string(),
            regex,
        })
    }

    /// The pattern as given.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether `topic` is matched. Internal topics (`__consumer_offsets`,
    /// `__transaction_state`, any name starting with `__`) never are, as with the Java
    /// client's default `exclude.internal.topics=true`.
    pub fn matches(&self, topic: &str) -> bool {
        !topic.starts_with("__") && self.regex.is_match(topic)
    }

    /// The topics to subscribe to: `explicit`, and every name in `known` the pattern
    /// matches; sorted, each once.
    pub fn subscription<'a>(
        &self,
        explicit: &[String],
        known: impl IntoIterator<Item = &'a str>,
    ) -> Vec<String> {
        let mut out: BTreeSet<String> = explicit.iter().cloned().collect();
        out.extend(
            known
                .into_iter()
                .filter(|t| self.matches(t))
                .map(str::to_string),
        );
        out.into_iter().collect()
    }
}

/// Splits a librdkafka-style topic list into names and one pattern: each entry
/// starting with `^` is a regex (librdkafka's rule), and several are joined as
/// alternatives.
pub fn split_patterns<S: AsRef<str>>(topics: &[S]) -> (Vec<String>, Option<String>) {
    let mut names = Vec::new();
    let mut patterns = Vec::new();
    for t in topics {
        let t = t.as_ref();
        if t.starts_with('^') {
            patterns.push(format!("(?:{t})"));
        } else {
            names.push(t.to_string());
        }
    }
    let pattern = (!patterns.is_empty()).then(|| patterns.join("|"));
    (names, pattern)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_names_match_and_internal_topics_never_do() {
        let p = TopicPattern::new("orders\\..*").unwrap();
        assert!(p.matches("orders.eu"));
        assert!(!p.matches("old.orders.eu"), "the whole name, not a part");
        assert!(!p.matches("ordersXeu"));
        let all = TopicPattern::new(".*").unwrap();
        assert!(all.matches("t"));
        assert!(!all.matches("__consumer_offsets"));
        assert_eq!(
            p.subscription(
                &["fixed".to_string()],
                ["orders.us", "orders.eu", "payments", "fixed"]
            ),
            ["fixed", "orders.eu", "orders.us"]
        );
    }

    #[test]
    fn a_bad_pattern_is_an_error_that_names_it() {
        let e = TopicPattern::new("orders[").unwrap_err();
        assert!(e.contains("orders["), "{e}");
    }

    #[test]
    fn librdkafka_caret_entries_are_patterns() {
        assert_eq!(
            split_patterns(&["a", "^orders\\..*", "b", "^x.*"]),
            (
                vec!["a".to_string(), "b".to_string()],
                Some("(?:^orders\\..*)|(?:^x.*)".to_string())
            )
        );
        assert_eq!(split_patterns(&["a"]), (vec!["a".to_string()], None));
        let (_, p) = split_patterns(&["^orders\\..*"]);
        let p = TopicPattern::new(&p.unwrap()).unwrap();
        assert!(p.matches("orders.eu"));
    }
}
