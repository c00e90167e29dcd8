//! The console's pages as server-rendered HTML (maud: templates checked at compile time,
//! every value escaped). No script, no third-party resource: one stylesheet compiled into
//! the binary, forms for every action, so the pages work offline, with a keyboard and on a
//! phone.

use std::time::{Duration, SystemTime};

use maud::{html, Markup, DOCTYPE};
use outboxd_connector::{HeldKey, RowDetail, RowSummary, StatusSummary, TableKind};

use super::auth::Session;

/// The stylesheet, served at `/ui/style.css`.
pub(crate) const STYLE: &str = include_str!("style.css");

/// The longest `last_error` a list shows; the row's page shows it whole.
const LIST_ERROR_CHARS: usize = 160;

/// Who is signed in, and the tables this process runs (the navigation links them).
pub(crate) struct Nav<'a> {
    pub(crate) session: &'a Session,
    pub(crate) tables: &'a [TableKind],
}

/// A whole page: head, navigation (when signed in), a notice, the body.
pub(crate) fn page(
    title: &str,
    nav: Option<&Nav<'_>>,
    notice: Option<&str>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · outboxd" }
                link rel="stylesheet" href="/ui/style.css";
            }
            body {
                header {
                    a.brand href="/ui" { "outboxd" }
                    @if let Some(Nav { session, tables }) = nav {
                        nav aria-label="Main" {
                            a href="/ui" { "Overview" }
                            @for table in tables.iter() {
                                a href=(format!("/ui/{}/rows?status=FAILED", table.name())) { (title_case(table.name())) " failed" }
                                a href=(format!("/ui/{}/rows?status=MANUAL_REQUIRED", table.name())) { (title_case(table.name())) " manual" }
                                a href=(format!("/ui/{}/held", table.name())) { (title_case(table.name())) " held keys" }
                            }
                        }
                        form.signout method="post" action="/ui/logout" {
                            input type="hidden" name="csrf" value=(session.csrf);
                            span { "Signed in as " (session.operator) }
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    @if let Some(notice) = notice {
                        p.notice role="status" { (notice) }
                    }
                    (body)
                }
            }
        }
    }
}

/// The sign-in form; `failed` after a wrong credential.
pub(crate) fn login(failed: bool) -> Markup {
    let body = html! {
        @if failed {
            p.error role="alert" { "That token is not the console's credential." }
        }
        form.login method="post" action="/ui/login" {
            label for="token" { "Token" }
            input #token type="password" name="token" required autocomplete="current-password" autofocus;
            label for="name" { "Your name (for the audit log)" }
            input #name type="text" name="name" maxlength="64" autocomplete="username";
            button type="submit" { "Sign in" }
        }
    };
    page("Sign in", None, None, body)
}

/// What the overview shows.
pub(crate) struct Overview<'a> {
    pub(crate) pipeline: &'a str,
    /// `/readyz`'s answer: ready or the reasons not.
    pub(crate) readiness: Result<String, String>,
    /// Whether a log session is open now (the outbox relay in log mode).
    pub(crate) streaming: bool,
    /// When the last log session ended or failed to open, and why.
    pub(crate) last_interruption: Option<(SystemTime, String)>,
    pub(crate) relays_outbox: bool,
    pub(crate) runs_inbox: bool,
    pub(crate) confirmed: Option<String>,
    pub(crate) counters: Vec<(&'static str, u64)>,
    pub(crate) canary_last_success: Option<SystemTime>,
    pub(crate) outbox: Option<Result<StatusSummary, String>>,
    pub(crate) inbox: Option<Result<StatusSummary, String>>,
    /// The latest rows waiting for an operator, by table.
    pub(crate) recent: Vec<(TableKind, Result<Vec<RowSummary>, String>)>,
}

