-- outboxd: the checkpoint table for PostgreSQL.
--
-- By hand:   psql -v checkpoint_table=outboxd_checkpoint -f schemas/postgres/checkpoint.sql
-- One row per pipeline: the log position up to which every outbox event is in Kafka and
-- its status written back. Written in the same transaction as that write-back. On
-- PostgreSQL the replication slot's confirmed_flush_lsn follows it; the row is what
-- `outboxd status` and `outboxd recover` read.
\if :{?checkpoint_table} \else \set checkpoint_table outboxd_checkpoint \endif

CREATE TABLE IF NOT EXISTS :"checkpoint_table" (
    pipeline    text        PRIMARY KEY,
    position    text        NOT NULL,     -- `lsn:16/B374D848`
    updated_at  timestamptz NOT NULL DEFAULT now()
);
