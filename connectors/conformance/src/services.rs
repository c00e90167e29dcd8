//! What the engines' tests against the servers `scripts/services` starts share besides a
//! port: the environment a test may override, the TLS files (the test CA that signed the
//! servers' certificates, and a CA that did not), and the `check` line TLS tests assert on.

use std::path::PathBuf;

use outboxd_connector::{CheckLine, CheckReport, CheckStatus};

/// Environment variable `name`, or `default` when it is not set.
#[must_use]
pub fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// The TLS file `file` of `scripts/services` (`$OUTBOXD_SERVICES_DIR/tls/<file>`), unless
/// variable `var` names another.
#[must_use]
pub fn tls_file(var: &str, file: &str) -> PathBuf {
    let state = env_or("OUTBOXD_SERVICES_DIR", "/var/tmp/outboxd-services");
    PathBuf::from(env_or(var, &format!("{state}/tls/{file}")))
}

/// The CA that signed the servers' certificates (`OUTBOXD_TEST_CA` overrides it).
#[must_use]
pub fn ca() -> PathBuf {
    tls_file("OUTBOXD_TEST_CA", "ca.crt")
}

/// A CA that signed none of them (`OUTBOXD_TEST_WRONG_CA` overrides it).
#[must_use]
pub fn wrong_ca() -> PathBuf {
    tls_file("OUTBOXD_TEST_WRONG_CA", "wrong-ca.crt")
}

/// Panics unless `report` has a `tls` line of `status` whose detail contains `detail`;
/// the line, for further assertions.
pub fn assert_tls_line<'a>(
    report: &'a CheckReport,
    status: CheckStatus,
    detail: &str,
) -> &'a CheckLine {
    let tls = (report.iter().find(|l| l.item == "tls"))
        .unwrap_or_else(|| panic!("no tls line in {report:?}"));
    assert_eq!(tls.status, status, "{tls}");
    assert!(tls.detail.contains(detail), "`{detail}` not in: {tls}");
    tls
}
