//! The operator console: `/ui` on the `[metrics]` address, off unless `[console]` is
//! present. What is stuck, why, and the button that fixes it:
//!
//! - the overview: the pipeline's state (`/readyz`'s answer), the confirmed position, its
//!   counters, rows by status of the outbox and the inbox, the canary's last success, and
//!   the latest rows waiting for an operator;
//! - FAILED and MANUAL_REQUIRED rows (any status, in fact) of either table, filtered by
//!   type, key and error text, newest first, paged by keyset;
//! - the keys strict ordering holds, with the row holding each and how many wait;
//! - a row's page: its headers, a bounded payload preview, attempts, errors, the sink's
//!   position; and the actions its status allows (retry, park, resolve), each with a
//!   required reason.
//!
//! The reads and the actions are the connector's [`TableAdmin`], the same calls as
//! `outboxd status|retry|park|resolve`, on a connection of the console's own with the
//! runtime role's grants. Each action is logged (who, what, which row, why), counted in
//! `outboxd_console_actions_total{table,action}`, and noted in the row's `last_error`
//! (park and resolve) with the operator's name. Actions are idempotent: a second resolve
//! of a resolved row changes nothing and says so.
//!
//! Signing in: [`auth`]. A request without a live session gets 401 and the sign-in form,
//! nothing else.

pub mod config;

mod auth;
mod pages;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::Markup;
use outboxd_connector::{
    Connector, ConnectorError, RetrySelector, RowQuery, Secret, TableAdmin, TableKind,
};
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::observability::Health;
use crate::relay::PipelineStats;
use crate::sink::Sink;
use auth::{Session, Sessions};

pub use config::{ConsoleConfig, ENV_CONSOLE_TOKEN};

/// How long a page waits for the database (the connection and the query).
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest reason kept.
const MAX_REASON: usize = 500;
/// Held keys a page shows.
const HELD_PAGE: usize = 50;
/// The latest rows waiting for an operator the overview shows, per table.
const RECENT: usize = 5;
/// The largest sign-in form read.
const MAX_LOGIN_FORM: usize = 4096;
/// The largest form of any other page read (a reason is at most 500 characters).
const MAX_FORM: usize = 16 * 1024;

/// What the console needs of the running process.
pub(crate) struct ConsoleSetup {
    pub(crate) pipeline: String,
    /// Whether the process relays the outbox.
    pub(crate) relays_outbox: bool,
    /// Whether its outbox rows carry a status to show (`outbox.rows = "kept"`).
    pub(crate) outbox_table: bool,
    pub(crate) runs_inbox: bool,
    /// `pipeline.ordering = "strict"`: a key is held behind a row in trouble.
    pub(crate) strict_order: bool,
    /// What the outbox's sink position means: `Kafka` or `HTTP`.
    pub(crate) sink: &'static str,
    pub(crate) token: Secret,
    pub(crate) config: ConsoleConfig,
}

/// Actions taken through the console, by table and action (`/metrics`).
#[derive(Debug, Default)]
pub struct ActionCounts {
    enabled: std::sync::atomic::AtomicBool,
    counts: [AtomicU64; 6],
}

const ACTIONS: [&str; 3] = ["retry", "park", "resolve"];
const TABLES: [TableKind; 2] = [TableKind::Outbox, TableKind::Inbox];

impl ActionCounts {
    fn slot(table: TableKind, action: &str) -> Option<usize> {
        let t = TABLES.iter().position(|t| *t == table)?;
        let a = ACTIONS.iter().position(|a| *a == action)?;
        Some(t * ACTIONS.len() + a)
    }

