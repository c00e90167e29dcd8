//! The SQL of `schemas/mysql/*.sql`, rendered for the configured table names, and the
//! quoting every other statement of this crate uses for names and values.
//!
//! The files are plain SQL for the `mysql` client with the default names; `init` runs the
//! same text with comment lines dropped and each backquoted default name replaced (see
//! [`render_all`]).

use outboxd_connector::OutboxLayout;

const OUTBOX_SQL: &str = include_str!("../../../schemas/mysql/outbox.sql");
const INBOX_SQL: &str = include_str!("../../../schemas/mysql/inbox.sql");
const CHECKPOINT_SQL: &str = include_str!("../../../schemas/mysql/checkpoint.sql");

/// `name` as a backquoted identifier: ``a`b`` → ```a``b```.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// A configured table name, optionally database-qualified (`app.outbox`), split in two.
/// Backquotes around either part are removed.
pub(crate) fn split_qualified(name: &str) -> (Option<String>, String) {
    let unquote = |s: &str| {
        let s = s.trim();
        match s.strip_prefix('`').and_then(|s| s.strip_suffix('`')) {
            Some(inner) => inner.replace("``", "`"),
            None => s.to_owned(),
        }
    };
    match name.split_once('.') {
        Some((db, table)) => (Some(unquote(db)), unquote(table)),
        None => (None, unquote(name)),
    }
}

/// A configured table name quoted for SQL: `app.outbox` → `` `app`.`outbox` ``.
pub(crate) fn qualified(name: &str) -> String {
    match split_qualified(name) {
        (Some(db), table) => format!("{}.{}", quote_ident(&db), quote_ident(&table)),
        (None, table) => quote_ident(&table),
    }
}

/// `(database, table)` of a configured name, the database defaulting to `default_db`.
pub(crate) fn table_ident(name: &str, default_db: &str) -> (String, String) {
    let (db, table) = split_qualified(name);
    (db.unwrap_or_else(|| default_db.to_owned()), table)
}

/// A string as an SQL expression that no `sql_mode` or character set can misread: its
/// UTF-8 bytes in a hex literal, converted to utf8mb4.
pub(crate) fn sql_string(s: &str) -> String {
    format!("CONVERT({} USING utf8mb4)", hex_literal(s.as_bytes()))
}

/// Bytes as a binary hex literal, `X'6f75'`.
pub(crate) fn hex_literal(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(bytes.len() * 2 + 3);
    out.push_str("X'");
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out.push('\'');
    out
}

/// The name of the outbox's retry index (`<table>_retry_due_idx`).
pub(crate) fn outbox_retry_index(layout: &OutboxLayout) -> String {
    format!("{}_retry_due_idx", split_qualified(layout.outbox_table()).1)
}

/// The name of poll mode's index of INIT rows (`<table>_poll_idx`).
pub(crate) fn outbox_poll_index(layout: &OutboxLayout) -> String {
    format!("{}_poll_idx", split_qualified(layout.outbox_table()).1)
}

/// The name of the inbox's due index (`<table>_due_idx`): claims, reaper, janitor.
pub(crate) fn inbox_due_index(layout: &OutboxLayout) -> String {
    format!("{}_due_idx", split_qualified(&layout.inbox_table).1)
}

/// The name of the inbox's per-key order index (`<table>_key_idx`).
pub(crate) fn inbox_key_index(layout: &OutboxLayout) -> String {
    format!("{}_key_idx", split_qualified(&layout.inbox_table).1)
}

/// One table's DDL, rendered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TableDdl {
    /// The configured table name.
    pub(crate) table: String,
    /// `(index name, columns)` of the indexes that are not keys, which `init` adds to an
    /// existing table when missing.
    pub(crate) indexes: Vec<(String, String)>,
    /// One statement.
    pub(crate) sql: String,
}

/// The DDL of the outbox table(s), the inbox and the checkpoint table for `layout`, in
/// that order.
pub(crate) fn render_all(layout: &OutboxLayout) -> Vec<TableDdl> {
    let narrowed = (0..layout.outbox_tables.len()).filter_map(|i| layout.for_table(i));
    let outboxes = narrowed.filter_map(|one| render_first(&one).into_iter().next());
    let [_, inbox, checkpoint] = render_first(layout);
    let features = layout.features;
    (outboxes.filter(|_| features.outbox))
        .chain(features.inbox.then_some(inbox))
        .chain(features.outbox.then_some(checkpoint))
        .collect()
}

