//! `kafka.allowed_topics`: which topics a row may name.
//!
//! Whoever may insert an outbox row chooses its topic (its `topic` column, or its
//! `message_type` through the template). Without a list that is any topic the producer's
//! credentials can write, and, with broker-side auto-creation, a new one. With a list, a
//! row routed elsewhere is never sent: it becomes MANUAL_REQUIRED with the reason.

/// Exact names and `*` patterns (`*` matches any run of characters, `.` included).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedTopics {
    /// Empty: every topic is allowed (no list configured).
    patterns: Vec<Pattern>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Pattern {
    /// The pattern as configured, for messages.
    text: String,
    /// The literal pieces between `*`s.
    pieces: Vec<String>,
}

impl AllowedTopics {
    /// Parses the configured list; an empty entry is an error (it would allow nothing and
    /// is most likely a mistake).
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut patterns = Vec::with_capacity(entries.len());
        for entry in entries {
            if entry.trim().is_empty() {
                return Err(
                    "kafka.allowed_topics has an empty entry; list topic names or patterns \
                     such as \"orders.*\""
                        .to_owned(),
                );
            }
            patterns.push(Pattern {
                text: entry.clone(),
                pieces: entry.split('*').map(str::to_owned).collect(),
            });
        }
        Ok(Self { patterns })
    }

    /// Why `topic` may not be written, or `None` when it may.
    pub fn refusal(&self, topic: &str) -> Option<String> {
        if self.patterns.is_empty() || self.patterns.iter().any(|p| p.matches(topic)) {
            return None;
        }
        let listed: Vec<&str> = self.patterns.iter().map(|p| p.text.as_str()).collect();
        Some(format!(
            "topic `{topic}` is not in kafka.allowed_topics ({}); not sent. Fix the row's \
             topic or message_type, or add the topic to the list, then `outboxd retry --id`",
            listed.join(", ")
        ))
    }
}

impl Pattern {
    fn matches(&self, topic: &str) -> bool {
        let (first, rest) = match self.pieces.split_first() {
            Some(split) => split,
            None => return topic.is_empty(),
        };
        if rest.is_empty() {
            return topic == first;
        }
        let Some(mut remaining) = topic.strip_prefix(first.as_str()) else {
            return false;
        };
        let (last, middle) = match rest.split_last() {
            Some(split) => split,
            None => return true,
        };
        for piece in middle {
            match remaining.find(piece.as_str()) {
                Some(at) => remaining = &remaining[at + piece.len()..],
                None => return false,
            }
        }
        remaining.len() >= last.len() && remaining.ends_with(last.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowedTopics {
        let entries: Vec<String> = entries.iter().map(|e| (*e).to_owned()).collect();
        AllowedTopics::parse(&entries).expect("valid list")
    }

    #[test]
    fn no_list_allows_every_topic() {
        assert_eq!(list(&[]).refusal("anything"), None);
    }

    #[test]
    fn exact_names_and_patterns() {
        let allowed = list(&["payments", "orders.*", "*.audit", "a*b*c"]);
        for topic in [
            "payments",
            "orders.created",
            "orders.",
            "billing.audit",
            "abc",
            "a-b-c",
            "aXbYbZc",
        ] {
            assert_eq!(allowed.refusal(topic), None, "{topic}");
        }
        for topic in [
            "payment",
            "payments.x",
            "order.created",
            "audit",
            "ab",
            "acb",
            "a-b-cd",
        ] {
            let why = allowed.refusal(topic).expect(topic);
            assert!(
                why.contains(topic) && why.contains("kafka.allowed_topics"),
                "{why}"
            );
        }
    }

    #[test]
    fn an_empty_entry_is_an_error() {
        let err = AllowedTopics::parse(&["orders".into(), " ".into()]).unwrap_err();
        assert!(err.contains("empty entry"), "{err}");
    }
}