    fn count(&self, table: TableKind, action: &str) {
        if let Some(i) = Self::slot(table, action) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Each `(table, action, count)`, once the console runs (an empty list otherwise).
    pub(crate) fn snapshot(&self) -> Vec<(&'static str, &'static str, u64)> {
        if !self.enabled.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for table in TABLES {
            for action in ACTIONS {
                let n =
                    Self::slot(table, action).map_or(0, |i| self.counts[i].load(Ordering::Relaxed));
                out.push((table.name(), action, n));
            }
        }
        out
    }
}

/// The console of one running process.
struct Console<C: Connector, S: Sink> {
    setup: ConsoleSetup,
    /// The tables this process runs: the outbox (the relay), the inbox, or both.
    tables: Vec<TableKind>,
    health: Arc<Health<C, S>>,
    stats: Arc<PipelineStats>,
    connector: C,
    sessions: Sessions,
    outbox: Mutex<Option<C::Store>>,
    inbox: Mutex<Option<C::Inbox>>,
}

/// The console's routes, under `/ui`.
pub(crate) fn routes<C, S>(
    setup: ConsoleSetup,
    health: Arc<Health<C, S>>,
    stats: Arc<PipelineStats>,
    connector: C,
) -> Router
where
    C: Connector + 'static,
    S: Sink + 'static,
{
    stats.console_actions.enabled.store(true, Ordering::Relaxed);
    let tables = TABLES
        .into_iter()
        .filter(|t| match t {
            TableKind::Outbox => setup.outbox_table,
            TableKind::Inbox => setup.runs_inbox,
        })
        .collect();
    let console = Arc::new(Console {
        sessions: Sessions::new(setup.config.session_ttl, setup.config.secure_cookie),
        tables,
        setup,
        health,
        stats,
        connector,
        outbox: Mutex::new(None),
        inbox: Mutex::new(None),
    });
    Router::new()
        .route("/ui", get(overview::<C, S>))
        .route("/ui/", get(overview::<C, S>))
        .route("/ui/style.css", get(style))
        .route(
            "/ui/login",
            get(login_form)
                .post(login::<C, S>)
                .layer(axum::extract::DefaultBodyLimit::max(MAX_LOGIN_FORM)),
        )
        .route("/ui/logout", post(logout::<C, S>))
        .route("/ui/{table}/rows", get(list::<C, S>))
        .route("/ui/{table}/held", get(held::<C, S>))
        .route("/ui/{table}/rows/{id}", get(detail::<C, S>))
        .route("/ui/{table}/rows/{id}/{action}", post(act::<C, S>))
        // Every form is small (a reason is at most 500 characters): nothing reads more.
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FORM))
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(console)
}

/// Every console answer: no caching, no framing, no script, no referrer.
async fn secure_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn html(status: StatusCode, markup: Markup) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

/// 401 and the sign-in form: what a request without a live session gets, whatever it
/// asked for.
fn unauthorized() -> Response {
    html(StatusCode::UNAUTHORIZED, pages::login(false))
}

impl<C: Connector, S: Sink> Console<C, S> {
    fn nav<'a>(&'a self, session: &'a Session) -> pages::Nav<'a> {
        pages::Nav {
            session,
            tables: &self.tables,
        }
    }

    /// The table named in a path, when this process runs it.
    fn table(&self, name: &str) -> Option<TableKind> {
        self.tables.iter().copied().find(|t| t.name() == name)
    }

    fn session(&self, headers: &HeaderMap) -> Option<Session> {
        let cookie = headers.get(header::COOKIE).and_then(|v| v.to_str().ok());
        self.sessions.find(cookie)
    }

    /// Runs `work` on the table's store, opened on first use, dropped after an error.
    async fn on_store<A, R>(
        slot: &Mutex<Option<A>>,
        open: impl Future<Output = Result<A, ConnectorError>>,
        work: impl AsyncFnOnce(&A) -> Result<R, ConnectorError>,
    ) -> Result<R, String> {
        let mut slot = slot.lock().await;
        let result = tokio::time::timeout(QUERY_TIMEOUT, async {
            if slot.is_none() {
                *slot = Some(open.await?);
            }
            match slot.as_ref() {
                Some(store) => work(store).await,
                None => Err(ConnectorError::transient("no database connection")),
            }
        })
        .await;
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                // A broken connection is opened again; a refused request keeps it.
                if e.is_transient() {
                    *slot = None;
                }
                Err(e.to_string())
            }
            Err(_) => {
                *slot = None;
                Err(format!(
                    "the database did not answer within {QUERY_TIMEOUT:?}"
                ))
            }
        }
    }
}

/// Runs `$call` on the store of `$table` (`outbox` or `inbox`), as [`Console::on_store`].
macro_rules! on_table {
    ($console:expr, $table:expr, |$store:ident| $call:expr) => {
        match $table {
            TableKind::Outbox => {
                Console::<C, S>::on_store(
                    &$console.outbox,
                    $console.connector.open_store(),
                    async |$store: &C::Store| $call.await,
                )
                .await
            }
            TableKind::Inbox => {
                Console::<C, S>::on_store(
                    &$console.inbox,
                    $console.connector.open_inbox(),
                    async |$store: &C::Inbox| $call.await,
                )
                .await
            }
        }
    };
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        pages::STYLE,
    )
}

