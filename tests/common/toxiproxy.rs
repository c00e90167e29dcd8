//! A small client of Toxiproxy's HTTP API (the `toxiproxy` service of `scripts/services`,
//! at `OUTBOXD_TEST_TOXIPROXY`), for the network-fault tests: a [`Proxy`] between outboxd
//! and a real server, on a loopback port of its own, with toxics added and removed while
//! the test runs, and deleted when dropped. Plain HTTP/1.1 over a blocking `TcpStream`, one
//! request per connection (HTTP/1.0): usable from `Drop`, and each request is a loopback round trip.
//!
//! The toxics the tests use (Toxiproxy's own semantics):
//! - `timeout` with `timeout: 0`: a black hole. Every byte is dropped (neither delayed nor
//!   delivered later) and no connection is closed; the peers see silence until the toxic
//!   is removed, after which bytes flow again through the same connections (with a gap).
//! - `reset_peer`: a connection is reset (TCP RST) at its next byte.
//! - `latency`: each chunk delayed by `latency` ± `jitter` ms.
//! - `limit_data`: the connection is closed once `bytes` have passed.
//!
//! Disabling a proxy ([`Proxy::set_enabled`]) closes its connections and stops listening
//! (connections are refused) until it is enabled again, on the same port.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use rand::Rng;
use serde_json::{json, Value};

use super::{env_or, free_port};

/// Which direction of a proxied connection a toxic acts on: `Upstream` is client → server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Upstream,
    Downstream,
}

impl Stream {
    pub const BOTH: [Stream; 2] = [Stream::Upstream, Stream::Downstream];

    fn name(self) -> &'static str {
        match self {
            Stream::Upstream => "upstream",
            Stream::Downstream => "downstream",
        }
    }
}

/// A toxic and its attributes.
#[derive(Clone, Copy, Debug)]
pub enum Toxic {
    /// Drops every byte; closes the connection after `ms` (never when 0: a black hole).
    Timeout { ms: u64 },
    /// Delays each chunk by `ms` ± `jitter_ms`.
    Latency { ms: u64, jitter_ms: u64 },
    /// Resets the connection (RST) `ms` after its next byte (at once when 0).
    ResetPeer { ms: u64 },
    /// Closes the connection once `bytes` have passed.
    LimitData { bytes: u64 },
}

impl Toxic {
    /// A black hole: nothing passes, nothing is closed.
    pub const BLACK_HOLE: Toxic = Toxic::Timeout { ms: 0 };

    fn kind(self) -> &'static str {
        match self {
            Toxic::Timeout { .. } => "timeout",
            Toxic::Latency { .. } => "latency",
            Toxic::ResetPeer { .. } => "reset_peer",
            Toxic::LimitData { .. } => "limit_data",
        }
    }

    fn attributes(self) -> Value {
        match self {
            Toxic::Timeout { ms } | Toxic::ResetPeer { ms } => json!({ "timeout": ms }),
            Toxic::Latency { ms, jitter_ms } => json!({ "latency": ms, "jitter": jitter_ms }),
            Toxic::LimitData { bytes } => json!({ "bytes": bytes }),
        }
    }
}

/// The Toxiproxy server's API.
#[derive(Clone, Debug)]
pub struct Toxiproxy {
    /// `host:port` of the HTTP API.
    pub api: String,
}

impl Toxiproxy {
    /// The server `scripts/services` runs (`OUTBOXD_TEST_TOXIPROXY`); panics with the fix
    /// when it does not answer.
    pub fn from_env() -> Self {
        let api = Self {
            api: env_or("OUTBOXD_TEST_TOXIPROXY", "127.0.0.1:28474"),
        };
        if let Err(e) = api.request("GET", "/version", None) {
            panic!(
                "Toxiproxy's API at {} does not answer ({e}); start it with \
                 `scripts/services start toxiproxy`",
                api.api
            );
        }
        api
    }

