use super::*;
use bytes::Bytes;
use mysql_async::binlog::events::FormatDescriptionEvent;
use mysql_async::binlog::BinlogVersion;

/// Columns of `schemas/mysql/outbox.sql` in ordinal order.
const COLUMNS: &[&str] = &[
    "id",
    "message_id",
    "message_type",
    "biz_key",
    "topic",
    "payload",
    "headers",
    "status",
    "retry_count",
    "max_retry_count",
    "next_retry_time",
    "claimed_at",
    "claim_token",
    "last_error",
    "created_at",
    "updated_at",
    "sent_at",
    "kafka_partition",
    "kafka_offset",
];

/// `DATA_TYPE`s of [`COLUMNS`] on MariaDB.
const TYPES: &[&str] = &[
    "bigint",
    "varchar",
    "varchar",
    "varchar",
    "varchar",
    "longtext",
    "longtext",
    "varchar",
    "int",
    "int",
    "timestamp",
    "timestamp",
    "char",
    "text",
    "timestamp",
    "timestamp",
    "timestamp",
    "int",
    "bigint",
];

fn names(with_tenant: bool) -> Vec<(String, String)> {
    let mut names: Vec<(String, String)> = COLUMNS
        .iter()
        .zip(TYPES)
        .map(|(c, t)| ((*c).to_owned(), (*t).to_owned()))
        .collect();
    if with_tenant {
        names.insert(1, ("tenant".to_owned(), "varchar".to_owned()));
    }
    names
}

/// The captured events (see tests/capture.rs), read as the stream reads them.
fn fixture() -> Vec<Event> {
    let mut fde = FormatDescriptionEvent::new(BinlogVersion::Version4);
    let mut events = Vec::new();
    for line in include_str!("../testdata/mariadb_outbox.hex").lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bytes: Vec<u8> = (0..line.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&line[i..i + 2], 16).unwrap())
            .collect();
        let event = Event::read(&fde, &bytes[..]).unwrap();
        if event.header().event_type_raw() == EventType::FORMAT_DESCRIPTION_EVENT as u8 {
            fde = event
                .read_event::<FormatDescriptionEvent>()
                .unwrap()
                .into_owned()
                .with_footer(event.footer());
        }
        events.push(event);
    }
    events
}

fn start() -> BinlogPosition {
    BinlogPosition {
        file: "mariadb-bin.000002".into(),
        offset: 32215,
        gtid_set: Some("0-1-100".into()),
    }
}

/// Feeds every event, answering column look-ups with `lookup(n)` for the n-th one.
fn run(
    decoder: &mut Decoder,
    lookup: impl Fn(usize) -> Vec<(String, String)>,
) -> Result<Vec<Decoded>, ConnectorError> {
    let mut out = Vec::new();
    let mut lookups = 0;
    for event in fixture() {
        loop {
            match decoder.handle(&event)? {
                Decoded::NeedColumns => {
                    decoder.provide_columns(lookup(lookups));
                    lookups += 1;
                }
                Decoded::Nothing => break,
                other => {
                    out.push(other);
                    break;
                }
            }
        }
    }
    Ok(out)
}

fn transactions(out: &[Decoded]) -> Vec<&CommittedTransaction> {
    out.iter()
        .filter_map(|d| match d {
            Decoded::Transaction(t) => Some(t),
            _ => None,
        })
        .collect()
}

