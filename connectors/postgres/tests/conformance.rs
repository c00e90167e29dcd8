//! The connector contract's scenarios (`outboxd_conformance`) against a real PostgreSQL:
//! each scenario gets its own schema, publication and slot (`support_store::Fixture`),
//! and this harness reads and sets rows with plain SQL through tokio-postgres. The
//! connector runs as README's "Privileges" says (`Fixture::least_privilege`): `init` as
//! the admin role, everything else as the runtime role with `schemas/postgres/grants.sql`.

mod support_store;

use outboxd_conformance::{Harness, NewRow, RowState, Setup, Table};
use outboxd_connector::{ConnectorError, Position, ReadMode};
use outboxd_postgres::PostgresConnector;
use outboxd_postgres::{parse_position, Lsn};
use support_store::Fixture;

struct Pg(Fixture);

/// `'text'` as an SQL literal.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// `now() + seconds`.
fn from_now(seconds: i64) -> String {
    format!("now() + interval '1 second' * {seconds}")
}

impl Pg {
    async fn insert_in(&self, rows: &[NewRow], end: &str) -> Vec<i64> {
        let client = &self.0.client;
        client.batch_execute("BEGIN").await.expect("begin");
        let sql = format!(
            "INSERT INTO {} (message_id, message_type, biz_key, payload, headers, max_retry_count) \
             VALUES ('m-' || gen_random_uuid(), $1, $2, '{{\"k\": 1}}', \
             '{{\"trace\": \"abc\", \"n\": 7}}', $3) RETURNING id",
            self.0.outbox()
        );
        let mut ids = Vec::new();
        for row in rows {
            let inserted = client
                .query_one(&sql, &[&row.message_type, &row.key, &row.max_retry_count])
                .await
                .expect("insert");
            ids.push(inserted.get(0));
        }
        client.batch_execute(end).await.expect("end transaction");
        ids
    }
}

impl Harness for Pg {
    type Connector = PostgresConnector;
    const UTC_OFFSET: &'static str = "+00";
    const STORED_HEADERS: &'static [(&'static str, &'static str)] = &[("n", "7"), ("trace", "abc")];
    type Lock = tokio_postgres::Client;

    async fn create(prefix: &str) -> Self {
        Pg(Fixture::least_privilege(prefix).await)
    }

    async fn init(&self, mode: ReadMode) -> Result<Vec<String>, ConnectorError> {
        self.0.init(mode).await
    }

    fn connector(&self) -> &PostgresConnector {
        &self.0.connector
    }

    async fn insert(&self, rows: &[NewRow]) -> Vec<i64> {
        self.insert_in(rows, "COMMIT").await
    }

    async fn insert_rolled_back(&self, rows: &[NewRow]) {
        self.insert_in(rows, "ROLLBACK").await;
    }

    async fn row(&self, id: i64) -> RowState {
        let sql = format!(
            "SELECT status, retry_count, extract(epoch FROM next_retry_time - now())::float8, \
             claim_token::text, claimed_at IS NOT NULL, last_error, sent_at IS NOT NULL, \
             kafka_partition, kafka_offset FROM {} WHERE id = $1",
            self.0.outbox()
        );
        let r = self
            .0
            .client
            .query_one(&sql, &[&id])
            .await
            .expect("read row");
        RowState {
            status: r.get(0),
            retry_count: r.get(1),
            next_retry_in: r.get(2),
            claim_token: r.get(3),
            claimed: r.get(4),
            last_error: r.get(5),
            sent: r.get(6),
            partition: r.get(7),
            offset: r.get(8),
        }
    }

    async fn set(&self, ids: &[i64], setup: &Setup) {
        let set = setup.assignments(literal, from_now);
        let sql = format!(
            "UPDATE {} SET {} WHERE id = ANY($1)",
            self.0.outbox(),
            set.join(", ")
        );
        self.0
            .client
            .execute(&sql, &[&ids])
            .await
            .expect("set columns");
    }

    async fn lock_row(&self, id: i64) -> tokio_postgres::Client {
        let other = self.0.env.client().await;
        other
            .batch_execute(&format!(
                "BEGIN; SELECT 1 FROM {} WHERE id = {id} FOR UPDATE",
                self.0.outbox()
            ))
            .await
            .expect("lock");
        other
    }

