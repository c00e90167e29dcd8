//! PostgreSQL's write-ahead-log location, and its form as the core's opaque
//! [`Position`]: ordinal = the LSN, text = `lsn:16/B374D848`.

use std::fmt;
use std::str::FromStr;

use outboxd_connector::{ConnectorError, ParsePositionError, Position};

/// A PostgreSQL write-ahead-log location.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

/// The scheme of PostgreSQL positions in the checkpoint table.
const SCHEME: &str = "lsn:";

impl Lsn {
    /// This LSN as the core's position.
    pub fn position(self) -> Position {
        Position::new(u128::from(self.0), format!("{SCHEME}{self}"))
    }

    /// The LSN of `lsn:16/B374D848`.
    pub(crate) fn from_text(text: &str) -> Result<Self, ParsePositionError> {
        Ok(text.parse::<PositionText>()?.0)
    }

    /// The LSN of a position this connector made (or read from the checkpoint table).
    pub fn from_position(position: &Position) -> Result<Self, ConnectorError> {
        position.decode::<PositionText>().map(|p| p.0)
    }
}

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

/// `lsn:16/B374D848`, the stored form.
struct PositionText(Lsn);

impl FromStr for PositionText {
    type Err = ParsePositionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lsn = s.strip_prefix(SCHEME).ok_or_else(|| {
            ParsePositionError(format!("`{s}` is not a position like `lsn:16/B374D848`"))
        })?;
        Ok(PositionText(lsn.parse()?))
    }
}

/// Parses a checkpoint text (`lsn:16/B374D848`, with or without the cluster it was
/// written on: `;system=…;timeline=…`) into a position.
pub fn parse_position(text: &str) -> Result<Position, ParsePositionError> {
    Ok(crate::log::identity::StoredCheckpoint::parse(text)?.position())
}

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
        let pos = parse_position("lsn:0/16B3748").unwrap();
        assert_eq!(pos.to_string(), "lsn:0/16B3748");
        assert_eq!(Lsn::from_position(&pos).unwrap(), Lsn(0x16B_3748));
        assert_eq!(pos.gauge(), 0x16B_3748);
        assert!(Lsn(1).position() < Lsn(2).position());
        assert!(parse_position("binlog:f:4").is_err());
        let stored = parse_position("lsn:0/16B3748;system=7;timeline=1").unwrap();
        assert_eq!(stored, pos);
        assert!(Lsn::from_position(&Position::new(4, "binlog:f:4")).is_err());
    }
}
