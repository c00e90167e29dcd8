//! The password never crosses a channel whose server is not verified: a fake MySQL
//! server on loopback (a thread speaking just enough of the protocol: the v10 greeting,
//! TLS when it offers it, `AuthSwitchRequest`, caching_sha2_password's "perform full
//! authentication" and its public key) asks for the password the ways that would expose
//! it, and records every byte the client sends, decrypting what the client encrypts with
//! the fake's public key as a man in the middle would.
//!
//! No database is needed, except by the last test (MariaDB's own login still works; it
//! reads OUTBOXD_TEST_MYSQL_* like the other tests, and connects to the MariaDB of
//! `scripts/services`).

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::rsa::{Padding, Rsa};
use openssl::ssl::{SslAcceptor, SslMethod};
use openssl::x509::extension::{BasicConstraints, SubjectAlternativeName};
use openssl::x509::{X509NameBuilder, X509};
use outboxd_connector::{ConnectorError, ErrorKind, OutboxLayout};
use outboxd_mysql::{MysqlConfig, MysqlConnector, SslMode};

const PASSWORD: &str = "s3cret-Pa55word-never-on-the-wire";
const NONCE: &[u8; 20] = b"abcdefghijklmnopqrst";
const CLIENT_SSL: u32 = 0x0800;

