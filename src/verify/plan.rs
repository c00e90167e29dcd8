//! The synthetic events of one `verify` run: which key each goes to, which transaction
//! holds it, which transactions roll back, and how an event is recognised when it comes
//! back from the sink.
//!
//! Every event's message id is `outboxd-verify-<run>-<index>`: `<run>` is random per run
//! (so runs never mix, `--seed` or not), `<index>` counts events in the order they were
//! written. One
//! writer commits one transaction at a time, so the index order of a key's committed
//! events is their commit order: the order the sink must keep. The id is in the payload
//! too, so a record is recognised whatever envelope carries it.

use outboxd_connector::NewOutboxRow;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What to write, from the command line.
#[derive(Clone, Debug)]
pub(crate) struct PlanSettings {
    /// The events' `message_type` prefix (`<prefix>.<n>`, see [`Plan::next_transaction`]).
    pub(crate) message_type: String,
    /// The topic column: the Kafka topic, or with `[http]` the endpoint.
    pub(crate) topic: String,
    /// Distinct business keys.
    pub(crate) keys: u32,
    /// At most this many events per transaction (1 to this, at random).
    pub(crate) max_batch: u32,
    /// Of every 100 transactions, about this many are rolled back.
    pub(crate) rollback_percent: u32,
    /// Seeds the choices (keys, sizes, rollbacks), so a run can be repeated.
    pub(crate) seed: u64,
}

/// One event `verify` wrote (or tried to).
#[derive(Clone, Debug)]
pub(crate) struct PlannedEvent {
    /// Its position in write order, from 0.
    pub(crate) index: u64,
    /// Its business key's number.
    pub(crate) key: u32,
    /// Its message id (see the module doc).
    pub(crate) message_id: String,
    /// Its business key: the Kafka record key it must carry.
    pub(crate) biz_key: String,
}

/// The events of a run, transaction by transaction.
#[derive(Debug)]
pub(crate) struct Plan {
    settings: PlanSettings,
    run: String,
    rng: StdRng,
    next_index: u64,
    /// Per key, how many events were planned (the `<n>` of the message type).
    per_key: Vec<u32>,
}

/// The prefix of every message id of `run`.
pub(crate) fn id_prefix(run: &str) -> String {
    format!("outboxd-verify-{run}-")
}

/// The index of the first message id of `run` in `bytes` (a record's value, a request's
/// body or its `webhook-id`), if any: the prefix followed by at least one digit (the
/// run's business keys start with the prefix too, then `k`).
pub(crate) fn find_index(bytes: &[u8], prefix: &str) -> Option<u64> {
    let needle = prefix.as_bytes();
    let mut from = 0;
    while from + needle.len() <= bytes.len() {
        let at = from
            + bytes[from..]
                .windows(needle.len())
                .position(|window| window == needle)?;
        let start = at + needle.len();
        let digits = (bytes[start..].iter())
            .take_while(|b| b.is_ascii_digit())
            .count();
        let index = std::str::from_utf8(&bytes[start..start + digits])
            .ok()
            .and_then(|text| text.parse().ok());
        if index.is_some() {
            return index;
        }
        from = at + 1;
    }
    None
}

/// A run id: random whatever `--seed` says, so a repeated run never meets an earlier
/// run's rows, messages or scratch table.
pub(crate) fn new_run_id() -> String {
    format!("{:08x}", rand::thread_rng().gen::<u32>())
}

impl Plan {
    pub(crate) fn new(settings: PlanSettings, run: String) -> Self {
        let rng = StdRng::seed_from_u64(settings.seed);
        let keys = settings.keys.max(1) as usize;
        Self {
            settings,
            run,
            rng,
            next_index: 0,
            per_key: vec![0; keys],
        }
    }

