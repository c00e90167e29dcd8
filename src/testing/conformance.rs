//! The connector contract's conformance suite (`outboxd_conformance`) against the memory
//! twins, as `connectors/*/tests/conformance.rs` run it against PostgreSQL and MariaDB:
//! the core's unit tests are only as good as the twins they run on, and this is what
//! proves the twins keep the contract the real stores keep.
//!
//! The harness's "plain SQL on the side" is the database's state read and set directly.
//! Every store, claim and stream scenario runs, and `recover`'s scan of INIT rows (an
//! `admin::` scenario, but of the [`OutboxStore`](outboxd_connector::OutboxStore)); the
//! operator's other actions and the inbox are not twinned ([`super::connector`]), so
//! their scenarios are listed as ignored.

use std::sync::Arc;

use bytes::Bytes;
use outboxd_conformance::{Harness, NewRow, RowState, Setup, Table};
use outboxd_connector::{Connector, ConnectorError, Position, ReadMode};

use super::connector::MemoryConnector;
use super::database::{from_now, rfc3339, seconds_from_now, uuid, Database, Row};
use super::lsn;

/// The scenario's database, through its connector.
struct MemoryHarness {
    connector: MemoryConnector,
}

impl MemoryHarness {
    fn db(&self) -> &Arc<Database> {
        &self.connector.db
    }
}

/// A row lock another transaction holds until [`Harness::unlock`].
struct RowLock {
    db: Arc<Database>,
    id: i64,
}

/// What the harness reads or writes only on the tables the twins do not twin.
fn not_twinned(what: &str) -> ! {
    panic!("{what}: the memory twin does not twin the inbox or the operator's tables")
}

impl Harness for MemoryHarness {
    type Connector = MemoryConnector;
    const UTC_OFFSET: &'static str = "Z";
    /// The twin keeps the headers object's order, as a text column does.
    const STORED_HEADERS: &'static [(&'static str, &'static str)] = &[("trace", "abc"), ("n", "7")];
    type Lock = RowLock;

    async fn create(_prefix: &str) -> Self {
        Self {
            connector: MemoryConnector::default(),
        }
    }

    fn connector(&self) -> &MemoryConnector {
        &self.connector
    }

    async fn init(&self, mode: ReadMode) -> Result<Vec<String>, ConnectorError> {
        self.connector.init(mode).await
    }

