-- outboxd: the inbox table for MySQL 8 and MariaDB (10.6 or later).
--
-- By hand:   mysql app < schemas/mysql/inbox.sql
-- Messages from Kafka or HTTP land here, deduplicated by (source, message_id) and by
-- (message_type, biz_key), and move PENDING -> PROCESSING -> DONE / FAILED / MANUAL_REQUIRED.
-- `outboxd init` renders the backquoted names as for outbox.sql (`inbox`, `inbox_*`).
CREATE TABLE IF NOT EXISTS `inbox` (
    id               BIGINT        NOT NULL AUTO_INCREMENT,
    source           VARCHAR(255)  NOT NULL,       -- e.g. `kafka:orders` or `http`
    message_id       VARCHAR(255)  NOT NULL,
    message_type     VARCHAR(255)  NOT NULL,
    biz_key          VARCHAR(255)  NOT NULL,
    payload          JSON          NOT NULL,       -- or LONGBLOB
    headers          JSON          NULL,
    status           VARCHAR(16)   NOT NULL DEFAULT 'PENDING',
    retry_count      INT           NOT NULL DEFAULT 0,
    max_retry_count  INT           NOT NULL DEFAULT 10,
    next_retry_time  TIMESTAMP(6)  NULL DEFAULT NULL,
    claimed_at       TIMESTAMP(6)  NULL DEFAULT NULL,
    claim_token      CHAR(36)      NULL,
    last_error       TEXT          NULL,
    created_at       TIMESTAMP(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at       TIMESTAMP(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    processed_at     TIMESTAMP(6)  NULL DEFAULT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY `inbox_source_message_key` (source, message_id),
    UNIQUE KEY `inbox_type_key_key` (message_type, biz_key),
    -- MySQL has no partial index and DONE rows stay until the janitor removes them, so
    -- status leads: the claim finds PENDING rows and due FAILED rows in order (and the
    -- reaper PROCESSING rows, the janitor DONE ones) without reading the others.
    KEY `inbox_due_idx` (status, next_retry_time, id),
    -- Serves per-key order: a row is claimed only when no earlier row of its biz_key is
    -- open, one probe per open status, however many DONE rows the key has.
    KEY `inbox_key_idx` (biz_key, status, id),
    -- (`outboxd init` adds both to an inbox table of an earlier release, whose
    -- `inbox_claim_idx` (next_retry_time, id) is no longer used and may be dropped.)
    CONSTRAINT `inbox_status_check`
        CHECK (status IN ('PENDING', 'PROCESSING', 'DONE', 'FAILED', 'MANUAL_REQUIRED'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