pub(crate) fn overview(o: &Overview<'_>, now: SystemTime) -> Markup {
    let (state_class, state) = match &o.readiness {
        Ok(text) => ("ok", text.trim()),
        Err(text) => ("bad", text.trim()),
    };
    html! {
        section aria-labelledby="state" {
            h2 #state { "Pipeline " code { (o.pipeline) } }
            p class=(format!("state {state_class}")) { (state) }
            @if let Some((at, why)) = &o.last_interruption {
                @if o.streaming {
                    p { "Last interruption " (ago(now, *at)) ": " (why) }
                } @else {
                    p.error { "Reconnecting (or waiting as a standby); last attempt " (ago(now, *at)) ": " (why) }
                }
            }
            dl {
                dt { "Runs" }
                dd {
                    @if o.relays_outbox { "the outbox relay" }
                    @if o.relays_outbox && o.runs_inbox { " and " }
                    @if o.runs_inbox { "the inbox" }
                }
                @if let Some(position) = &o.confirmed {
                    dt { "Log position confirmed" } dd { code { (position) } }
                }
                @for (name, value) in &o.counters {
                    dt { (name) } dd { (value) }
                }
                @if let Some(at) = o.canary_last_success {
                    dt { "Canary's last success" } dd { (ago(now, at)) }
                }
            }
        }
        @for (table, summary) in [(TableKind::Outbox, &o.outbox), (TableKind::Inbox, &o.inbox)] {
            @if let Some(summary) = summary {
                section aria-labelledby=(format!("{}-rows", table.name())) {
                    h2 id=(format!("{}-rows", table.name())) { (title_case(table.name())) " rows" }
                    @match summary {
                        Ok(summary) => (status_table(table, summary, now)),
                        Err(e) => p.error { "The status query failed: " (e) },
                    }
                }
            }
        }
        @for (table, rows) in &o.recent {
            section aria-labelledby=(format!("{}-recent", table.name())) {
                h2 id=(format!("{}-recent", table.name())) { "Latest " (table.name()) " rows waiting for an operator" }
                @match rows {
                    Ok(rows) if rows.is_empty() => p { "None." },
                    Ok(rows) => (row_table(*table, rows, now)),
                    Err(e) => p.error { (e) },
                }
            }
        }
    }
}

fn status_table(table: TableKind, summary: &StatusSummary, now: SystemTime) -> Markup {
    let count = |status: &str| -> i64 {
        (summary.counts.iter())
            .filter(|c| c.status == status)
            .map(|c| c.rows)
            .sum()
    };
    html! {
        table {
            thead { tr { @for status in table.statuses() { th scope="col" { (status) } } } }
            tbody { tr { @for status in table.statuses() {
                td {
                    @if matches!(status, "FAILED" | "MANUAL_REQUIRED") {
                        a href=(format!("/ui/{}/rows?status={status}", table.name())) { (count(status)) }
                    } @else {
                        (count(status))
                    }
                }
            } } }
        }
        dl {
            dt { "Oldest unsent" }
            dd { (summary.oldest_unsent.map_or_else(|| "none".to_owned(), |t| ago(now, t))) }
            @if let Some(lag) = summary.source_lag_bytes {
                dt { "Log lag" } dd { (lag) " bytes" }
            }
        }
    }
}

/// The filters of a list page, as the form shows them.
pub(crate) struct ListFilters<'a> {
    pub(crate) status: &'a str,
    pub(crate) message_type: &'a str,
    pub(crate) biz_key: &'a str,
    pub(crate) error: &'a str,
}

pub(crate) fn row_list(
    table: TableKind,
    filters: &ListFilters<'_>,
    rows: &[RowSummary],
    next_page: Option<String>,
    now: SystemTime,
) -> Markup {
    let name = table.name();
    html! {
        form.filters method="get" action=(format!("/ui/{name}/rows")) {
            label for="status" { "Status" }
            select #status name="status" {
                @for status in table.statuses() {
                    option value=(status) selected[status == filters.status] { (status) }
                }
            }
            label for="type" { "Message type" }
            input #type type="text" name="type" value=(filters.message_type);
            label for="key" { "Key" }
            input #key type="text" name="key" value=(filters.biz_key);
            label for="error" { "Error contains" }
            input #error type="text" name="error" value=(filters.error);
            button type="submit" { "Filter" }
        }
        @if rows.is_empty() {
            p { "No rows." }
        } @else {
            (row_table(table, rows, now))
        }
        @if let Some(next) = next_page {
            p { a rel="next" href=(next) { "Older rows →" } }
        }
    }
}

