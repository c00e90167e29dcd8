//! The webhook handler and the HTTP sink verify an https:// service's certificate: a
//! service presenting a self-signed certificate is refused (a failed attempt naming the
//! certificate problem), never sent the message; the HTTP sink trusts it once its
//! endpoint names it in `ca_file` (a private CA).

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use openssl::asn1::Asn1Time;
use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::rsa::Rsa;
use openssl::ssl::{SslAcceptor, SslMethod};
use openssl::x509::extension::SubjectAlternativeName;
use openssl::x509::{X509NameBuilder, X509};
use outboxd::inbox::handler::WebhookHandler;
use outboxd::inbox::{Handled, Handler};
use outboxd_connector::{ClaimToken, ClaimedMessage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A certificate for 127.0.0.1 signed by nobody the system trusts, and its key.
fn self_signed() -> (X509, PKey<openssl::pkey::Private>) {
    let key = PKey::from_rsa(Rsa::generate(2048).unwrap()).unwrap();
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", "127.0.0.1").unwrap();
    let name = name.build();
    let mut cert = X509::builder().unwrap();
    cert.set_version(2).unwrap();
    cert.set_subject_name(&name).unwrap();
    cert.set_issuer_name(&name).unwrap();
    cert.set_pubkey(&key).unwrap();
    cert.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    cert.set_not_after(&Asn1Time::days_from_now(1).unwrap())
        .unwrap();
    let san = SubjectAlternativeName::new()
        .ip("127.0.0.1")
        .build(&cert.x509v3_context(None, None))
        .unwrap();
    cert.append_extension(san).unwrap();
    cert.sign(&key, MessageDigest::sha256()).unwrap();
    (cert.build(), key)
}

/// An outbox event `m-<id>` of key `biz_key`, for the HTTP sink's requests.
fn outbox_event(id: i64, biz_key: &str) -> outboxd_connector::OutboxEvent {
    outboxd_connector::OutboxEvent {
        id,
        table: 0,
        message_id: format!("m-{id}"),
        message_type: "t".into(),
        biz_key: biz_key.into(),
        key: bytes::Bytes::from_static(b"k"),
        topic: None,
        routing: None,
        payload: bytes::Bytes::from_static(b"{}"),
        headers: Vec::new(),
        created_at: "2026-01-01T00:00:00Z".into(),
        retry_count: 0,
        max_retry_count: 10,
        commit_time: None,
        rejected: None,
    }
}

/// A TLS server on loopback presenting `cert`, answering 200 to every request: its port
/// and how many requests reached it (only from a client that accepted the certificate).
/// With `client_ca`, only a client presenting that certificate gets through (mutual TLS).
async fn tls_server(
    cert: &X509,
    key: &PKey<openssl::pkey::Private>,
    client_ca: Option<&X509>,
) -> (u16, Arc<AtomicUsize>) {
    let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
    acceptor.set_certificate(cert).unwrap();
    acceptor.set_private_key(key).unwrap();
    if let Some(client_ca) = client_ca {
        acceptor
            .cert_store_mut()
            .add_cert(client_ca.clone())
            .unwrap();
        acceptor.set_verify(
            openssl::ssl::SslVerifyMode::PEER | openssl::ssl::SslVerifyMode::FAIL_IF_NO_PEER_CERT,
        );
    }
    let acceptor = acceptor.build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&requests);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let ssl = openssl::ssl::Ssl::new(acceptor.context()).unwrap();
            let mut tls = tokio_openssl::SslStream::new(ssl, tcp).unwrap();
            if Pin::new(&mut tls).accept().await.is_ok() {
                // Only a client that accepted the certificate gets this far.
                // A connection closed without a request (`check`'s probe) is not counted.
                let mut buf = [0u8; 1024];
                if !matches!(tls.read(&mut buf).await, Ok(n) if n > 0) {
                    continue;
                }
                seen.fetch_add(1, Ordering::Relaxed);
                let _ = tls
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
        }
    });
    (port, requests)
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused_and_nothing_is_sent() {
    let (cert, key) = self_signed();
    let (port, requests) = tls_server(&cert, &key, None).await;
    let handler = WebhookHandler::new(
        &format!("https://127.0.0.1:{port}/hooks"),
        Duration::from_secs(5),
        &[],
    )
    .expect("handler");
    let message = ClaimedMessage {
        id: 1,
        source: "s".into(),
        message_id: "m-1".into(),
        message_type: "t".into(),
        biz_key: "k".into(),
        payload: b"{}".to_vec(),
        headers: Vec::new(),
        retry_count: 0,
        max_retry_count: 10,
        created_at: SystemTime::now(),
        claim_token: ClaimToken("00000000-0000-0000-0000-000000000000".into()),
    };
    match handler.handle(&message).await {
        Handled::Retry { error, .. } => {
            assert!(
                error.contains("certificate"),
                "the reason names it: {error}"
            );
        }
        other => panic!("an untrusted certificate must not pass: {other:?}"),
    }
    assert_eq!(requests.load(Ordering::Relaxed), 0, "nothing sent");
}

