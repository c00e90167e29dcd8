-- outboxd: what the runtime role needs on the tables `outboxd init` made, for PostgreSQL.
--
-- By hand, as the tables' owner (the role that ran `init`) or a superuser:
--   psql -v run_role=outboxd_run -v schema=public -v outbox_table=outbox \
--        -v inbox_table=inbox -v checkpoint_table=outboxd_checkpoint \
--        -f schemas/postgres/grants.sql
-- The runtime role runs `run`, `check`, `recover` and the operator commands. It also
-- needs LOGIN REPLICATION (reading the slot; `recover` drops and creates it) and
-- pg_monitor (seeing other sessions: the synchronous-standby wait and check's WAL sender
-- count); see README, "Privileges". Every statement is idempotent. The three tables are
-- taken to be in one schema (`schema`, default public), each name as one identifier.
-- The inbox's SQL handler runs its statement as this role too: grant it what the
-- statement touches on your own tables (README, "Privileges"); nothing here does that.
\if :{?run_role} \else \set run_role outboxd_run \endif
\if :{?schema} \else \set schema public \endif
\if :{?outbox_table} \else \set outbox_table outbox \endif
\if :{?inbox_table} \else \set inbox_table inbox \endif
\if :{?checkpoint_table} \else \set checkpoint_table outboxd_checkpoint \endif

-- Names in the schema resolve only with USAGE (PUBLIC holds it on `public` by default).
GRANT USAGE ON SCHEMA :"schema" TO :"run_role";
-- An inbox-only process (no [outbox], no [kafka]) has only the inbox table: add
-- `-v inbox_only=1` to grant on it alone.
\if :{?inbox_only} \else
-- Events read by id (re-reads after a reconnect, retries, poll mode, recover, status),
-- statuses written back; DELETE only for `outboxd janitor`.
GRANT SELECT, UPDATE, DELETE ON :"schema".:"outbox_table" TO :"run_role";
\endif
-- With [canary] (or for `outboxd verify`), add `-v canary=1`: their rows are inserted
-- into the outbox like the application's (and deleted once delivered).
\if :{?canary}
GRANT INSERT ON :"schema".:"outbox_table" TO :"run_role";
\endif
-- Received messages stored (INSERT), claimed, written back; DELETE only for the janitor.
-- Its id is an identity column, whose sequence needs no grant.
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".:"inbox_table" TO :"run_role";
\if :{?inbox_only} \else
-- The pipeline's position: read at start, written with each write-back.
GRANT SELECT, INSERT, UPDATE ON :"schema".:"checkpoint_table" TO :"run_role";
\endif