/// What the fake server asks once the client has sent its handshake response.
#[derive(Clone, Copy, Debug)]
enum Ask {
    /// caching_sha2_password's "perform full authentication" (0x01 0x04); the greeting
    /// must name caching_sha2_password.
    FullAuth,
    /// An AuthSwitchRequest to this plugin; for caching_sha2_password followed by the
    /// full authentication request.
    SwitchTo(&'static str),
}

/// Everything the fake server got from the client, over every connection.
#[derive(Default)]
struct Seen {
    /// The payloads of the client's packets (inside TLS: as decrypted).
    packets: Vec<Vec<u8>>,
    /// What came out of the RSA-encrypted password, decrypted with the fake's key and
    /// unmasked with the nonce: what a man in the middle learns.
    decrypted: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Each packet's length and first bytes: enough to tell a scramble from a key
        // request or a password.
        let short = |p: &Vec<u8>| {
            format!(
                "{}:{}",
                p.len(),
                String::from_utf8_lossy(&p[..p.len().min(40)])
            )
        };
        f.debug_struct("Seen")
            .field(
                "packets",
                &self.packets.iter().map(short).collect::<Vec<_>>(),
            )
            .field(
                "decrypted",
                &self.decrypted.iter().map(short).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Seen {
    fn asked_for_public_key(&self) -> bool {
        self.packets.iter().any(|p| p.as_slice() == [0x02])
    }

    fn learned_password(&self) -> bool {
        let password = PASSWORD.as_bytes();
        let holds = |bytes: &[u8]| bytes.windows(password.len()).any(|w| w == password);
        self.packets.iter().any(|p| holds(p)) || self.decrypted.iter().any(|p| holds(p))
    }
}

struct FakeServer {
    port: u16,
    seen: Arc<Mutex<Seen>>,
}

/// The fake server's certificate (and, when it is not self-signed, the CA that signed it).
struct Identity {
    cert: X509,
    key: PKey<Private>,
    /// PEM file of the CA, for `sslrootcert`.
    ca_file: Option<PathBuf>,
}

fn ec_key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("P-256");
    PKey::from_ec_key(EcKey::generate(&group).expect("EC key")).expect("PKey")
}

fn certificate(
    cn: &str,
    key: &PKey<Private>,
    issuer: Option<(&X509, &PKey<Private>)>,
    ca: bool,
) -> X509 {
    let mut name = X509NameBuilder::new().expect("name");
    name.append_entry_by_text("CN", cn).expect("CN");
    let name = name.build();
    let mut builder = X509::builder().expect("X509 builder");
    builder.set_version(2).expect("version");
    let mut serial = BigNum::new().expect("serial");
    serial
        .rand(64, MsbOption::MAYBE_ZERO, false)
        .expect("serial");
    builder
        .set_serial_number(&serial.to_asn1_integer().expect("serial"))
        .expect("serial");
    builder.set_subject_name(&name).expect("subject");
    builder
        .set_issuer_name(issuer.map_or(&name, |(cert, _)| cert.subject_name()))
        .expect("issuer");
    builder.set_pubkey(key).expect("public key");
    builder
        .set_not_before(&Asn1Time::days_from_now(0).expect("time"))
        .expect("not before");
    builder
        .set_not_after(&Asn1Time::days_from_now(2).expect("time"))
        .expect("not after");
    if ca {
        let constraints = BasicConstraints::new().critical().ca().build().expect("CA");
        builder.append_extension(constraints).expect("CA");
    } else {
        let san = SubjectAlternativeName::new()
            .ip("127.0.0.1")
            .build(&builder.x509v3_context(issuer.map(|(cert, _)| cert.as_ref()), None))
            .expect("SAN");
        builder.append_extension(san).expect("SAN");
    }
    let signer = issuer.map_or(key, |(_, key)| key);
    builder.sign(signer, MessageDigest::sha256()).expect("sign");
    builder.build()
}

/// A certificate for 127.0.0.1 that nothing vouches for.
fn self_signed() -> Identity {
    let key = ec_key();
    Identity {
        cert: certificate("fake-mysql", &key, None, false),
        key,
        ca_file: None,
    }
}

/// A certificate for 127.0.0.1 signed by a CA written to a PEM file, for verify-full.
fn ca_signed() -> Identity {
    let ca_key = ec_key();
    let ca = certificate("fake-mysql-ca", &ca_key, None, true);
    let key = ec_key();
    let cert = certificate("fake-mysql", &key, Some((&ca, &ca_key)), false);
    let ca_file = std::env::temp_dir().join(format!(
        "outboxd-password-test-ca-{}-{}.pem",
        std::process::id(),
        support::rand_u32()
    ));
    std::fs::write(&ca_file, ca.to_pem().expect("CA PEM")).expect("write the CA file");
    Identity {
        cert,
        key,
        ca_file: Some(ca_file),
    }
}

fn packet(seq: u8, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len())
        .expect("small packet")
        .to_le_bytes();
    let mut out = vec![len[0], len[1], len[2], seq];
    out.extend_from_slice(payload);
    out
}

fn read_packet(io: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    let mut header = [0u8; 4];
    io.read_exact(&mut header)?;
    let len = usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
    let mut payload = vec![0; len];
    io.read_exact(&mut payload)?;
    Ok((header[3], payload))
}

/// The v10 greeting of a MySQL 8 naming `plugin`.
fn greeting(plugin: &str, tls: bool) -> Vec<u8> {
    // LONG_PASSWORD | CONNECT_WITH_DB | PROTOCOL_41 | TRANSACTIONS | SECURE_CONNECTION |
    // MULTI_STATEMENTS | MULTI_RESULTS | PS_MULTI_RESULTS | PLUGIN_AUTH | CONNECT_ATTRS |
    // DEPRECATE_EOF, and SSL when offered.
    let mut caps: u32 = 0x1 | 0x8 | 0x200 | 0x2000 | 0x8000 | 0x1_0000 | 0x2_0000 | 0x4_0000;
    caps |= 0x8_0000 | 0x10_0000 | 0x100_0000;
    if tls {
        caps |= CLIENT_SSL;
    }
    let mut body = vec![10u8];
    body.extend_from_slice(b"8.0.36-fake\0");
    body.extend_from_slice(&7u32.to_le_bytes());
    body.extend_from_slice(&NONCE[..8]);
    body.push(0);
    body.extend_from_slice(&(caps as u16).to_le_bytes());
    body.push(255); // utf8mb4_0900_ai_ci
    body.extend_from_slice(&2u16.to_le_bytes());
    body.extend_from_slice(&((caps >> 16) as u16).to_le_bytes());
    body.push(21);
    body.extend_from_slice(&[0; 10]);
    body.extend_from_slice(&NONCE[8..]);
    body.push(0);
    body.extend_from_slice(plugin.as_bytes());
    body.push(0);
    body
}

fn auth_switch(plugin: &str) -> Vec<u8> {
    let mut body = vec![0xfe];
    body.extend_from_slice(plugin.as_bytes());
    body.push(0);
    body.extend_from_slice(NONCE);
    body.push(0);
    body
}

fn access_denied() -> Vec<u8> {
    let mut body = vec![0xff];
    body.extend_from_slice(&1045u16.to_le_bytes());
    body.extend_from_slice(b"#28000Access denied (fake server)");
    body
}

/// Starts a fake server that greets naming `plugin`, offers TLS with `tls`, and asks
/// `ask`; it serves every connection made to it (`prefer` may make two).
fn fake_server(plugin: &'static str, tls: Option<&Identity>, ask: Ask) -> FakeServer {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let acceptor = tls.map(|identity| {
        let mut acceptor =
            SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).expect("acceptor");
        acceptor.set_private_key(&identity.key).expect("server key");
        acceptor
            .set_certificate(&identity.cert)
            .expect("server certificate");
        Arc::new(acceptor.build())
    });
    let rsa = Arc::new(Rsa::generate(2048).expect("RSA key"));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { return };
            let (log, acceptor, rsa) = (Arc::clone(&log), acceptor.clone(), Arc::clone(&rsa));
            std::thread::spawn(move || {
                let _ = serve(tcp, plugin, acceptor.as_deref(), ask, &rsa, &log);
            });
        }
    });
    FakeServer { port, seen }
}

