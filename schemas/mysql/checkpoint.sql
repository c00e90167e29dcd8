-- outboxd: the checkpoint table for MySQL 8 and MariaDB.
--
-- By hand:   mysql app < schemas/mysql/checkpoint.sql
-- One row per pipeline: the binlog position up to which every outbox event is in Kafka and
-- its status written back, `binlog:<file>:<offset>` with `:<gtid set>` appended when GTIDs
-- are on. Written in the same transaction as that write-back (and, while only other
-- tables change, every few seconds by the stream). On MySQL/MariaDB this row is the
-- authority: outboxd resumes from it. It never moves backward.
CREATE TABLE IF NOT EXISTS `outboxd_checkpoint` (
    pipeline    VARCHAR(64)   NOT NULL,
    position    TEXT          NOT NULL,
    updated_at  TIMESTAMP(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (pipeline)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