    /// The next transaction: its rows, its events, and whether it is to be rolled back.
    /// Message types are `<prefix>.<n>`, `n` counting the key's events: outboxd's table
    /// keeps one event per type and key (`UNIQUE (message_type, biz_key)`).
    pub(crate) fn next_transaction(&mut self) -> (Vec<NewOutboxRow>, Vec<PlannedEvent>, bool) {
        let size = self.rng.gen_range(1..=self.settings.max_batch.max(1));
        let rollback = self.rng.gen_range(0..100) < self.settings.rollback_percent;
        let mut rows = Vec::with_capacity(size as usize);
        let mut events = Vec::with_capacity(size as usize);
        for _ in 0..size {
            let key = self.rng.gen_range(0..self.per_key.len());
            let n = self.per_key[key];
            self.per_key[key] += 1;
            let index = self.next_index;
            self.next_index += 1;
            let message_id = format!("{}{index}", id_prefix(&self.run));
            let biz_key = format!("outboxd-verify-{}-k{key}", self.run);
            rows.push(NewOutboxRow {
                headers: None,
                message_id: message_id.clone(),
                message_type: format!("{}.{n}", self.settings.message_type),
                payload: format!(
                    r#"{{"id":"{message_id}","key":"{biz_key}","n":{n},"verify":"outboxd verify run {}"}}"#,
                    self.run
                ),
                biz_key,
                topic: Some(self.settings.topic.clone()),
            });
            events.push(PlannedEvent {
                index,
                key: key as u32,
                message_id,
                biz_key: rows.last().map(|r| r.biz_key.clone()).unwrap_or_default(),
            });
        }
        (rows, events, rollback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PlanSettings {
        PlanSettings {
            message_type: "outboxd.verify".into(),
            topic: "verify".into(),
            keys: 3,
            max_batch: 4,
            rollback_percent: 20,
            seed: 7,
        }
    }

    #[test]
    fn events_are_numbered_in_write_order_and_typed_once_per_key() {
        let mut plan = Plan::new(settings(), new_run_id());
        let mut seen_types = std::collections::HashSet::new();
        let mut next = 0;
        let mut rollbacks = 0;
        for _ in 0..200 {
            let (rows, events, rollback) = plan.next_transaction();
            rollbacks += usize::from(rollback);
            assert!((1..=4).contains(&rows.len()));
            for (row, event) in rows.iter().zip(&events) {
                assert_eq!(event.index, next);
                next += 1;
                assert_eq!(row.message_id, event.message_id);
                assert!(row.payload.contains(&row.message_id));
                assert!(seen_types.insert((row.message_type.clone(), row.biz_key.clone())));
                serde_json::from_str::<serde_json::Value>(&row.payload).expect("JSON payload");
            }
        }
        assert!(
            (20..=60).contains(&rollbacks),
            "{rollbacks} of 200 rolled back"
        );
        // The same seed makes the same choices, under another run id.
        let mut first = Plan::new(settings(), "a".into());
        let mut again = Plan::new(settings(), "b".into());
        for _ in 0..20 {
            let (a, b) = (first.next_transaction(), again.next_transaction());
            let keys = |events: &[PlannedEvent]| events.iter().map(|e| e.key).collect::<Vec<_>>();
            assert_eq!((keys(&a.1), a.2), (keys(&b.1), b.2));
            assert_ne!(a.0[0].message_id, b.0[0].message_id);
        }
    }

    #[test]
    fn an_event_is_found_in_any_envelope() {
        let prefix = id_prefix("0badcafe");
        let envelope = br#"{"data":{"id":"outboxd-verify-0badcafe-1234","n":2}}"#;
        assert_eq!(find_index(envelope, &prefix), Some(1234));
        let escaped = br#"{"data":"{\"id\":\"outboxd-verify-0badcafe-7\"}"}"#;
        assert_eq!(find_index(escaped, &prefix), Some(7));
        assert_eq!(find_index(b"outboxd-verify-otherrun-7", &prefix), None);
        assert_eq!(find_index(b"outboxd-verify-0badcafe-", &prefix), None);
        let key_first = br#"{"key":"outboxd-verify-0badcafe-k3","id":"outboxd-verify-0badcafe-9"}"#;
        assert_eq!(
            find_index(key_first, &prefix),
            Some(9),
            "past the key to the id"
        );
        assert_eq!(find_index(b"", &prefix), None);
    }
}
