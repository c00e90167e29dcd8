//! One outbox table as the MySQL statements name it: the table quoted, and the columns
//! they address under the layout (outboxd's own, or where `outbox.columns` puts them on
//! the application's table, e.g. Debezium's with the integer row id `init --add-columns`
//! added). The status columns always have outboxd's names.

use std::fmt;

use outboxd_connector::OutboxLayout;
use outboxd_connector_kit::columns::{self, RowNames};
use outboxd_connector_kit::ColumnMap;

use crate::schema::{qualified, quote_ident};

/// One outbox table and the names of its columns, quoted for MySQL. Displays as the
/// quoted table name, so statements write `{outbox}` for it.
#[derive(Clone, Debug)]
pub(crate) struct OutboxTable {
    /// The table, quoted (`` `app`.`outbox` ``).
    pub(crate) quoted: String,
    /// The columns the statements name besides the status columns.
    pub(crate) names: RowNames,
    /// The select list of the claim fields for alias `o` ([`columns::claim_fields`]).
    pub(crate) select: String,
    /// Where each claim field is in a row of `select`; a claim's token follows them
    /// ([`ColumnMap::field_count`]).
    pub(crate) map: ColumnMap,
}

impl OutboxTable {
    /// The table `name` (as configured) under `layout`.
    pub(crate) fn new(name: &str, layout: &OutboxLayout) -> Self {
        let fields = columns::claim_fields(layout);
        let select = fields
            .iter()
            .map(|(_, column)| format!("o.{}", quote_ident(column)))
            .collect::<Vec<_>>()
            .join(", ");
        Self {
            quoted: qualified(name),
            names: RowNames::quoted(layout, quote_ident),
            select,
            map: ColumnMap::in_select_order(&fields, layout),
        }
    }
}

impl fmt::Display for OutboxTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.quoted)
    }
}
