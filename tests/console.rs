//! The operator console (`[console]`, `/ui`) in a real browser: Debian's Chromium driven
//! headless through chromedriver (WebDriver, with the `fantoccini` crate), against
//! `outboxd run` on PostgreSQL and on MariaDB with Kafka.
//!
//! The story an operator lives: a row of key K names a topic outside
//! `kafka.allowed_topics`, so it becomes MANUAL_REQUIRED and holds K; two later rows of K
//! are parked behind it. The operator signs in (a wrong token first), finds K among the
//! held keys, opens the row, reads why, and resolves it with a reason. The key is released
//! and the two parked rows reach Kafka, in order. Along the way: without a session every
//! page answers 401 and shows no row; a form posted with the session cookie but without
//! the session's CSRF token is refused; the action is noted in the row and counted in
//! `/metrics`.
//!
//! Screenshots go to `target/console-screenshots/`; with
//! `OUTBOXD_CONSOLE_SCREENSHOT_DOCS=1` the PostgreSQL run also writes the row's page to
//! `docs/images/console-row.png`, the picture `docs/console.md` shows.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::engine::{Engine, Pipeline, Writer};
use common::mysql::MysqlServices;
use common::postgres::PgServices;
use common::{free_port, http_get, metric_value, metrics_section};
use fantoccini::{Client, ClientBuilder, Locator};

const TOKEN: &str = "console-test-token-5b1f0c";
/// The metrics bearer token: a different credential, which opens `/metrics` and
/// `/readyz` and not the console.
const METRICS_TOKEN: &str = "metrics-test-token-77e2a9";

/// chromedriver on a port of its own, stopped on drop.
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    fn start() -> Self {
        let port = free_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; scripts/test installs it)");
        Self { child, port }
    }

    /// A headless Chromium session (as root it needs `--no-sandbox`).
    async fn browser(&self) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1200,900"],
            }),
        );
        let url = format!("http://127.0.0.1:{}", self.port);
        common::wait_for("chromedriver to answer", Duration::from_secs(20), || {
            let (caps, url) = (caps.clone(), url.clone());
            async move {
                ClientBuilder::native()
                    .capabilities(caps)
                    .connect(&url)
                    .await
                    .ok()
            }
        })
        .await
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw HTTP/1.1 request: (status, body).
async fn http(port: u16, request: String) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.expect("read");
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let body = reply
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// `GET path` with the metrics bearer token: (status, body), `None` while nothing answers.
async fn bearer_get(port: u16, path: &str) -> Option<(u16, String)> {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    Some(
        http(
            port,
            format!(
                "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {METRICS_TOKEN}\r\n\r\n"
            ),
        )
        .await,
    )
}

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

async fn page_text(browser: &Client) -> String {
    browser.source().await.expect("page source")
}

/// The page's source once it contains `text` (a click returns before the page it leads
/// to has loaded).
async fn page_with(browser: &Client, text: &str) -> String {
    common::wait_for(
        &format!("a page with `{text}`"),
        Duration::from_secs(15),
        || async {
            let source = page_text(browser).await;
            source.contains(text).then_some(source)
        },
    )
    .await
}

