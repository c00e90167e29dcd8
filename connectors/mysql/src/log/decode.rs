//! Assembles committed outbox transactions from binlog events. A pure state machine (no
//! I/O): [`crate::stream`] (`log/stream.rs`) feeds it the events of the replication stream, the unit tests
//! feed it events captured from a real MariaDB server.
//!
//! - Transactions are delimited by their GTID event (MySQL `GTID`/`ANONYMOUS_GTID`,
//!   MariaDB's own), `BEGIN`, and `XID` or a `COMMIT` query; a `ROLLBACK` query or an
//!   `XA PREPARE` drops what was collected. Only a commit yields rows.
//! - Table maps of other tables are remembered by table id only; their rows events are
//!   skipped after reading the 6-byte table id. Update and delete rows events (the
//!   status write-backs among them) are never decoded.
//! - Column names come from the table map when the server logs them
//!   (`binlog_row_metadata = FULL`), otherwise from `information_schema`, through
//!   [`Decoded::NeedColumns`]; they are cached with the table's shape (its column types) and
//!   looked up again when the shape changes or a DDL statement names the outbox table.
//! - The position is the binlog file and the end offset of the last event that closed a
//!   transaction (or stood between transactions), with the GTID state executed up to it.
//! - An INCIDENT event (the server lost events: the binlog has a gap) is a definite
//!   error, never skipped: only `outboxd recover` can make up for what is missing.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use mysql_async::binlog::events::{
    Event, EventData, GtidEvent, IncidentEvent, OptionalMetaExtractor, OptionalMetadataField,
    QueryEvent, RotateEvent, TableMapEvent,
};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::binlog::{BinlogChecksumAlg, EventType, IncidentType};
use mysql_async::consts::ColumnType;
use mysql_async::Value;
use mysql_common::io::ParseBuf;
use outboxd_connector::{
    CommittedTransaction, ConnectorError, ErrorReason, OutboxEvent, OutboxLayout, TransactionPart,
    PART_BYTES, PART_EVENTS,
};
use outboxd_connector_kit::row::{self, RowSource, Value as Cell};
use outboxd_connector_kit::{ColumnMap, Field};

use crate::log::gtid::{uuid_text, Gtid, GtidState, MariaDbGtidPos};
use crate::log::position::BinlogPosition;
use crate::time::{fraction, iso8601_utc};

/// MariaDB event types mysql_common does not know.
const MARIADB_GTID_EVENT: u8 = 162;
const MARIADB_GTID_LIST_EVENT: u8 = 163;
/// MySQL 8.0.26+: heartbeat with a 64-bit position.
const HEARTBEAT_LOG_EVENT_V2: u8 = 0x29;
/// MariaDB GTID event flag: a statement without BEGIN/COMMIT (DDL) follows.
const MARIADB_FL_STANDALONE: u8 = 1;
/// MariaDB GTID event flag: the group changes transactional tables only, so it ends in a
/// commit; without it the group may end in ROLLBACK (see [`Group::may_split`]).
const MARIADB_FL_TRANSACTIONAL: u8 = 4;

/// What one event amounts to.
#[derive(Debug)]
pub(crate) enum Decoded {
    /// Nothing to report (inside a transaction, or a table map).
    Nothing,
    /// Between transactions, the position moved (a transaction without outbox rows
    /// committed, a rotation, a DDL statement): a progress candidate.
    Boundary,
    /// A committed transaction with outbox rows (or the end of one yielded in parts).
    Transaction(CommittedTransaction),
    /// The next rows of a large transaction (its end follows).
    Part(TransactionPart),
    /// The server's heartbeat: the binlog is idle.
    Heartbeat,
    /// The outbox's column names are needed: look them up, hand them to
    /// [`Decoder::provide_columns`] and give the decoder the same event again.
    NeedColumns,
}

/// The outbox columns by name, from `information_schema` (ordinal order), with the shape
/// (column types of the table map) they were last matched against.
#[derive(Debug)]
struct CachedNames {
    names: Vec<String>,
    /// `DATA_TYPE` of each column, to check names against a table map's types.
    types: Vec<String>,
    shape: Option<Vec<u8>>,
}

enum TableEntry {
    Other,
    /// outboxd's own checkpoint table.
    Checkpoint,
    Outbox(Box<OutboxTable>),
}

struct OutboxTable {
    /// Which outbox table: its index in the layout (the event's `table`).
    index: u16,
    /// The table map event's bytes, to recognise a repeat cheaply.
    raw: Vec<u8>,
    tme: TableMapEvent<'static>,
    columns: OutboxColumns,
    /// Each column's type and signedness, read once from the table map (see
    /// [`read_row_image`]).
    kinds: Vec<(ColumnType, bool)>,
}

