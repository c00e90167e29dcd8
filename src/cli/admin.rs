//! The operator's commands — `outboxd status`, `retry`, `park`, `resolve`, `janitor` —
//! over any connector's [`TableAdmin`]: its outbox store, or with `--inbox` its inbox
//! store. Both implement the one trait, so [`run`] is written once; the table's
//! [`TableKind`] names its statuses in the output ([`TableWords`]) and the inbox's
//! deduplication window reaches its janitor in the [`JanitorRule`]. Each result is
//! printed as a readable table or, with `--json`, as one JSON document on stdout.
//!
//! Exit codes: 0 when done; 1 when a command naming one row (`--id`) changed nothing (no
//! such row, or not in a status the command applies to), so scripts can tell.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};

use humantime_serde::re::humantime;
use outboxd_connector::{
    JanitorAction, JanitorRule, RetrySelector, StatusSummary, TableAdmin, TableKind,
};
use serde::Serialize;

/// How the output of one table speaks of its rows, besides the status names its
/// [`TableKind`] gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableWords {
    /// The table, with its statuses.
    pub table: TableKind,
    /// What a finished row was (`sent`, `handled`).
    pub done_verb: &'static str,
    /// The start of `last_error` after `resolve`.
    pub resolved_note: &'static str,
    /// How the output names one row (`row`, `inbox row`).
    pub row: &'static str,
    /// Who waits behind a parked row.
    pub later: &'static str,
    /// What the later rows of a key are (`events`, `messages`).
    pub items: &'static str,
    /// The flag the commands need for this table (`` or ` --inbox`).
    pub flag: &'static str,
}

/// The outbox's words.
pub const OUTBOX: TableWords = TableWords {
    table: TableKind::Outbox,
    done_verb: "sent",
    resolved_note: "resolved by operator without sending",
    row: "row",
    later: "with strict ordering later events",
    items: "events",
    flag: "",
};

/// The inbox's words.
pub const INBOX: TableWords = TableWords {
    table: TableKind::Inbox,
    done_verb: "handled",
    resolved_note: "resolved by operator without handling",
    row: "inbox row",
    later: "later messages",
    items: "messages",
    flag: " --inbox",
};

impl TableWords {
    /// The words of `table`.
    pub const fn of(table: TableKind) -> Self {
        match table {
            TableKind::Outbox => OUTBOX,
            TableKind::Inbox => INBOX,
        }
    }
}

/// Rows per janitor batch unless `--batch` says otherwise.
pub const DEFAULT_JANITOR_BATCH: usize = 1000;

/// One operator command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminCommand {
    /// Counts by status and message type, oldest unsent row, log lag, checkpoint.
    Status,
    /// Make FAILED / MANUAL_REQUIRED rows due now.
    Retry(RetrySelector),
    /// Take one INIT or FAILED row out of automatic retries.
    Park {
        /// Outbox row id.
        id: i64,
        /// Recorded in `last_error`.
        reason: String,
    },
    /// Skip one unsent row for good (SUCCESS without sending).
    Resolve {
        /// Outbox row id.
        id: i64,
        /// Recorded in `last_error`.
        reason: String,
    },
    /// Delete or archive SUCCESS rows older than a retention, batch by batch.
    Janitor {
        /// Rows sent longer ago than this go.
        older_than: Duration,
        /// Move them into this table instead of deleting them.
        archive_table: Option<String>,
        /// Rows per transaction.
        batch: usize,
    },
}

/// How the result is printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputFormat {
    /// Readable text and tables.
    #[default]
    Text,
    /// One JSON document on stdout (janitor progress goes to stderr).
    Json,
}

/// What the output names — the pipeline and the table acted on — and what the
/// configuration adds to a command.
#[derive(Clone, Debug)]
pub struct AdminContext {
    /// `pipeline.name`.
    pub pipeline: String,
    /// The table as configured (the outbox, or with `--inbox` the inbox).
    pub table: String,
    /// The inbox's deduplication window (`inbox.dedupe_retention`), which its janitor
    /// never cuts into; `None` for the outbox ([`JanitorRule::dedupe_window`]).
    pub dedupe_window: Option<Duration>,
}