fn serve(
    mut tcp: TcpStream,
    plugin: &str,
    acceptor: Option<&SslAcceptor>,
    ask: Ask,
    rsa: &Rsa<Private>,
    log: &Mutex<Seen>,
) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    tcp.write_all(&packet(0, &greeting(plugin, acceptor.is_some())))?;
    let (seq, first) = read_packet(&mut tcp)?;
    log.lock().expect("log").packets.push(first.clone());
    let caps = first
        .get(..4)
        .map_or(0, |c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    match acceptor {
        Some(acceptor) if caps & CLIENT_SSL != 0 && first.len() == 32 => {
            let mut tls = acceptor
                .accept(tcp)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let (seq, response) = read_packet(&mut tls)?;
            log.lock().expect("log").packets.push(response);
            converse(&mut tls, seq, ask, rsa, log)
        }
        _ => converse(&mut tcp, seq, ask, rsa, log),
    }
}

fn send(io: &mut impl Write, seq: &mut u8, body: &[u8]) -> std::io::Result<()> {
    *seq = seq.wrapping_add(1);
    io.write_all(&packet(*seq, body))
}

fn receive(io: &mut impl Read, seq: &mut u8, log: &Mutex<Seen>) -> std::io::Result<Vec<u8>> {
    let (s, payload) = read_packet(io)?;
    *seq = s;
    log.lock().expect("log").packets.push(payload.clone());
    Ok(payload)
}

/// The exchange after the handshake response (sequence number `seq`).
fn converse(
    io: &mut (impl Read + Write),
    mut seq: u8,
    ask: Ask,
    rsa: &Rsa<Private>,
    log: &Mutex<Seen>,
) -> std::io::Result<()> {
    let full_auth = match ask {
        Ask::FullAuth => true,
        Ask::SwitchTo(plugin) => {
            send(io, &mut seq, &auth_switch(plugin))?;
            // The scramble, or the cleartext password.
            receive(io, &mut seq, log)?;
            plugin == "caching_sha2_password"
        }
    };
    if full_auth {
        send(io, &mut seq, &[0x01, 0x04])?;
        let answer = receive(io, &mut seq, log)?;
        if answer == [0x02] {
            // The client asks for the public key: this one's, whose private half a man
            // in the middle holds.
            let mut body = vec![0x01];
            body.extend_from_slice(&rsa.public_key_to_pem().expect("public key PEM"));
            send(io, &mut seq, &body)?;
            let encrypted = receive(io, &mut seq, log)?;
            let mut plain = vec![0; rsa.size() as usize];
            if let Ok(n) = rsa.private_decrypt(&encrypted, &mut plain, Padding::PKCS1_OAEP) {
                plain.truncate(n);
                for (i, byte) in plain.iter_mut().enumerate() {
                    *byte ^= NONCE[i % NONCE.len()];
                }
                log.lock().expect("log").decrypted.push(plain);
            }
        }
    }
    send(io, &mut seq, &access_denied())
}

