//! The sink conformance suite: what the [`Sink`] trait promises, written once as scenarios
//! (`scenarios.rs`) and run against every sink: the in-memory twin the core's unit tests
//! drive (`memory.rs`), the HTTP sink against a loopback server (`http.rs`), and the Kafka
//! sink against the real broker of `OUTBOXD_TEST_KAFKA` (`kafka.rs`). A behaviour one sink
//! passes and another fails is a contract violation, not a test difference; and the twin
//! passing them is what makes the core's tests on it worth something.
//!
//! The scenarios only call the [`Sink`] trait, plus the [`SinkHarness`] of each sink for
//! what the trait cannot say: a fresh destination and a reader of what it took, a record
//! it refuses for good, a destination nobody answers at, a sink in its fatal state, a
//! sink with a small byte bound.
//!
//! Each harness lists every scenario of [`SCENARIOS`] in [`sink_conformance_tests!`]:
//! those that apply (one test each; one the sink fails is marked `#[ignore = "what goes
//! wrong"]`) and, with the reason, those that do not (the HTTP sink has no fatal state).
//! A test fails when a scenario is in neither list, as the connectors' `conformance_tests!`
//! does.
//!
//! `loopback.rs` is the HTTP test server, shared with `sink/http/tests.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use outboxd_connector::OutboxEvent;

use crate::sink::{Sink, SinkResult};

mod http;
mod kafka;
pub(crate) mod loopback;
mod memory;
mod scenarios;

/// What a scenario needs of a sink besides the [`Sink`] trait. Methods of scenarios a
/// harness marks as not applying keep their default, which panics.
pub(crate) trait SinkHarness: Sized {
    /// The sink under test.
    type Sink: Sink + 'static;

    /// A fresh destination nothing else writes to (a topic of its own, a server of its
    /// own). Each scenario starts one.
    async fn start() -> Self;

    /// A new sink, strict ordering, to this harness's destination. The scenario owns it:
    /// dropping the last handle is the process going away (for Kafka, librdkafka purges
    /// what it still holds).
    async fn sink(&self) -> Arc<Self::Sink>;

    /// The row ids (of [`crate::testing::event`]'s `m-<id>` message ids) the destination
    /// took, in the order its reader sees them (for Kafka: partition by partition, in
    /// offset order; a key's records are in one partition). What the destination holds
    /// now; a reader that lags (a Kafka consumer) reads on, within a bound, until it has
    /// `at_least` records and has reached the end.
    async fn delivered(&self, at_least: usize) -> Vec<i64>;

    /// Makes the destination slow to decide each record, so that `flush` has something to
    /// wait for (a no-op where the destination takes time anyway).
    fn slow_down(&self);

    /// An event the destination refuses for good (too large for the topic; an endpoint
    /// answering 422): its delivery fails refused for good: [`FailureKind::Rejected`](crate::sink::FailureKind) or `Refused`.
    fn refused_event(&self, id: i64, key: &str) -> OutboxEvent;

    /// A sink to a destination nobody answers at; it gives a record up as retryable
    /// within a few seconds.
    async fn unreachable_sink(&self) -> Arc<Self::Sink>;

    /// A sink in its fatal state, to this harness's destination: every record fails
    /// [`FailureKind::Fatal`](crate::sink::FailureKind) until [`Sink::recover`].
    async fn fatal_sink(&self) -> Arc<Self::Sink> {
        unimplemented!("this harness marks the fatal scenario as not applying")
    }

    /// A sink whose local queue holds at most the returned number of bytes, to a
    /// destination that takes nothing (records stay queued) and gives each record up as
    /// retryable within a few seconds.
    async fn bounded_sink(&self) -> (Arc<Self::Sink>, usize) {
        unimplemented!("this harness marks the bound scenario as not applying")
    }
}

/// Every scenario of `scenarios.rs`, by function name.
pub(crate) const SCENARIOS: &[&str] = &[
    "each_keys_records_arrive_in_send_order_among_concurrent_keys",
    "a_record_the_destination_refuses_is_rejected_and_others_go_on",
    "a_refusal_is_the_records_alone_not_its_neighbours",
    "an_unreachable_destination_is_retryable",
    "recover_keeps_a_healthy_sink",
    "a_fatal_sink_fails_fatal_until_recovered",
    "handed_over_bytes_stay_within_the_bound",
    "flush_waits_for_records_whose_outcome_is_awaited",
    "flush_waits_for_records_whose_delivery_was_dropped",
];

