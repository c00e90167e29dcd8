//! One record handed to librdkafka, and what its errors mean for the row and the producer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::DeliveryFuture;

use crate::sink::{FailureKind, Receipt, SinkFailure, SinkResult};

/// A record handed to the producer; resolves to its outcome.
///
/// A plain enum rather than an `async` block so the relay's per-record future stays the
/// one allocation it was before the sink boundary existed. The event's tracing span is
/// its caller's to hold (the relay's session, the claim worker, `recover`).
#[must_use = "a delivery resolves to the record's outcome"]
pub struct KafkaDelivery(State, Transactional);

/// Whether the record went out inside a Kafka transaction (exactly-once): a failure
/// there makes the whole transaction fail, so it is the sink's, not the row's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transactional {
    No,
    Yes,
}

enum State {
    /// Waiting for the broker's acknowledgement.
    InFlight(DeliveryFuture),
    /// Already decided (rejected before it was queued); taken when polled.
    Done(Option<SinkFailure>),
}

impl KafkaDelivery {
    pub(super) fn in_flight(future: DeliveryFuture) -> Self {
        Self(State::InFlight(future), Transactional::No)
    }

    /// A record inside the open Kafka transaction: any failure dooms the transaction,
    /// which can then only be aborted. See [`in_transaction_failure`] for whose it is.
    pub(super) fn in_transaction(future: DeliveryFuture) -> Self {
        Self(State::InFlight(future), Transactional::Yes)
    }

    pub(super) fn failed(e: &KafkaError) -> Self {
        Self(State::Done(Some(classify(e))), Transactional::No)
    }

    /// Refused before it was queued, inside a Kafka transaction: a refusal of this record
    /// alone ([`FailureKind::Rejected`]) leaves the transaction usable; anything else (the
    /// producer in a state that needs an abort, a full stop) is the sink's.
    pub(super) fn failed_in_transaction(e: &KafkaError) -> Self {
        let mut failure = classify(e);
        if failure.kind != FailureKind::Rejected {
            failure.kind = FailureKind::Fatal;
        }
        Self(State::Done(Some(failure)), Transactional::No)
    }

    /// Decided before it was queued, with the sink to blame.
    pub(super) fn fatal(error: String) -> Self {
        let failure = SinkFailure {
            kind: FailureKind::Fatal,
            error,
            retry_after: None,
        };
        Self(State::Done(Some(failure)), Transactional::No)
    }
}

impl Future for KafkaDelivery {
    type Output = SinkResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<SinkResult> {
        self.get_mut().poll_outcome(cx)
    }
}

impl KafkaDelivery {
    fn poll_outcome(&mut self, cx: &mut Context<'_>) -> Poll<SinkResult> {
        match &mut self.0 {
            State::Done(failure) => {
                Poll::Ready(Err(failure.take().unwrap_or_else(|| SinkFailure {
                    kind: FailureKind::Fatal,
                    error: "a Kafka delivery was polled after it completed".into(),
                    retry_after: None,
                })))
            }
            State::InFlight(future) => Pin::new(future).poll(cx).map(|result| match result {
                Ok(Ok(delivery)) => Ok(Receipt {
                    partition: delivery.partition,
                    offset: delivery.offset,
                }),
                Ok(Err((e, _message))) if self.1 == Transactional::Yes => {
                    Err(in_transaction_failure(&e))
                }
                // Purged: outboxd replaced a stuck producer (`Sink::rebuild`).
                Ok(Err((e, _message)))
                    if matches!(
                        e.rdkafka_error_code(),
                        Some(RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight)
                    ) =>
                {
                    Err(SinkFailure {
                        kind: FailureKind::Fatal,
                        error: "the Kafka producer was rebuilt before the record was \
                                acknowledged; it is read again from the log and sent again"
                            .into(),
                        retry_after: None,
                    })
                }
                Ok(Err((e, _message))) => Err(classify(&e)),
                Err(_canceled) => Err(SinkFailure {
                    kind: FailureKind::Fatal,
                    error: "the Kafka producer was shut down before the record was acknowledged"
                        .into(),
                    retry_after: None,
                }),
            }),
        }
    }
}