/// The HTTP sink: refused without the certificate (nothing sent); with the endpoint's
/// `ca_file` naming it, still refused by a server that asks for a client certificate until
/// `client_cert`/`client_key` give one; then delivered.
#[tokio::test]
async fn the_http_sink_trusts_a_private_ca_and_presents_a_client_certificate() {
    use outboxd::sink::http::{HttpSink, HttpSinkConfig};
    use outboxd::sink::{FailureKind, Sink};
    let (cert, key) = self_signed();
    let (client, client_key) = self_signed();
    let (port, requests) = tls_server(&cert, &key, Some(&client)).await;
    let dir = std::env::temp_dir().join(format!("outboxd-sink-tls-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, cert.to_pem().unwrap()).unwrap();
    let (client_pem, client_key_pem) = (dir.join("client.pem"), dir.join("client.key"));
    std::fs::write(&client_pem, client.to_pem().unwrap()).unwrap();
    std::fs::write(
        &client_key_pem,
        client_key.private_key_to_pem_pkcs8().unwrap(),
    )
    .unwrap();
    let sink = |extra: &str| {
        let text =
            format!("[endpoints.default]\nurl = \"https://127.0.0.1:{port}/hooks\"\n{extra}");
        let config: HttpSinkConfig = toml::from_str(&text).expect("[http]");
        HttpSink::new(&config, "tls", true, &["outbox".into()]).expect("sink")
    };
    let event = outbox_event(1, "k");

    let untrusting = sink("");
    let failure = untrusting.send(&event).await.await.unwrap_err();
    assert_eq!(failure.kind, FailureKind::Retryable);
    assert!(failure.error.contains("certificate"), "{}", failure.error);
    assert_eq!(requests.load(Ordering::Relaxed), 0, "nothing sent");

    // The server asks for a client certificate: trusting it is not enough.
    let anonymous = sink(&format!("ca_file = \"{}\"\n", ca.display()));
    let failure = anonymous.send(&event).await.await.unwrap_err();
    assert_eq!(failure.kind, FailureKind::Retryable, "{}", failure.error);
    assert_eq!(requests.load(Ordering::Relaxed), 0, "nothing sent");

    let trusting = sink(&format!(
        "ca_file = \"{}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"\n",
        ca.display(),
        client_pem.display(),
        client_key_pem.display()
    ));
    let receipt = trusting.send(&event).await.await.expect("delivered");
    assert_eq!(receipt.partition, 200);
    assert_eq!(requests.load(Ordering::Relaxed), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `check` probes each endpoint without sending an event: a name that does not resolve
/// fails at DNS, a certificate nobody trusts fails naming the certificate, and a trusted
/// one passes with the handshake's result; the server gets no request.
#[tokio::test]
async fn check_probes_dns_connection_and_tls_without_sending_anything() {
    use outboxd::sink::http::{HttpSink, HttpSinkConfig};
    use outboxd::sink::Sink;
    use outboxd_connector::CheckStatus;
    let (cert, key) = self_signed();
    let (port, requests) = tls_server(&cert, &key, None).await;
    let dir = std::env::temp_dir().join(format!("outboxd-sink-check-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, cert.to_pem().unwrap()).unwrap();
    let sink = |url: &str, extra: &str| {
        let text = format!("[endpoints.default]\nurl = \"{url}\"\n{extra}");
        let config: HttpSinkConfig = toml::from_str(&text).expect("[http]");
        HttpSink::new(&config, "check", true, &["outbox".into()]).expect("sink")
    };
    let url = format!("https://127.0.0.1:{port}/hooks");
    let timeout = Duration::from_secs(5);

    let unknown = sink("https://no-such-host.invalid/hooks", "")
        .check(timeout)
        .await;
    assert_eq!(unknown.status, CheckStatus::Fail, "{unknown}");
    assert!(unknown.detail.contains("DNS"), "{unknown}");
    // Every endpoint is probed: one failing does not hide the others.
    let text = format!(
        "[endpoints.a]\nurl = \"https://no-such-host.invalid/a\"\n\
         [endpoints.b]\nurl = \"https://127.0.0.1:{port}/b\"\nca_file = \"{}\"\n\
         [endpoints.c]\nurl = \"https://also-no-such-host.invalid/c\"\n",
        ca.display()
    );
    let config: HttpSinkConfig = toml::from_str(&text).expect("[http]");
    let several = HttpSink::new(&config, "check", true, &["outbox".into()]).expect("sink");
    let line = several.check(timeout).await;
    assert_eq!(line.status, CheckStatus::Fail, "{line}");
    for named in [
        "endpoint `a`",
        "endpoint `c`",
        "reachable: b (",
        "TLS verified",
    ] {
        assert!(line.detail.contains(named), "`{named}` in {line}");
    }

    let untrusted = sink(&url, "").check(timeout).await;
    assert_eq!(untrusted.status, CheckStatus::Fail, "{untrusted}");
    assert!(untrusted.detail.contains("certificate"), "{untrusted}");

    let trusted = sink(&url, &format!("ca_file = \"{}\"\n", ca.display()))
        .check(timeout)
        .await;
    assert_eq!(trusted.status, CheckStatus::Ok, "{trusted}");
    assert!(trusted.detail.contains("TLS verified"), "{trusted}");
    // The server takes one connection at a time: once an event sent after the probes is
    // counted, the probes' connections were seen before it, and none carried a request.
    let delivering = sink(&url, &format!("ca_file = \"{}\"\n", ca.display()));
    delivering
        .send(&outbox_event(1, "k"))
        .await
        .await
        .expect("delivered");
    assert_eq!(
        requests.load(Ordering::Relaxed),
        1,
        "only the event was a request"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// HTTP/2 where the endpoint offers it: a server that selects `h2` by ALPN receives the
/// sink's requests as HTTP/2, on one connection.
#[tokio::test]
async fn the_http_sink_speaks_http2_where_the_endpoint_offers_it() {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use outboxd::sink::http::{HttpSink, HttpSinkConfig};
    use outboxd::sink::Sink;
    use std::sync::Mutex;

    let (cert, key) = self_signed();
    let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
    acceptor.set_certificate(&cert).unwrap();
    acceptor.set_private_key(&key).unwrap();
    acceptor.set_alpn_select_callback(|_, offered| {
        openssl::ssl::select_next_proto(b"\x02h2", offered).ok_or(openssl::ssl::AlpnError::NOACK)
    });
    let acceptor = acceptor.build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let versions = Arc::new(Mutex::new(Vec::new()));
    let connections = Arc::new(AtomicUsize::new(0));
    let (seen, accepted) = (Arc::clone(&versions), Arc::clone(&connections));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let ssl = openssl::ssl::Ssl::new(acceptor.context()).unwrap();
            let mut tls = tokio_openssl::SslStream::new(ssl, tcp).unwrap();
            if Pin::new(&mut tls).accept().await.is_err() {
                continue;
            }
            accepted.fetch_add(1, Ordering::Relaxed);
            let seen = Arc::clone(&seen);
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                seen.lock()
                    .unwrap()
                    .push(format!("{:?}", request.version()));
                async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        bytes::Bytes::new(),
                    )))
                }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service),
            );
        }
    });

    let dir = std::env::temp_dir().join(format!("outboxd-sink-h2-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, cert.to_pem().unwrap()).unwrap();
    let text = format!(
        "[endpoints.default]\nurl = \"https://127.0.0.1:{port}/hooks\"\nca_file = \"{}\"\n",
        ca.display()
    );
    let config: HttpSinkConfig = toml::from_str(&text).expect("[http]");
    let sink = HttpSink::new(&config, "h2", true, &["outbox".into()]).expect("sink");
    for id in 1..=3 {
        let event = outbox_event(id, &format!("k{id}"));
        let receipt = sink.send(&event).await.await.expect("delivered");
        assert_eq!(receipt.partition, 200);
    }
    assert_eq!(*versions.lock().unwrap(), ["HTTP/2.0"; 3]);
    assert_eq!(
        connections.load(Ordering::Relaxed),
        1,
        "one connection, kept"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