#[test]
fn assembles_the_captured_transactions() {
    let gtid = GtidState::parse("0-1-100", true);
    let mut decoder = Decoder::new(
        "outboxd",
        "fixture_outbox",
        &OutboxLayout::default(),
        &start(),
        gtid,
    );
    let out = run(&mut decoder, |n| names(n > 0)).unwrap();
    assert!(!decoder.in_transaction());
    let txns = transactions(&out);
    assert_eq!(txns.len(), 2, "{out:?}");

    let first = txns[0];
    assert_eq!(first.events.len(), 2);
    let e = &first.events[0];
    assert_eq!(e.message_id, "m-order-1");
    assert_eq!(e.message_type, "order.created");
    assert_eq!(e.biz_key, "order-1");
    assert_eq!(&e.key[..], b"order-1");
    assert_eq!(e.topic, None);
    assert_eq!(&e.payload[..], br#"{"total": 12.5}"#);
    assert_eq!(
        e.headers,
        vec![
            ("trace".to_owned(), Bytes::from_static(b"abc")),
            ("n".to_owned(), Bytes::from_static(b"1"))
        ]
    );
    assert_eq!(e.created_at, "2026-05-09T07:30:00.123456+00:00");
    assert_eq!((e.retry_count, e.max_retry_count), (0, 10));
    assert!(e.commit_time.is_some() && e.commit_time == first.commit_time);
    assert_eq!(first.events[1].topic.as_deref(), Some("orders.special"));
    assert!(first.events[1].id > e.id);
    let at = BinlogPosition::from_position(&first.commit_position).expect("binlog");
    assert_eq!((at.file.as_str(), at.offset), ("mariadb-bin.000002", 33334));
    assert_eq!(
        at.gtid_set.as_deref(),
        Some("0-1-62"),
        "its GTID is applied"
    );

    // After the DDL: the new column shifts the others, names are read again.
    let second = txns[1];
    assert_eq!(second.events.len(), 1);
    assert_eq!(second.events[0].message_id, "m-order-3");
    assert_eq!(second.events[0].biz_key, "order-3");
    assert!(second.commit_position > first.commit_position);

    // Other tables' commits, the write-back and the DDL are progress, in order; the
    // last event leaves the position at the end of the stream.
    let boundaries = out
        .iter()
        .filter(|d| matches!(d, Decoded::Boundary))
        .count();
    assert!(boundaries >= 4, "{out:?}");
    let end = decoder.position();
    assert_eq!(end.offset, 35353);
    assert_eq!(
        end.gtid_set.as_deref(),
        Some("0-1-68"),
        "seven transactions"
    );
}

#[test]
fn writes_to_the_checkpoint_table_alone_are_not_progress() {
    let boundaries = |decoder: &mut Decoder| {
        run(decoder, |n| names(n > 0))
            .unwrap()
            .iter()
            .filter(|d| matches!(d, Decoded::Boundary))
            .count()
    };
    let mut plain = Decoder::new(
        "outboxd",
        "fixture_outbox",
        &OutboxLayout::default(),
        &start(),
        None,
    );
    // Pretend `fixture_other` is the checkpoint table: its transaction moves the
    // position silently.
    let mut own = Decoder::new(
        "outboxd",
        "fixture_outbox",
        &OutboxLayout::default(),
        &start(),
        None,
    )
    .with_checkpoint_table("outboxd", "fixture_other");
    assert_eq!(boundaries(&mut own), boundaries(&mut plain) - 1);
    assert_eq!(own.position(), plain.position());
}

/// Corrupted bodies (header intact, so the framing holds): the decoder returns errors,
/// it never panics. A deterministic stand-in for fuzzing.
#[test]
fn an_event_shorter_than_its_header_says_is_an_error() {
    // What the `binlog_decoder` fuzz target found at once: a header declaring more
    // bytes than follow. `Event::read` alone allocates them and panics on the
    // missing ones (here 1.5 GB declared, none sent).
    let fde = FormatDescriptionEvent::new(BinlogVersion::Version4);
    let mut event = vec![0u8; 19];
    event[4] = EventType::QUERY_EVENT as u8;
    event[9..13].copy_from_slice(&0x5a5a_5a5au32.to_le_bytes());
    assert!(read_event(&fde, &event).is_err());
    // Shorter than a header, or declaring less than one.
    assert!(read_event(&fde, &event[..12]).is_err());
    event[9..13].copy_from_slice(&18u32.to_le_bytes());
    assert!(read_event(&fde, &event).is_err());
    // Found next: after a format description that turns CRC32 on, an event of 19 + 2
    // bytes; `Event::read` cut 4 checksum bytes off its 2-byte body.
    let crc_fde = fixture()
        .into_iter()
        .find(|e| e.header().event_type_raw() == EventType::FORMAT_DESCRIPTION_EVENT as u8)
        .unwrap();
    let crc_fde = crc_fde
        .read_event::<FormatDescriptionEvent>()
        .unwrap()
        .into_owned()
        .with_footer(crc_fde.footer());
    let mut short = vec![0u8; 21];
    short[4] = EventType::XID_EVENT as u8;
    short[9..13].copy_from_slice(&21u32.to_le_bytes());
    assert!(read_event(&crc_fde, &short).is_err());
    // The captured events all read.
    let mut fde = fde;
    for line in include_str!("../testdata/mariadb_outbox.hex").lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bytes: Vec<u8> = (0..line.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&line[i..i + 2], 16).unwrap())
            .collect();
        let event = read_event(&fde, &bytes).unwrap();
        if event.header().event_type_raw() == EventType::FORMAT_DESCRIPTION_EVENT as u8 {
            fde = event
                .read_event::<FormatDescriptionEvent>()
                .unwrap()
                .into_owned()
                .with_footer(event.footer());
        }
    }
}