fn config(port: u16, sslmode: SslMode, sslrootcert: Option<PathBuf>) -> MysqlConfig {
    MysqlConfig {
        host: "127.0.0.1".into(),
        port,
        password: Some(PASSWORD.into()),
        password_file: None,
        sslmode,
        sslrootcert,
        connect_timeout: Duration::from_secs(10),
        ..support::config()
    }
}

async fn connect(cfg: MysqlConfig) -> Result<mysql_async::Conn, ConnectorError> {
    MysqlConnector::new(cfg, "password", OutboxLayout::default())?
        .sql_conn()
        .await
}

/// The refusal: definite, naming the plugin and what to change.
fn assert_refused(e: &ConnectorError, plugin: &str) {
    assert_eq!(e.kind(), ErrorKind::Definite, "{e}");
    let text = e.to_string();
    for needle in [
        plugin,
        "verify-full",
        "verify-ca",
        "source.allow_insecure_password",
    ] {
        assert!(text.contains(needle), "`{needle}` not in: {text}");
    }
}

/// Asserts that `server` learned neither the password nor was asked for its public
/// key, then that every connection attempt was refused naming `plugin`.
fn assert_nothing_exposed(
    server: &FakeServer,
    results: Vec<Result<mysql_async::Conn, ConnectorError>>,
    plugin: &str,
) {
    {
        let seen = server.seen.lock().expect("log");
        assert!(
            !seen.learned_password(),
            "the password reached the server: {seen:?}"
        );
        assert!(
            !seen.asked_for_public_key(),
            "the server's public key was asked for: {seen:?}"
        );
    }
    for result in results {
        match result {
            Ok(_) => panic!("connected"),
            Err(e) => assert_refused(&e, plugin),
        }
    }
}

#[tokio::test]
async fn full_authentication_is_refused_without_tls() {
    // The greeting names caching_sha2_password: the client's first answer is its
    // scramble, then the server asks for the password itself.
    let server = fake_server("caching_sha2_password", None, Ask::FullAuth);
    let mut results = Vec::new();
    for mode in [SslMode::Disable, SslMode::Prefer] {
        results.push(connect(config(server.port, mode, None)).await);
    }
    assert_nothing_exposed(&server, results, "caching_sha2_password");
}

#[tokio::test]
async fn a_switch_to_caching_sha2_is_refused_without_tls() {
    // The greeting names mysql_native_password (MariaDB, or MySQL 8 with it as the
    // default), and the account's plugin is caching_sha2_password.
    let server = fake_server(
        "mysql_native_password",
        None,
        Ask::SwitchTo("caching_sha2_password"),
    );
    let result = connect(config(server.port, SslMode::Disable, None)).await;
    assert_nothing_exposed(&server, vec![result], "caching_sha2_password");
}

#[tokio::test]
async fn the_cleartext_plugin_is_refused_without_tls() {
    for greeting in ["mysql_clear_password", "mysql_native_password"] {
        let server = fake_server(greeting, None, Ask::SwitchTo("mysql_clear_password"));
        let result = connect(config(server.port, SslMode::Disable, None)).await;
        assert_nothing_exposed(&server, vec![result], "mysql_clear_password");
    }
}

#[tokio::test]
async fn full_authentication_is_refused_over_tls_that_is_not_verified() {
    // TLS with a certificate anyone could make: the client would send the password in
    // clear inside it, to whoever answered.
    let identity = self_signed();
    for ask in [Ask::FullAuth, Ask::SwitchTo("caching_sha2_password")] {
        let server = fake_server("caching_sha2_password", Some(&identity), ask);
        let mut results = Vec::new();
        for mode in [SslMode::Prefer, SslMode::Require] {
            results.push(connect(config(server.port, mode, None)).await);
        }
        // The fake did see the TLS handshake and the client's response inside it.
        let packets = server.seen.lock().expect("log").packets.len();
        assert!(packets >= 4, "{packets} packets");
        assert_nothing_exposed(&server, results, "caching_sha2_password");
    }
    let server = fake_server(
        "mysql_native_password",
        Some(&identity),
        Ask::SwitchTo("mysql_clear_password"),
    );
    let result = connect(config(server.port, SslMode::Require, None)).await;
    assert_nothing_exposed(&server, vec![result], "mysql_clear_password");
}