    async fn unlock(&self, lock: tokio_postgres::Client) {
        lock.batch_execute("ROLLBACK").await.expect("rollback");
    }

    fn positions(&self) -> [Position; 4] {
        // As text, "lsn:10/0" sorts before "lsn:9/…": the checkpoint compares LSNs.
        [
            "lsn:0/16B3748",
            "lsn:9/FFFFFEFF",
            "lsn:9/FFFFFF00",
            "lsn:10/0",
        ]
        .map(|p| parse_position(p).expect("position"))
    }

    async fn confirmed_position(&self) -> Option<Position> {
        let row = self
            .0
            .client
            .query_opt(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.0.slot],
            )
            .await
            .expect("slot");
        let lsn: Option<String> = row.and_then(|r| r.get(0));
        lsn.map(|l| l.parse::<Lsn>().expect("lsn").position())
    }

    async fn lose_log_position(&self) {
        self.0
            .client
            .execute("SELECT pg_drop_replication_slot($1)", &[&self.0.slot])
            .await
            .expect("drop slot");
    }

    async fn carry_checkpoint_from_another_server(&self) {
        // As a row copied from another cluster reads here: another system identifier,
        // an LSN past this cluster's WAL (added here: pg_lsn + int needs 14).
        let row = self
            .0
            .client
            .query_one(
                "SELECT pg_current_wal_lsn()::text, (system_identifier + 1)::text \
                 FROM pg_control_system()",
                &[],
            )
            .await
            .expect("the current LSN");
        let current: String = row.get(0);
        let system: String = row.get(1);
        let ahead = Lsn(current.parse::<Lsn>().expect("lsn").0 + 1_000_000_000);
        let position = format!("lsn:{ahead};system={system};timeline=1");
        let sql = format!(
            "INSERT INTO \"{}\".outboxd_checkpoint AS t (pipeline, position, updated_at) \
             VALUES ($1, $2, now()) \
             ON CONFLICT (pipeline) DO UPDATE SET position = EXCLUDED.position",
            self.0.schema
        );
        self.0
            .client
            .execute(&sql, &[&self.0.connector.pipeline(), &position])
            .await
            .expect("copy a checkpoint from another cluster");
    }

    async fn inbox_row(&self, id: i64) -> RowState {
        let sql = format!(
            "SELECT status, retry_count, extract(epoch FROM next_retry_time - now())::float8, \
             claim_token::text, claimed_at IS NOT NULL, last_error, processed_at IS NOT NULL \
             FROM \"{}\".inbox WHERE id = $1",
            self.0.schema
        );
        let r = (self.0.client.query_one(&sql, &[&id]).await).expect("read inbox row");
        RowState {
            status: r.get(0),
            retry_count: r.get(1),
            next_retry_in: r.get(2),
            claim_token: r.get(3),
            claimed: r.get(4),
            last_error: r.get(5),
            sent: r.get(6),
            partition: None,
            offset: None,
        }
    }

    async fn set_inbox(&self, ids: &[i64], setup: &Setup) {
        let set = setup.assignments(literal, from_now);
        let sql = format!(
            "UPDATE \"{}\".inbox SET {} WHERE id = ANY($1)",
            self.0.schema,
            set.join(", ")
        );
        (self.0.client.execute(&sql, &[&ids]).await).expect("set inbox columns");
    }

    async fn set_processed_ago(&self, ids: &[i64], seconds: i64) {
        let sql = format!(
            "UPDATE \"{}\".inbox SET processed_at = {} WHERE id = ANY($1)",
            self.0.schema,
            from_now(-seconds)
        );
        (self.0.client.execute(&sql, &[&ids]).await).expect("set processed_at");
    }

    async fn effects_table(&self) -> String {
        let table = format!("\"{}\".effects", self.0.schema);
        let run = self.0.run_role.as_deref().expect("a runtime role");
        // The application's table: the SQL handler's statement runs as the runtime role,
        // which needs INSERT and, for the bigserial column, USAGE on its sequence.
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {table} (n bigserial, v text); \
             GRANT INSERT ON {table} TO \"{run}\"; \
             GRANT USAGE ON SEQUENCE \"{}\".effects_n_seq TO \"{run}\"",
            self.0.schema
        );
        (self.0.client.batch_execute(&create).await).expect("create the effects table");
        table
    }

    async fn effects(&self) -> Vec<String> {
        let sql = format!("SELECT v FROM \"{}\".effects ORDER BY n", self.0.schema);
        let rows = (self.0.client.query(&sql, &[]).await).expect("effects");
        rows.iter().map(|r| r.get(0)).collect()
    }

    async fn hide_table(&self, table: Table, away: bool) {
        let name = match table {
            Table::Outbox => "outbox",
            Table::Checkpoint => "outboxd_checkpoint",
        };
        let (from, to) = if away {
            (name.to_owned(), format!("{name}_away"))
        } else {
            (format!("{name}_away"), name.to_owned())
        };
        self.0
            .client
            .batch_execute(&format!(
                "ALTER TABLE \"{}\".{from} RENAME TO {to}",
                self.0.schema
            ))
            .await
            .expect("rename table");
    }

    async fn archive_table(&self) -> String {
        let run = self.0.run_role.as_deref().expect("a runtime role");
        let create = format!(
            "CREATE TABLE IF NOT EXISTS \"{schema}\".outbox_archive (LIKE \"{schema}\".outbox); \
             GRANT INSERT ON \"{schema}\".outbox_archive TO \"{run}\"",
            schema = self.0.schema
        );
        (self.0.client.batch_execute(&create).await).expect("create the archive table");
        format!("{}.outbox_archive", self.0.schema)
    }

    async fn grant_insert_on_outbox(&self) {
        let run = self.0.run_role.as_deref().expect("a runtime role");
        let grant = format!("GRANT INSERT ON \"{}\".outbox TO \"{run}\"", self.0.schema);
        (self.0.client.batch_execute(&grant).await).expect("grant INSERT on the outbox");
    }

    async fn grant_create_table(&self) {
        let run = self.0.run_role.as_deref().expect("a runtime role");
        let grant = format!("GRANT CREATE ON SCHEMA \"{}\" TO \"{run}\"", self.0.schema);
        (self.0.client.batch_execute(&grant).await).expect("grant CREATE on the schema");
    }

    async fn archived_ids(&self) -> Vec<i64> {
        let sql = format!(
            "SELECT id FROM \"{}\".outbox_archive ORDER BY id",
            self.0.schema
        );
        let rows = self.0.client.query(&sql, &[]).await.expect("archive");
        rows.iter().map(|r| r.get(0)).collect()
    }

    async fn cleanup(self) {
        // The fixture drops its schema, publication and slot.
        drop(self.0);
    }
}