fn row_table(table: TableKind, rows: &[RowSummary], now: SystemTime) -> Markup {
    html! {
        table.rows {
            thead { tr {
                th scope="col" { "Id" } th scope="col" { "Type" } th scope="col" { "Key" }
                th scope="col" { "Status" } th scope="col" { "Attempts" }
                th scope="col" { "Next retry" } th scope="col" { "Last error" }
            } }
            tbody {
                @for row in rows {
                    tr {
                        td { a href=(format!("/ui/{}/rows/{}", table.name(), row.id)) { (row.id) } }
                        td { (row.message_type) }
                        td { (row.biz_key) }
                        td { (row.status) }
                        td { (row.retry_count) "/" (row.max_retry_count) }
                        td { (row.next_retry_time.map_or_else(String::new, |t| when(now, t))) }
                        td.error-text { (cut(row.last_error.as_deref().unwrap_or(""), LIST_ERROR_CHARS)) }
                    }
                }
            }
        }
    }
}

/// The held keys; `held` is false on an outbox under relaxed ordering, where a row in
/// trouble holds nothing back.
pub(crate) fn held_keys(
    table: TableKind,
    held: bool,
    keys: &[HeldKey],
    next_page: Option<String>,
) -> Markup {
    let name = table.name();
    html! {
        @if held {
            p {
                "Each key below waits for the row that holds it: nothing later of the key is "
                @match table { TableKind::Outbox => "sent", TableKind::Inbox => "handled" }
                " before it. Retry, park or resolve the holding row to release the key."
            }
        } @else {
            p {
                "pipeline.ordering is relaxed: a row in trouble holds nothing back, later rows "
                "of its key are sent meanwhile. The keys below have a row in trouble."
            }
        }
        @if keys.is_empty() {
            p { "No key is held." }
        } @else {
            table.rows {
                thead { tr {
                    th scope="col" { "Key" } th scope="col" { "Held by" } th scope="col" { "Status" }
                    th scope="col" { "Last error" }
                    th scope="col" {
                        @match table { TableKind::Outbox => "In trouble behind it", TableKind::Inbox => "Waiting behind it" }
                    }
                } }
                tbody {
                    @for key in keys {
                        tr {
                            td { (key.holder.biz_key) }
                            td { a href=(format!("/ui/{name}/rows/{}", key.holder.id)) { "row " (key.holder.id) } }
                            td { (key.holder.status) }
                            td.error-text { (cut(key.holder.last_error.as_deref().unwrap_or(""), LIST_ERROR_CHARS)) }
                            td {
                                a href=(format!("/ui/{name}/rows?status=FAILED&key={}", url_encode(&key.holder.biz_key))) {
                                    (key.waiting)
                                }
                            }
                        }
                    }
                }
            }
        }
        @if let Some(next) = next_page {
            p { a rel="next" href=(next) { "More keys →" } }
        }
    }
}

