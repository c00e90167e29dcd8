//! `ingress-flood`: what costly requests to the inbox's HTTP door do to the process that
//! also relays (one outboxd: log mode on PostgreSQL and `[inbox.http]` with one signed
//! source on the same endpoint).
//!
//! The hostile request is the most costly one the door takes without a secret: a 1 MiB
//! body, a current `webhook-timestamp`, and a `webhook-signature` of seven entries of a
//! tag's length followed by 1,500 empty ones. Rows:
//! - one hostile request at a time, 20 in a row: its latency (the request's cost);
//! - the relay at `--flood-rate` (1,000 ev/s), quiet, then with `--flood-clients` (50)
//!   clients sending hostile requests back to back: commit → Kafka latency, CPU;
//! - `/healthz` during the flood, asked every 50 ms: its latency.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::daemon::{self, BenchPipeline, Source};
use crate::report::{Latency, Row};
use crate::Bench;

/// A source's secret: the hostile requests never match it.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

impl Bench {
    pub(crate) async fn ingress_flood(&mut self) -> anyhow::Result<Vec<Row>> {
        let p = self.flood_pipeline().await?;
        let port = p.metrics_port;
        let request = Arc::new(hostile_request());
        let rate = self.args.flood_rate;
        let mut rows = Vec::new();

        // The cost of one request, alone.
        let mut daemon = self.spawn(&p, &format!("{}-alone.log", p.name))?;
        crate::wait_ready(&mut daemon, port, Duration::from_secs(30)).await?;
        let mut alone = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            send(port, &request).await?;
            alone.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        let _ = daemon.terminate(Duration::from_secs(60)).await;
        alone.sort_by(f64::total_cmp);
        let mut row = Row::named("inbox HTTP: one hostile 1 MiB request");
        row.events = alone.len();
        row.latency = Latency::from_sorted(&alone);
        row.note = "latency = the request's answer (401)".into();
        rows.push(row);

        let (quiet, daemon) = self
            .fixed_rate_at(
                &p,
                &format!("log (PostgreSQL) @{rate} ev/s, quiet"),
                "q",
                rate,
            )
            .await?;
        let _ = daemon.terminate(Duration::from_secs(60)).await;
        rows.push(quiet);

        // The same with the flood, which starts once outboxd is ready (`/readyz`).
        let stop = Arc::new(AtomicBool::new(false));
        let go = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let mut clients = Vec::new();
        for _ in 0..self.args.flood_clients {
            let (request, stop, go, sent) = (
                Arc::clone(&request),
                Arc::clone(&stop),
                Arc::clone(&go),
                Arc::clone(&sent),
            );
            clients.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if go.load(Ordering::Relaxed) && send(port, &request).await.is_ok() {
                        sent.fetch_add(1, Ordering::Relaxed);
                    } else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }));
        }
        // Probes: each `/healthz` gets 5 s; one that does not answer counts as a failure.
        let probes = tokio::spawn({
            let (stop, go) = (Arc::clone(&stop), Arc::clone(&go));
            async move {
                while !stop.load(Ordering::Relaxed) && !go.load(Ordering::Relaxed) {
                    if let Ok((200, _)) = daemon::http_get(port, "/readyz").await {
                        go.store(true, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let (mut latencies, mut failed) = (Vec::new(), 0usize);
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let probe = daemon::http_get(port, "/healthz");
                    match tokio::time::timeout(Duration::from_secs(5), probe).await {
                        Ok(Ok((200, _))) => latencies.push(asked.elapsed().as_secs_f64() * 1000.0),
                        _ => failed += 1,
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (latencies, failed)
            }
        });
        let label = format!(
            "log (PostgreSQL) @{rate} ev/s, {} flooding",
            self.args.flood_clients
        );
        let flooded = self.fixed_rate_at(&p, &label, "f", rate).await;
        stop.store(true, Ordering::Relaxed);
        for client in clients {
            let _ = client.await;
        }
        let (mut healthz, failed) = probes.await?;
        let hostile = sent.load(Ordering::Relaxed);
        match flooded {
            Ok((mut row, daemon)) => {
                let _ = daemon.terminate(Duration::from_secs(60)).await;
                row.note = format!("{hostile} hostile requests answered meanwhile");
                rows.push(row);
            }
            // Before the door was bounded, the flood kept outboxd from becoming ready.
            Err(e) => rows.push(Row::unavailable(
                &label,
                &format!(
                    "failed under the flood ({hostile} hostile requests answered): {}",
                    crate::last_line(&format!("{e:#}"))
                ),
            )),
        }
        healthz.sort_by(f64::total_cmp);
        let mut row = Row::named("/healthz during the flood");
        row.events = healthz.len();
        row.latency = Latency::from_sorted(&healthz);
        row.note = format!("asked every 50 ms; {failed} not answered within 5 s");
        rows.push(row);
        Ok(rows)
    }

    /// A log-mode pipeline with an inbox table and `[inbox.http]` (source `shop` signed).
    async fn flood_pipeline(&mut self) -> anyhow::Result<BenchPipeline> {
        let name = format!("bench_{}_flood", self.run);
        let topic = format!("bench.{}.flood", self.run);
        crate::consume::create_topic(&self.services.kafka, &topic, self.args.partitions).await?;
        self.topics.push(topic.clone());
        let extra = format!(
            "[inbox]\n[inbox.http]\n[inbox.http.secrets]\nshop = [\"{SECRET}\"]\n\
             [inbox.handlers.default]\nkind = \"sql\"\nstatement = \"SELECT 1\"\n"
        );
        let p = BenchPipeline::write(
            &self.dir,
            &self.services,
            &name,
            &topic,
            Source::PgLog,
            &extra,
        )?;
        // The inbox's table is a key of [outbox], written above the extra sections.
        let text = std::fs::read_to_string(&p.config)?;
        let table_line = format!("table = \"{}\"\n", p.table);
        let with_inbox = text.replacen(
            &table_line,
            &format!("{table_line}inbox_table = \"inbox_{name}\"\n"),
            1,
        );
        std::fs::write(&p.config, with_inbox)?;
        self.pipelines.push(p.clone());
        daemon::outboxd_once(&self.args.outboxd, "init", &p.config).await?;
        Ok(p)
    }
}

/// The raw hostile request (see the module doc).
fn hostile_request() -> Vec<u8> {
    let mut body = br#"{"type": "x", "pad": ""#.to_vec();
    body.resize(1024 * 1024 - 2, b'a');
    body.extend_from_slice(b"\"}");
    let tag_sized = format!("v1,{}=", "A".repeat(43));
    let mut entries = vec![tag_sized; 7];
    entries.extend(std::iter::repeat_n("v1,".to_owned(), 1_500));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    // The timestamp stays within the door's 5-minute tolerance for the run's length.
    let head = format!(
        "POST /v1/inbox/shop HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\
         webhook-id: flood\r\nwebhook-timestamp: {now}\r\nwebhook-signature: {}\r\n\r\n",
        body.len(),
        entries.join(" ")
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(&body);
    request
}

/// Sends `request` and reads the answer to the end (the server closes).
async fn send(port: u16, request: &[u8]) -> std::io::Result<()> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    // A server that answers before the whole body (503 when busy) may close early.
    let _ = stream.write_all(request).await;
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply).await;
    Ok(())
}
