//! Observability: what an operator's scraper and probes see of a running pipeline.
//!
//! The dataflow: the relay and the claim worker count into [`PipelineStats`] (plain
//! atomics) and [`PipelineMetrics`] (`prometheus-client` metrics) as they run. The HTTP
//! endpoint ([`server`]) answers `/metrics`, `/healthz` and `/readyz`; on each request
//! [`health`] adds what only the outside knows (Kafka's reachability, the database's
//! status summary, each behind its cache) and [`metrics`] renders every series, with the
//! process's own figures from [`process`]. [`trace_context`] ties the log lines about an
//! event to the application's trace (the row's `traceparent`), and [`otlp`] exports those
//! events' spans to an OpenTelemetry collector (`[otlp]`).
//!
//! [`PipelineStats`]: crate::relay::PipelineStats

pub mod endpoint_metrics;
mod health;
mod metrics;
pub mod otlp;
mod process;
mod server;
pub(crate) mod trace_context;

pub(crate) use health::Health;
pub use metrics::{PipelineMetrics, UncommittedRecords};
pub(crate) use server::{bind, require_bearer, router, serve_while};
