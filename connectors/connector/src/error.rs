use std::error::Error as StdError;
use std::fmt;

/// What a caller can do about a [`ConnectorError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The operation may succeed if retried later: connection refused or reset, server
    /// shutting down, serialization failure, a replication slot in use by another reader.
    /// The core retries with backoff and stays up.
    Transient,
    /// Retrying will not help: bad credentials, a missing table or publication, a
    /// replication slot that was dropped or invalidated, data that cannot be decoded.
    /// The core stops and prints the message, which says what to do.
    Definite,
}

/// Why a [`ConnectorError`] happened, when the connector knows more than its
/// [`ErrorKind`]: classified where the error arises (an SQLSTATE, a driver error variant),
/// so a caller acts on it without reading the message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorReason {
    /// Nothing more specific than the kind.
    #[default]
    Unspecified,
    /// The log position to resume from is gone: the replication slot was invalidated
    /// or dropped, the binlog was purged, or the checkpoint row was written on another
    /// server (a dump/restore, a migration). `outboxd recover` rescans the outbox.
    PositionLost,
    /// Another reader holds the replication slot or the pipeline's lock.
    SlotInUse,
    /// A database object outboxd needs (table, publication, slot) does not exist:
    /// `outboxd init` creates it.
    MissingObject,
    /// The outbox's shape does not fit (a column missing or of another type).
    SchemaMismatch,
    /// TLS was asked for and the server does not offer it (or the handshake failed).
    TlsUnavailable,
}

/// An error from a connector, classified so the core knows whether to retry.
///
/// The message is written for the operator: it names the object involved and, for
/// definite errors, the fix.
#[derive(Debug)]
pub struct ConnectorError {
    kind: ErrorKind,
    reason: ErrorReason,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl ConnectorError {
    /// A transient error: retry with backoff.
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Transient,
            reason: ErrorReason::Unspecified,
            message: message.into(),
            source: None,
        }
    }

    /// A definite error: stop and tell the operator.
    pub fn definite(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Definite,
            reason: ErrorReason::Unspecified,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying cause (shown after the message).
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// Records why the error happened (see [`ErrorReason`]).
    pub fn with_reason(mut self, reason: ErrorReason) -> Self {
        self.reason = reason;
        self
    }

    /// Why the error happened, when the connector knows.
    pub fn reason(&self) -> ErrorReason {
        self.reason
    }

    /// The same error with another message (the reason, kind and cause stay): for adding
    /// the operator's fix to an error classified further down.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    /// The classification of this error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// True when retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Transient
    }

    /// The operator-facing message, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConnectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for ConnectorError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_travel_with_the_error() {
        let plain = ConnectorError::transient("x");
        assert_eq!(plain.reason(), ErrorReason::Unspecified);
        let lost = ConnectorError::definite("slot gone").with_reason(ErrorReason::PositionLost);
        let fixed = lost.with_message("slot gone: run `outboxd recover`");
        assert_eq!(fixed.reason(), ErrorReason::PositionLost);
        assert_eq!(fixed.kind(), ErrorKind::Definite);
        assert_eq!(fixed.message(), "slot gone: run `outboxd recover`");
    }
}
