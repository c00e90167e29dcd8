//! Verified TLS on the SQL and the replication connection, against the real PostgreSQL of
//! `scripts/services` (its certificate is signed by the local test CA the script makes),
//! and against tiny protocol peers on loopback for what a real server will not do: refuse
//! TLS, or ask for a cleartext or MD5 password.
//!
//! Run: `scripts/services start postgres && eval "$(scripts/services env)" && cargo test
//! -p outboxd-postgres --test tls`. Reads OUTBOXD_TEST_PG_* like the other tests, and
//! OUTBOXD_TEST_CA, OUTBOXD_TEST_WRONG_CA, OUTBOXD_TEST_CLIENT_CERT, OUTBOXD_TEST_CLIENT_KEY,
//! OUTBOXD_TEST_CLIENT_USER (defaults: the files under the services' state directory).

use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use openssl::ssl::{SslAcceptor, SslFiletype, SslMethod};
use outboxd_conformance::services::{assert_tls_line, ca, env_or as env, tls_file, wrong_ca};
use outboxd_connector::{CheckStatus, ConnectorError, ErrorKind, OutboxLayout};
use outboxd_connector_kit::tls::{Negotiated, Verification};
use outboxd_postgres::replication::ReplicationConnection;
use outboxd_postgres::{PostgresConfig, PostgresConnector, SslMode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

fn port() -> u16 {
    env("OUTBOXD_TEST_PG_PORT", "25432")
        .parse()
        .expect("OUTBOXD_TEST_PG_PORT")
}

/// The test role over TLS in `mode`, trusting `rootcert`.
fn config(mode: SslMode, rootcert: Option<PathBuf>) -> PostgresConfig {
    PostgresConfig {
        host: env("OUTBOXD_TEST_PG_HOST", "127.0.0.1"),
        port: port(),
        user: env("OUTBOXD_TEST_PG_USER", "outboxd"),
        password: Some(env("OUTBOXD_TEST_PG_PASSWORD", "outboxd").into()),
        password_file: None,
        database: env("OUTBOXD_TEST_PG_DATABASE", "outboxd"),
        sslmode: mode,
        sslrootcert: rootcert,
        sslcert: None,
        sslkey: None,
        allow_insecure_password: false,
        slot: None,
        publication: None,
        slot_failover: false,
        status_interval: Duration::from_secs(10),
        silence_timeout: Duration::from_secs(120),
        connect_timeout: Duration::from_secs(10),
    }
}

fn connector(cfg: PostgresConfig) -> Result<PostgresConnector, ConnectorError> {
    PostgresConnector::new(cfg, "tls", OutboxLayout::default())
}

/// `(ssl, version)` of the SQL connection's own row in `pg_stat_ssl`.
async fn sql_ssl(cfg: PostgresConfig) -> Result<(bool, Option<String>, String), ConnectorError> {
    let client = connector(cfg)?.sql_client().await?;
    let row = client
        .query_one(
            "SELECT ssl, version, current_user::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl");
    Ok((row.get(0), row.get(1), row.get(2)))
}

/// Opens a replication connection, runs IDENTIFY_SYSTEM, returns what its TLS verified.
async fn replication(cfg: PostgresConfig) -> Result<Negotiated, ConnectorError> {
    let mut conn = ReplicationConnection::connect(&cfg).await?;
    let system = conn.identify_system().await?;
    assert_eq!(system.dbname.as_deref(), Some(cfg.database.as_str()));
    Ok(conn.negotiated().clone())
}

fn assert_verified(negotiated: &Negotiated, expected: Verification) {
    match negotiated {
        Negotiated::Tls { version, verified } => {
            assert_eq!(*verified, expected);
            assert!(version.starts_with("TLS"), "{version}");
        }
        Negotiated::Plain => panic!("expected TLS, got a plain connection"),
    }
}

fn assert_refused(e: &ConnectorError, needle: &str) {
    assert_eq!(e.kind(), ErrorKind::Definite, "{e}");
    assert!(e.to_string().contains(needle), "`{needle}` not in: {e}");
}

#[tokio::test]
async fn verify_full_with_the_right_ca_verifies_both_connections_and_check_says_so() {
    let cfg = config(SslMode::VerifyFull, Some(ca()));
    let (ssl, version, _) = sql_ssl(cfg.clone()).await.expect("verified SQL connection");
    assert!(ssl, "the server sees TLS");
    assert!(version.unwrap_or_default().starts_with("TLS"));
    assert_verified(
        &replication(cfg.clone())
            .await
            .expect("verified replication connection"),
        Verification::ChainAndHost,
    );

    let report = connector(cfg).unwrap().check().await;
    let line = |item: &str| {
        report
            .iter()
            .find(|l| l.item == item)
            .unwrap_or_else(|| panic!("no `{item}` line in {report:?}"))
            .clone()
    };
    for item in ["tls", "replication tls"] {
        let l = line(item);
        assert_eq!(l.status, CheckStatus::Ok, "{l}");
        assert!(
            l.detail
                .contains("certificate verified for 127.0.0.1 (sslmode=verify-full)"),
            "{l}"
        );
    }

    // require: encrypted, not verified, and check says so.
    let report = connector(config(SslMode::Require, None))
        .unwrap()
        .check()
        .await;
    let tls = assert_tls_line(
        &report,
        CheckStatus::Warn,
        "certificate NOT verified (sslmode=require)",
    );
    // The warning ends the line: nothing after it softens it.
    assert!(
        tls.detail
            .ends_with("certificate NOT verified (sslmode=require)"),
        "{tls}"
    );
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    for mode in [SslMode::VerifyFull, SslMode::VerifyCa, SslMode::Require] {
        // require with sslrootcert is verify-ca, as in libpq.
        let cfg = config(mode, Some(wrong_ca()));
        let e = sql_ssl(cfg.clone()).await.expect_err("wrong CA accepted");
        assert_refused(&e, "could not be verified");
        assert_refused(&e, "source.sslrootcert");
        let e = replication(cfg).await.expect_err("wrong CA accepted");
        assert_refused(&e, "could not be verified");
    }
}

/// A byte pipe from `127.0.0.2:<port>` to the server: a connection by an address the
/// server's certificate does not name.
async fn other_address_forwarder() -> u16 {
    let listener = TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2");
    let port_here = listener.local_addr().unwrap().port();
    let target = port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    port_here
}

#[tokio::test]
async fn a_host_name_the_certificate_lacks_is_refused_by_verify_full_only() {
    let forwarded = other_address_forwarder().await;
    let at = |mode, rootcert| PostgresConfig {
        host: "127.0.0.2".into(),
        port: forwarded,
        ..config(mode, rootcert)
    };
    let e = sql_ssl(at(SslMode::VerifyFull, Some(ca())))
        .await
        .expect_err("a certificate for 127.0.0.1 accepted for 127.0.0.2");
    assert_refused(&e, "host name could not be verified");
    assert_refused(&e, "IP address mismatch");
    let e = replication(at(SslMode::VerifyFull, Some(ca())))
        .await
        .expect_err("accepted for 127.0.0.2");
    assert_refused(&e, "host name could not be verified");

    for mode in [SslMode::VerifyCa, SslMode::Require] {
        let (ssl, _, _) = sql_ssl(at(mode, Some(ca())))
            .await
            .expect("verify-ca does not check the name");
        assert!(ssl);
        assert_verified(
            &replication(at(mode, Some(ca()))).await.expect("verify-ca"),
            Verification::Chain,
        );
    }
}

#[tokio::test]
async fn a_client_certificate_logs_in_as_its_role() {
    let user = env("OUTBOXD_TEST_CLIENT_USER", "outboxd_cert");
    let with_cert = PostgresConfig {
        user: user.clone(),
        password: None,
        password_file: None,
        sslcert: Some(tls_file("OUTBOXD_TEST_CLIENT_CERT", "client.crt")),
        sslkey: Some(tls_file("OUTBOXD_TEST_CLIENT_KEY", "client.key")),
        ..config(SslMode::VerifyFull, Some(ca()))
    };
    let (ssl, _, current_user) = sql_ssl(with_cert.clone()).await.expect("certificate login");
    assert!(ssl);
    assert_eq!(current_user, user);
    assert_verified(
        &replication(with_cert.clone())
            .await
            .expect("certificate login, replication"),
        Verification::ChainAndHost,
    );

    // Without the certificate the same role cannot log in.
    let without = PostgresConfig {
        sslcert: None,
        sslkey: None,
        ..with_cert.clone()
    };
    let e = sql_ssl(without)
        .await
        .expect_err("no certificate, no login");
    assert!(e.to_string().contains("certificate"), "{e}");

    // A key that is not the certificate's is a config error naming both keys.
    let e = connector(PostgresConfig {
        sslkey: Some(tls_file("OUTBOXD_TEST_CA_KEY", "wrong-ca.key")),
        ..with_cert
    })
    .expect_err("mismatched key");
    assert_refused(&e, "source.sslkey");
}

#[tokio::test]
async fn missing_files_are_config_errors_naming_key_and_path() {
    let e = connector(config(
        SslMode::VerifyFull,
        Some("/nonexistent/ca.pem".into()),
    ))
    .expect_err("missing CA file");
    assert_refused(
        &e,
        "source.sslrootcert = `/nonexistent/ca.pem` cannot be read",
    );
    let e = connector(config(SslMode::VerifyCa, None)).expect_err("verify-ca without a CA");
    assert_refused(&e, "needs source.sslrootcert");
    let e = connector(config(SslMode::Require, Some(tls_file("X", "client.key"))))
        .expect_err("a key is not a CA file");
    assert_refused(&e, "does not hold CA certificates");
}

// ---- Protocol peers on loopback ---------------------------------------------------------

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

const SSL_REQUEST: u32 = 80_877_103;

/// How the fake server answers.
#[derive(Clone, Copy)]
enum Peer {
    /// 'N' to SSLRequest, then this authentication request.
    NoTls(Auth),
    /// 'S' (TLS with the local CA's server certificate), then this authentication request.
    Tls(Auth),
}

#[derive(Clone, Copy)]
enum Auth {
    Cleartext,
    Md5,
    /// AuthenticationSASL offering SCRAM-SHA-256-PLUS and SCRAM-SHA-256.
    ScramPlus,
}

/// A server on loopback that speaks the start of PostgreSQL's protocol as `peer` says,
/// then reports what the client sent after the authentication request (until it closes,
/// or 3 s).
async fn fake_server(peer: Peer) -> (u16, mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Ok(after) = serve(tcp, peer).await {
                    let _ = tx.send(after);
                }
            });
        }
    });
    (port, rx)
}

