//! `verify`'s end of the HTTP sink: a plain-HTTP server on the address of the endpoint the
//! run's events go to, standing in for the partner's service. Each request's
//! `webhook-id` (the event's message id) is recorded; with the endpoint's secrets set,
//! its Standard Webhooks signature is checked first, and a request that fails it is
//! refused (401) and counted, as a real receiver would.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::arrivals::Arrivals;
use super::plan::find_index;
use crate::webhooks::signature::{self, Secret};

/// A request body larger than this is refused (the run's payloads are a few hundred bytes).
const MAX_BODY: usize = 1 << 20;

/// Signatures older or newer than this are refused, as Standard Webhooks advises.
const TOLERANCE: Duration = Duration::from_secs(300);

/// The receiver; stops accepting when dropped.
pub(crate) struct HttpReceiver {
    task: JoinHandle<()>,
}

impl Drop for HttpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where `url` (an endpoint's) is served: plain http, an address of this machine.
pub(crate) fn listen_address(url: &str) -> Result<SocketAddr, String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("endpoint url {url:?}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "endpoint url {url}: verify receives the events itself, over plain http on this \
             machine; point the run's endpoint at http://127.0.0.1:<port>/ (a free port)"
        ));
    }
    let host = uri.host().unwrap_or("127.0.0.1").trim_matches(['[', ']']);
    let ip: std::net::IpAddr = match host {
        "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
        other => other.parse().map_err(|_| {
            format!("endpoint url {url}: verify listens on an IP address (127.0.0.1), not {host}")
        })?,
    };
    Ok(SocketAddr::new(ip, uri.port_u16().unwrap_or(80)))
}

impl HttpReceiver {
    /// Listens on `address` and records each request of the run (`prefix`).
    pub(crate) async fn start(
        address: SocketAddr,
        secrets: Vec<Secret>,
        prefix: String,
        arrivals: Arc<Arrivals>,
    ) -> Result<Self, String> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|e| format!("cannot listen on {address} (the run's endpoint): {e}"))?;
        let shared = Arc::new((secrets, prefix, arrivals));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let shared = shared.clone();
                        async move {
                            let (secrets, prefix, arrivals) = &*shared;
                            Ok::<_, Infallible>(receive(request, secrets, prefix, arrivals).await)
                        }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    let _ = http.serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Ok(Self { task })
    }
}

async fn receive(
    request: Request<Incoming>,
    secrets: &[Secret],
    prefix: &str,
    arrivals: &Arrivals,
) -> Response<Full<Bytes>> {
    let answer = |status: StatusCode| {
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = status;
        response
    };
    let (parts, body) = request.into_parts();
    let Ok(body) = Limited::new(body, MAX_BODY).collect().await else {
        return answer(StatusCode::PAYLOAD_TOO_LARGE);
    };
    let body = body.to_bytes();
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    if !secrets.is_empty() {
        let checked = signature::verify(
            secrets,
            header("webhook-id"),
            header("webhook-timestamp"),
            header("webhook-signature"),
            &body,
            TOLERANCE,
            SystemTime::now(),
        );
        if checked.is_err() {
            arrivals.refuse_signature();
            return answer(StatusCode::UNAUTHORIZED);
        }
    }
    let index = header("webhook-id")
        .and_then(|id| find_index(id.as_bytes(), prefix))
        .or_else(|| find_index(&body, prefix));
    if let Some(index) = index {
        arrivals.record(index, None, None);
    }
    answer(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::listen_address;

    #[test]
    fn the_endpoint_must_be_plain_http_on_an_address() {
        assert_eq!(
            listen_address("http://127.0.0.1:8089/hooks")
                .unwrap()
                .to_string(),
            "127.0.0.1:8089"
        );
        assert_eq!(
            listen_address("http://localhost/").unwrap().to_string(),
            "127.0.0.1:80"
        );
        assert_eq!(
            listen_address("http://[::1]:8089/").unwrap().to_string(),
            "[::1]:8089"
        );
        assert!(listen_address("https://127.0.0.1:8443/").is_err());
        assert!(listen_address("http://partner.example/").is_err());
    }
}
