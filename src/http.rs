//! A minimal HTTP/1.1 responder for `/metrics`, `/healthz` and `/readyz`.
//!
//! GET and HEAD only, one request per connection (`Connection: close`), request heads up to
//! 8 KiB read within 5 s, at most [`MAX_CONNECTIONS`] at once. That is all a Prometheus
//! scraper or a Kubernetes probe needs, without an HTTP framework in the binary.
//!
//! The server runs as a future beside the pipeline (not a spawned task), so it can borrow
//! the pipeline's connector and producer.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Longest request head accepted.
const MAX_HEAD: usize = 8 * 1024;
/// Time allowed to receive the request head, and to send the response.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 16;

/// A response: status, content type and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

impl Response {
    /// 200 with a body of the given type.
    pub fn ok(content_type: &'static str, body: String) -> Self {
        Self {
            status: 200,
            content_type,
            body,
        }
    }

    /// A plain-text response.
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }
}

/// What the server answers: a response for a request path (query string removed).
pub trait Routes {
    /// The response to `GET path`.
    fn respond(&self, path: &str) -> impl Future<Output = Response>;
}

/// Runs `work` to completion with the server answering on `listener` beside it (in the
/// same task, so `routes` may borrow what `work` uses). Without a listener, just `work`.
pub async fn serve_while<R: Routes, T>(
    listener: Option<TcpListener>,
    routes: &R,
    work: impl Future<Output = T>,
) -> T {
    let Some(listener) = listener else {
        return work.await;
    };
    tokio::select! {
        result = work => result,
        never = serve(listener, routes) => match never {},
    }
}

/// Binds `addr` for [`serve`], with an error that names the config key.
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).await.map_err(|e| {
        format!(
            "cannot listen on metrics.listen = \"{addr}\": {e}; choose a free address or remove \
             the [metrics] section"
        )
    })
}

/// Accepts connections on `listener` and answers them with `routes`, forever.
pub async fn serve<R: Routes>(listener: TcpListener, routes: &R) -> Infallible {
    let mut connections = FuturesUnordered::new();
    loop {
        tokio::select! {
            accepted = listener.accept(), if connections.len() < MAX_CONNECTIONS => match accepted {
                Ok((stream, _peer)) => connections.push(handle(stream, routes)),
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(()) = connections.next(), if !connections.is_empty() => {}
        }
    }
}

async fn handle<R: Routes>(mut stream: TcpStream, routes: &R) {
    let head = match tokio::time::timeout(IO_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(head)) => head,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "metrics listener: bad request");
            return;
        }
        Err(_) => return,
    };
    let (response, head_only) = match parse_request_line(&head) {
        Some((method @ ("GET" | "HEAD"), path)) => (routes.respond(path).await, method == "HEAD"),
        Some(_) => (Response::text(405, "only GET and HEAD\n"), false),
        None => (Response::text(400, "bad request\n"), false),
    };
    let bytes = encode(&response, head_only);
    let _ = tokio::time::timeout(IO_TIMEOUT, async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    })
    .await;
}

/// Reads until the blank line that ends the request head.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before the end of the request head",
            ));
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Ok(head);
        }
        if head.len() > MAX_HEAD {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "request head too long",
            ));
        }
    }
}

/// `GET /metrics?x=1 HTTP/1.1` → `("GET", "/metrics")`.
fn parse_request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line_end = head.iter().position(|b| *b == b'\n')?;
    let line = std::str::from_utf8(&head[..line_end]).ok()?.trim_end();
    let mut parts = line.split(' ');
    let method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Some((method, path))
}

fn encode(response: &Response, head_only: bool) -> Vec<u8> {
    let reason = match response.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "",
    };
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        response.status,
        response.content_type,
        response.body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(response.body.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;

    impl Routes for Fixed {
        async fn respond(&self, path: &str) -> Response {
            Response::text(200, format!("you asked for {path}"))
        }
    }

    #[test]
    fn request_lines_parse_strictly() {
        assert_eq!(
            parse_request_line(b"GET /metrics?name[]=x HTTP/1.1\r\nHost: a\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(
            parse_request_line(b"HEAD /readyz HTTP/1.0\n\n"),
            Some(("HEAD", "/readyz"))
        );
        assert_eq!(parse_request_line(b"GET /\r\n\r\n"), None);
        assert_eq!(parse_request_line(b"\xff\xfe / HTTP/1.1\r\n\r\n"), None);
        assert_eq!(parse_request_line(b"GET / SPDY/3\r\n\r\n"), None);
    }

    #[tokio::test]
    async fn serves_requests_and_survives_garbage() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = serve(listener, &Fixed);
        let client = async {
            // Garbage and an early close do not stop the server.
            let mut bad = TcpStream::connect(addr).await.unwrap();
            bad.write_all(b"\x00\x01\x02 nonsense\r\n\r\n")
                .await
                .unwrap();
            let mut reply = String::new();
            bad.read_to_string(&mut reply).await.unwrap();
            assert!(reply.starts_with("HTTP/1.1 400 "), "{reply}");
            drop(TcpStream::connect(addr).await.unwrap());

            let mut ok = TcpStream::connect(addr).await.unwrap();
            ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut reply = String::new();
            ok.read_to_string(&mut reply).await.unwrap();
            assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
            assert!(reply.ends_with("\r\n\r\nyou asked for /healthz"), "{reply}");

            let mut post = TcpStream::connect(addr).await.unwrap();
            post.write_all(b"POST /metrics HTTP/1.1\r\n\r\n")
                .await
                .unwrap();
            let mut reply = String::new();
            post.read_to_string(&mut reply).await.unwrap();
            assert!(reply.starts_with("HTTP/1.1 405 "), "{reply}");
        };
        tokio::select! {
            never = server => match never {},
            () = client => {}
        }
    }
}