/// A transaction being read.
#[derive(Default)]
struct Group {
    events: Vec<OutboxEvent>,
    gtid: Option<Gtid>,
    /// Opened by BEGIN (or a MariaDB GTID that implies it): ends at XID/COMMIT. Otherwise
    /// the next statement is standalone and ends it.
    has_begin: bool,
    /// Rows of the checkpoint table were written.
    touched_checkpoint: bool,
    /// Rows of another table were written.
    touched_other: bool,
    /// [`OutboxEvent::size`] of `events`.
    bytes: usize,
    /// Parts yielded so far: the end may then be empty.
    parts: usize,
    /// Whether the group is certain to end in a commit, so its rows may be handed over in
    /// parts before the end is read. A group that also changed a non-transactional table
    /// is logged even when it rolls back, ending in ROLLBACK: its outbox rows never
    /// happened, so they must not be sent before the end says so. Certain when MariaDB
    /// marks the group transactional, or when MySQL logs it with a GTID (GTID mode needs
    /// `enforce_gtid_consistency`, which refuses non-transactional changes inside a
    /// transaction). Otherwise the group is held whole, as before parts existed.
    may_split: bool,
}

/// The binlog → outbox transaction state machine of one stream.
pub(crate) struct Decoder {
    /// `(database, table)` of each outbox table, in the layout's order.
    outboxes: Vec<(String, String)>,
    /// The outbox whose column names [`Decoded::NeedColumns`] asked for.
    wanted: usize,
    /// The column names and whether rows carry their status.
    layout: OutboxLayout,
    /// `(database, table)` of the checkpoint table, when known.
    checkpoint_table: Option<(String, String)>,
    tables: HashMap<u64, TableEntry>,
    /// Each outbox's column names (same index), once read.
    names: Vec<Option<CachedNames>>,
    file: String,
    offset: u64,
    gtid: Option<GtidState>,
    group: Option<Group>,
    /// End offset of the last MySQL transaction payload event: the events inside it carry
    /// no position of their own.
    payload_end: u64,
}