#[test]
fn corrupted_events_are_errors_not_panics() {
    let mut fde = FormatDescriptionEvent::new(BinlogVersion::Version4);
    let mut raw: Vec<Vec<u8>> = Vec::new();
    for line in include_str!("../testdata/mariadb_outbox.hex").lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        raw.push(
            (0..line.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&line[i..i + 2], 16).unwrap())
                .collect(),
        );
    }
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut panics, mut errors, mut transactions) = (0, 0, 0);
    for round in 0..300 {
        let mut decoder = Decoder::new(
            "outboxd",
            "fixture_outbox",
            &OutboxLayout::default(),
            &start(),
            None,
        );
        decoder.provide_columns(names(false));
        for (n, bytes) in raw.iter().enumerate() {
            let mut bytes = bytes.clone();
            // Corrupt one in four events after the FDE, a few body bytes each.
            if n > 1 && next() % 4 == 0 && bytes.len() > 23 {
                for _ in 0..=(next() % 4) {
                    let at = 19 + (next() as usize) % (bytes.len() - 23);
                    bytes[at] = next() as u8;
                }
            }
            let Ok(event) = Event::read(&fde, &bytes[..]) else {
                continue;
            };
            // Re-serialised, the corrupted event carries a valid CRC32, so the row
            // decoding is reached rather than the checksum check.
            let mut fixed = Vec::new();
            if event.write(BinlogVersion::Version4, &mut fixed).is_err() {
                continue;
            }
            let Ok(event) = Event::read(&fde, &fixed[..]) else {
                continue;
            };
            if event.header().event_type_raw() == EventType::FORMAT_DESCRIPTION_EVENT as u8 {
                if let Ok(f) = event.read_event::<FormatDescriptionEvent>() {
                    fde = f.into_owned().with_footer(event.footer());
                }
            }
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decoder.handle(&event)));
            match result {
                Err(_) => {
                    panics += 1;
                    eprintln!("round {round}, event {n}: panic");
                }
                Ok(Err(_)) => errors += 1,
                Ok(Ok(Decoded::Transaction(_))) => transactions += 1,
                Ok(Ok(_)) => {}
            }
        }
    }
    assert_eq!(panics, 0);
    // The corruption reached the decoder, and intact transactions still decoded.
    assert!(
        errors > 50 && transactions > 50,
        "{errors} errors, {transactions} transactions"
    );
}

/// An INCIDENT event (here LOST_EVENTS, what a server logs when it could not write
/// some events to its binlog) after the captured stream, built as the server writes it:
/// header, incident type, length-prefixed message, CRC32.
fn incident_event(fde: &FormatDescriptionEvent<'_>, at: u32) -> Event {
    let message = b"error writing to the binary log";
    let mut body = 1u16.to_le_bytes().to_vec(); // INCIDENT_LOST_EVENTS
    body.push(message.len() as u8);
    body.extend_from_slice(message);
    let size = 19 + body.len() as u32 + 4;
    let mut bytes = Vec::new();
    bytes.extend(1_778_311_800u32.to_le_bytes());
    bytes.push(EventType::INCIDENT_EVENT as u8);
    bytes.extend(1u32.to_le_bytes());
    bytes.extend(size.to_le_bytes());
    bytes.extend((at + size).to_le_bytes());
    bytes.extend(0u16.to_le_bytes());
    bytes.extend(body);
    bytes.extend([0; 4]);
    // Read, then written again: the copy carries the right CRC32.
    let event = Event::read(fde, &bytes[..]).unwrap();
    let mut fixed = Vec::new();
    event.write(BinlogVersion::Version4, &mut fixed).unwrap();
    Event::read(fde, &fixed[..]).unwrap()
}

#[test]
fn an_incident_stops_the_stream_instead_of_skipping_the_gap() {
    let mut decoder = Decoder::new(
        "outboxd",
        "fixture_outbox",
        &OutboxLayout::default(),
        &start(),
        None,
    );
    run(&mut decoder, |n| names(n > 0)).unwrap();
    let fde = fixture()
        .iter()
        .find(|e| e.header().event_type_raw() == EventType::FORMAT_DESCRIPTION_EVENT as u8)
        .map(|e| {
            e.read_event::<FormatDescriptionEvent>()
                .unwrap()
                .into_owned()
                .with_footer(e.footer())
        })
        .unwrap();
    let before = decoder.position();
    let incident = incident_event(&fde, 35353);
    assert!(checksum_ok(&incident));
    let err = decoder.handle(&incident).unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert_eq!(err.reason(), ErrorReason::PositionLost, "{err}");
    let message = err.message();
    for part in [
        "INCIDENT",
        "LOST_EVENTS",
        "error writing to the binary log",
        "mariadb-bin.000002:35353",
        "outboxd recover --config <file>",
    ] {
        assert!(message.contains(part), "`{part}` missing from: {message}");
    }
    // The gap is not stepped over: the position stays before it.
    assert_eq!(decoder.position(), before);

    // Inside a transaction too.
    let mut decoder = Decoder::new(
        "outboxd",
        "fixture_outbox",
        &OutboxLayout::default(),
        &start(),
        None,
    );
    decoder.group = Some(Group::default());
    assert!(decoder.handle(&incident).is_err());
}