async fn an_operator_resolves_a_held_key<E: Engine>(prefix: &str, engine: &str) {
    let port = free_port();
    let extra = format!(
        "{}bearer_token = \"{METRICS_TOKEN}\"\n\n[console]\ntoken = \"{TOKEN}\"\n",
        metrics_section(port)
    );
    let p = Pipeline::<E>::new(prefix, 1, &extra).await;
    // Only the pipeline's topic is allowed: a row naming another is refused for good.
    let config = std::fs::read_to_string(&p.config_path).expect("config");
    let config = config.replacen(
        "message_timeout = \"10s\"\n",
        &format!(
            "message_timeout = \"10s\"\nallowed_topics = [\"{}\"]\n",
            p.topic
        ),
        1,
    );
    std::fs::write(&p.config_path, config).expect("config");
    p.init();
    let daemon = p.spawn_run("run.log");
    common::wait_for("/readyz ready", Duration::from_secs(60), || async {
        let (status, _) = bearer_get(port, "/readyz").await?;
        (status == 200).then_some(())
    })
    .await;

    let mut writer = p.writer().await;
    writer
        .insert_padded("c-1", "K", 1, "it.not-allowed", 16)
        .await;
    writer.insert_padded("c-2", "K", 2, &p.topic, 16).await;
    writer.insert_padded("c-3", "K", 3, &p.topic, 16).await;
    common::wait_for(
        "c-1 MANUAL_REQUIRED, c-2 and c-3 parked behind it",
        Duration::from_secs(60),
        || async {
            let rows = p.rows().await;
            let status = |id: &str| rows.get(id).map(|r| r.status.clone()).unwrap_or_default();
            (status("c-1") == "MANUAL_REQUIRED"
                && status("c-2") == "FAILED"
                && status("c-3") == "FAILED")
                .then_some(())
        },
    )
    .await;
    let held_row = p.row_id("c-1").await;

    // No session: 401 and the sign-in form, never a row.
    for path in [
        "/ui".to_owned(),
        "/ui/outbox/held".to_owned(),
        format!("/ui/outbox/rows/{held_row}"),
    ] {
        let (status, body) = http_get(port, &path).await.expect("answers");
        assert_eq!(status, 401, "{path}: {body}");
        assert!(body.contains("name=\"token\""), "{path}: the sign-in form");
        assert!(
            !body.contains("c-1") && !body.contains("MANUAL_REQUIRED"),
            "{path}: {body}"
        );
    }
    // The bearer token of the other routes is not what opens the console's pages either.
    let (status, _) = http(
        port,
        format!(
            "GET /ui/outbox/held HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {METRICS_TOKEN}\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(status, 401);
    // And the console's presence opens no other route: paths that look like the
    // console's still need the bearer token.
    for path in [
        "/metrics",
        "/ui/../metrics",
        "/uix",
        "/ui%2F..%2Fmetrics",
        "/readyz",
    ] {
        let (status, body) = http_get(port, path).await.expect("answers");
        assert_eq!(status, 401, "{path}: {body}");
        assert!(!body.contains("outboxd_"), "{path}: {body}");
    }

    let driver = Driver::start();
    let browser = driver.browser().await;
    let base = format!("http://127.0.0.1:{port}");
    browser.goto(&format!("{base}/ui")).await.expect("open /ui");
    browser
        .find(Locator::Css("#token"))
        .await
        .expect("token field")
        .send_keys("not-the-token")
        .await
        .expect("type");
    browser
        .find(Locator::Css("form.login button"))
        .await
        .expect("sign-in button")
        .click()
        .await
        .expect("submit");
    page_with(&browser, "not the console").await;
    browser
        .find(Locator::Css("#token"))
        .await
        .expect("field")
        .send_keys(TOKEN)
        .await
        .expect("type");
    browser
        .find(Locator::Css("#name"))
        .await
        .expect("field")
        .send_keys("ana")
        .await
        .expect("type");
    browser
        .find(Locator::Css("form.login button"))
        .await
        .expect("button")
        .click()
        .await
        .expect("submit");
    let overview = page_with(&browser, "Signed in as ana").await;
    assert!(overview.contains(&p.name), "the pipeline's name");
    std::fs::write(
        screenshots().join(format!("{engine}-overview.png")),
        browser.screenshot().await.expect("screenshot"),
    )
    .expect("save");

    // Held keys → the row holding K.
    browser
        .find(Locator::LinkText("Outbox held keys"))
        .await
        .expect("nav link")
        .click()
        .await
        .expect("open held keys");
    let held = page_with(&browser, "Each key below waits").await;
    assert!(held.contains(">K<"), "K is held: {held}");
    assert!(held.contains(">2<"), "two rows wait behind it: {held}");
    browser
        .find(Locator::LinkText(&format!("row {held_row}")))
        .await
        .expect("the holding row's link")
        .click()
        .await
        .expect("open the row");
    let detail = page_with(&browser, &format!("outbox row {held_row}")).await;
    assert!(detail.contains("MANUAL_REQUIRED"), "{detail}");
    assert!(
        detail.contains("it.not-allowed"),
        "the row's topic: {detail}"
    );
    assert!(
        detail.contains("allowed_topics"),
        "why it is refused: {detail}"
    );
    let shot = browser.screenshot().await.expect("screenshot");
    std::fs::write(screenshots().join(format!("{engine}-row.png")), &shot).expect("save");
    if engine == "postgres" && std::env::var_os("OUTBOXD_CONSOLE_SCREENSHOT_DOCS").is_some() {
        let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/images");
        std::fs::create_dir_all(&docs).expect("docs/images");
        std::fs::write(docs.join("console-row.png"), &shot).expect("save");
    }

    // A POST with the session's cookie but not its CSRF token is refused.
    let cookie = browser
        .get_named_cookie("outboxd_console")
        .await
        .expect("the session cookie");
    assert_eq!(cookie.http_only(), Some(true));
    let forged = format!(
        "POST /ui/outbox/rows/{held_row}/resolve HTTP/1.1\r\nHost: x\r\nCookie: outboxd_console={}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 20\r\n\r\ncsrf=x&reason=forged",
        cookie.value()
    );
    let (status, body) = http(port, forged).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        p.rows().await["c-1"].status,
        "MANUAL_REQUIRED",
        "nothing changed"
    );

    // Resolve with a reason.
    browser
        .find(Locator::Css("#reason-resolve"))
        .await
        .expect("the resolve form")
        .send_keys("customer cancelled; nothing to send")
        .await
        .expect("type");
    browser
        .find(Locator::Css("button[value=resolve]"))
        .await
        .expect("resolve button")
        .click()
        .await
        .expect("resolve");
    let after = page_with(&browser, "Done: resolve.").await;
    assert!(after.contains("SUCCESS"), "{after}");

    // The key is released: the parked rows reach Kafka, in order.
    let records = p.consume(2, Duration::from_secs(60));
    let seqs: Vec<&str> = records
        .iter()
        .filter(|r| r.key == "K")
        .filter_map(|r| r.headers.get("seq").map(String::as_str))
        .collect();
    assert_eq!(seqs, ["2", "3"], "{records:?}");
    common::wait_for("c-2 and c-3 SUCCESS", Duration::from_secs(30), || async {
        let rows = p.rows().await;
        (rows["c-2"].status == "SUCCESS" && rows["c-3"].status == "SUCCESS").then_some(rows)
    })
    .await;
    let rows = p.rows().await;
    let note = rows["c-1"].last_error.clone().unwrap_or_default();
    assert_eq!(
        note,
        "resolved by operator without sending: customer cancelled; nothing to send (by ana in the console)"
    );

    // Resolving again changes nothing, and says so.
    browser.refresh().await.expect("reload");
    page_with(&browser, "nothing to do").await;
    assert!(
        browser.find(Locator::Css("#reason-resolve")).await.is_err(),
        "a resolved row offers no action"
    );
    let (_, metrics) = bearer_get(port, "/metrics").await.expect("/metrics");
    let resolved = metric_value(
        &metrics,
        "outboxd_console_actions_total",
        "{table=\"outbox\",action=\"resolve\"}",
    );
    assert_eq!(resolved, Some(1.0), "{metrics}");
    assert!(
        daemon.log_text().contains("console action"),
        "the action is logged"
    );

    // Signing out ends the session.
    browser
        .find(Locator::Css("form.signout button"))
        .await
        .expect("sign out")
        .click()
        .await
        .expect("sign out");
    browser
        .goto(&format!("{base}/ui/outbox/held"))
        .await
        .expect("open");
    page_with(&browser, "name=\"token\"").await;
    browser.close().await.expect("close the browser");
    drop(daemon);
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_operator_resolves_a_held_key_in_the_browser() {
    an_operator_resolves_a_held_key::<PgServices>("console", "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_an_operator_resolves_a_held_key_in_the_browser() {
    an_operator_resolves_a_held_key::<MysqlServices>("console", "mariadb").await;
}