impl fmt::Debug for Decoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder")
            .field("outbox", &self.table_name())
            .field("position", &self.position())
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder for the outbox `db`.`table` starting at `start` (whose GTID state, when
    /// known, is kept up to date).
    pub(crate) fn new(
        outbox_db: &str,
        outbox_table: &str,
        layout: &OutboxLayout,
        start: &BinlogPosition,
        gtid: Option<GtidState>,
    ) -> Self {
        Self {
            outboxes: vec![(outbox_db.to_owned(), outbox_table.to_owned())],
            wanted: 0,
            layout: layout.clone(),
            checkpoint_table: None,
            tables: HashMap::new(),
            names: vec![None],
            file: start.file.clone(),
            offset: start.offset,
            gtid,
            group: None,
            payload_end: 0,
        }
    }

    /// Names the checkpoint table: a transaction that writes only its rows (outboxd's own
    /// checkpoint writes) moves the position silently instead of as a [`Decoded::Boundary`],
    /// so persisting a confirmed position does not cause another one, forever.
    pub(crate) fn with_checkpoint_table(mut self, db: &str, table: &str) -> Self {
        self.checkpoint_table = Some((db.to_owned(), table.to_owned()));
        self
    }

    /// Reads `outboxes` (`(database, table)`, the layout's order, the first the one given
    /// to [`Decoder::new`]) instead of one outbox table.
    pub(crate) fn with_outboxes(mut self, outboxes: Vec<(String, String)>) -> Self {
        if !outboxes.is_empty() {
            self.names = outboxes.iter().map(|_| None).collect();
            self.outboxes = outboxes;
        }
        self
    }

    /// `db.table` of the outbox tables, for messages.
    pub(crate) fn table_name(&self) -> String {
        let names: Vec<String> = (0..self.outboxes.len()).map(|i| self.name_of(i)).collect();
        names.join(", ")
    }

    /// `db.table` of outbox `index`.
    fn name_of(&self, index: usize) -> String {
        let (db, table) = &self.outboxes[index];
        format!("{db}.{table}")
    }

    /// `(database, table)` of the outbox whose column names [`Decoded::NeedColumns`] asked
    /// for.
    pub(crate) fn outbox(&self) -> (&str, &str) {
        let (db, table) = &self.outboxes[self.wanted];
        (db, table)
    }

    /// True while inside a transaction.
    pub(crate) fn in_transaction(&self) -> bool {
        self.group.is_some()
    }

    /// The last position between transactions, where a stream can resume.
    pub(crate) fn position(&self) -> BinlogPosition {
        BinlogPosition {
            file: self.file.clone(),
            offset: self.offset,
            gtid_set: self.gtid.as_ref().map(ToString::to_string),
        }
    }

    /// The outbox's column names in ordinal order, from `information_schema`.
    /// Each is `(COLUMN_NAME, DATA_TYPE)`.
    pub(crate) fn provide_columns(&mut self, columns: Vec<(String, String)>) {
        let (names, types) = columns.into_iter().unzip();
        self.names[self.wanted] = Some(CachedNames {
            names,
            types,
            shape: None,
        });
    }

    /// Handles one event.
    pub(crate) fn handle(&mut self, event: &Event) -> Result<Decoded, ConnectorError> {
        let header = event.header();
        let end = u64::from(header.log_pos());
        let kind = header.event_type_raw();
        const WRITE_V1: u8 = EventType::WRITE_ROWS_EVENT_V1 as u8;
        const WRITE_V2: u8 = EventType::WRITE_ROWS_EVENT as u8;
        const TABLE_MAP: u8 = EventType::TABLE_MAP_EVENT as u8;
        const QUERY: u8 = EventType::QUERY_EVENT as u8;
        const XID: u8 = EventType::XID_EVENT as u8;
        const GTID: u8 = EventType::GTID_EVENT as u8;
        const GTID_TAGGED: u8 = EventType::GTID_TAGGED_LOG_EVENT as u8;
        const ANONYMOUS_GTID: u8 = EventType::ANONYMOUS_GTID_EVENT as u8;
        const ROTATE: u8 = EventType::ROTATE_EVENT as u8;
        const PAYLOAD: u8 = EventType::TRANSACTION_PAYLOAD_EVENT as u8;
        const HEARTBEAT: u8 = EventType::HEARTBEAT_EVENT as u8;
        const XA_PREPARE: u8 = EventType::XA_PREPARE_LOG_EVENT as u8;
        const UPDATE_V1: u8 = EventType::UPDATE_ROWS_EVENT_V1 as u8;
        const DELETE_V1: u8 = EventType::DELETE_ROWS_EVENT_V1 as u8;
        const UPDATE_V2: u8 = EventType::UPDATE_ROWS_EVENT as u8;
        const DELETE_V2: u8 = EventType::DELETE_ROWS_EVENT as u8;
        const PARTIAL_UPDATE: u8 = EventType::PARTIAL_UPDATE_ROWS_EVENT as u8;
        const INCIDENT: u8 = EventType::INCIDENT_EVENT as u8;
        match kind {
            WRITE_V1 | WRITE_V2 => self.write_rows(event),
            UPDATE_V1 | DELETE_V1 | UPDATE_V2 | DELETE_V2 | PARTIAL_UPDATE => Ok(Decoded::Nothing),
            TABLE_MAP => self.table_map(event),
            QUERY => self.query(event, end),
            XID => Ok(self.commit(end, header.timestamp())),
            GTID | GTID_TAGGED => {
                let gtid = event.read_event::<GtidEvent>().map_err(|e| self.bad(e))?;
                let tag = gtid.tag().map(|t| t.as_str().to_ascii_lowercase());
                self.group = Some(Group {
                    gtid: Some(Gtid::MySql {
                        uuid: uuid_text(&gtid.sid()),
                        tag,
                        gno: gtid.gno(),
                    }),
                    may_split: true,
                    ..Group::default()
                });
                Ok(Decoded::Nothing)
            }
            ANONYMOUS_GTID => {
                self.group = Some(Group::default());
                Ok(Decoded::Nothing)
            }
            MARIADB_GTID_EVENT => {
                let (gtid, flags) = parse_mariadb_gtid(event.data(), header.server_id())
                    .ok_or_else(|| self.bad("short MariaDB GTID event"))?;
                self.group = Some(Group {
                    gtid: Some(gtid),
                    has_begin: flags & MARIADB_FL_STANDALONE == 0,
                    may_split: flags & MARIADB_FL_TRANSACTIONAL != 0,
                    ..Group::default()
                });
                Ok(Decoded::Nothing)
            }
            MARIADB_GTID_LIST_EVENT => {
                // The state at the start of a binlog file: authoritative when we have none.
                if self.gtid.is_none() && self.group.is_none() {
                    if let Some(list) = parse_mariadb_gtid_list(event.data()) {
                        self.gtid = Some(GtidState::MariaDb(list));
                    }
                }
                Ok(self.advance(end))
            }
            ROTATE => {
                let rotate = event.read_event::<RotateEvent>().map_err(|e| self.bad(e))?;
                let mut name = rotate.name_raw();
                // The artificial rotate that opens a stream comes before the format
                // description, so its CRC32 is still attached to the name: it names the
                // file we asked for.
                if end == 0
                    && name.len() == self.file.len() + 4
                    && name.starts_with(self.file.as_bytes())
                {
                    name = &name[..self.file.len()];
                }
                let name = String::from_utf8_lossy(name).into_owned();
                if name != self.file {
                    // Table ids are only unique within one server run, which a file never
                    // spans; drop what the old file taught us.
                    self.tables.clear();
                }
                self.file = name;
                self.offset = rotate.position();
                Ok(Decoded::Boundary)
            }
            PAYLOAD => {
                self.payload_end = end;
                Ok(Decoded::Nothing)
            }
            HEARTBEAT | HEARTBEAT_LOG_EVENT_V2 => Ok(Decoded::Heartbeat),
            INCIDENT => Err(self.incident(event)),
            XA_PREPARE => {
                // The rows of an XA transaction commit later, in a statement of their own;
                // outboxd does not follow XA transactions into the outbox.
                if let Some(group) = self.group.take() {
                    if !group.events.is_empty() {
                        return Err(ConnectorError::definite(format!(
                            "an XA transaction inserted into outbox `{}`: outboxd does not \
                             support XA transactions on the outbox; insert outbox rows in \
                             ordinary transactions",
                            self.table_name()
                        )));
                    }
                    self.apply_gtid(group.gtid.as_ref());
                }
                Ok(self.advance(end))
            }
            _ => {
                if self.group.is_some() {
                    return Ok(Decoded::Nothing);
                }
                Ok(self.advance(end))
            }
        }
    }

    /// Moves the resume position to `end` (between transactions only, never backward in a
    /// file; artificial events with position 0 do not move it).
    fn advance(&mut self, end: u64) -> Decoded {
        if end > self.offset {
            self.offset = end;
            Decoded::Boundary
        } else {
            Decoded::Nothing
        }
    }

    fn apply_gtid(&mut self, gtid: Option<&Gtid>) {
        if let (Some(state), Some(gtid)) = (self.gtid.as_mut(), gtid) {
            state.add(gtid);
        }
    }

    fn commit(&mut self, end: u64, timestamp: u32) -> Decoded {
        let end = if end > 0 { end } else { self.payload_end };
        let group = self.group.take().unwrap_or_default();
        self.apply_gtid(group.gtid.as_ref());
        if end > self.offset {
            self.offset = end;
        }
        if group.events.is_empty() && group.parts == 0 {
            if group.touched_checkpoint && !group.touched_other {
                return Decoded::Nothing;
            }
            return Decoded::Boundary;
        }
        let commit_time =
            SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(u64::from(timestamp)));
        let mut events = group.events;
        for event in &mut events {
            event.commit_time = commit_time;
        }
        Decoded::Transaction(CommittedTransaction {
            commit_position: self.position().position(),
            commit_time,
            events,
        })
    }

    fn query(&mut self, event: &Event, end: u64) -> Result<Decoded, ConnectorError> {
        let query = event.read_event::<QueryEvent>().map_err(|e| self.bad(e))?;
        let text = query.query_raw();
        let trimmed = trim_ascii(text);
        if trimmed.eq_ignore_ascii_case(b"BEGIN") || starts_with_ci(trimmed, b"XA START") {
            match &mut self.group {
                Some(group) => group.has_begin = true,
                None => {
                    self.group = Some(Group {
                        has_begin: true,
                        ..Group::default()
                    })
                }
            }
            return Ok(Decoded::Nothing);
        }
        if trimmed.eq_ignore_ascii_case(b"COMMIT") {
            return Ok(self.commit(end, event.header().timestamp()));
        }
        if trimmed.eq_ignore_ascii_case(b"ROLLBACK") {
            // Logged for transactions that also changed non-transactional tables: what
            // they inserted into the outbox never happened.
            let group = self.group.take().unwrap_or_default();
            self.apply_gtid(group.gtid.as_ref());
            return Ok(self.advance(end));
        }
        let mentions_outbox = (self.outboxes.iter()).any(|(_, t)| contains_ci(text, t.as_bytes()));
        match &self.group {
            Some(group) if group.has_begin => {
                if mentions_outbox
                    && !starts_with_ci(trimmed, b"XA END")
                    && !starts_with_ci(trimmed, b"SAVEPOINT")
                {
                    return Err(ConnectorError::definite(format!(
                        "the binlog holds a statement, not row events, for outbox `{}` \
                         (binlog_format is not ROW for that session?): set binlog_format = ROW \
                         globally, then run `outboxd recover --config <file>`",
                        self.table_name()
                    )));
                }
                Ok(Decoded::Nothing)
            }
            _ => {
                // A statement of its own: DDL, or XA COMMIT/ROLLBACK.
                let group = self.group.take().unwrap_or_default();
                self.apply_gtid(group.gtid.as_ref());
                if mentions_outbox {
                    tracing::debug!(outbox = %self.table_name(), "DDL on the outbox: its columns are read again");
                    self.names.iter_mut().for_each(|n| *n = None);
                    self.tables
                        .retain(|_, t| matches!(t, TableEntry::Other | TableEntry::Checkpoint));
                }
                Ok(self.advance(end))
            }
        }
    }

    fn table_map(&mut self, event: &Event) -> Result<Decoded, ConnectorError> {
        let data = event.data();
        let id = table_id(data).ok_or_else(|| self.bad("short table map event"))?;
        let known = match self.tables.get(&id) {
            Some(TableEntry::Other) => Some(false),
            Some(TableEntry::Checkpoint) => Some(true),
            Some(TableEntry::Outbox(t)) if t.raw == data => Some(false),
            _ => None,
        };
        if let Some(checkpoint) = known {
            self.touch(checkpoint);
            return Ok(Decoded::Nothing);
        }
        let tme = event
            .read_event::<TableMapEvent>()
            .map_err(|e| self.bad(e))?;
        let outbox = self.outboxes.iter().position(|(db, table)| {
            tme.database_name_raw() == db.as_bytes()
                && tme.table_name_raw().eq_ignore_ascii_case(table.as_bytes())
        });
        let Some(index) = outbox else {
            let checkpoint = self.checkpoint_table.as_ref().is_some_and(|(db, table)| {
                tme.database_name_raw() == db.as_bytes() && tme.table_name_raw() == table.as_bytes()
            });
            let entry = if checkpoint {
                TableEntry::Checkpoint
            } else {
                TableEntry::Other
            };
            self.tables.insert(id, entry);
            self.touch(checkpoint);
            return Ok(Decoded::Nothing);
        };
        let table_name = self.name_of(index);
        self.touch(false);
        if !checksum_ok(event) {
            return Err(self.checksum_error());
        }
        let count = usize::try_from(tme.columns_count()).unwrap_or(usize::MAX);
        let mut shape = Vec::with_capacity(count.min(4096));
        for i in 0..count {
            let ty = tme.get_column_type(i).ok().flatten().ok_or_else(|| {
                self.bad(format!("column {i} of the table map has an unknown type"))
            })?;
            // mysql_common indexes each value's column metadata unchecked: an empty slice
            // when the table map's metadata is too short, and always for a typed array
            // (its metadata is the element type's, without the type byte it reads first).
            // Both panic (found by the `binlog_decoder` fuzz target); no outbox column is
            // a typed array, so a row is decoded only with all of the metadata there.
            if ty == ColumnType::MYSQL_TYPE_TYPED_ARRAY || tme.get_column_metadata(i).is_none() {
                return Err(self.bad(format!(
                    "column {i} of the table map (type {ty:?}) lacks its type's metadata"
                )));
            }
            shape.push(ty as u8);
        }
        let logged_names = logged_column_names(&tme);
        let names: Vec<String> = match logged_names {
            Some(names) if names.len() == count => names,
            _ => match &mut self.names[index] {
                Some(cached) if cached.shape.as_ref().is_none_or(|s| *s == shape) => {
                    // information_schema may describe a later version of the table (DDL
                    // committed after the rows being read): its first `count` columns must
                    // have the table map's types, column by column (a column appended
                    // since is fine, one inserted or dropped before the end is not).
                    let mismatch = (0..count).find(|&i| {
                        let info = cached.types.get(i).and_then(|t| info_class(t));
                        let logged = tme.get_column_type(i).ok().flatten().and_then(binlog_class);
                        cached.types.len() < count
                            || matches!((info, logged), (Some(a), Some(b)) if a != b)
                    });
                    if let Some(at) = mismatch {
                        return Err(ConnectorError::definite(format!(
                            "outbox `{}`: the binlog's table map ({} columns) does not match \
                             information_schema ({} columns, column {} differs): the table was \
                             altered after these rows were written, and without column names \
                             in the binlog outboxd cannot tell which value is which. Set \
                             binlog_row_metadata = FULL (the binlog then names its columns) and \
                             run `outboxd recover --config <file>`",
                            table_name,
                            count,
                            cached.names.len(),
                            at + 1
                        )));
                    }
                    cached.shape = Some(shape.clone());
                    cached.names[..count].to_vec()
                }
                _ => {
                    self.wanted = index;
                    return Ok(Decoded::NeedColumns);
                }
            },
        };
        let columns = OutboxColumns::new(&names, &shape, &table_name, &self.layout)?;
        let kinds = column_kinds(&tme).map_err(|e| self.bad(e))?;
        tracing::debug!(outbox = %table_name, table_id = id, columns = count, "outbox table map");
        self.tables.insert(
            id,
            TableEntry::Outbox(Box::new(OutboxTable {
                // The layout's tables number at most u16::MAX (config).
                index: u16::try_from(index).unwrap_or(u16::MAX),
                raw: data.to_vec(),
                tme: tme.into_owned(),
                columns,
                kinds,
            })),
        );
        Ok(Decoded::Nothing)
    }

    /// Notes which kind of table the current transaction writes.
    fn touch(&mut self, checkpoint: bool) {
        let group = self.group.get_or_insert_with(|| Group {
            has_begin: true,
            ..Group::default()
        });
        if checkpoint {
            group.touched_checkpoint = true;
        } else {
            group.touched_other = true;
        }
    }

    fn write_rows(&mut self, event: &Event) -> Result<Decoded, ConnectorError> {
        let id = table_id(event.data()).ok_or_else(|| self.bad("short rows event"))?;
        let table = match self.tables.get(&id) {
            Some(TableEntry::Outbox(table)) => table,
            // Other tables, or a table whose map we have not seen (impossible within a
            // transaction, which always repeats its table maps).
            _ => return Ok(Decoded::Nothing),
        };
        if !checksum_ok(event) {
            return Err(self.checksum_error());
        }
        let table_name = self.name_of(usize::from(table.index));
        let data = event.read_data().map_err(|e| self.bad(e))?;
        let Some(EventData::RowsEvent(rows_event)) = data else {
            return Err(self.bad("a write rows event that is not one"));
        };
        // Which table columns the row images carry (all of them with binlog_row_image =
        // FULL); a column outside the image reads as missing.
        let present: Vec<bool> = (0..table.columns.count)
            .map(|i| {
                rows_event
                    .columns_after_image()
                    .is_some_and(|image| image.get(i).is_some_and(|bit| *bit))
            })
            .collect();
        let mut events = Vec::new();
        let mut rows = ParseBuf(rows_event.rows_data());
        let mut values = Vec::with_capacity(table.columns.count);
        while !rows.is_empty() {
            read_row_image(&mut rows, &table.tme, &table.kinds, &present, &mut values).map_err(
                |e| {
                    ConnectorError::definite(format!(
                        "cannot decode a row inserted into outbox `{table_name}`"
                    ))
                    .with_source(e)
                },
            )?;
            let row = RowView {
                values: &values,
                table: &table_name,
                columns: &table.columns,
            };
            if let Some(mut event) = to_event(&row)? {
                event.table = table.index;
                events.push(event);
            }
        }
        // Where the transaction begins: the last position between transactions (the
        // offset moves only at commits and boundaries).
        let begin_position = self.position();
        let timestamp = event.header().timestamp();
        let group = self.group.get_or_insert_with(|| Group {
            has_begin: true,
            ..Group::default()
        });
        group.bytes += events.iter().map(OutboxEvent::size).sum::<usize>();
        group.events.extend(events);
        if group.may_split && (group.events.len() >= PART_EVENTS || group.bytes >= PART_BYTES) {
            // A large transaction: hand its rows over as they come. The binlog stamps the
            // commit time on the commit only; the rows event's time stands in for it.
            let commit_time =
                SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(u64::from(timestamp)));
            let mut events = std::mem::take(&mut group.events);
            for event in &mut events {
                event.commit_time = commit_time;
            }
            group.bytes = 0;
            group.parts += 1;
            return Ok(Decoded::Part(TransactionPart {
                begin_position: begin_position.position(),
                commit_time,
                events,
            }));
        }
        Ok(Decoded::Nothing)
    }

    /// An INCIDENT event: the server could not log everything (LOST_EVENTS: a binlog
    /// write failed, a cache overflowed), so committed rows may be missing from the binlog
    /// after this point. Stepping over it would lose them silently; the position stays
    /// before it and the stream stops until the operator rescans.
    fn incident(&self, event: &Event) -> ConnectorError {
        let (kind, detail) = match event.read_event::<IncidentEvent>() {
            Ok(incident) => {
                let kind = match incident.incident_type() {
                    Ok(IncidentType::INCIDENT_LOST_EVENTS) => "LOST_EVENTS".to_owned(),
                    Ok(IncidentType::INCIDENT_NONE) => "NONE".to_owned(),
                    Err(e) => format!("type {}", e.0),
                };
                (kind, incident.message().into_owned())
            }
            Err(e) => ("unreadable".to_owned(), e.to_string()),
        };
        ConnectorError::definite(format!(
            "the binlog has a gap: the server logged an INCIDENT event ({kind}: `{detail}`) \
             after {}:{} (outbox `{}`), so events after it may be missing. outboxd stops \
             rather than skip it. Make sure no outbox row was lost (on a replica: resync it \
             from its primary), then run `outboxd recover --config <file>`: it records the \
             current position and publishes every INIT row",
            self.file,
            self.offset,
            self.table_name()
        ))
        .with_reason(ErrorReason::PositionLost)
    }

    fn bad(&self, e: impl fmt::Display) -> ConnectorError {
        ConnectorError::definite(format!(
            "cannot decode the binlog at {}:{} (outbox `{}`): {e}",
            self.file,
            self.offset,
            self.table_name()
        ))
    }

    fn checksum_error(&self) -> ConnectorError {
        ConnectorError::transient(format!(
            "binlog event checksum mismatch after {}:{}; reading it again",
            self.file, self.offset
        ))
    }
}

