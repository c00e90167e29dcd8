//! TLS and password safety of every PostgreSQL connection: the SQL connections
//! (tokio-postgres) and the hand-written replication connection speak through the same
//! pieces, so they cannot verify differently.
//!
//! - [`PgTls`]: the OpenSSL context of a [`TlsPolicy`] (roots, client certificate,
//!   verification), built once per process and policy, and the handshake that reports
//!   what was verified ([`Negotiated`]) or says which key to change when it fails.
//! - [`AuthGuard`]: a byte-level watch on the backend messages of the startup that
//!   refuses a server asking for a cleartext or MD5 password over a channel whose server
//!   is not verified (unless `allow_insecure_password`), before the client can answer it;
//!   and that refuses a server answering SSLRequest with `N` when TLS is required.
//!   tokio-postgres has no `require_auth`, so the guard sits between it and the socket.
//! - [`PgTlsConnect`]: tokio-postgres's `TlsConnect` over [`PgTls`], with the
//!   tls-server-end-point channel binding SCRAM-SHA-256-PLUS needs.
//!
//! Errors raised inside tokio-postgres travel as a [`ConnectorError`] wrapped in its error
//! chain; [`carried_error`] takes it out again, so a refusal stays definite.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::ssl::{Ssl, SslConnector, SslMethod, SslRef, SslVerifyMode};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509VerifyResult;
use outboxd_connector::{ConnectorError, ErrorKind};
use outboxd_connector_kit::tls::{
    root_certificates, ClientIdentity, Negotiated, Roots, TlsUse, Verification,
};
use outboxd_connector_kit::TlsPolicy;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_openssl::SslStream;
use tokio_postgres::tls::{ChannelBinding, TlsConnect};

use crate::PostgresConfig;

/// The TLS side of one configuration: its policy and the OpenSSL context built from it.
#[derive(Clone)]
pub(crate) struct PgTls {
    policy: TlsPolicy,
    connector: SslConnector,
    allow_insecure_password: bool,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTls")
            .field("policy", &self.policy)
            .field("allow_insecure_password", &self.allow_insecure_password)
            .finish_non_exhaustive()
    }
}

