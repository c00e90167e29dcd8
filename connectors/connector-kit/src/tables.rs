//! Several outbox tables in one store: a write-back's rows split by the table they are in.
//!
//! Row ids are unique per table only, so every statement on rows is per table; a store
//! runs each table's statements in the same database transaction. The split borrows the
//! batch when all its rows are in one table (every pipeline with one table, and most
//! batches of one with several), so that case copies nothing.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

use outboxd_connector::{
    ClaimToken, ClaimedWriteBack, ConnectorError, Delivered, DeliveryFailure, ParkedEvent, RowId,
    WriteBack,
};

/// Something written back to one row of one outbox table.
pub trait InTable: Clone {
    /// The index of the row's table ([`outboxd_connector::OutboxEvent::table`]).
    fn table(&self) -> u16;
}

impl InTable for Delivered {
    fn table(&self) -> u16 {
        self.table
    }
}

impl InTable for DeliveryFailure {
    fn table(&self) -> u16 {
        self.table
    }
}

impl InTable for ParkedEvent {
    fn table(&self) -> u16 {
        self.table
    }
}

impl<T: InTable> InTable for (T, ClaimToken) {
    fn table(&self) -> u16 {
        self.0.table()
    }
}

impl InTable for RowId {
    fn table(&self) -> u16 {
        self.table
    }
}

/// `rows` by table, in table order: one borrowed group when all are in one table.
pub fn group<T: InTable>(rows: &[T]) -> Vec<(u16, Cow<'_, [T]>)> {
    let Some(first) = rows.first().map(InTable::table) else {
        return Vec::new();
    };
    if rows.iter().all(|r| r.table() == first) {
        return vec![(first, Cow::Borrowed(rows))];
    }
    let mut by_table: BTreeMap<u16, Vec<T>> = BTreeMap::new();
    for row in rows {
        by_table.entry(row.table()).or_default().push(row.clone());
    }
    by_table
        .into_iter()
        .map(|(table, rows)| (table, Cow::Owned(rows)))
        .collect()
}

/// The rows of a [`WriteBack`] that are in one table (no checkpoint: a store writes that
/// once per transaction, after every table's rows).
#[derive(Clone, Debug, Default)]
pub struct TableWriteBack<'a> {
    /// The table's index.
    pub table: u16,
    delivered: Cow<'a, [Delivered]>,
    failed: Cow<'a, [DeliveryFailure]>,
    parked: Cow<'a, [ParkedEvent]>,
    rejected: Cow<'a, [ParkedEvent]>,
    replace_positions: bool,
}

impl TableWriteBack<'_> {
    /// The rows as a write-back without checkpoint.
    pub fn rows(&self) -> WriteBack<'_> {
        WriteBack {
            delivered: &self.delivered,
            failed: &self.failed,
            parked: &self.parked,
            rejected: &self.rejected,
            checkpoint: None,
            replace_positions: self.replace_positions,
        }
    }
}

/// The rows of `batch` split by table, in table order; empty when it has none.
pub fn split_write_back<'a>(batch: &WriteBack<'a>) -> Vec<TableWriteBack<'a>> {
    let mut parts: BTreeMap<u16, TableWriteBack<'a>> = BTreeMap::new();
    for (table, rows) in group(batch.delivered) {
        parts.entry(table).or_default().delivered = rows;
    }
    for (table, rows) in group(batch.failed) {
        parts.entry(table).or_default().failed = rows;
    }
    for (table, rows) in group(batch.parked) {
        parts.entry(table).or_default().parked = rows;
    }
    for (table, rows) in group(batch.rejected) {
        parts.entry(table).or_default().rejected = rows;
    }
    parts
        .into_iter()
        .map(|(table, part)| TableWriteBack {
            table,
            replace_positions: batch.replace_positions,
            ..part
        })
        .collect()
}

/// The rows of a [`ClaimedWriteBack`] that are in one table.
#[derive(Clone, Debug, Default)]
pub struct TableClaimedWriteBack<'a> {
    /// The table's index.
    pub table: u16,
    delivered: Cow<'a, [(Delivered, ClaimToken)]>,
    failed: Cow<'a, [(DeliveryFailure, ClaimToken)]>,
    released: Cow<'a, [(ParkedEvent, ClaimToken)]>,
    rejected: Cow<'a, [(ParkedEvent, ClaimToken)]>,
}