async fn serve(mut tcp: TcpStream, peer: Peer) -> std::io::Result<Vec<u8>> {
    let len = tcp.read_u32().await?;
    let code = tcp.read_u32().await?;
    let (mut io, auth): (Box<dyn Io>, Auth) = if code == SSL_REQUEST {
        match peer {
            Peer::NoTls(auth) => {
                tcp.write_all(b"N").await?;
                let len = tcp.read_u32().await?;
                let mut startup = vec![0; len as usize - 4];
                tcp.read_exact(&mut startup).await?;
                (Box::new(tcp), auth)
            }
            Peer::Tls(auth) => {
                tcp.write_all(b"S").await?;
                let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
                acceptor
                    .set_certificate_chain_file(tls_file("X", "postgres.crt"))
                    .unwrap();
                acceptor
                    .set_private_key_file(tls_file("X", "postgres.key"), SslFiletype::PEM)
                    .unwrap();
                let ssl = openssl::ssl::Ssl::new(acceptor.build().context()).unwrap();
                let mut tls = tokio_openssl::SslStream::new(ssl, tcp).unwrap();
                Pin::new(&mut tls)
                    .accept()
                    .await
                    .map_err(std::io::Error::other)?;
                let len = tls.read_u32().await?;
                let mut startup = vec![0; len as usize - 4];
                tls.read_exact(&mut startup).await?;
                (Box::new(tls), auth)
            }
        }
    } else {
        // sslmode=disable: this was the startup message.
        let mut rest = vec![0; len as usize - 8];
        tcp.read_exact(&mut rest).await?;
        match peer {
            Peer::NoTls(auth) | Peer::Tls(auth) => (Box::new(tcp), auth),
        }
    };
    let request: Vec<u8> = match auth {
        Auth::Cleartext => [&b"R"[..], &8u32.to_be_bytes(), &3u32.to_be_bytes()].concat(),
        Auth::Md5 => [
            &b"R"[..],
            &12u32.to_be_bytes(),
            &5u32.to_be_bytes(),
            b"salt",
        ]
        .concat(),
        Auth::ScramPlus => {
            let body = b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0";
            let len = u32::try_from(8 + body.len()).unwrap();
            [
                &b"R"[..],
                &len.to_be_bytes(),
                &10u32.to_be_bytes(),
                &body[..],
            ]
            .concat()
        }
    };
    io.write_all(&request).await?;
    io.flush().await?;
    let mut after = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), io.read_to_end(&mut after)).await;
    Ok(after)
}