/// The class of a binlog column type, comparable with [`info_class`].
fn binlog_class(t: ColumnType) -> Option<&'static str> {
    use ColumnType::*;
    Some(match t {
        MYSQL_TYPE_TINY => "tinyint",
        MYSQL_TYPE_SHORT => "smallint",
        MYSQL_TYPE_INT24 => "mediumint",
        MYSQL_TYPE_LONG => "int",
        MYSQL_TYPE_LONGLONG => "bigint",
        MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING => "varchar",
        MYSQL_TYPE_STRING => "char",
        MYSQL_TYPE_BLOB | MYSQL_TYPE_TINY_BLOB | MYSQL_TYPE_MEDIUM_BLOB | MYSQL_TYPE_LONG_BLOB => {
            "blob"
        }
        MYSQL_TYPE_JSON => "json",
        MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 => "timestamp",
        MYSQL_TYPE_DATETIME | MYSQL_TYPE_DATETIME2 => "datetime",
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => "date",
        MYSQL_TYPE_TIME | MYSQL_TYPE_TIME2 => "time",
        MYSQL_TYPE_DECIMAL | MYSQL_TYPE_NEWDECIMAL => "decimal",
        MYSQL_TYPE_FLOAT => "float",
        MYSQL_TYPE_DOUBLE => "double",
        MYSQL_TYPE_YEAR => "year",
        MYSQL_TYPE_BIT => "bit",
        MYSQL_TYPE_ENUM => "enum",
        MYSQL_TYPE_SET => "set",
        MYSQL_TYPE_GEOMETRY => "geometry",
        _ => return None,
    })
}

