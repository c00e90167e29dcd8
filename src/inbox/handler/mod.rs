//! Handlers: what happens to a claimed inbox message. One per `message_type`, with a
//! default (`[inbox.handlers.default]`):
//!
//! - `webhook.rs`: POST to the user's service; the answer decides DONE, FAILED or
//!   MANUAL_REQUIRED;
//! - `sql.rs`: a statement of the user's, run in the transaction that marks the row DONE,
//!   so its effect in that database happens exactly once;
//! - [`Handler`]: the trait both implement, for services that embed outboxd as a library
//!   (see `examples/inbox_handler.rs`).

mod sql;
mod webhook;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use outboxd_connector::ClaimedMessage;

pub use sql::SqlHandler;
pub use webhook::WebhookHandler;

use super::config::HandlerConfig;

/// What a handler made of one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handled {
    /// Processed: the row becomes DONE (with [`Handler::statement`] in the same
    /// transaction).
    Done,
    /// Failed, may succeed later: FAILED with backoff, no earlier than `after` when the
    /// handler knows (`Retry-After`); MANUAL_REQUIRED once out of attempts.
    Retry {
        /// Stored in `last_error`.
        error: String,
        /// A lower bound on the delay.
        after: Option<Duration>,
    },
    /// Cannot succeed by retrying: MANUAL_REQUIRED with the reason.
    Manual {
        /// Stored in `last_error`.
        reason: String,
    },
}

/// Processes inbox messages. Called outside any database transaction, at most once at a
/// time per `biz_key`; a message may be handled again after a crash (at-least-once), so
/// handlers with effects outside the inbox's database should be idempotent on
/// `message_id` (the webhook sends it as `Idempotency-Key`).
pub trait Handler: Send + Sync + 'static {
    /// Handles `message`.
    fn handle<'a>(&'a self, message: &'a ClaimedMessage) -> BoxFuture<'a, Handled>;

    /// A statement run in the transaction that marks the message DONE (see
    /// [`outboxd_connector::InboxOutcome::Done`]); `None` for handlers whose effects live
    /// elsewhere.
    fn statement(&self) -> Option<&str> {
        None
    }

    /// The longest a call may take; past it the attempt counts as failed.
    fn timeout(&self) -> Duration {
        Duration::from_secs(30)
    }
}

/// The handler of each message type, and the default.
#[derive(Clone, Default)]
pub struct Handlers {
    by_type: BTreeMap<String, Arc<dyn Handler>>,
    default: Option<Arc<dyn Handler>>,
}

impl Handlers {
    /// Builds the configured handlers (`default` is the fallback's name).
    pub fn from_config(config: &BTreeMap<String, HandlerConfig>) -> Result<Self, String> {
        let mut handlers = Self::default();
        for (message_type, handler) in config {
            let built: Arc<dyn Handler> = match handler {
                HandlerConfig::Webhook {
                    url,
                    timeout,
                    retryable_statuses,
                } => Arc::new(WebhookHandler::new(url, *timeout, retryable_statuses)?),
                HandlerConfig::Sql { statement } => Arc::new(SqlHandler::new(statement)),
            };
            handlers = handlers.with(message_type, built);
        }
        Ok(handlers)
    }

    /// Adds `handler` for `message_type` (`"default"`: every other type).
    pub fn with(mut self, message_type: &str, handler: Arc<dyn Handler>) -> Self {
        if message_type == "default" {
            self.default = Some(handler);
        } else {
            self.by_type.insert(message_type.to_owned(), handler);
        }
        self
    }

    /// These handlers, with `other`'s replacing those of the same message type.
    pub fn merged(mut self, other: Handlers) -> Self {
        self.by_type.extend(other.by_type);
        if other.default.is_some() {
            self.default = other.default;
        }
        self
    }

    /// True when no message type has a handler.
    pub fn is_empty(&self) -> bool {
        self.by_type.is_empty() && self.default.is_none()
    }

    /// The handler of `message_type`.
    pub fn for_type(&self, message_type: &str) -> Option<&Arc<dyn Handler>> {
        self.by_type.get(message_type).or(self.default.as_ref())
    }

    /// The longest handler timeout (the claim must outlast it).
    pub fn longest_timeout(&self) -> Duration {
        (self.by_type.values().chain(self.default.iter()))
            .map(|h| h.timeout())
            .max()
            .unwrap_or_default()
    }
}
