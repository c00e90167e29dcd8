//! The HTTP sink's series, one set per endpoint of `[http.endpoints]`:
//!
//! | series | type | labels |
//! |---|---|---|
//! | `outboxd_http_requests_total` | counter | `endpoint`, `class` (`2xx` … `5xx`, `no_answer`) |
//! | `outboxd_http_request_duration_seconds` | histogram | `endpoint` |
//! | `outboxd_http_requests_in_flight` | gauge | `endpoint` |
//! | `outboxd_http_endpoint_up` | gauge | `endpoint` |
//!
//! The sink takes one [`EndpointSeries`] per endpoint when it starts: handles into the
//! families, so a request costs a few atomic operations and no lookup. `/metrics`
//! registers the families themselves ([`EndpointMetrics::register`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds, in seconds, of the request duration histogram's buckets: a loopback
/// receiver answers within a millisecond, a partner's webhook within seconds, and the
/// longest a request may take is `http.timeout`.
const DURATION_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The `class` label's values: the answer's status class, or no answer at all (no
/// connection, or none within `http.timeout`).
const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "no_answer"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabel {
    endpoint: String,
    class: &'static str,
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// Every endpoint's series (see the module documentation). Cloning shares them.
#[derive(Clone, Debug)]
pub struct EndpointMetrics {
    requests: Family<RequestLabel, Counter>,
    duration: Family<EndpointLabel, Histogram, fn() -> Histogram>,
    in_flight: Family<EndpointLabel, Gauge>,
    up: Family<EndpointLabel, Gauge>,
}

impl Default for EndpointMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            in_flight: Family::default(),
            up: Family::default(),
        }
    }
}

impl EndpointMetrics {
    /// The series of `endpoint`, created now (each class at 0, the endpoint up), so a
    /// dashboard or an alert has them before the first request.
    pub fn endpoint(&self, endpoint: &str) -> EndpointSeries {
        let label = EndpointLabel {
            endpoint: endpoint.to_owned(),
        };
        let requests = CLASSES.map(|class| {
            self.requests.get_or_create_owned(&RequestLabel {
                endpoint: endpoint.to_owned(),
                class,
            })
        });
        let up = self.up.get_or_create_owned(&label);
        up.set(1);
        EndpointSeries {
            requests,
            duration: self.duration.get_or_create_owned(&label),
            in_flight: self.in_flight.get_or_create_owned(&label),
            up,
        }
    }

    /// Adds every endpoint's series to a scrape's registry.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "outboxd_http_requests",
            "HTTP sink requests by endpoint and answer: the status class, or no_answer (no \
             connection, or none within http.timeout)",
            self.requests.clone(),
        );
        registry.register(
            "outboxd_http_request_duration_seconds",
            "HTTP sink requests, from sending to the answer (or to giving up on one)",
            self.duration.clone(),
        );
        registry.register(
            "outboxd_http_requests_in_flight",
            "HTTP sink requests sent and not answered yet",
            self.in_flight.clone(),
        );
        registry.register(
            "outboxd_http_endpoint_up",
            "0 while the HTTP sink takes the endpoint for down (its rows wait, one request \
             probes it), else 1",
            self.up.clone(),
        );
    }
}

/// One endpoint's series (handles that share the families' values).
#[derive(Clone, Debug)]
pub struct EndpointSeries {
    requests: [Counter; CLASSES.len()],
    duration: Histogram,
    in_flight: Gauge,
    up: Gauge,
}

impl EndpointSeries {
    /// A request is sent; the returned guard counts it in flight until it is dropped.
    pub fn sending(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// A request ended after `seconds`: answered with `status`, or not at all (`None`).
    pub fn answered(&self, status: Option<u16>, seconds: f64) {
        let class = match status {
            Some(code @ 100..=599) => usize::from(code / 100 - 1),
            // A code outside 100–599 is not HTTP's; hyper does not let one through.
            Some(_) | None => CLASSES.len() - 1,
        };
        self.requests[class].inc();
        self.duration.observe(seconds);
    }

    /// The circuit breaker took the endpoint for down (`false`) or up again.
    pub fn set_up(&self, up: bool) {
        self.up.set(i64::from(up));
    }
}

/// A request in flight, counted until dropped (an answer, or a cancelled task).
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::prometheus_text;

    use super::*;

    #[test]
    fn each_endpoint_has_its_series_from_the_start_and_counts_by_class() {
        let metrics = EndpointMetrics::default();
        let orders = metrics.endpoint("orders");
        let _billing = metrics.endpoint("billing");
        {
            let _sent = orders.sending();
            let mut registry = Registry::default();
            metrics.register(&mut registry);
            let mut text = String::new();
            prometheus_text::encode(&mut text, &registry).unwrap();
            assert!(text.contains("outboxd_http_requests_in_flight{endpoint=\"orders\"} 1"));
        }
        orders.answered(Some(200), 0.002);
        orders.answered(Some(503), 0.004);
        orders.answered(None, 5.0);
        orders.set_up(false);

        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_text::encode(&mut text, &registry).unwrap();
        for line in [
            "# TYPE outboxd_http_requests_total counter",
            "outboxd_http_requests_total{endpoint=\"orders\",class=\"2xx\"} 1",
            "outboxd_http_requests_total{endpoint=\"orders\",class=\"5xx\"} 1",
            "outboxd_http_requests_total{endpoint=\"orders\",class=\"no_answer\"} 1",
            "outboxd_http_requests_total{endpoint=\"orders\",class=\"4xx\"} 0",
            "outboxd_http_requests_total{endpoint=\"billing\",class=\"2xx\"} 0",
            "outboxd_http_request_duration_seconds_count{endpoint=\"orders\"} 3",
            "outboxd_http_request_duration_seconds_bucket{endpoint=\"orders\",le=\"0.0025\"} 1",
            "outboxd_http_requests_in_flight{endpoint=\"orders\"} 0",
            "outboxd_http_endpoint_up{endpoint=\"orders\"} 0",
            "outboxd_http_endpoint_up{endpoint=\"billing\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
    }
}
