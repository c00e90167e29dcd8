//! The password guard: no MySQL or MariaDB password, nor what would stand for it, goes
//! to a server that is not verified (the MySQL side of what `connectors/postgres/src/
//! tls.rs`'s `AuthGuard` does for PostgreSQL).
//!
//! # What is refused
//!
//! On a connection without TLS, or with TLS whose certificate is not verified (`sslmode`
//! below `verify-ca`, no `sslrootcert`), unless `source.allow_insecure_password`:
//!
//! - `caching_sha2_password` (MySQL 8's default). Its fast path sends a scramble, but on
//!   a cache miss the server asks for the password itself (AuthMoreData 0x04): in clear
//!   inside TLS, or RSA-encrypted with a public key the client first asks the server for
//!   (0x02). Over an unverified channel both reach whoever answers: the impostor reads
//!   the cleartext, or hands out its own key. Whoever answers decides when to ask, so
//!   the account's use of the plugin is refused, on its first sign (an AuthSwitchRequest
//!   to it, or the answer to the client's caching_sha2 scramble, 0x03 as well as 0x04):
//!   a refusal that waited for a cache miss would stop a running pipeline at the next
//!   restart of the server instead of at the first connection.
//! - `mysql_clear_password`: the password in clear. mysql_async refuses it already
//!   (`enable_cleartext_plugin` is off on these channels); the guard refuses it first, so
//!   that the error says what to do.
//!
//! `mysql_native_password` (MariaDB's default), MariaDB's `client_ed25519` and `parsec`
//! send a proof bound to the server's nonce, never the password or a hash that logs in
//! by itself: they pass, as SCRAM does on the PostgreSQL side. (An impostor can still try
//! to guess the password offline from such a proof, as from SCRAM's; only verifying the
//! server prevents that. And mysql_async is built here without its `client_ed25519` and
//! `client_parsec` features: it panics when asked for those two, on any channel.)
//!
//! # Why it sits in the connection
//!
//! mysql_async (0.37) has no switch for any of this: `continue_caching_sha2_password_auth`
//! sends the password whenever the server asks, in clear on any TLS (`is_secure`) and
//! after asking for the key otherwise. A check before the connection would not be sound:
//! the greeting names only the server's default plugin (the account's arrives later, in
//! an AuthSwitchRequest), the cache decides between 0x03 and 0x04 connection by
//! connection, and above all an impostor answers a probe one way and the real connection
//! another. So the check is made on the bytes of the very connection that carries the
//! password, before the client reads them: mysql_async connects to a loopback listener
//! the guard opens for that one connection, and the guard connects to the server,
//! relays the authentication packet by packet, and drops both sides instead of passing
//! on a packet that asks for the password ([`watch::AuthWatch`]). The refusal is kept for
//! the caller ([`Guard::failed`]) and becomes a definite error.
//!
//! On TLS the exchange is encrypted, so the guard itself holds the TLS session: it sends
//! the SSLRequest made of the client's handshake response, does the handshake with
//! OpenSSL ([`tls`]), and renumbers the packets of the authentication by one (the
//! SSLRequest takes a sequence number the client never sent). Only unverified TLS is
//! done this way; verified TLS stays with mysql_async, which may then send any password
//! (the server is the one the certificate names).
//!
//! # Limits
//!
//! - The relay stays for the life of the connection (the binlog stream included): one
//!   more copy of every byte through loopback. Verified TLS (recommended anyway) and
//!   `allow_insecure_password` connect directly.
//! - The loopback listener takes one connection, and it must be this client's: the
//!   handshake response must end with a random per-connection token that mysql_async
//!   sends as its only connection attribute ([`watch::TOKEN_ATTRIBUTE`]), removed before
//!   the response goes on. A local process that connects first gets the server's
//!   greeting and makes this attempt fail; nothing it sends reaches the server, so it
//!   cannot borrow the guard's TLS session and client certificate.
//! - Only the connection phase is watched. A later COM_CHANGE_USER (mysql_async's
//!   `change_user`, or its `reset` on servers without COM_RESET_CONNECTION)
//!   authenticates again, unwatched; outboxd uses neither.
//! - `sha256_password`, `dialog` (PAM) and `auth_gssapi_client` are not the guard's
//!   business: mysql_async does not implement them and fails ("unknown auth plugin") on
//!   any channel, after sending an empty answer. `mysql_old_password` is refused by the
//!   driver (`secure_auth`).
//! - Tested against a fake MySQL 8 (tests/password.rs) and the real MariaDB; no MySQL 8
//!   runs in this project's test services.