/// Runs `command` against `store` (an outbox or inbox store), printing its result;
/// returns the exit code.
pub async fn run<S: TableAdmin>(
    store: &S,
    context: &AdminContext,
    command: &AdminCommand,
    format: OutputFormat,
) -> anyhow::Result<i32> {
    let json = format == OutputFormat::Json;
    let w = TableWords::of(S::TABLE);
    let (output, code) = match command {
        AdminCommand::Status => {
            let summary = store.status_summary().await?;
            let now = SystemTime::now();
            let output = if json {
                to_json(&StatusJson::new(context, w, &summary, now))?
            } else {
                render_status(context, w, &summary, now)
            };
            (output, 0)
        }
        AdminCommand::Retry(selector) => {
            let rows = store.retry_rows(selector).await?;
            let code = i32::from(matches!(selector, RetrySelector::Id(_)) && rows == 0);
            let output = if json {
                to_json(&RowsJson {
                    command: "retry",
                    selection: describe_selector(selector),
                    rows,
                })?
            } else if rows == 0 {
                format!(
                    "retry: no rows changed ({}: none in FAILED or MANUAL_REQUIRED)",
                    describe_selector(selector)
                )
            } else {
                format!(
                    "retry: {rows} {}(s) due now ({}): status FAILED, retry_count 0; a running \
                     outboxd picks them up with its next retry round",
                    w.row,
                    describe_selector(selector)
                )
            };
            (output, code)
        }
        AdminCommand::Park { id, reason } => {
            let changed = store.park_row(*id, reason).await?;
            let text = if changed {
                format!(
                    "park: {} {id} is MANUAL_REQUIRED, last_error \"parked by operator: {reason}\"; \
                     {} of its biz_key wait for it \
                     (`outboxd retry{flag} --id {id}` or `outboxd resolve{flag} --id {id}` releases them)",
                    w.row,
                    w.later,
                    flag = w.flag
                )
            } else {
                format!(
                    "park: {} {id} unchanged (no such row, or not {} or FAILED)",
                    w.row,
                    w.table.new_status()
                )
            };
            one_row("park", *id, changed, reason, text, json)?
        }
        AdminCommand::Resolve { id, reason } => {
            let changed = store.resolve_row(*id, reason).await?;
            let text = if changed {
                format!(
                    "resolve: {} {id} is {} without being {}, last_error \"{}: {reason}\"; \
                     later {} of its biz_key are released",
                    w.row,
                    w.table.finished_status(),
                    w.done_verb,
                    w.resolved_note,
                    w.items
                )
            } else {
                format!(
                    "resolve: {} {id} unchanged (no such row, or already {})",
                    w.row,
                    w.table.finished_status()
                )
            };
            one_row("resolve", *id, changed, reason, text, json)?
        }
        AdminCommand::Janitor {
            older_than,
            archive_table,
            batch,
        } => {
            let rule = JanitorRule {
                older_than: *older_than,
                dedupe_window: context.dedupe_window,
                action: match archive_table {
                    Some(table) => JanitorAction::Archive(table.clone()),
                    None => JanitorAction::Delete,
                },
            };
            let report = janitor(store, &rule, *batch, json).await?;
            let output = if json {
                to_json(&report)?
            } else {
                format!(
                    "janitor done: {} {} {}(s) older than {} {} in {} batch(es), {:.1}s",
                    report.rows,
                    w.table.finished_status(),
                    w.row,
                    report.older_than,
                    report.verb(),
                    report.batches,
                    report.seconds
                )
            };
            (output, 0)
        }
    };
    println!("{output}");
    Ok(code)
}

fn one_row(
    command: &'static str,
    id: i64,
    changed: bool,
    reason: &str,
    text: String,
    json: bool,
) -> anyhow::Result<(String, i32)> {
    let output = if json {
        to_json(&OneRowJson {
            command,
            id,
            changed,
            reason,
        })?
    } else {
        text
    };
    Ok((output, i32::from(!changed)))
}

fn to_json(value: &impl Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(value)?)
}

fn describe_selector(selector: &RetrySelector) -> String {
    match selector {
        RetrySelector::Id(id) => format!("id {id}"),
        RetrySelector::Status {
            status,
            message_type: None,
        } => format!("status {status}"),
        RetrySelector::Status {
            status,
            message_type: Some(t),
        } => format!("status {status}, type {t}"),
    }
}