/// The class of an `information_schema.COLUMNS.DATA_TYPE`; `None` when unknown.
fn info_class(data_type: &str) -> Option<&'static str> {
    Some(match data_type.to_ascii_lowercase().as_str() {
        "tinyint" => "tinyint",
        "smallint" => "smallint",
        "mediumint" => "mediumint",
        "int" | "integer" => "int",
        "bigint" => "bigint",
        "varchar" | "varbinary" => "varchar",
        "char" | "binary" => "char",
        "tinytext" | "text" | "mediumtext" | "longtext" | "tinyblob" | "blob" | "mediumblob"
        | "longblob" => "blob",
        "json" => "json",
        "timestamp" => "timestamp",
        "datetime" => "datetime",
        "date" => "date",
        "time" => "time",
        "decimal" | "numeric" => "decimal",
        "float" => "float",
        "double" | "real" => "double",
        "year" => "year",
        "bit" => "bit",
        "enum" => "enum",
        "set" => "set",
        "geometry" | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring"
        | "multipolygon" | "geometrycollection" => "geometry",
        _ => return None,
    })
}

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
fn table_id(data: &[u8]) -> Option<u64> {
    let b = data.get(..6)?;
    Some(u64::from_le_bytes([
        b[0], b[1], b[2], b[3], b[4], b[5], 0, 0,
    ]))
}

