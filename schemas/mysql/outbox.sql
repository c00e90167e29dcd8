-- outboxd: the outbox table for MySQL 8 and MariaDB (10.6 or later).
--
-- By hand:   mysql app < schemas/mysql/outbox.sql
-- `outboxd init` runs this same file with the configured names: the backquoted name
-- `outbox` becomes the configured table (`db`.`table` when qualified) and every backquoted
-- name starting with `outbox_` (indexes, constraints) takes the configured table name as
-- its stem. Comment lines are skipped. Every statement is idempotent.
--
-- payload is JSON by default. On MySQL 8 JSON is stored in binary form and outboxd
-- publishes it re-rendered as compact JSON text (keys in MySQL's order); on MariaDB JSON is
-- LONGTEXT and is published as written. For binary payloads (Avro, Protobuf) declare
-- payload `LONGBLOB` instead: outboxd publishes the bytes as stored.
--
-- Times are TIMESTAMP(6): instants, stored in UTC and published with a `+00:00` offset.
-- outboxd's own sessions use time_zone '+00:00'.
CREATE TABLE IF NOT EXISTS `outbox` (
    id               BIGINT        NOT NULL AUTO_INCREMENT,
    message_id       VARCHAR(255)  NOT NULL,
    message_type     VARCHAR(255)  NOT NULL,
    biz_key          VARCHAR(255)  NOT NULL,
    topic            VARCHAR(249)  NULL,           -- NULL: use the configured topic template
    payload          JSON          NOT NULL,       -- or LONGBLOB
    headers          JSON          NULL,           -- a JSON object: extra Kafka record headers
    status           VARCHAR(16)   NOT NULL DEFAULT 'INIT',
    retry_count      INT           NOT NULL DEFAULT 0,
    max_retry_count  INT           NOT NULL DEFAULT 10,
    next_retry_time  TIMESTAMP(6)  NULL DEFAULT NULL,   -- NULL until the row first fails
    claimed_at       TIMESTAMP(6)  NULL DEFAULT NULL,
    claim_token      CHAR(36)      NULL,
    last_error       TEXT          NULL,
    created_at       TIMESTAMP(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at       TIMESTAMP(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    sent_at          TIMESTAMP(6)  NULL DEFAULT NULL,
    kafka_partition  INT           NULL,
    kafka_offset     BIGINT        NULL,
    PRIMARY KEY (id),
    UNIQUE KEY `outbox_message_id_key` (message_id),
    -- The second deduplication key: one event of a type per business key.
    UNIQUE KEY `outbox_type_key_key` (message_type, biz_key),
    -- Serves the retry claim (`status = 'FAILED' AND next_retry_time <= now() ORDER BY id`),
    -- the reaper and the retry schedule: next_retry_time is set exactly on the rows in
    -- FAILED, PROCESSING or MANUAL_REQUIRED, and NULL again once a row is SUCCESS.
    KEY `outbox_retry_due_idx` (next_retry_time, id),
    -- Strict ordering: the earlier events of a key that are in trouble.
    KEY `outbox_key_retry_idx` (biz_key, next_retry_time, id),
    CONSTRAINT `outbox_status_check`
        CHECK (status IN ('INIT', 'PROCESSING', 'SUCCESS', 'FAILED', 'MANUAL_REQUIRED'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