#[test]
fn another_table_name_yields_only_progress() {
    let mut decoder = Decoder::new(
        "outboxd",
        "outbox",
        &OutboxLayout::default(),
        &start(),
        None,
    );
    let out = run(&mut decoder, |_| {
        panic!("no column look-up for other tables")
    })
    .unwrap();
    assert!(transactions(&out).is_empty(), "{out:?}");
    assert_eq!(decoder.position().offset, 35353);
    assert_eq!(decoder.position().gtid_set, None);
}

#[test]
fn a_column_appended_later_keeps_the_names_of_the_rows_before_it() {
    // information_schema already has a column the first rows did not.
    let mut decoder = Decoder::new(
        "outboxd",
        "fixture_outbox",
        &OutboxLayout::default(),
        &start(),
        None,
    );
    let mut appended = names(false);
    appended.push(("tenant".to_owned(), "varchar".to_owned()));
    for event in fixture() {
        let decoded = match decoder.handle(&event).unwrap() {
            Decoded::NeedColumns => {
                decoder.provide_columns(appended.clone());
                decoder.handle(&event).unwrap()
            }
            other => other,
        };
        if let Decoded::Transaction(txn) = decoded {
            assert_eq!(txn.events[0].message_id, "m-order-1");
            assert_eq!(txn.events[1].topic.as_deref(), Some("orders.special"));
            return;
        }
    }
    panic!("no transaction");
}

#[test]
fn stale_column_names_are_caught_by_the_types() {
    // Names from before the ALTER for the table map after it: `created_at` would land
    // on a TEXT column.
    let mut decoder = Decoder::new(
        "outboxd",
        "fixture_outbox",
        &OutboxLayout::default(),
        &start(),
        None,
    );
    let err = run(&mut decoder, |_| names(false)).unwrap_err();
    assert!(!err.is_transient());
    assert!(
        err.message().contains("binlog_row_metadata = FULL"),
        "{err}"
    );
}

#[test]
fn a_missing_key_column_names_column_and_table() {
    let mut decoder = Decoder::new(
        "outboxd",
        "fixture_outbox",
        &OutboxLayout {
            key_column: "no_such_column".into(),
            ..OutboxLayout::default()
        },
        &start(),
        None,
    );
    let err = run(&mut decoder, |n| names(n > 0)).unwrap_err();
    assert!(err.message().contains("`no_such_column`"), "{err}");
    assert!(err.message().contains("outboxd.fixture_outbox"), "{err}");
}

#[test]
fn byte_helpers() {
    assert_eq!(trim_ascii(b"  BEGIN\n"), b"BEGIN");
    assert_eq!(trim_ascii(b"   "), b"");
    assert!(contains_ci(
        b"ALTER TABLE `Outbox_x` ADD c INT",
        b"outbox_x"
    ));
    assert!(!contains_ci(b"ALTER TABLE other", b"outbox"));
    assert!(starts_with_ci(b"xa start 'a'", b"XA START"));
    assert_eq!(table_id(&[1, 2, 0, 0, 0, 0, 9]), Some(0x0201));
    assert_eq!(table_id(&[1, 2]), None);
}

#[test]
fn mariadb_gtid_events_parse() {
    let mut data = 42u64.to_le_bytes().to_vec();
    data.extend(7u32.to_le_bytes());
    data.push(MARIADB_FL_STANDALONE);
    let (gtid, flags) = parse_mariadb_gtid(&data, 3).unwrap();
    assert_eq!(
        gtid,
        Gtid::MariaDb {
            domain: 7,
            server: 3,
            seq: 42
        }
    );
    assert_eq!(flags, MARIADB_FL_STANDALONE);
    assert!(parse_mariadb_gtid(&data[..10], 3).is_none());

    let mut list = 2u32.to_le_bytes().to_vec();
    for (d, s, n) in [(0u32, 1u32, 9u64), (1, 2, 3)] {
        list.extend(d.to_le_bytes());
        list.extend(s.to_le_bytes());
        list.extend(n.to_le_bytes());
    }
    assert_eq!(
        parse_mariadb_gtid_list(&list).unwrap().to_string(),
        "0-1-9,1-2-3"
    );
    assert!(parse_mariadb_gtid_list(&list[..20]).is_none());
}
