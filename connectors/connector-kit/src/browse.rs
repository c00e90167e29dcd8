//! The operator console's reads of a table of rows with a status, the outbox or the
//! inbox ([`TableAdmin::list_rows`], [`TableAdmin::row_detail`], [`TableAdmin::held_keys`]):
//! the statements, written once for both engines, and the rows they return read back from
//! text cells (each engine runs them as plain text queries).
//!
//! An engine gives its dialect: identifier quoting, string literals and how a timestamp
//! becomes microseconds since the epoch. Every value the operator types (a message type,
//! a key, error text) goes in as a literal the engine escaped; ids and limits are numbers.
//!
//! Pages are keysets on the id (newest first), never `OFFSET`: a page costs the same on a
//! table of a million rows. FAILED and MANUAL_REQUIRED rows are found through the index
//! of rows in trouble (`next_retry_time IS NOT NULL` on the outbox, by status on the inbox).
//!
//! [`TableAdmin::list_rows`]: outboxd_connector::TableAdmin::list_rows
//! [`TableAdmin::row_detail`]: outboxd_connector::TableAdmin::row_detail
//! [`TableAdmin::held_keys`]: outboxd_connector::TableAdmin::held_keys

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outboxd_connector::{
    ConnectorError, HeldKey, OutboxLayout, RowDetail, RowQuery, RowSummary, TableKind,
};

use crate::columns::RowNames;

/// What differs between the engines in the console's statements.
pub struct Dialect {
    /// A string literal, escaped for the engine.
    pub literal: fn(&str) -> String,
    /// A timestamp expression as whole microseconds since the epoch (an integer).
    pub epoch_micros: fn(&str) -> String,
    /// An expression (JSON or text; not bytes) as text.
    pub as_text: fn(&str) -> String,
    /// The first `n` characters of a payload column as text; `binary` when the column
    /// holds bytes (shown as the engine escapes them).
    pub payload_preview: fn(column: &str, n: usize, binary: bool) -> String,
    /// The length in bytes of a payload column as stored.
    pub payload_bytes: fn(column: &str, binary: bool) -> String,
    /// Whether a payload column is longer than the `n` characters (bytes, when `binary`
    /// on an engine that cuts bytes) of its preview: a boolean the engine gives as text.
    pub payload_cut: fn(column: &str, n: usize, binary: bool) -> String,
    /// How the held keys are found: by walking the key index of the rows in trouble one
    /// key at a time (PostgreSQL, whose partial index holds only those rows), or by
    /// grouping the rows in trouble (MySQL, whose key index holds every row: a walk would
    /// step through the finished rows of every key in between).
    pub held_keys: HeldKeysScan,
}

/// See [`Dialect::held_keys`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldKeysScan {
    /// A recursive walk of the key index, one probe per key shown.
    SkipScan,
    /// One grouping of the rows in trouble, cut to the page.
    Group,
}

/// The table and its columns, quoted by the engine.
#[derive(Clone, Debug)]
pub struct BrowseTable {
    /// The qualified, quoted table name.
    pub table: String,
    /// Outbox or inbox: which statuses, which columns.
    pub kind: TableKind,
    /// The integer id.
    pub id: String,
    /// The message type.
    pub message_type: String,
    /// The business key.
    pub biz_key: String,
    /// The message id.
    pub message_id: String,
    /// The payload.
    pub payload: String,
    /// Whether the payload column holds bytes (`bytea`, `LONGBLOB`) rather than JSON or
    /// text.
    pub binary_payload: bool,
    /// The headers (a JSON object), when the table has them.
    pub headers: Option<String>,
    /// When the row was written, when the table says.
    pub created_at: Option<String>,
    /// The outbox's topic or endpoint column, when it has one.
    pub topic: Option<String>,
}

impl BrowseTable {
    /// An outbox table, `table` qualified and quoted, its columns where the layout puts them
    /// (the status columns always have outboxd's names), each through `quote`.
    pub fn outbox(table: String, layout: &OutboxLayout, quote: impl Fn(&str) -> String) -> Self {
        let names = RowNames::quoted(layout, &quote);
        let columns = &layout.columns;
        Self {
            table,
            kind: TableKind::Outbox,
            id: names.id,
            message_type: names.message_type,
            biz_key: names.biz_key,
            message_id: quote(&columns.message_id),
            payload: quote(&columns.payload),
            binary_payload: false,
            headers: columns.headers.as_deref().map(&quote),
            created_at: names.created_at,
            topic: columns.topic.as_deref().map(&quote),
        }
    }