/// CRC32 of the event as sent, when the stream carries checksums.
fn checksum_ok(event: &Event) -> bool {
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
fn logged_column_names(tme: &TableMapEvent<'_>) -> Option<Vec<String>> {
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

fn trim_ascii(b: &[u8]) -> &[u8] {
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

fn starts_with_ci(text: &[u8], prefix: &[u8]) -> bool {
    text.get(..prefix.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
}

fn contains_ci(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Where each outbox column is (the kit's [`ColumnMap`]), checked against the binlog's
/// table map.
#[derive(Clone, Debug)]
struct OutboxColumns {
    count: usize,
    map: ColumnMap,
}

impl OutboxColumns {
    fn new(
        names: &[String],
        shape: &[u8],
        table: &str,
        layout: &OutboxLayout,
    ) -> Result<Self, ConnectorError> {
        let map = ColumnMap::resolve(
            |name| names.iter().position(|c| c.eq_ignore_ascii_case(name)),
            layout,
            table,
            "schemas/mysql/outbox.sql",
        )?;
        use ColumnType::*;
        let ints: &[ColumnType] = &[
            MYSQL_TYPE_TINY,
            MYSQL_TYPE_SHORT,
            MYSQL_TYPE_INT24,
            MYSQL_TYPE_LONG,
            MYSQL_TYPE_LONGLONG,
        ];
        let strings: &[ColumnType] = &[
            MYSQL_TYPE_VARCHAR,
            MYSQL_TYPE_VAR_STRING,
            MYSQL_TYPE_STRING,
            MYSQL_TYPE_BLOB,
            MYSQL_TYPE_TINY_BLOB,
            MYSQL_TYPE_MEDIUM_BLOB,
            MYSQL_TYPE_LONG_BLOB,
            MYSQL_TYPE_JSON,
            MYSQL_TYPE_ENUM,
        ];
        let times: &[ColumnType] = &[
            MYSQL_TYPE_TIMESTAMP2,
            MYSQL_TYPE_TIMESTAMP,
            MYSQL_TYPE_DATETIME2,
            MYSQL_TYPE_DATETIME,
        ];
        let expected = [
            (Field::Id, ints, "an integer"),
            (Field::MessageId, strings, "a string"),
            (Field::MessageType, strings, "a string"),
            (Field::BizKey, strings, "a string"),
            (Field::Payload, strings, "JSON, a string or a blob"),
            (Field::CreatedAt, times, "a TIMESTAMP or DATETIME"),
            (Field::Status, strings, "a string"),
            (Field::RetryCount, ints, "an integer"),
            (Field::MaxRetryCount, ints, "an integer"),
        ];
        for (field, kinds, what) in expected {
            let Some(column) = map.get(field) else {
                // Not read under this layout (ColumnMap::resolve requires what is).
                continue;
            };
            let fits = Some(column).is_some_and(|i| {
                shape
                    .get(i)
                    .is_some_and(|t| kinds.iter().any(|k| *k as u8 == *t))
            });
            if !fits {
                return Err(ConnectorError::definite(format!(
                    "outbox table `{table}`: column `{}` is not {what} in the binlog's \
                     table map (were the column names read for another version of the table? \
                     set binlog_row_metadata = FULL)",
                    field.label()
                ))
                .with_reason(ErrorReason::SchemaMismatch));
            }
        }
        Ok(Self {
            count: shape.len(),
            map,
        })
    }
}

/// One inserted row, addressed by table column, as the kit's row conversion reads it.
struct RowView<'a> {
    /// The row's values by table column; `None` for a column outside the row image.
    values: &'a [Option<BinlogValue<'a>>],
    table: &'a str,
    columns: &'a OutboxColumns,
}

impl RowView<'_> {
    fn unexpected(&self, name: &str, value: &dyn fmt::Debug) -> ConnectorError {
        ConnectorError::definite(format!(
            "outbox `{}`: column `{name}` has an unexpected value {value:?}",
            self.table
        ))
    }
}

impl RowSource for RowView<'_> {
    /// Strings and blobs as stored, JSON as JSON text, integers as integers; `created_at`
    /// as ISO 8601 (TIMESTAMP in UTC, `+00:00`; DATETIME without offset).
    fn value(&self, field: Field) -> Result<Cell, ConnectorError> {
        let Some(column) = self.columns.map.get(field) else {
            return Ok(Cell::Null);
        };
        let name = field.label();
        let value = self
            .values
            .get(column)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                ConnectorError::definite(format!(
                    "outbox `{}`: the binlog row lacks column `{name}`: set binlog_row_image = FULL",
                    self.table
                ))
            })?;
        let time = field == Field::CreatedAt;
        let iso = |text: String| Ok(Cell::Bytes(Bytes::from(text)));
        match value {
            BinlogValue::Value(Value::NULL) => Ok(Cell::Null),
            BinlogValue::Value(Value::Date(y, mo, d, h, mi, s, us)) if time => iso(format!(
                "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{}",
                fraction(*us)
            )),
            BinlogValue::Value(Value::Int(secs)) if time => iso(iso8601_utc(*secs, 0)),
            BinlogValue::Value(Value::Bytes(b)) if time => {
                // TIMESTAMP2: `seconds[.micros]` since the epoch.
                let text = std::str::from_utf8(b).unwrap_or_default();
                let (secs, micros) = text.split_once('.').unwrap_or((text, "0"));
                match (secs.parse::<i64>(), micros.parse::<u32>()) {
                    (Ok(secs), Ok(micros)) => iso(iso8601_utc(secs, micros)),
                    _ => Err(ConnectorError::definite(format!(
                        "outbox `{}`: column `{name}` = `{text}` is not a timestamp",
                        self.table
                    ))),
                }
            }
            other if time => Err(self.unexpected(name, other)),
            BinlogValue::Value(Value::Bytes(b)) => Ok(Cell::Bytes(Bytes::copy_from_slice(b))),
            BinlogValue::Value(Value::Int(i)) => Ok(Cell::Int(*i)),
            BinlogValue::Value(Value::UInt(u)) => i64::try_from(*u).map(Cell::Int).map_err(|_| {
                ConnectorError::definite(format!(
                    "outbox `{}`: column `{name}` is out of range",
                    self.table
                ))
            }),
            BinlogValue::Jsonb(json) => {
                let json = serde_json::Value::try_from(json.clone()).map_err(|e| {
                    ConnectorError::definite(format!(
                        "outbox `{}`: column `{name}` holds JSON that cannot be rendered",
                        self.table
                    ))
                    .with_source(e)
                })?;
                Ok(Cell::Bytes(Bytes::from(json.to_string())))
            }
            other => Err(self.unexpected(name, other)),
        }
    }
}