mod tls;
mod watch;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use openssl::ssl::SslConnector;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

pub(crate) use watch::{Exposing, Malformed};

use self::tls::TlsStream;
use self::watch::{AuthWatch, Greeting, Verdict, CLIENT_SSL};
use outboxd_connector_kit::net::MaybeTls;

/// Whether the guard brings TLS to the server (always unverified: verified TLS is
/// mysql_async's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GuardTls {
    /// Plain TCP.
    Off,
    /// TLS when the greeting offers it.
    IfOffered,
    /// TLS, or [`GuardError::NoTls`].
    Required,
}

/// What the channel to the server is, for the refusal's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Channel {
    /// No TLS.
    Plain,
    /// TLS whose certificate is not verified.
    UnverifiedTls,
}

/// Why a guarded connection did not come about, as the guard saw it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GuardError {
    /// The server asked for the password in a way that would expose it.
    #[error("the server asks for the password with {exposing} over {channel:?}")]
    Refused {
        exposing: Exposing,
        channel: Channel,
    },
    /// TLS is required and the greeting does not offer it.
    #[error("the server does not offer TLS")]
    NoTls,
    /// The TLS handshake with the server failed.
    #[error("TLS handshake failed: {0}")]
    Handshake(#[source] openssl::ssl::Error),
    /// Connecting to, reading from or writing to the server failed.
    #[error("{0}")]
    Server(#[source] io::Error),
    /// The server broke the protocol.
    #[error(transparent)]
    Malformed(#[from] Malformed),
    /// The loopback connection did not carry this connection's token.
    #[error("the loopback connection of the password guard came from another process")]
    Stranger,
    /// The loopback listener or the token could not be made.
    #[error("cannot set up the password guard: {0}")]
    Local(String),
}

/// Where and how the guard connects.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) tls: GuardTls,
    /// The OpenSSL settings of the TLS to the server (no verification; the client
    /// certificate, if any); needed unless `tls` is [`GuardTls::Off`].
    pub(crate) connector: Option<SslConnector>,
}

/// A guard waiting for its client, then relaying its connection.
#[derive(Debug)]
pub(crate) struct Guard {
    address: IpAddr,
    port: u16,
    token: String,
    outcome: Arc<Mutex<Option<GuardError>>>,
    task: AbortHandle,
}

/// Largest packet read during authentication: greetings, switches, scrambles and keys
/// are far smaller, and an impostor must not make the guard buffer 16 MiB.
const MAX_AUTH_PACKET: usize = 64 * 1024;

/// Copy buffer of the relay after authentication, each way (binlog events are large).
const RELAY_BUFFER: usize = 64 * 1024;

impl Guard {
    /// Opens the loopback listener and starts the guard for one connection to `target`.
    pub(crate) async fn start(target: Target) -> Result<Self, GuardError> {
        let local = |e: &dyn std::fmt::Display| GuardError::Local(e.to_string());
        let listener = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await {
            Ok(listener) => listener,
            // A host without IPv4 loopback.
            Err(_) => TcpListener::bind((Ipv6Addr::LOCALHOST, 0))
                .await
                .map_err(|e| local(&e))?,
        };
        let bound = listener.local_addr().map_err(|e| local(&e))?;
        let mut random = [0u8; 16];
        openssl::rand::rand_bytes(&mut random).map_err(|e| local(&e))?;
        let token: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let outcome = Arc::new(Mutex::new(None));
        let task =
            tokio::spawn(run(listener, target, token.clone(), Arc::clone(&outcome))).abort_handle();
        Ok(Self {
            address: bound.ip(),
            port: bound.port(),
            token,
            outcome,
            task,
        })
    }

    /// The loopback address for the client.
    pub(crate) fn address(&self) -> String {
        self.address.to_string()
    }

    /// The loopback port for the client.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The client's connection attributes: the token, and nothing else.
    pub(crate) fn attributes(&self) -> HashMap<String, String> {
        HashMap::from([(watch::TOKEN_ATTRIBUTE.to_owned(), self.token.clone())])
    }

    /// After the client failed to connect: stops the guard, and returns why it ended
    /// the connection, if it did. The guard stores its error before it closes the
    /// client's side, so a client that failed because of it finds it here.
    pub(crate) fn failed(self) -> Option<GuardError> {
        self.task.abort();
        self.outcome.lock().ok().and_then(|mut slot| slot.take())
    }
}

/// The guard's task: one client, one server connection.
async fn run(
    listener: TcpListener,
    target: Target,
    token: String,
    outcome: Arc<Mutex<Option<GuardError>>>,
) {
    let mut client = match listener.accept().await {
        Ok((client, _)) => client,
        Err(e) => {
            store(&outcome, GuardError::Local(e.to_string()));
            return;
        }
    };
    drop(listener);
    // Small packets both ways during authentication; the client sets it on its side.
    let _ = client.set_nodelay(true);
    let mut from_client = Frames::default();
    match authenticate(&mut client, &mut from_client, &target, &token).await {
        Ok(Some((server, from_server))) => relay(client, server, from_client, from_server).await,
        Ok(None) => {}
        // Stored before `client` is dropped (closed): the client fails on the close.
        Err(e) => store(&outcome, e),
    }
}

fn store(outcome: &Mutex<Option<GuardError>>, e: GuardError) {
    if let Ok(mut slot) = outcome.lock() {
        *slot = Some(e);
    }
}

/// The server's side of a guarded connection.
type ServerIo = MaybeTls<TlsStream>;

/// Connects to the server and relays the authentication, refusing what
/// [`AuthWatch`] refuses. `Ok(None)`: the client went away; nothing to relay.
async fn authenticate(
    client: &mut TcpStream,
    from_client: &mut Frames,
    target: &Target,
    token: &str,
) -> Result<Option<(ServerIo, Frames)>, GuardError> {
    let mut tcp = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(GuardError::Server)?;
    let _ = tcp.set_nodelay(true);
    outboxd_connector_kit::net::detect_dead_peers(&tcp);
    let mut from_server = Frames::default();
    let greeting = from_server.next_from_server(&mut tcp).await?;
    let (capabilities, plugin) = match watch::greeting(&greeting.payload)? {
        Greeting::V10 {
            capabilities,
            plugin,
        } => (capabilities, plugin),
        // The client reads the error and fails on it.
        Greeting::Error => {
            let _ = client.write_all(&greeting.frame(0)).await;
            return Ok(None);
        }
    };
    let offers_tls = capabilities & CLIENT_SSL != 0;
    let tls = match target.tls {
        GuardTls::Off => false,
        GuardTls::IfOffered => offers_tls,
        GuardTls::Required if offers_tls => true,
        GuardTls::Required => return Err(GuardError::NoTls),
    };
    if client.write_all(&greeting.frame(0)).await.is_err() {
        return Ok(None);
    }
    let Ok(Some(response)) = from_client.next(client).await else {
        return Ok(None);
    };
    let response_payload =
        watch::strip_token(&response.payload, token).ok_or(GuardError::Stranger)?;
    let (mut server, shift, channel) = if tls {
        let connector = target.connector.as_ref().ok_or_else(|| {
            GuardError::Local("no TLS settings for a guarded TLS connection".into())
        })?;
        let with_ssl = watch::with_ssl(&response_payload);
        let ssl_request = Packet {
            seq: response.seq,
            payload: watch::ssl_request(&with_ssl),
        };
        tcp.write_all(&ssl_request.frame(0))
            .await
            .map_err(GuardError::Server)?;
        if !from_server.buf.is_empty() {
            return Err(Malformed("data before the TLS handshake").into());
        }
        let mut stream = TlsStream::connect(connector, &target.host, tcp)
            .await
            .map_err(GuardError::Handshake)?;
        let response = Packet {
            seq: response.seq,
            payload: with_ssl,
        };
        // The SSLRequest took the response's number: every packet of the client's goes
        // one up, every packet of the server's one down, until authentication ends.
        stream
            .write_all(&response.frame(1))
            .await
            .map_err(GuardError::Server)?;
        (ServerIo::Tls(Box::new(stream)), 1u8, Channel::UnverifiedTls)
    } else {
        let response = Packet {
            seq: response.seq,
            payload: response_payload,
        };
        tcp.write_all(&response.frame(0))
            .await
            .map_err(GuardError::Server)?;
        (ServerIo::Plain(tcp), 0u8, Channel::Plain)
    };
    let mut watch = AuthWatch::new(plugin.as_deref());
    loop {
        tokio::select! {
            packet = from_server.next_from_server(&mut server) => {
                let packet = packet?;
                let verdict = watch.server_packet(&packet.payload);
                if let Verdict::Refuse(exposing) = verdict {
                    return Err(GuardError::Refused { exposing, channel });
                }
                if client.write_all(&packet.frame(shift.wrapping_neg())).await.is_err() {
                    return Ok(None);
                }
                if verdict == Verdict::Last {
                    return Ok(Some((server, from_server)));
                }
            }
            packet = from_client.next(client) => {
                let Ok(Some(packet)) = packet else {
                    return Ok(None);
                };
                server
                    .write_all(&packet.frame(shift))
                    .await
                    .map_err(GuardError::Server)?;
            }
        }
    }
}

/// After authentication: the bytes already read, then a plain copy both ways until
/// either side closes.
async fn relay(
    mut client: TcpStream,
    mut server: ServerIo,
    from_client: Frames,
    from_server: Frames,
) {
    if client.write_all(&from_server.buf).await.is_err()
        || server.write_all(&from_client.buf).await.is_err()
    {
        return;
    }
    if let Err(e) = tokio::io::copy_bidirectional_with_sizes(
        &mut client,
        &mut server,
        RELAY_BUFFER,
        RELAY_BUFFER,
    )
    .await
    {
        tracing::debug!(error = %e, "guarded MySQL connection ended");
    }
}

/// One MySQL packet.
struct Packet {
    seq: u8,
    payload: Vec<u8>,
}

impl Packet {
    /// Header and payload, with the sequence number moved by `shift`.
    fn frame(&self, shift: u8) -> Vec<u8> {
        // `MAX_AUTH_PACKET` keeps payloads far below the 24-bit length.
        let len = u32::try_from(self.payload.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes();
        let mut out = Vec::with_capacity(4 + self.payload.len());
        out.extend_from_slice(&[len[0], len[1], len[2], self.seq.wrapping_add(shift)]);
        out.extend_from_slice(&self.payload);
        out
    }
}

/// The packets of one direction, read into a buffer; reading is cancel-safe (a
/// `select!` may drop it mid-packet: the bytes stay in the buffer).
#[derive(Default)]
struct Frames {
    buf: BytesMut,
}

impl Frames {
    /// The next packet; `None` when the peer closed between packets.
    async fn next<R: AsyncRead + Unpin>(&mut self, io: &mut R) -> io::Result<Option<Packet>> {
        loop {
            if self.buf.len() >= 4 {
                let len = usize::from(self.buf[0])
                    | usize::from(self.buf[1]) << 8
                    | usize::from(self.buf[2]) << 16;
                if len > MAX_AUTH_PACKET {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("a packet of {len} bytes during authentication"),
                    ));
                }
                if self.buf.len() >= 4 + len {
                    let frame = self.buf.split_to(4 + len);
                    return Ok(Some(Packet {
                        seq: frame[3],
                        payload: frame[4..].to_vec(),
                    }));
                }
            }
            self.buf.reserve(4096);
            if io.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(io::ErrorKind::UnexpectedEof.into())
                };
            }
        }
    }

    /// [`Self::next`] from the server, which must not close during authentication.
    async fn next_from_server<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
    ) -> Result<Packet, GuardError> {
        match self.next(io).await {
            Ok(Some(packet)) => Ok(packet),
            Ok(None) => Err(GuardError::Server(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection during authentication",
            ))),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                Err(Malformed("packet size during authentication").into())
            }
            Err(e) => Err(GuardError::Server(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stranger_on_the_loopback_port_gets_nothing_through() {
        // A server that greets, then records what reaches it.
        let server = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = server.local_addr().unwrap().port();
        let received = tokio::spawn(async move {
            let (mut tcp, _) = server.accept().await.unwrap();
            let greeting = Packet {
                seq: 0,
                payload: watch::v10(0x0008_8209, "mysql_native_password"),
            };
            tcp.write_all(&greeting.frame(0)).await.unwrap();
            let mut rest = Vec::new();
            let _ = tcp.read_to_end(&mut rest).await;
            rest
        });
        let guard = Guard::start(Target {
            host: "127.0.0.1".into(),
            port,
            tls: GuardTls::Off,
            connector: None,
        })
        .await
        .unwrap();
        // Another local process, first on the port: it gets the greeting, and its
        // response, without this connection's token, goes nowhere.
        let mut stranger = TcpStream::connect((guard.address, guard.port))
            .await
            .unwrap();
        let mut frames = Frames::default();
        frames.next(&mut stranger).await.unwrap().unwrap();
        let mut response = 0x0008_8209u32.to_le_bytes().to_vec();
        response.extend_from_slice(&[0; 28]);
        response.extend_from_slice(b"root\0\0");
        let response = Packet {
            seq: 1,
            payload: response,
        };
        stranger.write_all(&response.frame(0)).await.unwrap();
        let mut rest = Vec::new();
        stranger.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        assert!(
            received.await.unwrap().is_empty(),
            "the response was relayed"
        );
        assert!(matches!(guard.failed(), Some(GuardError::Stranger)));
    }
}
