//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not an API). Each
//! feeds arbitrary bytes to the real decoders, ignores their errors and panics only
//! where a decoder broke its contract (it must never panic).

use mysql_async::binlog::events::FormatDescriptionEvent;
use mysql_async::binlog::{BinlogVersion, EventType};
use outboxd_connector_kit::fuzz_input::split_messages;

use crate::log::decode::{
    parse_mariadb_gtid, parse_mariadb_gtid_list, read_event, Decoded, Decoder,
};
use crate::log::gtid::{GtidState, MariaDbGtidPos, MysqlGtidSet};
use crate::log::identity::StoredCheckpoint;
use crate::log::position::BinlogPosition;

/// Columns of `schemas/mysql/outbox.sql` and their MariaDB `DATA_TYPE`s, as
/// `information_schema` answers the decoder's look-up (the captured seeds' table).
const COLUMNS: &[(&str, &str)] = &[
    ("id", "bigint"),
    ("message_id", "varchar"),
    ("message_type", "varchar"),
    ("biz_key", "varchar"),
    ("topic", "varchar"),
    ("payload", "longtext"),
    ("headers", "longtext"),
    ("status", "varchar"),
    ("retry_count", "int"),
    ("max_retry_count", "int"),
    ("next_retry_time", "timestamp"),
    ("claimed_at", "timestamp"),
    ("claim_token", "char"),
    ("last_error", "text"),
    ("created_at", "timestamp"),
    ("updated_at", "timestamp"),
    ("sent_at", "timestamp"),
    ("kafka_partition", "int"),
    ("kafka_offset", "bigint"),
];

/// `binlog_decoder`: a flags byte, then binlog events as the server sends them (header,
/// body, CRC32; see [`split_messages`]), each read by `mysql_common`
/// (`log::decode::read_event`, with the format description of the stream so far, as the
/// stream reads them) and handed to the outbox decoder (`log::decode::Decoder::handle`), column names answered as
/// `information_schema` would. Flags: bit 0 re-serialises each event first, so it
/// carries a valid CRC32 and mutations reach the row decoding; bit 1 starts from a
/// MariaDB GTID position (else MySQL's, with bit 2 none at all).
pub fn binlog_decoder(data: &[u8]) {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    let gtid = match (flags & 2 != 0, flags & 4 != 0) {
        (true, _) => GtidState::parse("0-1-100", true),
        (false, false) => GtidState::parse("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5", false),
        (false, true) => None,
    };
    let start = BinlogPosition {
        file: "mariadb-bin.000002".into(),
        offset: 32215,
        gtid_set: gtid.as_ref().map(ToString::to_string),
    };
    let mut decoder = Decoder::new(
        "outboxd",
        "fixture_outbox",
        &outboxd_connector::OutboxLayout::default(),
        &start,
        gtid,
    )
    .with_checkpoint_table("outboxd", "outboxd_checkpoint");
    let mut fde = FormatDescriptionEvent::new(BinlogVersion::Version4);
    let mut lookups = 0;
    for bytes in split_messages(data) {
        let Ok(mut event) = read_event(&fde, bytes) else {
            continue;
        };
        if flags & 1 != 0 {
            let mut fixed = Vec::new();
            if event.write(BinlogVersion::Version4, &mut fixed).is_err() {
                continue;
            }
            let Ok(again) = read_event(&fde, &fixed) else {
                continue;
            };
            event = again;
        }
        if event.header().event_type_raw() == EventType::FORMAT_DESCRIPTION_EVENT as u8 {
            if let Ok(f) = event.read_event::<FormatDescriptionEvent>() {
                fde = f.into_owned().with_footer(event.footer());
            }
        }
        // As the stream does: look the names up when asked, then hand the event again
        // (a few times at most: names that do not fit are asked for again).
        for _ in 0..3 {
            match decoder.handle(&event) {
                Ok(Decoded::NeedColumns) => {
                    let mut names: Vec<(String, String)> = COLUMNS
                        .iter()
                        .map(|(c, t)| ((*c).to_owned(), (*t).to_owned()))
                        .collect();
                    if lookups > 0 {
                        // The seeds add a column after the first rows.
                        names.insert(1, ("tenant".to_owned(), "varchar".to_owned()));
                    }
                    lookups += 1;
                    decoder.provide_columns(names);
                }
                _ => break,
            }
        }
        let _ = (decoder.position(), decoder.in_transaction());
    }
}

/// `gtid_sets`: the text forms of GTID state (MySQL sets, MariaDB positions), checkpoint
/// rows and the binary MariaDB GTID and GTID list event bodies. A parsed state printed
/// must parse again to the same text.
pub fn gtid_sets(data: &[u8]) {
    let _ = parse_mariadb_gtid(data, 1);
    if let Some(pos) = parse_mariadb_gtid_list(data) {
        roundtrip(&pos, MariaDbGtidPos::parse);
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(set) = MysqlGtidSet::parse(text) {
        roundtrip(&set, MysqlGtidSet::parse);
        let mut state = GtidState::MySql(set);
        if let Some((gtid, _)) = parse_mariadb_gtid(data, 2) {
            state.add(&gtid); // the other flavor's GTID: ignored
        }
        let _ = state.to_string();
    }
    if let Some(pos) = MariaDbGtidPos::parse(text) {
        roundtrip(&pos, MariaDbGtidPos::parse);
        let mut state = GtidState::MariaDb(pos);
        if let Some((gtid, _)) = parse_mariadb_gtid(data, 2) {
            state.add(&gtid);
            roundtrip(&state, |t| GtidState::parse(t, true));
        }
    }
    if let Ok(checkpoint) = StoredCheckpoint::parse(text) {
        let _ = checkpoint.position.to_string();
    }
    let _ = text.parse::<BinlogPosition>();
}

fn roundtrip<T: std::fmt::Display>(value: &T, parse: impl Fn(&str) -> Option<T>) {
    let printed = value.to_string();
    let again = parse(&printed).unwrap_or_else(|| panic!("`{printed}` does not parse again"));
    assert_eq!(again.to_string(), printed, "printed form changed");
}

#[cfg(test)]
mod tests {
    /// The inputs on which `binlog_decoder` found panics in `mysql_common` (an event
    /// shorter than its header says, a body too short for its CRC32, a table map without
    /// the metadata of its columns): errors now.
    #[test]
    fn crashes_found_by_fuzzing_are_errors() {
        super::binlog_decoder(include_bytes!("log/testdata/fuzz/event_size.bin"));
        super::binlog_decoder(include_bytes!("log/testdata/fuzz/short_checksum.bin"));
        super::binlog_decoder(include_bytes!("log/testdata/fuzz/column_metadata.bin"));
    }
}