/// The DDL of the layout's first outbox table, its inbox and checkpoint table.
fn render_first(layout: &OutboxLayout) -> [TableDdl; 3] {
    let outbox = split_qualified(layout.outbox_table()).1;
    let inbox = split_qualified(&layout.inbox_table).1;
    let render_with = |script: &str| {
        render(script, &|name: &str| match name {
            "outbox" => Some(qualified(layout.outbox_table())),
            "inbox" => Some(qualified(&layout.inbox_table)),
            "outboxd_checkpoint" => Some(qualified(&layout.checkpoint_table)),
            _ => {
                if let Some(rest) = name.strip_prefix("outbox_") {
                    Some(quote_ident(&format!("{outbox}_{rest}")))
                } else {
                    name.strip_prefix("inbox_")
                        .map(|rest| quote_ident(&format!("{inbox}_{rest}")))
                }
            }
        })
    };
    [
        TableDdl {
            table: layout.outbox_table().to_owned(),
            indexes: vec![
                (outbox_retry_index(layout), "next_retry_time, id".into()),
                (
                    format!("{outbox}_key_retry_idx"),
                    "biz_key, next_retry_time, id".into(),
                ),
            ],
            sql: render_with(OUTBOX_SQL),
        },
        TableDdl {
            table: layout.inbox_table.clone(),
            indexes: vec![
                (
                    inbox_due_index(layout),
                    "status, next_retry_time, id".into(),
                ),
                (inbox_key_index(layout), "biz_key, status, id".into()),
            ],
            sql: render_with(INBOX_SQL),
        },
        TableDdl {
            table: layout.checkpoint_table.clone(),
            indexes: Vec::new(),
            sql: render_with(CHECKPOINT_SQL),
        },
    ]
}

/// Drops whole-line comments and replaces each backquoted identifier for which `rename`
/// has a replacement (the replacement is already quoted).
fn render(script: &str, rename: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(script.len());
    for line in script.lines() {
        if line.trim_start().starts_with("--") || line.trim().is_empty() {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find('`') {
            out.push_str(&rest[..start]);
            let after = &rest[start + 1..];
            let Some(end) = after.find('`') else {
                out.push_str(&rest[start..]);
                rest = "";
                break;
            };
            let name = &after[..end];
            match rename(name) {
                Some(replacement) => out.push_str(&replacement),
                None => {
                    out.push('`');
                    out.push_str(name);
                    out.push('`');
                }
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_names_and_values() {
        assert_eq!(quote_ident("outbox"), "`outbox`");
        assert_eq!(quote_ident("a`b"), "`a``b`");
        assert_eq!(qualified("app.outbox"), "`app`.`outbox`");
        assert_eq!(qualified("`app`.`out``box`"), "`app`.`out``box`");
        assert_eq!(table_ident("outbox", "db"), ("db".into(), "outbox".into()));
        assert_eq!(table_ident("x.outbox", "db"), ("x".into(), "outbox".into()));
        assert_eq!(hex_literal(b"\x00'\\"), "X'00275C'");
        assert_eq!(sql_string(""), "CONVERT(X'' USING utf8mb4)");
    }

    #[test]
    fn renders_default_layout_as_the_files_say() {
        let ddl = render_all(&OutboxLayout::default());
        assert_eq!(ddl.len(), 3);
        let outbox = &ddl[0].sql;
        assert!(
            outbox.starts_with("CREATE TABLE IF NOT EXISTS `outbox` ("),
            "{outbox}"
        );
        assert!(outbox.contains("KEY `outbox_retry_due_idx` (next_retry_time, id)"));
        assert!(outbox.contains("CONSTRAINT `outbox_status_check`"));
        assert!(
            !outbox.contains("-- outboxd"),
            "comment lines are dropped: {outbox}"
        );
        let inbox = &ddl[1];
        assert!(inbox
            .sql
            .contains("KEY `inbox_due_idx` (status, next_retry_time, id)"));
        assert!(inbox
            .sql
            .contains("KEY `inbox_key_idx` (biz_key, status, id)"));
        assert!(!inbox.sql.contains("inbox_claim_idx"), "{}", inbox.sql);
        // What init adds to an existing table is what the file creates.
        for (name, columns) in &inbox.indexes {
            assert!(
                inbox.sql.contains(&format!("KEY `{name}` ({columns})")),
                "{name}"
            );
        }
        assert!(ddl[2].sql.contains("`outboxd_checkpoint`"));
    }

    #[test]
    fn renders_qualified_names_with_their_stems() {
        let ddl = render_all(&OutboxLayout::with_tables(
            "app.orders_outbox",
            "app.Inbox",
            "ops.ckpt",
        ));
        let outbox = &ddl[0].sql;
        assert!(outbox.contains("CREATE TABLE IF NOT EXISTS `app`.`orders_outbox` ("));
        assert!(outbox.contains("`orders_outbox_retry_due_idx`"));
        assert!(outbox.contains("`orders_outbox_status_check`"));
        assert!(outbox.contains("`orders_outbox_type_key_key`"));
        assert!(ddl[1].sql.contains("`app`.`Inbox`"));
        assert!(ddl[1]
            .sql
            .contains("KEY `Inbox_due_idx` (status, next_retry_time, id)"));
        assert!(ddl[1]
            .sql
            .contains("KEY `Inbox_key_idx` (biz_key, status, id)"));
        assert_eq!(ddl[1].indexes[0].0, "Inbox_due_idx");
        assert_eq!(ddl[1].indexes[1].0, "Inbox_key_idx");
        assert!(ddl[2].sql.contains("`ops`.`ckpt`"));
        assert_eq!(ddl[0].indexes[0].0, "orders_outbox_retry_due_idx");
    }
}
