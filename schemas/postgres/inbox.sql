-- outboxd: the inbox table for PostgreSQL (12 or later).
--
-- By hand:   psql -v inbox_table=inbox -f schemas/postgres/inbox.sql
-- Messages from Kafka or HTTP land here, deduplicated by (source, message_id) and by
-- (message_type, biz_key), and move PENDING -> PROCESSING -> DONE / FAILED / MANUAL_REQUIRED.
\if :{?inbox_table} \else \set inbox_table inbox \endif
\if :{?inbox_claim_index} \else \set inbox_claim_index inbox_claim_idx \endif
\if :{?inbox_key_index} \else \set inbox_key_index inbox_key_idx \endif

CREATE TABLE IF NOT EXISTS :"inbox_table" (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source           text        NOT NULL,    -- e.g. `kafka:orders` or `http`
    message_id       text        NOT NULL,
    message_type     text        NOT NULL,
    biz_key          text        NOT NULL,
    payload          jsonb       NOT NULL,    -- or bytea
    headers          jsonb,
    status           text        NOT NULL DEFAULT 'PENDING'
                     CHECK (status IN ('PENDING', 'PROCESSING', 'DONE', 'FAILED', 'MANUAL_REQUIRED')),
    retry_count      integer     NOT NULL DEFAULT 0,
    max_retry_count  integer     NOT NULL DEFAULT 10,
    next_retry_time  timestamptz,
    claimed_at       timestamptz,
    claim_token      uuid,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    processed_at     timestamptz,
    UNIQUE (source, message_id),
    UNIQUE (message_type, biz_key)
) WITH (fillfactor = 80);

-- Serves the worker claim of PENDING rows and of FAILED rows that are due.
CREATE INDEX IF NOT EXISTS :"inbox_claim_index"
    ON :"inbox_table" (COALESCE(next_retry_time, created_at), id)
    WHERE status IN ('PENDING', 'FAILED');

-- Serves per-key order: a row is claimed only when no earlier row of its biz_key is open.
CREATE INDEX IF NOT EXISTS :"inbox_key_index"
    ON :"inbox_table" (biz_key, id)
    WHERE status <> 'DONE';
