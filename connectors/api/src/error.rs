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

/// An error from a connector, classified so the core knows whether to retry.
///
/// The message is written for the operator: it names the object involved and, for
/// definite errors, the fix.
#[derive(Debug)]
pub struct ConnectorError {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl ConnectorError {
    /// A transient error: retry with backoff.
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Transient,
            message: message.into(),
            source: None,
        }
    }

    /// A definite error: stop and tell the operator.
    pub fn definite(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Definite,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying cause (shown after the message).
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
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