outboxd_conformance::conformance_tests!(Pg;
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
    admin::status_summary_counts_rows_and_reads_the_checkpoint,
    admin::retry_makes_rows_due_again,
    admin::park_and_resolve_record_the_operator_reason,
    admin::console_reads_pages_rows_and_held_keys,
    admin::janitor_deletes_or_archives_old_success_rows,
    admin::scan_init_pages_through_init_rows_in_id_order,
    inbox::insert_stores_each_message_once_by_either_key,
    inbox::claim_takes_one_message_per_key_in_arrival_order,
    inbox::concurrent_claimers_never_share_a_key,
    inbox::the_sql_handler_takes_effect_only_with_done,
    inbox::failures_back_off_and_end_in_manual_required,
    inbox::reaper_and_schedule_cover_the_inbox,
    inbox::operator_actions_cover_the_inbox,
    inbox::console_reads_the_inbox,
    inbox::verify_reads_back_its_messages_and_counts_effects,
    stream::only_committed_transactions_are_read_in_commit_order,
    stream::a_reopened_stream_resumes_after_the_confirmed_position,
    stream::rows_written_while_no_stream_is_open_are_read_later,
    stream::status_updates_are_not_events,
    stream::a_second_reader_is_transient,
    stream::a_lost_log_position_is_a_definite_error,
    stream::a_checkpoint_from_another_server_is_refused_until_recover,
    stream::own_rows_are_written_read_back_and_deleted,
);
