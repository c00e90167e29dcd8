//! The operator commands end to end: the real `outboxd` binary against the test
//! PostgreSQL — `status` (table and JSON), `retry --status`, `park`, `resolve`,
//! `janitor` (archive and delete) — checking both what they print and what the outbox
//! table holds afterwards.

mod common;

use std::process::Output;

use common::postgres::TestPipeline;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command that must succeed and returns its stdout.
fn ok(p: &TestPipeline, args: &[&str]) -> String {
    let out = p.outboxd(args);
    assert!(
        out.status.success(),
        "outboxd {args:?} failed ({}):\n{}\n{}",
        out.status,
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(&out)
}

fn json(p: &TestPipeline, args: &[&str]) -> serde_json::Value {
    let text = ok(p, args);
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}):\n{text}"))
}

/// `(status, retry_count, last_error, sent_at IS NOT NULL)` of a row.
async fn row(
    client: &tokio_postgres::Client,
    p: &TestPipeline,
    id: i64,
) -> (String, i32, Option<String>, bool) {
    let r = client
        .query_one(
            &format!(
                "SELECT status, retry_count, last_error, sent_at IS NOT NULL FROM \"{}\" \
                 WHERE id = $1",
                p.table
            ),
            &[&id],
        )
        .await
        .expect("row");
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

#[tokio::test]
async fn operator_commands_change_the_outbox_and_report_it() {
    let p = TestPipeline::new("admcli", 1, "").await;
    p.init();
    let client = p.sql().await;
    for key in ["a", "b", "c", "d", "e"] {
        p.insert_event(&client, key, 1, "adm").await;
    }
    let ids: Vec<i64> = client
        .query(&format!("SELECT id FROM \"{}\" ORDER BY id", p.table), &[])
        .await
        .expect("ids")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (a, b, c, d, e) = (ids[0], ids[1], ids[2], ids[3], ids[4]);
    client
        .batch_execute(&format!(
            "UPDATE \"{t}\" SET status = 'MANUAL_REQUIRED', retry_count = 10, \
                    next_retry_time = now(), last_error = 'topic missing' WHERE id IN ({a}, {b});
             UPDATE \"{t}\" SET status = 'SUCCESS', sent_at = now() - interval '10 days' \
                    WHERE id = {c};
             UPDATE \"{t}\" SET status = 'SUCCESS', sent_at = now() WHERE id = {d};",
            t = p.table
        ))
        .await
        .expect("set statuses");

    // status, as JSON and as a table.
    let status = json(&p, &["status", "--json"]);
    assert_eq!(status["pipeline"], p.name.as_str());
    assert_eq!(status["totals"]["MANUAL_REQUIRED"], 2);
    assert_eq!(status["totals"]["SUCCESS"], 2);
    assert_eq!(status["totals"]["INIT"], 1);
    assert!(status["oldest_unsent"].is_string(), "{status}");
    assert!(status["source_lag_bytes"].is_u64(), "{status}");
    let table = ok(&p, &["status"]);
    assert!(table.contains("MESSAGE TYPE"), "{table}");
    let line = table
        .lines()
        .find(|l| l.starts_with("order.step1"))
        .unwrap_or_else(|| panic!("no order.step1 line:\n{table}"));
    assert_eq!(
        line.split_whitespace().collect::<Vec<_>>(),
        ["order.step1", "1", "0", "0", "2", "2", "5"],
        "{table}"
    );

    // retry every MANUAL_REQUIRED row.
    let retried = json(&p, &["retry", "--status", "MANUAL_REQUIRED", "--json"]);
    assert_eq!(retried["rows"], 2);
    for id in [a, b] {
        let (status, retries, error, _) = row(&client, &p, id).await;
        assert_eq!((status.as_str(), retries), ("FAILED", 0));
        assert_eq!(error.as_deref(), Some("topic missing"));
    }
    let none = p.outboxd(&["retry", "--id", "999999999"]);
    assert_eq!(none.status.code(), Some(1), "{}", stdout(&none));

    // park, then park again (nothing to do: exit code 1).
    let parked = json(
        &p,
        &[
            "park",
            "--id",
            &e.to_string(),
            "--reason",
            "bad payload",
            "--json",
        ],
    );
    assert_eq!(parked["changed"], true);
    let (status, _, error, _) = row(&client, &p, e).await;
    assert_eq!(status, "MANUAL_REQUIRED");
    assert_eq!(error.as_deref(), Some("parked by operator: bad payload"));
    let again = p.outboxd(&["park", "--id", &e.to_string(), "--reason", "x"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stdout(&again).contains("unchanged"), "{}", stdout(&again));

    // resolve.
    let text = ok(
        &p,
        &[
            "resolve",
            "--id",
            &e.to_string(),
            "--reason",
            "sent by hand",
        ],
    );
    assert!(
        text.contains(&format!("row {e} is SUCCESS without being sent")),
        "{text}"
    );
    let (status, _, error, sent) = row(&client, &p, e).await;
    assert_eq!((status.as_str(), sent), ("SUCCESS", false));
    assert_eq!(
        error.as_deref(),
        Some("resolved by operator without sending: sent by hand")
    );

    // janitor: archive the week-old row, then delete everything SUCCESS.
    let archive = format!("{}_archive", p.table);
    // The runtime role may not create tables: the administrator makes the archive table
    // (as README's "Privileges" says) and lets it insert there.
    client
        .batch_execute(&format!(
            "CREATE TABLE \"{archive}\" (LIKE \"{}\"); GRANT INSERT ON \"{archive}\" TO \"{}\"",
            p.table, p.services.run_user
        ))
        .await
        .expect("archive table");
    let report = json(
        &p,
        &[
            "janitor",
            "--older-than",
            "7d",
            "--archive-table",
            &archive,
            "--batch",
            "1",
            "--json",
        ],
    );
    assert_eq!(
        (report["rows"].as_u64(), report["action"].as_str()),
        (Some(1), Some("archive"))
    );
    let archived: Vec<i64> = client
        .query(&format!("SELECT id FROM \"{archive}\""), &[])
        .await
        .expect("archive")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(archived, [c]);
    let text = ok(&p, &["janitor", "--older-than", "0s"]);
    assert!(text.contains("janitor done: 2 SUCCESS row(s)"), "{text}");
    assert!(text.contains("batch 1: 2 row(s) deleted"), "{text}");
    let counts = p.status_counts().await;
    assert_eq!(counts.get("FAILED"), Some(&2), "{counts:?}");
    assert_eq!(counts.get("SUCCESS"), None, "{counts:?}");

    let _ = client
        .batch_execute(&format!("DROP TABLE IF EXISTS \"{archive}\""))
        .await;
    p.cleanup().await;
}