/// Janitor batches until one removes nothing; progress after every batch (stdout for
/// text, stderr for JSON so stdout stays one document).
async fn janitor<S: TableAdmin>(
    store: &S,
    rule: &JanitorRule,
    batch: usize,
    json: bool,
) -> anyhow::Result<JanitorJson> {
    let started = Instant::now();
    let action = &rule.action;
    let mut report = JanitorJson {
        command: "janitor",
        action: match action {
            JanitorAction::Delete => "delete",
            JanitorAction::Archive(_) => "archive",
        },
        archive_table: match action {
            JanitorAction::Archive(t) => Some(t.clone()),
            JanitorAction::Delete => None,
        },
        older_than: humantime::format_duration(rule.older_than).to_string(),
        batch_size: batch,
        rows: 0,
        batches: 0,
        seconds: 0.0,
    };
    loop {
        let n = store.janitor_batch(rule, batch).await?;
        report.seconds = started.elapsed().as_secs_f64();
        if n == 0 {
            break;
        }
        report.rows += n;
        report.batches += 1;
        let rate = report.rows as f64 / report.seconds.max(0.001);
        let line = format!(
            "janitor: batch {}: {n} row(s) {}, {} so far, {rate:.0} rows/s",
            report.batches,
            report.verb(),
            report.rows
        );
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
        // A short batch means the old rows are gone; one more call would only confirm it.
        if usize::try_from(n).is_ok_and(|n| n < batch) {
            break;
        }
    }
    Ok(report)
}

#[derive(Serialize)]
struct RowsJson {
    command: &'static str,
    selection: String,
    rows: u64,
}

#[derive(Serialize)]
struct OneRowJson<'a> {
    command: &'static str,
    id: i64,
    changed: bool,
    reason: &'a str,
}

#[derive(Serialize)]
struct JanitorJson {
    command: &'static str,
    action: &'static str,
    archive_table: Option<String>,
    older_than: String,
    batch_size: usize,
    rows: u64,
    batches: u64,
    seconds: f64,
}

impl JanitorJson {
    fn verb(&self) -> String {
        match &self.archive_table {
            Some(table) => format!("moved to {table}"),
            None => "deleted".to_owned(),
        }
    }
}

#[derive(Serialize)]
struct StatusJson {
    pipeline: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    outbox_table: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inbox_table: Option<String>,
    counts: Vec<CountJson>,
    totals: BTreeMap<String, i64>,
    oldest_unsent: Option<String>,
    oldest_unsent_age_seconds: Option<f64>,
    source_lag_bytes: Option<u64>,
    checkpoint: Option<CheckpointJson>,
}

#[derive(Serialize)]
struct CountJson {
    status: String,
    message_type: String,
    rows: i64,
}

#[derive(Serialize)]
struct CheckpointJson {
    position: String,
    updated_at: String,
    age_seconds: f64,
}

impl StatusJson {
    fn new(
        context: &AdminContext,
        w: TableWords,
        summary: &StatusSummary,
        now: SystemTime,
    ) -> Self {
        let mut totals = BTreeMap::new();
        for c in &summary.counts {
            *totals.entry(c.status.clone()).or_insert(0) += c.rows;
        }
        Self {
            pipeline: context.pipeline.clone(),
            outbox_table: (w.table == TableKind::Outbox).then(|| context.table.clone()),
            inbox_table: (w.table == TableKind::Inbox).then(|| context.table.clone()),
            counts: summary
                .counts
                .iter()
                .map(|c| CountJson {
                    status: c.status.clone(),
                    message_type: c.message_type.clone(),
                    rows: c.rows,
                })
                .collect(),
            totals,
            oldest_unsent: summary.oldest_unsent.map(rfc3339),
            oldest_unsent_age_seconds: summary.oldest_unsent.map(|t| age(now, t).as_secs_f64()),
            source_lag_bytes: summary.source_lag_bytes,
            checkpoint: summary
                .checkpoint
                .as_ref()
                .map(|(position, at)| CheckpointJson {
                    position: position.to_string(),
                    updated_at: rfc3339(*at),
                    age_seconds: age(now, *at).as_secs_f64(),
                }),
        }
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// How long before `now` `t` was (zero for a time in the future, e.g. clock skew).
fn age(now: SystemTime, t: SystemTime) -> Duration {
    now.duration_since(t).unwrap_or_default()
}

/// `1h 2m 3s`-style, at most two units, for ages shown to people.
fn short_age(d: Duration) -> String {
    let secs = d.as_secs();
    let (days, hours, mins, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (days, hours, mins) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, m) => format!("{m}m {s}s"),
        (0, h, m) => format!("{h}h {m}m"),
        (d, h, _) => format!("{d}d {h}h"),
    }
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut value = n as f64;
    let mut unit = "bytes";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    format!("{value:.1} {unit} ({n} bytes)")
}

/// The readable `outboxd status`: a message type × status table with totals, then the
/// oldest unsent row, the log lag and the checkpoint.
fn render_status(
    context: &AdminContext,
    w: TableWords,
    summary: &StatusSummary,
    now: SystemTime,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pipeline {} — {} {}",
        context.pipeline,
        w.table.name(),
        context.table
    );
    let _ = writeln!(out);