    /// outboxd's own inbox table (`schemas/*/inbox.sql`), `table` qualified and quoted.
    pub fn inbox(table: String) -> Self {
        Self {
            table,
            kind: TableKind::Inbox,
            id: "id".into(),
            message_type: "message_type".into(),
            biz_key: "biz_key".into(),
            message_id: "message_id".into(),
            payload: "payload".into(),
            binary_payload: false,
            headers: Some("headers".into()),
            created_at: Some("created_at".into()),
            topic: None,
        }
    }

    /// The same table, its payload column holding bytes when `binary`.
    pub fn with_binary_payload(mut self, binary: bool) -> Self {
        self.binary_payload = binary;
        self
    }

    /// "Rows in trouble" as the table's indexes find them: on the outbox every FAILED,
    /// PROCESSING and MANUAL_REQUIRED row (and no other) has `next_retry_time` set, which
    /// the partial and retry indexes cover.
    fn in_trouble(&self) -> &'static str {
        match self.kind {
            TableKind::Outbox => "next_retry_time IS NOT NULL AND ",
            TableKind::Inbox => "",
        }
    }

    /// The columns of a [`RowSummary`], in [`summary_from_cells`]'s order, of table alias
    /// `t`.
    fn summary_columns(&self, d: &Dialect) -> String {
        let created_at = self.created_at.as_deref().map_or_else(
            || "NULL".to_owned(),
            |c| (d.epoch_micros)(&format!("t.{c}")),
        );
        format!(
            "t.{id}, t.{message_type}, t.{biz_key}, t.status, t.retry_count, t.max_retry_count, \
             {next}, t.last_error, {created_at}, {updated}",
            id = self.id,
            message_type = self.message_type,
            biz_key = self.biz_key,
            next = (d.epoch_micros)("t.next_retry_time"),
            updated = (d.epoch_micros)("t.updated_at"),
        )
    }
}

/// How many cells [`summary_from_cells`] reads.
pub const SUMMARY_CELLS: usize = 10;

/// One page of [`RowQuery`]: the summary columns ([`summary_from_cells`]).
pub fn list_rows_sql(t: &BrowseTable, d: &Dialect, q: &RowQuery) -> String {
    let mut filters = vec![format!("t.status = {}", (d.literal)(&q.status))];
    if let Some(message_type) = &q.message_type {
        filters.push(format!(
            "t.{} = {}",
            t.message_type,
            (d.literal)(message_type)
        ));
    }
    if let Some(key) = &q.biz_key {
        filters.push(format!("t.{} = {}", t.biz_key, (d.literal)(key)));
    }
    if let Some(text) = &q.error_contains {
        filters.push(format!(
            "POSITION({} IN t.last_error) > 0",
            (d.literal)(text)
        ));
    }
    if let Some(before) = q.before_id {
        filters.push(format!("t.{} < {before}", t.id));
    }
    // The index of rows in trouble serves FAILED and MANUAL_REQUIRED.
    let trouble = if matches!(q.status.as_str(), "FAILED" | "MANUAL_REQUIRED") {
        t.in_trouble()
    } else {
        ""
    };
    format!(
        "SELECT {} FROM {} t WHERE {trouble}{} ORDER BY t.{} DESC LIMIT {}",
        t.summary_columns(d),
        t.table,
        filters.join(" AND "),
        t.id,
        q.limit
    )
}

