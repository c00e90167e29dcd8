//! Raw binlog events: reading one from the bytes the server sent (for tests and the fuzz
//! targets), the table id and CRC32 every decoded event is checked by, the column names
//! a table map logs, MariaDB's GTID and GTID list events, and the byte helpers the
//! query events are read with.

use mysql_async::binlog::events::{Event, OptionalMetadataField, TableMapEvent};
use mysql_async::binlog::BinlogChecksumAlg;
#[cfg(any(test, feature = "fuzzing"))]
use mysql_async::binlog::EventType;

use crate::log::gtid::{Gtid, MariaDbGtidPos};

/// Reads one event from the bytes the server sent for it, as the binlog stream does
/// (`mysql_common`'s `Event::read`), after checking the sizes `Event::read` trusts (both
/// found by the `binlog_decoder` fuzz target): it allocates the event size the header
/// declares (up to 4 GiB) and panics when fewer bytes follow; and it cuts the CRC32 (and
/// a format description's checksum algorithm) off the body without checking the body
/// holds them, which panics (subtract with overflow, or a slice out of range). The
/// stream itself gets its events from `mysql_async`, which calls `Event::read`
/// unguarded: there the panic is caught (`log::stream`'s `next_event`).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn read_event(
    fde: &mysql_async::binlog::events::FormatDescriptionEvent<'_>,
    bytes: &[u8],
) -> std::io::Result<Event> {
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let size = bytes
        .get(9..13)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let size = match size.and_then(|s| usize::try_from(s).ok()) {
        Some(size) if (EVENT_HEADER_LEN..=bytes.len()).contains(&size) => size,
        _ => {
            return Err(invalid(format!(
                "binlog event of {} bytes declares {size:?} in its header",
                bytes.len()
            )))
        }
    };
    let body = size - EVENT_HEADER_LEN;
    let footer = fde.footer();
    let is_fde = bytes.get(4) == Some(&(EventType::FORMAT_DESCRIPTION_EVENT as u8));
    let checksummed = footer.get_checksum_enabled()
        && !matches!(
            footer.get_checksum_alg(),
            Ok(None | Some(BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_OFF))
        );
    // A format description carries its own checksum algorithm byte and CRC32.
    let trailer = if is_fde {
        5
    } else {
        4 * usize::from(checksummed)
    };
    if body < trailer {
        return Err(invalid(format!(
            "binlog event body of {body} bytes cannot hold its {trailer}-byte checksum"
        )));
    }
    Event::read(fde, bytes)
}

/// The common header of every binlog event (v4): timestamp, type, server id, event size,
/// log position, flags.
#[cfg(any(test, feature = "fuzzing"))]
const EVENT_HEADER_LEN: usize = 19;

/// The 6-byte table id that starts table map and rows events (binlog v4).
pub(super) fn table_id(data: &[u8]) -> Option<u64> {
    let b = data.get(..6)?;
    Some(u64::from_le_bytes([
        b[0], b[1], b[2], b[3], b[4], b[5], 0, 0,
    ]))
}

/// CRC32 of the event as sent, when the stream carries checksums.
pub(super) fn checksum_ok(event: &Event) -> bool {
    let footer = event.footer();
    if !footer.get_checksum_enabled() {
        return true;
    }
    match (footer.get_checksum_alg(), event.checksum()) {
        (Ok(Some(alg @ BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_CRC32)), Some(sum)) => {
            u32::from_le_bytes(sum) == event.calc_checksum(alg)
        }
        _ => true,
    }
}

/// Column names the server wrote into the table map (`binlog_row_metadata = FULL`).
pub(super) fn logged_column_names(tme: &TableMapEvent<'_>) -> Option<Vec<String>> {
    for field in tme.iter_optional_meta() {
        if let Ok(OptionalMetadataField::ColumnName(names)) = field {
            let names: Result<Vec<String>, _> = names
                .iter_names()
                .map(|n| n.map(|n| n.name().into_owned()))
                .collect();
            return names.ok();
        }
    }
    None
}

/// MariaDB GTID event: seq_no u64, domain_id u32, flags u8, …
pub(crate) fn parse_mariadb_gtid(data: &[u8], server: u32) -> Option<(Gtid, u8)> {
    let seq = u64::from_le_bytes(data.get(0..8)?.try_into().ok()?);
    let domain = u32::from_le_bytes(data.get(8..12)?.try_into().ok()?);
    let flags = *data.get(12)?;
    Some((
        Gtid::MariaDb {
            domain,
            server,
            seq,
        },
        flags,
    ))
}

/// MariaDB GTID list event: count (low 28 bits) then (domain u32, server u32, seq u64)s.
pub(crate) fn parse_mariadb_gtid_list(data: &[u8]) -> Option<MariaDbGtidPos> {
    let count = u32::from_le_bytes(data.get(0..4)?.try_into().ok()?) & 0x0fff_ffff;
    let mut pos = MariaDbGtidPos::default();
    for i in 0..usize::try_from(count).ok()? {
        let at = 4 + i * 16;
        let entry = data.get(at..at + 16)?;
        let domain = u32::from_le_bytes(entry[0..4].try_into().ok()?);
        let server = u32::from_le_bytes(entry[4..8].try_into().ok()?);
        let seq = u64::from_le_bytes(entry[8..16].try_into().ok()?);
        pos.domains.insert(domain, (server, seq));
    }
    Some(pos)
}

pub(super) fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end.max(start)]
}

pub(super) fn starts_with_ci(text: &[u8], prefix: &[u8]) -> bool {
    text.get(..prefix.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
}

pub(super) fn contains_ci(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}
