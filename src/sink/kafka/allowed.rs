//! `kafka.allowed_topics`: which topics a row may name.
//!
//! Whoever may insert an outbox row chooses its topic (its `topic` column, or its
//! `message_type` through the template). Without a list that is any topic the producer's
//! credentials can write, and, with broker-side auto-creation, a new one. With a list, a
//! row routed elsewhere is never sent: it becomes MANUAL_REQUIRED with the reason.
//!
//! Some topics are never a row's, list or no list ([`ReservedTopics`]): the positions
//! topics of exactly-once delivery and Kafka's internal topics. The producer's credentials
//! can write the first (it commits positions there), and `*` allows everything.

use super::TopicTemplate;

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

/// The prefix of the positions topics: `kafka.positions_topic` defaults to
/// `outboxd-positions-<pipeline.name>` (see `KafkaConfig::positions_topic`).
const POSITIONS_PREFIX: &str = "outboxd-positions-";

/// The prefix of Kafka's internal topics (`__consumer_offsets`, `__transaction_state`).
const INTERNAL_PREFIX: &str = "__";

/// Topics no row may be sent to, whatever `kafka.allowed_topics` says.
///
/// - The positions topics: a session under exactly-once reads its pipeline's from the
///   start and takes the last record keyed by its `transactional.id` as the position to
///   resume from, so a row written there could move where delivery resumes (or make the
///   topic unreadable and keep exactly-once from starting). Every `outboxd-positions-*`
///   topic is refused (other pipelines' by default names), and this pipeline's
///   `kafka.positions_topic` whatever it is called.
/// - Kafka's internal topics (`__*`): the broker's own bookkeeping (group offsets,
///   transaction state). A broker refuses ordinary writes there; inside a Kafka
///   transaction such a refusal aborts the whole transaction, again and again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservedTopics {
    /// This pipeline's `kafka.positions_topic` (or its default).
    positions_topic: String,
}

impl ReservedTopics {
    /// The reserved topics of a pipeline whose positions topic is `positions_topic`.
    pub fn new(positions_topic: impl Into<String>) -> Self {
        Self {
            positions_topic: positions_topic.into(),
        }
    }