/// The failure of a record inside the open Kafka transaction, which is doomed either way.
/// When the broker refuses this record for what it is (too large for its topic, invalid,
/// a topic it may not write to or that does not exist) the failure is the row's, with
/// its kind: sent again in a transaction it would doom that one too, so the relay makes
/// the row FAILED outside the aborted transaction and sends the rest again. Anything else
/// (a timeout, a fenced or purged producer) is [`FailureKind::Fatal`]: the rows stay INIT
/// and the next session sends the whole transaction again.
fn in_transaction_failure(e: &KafkaError) -> SinkFailure {
    let failure = classify(e);
    let the_records = failure.kind == FailureKind::Rejected
        || matches!(
            e.rdkafka_error_code(),
            Some(RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::UnknownTopic)
        );
    match the_records {
        true => SinkFailure {
            kind: failure.kind,
            error: format!(
                "{}; the Kafka transaction holding it is aborted",
                failure.error
            ),
            retry_after: None,
        },
        false => SinkFailure {
            kind: FailureKind::Fatal,
            error: format!(
                "{}; the Kafka transaction holding it is aborted and its records are sent \
                 again",
                failure.error
            ),
            retry_after: None,
        },
    }
}

/// Fatal: the idempotent producer is unusable. Rejected: this record can never be
/// produced as it is. Anything else (timeouts, unavailable brokers, unknown topics that
/// may yet be created) may succeed later.
fn classify(e: &KafkaError) -> SinkFailure {
    let kind = match e.rdkafka_error_code() {
        Some(RDKafkaErrorCode::Fatal) => FailureKind::Fatal,
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidTopic,
        ) => FailureKind::Rejected,
        _ => FailureKind::Retryable,
    };
    SinkFailure {
        kind,
        error: e.to_string(),
        retry_after: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_by_what_they_mean_for_the_row() {
        let produce = |code| KafkaError::MessageProduction(code);
        assert_eq!(
            classify(&produce(RDKafkaErrorCode::Fatal)).kind,
            FailureKind::Fatal
        );
        assert_eq!(
            classify(&produce(RDKafkaErrorCode::MessageSizeTooLarge)).kind,
            FailureKind::Rejected
        );
        let timeout = classify(&produce(RDKafkaErrorCode::MessageTimedOut));
        assert_eq!(timeout.kind, FailureKind::Retryable);
        // The text is librdkafka's, unchanged: it is what `last_error` has always shown.
        assert_eq!(
            timeout.error,
            produce(RDKafkaErrorCode::MessageTimedOut).to_string()
        );
    }

    /// Inside a Kafka transaction a refusal of the record itself stays the row's (the
    /// relay takes the row out of its transactions); anything else is the producer's.
    #[test]
    fn in_a_transaction_only_a_refusal_of_the_record_is_the_rows() {
        let produce = |code| KafkaError::MessageProduction(code);
        let kind = |code| in_transaction_failure(&produce(code)).kind;
        assert_eq!(
            kind(RDKafkaErrorCode::MessageSizeTooLarge),
            FailureKind::Rejected
        );
        assert_eq!(
            kind(RDKafkaErrorCode::TopicAuthorizationFailed),
            FailureKind::Retryable
        );
        assert_eq!(kind(RDKafkaErrorCode::UnknownTopic), FailureKind::Retryable);
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::ProducerFenced,
            RDKafkaErrorCode::PurgeInflight,
            RDKafkaErrorCode::Fatal,
        ] {
            assert_eq!(kind(code), FailureKind::Fatal, "{code:?}");
        }
        let text = in_transaction_failure(&produce(RDKafkaErrorCode::MessageSizeTooLarge)).error;
        assert!(text.contains("aborted"), "{text}");
    }
}
