//! `[canary]`: a live end-to-end check inside `run` (see the module above).

use std::time::Duration;

use serde::Deserialize;

/// `[canary]`: off when the section is absent.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CanaryConfig {
    /// One canary row every interval.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// The canary rows' `message_type`.
    pub message_type: String,
    /// Written into the row's topic column: the canary's own Kafka topic, or with the HTTP
    /// sink the endpoint's name. Required: no consumer should take a canary for a
    /// business event, so it never goes where the template sends the application's rows.
    pub topic: Option<String>,
    /// `/readyz` fails once no canary has been delivered for this many intervals.
    pub unready_after: u32,
}

impl Default for CanaryConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            message_type: "outboxd.canary".into(),
            topic: None,
            unready_after: 4,
        }
    }
}

impl CanaryConfig {
    /// How long without a delivered canary before `/readyz` fails.
    pub fn unready_after(&self) -> Duration {
        self.interval * self.unready_after
    }

    /// What makes no sense on its own; what needs the rest of the file is checked by
    /// `Config::validate`.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.interval < Duration::from_millis(100) || self.interval > Duration::from_secs(3600) {
            return Err("canary.interval must be between 100ms and 1h".into());
        }
        if self.unready_after < 2 {
            return Err(
                "canary.unready_after must be at least 2 (intervals without a delivered \
                 canary before /readyz fails; one late canary is not a wedge)"
                    .into(),
            );
        }
        if self.message_type.trim().is_empty() {
            return Err("canary.message_type is empty".into());
        }
        if self.topic.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(
                "canary.topic is empty: set a topic (or endpoint) or remove the key".into(),
            );
        }
        Ok(())
    }
}