    /// One request: `(status, body)`. HTTP/1.0, so that the body comes whole (never
    /// chunked) and the server closes the connection after it.
    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, String)> {
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut stream = TcpStream::connect(&self.api)?;
        stream.set_read_timeout(Some(Duration::from_secs(15)))?;
        stream.set_write_timeout(Some(Duration::from_secs(15)))?;
        let request = format!(
            "{method} {path} HTTP/1.0\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            self.api,
            body.len()
        );
        stream.write_all(request.as_bytes())?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply)?;
        let reply = String::from_utf8_lossy(&reply);
        let status = reply
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP reply: {reply:?}")))?;
        let body = reply
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        Ok((status, body))
    }

    /// A request that must answer one of `ok` statuses.
    fn call(&self, method: &str, path: &str, body: Option<&Value>, ok: &[u16]) -> String {
        let (status, reply) = self
            .request(method, path, body)
            .unwrap_or_else(|e| panic!("toxiproxy {method} {path}: {e}"));
        assert!(
            ok.contains(&status),
            "toxiproxy {method} {path} {body:?}: {status} {reply}"
        );
        reply
    }

    /// The server's version, e.g. `v2.12.0`.
    pub fn version(&self) -> String {
        let reply = self.call("GET", "/version", None, &[200]);
        let version: Value = serde_json::from_str(&reply).expect("the version as JSON");
        version["version"].as_str().expect("version").to_owned()
    }

    /// A proxy named `<prefix>_<random>` listening on a free loopback port (below the
    /// ephemeral range, as the services' ports: see [`free_port`]) in front of `upstream`.
    pub fn proxy(&self, prefix: &str, upstream: &str) -> Proxy {
        let suffix: u32 = rand::thread_rng().gen_range(100_000..999_999);
        let name = format!("{prefix}_{suffix}");
        let port = free_port();
        self.create(&name, &format!("127.0.0.1:{port}"), upstream)
    }

    /// A proxy of a fixed name and listen address (Kafka's, whose address the broker
    /// advertises): one an earlier run left (a killed test) is deleted first.
    pub fn proxy_at(&self, name: &str, listen: &str, upstream: &str) -> Proxy {
        self.call("DELETE", &format!("/proxies/{name}"), None, &[204, 404]);
        self.create(name, listen, upstream)
    }

    fn create(&self, name: &str, listen: &str, upstream: &str) -> Proxy {
        let body = json!({
            "name": name,
            "listen": listen,
            "upstream": upstream,
            "enabled": true,
        });
        let reply = self.call("POST", "/proxies", Some(&body), &[201]);
        let created: Value = serde_json::from_str(&reply).expect("the proxy as JSON");
        let listen = created["listen"].as_str().expect("listen").to_owned();
        let port = listen
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("listen port");
        Proxy {
            api: self.clone(),
            name: name.to_owned(),
            port,
            upstream: upstream.to_owned(),
        }
    }
}

/// One proxy; deleted (its connections closed) when dropped.
#[derive(Debug)]
pub struct Proxy {
    api: Toxiproxy,
    pub name: String,
    /// The loopback port it listens on.
    pub port: u16,
    pub upstream: String,
}

impl Proxy {
    /// `127.0.0.1:<port>`.
    pub fn listen(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Adds `toxic` on `stream`, named `<kind>_<stream>`; returns the name.
    pub fn add(&self, toxic: Toxic, stream: Stream) -> String {
        let name = format!("{}_{}", toxic.kind(), stream.name());
        let body = json!({
            "name": name,
            "type": toxic.kind(),
            "stream": stream.name(),
            "toxicity": 1.0,
            "attributes": toxic.attributes(),
        });
        self.api.call(
            "POST",
            &format!("/proxies/{}/toxics", self.name),
            Some(&body),
            &[200],
        );
        name
    }

    /// Adds `toxic` in both directions.
    pub fn add_both(&self, toxic: Toxic) -> Vec<String> {
        Stream::BOTH.iter().map(|s| self.add(toxic, *s)).collect()
    }

    /// Removes the toxic `name`.
    pub fn remove(&self, name: &str) {
        self.api.call(
            "DELETE",
            &format!("/proxies/{}/toxics/{name}", self.name),
            None,
            &[204],
        );
    }

    /// The names of the toxics in place.
    pub fn toxics(&self) -> Vec<String> {
        let reply = self.api.call(
            "GET",
            &format!("/proxies/{}/toxics", self.name),
            None,
            &[200],
        );
        let toxics: Vec<Value> = serde_json::from_str(&reply).expect("toxics as JSON");
        toxics
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// Removes every toxic: the proxy passes everything again.
    pub fn heal(&self) {
        for name in self.toxics() {
            self.remove(&name);
        }
    }

    /// Enables (listens, passes) or disables (closes every connection, refuses new ones)
    /// the proxy: disabling is a cut.
    pub fn set_enabled(&self, enabled: bool) {
        self.api.call(
            "PATCH",
            &format!("/proxies/{}", self.name),
            Some(&json!({ "enabled": enabled })),
            &[200],
        );
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let path = format!("/proxies/{}", self.name);
        match self.api.request("DELETE", &path, None) {
            Ok((204 | 404, _)) => {}
            // Not a second panic while a failing test unwinds.
            Ok((status, body)) if !std::thread::panicking() => {
                panic!("toxiproxy DELETE {path}: {status} {body}")
            }
            Err(e) if !std::thread::panicking() => panic!("toxiproxy DELETE {path}: {e}"),
            _ => {}
        }
    }
}
