//! Secrets never reach the output: `init`, `check` and `run` (with a working source, a
//! refused port and a wrong password) and configs with mistakes next to a password, each
//! with distinctive secret values; none of them appears in stdout, stderr, the log, or
//! what `/metrics` and `/readyz` answer. Passwords given as files or in the environment
//! work end to end, and a config file holding secrets readable by others gets a `check`
//! warning.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::engine::Engine as _;
use common::postgres::{PgServices, TestPipeline};
use common::{free_port, http_get, metrics_section, run_outboxd, wait_for};
use rand::Rng;

/// Everything outboxd printed, labelled, to search for secrets at the end.
#[derive(Default)]
struct Printed(Vec<(String, String)>);

impl Printed {
    fn output(&mut self, label: &str, out: &Output) -> String {
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.0.push((label.to_owned(), text.clone()));
        text
    }

    fn text(&mut self, label: &str, text: String) {
        self.0.push((label.to_owned(), text));
    }

    fn assert_free_of(&self, secrets: &[&str]) {
        for (label, text) in &self.0 {
            for secret in secrets {
                assert!(
                    !text.contains(secret),
                    "a secret appears in {label}:\n{text}"
                );
            }
        }
    }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// `outboxd <args>` with the most verbose log there is.
fn outboxd(config: &Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(args)
        .arg("--config")
        .arg(config)
        .env("OUTBOXD_LOG", "trace")
        .output()
        .expect("run outboxd")
}

/// Starts `outboxd run` with a trace log; returns its log once it has logged that it
/// retries or an error (or exited), stopping it.
async fn run_until_it_complains(config: &Path, log: &Path) -> String {
    let mut daemon = common::spawn_outboxd(config, log, "trace");
    wait_for("a retry or an error in the run log", Duration::from_secs(30), || {
        let done = !daemon.is_running();
        let text = daemon.log_text();
        async move { (done || text.contains("retrying") || text.contains("ERROR")).then_some(()) }
    })
    .await;
    daemon.kill9();
    daemon.log_text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_any_output() {
    let tag: u32 = rand::thread_rng().gen_range(100_000..999_999);
    let role = format!("secrets_{tag}");
    let password = format!("Pg-Zq{tag}-hunter");
    let wrong = format!("Wrong-Zq{tag}-guess");
    let sasl = format!("Sasl-Zq{tag}-pass");
    let ssl_key = format!("Key-Zq{tag}-pass");
    let secrets = [
        password.as_str(),
        wrong.as_str(),
        sasl.as_str(),
        ssl_key.as_str(),
    ];

    // A role that logs in with the distinctive password (SCRAM).
    let admin = PgServices::from_env();
    let (client, connection) =
        tokio_postgres::connect(&admin.pg_conn_string(), tokio_postgres::NoTls)
            .await
            .expect("connect to the test PostgreSQL (is `scripts/services start` running?)");
    tokio::spawn(connection);
    // Not a superuser: the admin role's privileges of README's "Privileges" (it owns what
    // `init` makes, so it may also run what the runtime role runs).
    client
        .batch_execute(&format!(
            "SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{password}'; \
             GRANT CREATE ON DATABASE \"{}\" TO {role}; \
             GRANT CREATE ON SCHEMA public TO {role}",
            admin.pg_database
        ))
        .await
        .expect("create the test role");
    // This test is about secrets, not privileges: outboxd runs everything (`init` too) as
    // that one role; the test's own SQL stays with the test's role.
    let services = PgServices {
        run_user: role.clone(),
        run_password: password.clone(),
        admin_user: role.clone(),
        admin_password: password.clone(),
        ..PgServices::from_env()
    };
    let port = free_port();
    let extra = format!(
        "[kafka.options]\n\"sasl.password\" = \"{sasl}\"\n\"ssl.key.password\" = \"{ssl_key}\"\n{}",
        metrics_section(port)
    );
    let p = TestPipeline::on(services, "secrets", 1, &extra).await;
    let config = std::fs::read_to_string(&p.config_path).expect("config");
    assert!(config.contains(&password) && config.contains(&sasl));
    let mut printed = Printed::default();

    // The secrets in the file, readable by everyone: init works, check warns with the fix.
    chmod(&p.config_path, 0o644);
    let out = outboxd(&p.config_path, &["init"]);
    let text = printed.output("init", &out);
    assert!(out.status.success(), "{text}");
    // The checkpoint table is shared with other tests, made by whichever `init` ran first.
    PgServices::grant_runtime(&p).await;
    let out = outboxd(&p.config_path, &["check"]);
    let text = printed.output("check (secrets in a 0644 file)", &out);
    assert!(
        text.contains("readable by everyone") && text.contains("chmod 600"),
        "{text}"
    );
    assert!(text.contains("source.password"), "{text}");

    // run: streaming, then /metrics and /readyz.
    let mut daemon = common::spawn_outboxd(&p.config_path, &p.dir.join("run.log"), "trace");
    let ready = wait_for("/readyz 200", Duration::from_secs(60), || async {
        http_get(port, "/readyz").await.filter(|(s, _)| *s == 200)
    })
    .await;
    printed.text("/readyz", ready.1);
    let (_, metrics) = http_get(port, "/metrics").await.expect("/metrics");
    printed.text("/metrics", metrics);
    daemon.terminate();
    let log = daemon.log_text();
    assert!(
        log.contains("readable by everyone"),
        "the run log warns about the file:\n{log}"
    );
    printed.text("run log", log);

    // The same secrets from files (0600) and a 0600 config: check passes, no warning.
    let pw_file = p.dir.join("pg.password");
    let sasl_file = p.dir.join("sasl.password");
    std::fs::write(&pw_file, format!("{password}\n")).expect("password file");
    std::fs::write(&sasl_file, format!("{sasl}\n")).expect("sasl file");
    chmod(&pw_file, 0o600);
    chmod(&sasl_file, 0o600);
    let from_files = config
        .replacen(
            &format!("password = \"{password}\""),
            &format!("password_file = \"{}\"", pw_file.display()),
            1,
        )
        .replacen(&format!("\"sasl.password\" = \"{sasl}\"\n"), "", 1)
        .replacen(&format!("\"ssl.key.password\" = \"{ssl_key}\"\n"), "", 1)
        .replacen(
            "[kafka.options]",
            &format!(
                "sasl_password_file = \"{}\"\n[kafka.options]",
                sasl_file.display()
            ),
            1,
        );
    assert!(!from_files.contains(&password) && !from_files.contains(&sasl));
    let files_config = p.dir.join("from-files.toml");
    std::fs::write(&files_config, &from_files).expect("config");
    chmod(&files_config, 0o600);
    let out = outboxd(&files_config, &["check"]);
    let text = printed.output("check (secrets from files)", &out);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("chmod 600"), "{text}");
    // A secret file others may read is warned about like the config file (a warning:
    // check still passes), naming the key, the file and the fix.
    chmod(&pw_file, 0o644);
    let out = outboxd(&files_config, &["check"]);
    let text = printed.output("check (a readable password file)", &out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("source.password_file")
            && text.contains(&format!("chmod 600 {}", pw_file.display())),
        "{text}"
    );
    chmod(&pw_file, 0o600);

    // The password from the environment instead: the file names none, check passes.
    let pw_line = format!("password_file = \"{}\"\n", pw_file.display());
    assert!(from_files.contains(&pw_line));
    let env_config = p.dir.join("from-env.toml");
    std::fs::write(&env_config, from_files.replacen(&pw_line, "", 1)).expect("config");
    chmod(&env_config, 0o600);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(["check", "--config"])
        .arg(&env_config)
        .env("OUTBOXD_LOG", "trace")
        .env("OUTBOXD_SOURCE_PASSWORD", &password)
        .output()
        .expect("run outboxd");
    let text = printed.output("check (password from the environment)", &out);
    assert!(out.status.success(), "{text}");

    // A refused port and a wrong password: check reports, run fails or retries.
    let closed = free_port();
    for (label, broken) in [
        (
            "refused port",
            config.replacen(
                &format!("port = {}", p.services.pg_port),
                &format!("port = {closed}"),
                1,
            ),
        ),
        ("wrong password", config.replacen(&password, &wrong, 1)),
    ] {
        let path = p.dir.join("broken.toml");
        std::fs::write(&path, broken).expect("config");
        let out = outboxd(&path, &["check"]);
        let text = printed.output(&format!("check ({label})"), &out);
        assert!(!out.status.success(), "{label}: {text}");
        let log = run_until_it_complains(&path, &p.dir.join("broken.log")).await;
        assert!(
            log.contains("ERROR") || log.contains("WARN"),
            "{label}: {log}"
        );
        printed.text(&format!("run log ({label})"), log);
    }

    // Mistakes next to a password, and on its line: the error names the line, never the
    // value.
    for (label, mistake) in [
        (
            "typo next to the password",
            config.replacen("database = ", "databse = ", 1),
        ),
        (
            "unterminated password",
            config.replacen(&format!("\"{password}\""), &format!("\"{password}"), 1),
        ),
        (
            "misspelled password key",
            config.replacen("password = ", "pasword = ", 1),
        ),
        (
            "misspelled sasl.password",
            config.replacen("\"sasl.password\" = ", "\"sasl.pasword\" = ", 1),
        ),
        (
            "password not a string",
            config.replacen(&format!("\"{password}\""), &format!("{tag}{tag}"), 1),
        ),
    ] {
        let path = p.dir.join("mistake.toml");
        std::fs::write(&path, mistake).expect("config");
        for command in ["check", "run", "init"] {
            let out = run_outboxd(&path, &[command]);
            let text = printed.output(&format!("{command} ({label})"), &out);
            assert_eq!(out.status.code(), Some(2), "{label}: {text}");
            assert!(
                text.contains("line ") || text.contains("sasl.pasword"),
                "{label}: {text}"
            );
        }
    }
    let numeric = format!("{tag}{tag}");

    printed.assert_free_of(&secrets);
    printed.assert_free_of(&[numeric.as_str()]);

    p.cleanup().await;
    client
        .batch_execute(&format!(
            "REASSIGN OWNED BY {role} TO CURRENT_USER; DROP OWNED BY {role}; DROP ROLE {role}"
        ))
        .await
        .expect("drop the test role");
}