impl PgTls {
    /// The TLS of `config`. Built once per process and policy: building a context loads
    /// the system's CA bundle, which costs more than the rest of a connection. The files
    /// are therefore read once; a renewed certificate takes effect at the next start.
    pub(crate) fn for_config(config: &PostgresConfig) -> Result<Arc<PgTls>, ConnectorError> {
        type Cache = Mutex<HashMap<(TlsPolicy, bool), Arc<PgTls>>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let policy = TlsPolicy::from_options(config.tls_options())?;
        let key = (policy, config.allow_insecure_password);
        let cache = CACHE.get_or_init(Default::default);
        if let Some(tls) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(tls);
        }
        let tls = Arc::new(PgTls {
            connector: build_connector(&key.0)?,
            policy: key.0.clone(),
            allow_insecure_password: key.1,
        });
        if let Ok(mut cache) = cache.lock() {
            cache.insert(key, Arc::clone(&tls));
        }
        Ok(tls)
    }

    /// The policy.
    pub(crate) fn policy(&self) -> &TlsPolicy {
        &self.policy
    }

    /// Whether a cleartext or MD5 password may be sent over a channel that negotiated
    /// `negotiated`: when its server was verified, or when the config allows it.
    pub(crate) fn password_allowed(&self, negotiated: &Negotiated) -> bool {
        self.allow_insecure_password
            || matches!(negotiated, Negotiated::Tls { verified, .. } if *verified != Verification::None)
    }

    /// The error for a server asking for a password in `method` (cleartext, MD5) when
    /// [`Self::password_allowed`] says no.
    pub(crate) fn password_refused(
        &self,
        context: &str,
        method: &str,
        negotiated: &Negotiated,
    ) -> ConnectorError {
        let channel = match negotiated {
            Negotiated::Plain => "a connection without TLS".to_owned(),
            Negotiated::Tls { .. } => format!(
                "TLS whose certificate is not verified (sslmode={})",
                self.policy.mode
            ),
        };
        ConnectorError::definite(format!(
            "{context}: the server asks for the password {method} over {channel}; refused, since \
             whoever poses as the server would learn it. Use scram-sha-256 on the server \
             (password_encryption and pg_hba.conf), or verify the server (source.sslmode = \
             \"verify-full\" with source.sslrootcert), or set source.allow_insecure_password = \
             true to send it anyway"
        ))
    }

    /// The guard of the plain socket of a connection that will send SSLRequest unless TLS
    /// is off.
    pub(crate) fn guard<S>(self: &Arc<Self>, inner: S, context: &str) -> AuthGuard<S> {
        let state = if self.policy.tls == TlsUse::Off {
            self.watch_state(&Negotiated::Plain)
        } else {
            GuardState::SslAnswer
        };
        AuthGuard {
            inner,
            state,
            tls: Arc::clone(self),
            context: context.to_owned(),
            header: [0; 9],
            have: 0,
            skip: 0,
        }
    }

    fn watch_state(&self, negotiated: &Negotiated) -> GuardState {
        if self.password_allowed(negotiated) {
            GuardState::Passive
        } else {
            GuardState::Watching(negotiated.clone())
        }
    }

    /// The TLS handshake over `io` (after the server accepted SSLRequest) for `host`.
    /// A certificate that fails verification is a definite error naming the keys.
    pub(crate) async fn handshake<S>(
        &self,
        io: S,
        host: &str,
        context: &str,
    ) -> Result<(SslStream<S>, Negotiated), ConnectorError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let tls_err = |e: openssl::error::ErrorStack| {
            ConnectorError::definite(format!("{context}: cannot set up TLS")).with_source(e)
        };
        let mut configuration = self.connector.configure().map_err(tls_err)?;
        configuration.set_verify_hostname(self.policy.verify == Verification::ChainAndHost);
        // No SNI for an address (RFC 6066); the address is still checked against the
        // certificate's IP SANs under verify-full.
        configuration.set_use_server_name_indication(host.parse::<IpAddr>().is_err());
        let ssl: Ssl = configuration.into_ssl(host).map_err(tls_err)?;
        let mut stream = SslStream::new(ssl, io).map_err(tls_err)?;
        if let Err(e) = Pin::new(&mut stream).connect().await {
            let verify = stream.ssl().verify_result();
            if self.policy.verify != Verification::None && verify != X509VerifyResult::OK {
                return Err(self
                    .policy
                    .verification_failed(context, verify.error_string()));
            }
            return Err(
                ConnectorError::transient(format!("{context}: TLS handshake failed"))
                    .with_source(e),
            );
        }
        let negotiated = Negotiated::Tls {
            version: stream.ssl().version_str().to_owned(),
            verified: self.policy.verify,
        };
        Ok((stream, negotiated))
    }
}

/// The OpenSSL context of `policy`.
fn build_connector(policy: &TlsPolicy) -> Result<SslConnector, ConnectorError> {
    let openssl = |e: openssl::error::ErrorStack| {
        ConnectorError::definite("cannot initialise OpenSSL").with_source(e)
    };
    // Loads the system's default roots (used by verify-full without sslrootcert).
    let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(openssl)?;
    if policy.verify == Verification::None {
        builder.set_verify(SslVerifyMode::NONE);
    } else {
        builder.set_verify(SslVerifyMode::PEER);
        if let Roots::File(path) = &policy.roots {
            // Only the configured CAs: the system's roots must not vouch for the server.
            let mut store = X509StoreBuilder::new().map_err(openssl)?;
            for cert in root_certificates(path)? {
                store.add_cert(cert).map_err(openssl)?;
            }
            builder.set_cert_store(store.build());
        }
    }
    if let Some(client) = &policy.client {
        let identity = ClientIdentity::load(client)?;
        builder.set_certificate(&identity.leaf).map_err(openssl)?;
        for extra in identity.chain {
            builder.add_extra_chain_cert(extra).map_err(openssl)?;
        }
        builder.set_private_key(&identity.key).map_err(openssl)?;
    }
    Ok(builder.build())
}

/// The tls-server-end-point channel binding (RFC 5929) of the server's certificate: its
/// hash with the algorithm of its signature (SHA-256 for MD5 and SHA-1).
pub(crate) fn tls_server_end_point(ssl: &SslRef) -> Option<Vec<u8>> {
    let cert = ssl.peer_certificate()?;
    let algorithms = cert
        .signature_algorithm()
        .object()
        .nid()
        .signature_algorithms()?;
    let digest = match algorithms.digest {
        Nid::MD5 | Nid::SHA1 => MessageDigest::sha256(),
        nid => MessageDigest::from_nid(nid)?,
    };
    cert.digest(digest).ok().map(|d| d.to_vec())
}