impl TableClaimedWriteBack<'_> {
    /// The rows as a claimed write-back.
    pub fn rows(&self) -> ClaimedWriteBack<'_> {
        ClaimedWriteBack {
            delivered: &self.delivered,
            failed: &self.failed,
            released: &self.released,
            rejected: &self.rejected,
        }
    }
}

/// The rows of `batch` split by table, in table order; empty when it has none.
pub fn split_claimed<'a>(batch: &ClaimedWriteBack<'a>) -> Vec<TableClaimedWriteBack<'a>> {
    let mut parts: BTreeMap<u16, TableClaimedWriteBack<'a>> = BTreeMap::new();
    for (table, rows) in group(batch.delivered) {
        parts.entry(table).or_default().delivered = rows;
    }
    for (table, rows) in group(batch.failed) {
        parts.entry(table).or_default().failed = rows;
    }
    for (table, rows) in group(batch.released) {
        parts.entry(table).or_default().released = rows;
    }
    for (table, rows) in group(batch.rejected) {
        parts.entry(table).or_default().rejected = rows;
    }
    parts
        .into_iter()
        .map(|(table, part)| TableClaimedWriteBack { table, ..part })
        .collect()
}

/// The ids of `rows` by table, in table order.
pub fn ids_by_table(rows: &[RowId]) -> Vec<(u16, Vec<i64>)> {
    group(rows)
        .into_iter()
        .map(|(table, rows)| (table, rows.iter().map(|r| r.id).collect()))
        .collect()
}

/// `ids` found in table `table`, as rows.
pub fn rows_of(table: u16, ids: impl IntoIterator<Item = i64>) -> HashSet<RowId> {
    ids.into_iter().map(|id| RowId { table, id }).collect()
}

/// The definite error of a row whose table index names no configured table: an internal
/// mix-up (an event of another pipeline's layout), never a reason to write elsewhere.
pub fn unknown_table(table: u16, tables: usize) -> ConnectorError {
    ConnectorError::definite(format!(
        "internal: a write-back names outbox table #{table}, but the pipeline has {tables}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn delivered(table: u16, id: i64) -> Delivered {
        Delivered {
            id,
            table,
            partition: 0,
            offset: id,
        }
    }

    #[test]
    fn one_table_is_borrowed_and_several_are_split_in_table_order() {
        let one = [delivered(0, 1), delivered(0, 2)];
        let groups = group(&one);
        assert_eq!(groups.len(), 1);
        assert!(matches!(groups[0].1, Cow::Borrowed(_)));

        let mixed = [delivered(1, 1), delivered(0, 2), delivered(1, 3)];
        let failed = [DeliveryFailure {
            id: 9,
            table: 2,
            error: "e".into(),
            retry_delay: Duration::from_secs(1),
        }];
        let batch = WriteBack {
            delivered: &mixed,
            failed: &failed,
            ..WriteBack::default()
        };
        let parts = split_write_back(&batch);
        let tables: Vec<u16> = parts.iter().map(|p| p.table).collect();
        assert_eq!(tables, [0, 1, 2]);
        let ids = |p: &TableWriteBack<'_>| -> Vec<i64> {
            p.rows().delivered.iter().map(|d| d.id).collect()
        };
        assert_eq!(ids(&parts[0]), [2]);
        assert_eq!(ids(&parts[1]), [1, 3]);
        assert_eq!(parts[2].rows().failed.len(), 1);
        assert!(parts[2].rows().delivered.is_empty());
        assert!(split_write_back(&WriteBack::default()).is_empty());
    }

    #[test]
    fn claimed_rows_keep_their_tokens_in_their_table() {
        let token = |t: &str| ClaimToken(t.into());
        let rows = [(delivered(1, 5), token("a")), (delivered(0, 5), token("b"))];
        let batch = ClaimedWriteBack {
            delivered: &rows,
            ..ClaimedWriteBack::default()
        };
        let parts = split_claimed(&batch);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].rows().delivered[0].1, token("b"));
        assert_eq!(parts[1].rows().delivered[0].1, token("a"));
        let ids = ids_by_table(&[RowId { table: 1, id: 3 }, RowId { table: 0, id: 3 }]);
        assert_eq!(ids, [(0, vec![3]), (1, vec![3])]);
    }
}
