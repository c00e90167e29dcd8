//! A binlog coordinate, and its form as the core's opaque [`Position`]:
//! ordinal = the file's sequence number in the high 64 bits and the offset in the low
//! ones; text = `binlog:mysql-bin.000042:1234`, with `:<gtid set>` appended when known.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use outboxd_connector::{ConnectorError, ParsePositionError, Position};

/// A MySQL/MariaDB binlog coordinate, with the GTID set executed up to it when GTIDs
/// are on. Ordered by file then offset; the GTID set rides along.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BinlogPosition {
    /// Binlog file name, e.g. `mysql-bin.000042` (fixed-width suffix, so it sorts).
    pub file: String,
    /// Byte offset in the file of the next event to read.
    pub offset: u64,
    /// GTID set executed up to here (MySQL `uuid:1-5` or MariaDB `0-1-42`), if on.
    pub gtid_set: Option<String>,
}

/// The scheme of binlog positions in the checkpoint table.
const SCHEME: &str = "binlog:";

impl BinlogPosition {
    /// This coordinate as the core's position.
    pub fn position(&self) -> Position {
        let ordinal = (u128::from(self.file_sequence()) << 64) | u128::from(self.offset);
        Position::new(ordinal, self.to_string())
    }

    /// The coordinate of a position this connector made (or read from the checkpoint).
    pub fn from_position(position: &Position) -> Result<Self, ConnectorError> {
        position.decode()
    }

    /// The number after the last `.` of the file name (`mysql-bin.000042` → 42).
    fn file_sequence(&self) -> u64 {
        self.file
            .rsplit('.')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

impl Ord for BinlogPosition {
    fn cmp(&self, other: &Self) -> Ordering {
        (&self.file, self.offset).cmp(&(&other.file, other.offset))
    }
}

impl PartialOrd for BinlogPosition {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for BinlogPosition {
    /// The stored form: `binlog:mysql-bin.000042:1234[:<gtid set>]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}:{}", self.file, self.offset)?;
        if let Some(gtid) = &self.gtid_set {
            write!(f, ":{gtid}")?;
        }
        Ok(())
    }
}

impl FromStr for BinlogPosition {
    type Err = ParsePositionError;

    /// Parses the stored form; what a checkpoint row carries after a `;` (the server it
    /// was read from, see `log::identity`) is left to `StoredCheckpoint`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let position = s.split_once(';').map_or(s, |(position, _)| position);
        if let Some(rest) = position.strip_prefix(SCHEME) {
            let mut parts = rest.splitn(3, ':');
            let file = parts.next().unwrap_or_default();
            let offset = parts.next().and_then(|o| o.parse().ok());
            if let (false, Some(offset)) = (file.is_empty(), offset) {
                let gtid_set = parts.next().filter(|g| !g.is_empty()).map(str::to_owned);
                return Ok(BinlogPosition {
                    file: file.into(),
                    offset,
                    gtid_set,
                });
            }
        }
        Err(ParsePositionError(format!(
            "`{s}` is not a position like `binlog:mysql-bin.000042:1234`"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_and_order() {
        for text in ["binlog:mysql-bin.000042:1234", "binlog:b.000001:4:0-1-42"] {
            let pos: BinlogPosition = text.parse().unwrap();
            assert_eq!(pos.to_string(), text);
            assert_eq!(pos.position().as_str(), text);
            assert_eq!(BinlogPosition::from_position(&pos.position()).unwrap(), pos);
        }
        let at = |s: &str| s.parse::<BinlogPosition>().unwrap();
        let (a, b) = (
            at("binlog:mysql-bin.000002:9000"),
            at("binlog:mysql-bin.000003:4"),
        );
        assert!(a < b);
        assert!(a.position() < b.position());
        assert!("binlog:f".parse::<BinlogPosition>().is_err());
        assert!("lsn:0/1".parse::<BinlogPosition>().is_err());
        let stored = "binlog:b.000001:4:0-1-42;server_id=1;domain=0";
        assert_eq!(at(stored), at("binlog:b.000001:4:0-1-42"));
    }

    #[test]
    fn the_gauge_is_file_then_offset() {
        let gauge = |s: &str| s.parse::<BinlogPosition>().unwrap().position().gauge();
        assert_eq!(gauge("binlog:mysql-bin.000001:4"), (1 << 32) | 4);
        assert!(gauge("binlog:mysql-bin.000002:4") > gauge("binlog:mysql-bin.000001:9000000"));
    }
}