/// A row's page: every field, the payload's preview and the actions its status allows.
pub(crate) fn row_detail(
    table: TableKind,
    row: &RowDetail,
    csrf: &str,
    preview_limit: usize,
    sink: &str,
    now: SystemTime,
) -> Markup {
    let s = &row.summary;
    let name = table.name();
    let finished = table.finished_status();
    let actions: Vec<(&str, &str, &str)> = [
        (
            "retry",
            "Retry",
            "Make it due again now, attempts from zero.",
            matches!(s.status.as_str(), "FAILED" | "MANUAL_REQUIRED"),
        ),
        (
            "park",
            "Park",
            "Stop retrying it and hold its key until an operator decides.",
            s.status == table.new_status() || s.status == "FAILED",
        ),
        (
            "resolve",
            "Resolve",
            match table {
                TableKind::Outbox => "Mark it done without sending it, releasing its key.",
                TableKind::Inbox => "Mark it done without handling it, releasing its key.",
            },
            s.status != finished,
        ),
    ]
    .into_iter()
    .filter(|(_, _, _, allowed)| *allowed)
    .map(|(action, label, help, _)| (action, label, help))
    .collect();
    html! {
        dl.detail {
            dt { "Status" } dd { (s.status) }
            dt { "Message type" } dd { (s.message_type) }
            dt { "Key" } dd { (s.biz_key) }
            dt { "Message id" } dd { code { (row.message_id) } }
            @if let Some(source) = &row.source { dt { "Source" } dd { (source) } }
            @if let Some(topic) = &row.topic { dt { "Topic or endpoint" } dd { (topic) } }
            dt { "Attempts" } dd { (s.retry_count) " of " (s.max_retry_count) }
            @if let Some(t) = s.next_retry_time {
                @if s.status == "MANUAL_REQUIRED" {
                    dt { "Waiting for an operator since" } dd { (ago(now, t)) }
                } @else {
                    dt { "Next retry" } dd { (when(now, t)) }
                }
            }
            @if let Some(t) = s.created_at { dt { "Written" } dd { (ago(now, t)) } }
            @if let Some(t) = s.updated_at { dt { "Last changed" } dd { (ago(now, t)) } }
            @if let Some(t) = row.finished_at {
                dt { @match table { TableKind::Outbox => "Sent", TableKind::Inbox => "Handled" } }
                dd { (ago(now, t)) }
            }
            @if let Some((first, second)) = row.sink_position {
                @if sink == "HTTP" {
                    dt { "Endpoint's answer" } dd { "HTTP " (first) " in " (second) " ms" }
                } @else {
                    dt { "Kafka position" } dd { "partition " (first) ", offset " (second) }
                }
            }
            dt { "Last error" } dd { pre { (s.last_error.as_deref().unwrap_or("none")) } }
            dt { "Headers" } dd { pre { (row.headers.as_deref().unwrap_or("none")) } }
            dt { "Payload" }
            dd {
                pre { (row.payload_preview) }
                @if row.payload_cut {
                    small { "The first " (preview_limit) " characters of " (row.payload_bytes) " bytes." }
                }
            }
        }
        p { a href=(format!("/ui/{name}/rows?status={}&key={}", s.status, url_encode(&s.biz_key))) { "Rows of this key in " (s.status) } }
        @if actions.is_empty() {
            p { "This row is " (finished) ": nothing to do." }
        }
        @for (action, label, help) in actions {
            form.action method="post" action=(format!("/ui/{name}/rows/{}/{action}", s.id)) {
                input type="hidden" name="csrf" value=(csrf);
                label for=(format!("reason-{action}")) { (label) " — " (help) " Reason:" }
                input id=(format!("reason-{action}")) type="text" name="reason" required maxlength="500";
                button type="submit" name="action" value=(action) { (label) " row " (s.id) }
            }
        }
    }
}

/// A short page for an error the operator can act on.
pub(crate) fn problem(nav: Option<&Nav<'_>>, title: &str, detail: &str) -> Markup {
    page(
        title,
        nav,
        None,
        html! { p.error role="alert" { (detail) } },
    )
}

fn title_case(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// `text` cut to `max` characters, marked when cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// `3m 20s ago`.
fn ago(now: SystemTime, t: SystemTime) -> String {
    match now.duration_since(t) {
        Ok(d) => format!("{} ago", short(d)),
        Err(e) => format!("in {}", short(e.duration())),
    }
}

/// `in 20s`, or `3m ago` when past.
fn when(now: SystemTime, t: SystemTime) -> String {
    match t.duration_since(now) {
        Ok(d) => format!("in {}", short(d)),
        Err(e) => format!("{} ago", short(e.duration())),
    }
}

fn short(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// `value` for a query string.
pub(crate) fn url_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b))
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_rows_is_escaped_and_cut() {
        let row = RowSummary {
            id: 1,
            message_type: "<script>alert(1)</script>".into(),
            biz_key: "k&1".into(),
            status: "FAILED".into(),
            retry_count: 1,
            max_retry_count: 10,
            next_retry_time: None,
            last_error: Some("é".repeat(200)),
            created_at: None,
            updated_at: None,
        };
        let html = row_table(TableKind::Outbox, &[row], SystemTime::now()).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;"));
        assert!(html.contains("k&amp;1"));
        assert!(html.contains(&format!("{}…", "é".repeat(LIST_ERROR_CHARS))));
    }

    #[test]
    fn keys_are_encoded_in_links() {
        assert_eq!(url_encode("a b&c/é"), "a%20b%26c%2F%C3%A9");
    }
}