    /// What `topic` is reserved for, or `None` when a row may name it.
    fn reserved_for(&self, topic: &str) -> Option<&'static str> {
        if topic == self.positions_topic {
            Some("this pipeline's kafka.positions_topic, where exactly-once records its positions")
        } else if topic.starts_with(POSITIONS_PREFIX) {
            Some("a positions topic of exactly-once delivery, `outboxd-positions-*`")
        } else if topic.starts_with(INTERNAL_PREFIX) {
            Some("a Kafka internal topic, `__*`")
        } else {
            None
        }
    }

    /// What every topic starting with `prefix` is reserved for, or `None`.
    fn reserved_prefix(prefix: &str) -> Option<&'static str> {
        if prefix.starts_with(POSITIONS_PREFIX) {
            Some("positions topics of exactly-once delivery, `outboxd-positions-*`")
        } else if prefix.starts_with(INTERNAL_PREFIX) {
            Some("Kafka internal topics, `__*`")
        } else {
            None
        }
    }

    /// Why a row routed to `topic` is refused, or `None` when it may be sent.
    pub fn refusal(&self, topic: &str) -> Option<String> {
        let what = self.reserved_for(topic)?;
        Some(format!(
            "topic `{topic}` is reserved ({what}): rows are never sent there, whatever \
             kafka.allowed_topics says; not sent. Fix the row's topic or message_type, then \
             `outboxd retry --id`"
        ))
    }

    /// At load: an entry of `kafka.allowed_topics` that matches reserved topics only is an
    /// error (it would allow nothing, and says the operator expects such rows to go). An
    /// entry that matches others too (`*`, `outboxd-*`) stays; the sink refuses the
    /// reserved topics it matches row by row.
    pub fn check_allowed_topics(&self, entries: &[String]) -> Result<(), String> {
        for entry in entries {
            // The literal text before the first `*`: every match starts with it.
            let (fixed, exact) = match entry.split_once('*') {
                Some((fixed, _)) => (fixed, false),
                None => (entry.as_str(), true),
            };
            let what = match exact {
                true => self.reserved_for(fixed),
                false => Self::reserved_prefix(fixed),
            };
            if let Some(what) = what {
                return Err(format!(
                    "kafka.allowed_topics entry `{entry}` names reserved topics only ({what}): \
                     outboxd never sends a row there, whatever the list says. Remove the entry"
                ));
            }
        }
        Ok(())
    }

    /// At load: a `kafka.topic_template` that routes every row without a `topic` column
    /// to reserved topics (a fixed topic, or a fixed prefix such as `__`) is an error.
    pub fn check_template(&self, template: &TopicTemplate, pipeline: &str) -> Result<(), String> {
        let (fixed, whole) = template.fixed_prefix(pipeline);
        let what = match whole {
            true => self.reserved_for(&fixed),
            false => Self::reserved_prefix(&fixed),
        };
        match what {
            Some(what) => Err(format!(
                "kafka.topic_template `{}` routes rows to reserved topics ({what}): outboxd \
                 never sends a row there. Choose a template whose topics are the outbox's own",
                template.text()
            )),
            None => Ok(()),
        }
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
    fn reserved_topics_are_refused_and_others_are_not() {
        let reserved = ReservedTopics::new("it.positions");
        for topic in [
            "it.positions",
            "outboxd-positions-orders",
            "outboxd-positions-",
            "__consumer_offsets",
            "__transaction_state",
            "__anything",
        ] {
            let why = reserved.refusal(topic).expect(topic);
            assert!(
                why.contains(&format!("`{topic}`")) && why.contains("kafka.allowed_topics"),
                "{why}"
            );
        }
        for topic in [
            "orders",
            "it.positions.x",
            "outboxd-positions",
            "outboxd-orders",
            "_private",
            "a__b",
        ] {
            assert_eq!(reserved.refusal(topic), None, "{topic}");
        }
    }

    #[test]
    fn entries_and_templates_of_reserved_topics_only_are_errors() {
        let reserved = ReservedTopics::new("outboxd-positions-p");
        for entry in [
            "__consumer_offsets",
            "__*",
            "__a*b",
            "outboxd-positions-*",
            "outboxd-positions-p",
        ] {
            let err = reserved
                .check_allowed_topics(&["orders".into(), entry.into()])
                .expect_err(entry);
            assert!(
                err.contains(&format!("`{entry}`")) && err.contains("kafka.allowed_topics"),
                "{err}"
            );
        }
        let entries: Vec<String> = ["*", "_*", "outboxd-*", "*__consumer_offsets", "orders"]
            .iter()
            .map(|e| (*e).to_owned())
            .collect();
        assert_eq!(reserved.check_allowed_topics(&entries), Ok(()));

        for template in [
            "__consumer_offsets",
            "__{message_type}",
            "outboxd-positions-{routing}",
            "outboxd-positions-{pipeline}",
        ] {
            let parsed = TopicTemplate::parse(template).expect(template);
            let err = reserved.check_template(&parsed, "p").expect_err(template);
            assert!(
                err.contains(&format!("`{template}`")) && err.contains("kafka.topic_template"),
                "{err}"
            );
        }
        // `{pipeline}` is known at load: rendered into the fixed part.
        let parsed = TopicTemplate::parse("outboxd-{pipeline}-{message_type}").unwrap();
        assert!(reserved.check_template(&parsed, "positions").is_err());
        assert_eq!(reserved.check_template(&parsed, "orders"), Ok(()));
        for template in [
            "outbox.{message_type}",
            "_{message_type}",
            "{message_type}",
            "outboxd-{pipeline}",
        ] {
            let parsed = TopicTemplate::parse(template).expect(template);
            assert_eq!(reserved.check_template(&parsed, "p"), Ok(()), "{template}");
        }
    }

    #[test]
    fn an_empty_entry_is_an_error() {
        let err = AllowedTopics::parse(&["orders".into(), " ".into()]).unwrap_err();
        assert!(err.contains("empty entry"), "{err}");
    }
}
