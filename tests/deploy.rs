//! The operations kit in `deploy/`: the Prometheus alert rules pass `promtool check rules`
//! and their unit tests (`promtool test rules`), and every metric the rules and the Grafana
//! dashboard use is one outboxd documents (README's metrics list), so a renamed metric
//! cannot leave an alert that never fires.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `promtool`: `OUTBOXD_PROMTOOL` (set by `scripts/test`, which installs it), or on PATH.
fn promtool() -> PathBuf {
    if let Ok(path) = std::env::var("OUTBOXD_PROMTOOL") {
        return PathBuf::from(path);
    }
    let on_path = Command::new("promtool").arg("--version").output();
    assert!(
        on_path.is_ok_and(|o| o.status.success()),
        "promtool not found: run scripts/test (it installs it) or set OUTBOXD_PROMTOOL"
    );
    PathBuf::from("promtool")
}

fn run(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alert_rules_are_valid_and_pass_their_unit_tests() {
    let dir = root().join("deploy/prometheus");
    let checked = run(&dir, &["check", "rules", "outboxd.rules.yml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = run(&dir, &["test", "rules", "outboxd.rules.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// The metric names in `text`: `outboxd_…` and `process_…`, without a histogram's suffix.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for prefix in ["outboxd_", "process_"] {
        let mut rest = text;
        while let Some(at) = rest.find(prefix) {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..end];
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .fold(name, |n, suffix| n.strip_suffix(suffix).unwrap_or(n));
            names.push(name.to_owned());
            rest = &tail[end..];
        }
    }
    names.sort();
    names.dedup();
    names
}

#[test]
fn every_metric_the_kit_uses_is_documented() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let documented = metric_names(&readme);
    let rules =
        std::fs::read_to_string(root().join("deploy/prometheus/outboxd.rules.yml")).expect("rules");
    let dashboard =
        std::fs::read_to_string(root().join("deploy/grafana/outboxd.json")).expect("dashboard");
    for (file, text) in [("rules", &rules), ("dashboard", &dashboard)] {
        let used = metric_names(text);
        assert!(used.len() >= 5, "{file} uses metrics");
        for name in used {
            assert!(
                documented.contains(&name),
                "the {file} use `{name}`, which README does not list"
            );
        }
    }
}

#[test]
fn the_dashboard_is_a_grafana_dashboard_with_a_query_in_every_panel() {
    let text =
        std::fs::read_to_string(root().join("deploy/grafana/outboxd.json")).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(dashboard["uid"], "outboxd");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = Vec::new();
    for panel in panels {
        ids.push(panel["id"].as_u64().expect("a panel id"));
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(
                expr.contains("job=~\"$job\""),
                "{}: every query follows the job/instance variables",
                panel["title"]
            );
        }
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
}
