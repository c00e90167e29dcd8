//! The SQL of `schemas/postgres/*.sql`, rendered for the configured table names, and the
//! quoting every other SQL statement of this crate uses for configured names.
//!
//! The files are written for `psql -v name=value -f file.sql`; `init` runs the same text:
//! psql meta-command lines (starting with `\`) and whole-line comments are dropped and each
//! `:"variable"` becomes the quoted identifier from the [`OutboxLayout`].

use outboxd_connector::OutboxLayout;

const OUTBOX_SQL: &str = include_str!("../../../schemas/postgres/outbox.sql");
const INBOX_SQL: &str = include_str!("../../../schemas/postgres/inbox.sql");
const CHECKPOINT_SQL: &str = include_str!("../../../schemas/postgres/checkpoint.sql");
const OUTBOX_POLL_SQL: &str = include_str!("../../../schemas/postgres/outbox_poll.sql");

/// `name` as a quoted SQL identifier: `order"s` → `"order""s"`. Names are taken literally,
/// so `Outbox` stays upper-case.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A configured table name, optionally schema-qualified, split in two and unquoted.
///
/// Names are taken as written, so `App.OutBox` is `"App"."OutBox"` (the case is kept, as
/// `init` creates it). A part in double quotes is unquoted: `"OutBox"` is `OutBox`, `""`
/// inside stands for one quote and a dot inside does not split (`"my.app"."Out""box"`).
/// Without a schema the server finds the table through the role's `search_path`, as for
/// any unqualified name in SQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TableName {
    pub(crate) schema: Option<String>,
    pub(crate) table: String,
}

impl TableName {
    pub(crate) fn parse(name: &str) -> Self {
        // The first dot outside double quotes separates the schema.
        let mut quoted = false;
        let dot = name.char_indices().find_map(|(i, c)| match c {
            '"' => {
                quoted = !quoted;
                None
            }
            '.' if !quoted => Some(i),
            _ => None,
        });
        match dot {
            Some(at) => Self {
                schema: Some(unquote(&name[..at])),
                table: unquote(&name[at + 1..]),
            },
            None => Self {
                schema: None,
                table: unquote(name),
            },
        }
    }

    /// Quoted for SQL: `"app"."outbox"`, or `"outbox"` when unqualified.
    pub(crate) fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", quote_ident(schema), quote_ident(&self.table)),
            None => quote_ident(&self.table),
        }
    }
}

/// `"Out""box"` → `Out"box`; a part not in double quotes is taken as written.
fn unquote(part: &str) -> String {
    match part
        .strip_prefix('"')
        .and_then(|inner| inner.strip_suffix('"'))
    {
        Some(inner) => inner.replace("\"\"", "\""),
        None => part.to_owned(),
    }
}

/// A configured table name quoted for SQL: `app.outbox` → `"app"."outbox"`,
/// `outbox` → `"outbox"`, `"OutBox"` → `"OutBox"`. The one spelling of a configured name
/// that every statement of this crate uses, so `init`, `check`, the store and the
/// replication stream all find the same table.
pub(crate) fn qualified(name: &str) -> String {
    TableName::parse(name).quoted()
}

/// The table's name without its schema, the stem of its index names.
pub(crate) fn base_name(name: &str) -> String {
    TableName::parse(name).table
}

/// The name of the outbox's retry index (`<table>_retry_due_idx`).
pub(crate) fn outbox_retry_index(layout: &OutboxLayout) -> String {
    format!("{}_retry_due_idx", base_name(layout.outbox_table()))
}

/// The name of the outbox's strict-ordering index (`<table>_key_retry_idx`).
pub(crate) fn outbox_key_retry_index(layout: &OutboxLayout) -> String {
    format!("{}_key_retry_idx", base_name(layout.outbox_table()))
}

/// The name of poll mode's index of INIT rows (`<table>_poll_idx`).
pub(crate) fn outbox_poll_index(layout: &OutboxLayout) -> String {
    format!("{}_poll_idx", base_name(layout.outbox_table()))
}

/// The name of the inbox's claim index (`<table>_claim_idx`).
pub(crate) fn inbox_claim_index(layout: &OutboxLayout) -> String {
    format!("{}_claim_idx", base_name(&layout.inbox_table))
}

/// The name of the inbox's per-key order index (`<table>_key_idx`).
pub(crate) fn inbox_key_index(layout: &OutboxLayout) -> String {
    format!("{}_key_idx", base_name(&layout.inbox_table))
}

/// One table's DDL, rendered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TableDdl {
    /// The configured (unquoted) table name.
    pub(crate) table: String,
    /// Index names created next to it (unqualified; indexes live in the table's schema).
    pub(crate) indexes: Vec<String>,
    /// The statements, ready for a simple-query `batch_execute`.
    pub(crate) sql: String,
}

