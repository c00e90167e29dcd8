-- outboxd: what the runtime user needs on the tables `outboxd init` made, for MySQL 8
-- and MariaDB.
--
-- By hand, as a user that may grant them (an administrator):
--   mysql app < schemas/mysql/grants.sql
-- with the user, database and table names edited below. The runtime user runs `run`,
-- `check`, `recover` and the operator commands. It also needs REPLICATION SLAVE and
-- REPLICATION CLIENT (MariaDB 10.5+: BINLOG MONITOR) ON *.*; see README, "Privileges".
-- Table-level grants are also what lets the user see these tables in information_schema.
-- The inbox's SQL handler runs its statement as this user too: grant it what the
-- statement touches on your own tables (README, "Privileges"); nothing here does that.
-- An inbox-only process (no [outbox], no [kafka]) has only the inbox table and needs only
-- its line, and no replication privilege.

-- Events read by id, statuses written back; DELETE only for `outboxd janitor`.
GRANT SELECT, UPDATE, DELETE ON `outbox` TO 'outboxd_run'@'%';
-- With [canary] (or for `outboxd verify`) only: its rows are inserted into the outbox like
-- the application's.
-- GRANT INSERT ON `outbox` TO 'outboxd_run'@'%';
-- Received messages stored (INSERT), claimed, written back; DELETE only for the janitor.
GRANT SELECT, INSERT, UPDATE, DELETE ON `inbox` TO 'outboxd_run'@'%';
-- The pipeline's position: read at start, written with each write-back.
GRANT SELECT, INSERT, UPDATE ON `outboxd_checkpoint` TO 'outboxd_run'@'%';
