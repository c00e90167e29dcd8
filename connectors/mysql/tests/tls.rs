//! Verified TLS on the MariaDB connections (SQL, and the binlog stream with its lock
//! connection, which are opened the same way), against the MariaDB of `scripts/services`
//! (its certificate is signed by the local test CA the script makes), and against a tiny
//! protocol peer on loopback for a server without TLS.
//!
//! Run: `scripts/services start mariadb && eval "$(scripts/services env)" && cargo test
//! -p outboxd-mysql --test tls`. Reads OUTBOXD_TEST_MYSQL_* like the other tests, and
//! OUTBOXD_TEST_CA, OUTBOXD_TEST_WRONG_CA, OUTBOXD_TEST_CLIENT_CERT, OUTBOXD_TEST_CLIENT_KEY,
//! OUTBOXD_TEST_CLIENT_USER (defaults: the files under the services' state directory).

mod support;

use std::path::PathBuf;

use mysql_async::prelude::Queryable;
use outboxd_conformance::services::{assert_tls_line, ca, env_or as env, tls_file, wrong_ca};
use outboxd_connector::{CheckStatus, ConnectorError, ErrorKind, OutboxLayout};
use outboxd_mysql::{MysqlConfig, MysqlConnector, SslMode};
use support::Fixture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn config(mode: SslMode, rootcert: Option<PathBuf>) -> MysqlConfig {
    MysqlConfig {
        sslmode: mode,
        sslrootcert: rootcert,
        ..support::config()
    }
}

fn connector(cfg: MysqlConfig) -> Result<MysqlConnector, ConnectorError> {
    MysqlConnector::new(cfg, "tls", OutboxLayout::default())
}

/// The TLS version the server sees on a SQL connection (empty: none), and the user.
async fn sql_tls(cfg: MysqlConfig) -> Result<(String, String), ConnectorError> {
    let mut conn = connector(cfg)?.sql_conn().await?;
    let version: Option<(String, String)> = conn
        .query_first("SHOW SESSION STATUS LIKE 'Ssl_version'")
        .await
        .expect("Ssl_version");
    let user: Option<String> = conn
        .query_first("SELECT CURRENT_USER()")
        .await
        .expect("CURRENT_USER()");
    Ok((
        version.map(|(_, v)| v).unwrap_or_default(),
        user.unwrap_or_default(),
    ))
}

fn assert_refused(e: &ConnectorError, needle: &str) {
    assert_eq!(e.kind(), ErrorKind::Definite, "{e}");
    assert!(e.to_string().contains(needle), "`{needle}` not in: {e}");
}

#[tokio::test]
async fn verify_full_with_the_right_ca_verifies_sql_and_binlog_connections() {
    let (version, _) = sql_tls(config(SslMode::VerifyFull, Some(ca())))
        .await
        .expect("verified SQL connection");
    assert!(version.starts_with("TLS"), "{version:?}");

    // The binlog stream (and its lock connection) under the same mode.
    let mut f = Fixture::new("tls_full");
    f.connector = MysqlConnector::new(
        config(SslMode::VerifyFull, Some(ca())),
        &f.name,
        f.connector.layout().clone(),
    )
    .unwrap();
    f.connector.init().await.expect("init over verified TLS");
    let stream = f.connector.open_stream().await.expect("verified binlog");
    drop(stream);

    let report = f.connector.check().await;
    assert_tls_line(
        &report,
        CheckStatus::Ok,
        "certificate verified for 127.0.0.1 (sslmode=verify-full)",
    );

    // With a CA that did not sign the server's certificate, neither opens.
    f.connector = MysqlConnector::new(
        config(SslMode::VerifyFull, Some(wrong_ca())),
        &f.name,
        f.connector.layout().clone(),
    )
    .unwrap();
    let e = f
        .connector
        .open_stream()
        .await
        .expect_err("wrong CA accepted");
    assert_refused(&e, "could not be verified");
    f.cleanup().await;

    // require without a CA: encrypted, not verified, and check says so.
    let report = connector(config(SslMode::Require, None))
        .unwrap()
        .check()
        .await;
    assert_tls_line(
        &report,
        CheckStatus::Warn,
        "certificate NOT verified (sslmode=require)",
    );
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    for mode in [SslMode::VerifyFull, SslMode::VerifyCa, SslMode::Require] {
        // require with sslrootcert is verify-ca, as in libpq.
        let e = sql_tls(config(mode, Some(wrong_ca())))
            .await
            .expect_err("wrong CA accepted");
        assert_refused(&e, "could not be verified");
        assert_refused(&e, "source.sslrootcert");
    }
}

