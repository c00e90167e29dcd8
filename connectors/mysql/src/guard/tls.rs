//! OpenSSL over a tokio socket, for the guard's side of a TLS connection whose
//! certificate is not verified: the guard must read the authentication exchange inside
//! it, so it, not mysql_async, holds the TLS session.
//!
//! OpenSSL's `SslStream` works on blocking `Read`/`Write`; [`Adapter`] makes the socket
//! look like one that answers `WouldBlock` when tokio's would be pending, having
//! registered the task's waker, and the stream turns `WouldBlock` back into `Pending`.
//! (tokio-openssl does the same; this crate keeps its dependencies to those it has.)

use std::future::poll_fn;
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use openssl::ssl::{ErrorCode, ShutdownResult, SslConnector, SslStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The socket as blocking I/O that would block instead of waiting.
#[derive(Debug)]
struct Adapter {
    tcp: TcpStream,
    /// The waker of the task polling the TLS stream now.
    waker: Waker,
}

impl Adapter {
    fn poll<T>(
        &mut self,
        f: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> io::Result<T> {
        let mut cx = Context::from_waker(&self.waker);
        match f(Pin::new(&mut self.tcp), &mut cx) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl Read for Adapter {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.poll(|tcp, cx| {
            let mut buf = ReadBuf::new(buf);
            tcp.poll_read(cx, &mut buf).map_ok(|()| buf.filled().len())
        })
    }
}

impl Write for Adapter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.poll(|tcp, cx| tcp.poll_write(cx, buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.poll(|tcp, cx| tcp.poll_flush(cx))
    }
}

/// A TLS client connection over a tokio socket.
#[derive(Debug)]
pub(super) struct TlsStream {
    inner: SslStream<Adapter>,
}

/// `WouldBlock` (the socket would have waited) as `Pending`.
fn pending_on_would_block<T>(result: io::Result<T>) -> Poll<io::Result<T>> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
        other => Poll::Ready(other),
    }
}

impl TlsStream {
    /// The TLS handshake over `tcp` with `connector`'s settings, for `host` (its name
    /// goes out as SNI; the certificate is not checked against it: the guard only serves
    /// unverified TLS).
    pub(super) async fn connect(
        connector: &SslConnector,
        host: &str,
        tcp: TcpStream,
    ) -> Result<Self, openssl::ssl::Error> {
        let mut configuration = connector.configure()?;
        configuration.set_verify_hostname(false);
        // No SNI for an address (RFC 6066).
        configuration.set_use_server_name_indication(host.parse::<IpAddr>().is_err());
        let ssl = configuration.into_ssl(host)?;
        let adapter = Adapter {
            tcp,
            waker: Waker::noop().clone(),
        };
        let mut inner = SslStream::new(ssl, adapter)?;
        poll_fn(|cx| {
            inner.get_mut().waker.clone_from(cx.waker());
            match inner.connect() {
                Ok(()) => Poll::Ready(Ok(())),
                Err(e) if matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) => {
                    Poll::Pending
                }
                Err(e) => Poll::Ready(Err(e)),
            }
        })
        .await?;
        Ok(Self { inner })
    }

    /// Runs `f` on the stream with the task of `cx` as the one to wake.
    fn with<R>(&mut self, cx: &Context<'_>, f: impl FnOnce(&mut SslStream<Adapter>) -> R) -> R {
        self.inner.get_mut().waker.clone_from(cx.waker());
        f(&mut self.inner)
    }
}

impl AsyncRead for TlsStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let read = this.with(cx, |s| s.read(buf.initialize_unfilled()));
        pending_on_would_block(read).map_ok(|n| buf.advance(n))
    }
}

impl AsyncWrite for TlsStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        pending_on_would_block(this.with(cx, |s| s.write(buf)))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        pending_on_would_block(this.with(cx, |s| s.flush()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // close_notify first (a server may otherwise log a truncated connection), then
        // the socket's FIN.
        match this.with(cx, |s| s.shutdown()) {
            Ok(ShutdownResult::Sent | ShutdownResult::Received) => {}
            Err(e) if e.code() == ErrorCode::ZERO_RETURN => {}
            Err(e) if matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) => {
                return Poll::Pending;
            }
            Err(e) => {
                return Poll::Ready(Err(e.into_io_error().unwrap_or_else(io::Error::other)));
            }
        }
        Pin::new(&mut this.inner.get_mut().tcp).poll_shutdown(cx)
    }
}