    // Columns: the known statuses in state-machine order, then any unexpected one.
    let mut columns: Vec<String> = (w.table.statuses().iter())
        .map(|s| (*s).to_owned())
        .collect();
    for c in &summary.counts {
        if !columns.contains(&c.status) {
            columns.push(c.status.clone());
        }
    }
    let mut rows: BTreeMap<&str, BTreeMap<&str, i64>> = BTreeMap::new();
    for c in &summary.counts {
        *rows
            .entry(c.message_type.as_str())
            .or_default()
            .entry(c.status.as_str())
            .or_insert(0) += c.rows;
    }
    let mut table: Vec<Vec<String>> = Vec::new();
    let mut header = vec!["MESSAGE TYPE".to_owned()];
    header.extend(columns.iter().cloned());
    header.push("TOTAL".to_owned());
    table.push(header);
    let mut totals = vec![0i64; columns.len()];
    for (message_type, counts) in &rows {
        let mut line = vec![(*message_type).to_owned()];
        let mut sum = 0;
        for (i, status) in columns.iter().enumerate() {
            let n = counts.get(status.as_str()).copied().unwrap_or(0);
            totals[i] += n;
            sum += n;
            line.push(n.to_string());
        }
        line.push(sum.to_string());
        table.push(line);
    }
    let mut total_line = vec!["(all)".to_owned()];
    total_line.extend(totals.iter().map(i64::to_string));
    total_line.push(totals.iter().sum::<i64>().to_string());
    table.push(total_line);