#[tokio::test]
async fn a_host_name_the_certificate_lacks_is_refused_by_verify_full_only() {
    // A byte pipe from 127.0.0.2, an address the certificate does not name.
    let listener = TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2");
    let forwarded = listener.local_addr().unwrap().port();
    let target = support::config().port;
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    let at = |mode, rootcert| MysqlConfig {
        host: "127.0.0.2".into(),
        port: forwarded,
        ..config(mode, rootcert)
    };
    let e = sql_tls(at(SslMode::VerifyFull, Some(ca())))
        .await
        .expect_err("a certificate for 127.0.0.1 accepted for 127.0.0.2");
    assert_refused(&e, "host name could not be verified");
    for mode in [SslMode::VerifyCa, SslMode::Require] {
        let (version, _) = sql_tls(at(mode, Some(ca())))
            .await
            .expect("verify-ca does not check the name");
        assert!(version.starts_with("TLS"), "{version:?}");
    }
}

#[tokio::test]
async fn a_client_certificate_logs_in_as_its_user() {
    let user = env("OUTBOXD_TEST_CLIENT_USER", "outboxd_cert");
    let with_cert = MysqlConfig {
        user: user.clone(),
        password: None,
        password_file: None,
        sslcert: Some(tls_file("OUTBOXD_TEST_CLIENT_CERT", "client.crt")),
        sslkey: Some(tls_file("OUTBOXD_TEST_CLIENT_KEY", "client.key")),
        ..config(SslMode::VerifyFull, Some(ca()))
    };
    let (version, current) = sql_tls(with_cert.clone()).await.expect("certificate login");
    assert!(version.starts_with("TLS"));
    assert!(current.starts_with(&format!("{user}@")), "{current}");
    let without = MysqlConfig {
        sslcert: None,
        sslkey: None,
        ..with_cert
    };
    let e = sql_tls(without)
        .await
        .expect_err("no certificate, no login");
    assert!(e.to_string().contains("Access denied"), "{e}");
}

/// A MySQL server greeting without CLIENT_SSL in its capabilities.
async fn server_without_tls() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                // PROTOCOL_41 | LONG_PASSWORD | CONNECT_WITH_DB | SECURE_CONNECTION |
                // PLUGIN_AUTH; no SSL (0x800).
                let caps: u32 = 0x0000_0200 | 0x1 | 0x8 | 0x0000_8000 | 0x0008_0000;
                let mut body = vec![10u8];
                body.extend_from_slice(b"5.7.99-fake\0");
                body.extend_from_slice(&7u32.to_le_bytes());
                body.extend_from_slice(b"abcdefgh\0");
                body.extend_from_slice(&(caps as u16).to_le_bytes());
                body.push(33);
                body.extend_from_slice(&2u16.to_le_bytes());
                body.extend_from_slice(&((caps >> 16) as u16).to_le_bytes());
                body.push(21);
                body.extend_from_slice(&[0; 10]);
                body.extend_from_slice(b"ijklmnopqrst\0");
                body.extend_from_slice(b"mysql_native_password\0");
                let len = u32::try_from(body.len()).unwrap().to_le_bytes();
                let mut packet = vec![len[0], len[1], len[2], 0];
                packet.extend_from_slice(&body);
                let _ = tcp.write_all(&packet).await;
                let mut rest = Vec::new();
                let _ = tokio::time::timeout(
                    std::time::Duration::from_secs(3),
                    tcp.read_to_end(&mut rest),
                )
                .await;
            });
        }
    });
    port
}

#[tokio::test]
async fn a_server_without_tls_is_refused_under_require_and_above() {
    let port = server_without_tls().await;
    for (mode, rootcert) in [
        (SslMode::Require, None),
        (SslMode::VerifyCa, Some(ca())),
        (SslMode::VerifyFull, Some(ca())),
    ] {
        let cfg = MysqlConfig {
            port,
            ..config(mode, rootcert)
        };
        let e = sql_tls(cfg).await.expect_err("downgrade accepted");
        assert_refused(&e, "does not offer TLS");
    }
}
