use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// A PostgreSQL write-ahead-log location.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl FromStr for Lsn {
    type Err = ParsePositionError;

    /// Parses PostgreSQL's text form, `16/B374D848`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParsePositionError(format!("`{s}` is not an LSN like 16/B374D848"));
        let (hi, lo) = s.split_once('/').ok_or_else(bad)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| bad())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| bad())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

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

/// A position in a database log. Positions of one source have a total order; the
/// checkpoint never moves backward.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Position {
    /// PostgreSQL: the end LSN of a commit, or a keepalive's WAL end.
    Lsn(Lsn),
    /// MySQL/MariaDB: the binlog coordinate after a commit.
    Binlog(BinlogPosition),
}

impl fmt::Display for Position {
    /// The form stored in the checkpoint table: `lsn:16/B374D848` or
    /// `binlog:mysql-bin.000042:1234` with `:<gtid set>` appended when known.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Lsn(lsn) => write!(f, "lsn:{lsn}"),
            Position::Binlog(b) => {
                write!(f, "binlog:{}:{}", b.file, b.offset)?;
                if let Some(gtid) = &b.gtid_set {
                    write!(f, ":{gtid}")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for Position {
    type Err = ParsePositionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(lsn) = s.strip_prefix("lsn:") {
            return Ok(Position::Lsn(lsn.parse()?));
        }
        if let Some(rest) = s.strip_prefix("binlog:") {
            let mut parts = rest.splitn(3, ':');
            let file = parts.next().unwrap_or_default();
            let offset = parts.next().and_then(|o| o.parse().ok());
            if let (false, Some(offset)) = (file.is_empty(), offset) {
                let gtid_set = parts.next().filter(|g| !g.is_empty()).map(str::to_owned);
                return Ok(Position::Binlog(BinlogPosition {
                    file: file.into(),
                    offset,
                    gtid_set,
                }));
            }
        }
        Err(ParsePositionError(format!(
            "`{s}` is not a position like `lsn:16/B374D848` or `binlog:mysql-bin.000042:1234`"
        )))
    }
}

/// A position string that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParsePositionError(String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_round_trips_through_text() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn.0, 0x16_B374_D848);
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert!("16B374D848".parse::<Lsn>().is_err());
        assert!("x/1".parse::<Lsn>().is_err());
    }

    #[test]
    fn positions_round_trip_and_order() {
        for text in [
            "lsn:0/16B3748",
            "binlog:mysql-bin.000042:1234",
            "binlog:b.000001:4:0-1-42",
        ] {
            let pos: Position = text.parse().unwrap();
            assert_eq!(pos.to_string(), text);
        }
        let a: Position = "binlog:mysql-bin.000002:9000".parse().unwrap();
        let b: Position = "binlog:mysql-bin.000003:4".parse().unwrap();
        assert!(a < b);
        assert!("lsn:0/1".parse::<Position>().unwrap() < "lsn:0/2".parse().unwrap());
        assert!("binlog:f".parse::<Position>().is_err());
        assert!("nonsense".parse::<Position>().is_err());
    }
}