/// One row in full: the summary columns, then message id, source, topic, headers, the
/// payload's first `preview_chars` characters and its length in bytes, when it finished,
/// and the sink's position ([`detail_from_cells`]).
pub fn row_detail_sql(t: &BrowseTable, d: &Dialect, id: i64, preview_chars: usize) -> String {
    let payload = format!("t.{}", t.payload);
    let preview = (d.payload_preview)(&payload, preview_chars, t.binary_payload);
    let bytes = (d.payload_bytes)(&payload, t.binary_payload);
    let cut = (d.payload_cut)(&payload, preview_chars, t.binary_payload);
    let headers = t
        .headers
        .as_deref()
        .map_or_else(|| "NULL".to_owned(), |h| (d.as_text)(&format!("t.{h}")));
    let (source, topic, finished, position) = match t.kind {
        TableKind::Outbox => (
            "NULL".to_owned(),
            t.topic
                .as_deref()
                .map_or_else(|| "NULL".to_owned(), |c| format!("t.{c}")),
            (d.epoch_micros)("t.sent_at"),
            "t.kafka_partition, t.kafka_offset",
        ),
        TableKind::Inbox => (
            "t.source".to_owned(),
            "NULL".to_owned(),
            (d.epoch_micros)("t.processed_at"),
            "NULL, NULL",
        ),
    };
    format!(
        "SELECT {summary}, t.{message_id}, {source}, {topic}, {headers}, \
         {preview}, {bytes}, {finished}, {position}, {cut} \
         FROM {table} t WHERE t.{id} = {id_value}",
        summary = t.summary_columns(d),
        message_id = t.message_id,
        table = t.table,
        id = t.id,
        id_value = id,
    )
}

/// Up to `limit` held keys after `after_key`, in key order: the summary columns of the
/// row holding each, then how many rows of the key wait behind it
/// ([`held_key_from_cells`]). A key is held while a row of it is FAILED or
/// MANUAL_REQUIRED; the row holding it is its lowest in FAILED, PROCESSING or
/// MANUAL_REQUIRED (a retry under way, or a claim not reaped yet, comes first), as the
/// claims see it.
pub fn held_keys_sql(
    t: &BrowseTable,
    d: &Dialect,
    after_key: Option<&str>,
    limit: usize,
) -> String {
    let after = after_key.map_or_else(String::new, |key| {
        format!(" AND {} > {}", t.biz_key, (d.literal)(key))
    });
    let (key, id, table, trouble) = (&t.biz_key, &t.id, &t.table, t.in_trouble());
    // Behind the holder: the outbox's rows in trouble (parked rows are FAILED), found by
    // the key index of those rows; the inbox's rows not handled yet.
    let behind = match t.kind {
        TableKind::Outbox => "b.next_retry_time IS NOT NULL".to_owned(),
        TableKind::Inbox => "b.status <> 'DONE'".to_owned(),
    };
    let held = "status IN ('FAILED', 'MANUAL_REQUIRED')";
    // The rows that hold a key, as the claims see them; `prefix` is `alias.` or empty.
    let blocking = |prefix: &str| match t.kind {
        TableKind::Outbox => format!("{prefix}next_retry_time IS NOT NULL"),
        TableKind::Inbox => {
            format!("{prefix}status IN ('FAILED', 'PROCESSING', 'MANUAL_REQUIRED')")
        }
    };
    let count_behind = format!(
        "(SELECT COUNT(*) FROM {table} b WHERE b.{key} = t.{key} AND {behind} AND b.{id} > t.{id})"
    );
    let summary = t.summary_columns(d);
    match d.held_keys {
        // The keys one at a time, each the next one with a row in trouble after the last
        // (one probe of the key index each), `limit` of them at most; never a grouping of
        // every row in trouble, which a hot key parked behind a failed row can make a
        // large set. Then each key's lowest row in trouble holds it.
        HeldKeysScan::SkipScan => format!(
            "WITH RECURSIVE held(held_key, n) AS (\
             SELECT MIN({key}), 1 FROM {table} WHERE {trouble}{held}{after} \
             UNION ALL \
             SELECT (SELECT MIN(k.{key}) FROM {table} k WHERE {k_trouble}k.{held} \
             AND k.{key} > held.held_key), held.n + 1 FROM held \
             WHERE held.held_key IS NOT NULL AND held.n < {limit}), \
             holders AS (SELECT held.held_key, (SELECT MIN(f.{id}) FROM {table} f \
             WHERE f.{key} = held.held_key AND {f_blocking}) AS holder \
             FROM held WHERE held.held_key IS NOT NULL) \
             SELECT {summary}, {count_behind} \
             FROM holders h JOIN {table} t ON t.{id} = h.holder ORDER BY h.held_key",
            k_trouble = trouble.replace("next_retry_time", "k.next_retry_time"),
            f_blocking = blocking("f."),
        ),
        // Each key's lowest row in trouble, keys with a FAILED or MANUAL_REQUIRED row.
        HeldKeysScan::Group => format!(
            "SELECT {summary}, {count_behind} \
             FROM (SELECT {key} AS held_key, MIN({id}) AS holder FROM {table} \
             WHERE {g_blocking} AND {key} IS NOT NULL{after} GROUP BY {key} \
             HAVING SUM(CASE WHEN {held} THEN 1 ELSE 0 END) > 0 \
             ORDER BY {key} LIMIT {limit}) h \
             JOIN {table} t ON t.{id} = h.holder ORDER BY h.held_key",
            g_blocking = blocking(""),
        ),
    }
}