/// The DDL of the outbox table(s), the inbox and the checkpoint table for `layout`, in
/// that order.
pub(crate) fn render_all(layout: &OutboxLayout) -> Vec<TableDdl> {
    let claim_index = inbox_claim_index(layout);
    let key_index = inbox_key_index(layout);
    let vars = variables(layout);
    let outboxes = each_outbox(layout).map(|one| TableDdl {
        table: one.outbox_table().to_owned(),
        indexes: vec![outbox_retry_index(&one), outbox_key_retry_index(&one)],
        sql: render(OUTBOX_SQL, &variables(&one)),
    });
    let inbox = TableDdl {
        table: layout.inbox_table.clone(),
        indexes: vec![claim_index, key_index],
        sql: render(INBOX_SQL, &vars),
    };
    let checkpoint = TableDdl {
        table: layout.checkpoint_table.clone(),
        indexes: Vec::new(),
        sql: render(CHECKPOINT_SQL, &vars),
    };
    let features = layout.features;
    (outboxes.filter(|_| features.outbox))
        .chain(features.inbox.then_some(inbox))
        .chain(features.outbox.then_some(checkpoint))
        .collect()
}

/// Poll mode's index of INIT rows, one per outbox table (see
/// `schemas/postgres/outbox_poll.sql` for why it is optional).
pub(crate) fn render_poll_indexes(layout: &OutboxLayout) -> Vec<TableDdl> {
    each_outbox(layout)
        .map(|one| TableDdl {
            table: one.outbox_table().to_owned(),
            indexes: vec![outbox_poll_index(&one)],
            sql: render(OUTBOX_POLL_SQL, &variables(&one)),
        })
        .collect()
}

/// The layout narrowed to each of its outbox tables in turn.
fn each_outbox(layout: &OutboxLayout) -> impl Iterator<Item = OutboxLayout> + '_ {
    (0..layout.outbox_tables.len()).filter_map(|i| layout.for_table(i))
}

/// The values of the scripts' `:"variables"`.
fn variables(layout: &OutboxLayout) -> Vec<(&'static str, String)> {
    vec![
        ("outbox_table", qualified(layout.outbox_table())),
        (
            "outbox_retry_index",
            quote_ident(&outbox_retry_index(layout)),
        ),
        (
            "outbox_key_retry_index",
            quote_ident(&outbox_key_retry_index(layout)),
        ),
        ("outbox_poll_index", quote_ident(&outbox_poll_index(layout))),
        ("inbox_table", qualified(&layout.inbox_table)),
        ("inbox_claim_index", quote_ident(&inbox_claim_index(layout))),
        ("inbox_key_index", quote_ident(&inbox_key_index(layout))),
        ("checkpoint_table", qualified(&layout.checkpoint_table)),
    ]
}