    async fn insert(&self, rows: &[NewRow]) -> Vec<i64> {
        // Unique message ids, as the real harnesses' `'m-' || uuid`.
        let new = rows.iter().map(|row| {
            Row::new(
                format!("m-{}", uuid()),
                row.message_type.clone(),
                row.key.clone(),
                Bytes::from_static(br#"{"k": 1}"#),
                Row::headers_of(Some(r#"{"trace": "abc", "n": 7}"#)),
                row.max_retry_count,
            )
        });
        self.db().commit(new.collect())
    }

    /// Nothing is written, but the ids the sequence handed out.
    async fn insert_rolled_back(&self, rows: &[NewRow]) {
        let mut state = self.db().state();
        state.next_id += i64::try_from(rows.len()).expect("a few rows");
    }

    async fn row(&self, id: i64) -> RowState {
        let state = self.db().state();
        let row = state.rows.get(&id).expect("the row exists");
        RowState {
            status: row.status.to_owned(),
            retry_count: row.retry_count,
            next_retry_in: row.next_retry_time.map(seconds_from_now),
            claim_token: row.claim_token.clone(),
            claimed: row.claimed_at.is_some(),
            last_error: row.last_error.clone(),
            sent: row.sent_at.is_some(),
            partition: row.partition,
            offset: row.offset,
        }
    }

    async fn set(&self, ids: &[i64], setup: &Setup) {
        let mut state = self.db().state();
        for id in ids {
            let row = state.rows.get_mut(id).expect("the row exists");
            set_columns(row, setup);
        }
    }

    async fn lock_row(&self, id: i64) -> RowLock {
        self.db().state().locked.insert(id);
        RowLock {
            db: Arc::clone(self.db()),
            id,
        }
    }

    async fn unlock(&self, lock: RowLock) {
        lock.db.state().locked.remove(&lock.id);
    }

    fn positions(&self) -> [Position; 4] {
        // Far past the scenario's log; as text, "lsn:0/FFFFFFFF" sorts after
        // "lsn:0/100000000": the checkpoint compares positions, not their text.
        [0xFFFF_FF00, 0xFFFF_FFFF, 0x1_0000_0000, 0x1_0000_0100].map(lsn)
    }

    async fn confirmed_position(&self) -> Option<Position> {
        self.db().state().slot.clone()
    }

    async fn lose_log_position(&self) {
        self.db().state().position_lost = true;
    }

    async fn carry_checkpoint_from_another_server(&self) {
        // Another server's text, past this server's log (an old outboxd resumed there
        // would skip every row inserted so far).
        let mut state = self.db().state();
        let ahead = state.log_end + 1_000;
        state.checkpoint = Some(Position::new(
            u128::from(ahead),
            format!("lsn:0/{ahead:X};server=another-server"),
        ));
    }

    async fn inbox_row(&self, _id: i64) -> RowState {
        not_twinned("inbox_row")
    }

    async fn set_inbox(&self, _ids: &[i64], _setup: &Setup) {
        not_twinned("set_inbox")
    }

    async fn set_processed_ago(&self, _ids: &[i64], _seconds: i64) {
        not_twinned("set_processed_ago")
    }

    async fn effects_table(&self) -> String {
        not_twinned("effects_table")
    }

    async fn effects(&self) -> Vec<String> {
        not_twinned("effects")
    }

    async fn hide_table(&self, table: Table, away: bool) {
        let mut state = self.db().state();
        match table {
            Table::Outbox => state.outbox_hidden = away,
            Table::Checkpoint => state.checkpoint_hidden = away,
        }
    }

    async fn archive_table(&self) -> String {
        not_twinned("archive_table")
    }

    async fn archived_ids(&self) -> Vec<i64> {
        not_twinned("archived_ids")
    }

    /// The twin has no privileges: anyone may insert.
    async fn grant_insert_on_outbox(&self) {}

    /// The twin has no privileges: anyone may create a table.
    async fn grant_create_table(&self) {}

    async fn cleanup(self) {}
}

/// Applies `setup` to `row`, as the real harnesses' UPDATE does.
fn set_columns(row: &mut Row, setup: &Setup) {
    if let Some(status) = setup.status {
        row.status = status;
    }
    if let Some(next) = setup.next_retry_in {
        row.next_retry_time = next.map(from_now);
    }
    if let Some(n) = setup.retry_count {
        row.retry_count = n;
    }
    if let Some(n) = setup.max_retry_count {
        row.max_retry_count = n;
    }
    if let Some(token) = &setup.claim_token {
        row.claim_token = Some(token.clone());
    }
    if let Some(ago) = setup.claimed_ago {
        row.claimed_at = Some(from_now(-ago));
    }
    if let Some(message_type) = &setup.message_type {
        row.message_type = message_type.clone();
    }
    if let Some(error) = &setup.last_error {
        row.last_error = Some(error.clone());
    }
    if let Some(ago) = setup.created_ago {
        row.created_at = rfc3339(from_now(-ago));
    }
    if setup.updated_ago.is_some() {
        not_twinned("updated_at (the janitor's column)");
    }
    if let Some(sent) = setup.sent_ago {
        row.sent_at = sent.map(|ago| from_now(-ago));
    }
}

outboxd_conformance::conformance_tests!(MemoryHarness;
    store::write_back_moves_rows_through_the_state_machine,
    store::checkpoint_commits_with_the_batch_and_never_moves_backward,
    store::delivered_rows_are_found_for_a_transaction_read_again,
    store::a_success_row_takes_a_new_position_only_when_its_first_was_aborted,
    store::exactly_once_parks_and_fails_a_success_row_of_an_aborted_transaction,
    stream::a_large_transaction_arrives_in_parts,
    store::open_store_without_tables_is_a_definite_error,
    claims::claim_takes_due_failed_rows_in_id_order,
    claims::concurrent_claimers_skip_locked_rows_and_never_share_one,
    claims::concurrent_claimers_share_the_due_rows,
    claims::strict_claim_takes_only_the_earliest_row_of_each_blocked_key,
    claims::poll_claim_takes_init_and_due_failed_rows_in_key_order,
    claims::strict_poll_claim_waits_for_an_earlier_row_locked_elsewhere,
    claims::complete_claimed_writes_only_where_the_claim_still_holds,
    claims::released_claims_keep_their_attempt_count,
    claims::reaper_returns_expired_claims_to_failed_or_manual_required,
    claims::parked_rows_become_failed_and_due_with_the_reason,
    claims::rejected_rows_need_an_operator_and_hold_their_key,
    claims::blocked_keys_and_retry_schedule_read_the_rows_in_trouble,
    #[ignore = "the memory twin does not twin TableAdmin but parking: the core's unit tests use it for the relay and the claim worker only"]
    admin::status_summary_counts_rows_and_reads_the_checkpoint,
    #[ignore = "the memory twin does not twin TableAdmin but parking: the core's unit tests use it for the relay and the claim worker only"]
    admin::retry_makes_rows_due_again,
    #[ignore = "the memory twin does not twin TableAdmin but parking: the core's unit tests use it for the relay and the claim worker only"]
    admin::park_and_resolve_record_the_operator_reason,
    #[ignore = "the memory twin does not twin TableAdmin but parking: the core's unit tests use it for the relay and the claim worker only"]
    admin::janitor_deletes_or_archives_old_success_rows,
    admin::scan_init_pages_through_init_rows_in_id_order,
    #[ignore = "the memory twin does not twin TableAdmin but parking: the core's unit tests use it for the relay and the claim worker only"]
    admin::console_reads_pages_rows_and_held_keys,
    #[ignore = "the memory twin does not twin InboxStore: the core's unit tests use it for the relay and the claim worker only"]
    inbox::insert_stores_each_message_once_by_either_key,
    #[ignore = "the memory twin does not twin InboxStore: the core's unit tests use it for the relay and the claim worker only"]
    inbox::claim_takes_one_message_per_key_in_arrival_order,
    #[ignore = "the memory twin does not twin InboxStore: the core's unit tests use it for the relay and the claim worker only"]
    inbox::concurrent_claimers_never_share_a_key,
    #[ignore = "the memory twin does not twin InboxStore: the core's unit tests use it for the relay and the claim worker only"]
    inbox::the_sql_handler_takes_effect_only_with_done,
    #[ignore = "the memory twin does not twin InboxStore: the core's unit tests use it for the relay and the claim worker only"]
    inbox::failures_back_off_and_end_in_manual_required,
    #[ignore = "the memory twin does not twin InboxStore: the core's unit tests use it for the relay and the claim worker only"]
    inbox::reaper_and_schedule_cover_the_inbox,
    #[ignore = "the memory twin does not twin InboxStore: the core's unit tests use it for the relay and the claim worker only"]
    inbox::operator_actions_cover_the_inbox,
    #[ignore = "the memory twin does not twin InboxStore: the core's unit tests use it for the relay and the claim worker only"]
    inbox::verify_reads_back_its_messages_and_counts_effects,
    #[ignore = "the memory twin does not twin InboxStore: the core's unit tests use it for the relay and the claim worker only"]
    inbox::console_reads_the_inbox,
    stream::only_committed_transactions_are_read_in_commit_order,
    stream::a_reopened_stream_resumes_after_the_confirmed_position,
    stream::rows_written_while_no_stream_is_open_are_read_later,
    stream::status_updates_are_not_events,
    stream::a_second_reader_is_transient,
    stream::a_lost_log_position_is_a_definite_error,
    stream::a_checkpoint_from_another_server_is_refused_until_recover,
    stream::own_rows_are_written_read_back_and_deleted,
);
