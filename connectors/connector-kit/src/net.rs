//! Socket options for connections to a database. A peer that vanishes without closing
//! (a network partition, a host powered off, a NAT entry dropped) leaves reads and
//! writes waiting forever unless the kernel is told to look: TCP keepalive probes find an
//! idle connection dead, and `TCP_USER_TIMEOUT` fails one whose sent data stays
//! unacknowledged (a status update, a write-back statement). The engine then sees an I/O
//! error, which is transient: the session reconnects.
//!
//! What this cannot see is a live TCP peer that forwards nothing (a stuck proxy): the
//! replication stream's own liveness check covers that (see the PostgreSQL engine's
//! `log/stream.rs`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Idle time before the first keepalive probe.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Time between keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the connection is dropped.
pub const KEEPALIVE_RETRIES: u32 = 3;
/// Sent data unacknowledged this long fails the connection (Linux).
pub const USER_TIMEOUT: Duration = Duration::from_secs(60);

/// Sets keepalive probes and `TCP_USER_TIMEOUT` on `tcp` (see the module doc). Best
/// effort: a platform without an option keeps its defaults.
pub fn detect_dead_peers(tcp: &TcpStream) {
    let socket = SockRef::from(tcp);
    let keepalive = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES);
    if let Err(e) = socket.set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "cannot set TCP keepalive on a database connection");
    }
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    if let Err(e) = socket.set_tcp_user_timeout(Some(USER_TIMEOUT)) {
        tracing::debug!(error = %e, "cannot set TCP_USER_TIMEOUT on a database connection");
    }
}

/// A connection to a database: plain TCP, or TLS (`T`, the engine's TLS stream) over it.
/// Reads and writes go to whichever it is.
#[derive(Debug)]
pub enum MaybeTls<T> {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (boxed: a TLS stream is large).
    Tls(Box<T>),
}

impl<T: AsyncRead + Unpin> AsyncRead for MaybeTls<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            MaybeTls::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for MaybeTls<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            MaybeTls::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            MaybeTls::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            MaybeTls::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_options_are_set_on_the_socket() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        detect_dead_peers(&tcp);
        let socket = SockRef::from(&tcp);
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(socket.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), KEEPALIVE_RETRIES);
        #[cfg(target_os = "linux")]
        assert_eq!(socket.tcp_user_timeout().unwrap(), Some(USER_TIMEOUT));
    }
}
