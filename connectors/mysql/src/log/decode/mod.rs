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

use mysql_async::binlog::events::{
    Event, EventData, GtidEvent, IncidentEvent, QueryEvent, RotateEvent, TableMapEvent,
};
use mysql_async::binlog::{EventType, IncidentType};
use mysql_async::consts::ColumnType;
use mysql_common::io::ParseBuf;
use outboxd_connector::{
    CommittedTransaction, ConnectorError, ErrorReason, OutboxEvent, OutboxLayout, TransactionPart,
    PART_BYTES, PART_EVENTS,
};

use crate::log::gtid::{uuid_text, Gtid, GtidState};
use crate::log::position::BinlogPosition;

mod events;
mod rows;
#[cfg(test)]
mod tests;

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use events::read_event;
use events::{checksum_ok, contains_ci, logged_column_names, starts_with_ci, table_id, trim_ascii};
pub(crate) use events::{parse_mariadb_gtid, parse_mariadb_gtid_list};
use rows::{
    binlog_class, column_kinds, info_class, read_row_image, to_event, OutboxColumns, RowView,
};

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
