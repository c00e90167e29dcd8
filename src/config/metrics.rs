//! `[metrics]`: the HTTP endpoint for `/metrics`, `/healthz` and `/readyz`.

use std::path::PathBuf;

use outboxd_connector::Secret;
use serde::Deserialize;

/// `[metrics]`: Prometheus `/metrics`, `/healthz` and `/readyz` over HTTP.
///
/// Off unless the section is present: a fixed default port would make a second outboxd on
/// the same host (a standby for the same pipeline, or another pipeline) fail to start.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Address to listen on; `0.0.0.0:9187` to be scraped or probed from other hosts.
    pub listen: std::net::SocketAddr,
    /// Topics with a series of their own in the per-topic counters; the topics seen after
    /// that count under `topic="other"`, so rows naming ever new topics (or message types)
    /// cannot grow memory or the scrape without bound.
    pub max_topic_series: usize,
    /// When set, every route but `/healthz` (`/metrics`, `/readyz`, the inbox's ingress)
    /// needs `Authorization: Bearer <token>`; `OUTBOXD_METRICS_BEARER_TOKEN` overrides it.
    pub bearer_token: Option<Secret>,
    /// File holding `bearer_token`.
    pub bearer_token_file: Option<PathBuf>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 9187)),
            max_topic_series: 200,
            bearer_token: None,
            bearer_token_file: None,
        }
    }
}

/// Environment variable that sets `metrics.bearer_token`.
pub const ENV_METRICS_BEARER_TOKEN: &str = "OUTBOXD_METRICS_BEARER_TOKEN";
