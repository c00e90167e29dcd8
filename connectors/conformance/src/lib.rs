//! The contract of `outboxd_connector`, as scenarios run against every engine.
//!
//! Each scenario is an async function generic over a [`Harness`]: the engine's test
//! crate implements the harness with plain SQL through its own client (a fresh isolated
//! outbox per scenario, rows inserted in committed or rolled-back transactions, status
//! columns read and set) and instantiates every scenario with
//! [`conformance_tests!`], one `#[tokio::test]` each. The scenarios themselves only call
//! the contract's traits ([`Connector`](outboxd_connector::Connector),
//! [`OutboxStore`](outboxd_connector::OutboxStore),
//! [`TableAdmin`](outboxd_connector::TableAdmin),
//! [`ChangeStream`](outboxd_connector::ChangeStream)), so a behaviour one engine passes
//! and another fails is a contract violation, not a test difference.
//!
//! - [`store`]: write-back, replay, checkpoint;
//! - [`claims`]: claims, tokens, strict order, reaper, parked rows, schedule;
//! - [`admin`]: the operator's actions;
//! - [`inbox`]: the inbox store: deduplication, per-key claims, outcomes, SQL handler;
//! - [`stream`]: the log tail.
//!
//! [`ports`] and [`services`] are test support every suite shares: loopback ports for the
//! servers tests start, and the environment and TLS files of those `scripts/services` starts.
//!
//! A new engine: implement [`Harness`] in its `tests/conformance.rs` and list every
//! scenario in [`conformance_tests!`] (a test fails when one is missing). A scenario the
//! engine fails is a connector bug: mark it `#[ignore = "…"]` with what goes wrong.
//!
//! The core's in-memory twins (`src/testing/`) run the suite too. A twin may leave a part
//! of the contract untwinned (they twin the outbox store and the stream, not the inbox nor
//! the operator's actions but parking): it lists those scenarios ignored with that reason,
//! and every other scenario must pass, as against a real engine.

pub mod admin;
pub mod claims;
mod harness;
pub mod inbox;
pub mod ports;
pub mod services;
pub mod store;
pub mod stream;
mod support;

pub use harness::{Harness, NewRow, RowState, Setup, Table};

/// Generates one `#[tokio::test]` (multi-threaded runtime: the calling crate needs tokio
/// with `macros` and `rt-multi-thread`) per scenario for harness `$harness`, and a test that
/// fails when a scenario of [`SCENARIOS`] is left out (mark a scenario the engine fails
/// `#[ignore = "why"]` instead):
///
/// ```ignore
/// outboxd_conformance::conformance_tests!(PgHarness;
///     store::write_back_moves_rows_through_the_state_machine,
///     #[ignore = "why"] claims::concurrent_claimers_share_the_due_rows,
/// );
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($harness:ty; $($(#[$meta:meta])* $module:ident :: $scenario:ident),* $(,)?) => {
        $(
            $(#[$meta])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                $crate::$module::$scenario::<$harness>().await;
            }
        )*

        #[test]
        fn every_conformance_scenario_is_instantiated() {
            $crate::assert_all_instantiated(&[
                $(concat!(stringify!($module), "::", stringify!($scenario))),*
            ]);
        }
    };
}

/// Every scenario, as `module::function`.
pub const SCENARIOS: &[&str] = &[
    "store::write_back_moves_rows_through_the_state_machine",
    "store::checkpoint_commits_with_the_batch_and_never_moves_backward",
    "store::delivered_rows_are_found_for_a_transaction_read_again",
    "store::a_success_row_takes_a_new_position_only_when_its_first_was_aborted",
    "store::exactly_once_parks_and_fails_a_success_row_of_an_aborted_transaction",
    "stream::a_large_transaction_arrives_in_parts",
    "store::open_store_without_tables_is_a_definite_error",
    "claims::claim_takes_due_failed_rows_in_id_order",
    "claims::concurrent_claimers_skip_locked_rows_and_never_share_one",
    "claims::concurrent_claimers_share_the_due_rows",
    "claims::strict_claim_takes_only_the_earliest_row_of_each_blocked_key",
    "claims::poll_claim_takes_init_and_due_failed_rows_in_key_order",
    "claims::strict_poll_claim_waits_for_an_earlier_row_locked_elsewhere",
    "claims::complete_claimed_writes_only_where_the_claim_still_holds",
    "claims::released_claims_keep_their_attempt_count",
    "claims::reaper_returns_expired_claims_to_failed_or_manual_required",
    "claims::parked_rows_become_failed_and_due_with_the_reason",
    "claims::rejected_rows_need_an_operator_and_hold_their_key",
    "claims::blocked_keys_and_retry_schedule_read_the_rows_in_trouble",
    "admin::status_summary_counts_rows_and_reads_the_checkpoint",
    "admin::retry_makes_rows_due_again",
    "admin::park_and_resolve_record_the_operator_reason",
    "admin::janitor_deletes_or_archives_old_success_rows",
    "admin::scan_init_pages_through_init_rows_in_id_order",
    "admin::console_reads_pages_rows_and_held_keys",
    "inbox::insert_stores_each_message_once_by_either_key",
    "inbox::claim_takes_one_message_per_key_in_arrival_order",
    "inbox::concurrent_claimers_never_share_a_key",
    "inbox::the_sql_handler_takes_effect_only_with_done",
    "inbox::failures_back_off_and_end_in_manual_required",
    "inbox::reaper_and_schedule_cover_the_inbox",
    "inbox::operator_actions_cover_the_inbox",
    "inbox::verify_reads_back_its_messages_and_counts_effects",
    "inbox::console_reads_the_inbox",
    "stream::only_committed_transactions_are_read_in_commit_order",
    "stream::a_reopened_stream_resumes_after_the_confirmed_position",
    "stream::rows_written_while_no_stream_is_open_are_read_later",
    "stream::status_updates_are_not_events",
    "stream::a_second_reader_is_transient",
    "stream::a_lost_log_position_is_a_definite_error",
    "stream::a_checkpoint_from_another_server_is_refused_until_recover",
    "stream::own_rows_are_written_read_back_and_deleted",
];

/// Panics unless `instantiated` names every scenario of [`SCENARIOS`] (used by
/// [`conformance_tests!`]).
pub fn assert_all_instantiated(instantiated: &[&str]) {
    let missing: Vec<&str> = SCENARIOS
        .iter()
        .copied()
        .filter(|s| !instantiated.contains(s))
        .collect();
    assert!(
        missing.is_empty(),
        "conformance scenarios not instantiated for this engine: {missing:?}"
    );
}