/// A row's cells as text (`None` for NULL), as an engine's plain text query returns them.
pub type TextCells = Vec<Option<String>>;

/// The statement of a read, made for the table as the engine's connection finds it (e.g.
/// whether PostgreSQL's payload column is `bytea`).
pub type MakeSql<'a> = &'a (dyn Fn(&BrowseTable) -> String + Sync);

/// An engine's store the console reads through, the outbox's or the inbox's: how one of
/// the statements above is run. Reading the rows back and the checks around them are
/// [`list`], [`detail`] and [`held`], the same for every engine.
pub trait Browse: Sync {
    /// Which table.
    const KIND: TableKind;

    /// Runs the statement `make` writes for the table (bounded on the server, as the
    /// engine can), on the store's connection; each row's cells as text. `what` names
    /// the read in an error.
    fn text_rows(
        &self,
        make: MakeSql<'_>,
        what: &str,
    ) -> impl Future<Output = Result<Vec<TextCells>, ConnectorError>> + Send;
}

/// One page of rows ([`TableAdmin::list_rows`]), in the engine's `dialect`.
///
/// [`TableAdmin::list_rows`]: outboxd_connector::TableAdmin::list_rows
pub async fn list<B: Browse>(
    store: &B,
    dialect: &Dialect,
    query: &RowQuery,
) -> Result<Vec<RowSummary>, ConnectorError> {
    query.check(B::KIND)?;
    let what = format!("listing {} rows", B::KIND.name());
    let sql = |t: &BrowseTable| list_rows_sql(t, dialect, query);
    read_rows(&store.text_rows(&sql, &what).await?, summary_from_cells)
}

/// One row in full ([`TableAdmin::row_detail`]), in the engine's `dialect`.
///
/// [`TableAdmin::row_detail`]: outboxd_connector::TableAdmin::row_detail
pub async fn detail<B: Browse>(
    store: &B,
    dialect: &Dialect,
    id: i64,
    preview_chars: usize,
) -> Result<Option<RowDetail>, ConnectorError> {
    let what = format!("reading {} row {id}", B::KIND.name());
    let sql = |t: &BrowseTable| row_detail_sql(t, dialect, id, preview_chars);
    let rows = read_rows(&store.text_rows(&sql, &what).await?, detail_from_cells)?;
    Ok(rows.into_iter().next())
}

/// The held keys ([`TableAdmin::held_keys`]), in the engine's `dialect`.
///
/// [`TableAdmin::held_keys`]: outboxd_connector::TableAdmin::held_keys
pub async fn held<B: Browse>(
    store: &B,
    dialect: &Dialect,
    after_key: Option<&str>,
    limit: usize,
) -> Result<Vec<HeldKey>, ConnectorError> {
    let what = format!("reading the {}'s held keys", B::KIND.name());
    let sql = |t: &BrowseTable| held_keys_sql(t, dialect, after_key, limit);
    read_rows(&store.text_rows(&sql, &what).await?, held_key_from_cells)
}

/// Each row read with `read`.
fn read_rows<T>(
    rows: &[TextCells],
    read: fn(&[Option<&str>]) -> Result<T, String>,
) -> Result<Vec<T>, ConnectorError> {
    rows.iter()
        .map(|row| {
            let cells: Vec<Option<&str>> = row.iter().map(Option::as_deref).collect();
            read(&cells).map_err(ConnectorError::definite)
        })
        .collect()
}