fn fake_config(port: u16, mode: SslMode) -> PostgresConfig {
    PostgresConfig {
        host: "127.0.0.1".into(),
        port,
        password: Some("secret-password".into()),
        password_file: None,
        connect_timeout: Duration::from_secs(5),
        ..config(mode, None)
    }
}

#[tokio::test]
async fn a_server_without_tls_is_refused_under_require_and_above() {
    let (port, _) = fake_server(Peer::NoTls(Auth::Cleartext)).await;
    for (mode, rootcert) in [
        (SslMode::Require, None),
        (SslMode::VerifyCa, Some(ca())),
        (SslMode::VerifyFull, Some(ca())),
    ] {
        let cfg = PostgresConfig {
            sslrootcert: rootcert,
            ..fake_config(port, mode)
        };
        let e = sql_ssl(cfg.clone()).await.expect_err("downgrade accepted");
        assert_refused(&e, "does not offer TLS");
        let e = replication(cfg).await.expect_err("downgrade accepted");
        assert_refused(&e, "does not offer TLS");
    }
}

#[tokio::test]
async fn a_password_is_not_sent_in_cleartext_or_md5_over_an_unverified_channel() {
    for auth in [Auth::Cleartext, Auth::Md5] {
        for (peer, mode) in [
            (Peer::NoTls(auth), SslMode::Disable),
            (Peer::NoTls(auth), SslMode::Prefer),
            (Peer::Tls(auth), SslMode::Require),
        ] {
            let (port, mut sent) = fake_server(peer).await;
            let cfg = fake_config(port, mode);
            let e = sql_ssl(cfg.clone()).await.expect_err("password sent");
            assert_refused(&e, "source.allow_insecure_password");
            let e = replication(cfg).await.expect_err("password sent");
            assert_refused(&e, "source.allow_insecure_password");
            for _ in 0..2 {
                let after = sent.recv().await.expect("the server saw the client");
                assert!(
                    !after.contains(&b'p'),
                    "the client answered the password request: {after:?}"
                );
            }
        }
    }

    // Allowed explicitly: the password goes out (a PasswordMessage, 'p').
    let (port, mut sent) = fake_server(Peer::NoTls(Auth::Cleartext)).await;
    let cfg = PostgresConfig {
        allow_insecure_password: true,
        ..fake_config(port, SslMode::Disable)
    };
    let _ = replication(cfg).await;
    let after = sent.recv().await.expect("the server saw the client");
    assert_eq!(after.first(), Some(&b'p'), "{after:?}");
    assert!(after.windows(15).any(|w| w == b"secret-password"));
}

#[tokio::test]
async fn the_replication_connection_binds_scram_to_the_tls_channel() {
    let (port, mut sent) = fake_server(Peer::Tls(Auth::ScramPlus)).await;
    let cfg = PostgresConfig {
        sslrootcert: Some(ca()),
        ..fake_config(port, SslMode::VerifyFull)
    };
    let _ = replication(cfg).await;
    let after = sent.recv().await.expect("the server saw the client");
    // SASLInitialResponse: 'p', length, mechanism\0, length, client-first-message.
    assert_eq!(after.first(), Some(&b'p'), "{after:?}");
    let text = String::from_utf8_lossy(&after);
    assert!(text.contains("SCRAM-SHA-256-PLUS\0"), "{text:?}");
    assert!(text.contains("p=tls-server-end-point,,"), "{text:?}");
}
