-- outboxd: the index of poll mode (`source.mode = "poll"`), for PostgreSQL (12 or later).
--
-- By hand:   psql -v outbox_table=outbox -f schemas/postgres/outbox_poll.sql
-- `outboxd init` creates it only when the config says `source.mode = "poll"`.
--
-- Poll mode claims the oldest INIT rows (`WHERE status = 'INIT' ORDER BY id LIMIT n FOR
-- UPDATE SKIP LOCKED`). Without this index that claim walks the primary key past every
-- SUCCESS row still in the table.
--
-- The trade-off: the predicate names `status`, which every SUCCESS write-back changes, so
-- with this index that write-back is no longer a HOT update (a new index entry in every
-- index per event, more WAL and index bloat). Poll mode pays that anyway; log mode does
-- not need the index, so do not create it there (and drop it when moving from poll mode to
-- log mode: DROP INDEX outbox_poll_idx).
\if :{?outbox_table} \else \set outbox_table outbox \endif
\if :{?outbox_poll_index} \else \set outbox_poll_index outbox_poll_idx \endif

CREATE INDEX IF NOT EXISTS :"outbox_poll_index"
    ON :"outbox_table" (id) WHERE status = 'INIT';