/// A [`RowSummary`] from the first [`SUMMARY_CELLS`] text cells of a row of
/// [`list_rows_sql`], [`row_detail_sql`] or [`held_keys_sql`].
pub fn summary_from_cells(cells: &[Option<&str>]) -> Result<RowSummary, String> {
    let cell = |i: usize| cells.get(i).copied().flatten();
    let text = |i: usize, name: &str| {
        cell(i)
            .map(str::to_owned)
            .ok_or_else(|| format!("the console's row read has no {name}"))
    };
    Ok(RowSummary {
        id: number(cell(0), "id")?.ok_or("the console's row read has no id")?,
        message_type: text(1, "message type")?,
        biz_key: text(2, "key")?,
        status: text(3, "status")?,
        retry_count: number(cell(4), "retry_count")?.unwrap_or(0),
        max_retry_count: number(cell(5), "max_retry_count")?.unwrap_or(0),
        next_retry_time: time(cell(6))?,
        last_error: cell(7).map(str::to_owned),
        created_at: time(cell(8))?,
        updated_at: time(cell(9))?,
    })
}

/// A [`RowDetail`] from the text cells of a row of [`row_detail_sql`].
pub fn detail_from_cells(cells: &[Option<&str>]) -> Result<RowDetail, String> {
    let summary = summary_from_cells(cells)?;
    let cell = |i: usize| cells.get(SUMMARY_CELLS + i).copied().flatten();
    let owned = |i: usize| cell(i).map(str::to_owned);
    let partition = number(cell(7), "kafka_partition")?;
    let offset = number(cell(8), "kafka_offset")?;
    Ok(RowDetail {
        summary,
        message_id: owned(0).unwrap_or_default(),
        source: owned(1),
        topic: owned(2),
        headers: owned(3),
        payload_preview: owned(4).unwrap_or_default(),
        payload_bytes: number(cell(5), "payload length")?.unwrap_or(0),
        // PostgreSQL's `t`/`f`, MySQL's 1/0.
        payload_cut: matches!(cell(9), Some("t" | "1" | "true")),
        finished_at: time(cell(6))?,
        sink_position: partition.zip(offset),
    })
}

/// A [`HeldKey`] from the text cells of a row of [`held_keys_sql`].
pub fn held_key_from_cells(cells: &[Option<&str>]) -> Result<HeldKey, String> {
    Ok(HeldKey {
        holder: summary_from_cells(cells)?,
        waiting: number(cells.get(SUMMARY_CELLS).copied().flatten(), "count")?.unwrap_or(0),
    })
}

fn number(cell: Option<&str>, name: &str) -> Result<Option<i64>, String> {
    cell.map(|text| {
        // MySQL gives a computed count or epoch as a decimal in some versions.
        let whole = text.split('.').next().unwrap_or(text);
        whole
            .trim()
            .parse::<i64>()
            .map_err(|e| format!("the console's row read: {name} `{text}` is not a number: {e}"))
    })
    .transpose()
}

