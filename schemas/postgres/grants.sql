-- outboxd: what the runtime role needs on the tables `outboxd init` made, for PostgreSQL.
--
-- By hand, as the tables' owner (the role that ran `init`) or a superuser:
--   psql -v run_role=outboxd_run -v outbox_table=outbox -v inbox_table=inbox \
--        -v checkpoint_table=outboxd_checkpoint -f schemas/postgres/grants.sql
-- The runtime role runs `run`, `check`, `recover` and the operator commands. It also
-- needs LOGIN REPLICATION (reading the slot; `recover` drops and creates it), pg_monitor
-- (seeing other sessions: the synchronous-standby wait and check's WAL sender count) and
-- USAGE on the tables' schema; see README, "Privileges". Every statement is idempotent.
-- The names are taken as one identifier each; for a table in another schema write the
-- GRANT by hand (and GRANT USAGE ON SCHEMA <schema> TO outboxd_run).
\if :{?run_role} \else \set run_role outboxd_run \endif
\if :{?outbox_table} \else \set outbox_table outbox \endif
\if :{?inbox_table} \else \set inbox_table inbox \endif
\if :{?checkpoint_table} \else \set checkpoint_table outboxd_checkpoint \endif

-- Events read by id (re-reads after a reconnect, retries, poll mode, recover, status),
-- statuses written back; DELETE only for `outboxd janitor`.
GRANT SELECT, UPDATE, DELETE ON :"outbox_table" TO :"run_role";
-- Received messages stored (INSERT), claimed, written back; DELETE only for the janitor.
GRANT SELECT, INSERT, UPDATE, DELETE ON :"inbox_table" TO :"run_role";
-- The pipeline's position: read at start, written with each write-back.
GRANT SELECT, INSERT, UPDATE ON :"checkpoint_table" TO :"run_role";