    let widths: Vec<usize> = (0..table[0].len())
        .map(|col| {
            table
                .iter()
                .map(|r| r[col].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in &table {
        let mut line = String::new();
        for (col, cell) in row.iter().enumerate() {
            let pad = widths[col].saturating_sub(cell.chars().count());
            if col == 0 {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str("  ");
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let _ = writeln!(out);

    let oldest = match summary.oldest_unsent {
        Some(t) => format!("{} ago ({})", short_age(age(now, t)), rfc3339(t)),
        None => format!("none (no {} or FAILED rows)", w.table.new_status()),
    };
    let lag = match summary.source_lag_bytes {
        Some(n) => format!("{} behind the server", bytes(n)),
        None => "unknown (no replication slot or binlog position to compare)".to_owned(),
    };
    let checkpoint = match &summary.checkpoint {
        Some((position, at)) => format!(
            "{position}, written {} ago ({})",
            short_age(age(now, *at)),
            rfc3339(*at)
        ),
        None => "none yet".to_owned(),
    };
    if w.table == TableKind::Inbox {
        let _ = write!(out, "oldest pending: {oldest}");
        return out;
    }
    let _ = writeln!(out, "oldest unsent:  {oldest}");
    let _ = writeln!(out, "log lag:        {lag}");
    let _ = write!(out, "checkpoint:     {checkpoint}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxd_connector::{Position, StatusCount};

    fn count(status: &str, message_type: &str, rows: i64) -> StatusCount {
        StatusCount {
            status: status.into(),
            message_type: message_type.into(),
            rows,
        }
    }

    fn context() -> AdminContext {
        AdminContext {
            pipeline: "orders".into(),
            table: "public.outbox".into(),
            dedupe_window: None,
        }
    }

    #[test]
    fn status_table_pivots_types_against_statuses() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let position = Position::new(0x16B_3748, "lsn:0/16B3748");
        let summary = StatusSummary {
            counts: vec![
                count("FAILED", "order.created", 2),
                count("INIT", "order.created", 10),
                count("SUCCESS", "order.created", 1200),
                count("MANUAL_REQUIRED", "payment.done", 1),
            ],
            oldest_unsent: Some(now - Duration::from_secs(192)),
            checkpoint: Some((position, now - Duration::from_secs(4))),
            source_lag_bytes: Some(3 * 1024 * 1024),
        };
        let text = render_status(&context(), OUTBOX, &summary, now);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "pipeline orders — outbox public.outbox");
        assert_eq!(
            lines[2],
            "MESSAGE TYPE   INIT  PROCESSING  FAILED  MANUAL_REQUIRED  SUCCESS  TOTAL"
        );
        assert_eq!(
            lines[3],
            "order.created    10           0       2                0     1200   1212"
        );
        assert_eq!(
            lines[4],
            "payment.done      0           0       0                1        0      1"
        );
        assert_eq!(
            lines[5],
            "(all)            10           0       2                1     1200   1213"
        );
        assert!(text.contains("oldest unsent:  3m 12s ago ("), "{text}");
        assert!(
            text.contains("log lag:        3.0 MiB (3145728 bytes) behind"),
            "{text}"
        );
        assert!(
            text.contains("checkpoint:     lsn:0/16B3748, written 4s ago"),
            "{text}"
        );

        let json =
            serde_json::to_value(StatusJson::new(&context(), OUTBOX, &summary, now)).unwrap();
        assert_eq!(json["totals"]["INIT"], 10);
        assert_eq!(json["counts"].as_array().map(Vec::len), Some(4));
        assert_eq!(json["oldest_unsent_age_seconds"], 192.0);
        assert_eq!(json["checkpoint"]["position"], "lsn:0/16B3748");
        assert_eq!(json["source_lag_bytes"], 3_145_728);
    }

    #[test]
    fn empty_outbox_renders_without_rows() {
        let text = render_status(
            &context(),
            OUTBOX,
            &StatusSummary::default(),
            SystemTime::now(),
        );
        assert!(text.contains("(all)"), "{text}");
        assert!(text.contains("none (no INIT or FAILED rows)"), "{text}");
        assert!(text.contains("checkpoint:     none yet"), "{text}");
    }

    #[test]
    fn the_inbox_status_names_the_inbox_statuses() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let summary = StatusSummary {
            counts: vec![count("PENDING", "t", 2), count("DONE", "t", 5)],
            oldest_unsent: Some(now - Duration::from_secs(5)),
            ..StatusSummary::default()
        };
        let inbox = AdminContext {
            table: "public.inbox".into(),
            dedupe_window: Some(Duration::from_secs(86_400)),
            ..context()
        };
        let text = render_status(&inbox, INBOX, &summary, now);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "pipeline orders — inbox public.inbox");
        assert_eq!(
            lines[2],
            "MESSAGE TYPE  PENDING  PROCESSING  FAILED  MANUAL_REQUIRED  DONE  TOTAL"
        );
        assert!(
            text.ends_with("oldest pending: 5s ago (2027-01-15T07:59:55.000Z)"),
            "{text}"
        );
        let json = serde_json::to_value(StatusJson::new(&inbox, INBOX, &summary, now)).unwrap();
        assert_eq!(json["inbox_table"], "public.inbox");
        assert!(json.get("outbox_table").is_none(), "{json}");
        assert_eq!(TableWords::of(TableKind::Inbox), INBOX);
        assert_eq!(TableWords::of(TableKind::Outbox), OUTBOX);
    }

    #[test]
    fn ages_and_sizes_read_well() {
        assert_eq!(short_age(Duration::from_secs(5)), "5s");
        assert_eq!(short_age(Duration::from_secs(3 * 3600 + 120)), "3h 2m");
        assert_eq!(short_age(Duration::from_secs(2 * 86_400 + 3600)), "2d 1h");
        assert_eq!(bytes(10), "10 bytes");
        assert_eq!(bytes(1536), "1.5 KiB (1536 bytes)");
    }
}