fn time(cell: Option<&str>) -> Result<Option<SystemTime>, String> {
    Ok(number(cell, "timestamp")?.map(|micros| {
        let magnitude = Duration::from_micros(micros.unsigned_abs());
        if micros >= 0 {
            UNIX_EPOCH + magnitude
        } else {
            UNIX_EPOCH - magnitude
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dialect() -> Dialect {
        Dialect {
            literal: |s| format!("'{}'", s.replace('\'', "''")),
            epoch_micros: |c| format!("us({c})"),
            as_text: |c| format!("txt({c})"),
            payload_preview: |c, n, binary| format!("pre({c}, {n}, {binary})"),
            payload_bytes: |c, binary| format!("len({c}, {binary})"),
            payload_cut: |c, n, binary| format!("cut({c}, {n}, {binary})"),
            held_keys: HeldKeysScan::SkipScan,
        }
    }

    fn outbox() -> BrowseTable {
        BrowseTable {
            table: "\"outbox\"".into(),
            kind: TableKind::Outbox,
            id: "id".into(),
            message_type: "message_type".into(),
            biz_key: "biz_key".into(),
            message_id: "message_id".into(),
            payload: "payload".into(),
            binary_payload: false,
            headers: Some("headers".into()),
            created_at: Some("created_at".into()),
            topic: Some("topic".into()),
        }
    }

    #[test]
    fn a_page_is_a_keyset_over_the_index_of_rows_in_trouble() {
        let query = RowQuery {
            status: "FAILED".into(),
            message_type: Some("order'created".into()),
            biz_key: None,
            error_contains: Some("timeout".into()),
            before_id: Some(900),
            limit: 50,
        };
        let sql = list_rows_sql(&outbox(), &dialect(), &query);
        assert!(
            sql.contains("WHERE next_retry_time IS NOT NULL AND t.status = 'FAILED'"),
            "{sql}"
        );
        assert!(sql.contains("t.message_type = 'order''created'"), "{sql}");
        assert!(
            sql.contains("POSITION('timeout' IN t.last_error) > 0"),
            "{sql}"
        );
        assert!(
            sql.ends_with("t.id < 900 ORDER BY t.id DESC LIMIT 50"),
            "{sql}"
        );
        assert!(!sql.contains("OFFSET"));

        let inbox = BrowseTable::inbox("\"inbox\"".into());
        let sql = list_rows_sql(&inbox, &dialect(), &query);
        assert!(sql.contains("WHERE t.status = 'FAILED'"), "{sql}");
    }

    #[test]
    fn held_keys_page_by_key_and_count_what_waits() {
        let sql = held_keys_sql(&outbox(), &dialect(), Some("k'1"), 20);
        assert!(sql.contains("biz_key > 'k''1'"), "{sql}");
        assert!(sql.contains("held.n < 20"), "at most 20 keys: {sql}");
        assert!(
            !sql.contains("GROUP BY"),
            "no grouping of every row in trouble"
        );
        assert!(
            sql.contains("b.next_retry_time IS NOT NULL AND b.id > t.id"),
            "{sql}"
        );
        let inbox = BrowseTable::inbox("\"inbox\"".into());
        let sql = held_keys_sql(&inbox, &dialect(), None, 20);
        assert!(sql.contains("b.status <> 'DONE'"), "{sql}");
        let grouped = Dialect {
            held_keys: HeldKeysScan::Group,
            ..dialect()
        };
        let sql = held_keys_sql(&outbox(), &grouped, Some("k"), 20);
        assert!(
            sql.contains(
                "WHERE next_retry_time IS NOT NULL AND biz_key IS NOT NULL AND biz_key > 'k' \
                 GROUP BY biz_key"
            ),
            "{sql}"
        );
        assert!(sql.contains("ORDER BY biz_key LIMIT 20"), "{sql}");
    }

    #[test]
    fn cells_read_back_into_rows() {
        let mut cells = vec![
            Some("7"),
            Some("order.created"),
            Some("K"),
            Some("MANUAL_REQUIRED"),
            Some("3"),
            Some("10"),
            Some("1700000000000000"),
            Some("boom"),
            None,
            Some("-1000000.000000"),
        ];
        let summary = summary_from_cells(&cells).expect("summary");
        assert_eq!(summary.id, 7);
        assert_eq!(summary.retry_count, 3);
        assert_eq!(
            summary.next_retry_time,
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(summary.created_at, None);
        assert_eq!(
            summary.updated_at,
            Some(UNIX_EPOCH - Duration::from_secs(1))
        );

        cells.extend([
            Some("m-7"),
            None,
            Some("orders"),
            Some("{\"a\":\"1\"}"),
            Some("{\"x\":"),
            Some("12345"),
            None,
            Some("2"),
            Some("99"),
            Some("t"),
        ]);
        let detail = detail_from_cells(&cells).expect("detail");
        assert_eq!(detail.message_id, "m-7");
        assert_eq!(detail.topic.as_deref(), Some("orders"));
        assert_eq!(detail.payload_bytes, 12345);
        assert_eq!(detail.sink_position, Some((2, 99)));
        assert!(detail.payload_cut);

        let bad = [Some("x")];
        assert!(summary_from_cells(&bad).unwrap_err().contains("id `x`"));
    }
}
