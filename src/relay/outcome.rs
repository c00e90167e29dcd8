//! The one mapping from a sink's outcome to what is written back to the row: a receipt
//! becomes [`Delivered`] (SUCCESS with partition and offset), any failure becomes a
//! [`DeliveryFailure`] (FAILED with the sink's text in `last_error` and the backoff delay).
//! The log relay, the claim worker and `outboxd recover` all write rows back through it.

use outboxd_connector::{Delivered, DeliveryFailure, RowId};

use crate::claims::next_retry_delay;
use crate::config::RetryConfig;
use crate::sink::{FailureKind, SinkResult};

/// What a delivery means for its row.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Durable in the destination: the row becomes SUCCESS.
    Delivered(Delivered),
    /// Not delivered: the row becomes FAILED (or MANUAL_REQUIRED at its last attempt).
    Failed {
        /// The write-back, with the retry delay drawn from the backoff policy.
        failure: DeliveryFailure,
        /// Why; [`FailureKind::Fatal`] also means the sink must be replaced.
        kind: FailureKind,
    },
}

impl Outcome {
    /// The outcome of the record of `row`, which had failed `retry_count` times before.
    pub(crate) fn new(
        row: RowId,
        retry_count: i32,
        result: SinkResult,
        retry: &RetryConfig,
    ) -> Self {
        let RowId { table, id } = row;
        match result {
            Ok(receipt) => Outcome::Delivered(Delivered {
                id,
                table,
                partition: receipt.partition,
                offset: receipt.offset,
            }),
            Err(failure) => Outcome::Failed {
                failure: DeliveryFailure {
                    id,
                    table,
                    error: failure.error,
                    // The backoff, or the destination's `Retry-After` when it asks for
                    // longer (up to `retry.cap`: a hostile answer cannot park a row for
                    // years).
                    retry_delay: next_retry_delay(retry, retry_count)
                        .max(failure.retry_after.unwrap_or_default().min(retry.cap)),
                },
                kind: failure.kind,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::sink::{Receipt, SinkFailure};
    use outboxd_connector::RowId;

    #[test]
    fn receipts_become_success_and_failures_keep_their_text_and_backoff() {
        let retry = RetryConfig {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            jitter: Duration::ZERO,
            ..RetryConfig::default()
        };
        let receipt = Receipt {
            partition: 3,
            offset: 42,
        };
        match Outcome::new(RowId { table: 0, id: 7 }, 0, Ok(receipt), &retry) {
            Outcome::Delivered(d) => assert_eq!((d.id, d.partition, d.offset), (7, 3, 42)),
            other => panic!("{other:?}"),
        }
        let failure = SinkFailure {
            kind: FailureKind::Rejected,
            error: "Message size too large".into(),
            retry_after: None,
        };
        match Outcome::new(RowId { table: 1, id: 8 }, 2, Err(failure), &retry) {
            Outcome::Failed { failure, kind } => {
                assert_eq!(kind, FailureKind::Rejected);
                assert_eq!((failure.table, failure.id), (1, 8));
                assert_eq!(failure.error, "Message size too large");
                assert_eq!(failure.retry_delay, Duration::from_secs(4));
            }
            other => panic!("{other:?}"),
        }
        // A `Retry-After` longer than the backoff wins, up to `retry.cap`.
        for (asked, due_in) in [(2, 4), (30, 30), (3600, 60)] {
            let failure = SinkFailure {
                kind: FailureKind::Retryable,
                error: "503".into(),
                retry_after: Some(Duration::from_secs(asked)),
            };
            match Outcome::new(RowId { table: 0, id: 9 }, 2, Err(failure), &retry) {
                Outcome::Failed { failure, .. } => {
                    assert_eq!(failure.retry_delay, Duration::from_secs(due_in), "{asked}")
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