/// Renders a psql script: drops meta-command and whole-line comment lines, substitutes
/// `:"var"` with the value from `vars`. Unknown variables are left as they are (the
/// server then rejects the statement; the unit tests make sure none are left).
fn render(script: &str, vars: &[(&str, String)]) -> String {
    let mut out = String::with_capacity(script.len());
    for line in script.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('\\') || trimmed.starts_with("--") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find(":\"") {
            out.push_str(&rest[..at]);
            let after = &rest[at + 2..];
            let replaced = after.find('"').and_then(|end| {
                let name = &after[..end];
                let value = vars.iter().find(|(var, _)| *var == name)?;
                Some((value.1.as_str(), end))
            });
            match replaced {
                Some((value, end)) => {
                    out.push_str(value);
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str(":\"");
                    rest = after;
                }
            }
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
    fn quotes_identifiers_and_qualified_names() {
        assert_eq!(quote_ident("outbox"), "\"outbox\"");
        assert_eq!(quote_ident("Out\"box"), "\"Out\"\"box\"");
        assert_eq!(qualified("outbox"), "\"outbox\"");
        assert_eq!(qualified("app.outbox"), "\"app\".\"outbox\"");
        assert_eq!(base_name("app.outbox"), "outbox");
        assert_eq!(
            TableName::parse("app.outbox"),
            TableName {
                schema: Some("app".into()),
                table: "outbox".into()
            }
        );
    }

    #[test]
    fn parses_quoted_and_mixed_case_names() {
        let parse = |name: &str| {
            let t = TableName::parse(name);
            (t.schema, t.table)
        };
        // Bare names are taken as written, case included.
        assert_eq!(parse("OutBox"), (None, "OutBox".into()));
        assert_eq!(parse("App.OutBox"), (Some("App".into()), "OutBox".into()));
        // Quotes are removed; a doubled quote is one; a dot inside quotes does not split.
        assert_eq!(parse("\"OutBox\""), (None, "OutBox".into()));
        assert_eq!(
            parse("\"my.app\".\"Out\"\"box\""),
            (Some("my.app".into()), "Out\"box".into())
        );
        assert_eq!(parse("app.\"a.b\""), (Some("app".into()), "a.b".into()));
        assert_eq!(qualified("\"OutBox\""), "\"OutBox\"");
        assert_eq!(qualified("\"My.App\".OutBox"), "\"My.App\".\"OutBox\"");
        assert_eq!(qualified("\"Out\"\"box\""), "\"Out\"\"box\"");
        assert_eq!(base_name("\"My.App\".\"OutBox\""), "OutBox");
        assert_eq!(
            outbox_retry_index(&OutboxLayout::with_tables("\"OutBox\"", "i", "c")),
            "OutBox_retry_due_idx"
        );
    }

    #[test]
    fn renders_default_layout() {
        let ddl = render_all(&OutboxLayout::default());
        assert_eq!(ddl.len(), 3);
        let outbox = &ddl[0].sql;
        assert!(
            outbox.contains("CREATE TABLE IF NOT EXISTS \"outbox\" ("),
            "{outbox}"
        );
        assert!(
            outbox.contains("CREATE INDEX IF NOT EXISTS \"outbox_retry_due_idx\""),
            "{outbox}"
        );
        assert!(
            outbox.contains("ON \"outbox\" (next_retry_time, id)"),
            "{outbox}"
        );
        assert_eq!(
            ddl[0].indexes,
            ["outbox_retry_due_idx", "outbox_key_retry_idx"]
        );
        assert!(
            outbox.contains("ON \"outbox\" (biz_key, id) WHERE next_retry_time IS NOT NULL"),
            "{outbox}"
        );
        assert!(ddl[1]
            .sql
            .contains("CREATE TABLE IF NOT EXISTS \"inbox\" ("));
        assert!(ddl[1]
            .sql
            .contains("CREATE INDEX IF NOT EXISTS \"inbox_claim_idx\""));
        assert!(ddl[2]
            .sql
            .contains("CREATE TABLE IF NOT EXISTS \"outboxd_checkpoint\" ("));
    }

    #[test]
    fn renders_schema_qualified_layout_without_leftovers() {
        let ddl = render_all(&OutboxLayout::with_tables(
            "app.orders_outbox",
            "app.Inbox",
            "ops.ckpt",
        ));
        let outbox = &ddl[0].sql;
        assert!(outbox.contains("CREATE TABLE IF NOT EXISTS \"app\".\"orders_outbox\" ("));
        assert!(outbox.contains("\"orders_outbox_retry_due_idx\""));
        assert!(outbox.contains("ON \"app\".\"orders_outbox\" (next_retry_time, id)"));
        assert!(ddl[1].sql.contains("\"app\".\"Inbox\""));
        assert!(ddl[1].sql.contains("\"Inbox_claim_idx\""));
        assert!(ddl[2].sql.contains("\"ops\".\"ckpt\""));
        for table in &ddl {
            assert!(!table.sql.contains(":\""), "variable left in {}", table.sql);
            assert!(!table.sql.lines().any(|l| l.trim_start().starts_with('\\')));
            // The column definitions survive, inline comments included.
            assert!(table.sql.contains("PRIMARY KEY"));
        }
        assert!(outbox.contains("WITH (fillfactor = 80)"));
        let mut layout = OutboxLayout::with_tables("app.orders_outbox", "i", "c");
        layout.outbox_tables.push("billing.outbox".into());
        let polls = render_poll_indexes(&layout);
        assert_eq!(polls.len(), 2);
        assert!(polls[1].sql.contains("ON \"billing\".\"outbox\""));
        // Several tables: each gets its own table DDL and indexes, before inbox and checkpoint.
        let all = render_all(&layout);
        let tables: Vec<&str> = all.iter().map(|d| d.table.as_str()).collect();
        assert_eq!(tables, ["app.orders_outbox", "billing.outbox", "i", "c"]);
        assert_eq!(
            all[1].indexes,
            ["outbox_retry_due_idx", "outbox_key_retry_idx"]
        );
        assert!(all[1].sql.contains("\"billing\".\"outbox\""));
        let poll = &polls[0];
        assert_eq!(poll.indexes, ["orders_outbox_poll_idx"]);
        assert!(
            poll.sql.contains(
                "CREATE INDEX IF NOT EXISTS \"orders_outbox_poll_idx\"\n    ON \"app\".\"orders_outbox\" (id) WHERE status = 'INIT'"
            ),
            "{}",
            poll.sql
        );
        assert!(!poll.sql.contains(":\""));
    }

    #[test]
    fn render_keeps_unknown_variables_and_plain_colons() {
        let vars = [("t", "\"x\"".to_string())];
        assert_eq!(
            render("\\set t y\nSELECT 1::int FROM :\"t\", :\"u\";", &vars),
            "SELECT 1::int FROM \"x\", :\"u\";\n"
        );
    }
}
