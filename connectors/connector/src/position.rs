use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::ConnectorError;

/// A position in a database log, opaque to the core.
///
/// Each connector makes positions from its own coordinate (PostgreSQL's LSN, a binlog
/// file and offset, …) and reads them back; the core only orders them (the ack frontier,
/// a checkpoint that never moves backward), stores and shows their text, and exports
/// them as a number. It never looks inside, so a new engine needs no change here.
///
/// - `ordinal` grows with the log: a later position of the same source has a larger
///   one. Positions are ordered by it.
/// - `text` is what the checkpoint table stores and logs show, prefixed by the engine's
///   scheme (`lsn:16/B374D848`, `binlog:mysql-bin.000042:1234`); the connector parses
///   it back. It may carry more than the ordinal (a GTID set rides along).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Position {
    ordinal: u128,
    text: Arc<str>,
}

impl Position {
    /// A position at `ordinal` in the log, stored and shown as `text`.
    pub fn new(ordinal: u128, text: impl Into<Arc<str>>) -> Self {
        Self {
            ordinal,
            text: text.into(),
        }
    }

    /// The number that orders positions of one source.
    pub fn ordinal(&self) -> u128 {
        self.ordinal
    }

    /// The text stored in the checkpoint table.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The engine's own coordinate, parsed back from the text; a text of another
    /// engine's form is a definite error.
    pub fn decode<T: FromStr<Err = ParsePositionError>>(&self) -> Result<T, ConnectorError> {
        self.text.parse().map_err(|e: ParsePositionError| {
            ConnectorError::definite(format!(
                "{e}: the checkpoint holds a position of another engine"
            ))
        })
    }

    /// The ordinal in 64 bits, for gauges: as it is when it fits; otherwise the high
    /// half in the upper 32 bits and the low 32 bits of the low half (a binlog file's
    /// sequence number and its offset), so the number still grows with the position.
    pub fn gauge(&self) -> u64 {
        match u64::try_from(self.ordinal) {
            Ok(n) => n,
            Err(_) => {
                let high = u64::try_from(self.ordinal >> 64).unwrap_or(u64::MAX);
                (high << 32) | (self.ordinal as u64 & 0xFFFF_FFFF)
            }
        }
    }
}

impl Ord for Position {
    fn cmp(&self, other: &Self) -> Ordering {
        self.ordinal
            .cmp(&other.ordinal)
            .then_with(|| self.text.cmp(&other.text))
    }
}

impl PartialOrd for Position {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A position text that a connector could not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParsePositionError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_order_by_ordinal_and_show_their_text() {
        let a = Position::new(5, "x:5");
        let b = Position::new(7, "x:7");
        assert!(a < b);
        assert_eq!(b.to_string(), "x:7");
        assert_eq!(b.as_str(), "x:7");
        assert_eq!(a.clone().max(b.clone()), b);
    }

    #[test]
    fn the_gauge_keeps_growing_past_64_bits() {
        assert_eq!(Position::new(42, "").gauge(), 42);
        let file = |n: u128, offset: u128| Position::new((n << 64) | offset, "").gauge();
        assert_eq!(file(1, 4), (1 << 32) | 4);
        assert!(file(2, 4) > file(1, 9_000_000));
    }
}
