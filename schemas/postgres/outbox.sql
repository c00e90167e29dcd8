-- outboxd: the outbox table for PostgreSQL (12 or later).
--
-- By hand:   psql -v outbox_table=outbox -f schemas/postgres/outbox.sql
-- `outboxd init` runs this same file with the configured names (psql meta-commands,
-- the lines starting with a backslash, are skipped; :"name" is replaced by the quoted
-- identifier). Every statement is idempotent.
--
-- payload is jsonb by default. For binary payloads (Avro, Protobuf) declare it `bytea`
-- instead: outboxd publishes the bytes as stored either way.
\if :{?outbox_table} \else \set outbox_table outbox \endif
\if :{?outbox_retry_index} \else \set outbox_retry_index outbox_retry_due_idx \endif
\if :{?outbox_key_retry_index} \else \set outbox_key_retry_index outbox_key_retry_idx \endif

CREATE TABLE IF NOT EXISTS :"outbox_table" (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id       text        NOT NULL UNIQUE,
    message_type     text        NOT NULL,
    biz_key          text        NOT NULL,
    topic            text,                    -- NULL: use the configured topic template
    payload          jsonb       NOT NULL,    -- or bytea
    headers          jsonb,                   -- a JSON object: extra Kafka record headers
    status           text        NOT NULL DEFAULT 'INIT'
                     CHECK (status IN ('INIT', 'PROCESSING', 'SUCCESS', 'FAILED', 'MANUAL_REQUIRED')),
    retry_count      integer     NOT NULL DEFAULT 0,
    max_retry_count  integer     NOT NULL DEFAULT 10,
    next_retry_time  timestamptz,             -- NULL until the row first fails
    claimed_at       timestamptz,
    claim_token      uuid,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    sent_at          timestamptz,
    kafka_partition  integer,
    kafka_offset     bigint,
    -- The second deduplication key: one event of a type per business key.
    UNIQUE (message_type, biz_key)
) WITH (fillfactor = 80);  -- room on each page, so the SUCCESS write-back stays a HOT update

-- Serves the retry claim (`status = 'FAILED' AND next_retry_time <= now() ORDER BY id`).
-- The predicate names next_retry_time, not status, on purpose: an index that references a
-- column the SUCCESS write-back changes (status, sent_at, ...) would make every write-back
-- a non-HOT update.
CREATE INDEX IF NOT EXISTS :"outbox_retry_index"
    ON :"outbox_table" (next_retry_time, id) WHERE next_retry_time IS NOT NULL;

-- Every row in FAILED, PROCESSING or MANUAL_REQUIRED has next_retry_time set (outboxd
-- keeps it so; set it too when you change a status by hand), so both partial indexes hold
-- exactly the rows in trouble, however many SUCCESS rows the table keeps.
--
-- Serves strict per-key ordering: "is an earlier event of this biz_key FAILED, PROCESSING
-- or MANUAL_REQUIRED?" (`biz_key = ? AND id < ? AND next_retry_time IS NOT NULL`).
CREATE INDEX IF NOT EXISTS :"outbox_key_retry_index"
    ON :"outbox_table" (biz_key, id) WHERE next_retry_time IS NOT NULL;