async fn login_form() -> Response {
    html(StatusCode::OK, pages::login(false))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    #[serde(default)]
    name: String,
}

async fn login<C: Connector, S: Sink>(
    State(console): State<Arc<Console<C, S>>>,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    if !console.sessions.sign_in_allowed() {
        // Debug only: the refusals come at the rate anyone sends them (the wrong tokens
        // that caused them were logged, at most ten in ten seconds).
        tracing::debug!(target: "outboxd::console", "console: too many wrong tokens; sign-in refused");
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "10")],
            "too many wrong tokens: try again in a few seconds\n",
        )
            .into_response();
    }
    let given = form.as_ref().map_or("", |Form(f)| f.token.as_str());
    if !auth::same_secret(given, console.setup.token.expose()) {
        console.sessions.sign_in_failed();
        tracing::warn!(target: "outboxd::console", "console: sign-in with a wrong token");
        return html(StatusCode::UNAUTHORIZED, pages::login(true));
    }
    let Ok(Form(form)) = form else {
        return unauthorized();
    };
    let id = console.sessions.open(&form.name);
    if let Some(session) = console
        .sessions
        .find(Some(&format!("{}={id}", auth::COOKIE)))
    {
        tracing::info!(target: "outboxd::console", operator = ?session.operator, "console: signed in");
    }
    let mut response = Redirect::to("/ui").into_response();
    if let Ok(cookie) = HeaderValue::from_str(&console.sessions.cookie(&id)) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout<C: Connector, S: Sink>(
    State(console): State<Arc<Console<C, S>>>,
    headers: HeaderMap,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    let Some(session) = console.session(&headers) else {
        return unauthorized();
    };
    let csrf = form.as_ref().map_or("", |Form(f)| f.csrf.as_str());
    if !auth::same_secret(csrf, &session.csrf) {
        return forbidden(&console.nav(&session));
    }
    let cookie = headers.get(header::COOKIE).and_then(|v| v.to_str().ok());
    console.sessions.close(cookie);
    let mut response = Redirect::to("/ui/login").into_response();
    if let Ok(cookie) = HeaderValue::from_str(&auth::expired_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

fn forbidden(nav: &pages::Nav<'_>) -> Response {
    html(
        StatusCode::FORBIDDEN,
        pages::problem(
            Some(nav),
            "Refused",
            "This form is not from your session (its CSRF token does not match): open the \
             page again and repeat the action.",
        ),
    )
}

fn bad_request(nav: &pages::Nav<'_>, what: &str) -> Response {
    html(
        StatusCode::BAD_REQUEST,
        pages::problem(Some(nav), "Bad request", what),
    )
}

fn not_found(nav: &pages::Nav<'_>, what: &str) -> Response {
    html(
        StatusCode::NOT_FOUND,
        pages::problem(Some(nav), "Not found", what),
    )
}

async fn overview<C: Connector, S: Sink>(
    State(console): State<Arc<Console<C, S>>>,
    headers: HeaderMap,
) -> Response {
    let Some(session) = console.session(&headers) else {
        return unauthorized();
    };
    let stats = &console.stats;
    let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
    let setup = &console.setup;
    let mut recent = Vec::new();
    for &table in &console.tables {
        let query = RowQuery {
            status: "MANUAL_REQUIRED".into(),
            limit: RECENT,
            ..RowQuery::default()
        };
        recent.push((table, on_table!(console, table, |s| s.list_rows(&query))));
    }
    let canary = stats
        .canary
        .enabled()
        .then(|| UNIX_EPOCH + Duration::from_secs_f64(stats.canary.last_success().max(0.0)));
    let confirmed = stats
        .confirmed
        .lock()
        .ok()
        .and_then(|p| p.as_ref().map(ToString::to_string));
    let last_interruption = stats.last_interruption.lock().ok().and_then(|l| l.clone());
    let view = pages::Overview {
        pipeline: &setup.pipeline,
        readiness: console.health.readiness().await,
        streaming: stats.streaming.load(Ordering::Relaxed),
        last_interruption,
        relays_outbox: setup.relays_outbox,
        runs_inbox: setup.runs_inbox,
        confirmed,
        counters: vec![
            ("Published", load(&stats.published)),
            ("Failed", load(&stats.failed)),
            ("Parked by strict ordering", load(&stats.parked)),
            ("Retried and published", load(&stats.retried)),
            ("In flight", load(&stats.in_flight)),
            ("Producer rebuilds", load(&stats.producer_rebuilds)),
        ],
        canary_last_success: canary,
        outbox: console.health.outbox_summary().await,
        inbox: console.health.inbox_summary().await,
        recent,
    };
    let body = pages::overview(&view, SystemTime::now());
    html(
        StatusCode::OK,
        pages::page("Overview", Some(&console.nav(&session)), None, body),
    )
}

#[derive(Deserialize, Default)]
struct ListParams {
    #[serde(default)]
    status: String,
    #[serde(default, rename = "type")]
    message_type: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    before: String,
}

fn non_empty(s: &str) -> Option<String> {
    (!s.trim().is_empty()).then(|| s.to_owned())
}

async fn list<C: Connector, S: Sink>(
    State(console): State<Arc<Console<C, S>>>,
    headers: HeaderMap,
    Path(table): Path<String>,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Response {
    let Some(session) = console.session(&headers) else {
        return unauthorized();
    };
    let Ok(Query(params)) = params else {
        return bad_request(
            &console.nav(&session),
            "The page's address is not one the console made.",
        );
    };
    let before_id = match params.before.trim() {
        "" => None,
        text => match text.parse::<i64>() {
            Ok(id) => Some(id),
            Err(_) => return bad_request(&console.nav(&session), "`before` is a row id."),
        },
    };
    let Some(table) = console.table(&table) else {
        return not_found(
            &console.nav(&session),
            "The console shows the outbox and the inbox.",
        );
    };
    let status = match params.status.as_str() {
        "" => "FAILED".to_owned(),
        s => s.to_owned(),
    };
    let page_size = console.setup.config.page_size;
    let query = RowQuery {
        status: status.clone(),
        message_type: non_empty(&params.message_type),
        biz_key: non_empty(&params.key),
        error_contains: non_empty(&params.error),
        before_id,
        limit: page_size,
    };
    if let Err(e) = query.check(table) {
        return bad_request(&console.nav(&session), &e.to_string());
    }
    let rows = match on_table!(console, table, |s| s.list_rows(&query)) {
        Ok(rows) => rows,
        Err(e) => {
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                pages::problem(Some(&console.nav(&session)), "Cannot list rows", &e),
            )
        }
    };
    let next_page = (rows.len() == page_size).then(|| {
        let last = rows.last().map_or(0, |r| r.id);
        format!(
            "/ui/{}/rows?status={}&type={}&key={}&error={}&before={last}",
            table.name(),
            pages::url_encode(&status),
            pages::url_encode(&params.message_type),
            pages::url_encode(&params.key),
            pages::url_encode(&params.error),
        )
    });
    let filters = pages::ListFilters {
        status: &status,
        message_type: &params.message_type,
        biz_key: &params.key,
        error: &params.error,
    };
    let title = format!("{} rows: {status}", table.name());
    let body = pages::row_list(table, &filters, &rows, next_page, SystemTime::now());
    html(
        StatusCode::OK,
        pages::page(&title, Some(&console.nav(&session)), None, body),
    )
}

#[derive(Deserialize, Default)]
struct HeldParams {
    after: Option<String>,
}

async fn held<C: Connector, S: Sink>(
    State(console): State<Arc<Console<C, S>>>,
    headers: HeaderMap,
    Path(table): Path<String>,
    params: Result<Query<HeldParams>, QueryRejection>,
) -> Response {
    let Some(session) = console.session(&headers) else {
        return unauthorized();
    };
    let Ok(Query(params)) = params else {
        return bad_request(
            &console.nav(&session),
            "The page's address is not one the console made.",
        );
    };
    let Some(table) = console.table(&table) else {
        return not_found(
            &console.nav(&session),
            "The console shows the outbox and the inbox.",
        );
    };
    let after = params.after.as_deref();
    let keys = match on_table!(console, table, |s| s.held_keys(after, HELD_PAGE)) {
        Ok(keys) => keys,
        Err(e) => {
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                pages::problem(Some(&console.nav(&session)), "Cannot read held keys", &e),
            )
        }
    };
    let next_page = (keys.len() == HELD_PAGE).then(|| {
        let last = keys.last().map_or("", |k| k.holder.biz_key.as_str());
        format!(
            "/ui/{}/held?after={}",
            table.name(),
            pages::url_encode(last)
        )
    });
    let title = format!("{} held keys", table.name());
    let held = table == TableKind::Inbox || console.setup.strict_order;
    let body = pages::held_keys(table, held, &keys, next_page);
    html(
        StatusCode::OK,
        pages::page(&title, Some(&console.nav(&session)), None, body),
    )
}

#[derive(Deserialize, Default)]
struct DetailParams {
    done: Option<String>,
}

async fn detail<C: Connector, S: Sink>(
    State(console): State<Arc<Console<C, S>>>,
    headers: HeaderMap,
    Path((table, id)): Path<(String, String)>,
    params: Result<Query<DetailParams>, QueryRejection>,
) -> Response {
    let Some(session) = console.session(&headers) else {
        return unauthorized();
    };
    let params = params.map(|Query(p)| p).unwrap_or_default();
    let Ok(id) = id.parse::<i64>() else {
        return bad_request(&console.nav(&session), "A row's id is a number.");
    };
    let Some(table) = console.table(&table) else {
        return not_found(
            &console.nav(&session),
            "The console shows the outbox and the inbox.",
        );
    };
    let preview = console.setup.config.payload_preview;
    let row = match on_table!(console, table, |s| s.row_detail(id, preview)) {
        Ok(Some(row)) => row,
        Ok(None) => {
            return not_found(
                &console.nav(&session),
                &format!("No {} row {id}.", table.name()),
            )
        }
        Err(e) => {
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                pages::problem(Some(&console.nav(&session)), "Cannot read the row", &e),
            )
        }
    };
    let notice = params.done.as_deref().and_then(|done| match done {
        "unchanged" => {
            Some("Nothing changed: the row's status did not allow it (already done?).".to_owned())
        }
        action if ACTIONS.contains(&action) => Some(format!("Done: {action}.")),
        _ => None,
    });
    let title = format!("{} row {id}", table.name());
    let body = pages::row_detail(
        table,
        &row,
        &session.csrf,
        preview,
        console.setup.sink,
        SystemTime::now(),
    );
    html(
        StatusCode::OK,
        pages::page(
            &title,
            Some(&console.nav(&session)),
            notice.as_deref(),
            body,
        ),
    )
}

