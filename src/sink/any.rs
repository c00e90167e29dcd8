//! The sink a process runs with, chosen by its config (`[kafka]` or `[http]`): one type
//! for the relay, the claim worker, `recover` and the endpoint, which stay generic over
//! [`Sink`] and never learn which destination it is.

use std::time::Duration;

use futures_util::future::Either;
use outboxd_connector::{CheckLine, OutboxEvent};

use super::http::{HttpDelivery, HttpSink};
use super::kafka::{KafkaDelivery, KafkaSink};
use super::{CommittedPosition, Sink, SinkFailure};
use crate::observability::endpoint_metrics::EndpointMetrics;

/// See the module documentation. One per process, built once: the variants' sizes do
/// not matter.
#[allow(clippy::large_enum_variant)]
pub enum AnySink {
    /// `[kafka]`
    Kafka(KafkaSink),
    /// `[http]`
    Http(HttpSink),
}

/// Calls the same method on whichever sink it is.
macro_rules! each {
    ($self:ident, $sink:ident => $call:expr) => {
        match $self {
            AnySink::Kafka($sink) => $call,
            AnySink::Http($sink) => $call,
        }
    };
}

impl Sink for AnySink {
    type Delivery = Either<KafkaDelivery, HttpDelivery>;

    async fn send(&self, event: &OutboxEvent) -> Self::Delivery {
        match self {
            AnySink::Kafka(sink) => Either::Left(sink.send(event).await),
            AnySink::Http(sink) => Either::Right(sink.send(event).await),
        }
    }

    fn waits_for(&self) -> &'static str {
        each!(self, sink => sink.waits_for())
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        each!(self, sink => sink.destination(event))
    }

    fn refusal(&self, event: &OutboxEvent) -> Option<String> {
        each!(self, sink => sink.refusal(event))
    }

    async fn flush(&self, deadline: Duration) {
        each!(self, sink => sink.flush(deadline).await)
    }

    async fn check(&self, timeout: Duration) -> CheckLine {
        each!(self, sink => sink.check(timeout).await)
    }

    fn queue_depth(&self) -> i64 {
        each!(self, sink => sink.queue_depth())
    }

    fn transactional(&self) -> bool {
        each!(self, sink => sink.transactional())
    }

    async fn committed_position(&self) -> Result<Option<CommittedPosition>, SinkFailure> {
        each!(self, sink => sink.committed_position().await)
    }

    async fn commit(&self, committed: &CommittedPosition) -> Result<(), SinkFailure> {
        each!(self, sink => sink.commit(committed).await)
    }

    async fn abort(&self) {
        each!(self, sink => sink.abort().await)
    }

    async fn destination_healthy(&self, timeout: Duration) -> Result<bool, String> {
        each!(self, sink => sink.destination_healthy(timeout).await)
    }

    async fn rebuild(&self) -> Result<(), String> {
        each!(self, sink => sink.rebuild().await)
    }

    async fn recover(&self) -> Result<bool, String> {
        each!(self, sink => sink.recover().await)
    }

    fn endpoint_metrics(&self) -> Option<EndpointMetrics> {
        each!(self, sink => sink.endpoint_metrics())
    }
}
