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
pub(crate) use webhook::check_forwardable;
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

/// A handler and the sources it takes messages from (empty: any).
#[derive(Clone)]
struct Bound {
    handler: Arc<dyn Handler>,
    sources: Vec<String>,
}

impl Bound {
    fn takes(&self, source: &str) -> bool {
        self.sources.is_empty() || self.sources.iter().any(|s| s == source)
    }
}

/// Why a message has no handler (it becomes MANUAL_REQUIRED with this reason).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoHandler {
    /// Neither its type nor `default` has one.
    ForType,
    /// Its type's handler (or, for a type without one, the default) is bound to other
    /// sources. The message does not fall through to the default: a type that one
    /// source may send must not reach a handler by way of another source.
    ForSource {
        /// The sources the handler takes.
        bound_to: Vec<String>,
    },
}

/// The handler of each message type, and the default.
#[derive(Clone, Default)]
pub struct Handlers {
    by_type: BTreeMap<String, Bound>,
    default: Option<Bound>,
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
                    forward_headers,
                    ..
                } => Arc::new(
                    WebhookHandler::new(url, *timeout, retryable_statuses)?
                        .forwarding(forward_headers)?,
                ),
                HandlerConfig::Sql { statement, .. } => Arc::new(SqlHandler::new(statement)),
            };
            handlers = handlers.bound(message_type, built, handler.sources());
        }
        Ok(handlers)
    }

    /// Adds `handler` for `message_type` (`"default"`: every other type), from any source.
    pub fn with(self, message_type: &str, handler: Arc<dyn Handler>) -> Self {
        self.bound(message_type, handler, &[])
    }

    /// Adds `handler` for `message_type` (`"default"`: every other type) of messages from
    /// `sources` only (empty: any source).
    pub fn bound(
        mut self,
        message_type: &str,
        handler: Arc<dyn Handler>,
        sources: &[String],
    ) -> Self {
        let bound = Bound {
            handler,
            sources: sources.to_vec(),
        };
        if message_type == "default" {
            self.default = Some(bound);
        } else {
            self.by_type.insert(message_type.to_owned(), bound);
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

    /// The handler of `message_type`, whatever the source.
    pub fn for_type(&self, message_type: &str) -> Option<&Arc<dyn Handler>> {
        (self.by_type.get(message_type).or(self.default.as_ref())).map(|b| &b.handler)
    }

    /// The handler of a message of `message_type` from `source`: its type's, else the
    /// default; either only when bound to that source (or to none).
    pub fn for_message(
        &self,
        source: &str,
        message_type: &str,
    ) -> Result<&Arc<dyn Handler>, NoHandler> {
        let bound =
            (self.by_type.get(message_type).or(self.default.as_ref())).ok_or(NoHandler::ForType)?;
        if bound.takes(source) {
            Ok(&bound.handler)
        } else {
            Err(NoHandler::ForSource {
                bound_to: bound.sources.clone(),
            })
        }
    }

    /// The longest handler timeout (the claim must outlast it).
    pub fn longest_timeout(&self) -> Duration {
        (self.by_type.values().chain(self.default.iter()))
            .map(|b| b.handler.timeout())
            .max()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(&'static str);

    impl Handler for Named {
        fn handle<'a>(&'a self, _: &'a ClaimedMessage) -> BoxFuture<'a, Handled> {
            Box::pin(async { Handled::Done })
        }
        fn statement(&self) -> Option<&str> {
            Some(self.0)
        }
    }

    fn name(found: Result<&Arc<dyn Handler>, NoHandler>) -> Result<&str, NoHandler> {
        found.map(|h| h.statement().unwrap_or_default())
    }

    /// A type bound to one source never reaches its handler (nor the default) from
    /// another source; unbound handlers take every source.
    #[test]
    fn handlers_bound_to_sources_take_only_those() {
        let shop = vec!["shop".to_owned()];
        let handlers = Handlers::default()
            .bound("order.paid", Arc::new(Named("paid")), &shop)
            .with("audit", Arc::new(Named("audit")))
            .with("default", Arc::new(Named("default")));
        assert_eq!(name(handlers.for_message("shop", "order.paid")), Ok("paid"));
        assert_eq!(
            name(handlers.for_message("evil", "order.paid")),
            Err(NoHandler::ForSource {
                bound_to: shop.clone()
            })
        );
        assert_eq!(name(handlers.for_message("evil", "audit")), Ok("audit"));
        assert_eq!(name(handlers.for_message("evil", "other")), Ok("default"));

        let only_shop = Handlers::default().bound("default", Arc::new(Named("d")), &shop);
        assert_eq!(name(only_shop.for_message("shop", "x")), Ok("d"));
        assert!(matches!(
            only_shop.for_message("web", "x"),
            Err(NoHandler::ForSource { .. })
        ));
        assert_eq!(
            name(Handlers::default().for_message("shop", "x")),
            Err(NoHandler::ForType)
        );
    }
}