/// Where the guard is in the startup.
#[derive(Clone, Debug)]
enum GuardState {
    /// The next byte from the server answers SSLRequest.
    SslAnswer,
    /// Reading backend messages on a channel of this kind, until AuthenticationOk.
    Watching(Negotiated),
    /// Nothing to watch any more (TLS took over, authentication is done, or passwords
    /// may be sent).
    Passive,
}

/// A socket wrapper that refuses, as a read error, a server asking for a cleartext or
/// MD5 password over a channel [`PgTls::password_allowed`] rejects, and a server
/// refusing TLS when it is required. It only looks at the bytes; they pass unchanged.
#[derive(Debug)]
pub(crate) struct AuthGuard<S> {
    inner: S,
    state: GuardState,
    tls: Arc<PgTls>,
    context: String,
    /// The start of the current message: tag, length, authentication code.
    header: [u8; 9],
    have: usize,
    /// Bytes of the current message still to pass before the next header.
    skip: usize,
}

impl<S> AuthGuard<S> {
    /// Looks at `bytes`, just read from the server; an error when they must not reach
    /// the client.
    fn inspect(&mut self, bytes: &[u8]) -> Result<(), ConnectorError> {
        let mut at = 0;
        while at < bytes.len() {
            match &self.state {
                GuardState::Passive => return Ok(()),
                GuardState::SslAnswer => {
                    if bytes[at] == b'S' {
                        self.state = GuardState::Passive;
                    } else if self.tls.policy.tls_required() {
                        return Err(self.tls.policy.downgrade_refused(&self.context));
                    } else {
                        self.state = self.tls.watch_state(&Negotiated::Plain);
                    }
                    at += 1;
                }
                GuardState::Watching(negotiated) => {
                    if self.skip > 0 {
                        let n = self.skip.min(bytes.len() - at);
                        self.skip -= n;
                        at += n;
                        continue;
                    }
                    self.header[self.have] = bytes[at];
                    self.have += 1;
                    at += 1;
                    let len = |h: &[u8; 9]| {
                        usize::try_from(u32::from_be_bytes([h[1], h[2], h[3], h[4]]))
                            .unwrap_or(usize::MAX)
                    };
                    if self.have == 5 && (self.header[0] != b'R' || len(&self.header) < 8) {
                        // Not an authentication request: let it pass whole.
                        self.skip = len(&self.header).saturating_sub(4);
                        self.have = 0;
                    } else if self.have == 9 {
                        let code = u32::from_be_bytes([
                            self.header[5],
                            self.header[6],
                            self.header[7],
                            self.header[8],
                        ]);
                        let method = match code {
                            0 => {
                                // AuthenticationOk: nothing more to guard.
                                self.state = GuardState::Passive;
                                return Ok(());
                            }
                            3 => Some("in cleartext"),
                            5 => Some("as an MD5 hash"),
                            _ => None,
                        };
                        if let Some(method) = method {
                            return Err(self.tls.password_refused(
                                &self.context,
                                method,
                                negotiated,
                            ));
                        }
                        self.skip = len(&self.header).saturating_sub(8);
                        self.have = 0;
                    }
                }
            }
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthGuard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if matches!(this.state, GuardState::Passive) {
                    return Poll::Ready(Ok(()));
                }
                // The bytes are in `buf`, but an error keeps the caller from acting on
                // them: the password is never sent.
                let fresh = buf.filled()[before..].to_vec();
                Poll::Ready(this.inspect(&fresh).map_err(io::Error::other))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthGuard<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What the SQL connection negotiated, filled in by [`PgTlsConnect`].
pub(crate) type NegotiatedSlot = Arc<Mutex<Option<Negotiated>>>;

/// tokio-postgres's TLS connector over [`PgTls`].
pub(crate) struct PgTlsConnect {
    pub(crate) tls: Arc<PgTls>,
    pub(crate) host: String,
    pub(crate) context: String,
    pub(crate) negotiated: NegotiatedSlot,
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = ConnectorError;
    type Future = Pin<Box<dyn Future<Output = Result<PgTlsStream<S>, ConnectorError>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let (stream, negotiated) = self
                .tls
                .handshake(stream, &self.host, &self.context)
                .await?;
            let binding = tls_server_end_point(stream.ssl());
            let state = self.tls.watch_state(&negotiated);
            if let Ok(mut slot) = self.negotiated.lock() {
                *slot = Some(negotiated);
            }
            Ok(PgTlsStream {
                inner: AuthGuard {
                    inner: stream,
                    state,
                    tls: Arc::clone(&self.tls),
                    context: self.context.clone(),
                    header: [0; 9],
                    have: 0,
                    skip: 0,
                },
                binding,
            })
        })
    }
}