/// Each column's type and whether it is unsigned (a numeric column, per the table map's
/// optional metadata; signed when the server does not say), in table order.
fn column_kinds(tme: &TableMapEvent<'_>) -> std::io::Result<Vec<(ColumnType, bool)>> {
    let meta = OptionalMetaExtractor::new(tme.iter_optional_meta())?;
    let mut unsigned = meta.iter_signedness();
    let count = usize::try_from(tme.columns_count()).unwrap_or(usize::MAX);
    let mut kinds = Vec::with_capacity(count.min(4096));
    for i in 0..count {
        let kind = match tme.get_column_type(i) {
            Ok(Some(kind)) => kind,
            Ok(None) => return Err(invalid("a column without a type in the table map")),
            Err(e) => return Err(invalid(&e.to_string())),
        };
        let is_unsigned = kind.is_numeric_type() && unsigned.next().unwrap_or(false);
        kinds.push((kind, is_unsigned));
    }
    Ok(kinds)
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

/// Reads one row image of a write rows event from `rows` into `values`, by table column
/// (`None` for a column outside the image).
///
/// Written here rather than taken from `mysql_common`'s `BinlogRow`, which builds a
/// `Column` (schema, table and name strings, flags, a shared slice made unique) for every
/// column of every row: half of the binlog task's CPU in a drain (BENCHMARKS.md). The
/// values are parsed by `mysql_common`'s own value parser, borrowed from the event, in
/// the layout `BinlogRow` reads (a null bitmap over the image's columns, then the
/// values): only the per-row metadata is left out. A write rows event carries no shared
/// (partial JSON) image.
fn read_row_image<'d>(
    rows: &mut ParseBuf<'d>,
    tme: &'d TableMapEvent<'static>,
    kinds: &[(ColumnType, bool)],
    present: &[bool],
    values: &mut Vec<Option<BinlogValue<'d>>>,
) -> std::io::Result<()> {
    values.clear();
    let in_image = present.iter().filter(|p| **p).count();
    let bitmap: &[u8] = rows.parse(in_image.div_ceil(8))?;
    let mut image_column = 0;
    for (i, &(kind, is_unsigned)) in kinds.iter().enumerate() {
        if !present.get(i).copied().unwrap_or(false) {
            values.push(None);
            continue;
        }
        let null = bitmap
            .get(image_column / 8)
            .is_none_or(|byte| byte & (1 << (image_column % 8)) != 0);
        image_column += 1;
        if null {
            values.push(Some(BinlogValue::Value(Value::NULL)));
            continue;
        }
        let meta = tme.get_column_metadata(i).unwrap_or(&[]);
        values.push(Some(rows.parse::<BinlogValue<'d>>((
            kind,
            meta,
            is_unsigned,
            false,
        ))?));
    }
    Ok(())
}

/// One inserted outbox row as an event; `None` when its status is not INIT.
fn to_event(row: &RowView<'_>) -> Result<Option<OutboxEvent>, ConnectorError> {
    row::event_from_insert(row, &row.columns.map, row.table)
}

#[cfg(test)]
mod tests {
    use super::*;
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
        for line in include_str!("testdata/mariadb_outbox.hex").lines() {
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
        for line in include_str!("testdata/mariadb_outbox.hex").lines() {
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
        for line in include_str!("testdata/mariadb_outbox.hex").lines() {
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
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    decoder.handle(&event)
                }));
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
}
