//! The webhook handler verifies an https:// service's certificate: a service presenting a
//! self-signed certificate is refused (a failed attempt naming the certificate problem),
//! never sent the message.

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

#[tokio::test]
async fn an_untrusted_certificate_is_refused_and_nothing_is_sent() {
    let (cert, key) = self_signed();
    let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
    acceptor.set_certificate(&cert).unwrap();
    acceptor.set_private_key(&key).unwrap();
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
                let mut buf = [0u8; 1024];
                let _ = tls.read(&mut buf).await;
                seen.fetch_add(1, Ordering::Relaxed);
                let _ = tls
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
        }
    });

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