/// The fake server's "Access denied", after it got what it asked for: the client did not
/// refuse.
fn assert_sent(server: &FakeServer, result: Result<mysql_async::Conn, ConnectorError>) {
    let e = result.expect_err("the fake server never lets anyone in");
    assert!(e.to_string().contains("Access denied (fake server)"), "{e}");
    let seen = server.seen.lock().expect("log");
    assert!(
        seen.learned_password(),
        "the password did not reach the server: {seen:?}"
    );
}

#[tokio::test]
async fn allow_insecure_password_sends_it_anyway() {
    let allowed = |port, mode| MysqlConfig {
        allow_insecure_password: true,
        ..config(port, mode, None)
    };
    // Without TLS: the public key exchange, with the fake's own key.
    let server = fake_server("caching_sha2_password", None, Ask::FullAuth);
    let result = connect(allowed(server.port, SslMode::Disable)).await;
    assert!(server.seen.lock().expect("log").asked_for_public_key());
    assert_sent(&server, result);
    // The cleartext plugin, enabled by the key.
    let server = fake_server(
        "mysql_native_password",
        None,
        Ask::SwitchTo("mysql_clear_password"),
    );
    let result = connect(allowed(server.port, SslMode::Disable)).await;
    assert_sent(&server, result);
    // Unverified TLS: in clear inside it.
    let server = fake_server("caching_sha2_password", Some(&self_signed()), Ask::FullAuth);
    let result = connect(allowed(server.port, SslMode::Require)).await;
    assert_sent(&server, result);
}

#[tokio::test]
async fn a_verified_server_gets_the_password() {
    // verify-full (and verify-ca) against the CA that signed the fake's certificate: the
    // server is the one the certificate names, so full authentication goes ahead (in
    // clear inside TLS, as MySQL's own client does), and so does the cleartext plugin.
    let identity = ca_signed();
    let ca = identity.ca_file.clone();
    for mode in [SslMode::VerifyFull, SslMode::VerifyCa] {
        let server = fake_server("caching_sha2_password", Some(&identity), Ask::FullAuth);
        let result = connect(config(server.port, mode, ca.clone())).await;
        assert!(!server.seen.lock().expect("log").asked_for_public_key());
        assert_sent(&server, result);
    }
    let server = fake_server(
        "mysql_native_password",
        Some(&identity),
        Ask::SwitchTo("mysql_clear_password"),
    );
    let result = connect(config(server.port, SslMode::VerifyFull, ca.clone())).await;
    assert_sent(&server, result);
    if let Some(ca) = ca {
        let _ = std::fs::remove_file(ca);
    }
}

/// The TLS version the server sees (empty: none) and the user, on a connection of the
/// connector.
async fn logged_in(cfg: MysqlConfig) -> Result<(String, String), ConnectorError> {
    let mut conn = connect(cfg).await?;
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

#[tokio::test]
async fn mariadb_native_password_logs_in_over_unverified_channels() {
    // MariaDB's default plugin never reveals the password: the guard lets it through,
    // without TLS and over the TLS it holds itself.
    let base = support::config();
    for (mode, tls) in [
        (SslMode::Disable, false),
        (SslMode::Prefer, true),
        (SslMode::Require, true),
    ] {
        let cfg = MysqlConfig {
            sslmode: mode,
            ..base.clone()
        };
        let (version, user) = logged_in(cfg)
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e} (is `scripts/services start` running?)"));
        assert_eq!(version.starts_with("TLS"), tls, "{mode}: {version:?}");
        assert!(user.starts_with(&format!("{}@", base.user)), "{user}");
    }
}
