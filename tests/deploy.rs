//! The operations kit in `deploy/`: the Prometheus alert rules pass `promtool check rules`
//! and their unit tests (`promtool test rules`), and every metric the rules and the Grafana
//! dashboard use is one outboxd documents (the metrics list of `docs/operations.md`), so a
//! renamed metric cannot leave an alert that never fires.

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
    let operations =
        std::fs::read_to_string(root().join("docs/operations.md")).expect("docs/operations.md");
    let documented = metric_names(&operations);
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
                "the {file} use `{name}`, which docs/operations.md does not list"
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

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A shipped config: valid for outboxd (parsed and validated as `run` does, without
/// reading its secret files), and as a plain table for the paths it names.
fn shipped_config(path: &str) -> (outboxd::config::Config, toml::Table) {
    let text = read(path);
    let config = outboxd::config::Config::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    config.validate().unwrap_or_else(|e| panic!("{path}: {e}"));
    (config, text.parse().expect("TOML"))
}

fn string_at<'t>(table: &'t toml::Table, section: &str, key: &str) -> &'t str {
    table[section][key]
        .as_str()
        .unwrap_or_else(|| panic!("{section}.{key}"))
}

/// The line of `text` that starts with `prefix`, without it.
fn line_after<'t>(text: &'t str, prefix: &str) -> &'t str {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix}"))
        .trim()
}

#[test]
fn the_systemd_unit_runs_outboxd_with_the_config_and_credential_it_ships() {
    let unit = read("deploy/systemd/outboxd.service");
    let (config, table) = shipped_config("deploy/systemd/outboxd.toml");
    assert_eq!(
        line_after(&unit, "ExecStart="),
        "/usr/local/bin/outboxd run --config /etc/outboxd/outboxd.toml"
    );
    // The password file is the credential the unit loads.
    let password_file = string_at(&table, "source", "password_file");
    let credential = password_file
        .strip_prefix("/run/credentials/outboxd.service/")
        .expect("a systemd credential");
    assert!(
        line_after(&unit, "LoadCredential=").starts_with(&format!("{credential}:")),
        "LoadCredential names {credential}"
    );
    // systemd waits longer than outboxd drains before it kills.
    let stop: u64 = line_after(&unit, "TimeoutStopSec=")
        .trim_end_matches('s')
        .parse()
        .expect("seconds");
    assert!(stop > config.delivery.shutdown_deadline.as_secs());
    // A config error (exit 2, see src/main.rs) must not restart in a loop.
    assert_eq!(line_after(&unit, "RestartPreventExitStatus="), "2");
    // The sandbox (docs/deployment.md, "Running under systemd and Kubernetes").
    for (key, value) in [
        ("NoNewPrivileges=", "yes"),
        ("ProtectSystem=", "strict"),
        ("CapabilityBoundingSet=", ""),
        ("SystemCallFilter=", "@system-service"),
        ("SystemCallArchitectures=", "native"),
        ("RestrictSUIDSGID=", "yes"),
        ("ProtectClock=", "yes"),
        ("ProtectKernelLogs=", "yes"),
        ("UMask=", "0077"),
    ] {
        assert_eq!(line_after(&unit, key), value, "{key}");
    }
}

#[test]
fn the_kubernetes_manifests_probe_mount_and_run_what_the_config_says() {
    let deployment = read("deploy/kubernetes/deployment.yaml");
    let (config, table) = shipped_config("deploy/kubernetes/outboxd.toml");
    assert!(read("deploy/kubernetes/kustomization.yaml").contains("- outboxd.toml"));
    assert!(deployment.contains(r#"args: ["run", "--config", "/etc/outboxd/outboxd.toml"]"#));
    assert!(deployment.contains("mountPath: /etc/outboxd/outboxd.toml"));
    // Secrets are files under the Secret's mount.
    let secrets = line_after(&deployment, "mountPath: /etc/outboxd/secrets");
    assert!(secrets.is_empty(), "the secrets mount");
    for (section, key) in [
        ("source", "password_file"),
        ("metrics", "bearer_token_file"),
    ] {
        assert!(
            string_at(&table, section, key).starts_with("/etc/outboxd/secrets/"),
            "{section}.{key} is read from the mounted Secret"
        );
    }
    // The probes reach the endpoint: it listens beyond loopback, on the container port.
    let metrics = config.metrics.as_ref().expect("[metrics]");
    assert!(
        metrics.listen.ip().is_unspecified(),
        "reachable by the kubelet"
    );
    assert_eq!(
        line_after(&deployment, "containerPort:"),
        metrics.listen.port().to_string()
    );
    assert_eq!(deployment.matches("path: /healthz").count(), 2);
    let grace: u64 = line_after(&deployment, "terminationGracePeriodSeconds:")
        .parse()
        .expect("seconds");
    assert!(grace > config.delivery.shutdown_deadline.as_secs());
    assert!(deployment.contains("replicas: 2"));
    // outboxd never calls the Kubernetes API: the pod gets no service account token.
    assert_eq!(
        line_after(&deployment, "automountServiceAccountToken:"),
        "false"
    );
}

/// The `port:` values of `text`'s lines (comments aside), as written.
fn ports(text: &str) -> Vec<&str> {
    text.lines()
        .map(|l| l.trim().trim_start_matches("- ").trim())
        .filter_map(|l| l.strip_prefix("port:"))
        .map(str::trim)
        .collect()
}

#[test]
fn the_network_policy_admits_the_endpoint_and_reaches_the_database_kafka_and_dns_only() {
    let deployment = read("deploy/kubernetes/deployment.yaml");
    let policy = read("deploy/kubernetes/networkpolicy.yaml");
    let (config, table) = shipped_config("deploy/kubernetes/outboxd.toml");
    assert!(read("deploy/kubernetes/kustomization.yaml").contains("- networkpolicy.yaml"));
    assert_eq!(line_after(&policy, "kind:"), "NetworkPolicy");
    // It selects the Deployment's pods.
    for label in [
        "app.kubernetes.io/name: outboxd",
        "app.kubernetes.io/instance: orders",
    ] {
        assert!(
            deployment.contains(label) && policy.contains(label),
            "{label}"
        );
    }
    // Both directions are closed but for the rules below.
    let types = policy
        .split_once("policyTypes:")
        .expect("policyTypes")
        .1
        .split_once("ingress:")
        .expect("ingress after policyTypes")
        .0;
    assert!(types.contains("- Ingress") && types.contains("- Egress"));
    let (ingress, egress) = policy
        .split_once("\n  ingress:")
        .expect("ingress")
        .1
        .split_once("\n  egress:")
        .expect("egress after ingress");
    // In: the endpoint's port only (metrics, health, the inbox over HTTP).
    let metrics = config.metrics.as_ref().expect("[metrics]");
    assert_eq!(ports(ingress), [metrics.listen.port().to_string()]);
    // Out: the database, Kafka's bootstrap port, DNS over UDP and TCP; nothing else.
    let source = table["source"]["port"].as_integer().expect("source.port");
    let kafka = string_at(&table, "kafka", "bootstrap_servers")
        .rsplit_once(':')
        .expect("host:port")
        .1;
    let mut out = ports(egress);
    out.sort_unstable();
    let mut want = vec![
        source.to_string(),
        kafka.to_owned(),
        "53".into(),
        "53".into(),
    ];
    want.sort_unstable();
    assert_eq!(out, want);
    assert_eq!(egress.matches("protocol: UDP").count(), 1, "DNS over UDP");
    assert_eq!(egress.matches("protocol: TCP").count(), 3);
    assert_eq!(egress.matches("- to:").count(), 3, "three destinations");
}