#[derive(Deserialize)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

async fn act<C: Connector, S: Sink>(
    State(console): State<Arc<Console<C, S>>>,
    headers: HeaderMap,
    Path((table, id, action)): Path<(String, String, String)>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let Some(session) = console.session(&headers) else {
        return unauthorized();
    };
    let Ok(Form(form)) = form else {
        return forbidden(&console.nav(&session));
    };
    if !auth::same_secret(&form.csrf, &session.csrf) {
        return forbidden(&console.nav(&session));
    }
    let Ok(id) = id.parse::<i64>() else {
        return bad_request(&console.nav(&session), "A row's id is a number.");
    };
    let (Some(table), true) = (console.table(&table), ACTIONS.contains(&action.as_str())) else {
        return not_found(
            &console.nav(&session),
            "No such action: retry, park or resolve a row.",
        );
    };
    // One line, no control characters: it goes into the row and the log.
    let reason: String = (form.reason.trim().chars())
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_REASON)
        .collect();
    if reason.is_empty() {
        return html(
            StatusCode::BAD_REQUEST,
            pages::problem(
                Some(&console.nav(&session)),
                "A reason is required",
                "Say why, for the audit log and the row's note.",
            ),
        );
    }
    // The row's note names who acted; the log line says it all again.
    let note = format!("{reason} (by {} in the console)", session.operator);
    let result = match action.as_str() {
        "retry" => on_table!(console, table, |s| s.retry_rows(&RetrySelector::Id(id)))
            .map(|changed| changed > 0),
        "park" => on_table!(console, table, |s| s.park_row(id, &note)),
        _ => on_table!(console, table, |s| s.resolve_row(id, &note)),
    };
    match result {
        Ok(changed) => {
            tracing::info!(
                target: "outboxd::console",
                operator = ?session.operator,
                action = %action,
                table = table.name(),
                id,
                reason = ?reason,
                changed,
                "console action"
            );
            if changed {
                console.stats.console_actions.count(table, &action);
            }
            let done = if changed {
                action.as_str()
            } else {
                "unchanged"
            };
            Redirect::to(&format!("/ui/{}/rows/{id}?done={done}", table.name())).into_response()
        }
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::problem(Some(&console.nav(&session)), "The action failed", &e),
        ),
    }
}