/// One test per applying scenario for harness `$harness` on runtime `#[$runtime]`, and a
/// test that fails unless every scenario of [`SCENARIOS`] is listed once, in `applies`
/// or, with a reason, in `not_applicable`:
///
/// ```ignore
/// sink_conformance_tests! {
///     harness: HttpHarness,
///     runtime: #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
///     applies: [recover_keeps_a_healthy_sink, #[ignore = "why"] flush_waits_for_…],
///     not_applicable: [a_fatal_sink_fails_fatal_until_recovered => "why"],
/// }
/// ```
macro_rules! sink_conformance_tests {
    (
        harness: $harness:ty,
        runtime: #[$runtime:meta],
        applies: [$($(#[$meta:meta])* $scenario:ident),* $(,)?],
        not_applicable: [$($left:ident => $why:literal),* $(,)?] $(,)?
    ) => {
        $(
            $(#[$meta])*
            #[$runtime]
            async fn $scenario() {
                $crate::sink::conformance::scenarios::$scenario::<$harness>().await;
            }
        )*

        #[test]
        fn every_sink_scenario_runs_or_is_marked_not_applying() {
            // The names left out are scenarios too (a typo does not compile).
            $(let _ = $crate::sink::conformance::scenarios::$left::<$harness>;)*
            $crate::sink::conformance::assert_all_listed(
                &[$(stringify!($scenario)),*],
                &[$((stringify!($left), $why)),*],
            );
        }
    };
}
use sink_conformance_tests;

/// Panics unless every scenario of [`SCENARIOS`] is in exactly one of `applies` and
/// `not_applicable`, the latter with a reason (used by [`sink_conformance_tests!`]).
pub(crate) fn assert_all_listed(applies: &[&str], not_applicable: &[(&str, &str)]) {
    for scenario in SCENARIOS {
        let runs = applies.contains(scenario);
        let left = not_applicable.iter().any(|(name, _)| name == scenario);
        assert!(
            runs || left,
            "sink conformance scenario `{scenario}` is neither run nor marked not applying \
             (with the reason) for this sink"
        );
        assert!(
            !(runs && left),
            "sink conformance scenario `{scenario}` is both run and marked not applying"
        );
    }
    for (name, why) in not_applicable {
        assert!(
            why.split_whitespace().count() >= 3,
            "say why `{name}` does not apply to this sink"
        );
    }
    for name in applies.iter().chain(not_applicable.iter().map(|(n, _)| n)) {
        assert!(SCENARIOS.contains(name), "`{name}` is not in SCENARIOS");
    }
}

/// How long a scenario waits for a delivery's outcome or a reader: the real sinks decide
/// in well under a second here; past this the sink is taken to never decide.
pub(crate) const DECIDED_WITHIN: Duration = Duration::from_secs(20);

/// The outcome of `delivery`, which must come within [`DECIDED_WITHIN`].
pub(crate) async fn decided(what: &str, delivery: impl Future<Output = SinkResult>) -> SinkResult {
    tokio::time::timeout(DECIDED_WITHIN, delivery)
        .await
        .unwrap_or_else(|_| panic!("{what}: no outcome within {DECIDED_WITHIN:?}"))
}

/// Row id of a message id `m-<id>` ([`crate::testing::event`]'s).
pub(crate) fn row_id(message_id: &str) -> i64 {
    message_id
        .strip_prefix("m-")
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("not a test message id: {message_id:?}"))
}

mod tests {
    use super::*;

    #[test]
    fn a_scenario_neither_run_nor_left_out_fails_the_harness() {
        let mut applies: Vec<&str> = SCENARIOS.to_vec();
        let missing = applies.pop().unwrap();
        let result = std::panic::catch_unwind(|| assert_all_listed(&applies, &[]));
        let message = *result.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains(missing), "{message}");
        assert_all_listed(&applies, &[(missing, "the sink has no such thing")]);
        let bare = std::panic::catch_unwind(|| assert_all_listed(&applies, &[(missing, "")]));
        assert!(bare.is_err(), "a reason is required");
    }
}