/// The TLS stream of a SQL connection, guarded, with its channel binding.
#[derive(Debug)]
pub(crate) struct PgTlsStream<S> {
    inner: AuthGuard<SslStream<S>>,
    binding: Option<Vec<u8>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for PgTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        match &self.binding {
            Some(hash) => ChannelBinding::tls_server_end_point(hash.clone()),
            None => ChannelBinding::none(),
        }
    }
}

/// The [`ConnectorError`] a guard or handshake raised inside tokio-postgres, if `e`
/// carries one: walks the chain, looking into I/O errors too.
pub(crate) fn carried_error(e: &(dyn std::error::Error + 'static)) -> Option<ConnectorError> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        let found = err.downcast_ref::<ConnectorError>().or_else(|| {
            err.downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<ConnectorError>())
        });
        if let Some(found) = found {
            let copy = match found.kind() {
                ErrorKind::Transient => ConnectorError::transient(found.to_string()),
                _ => ConnectorError::definite(found.to_string()),
            };
            return Some(copy.with_reason(found.reason()));
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxd_connector_kit::SslMode;
    use std::time::Duration;

    fn tls(mode: SslMode, allow: bool) -> Arc<PgTls> {
        let config = PostgresConfig {
            host: "127.0.0.1".into(),
            port: 1,
            user: "u".into(),
            password: None,
            password_file: None,
            database: "d".into(),
            sslmode: mode,
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            allow_insecure_password: allow,
            slot: None,
            publication: None,
            slot_failover: false,
            status_interval: Duration::from_secs(1),
            silence_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(1),
        };
        PgTls::for_config(&config).unwrap()
    }

    /// An authentication request message with `code`.
    fn auth(code: u32) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend_from_slice(&8u32.to_be_bytes());
        m.extend_from_slice(&code.to_be_bytes());
        m
    }

    #[test]
    fn guard_refuses_cleartext_and_md5_byte_by_byte() {
        for code in [3, 5] {
            let mut guard = tls(SslMode::Prefer, false).guard((), "ctx");
            // 'N' to SSLRequest, a notice, then the request, one byte at a time.
            let mut bytes = vec![b'N', b'N'];
            bytes.extend_from_slice(&6u32.to_be_bytes());
            bytes.extend_from_slice(b"hi");
            bytes.extend(auth(code));
            let mut refused = None;
            for b in &bytes {
                if let Err(e) = guard.inspect(std::slice::from_ref(b)) {
                    refused = Some(e);
                    break;
                }
            }
            let e = refused.expect("refused");
            assert!(e.message().contains("allow_insecure_password"), "{e}");
        }
    }

    #[test]
    fn guard_lets_scram_and_allowed_passwords_pass() {
        let mut guard = tls(SslMode::Disable, false).guard((), "ctx");
        let mut sasl = vec![b'R'];
        sasl.extend_from_slice(&23u32.to_be_bytes());
        sasl.extend_from_slice(&10u32.to_be_bytes());
        sasl.extend_from_slice(b"SCRAM-SHA-256\0\0");
        guard.inspect(&sasl).unwrap();
        guard.inspect(&auth(0)).unwrap();
        assert!(matches!(guard.state, GuardState::Passive));
        let mut allowed = tls(SslMode::Disable, true).guard((), "ctx");
        allowed.inspect(&auth(3)).unwrap();
        let mut downgrade = tls(SslMode::Require, true).guard((), "ctx");
        let e = downgrade.inspect(b"N").unwrap_err();
        assert!(e.message().contains("does not offer TLS"), "{e}");
        let mut tls_on = tls(SslMode::Require, false).guard((), "ctx");
        tls_on.inspect(b"S").unwrap();
        assert!(matches!(tls_on.state, GuardState::Passive));
    }
}
