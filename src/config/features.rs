//! Which halves a process runs, read from the sections its file has: `[outbox]` (or its
//! sink, `[kafka]` or `[http]`) turns the outbox relay on, `[inbox]` the inbox. `[source]` names the
//! database both use. An inbox-only process is `[source]` and `[inbox]`, nothing else.
//!
//! Files written before the features had their own sections keep working: `source.mode`
//! is read as `outbox.mode`, and `outbox.relay = false` turns the relay off, each with a
//! warning naming the new form (`outboxd check` prints it, `run` logs it).

use outboxd_connector::Features;

use super::{Config, ConfigError, ConfigWarning};

/// `pipeline.name` of a process without the outbox relay, unless the file names one.
const INBOX_ONLY_NAME: &str = "inbox";

impl Config {
    /// Whether this process relays the outbox.
    pub fn relays_outbox(&self) -> bool {
        self.outbox.relay
    }

    /// The tables `init`, `schema` and `check` create and look at. The relay's process
    /// gets the inbox table too, as it always has: the grants script and the `--inbox`
    /// operator commands of an outbox process expect it.
    pub fn features(&self) -> Features {
        Features {
            outbox: self.relays_outbox(),
            inbox: self.inbox.is_some() || self.relays_outbox(),
        }
    }

    /// The layout handed to the engine: the outbox's tables, and the features in use.
    pub fn layout(&self) -> outboxd_connector::OutboxLayout {
        outboxd_connector::OutboxLayout {
            features: self.features(),
            ..self.outbox.layout()
        }
    }

    /// Decides the features from the sections `raw` (the file as a plain table) has, moves
    /// the keys read at their old places to their new ones, and notes each old key.
    pub(super) fn apply_features(&mut self, raw: &toml::Table) -> Result<(), ConfigError> {
        let has = |section: &str| raw.contains_key(section);
        let key_in = |section: &str, key: &str| {
            raw.get(section)
                .and_then(|s| s.as_table())
                .is_some_and(|s| s.contains_key(key))
        };

        // The relay runs when the file configures it, unless the old switch turns it off.
        let relay_off = key_in("outbox", "relay") && !self.outbox.relay;
        if key_in("outbox", "relay") {
            self.warnings.push(ConfigWarning {
                message: "outbox.relay is deprecated".into(),
                fix: "an inbox-only process leaves out [outbox] and [kafka] (and outbox.relay); \
                      an outbox relay leaves out outbox.relay"
                    .into(),
            });
        }
        self.outbox.relay = (has("outbox") || has("kafka") || has("http")) && !relay_off;
        if !self.outbox.relay && self.inbox.is_none() {
            return Err(ConfigError::Invalid(
                "nothing to run: add [outbox] and a sink ([kafka] or [http]) to relay the outbox \
                 table, or [inbox] to receive messages (or both)"
                    .into(),
            ));
        }

        // `outbox.mode`, formerly `source.mode`.
        if key_in("source", "mode") {
            match self.outbox.mode {
                Some(mode) if mode != self.source.mode => {
                    return Err(ConfigError::Invalid(
                        "outbox.mode and source.mode disagree: keep outbox.mode only".into(),
                    ))
                }
                _ => self.warnings.push(ConfigWarning {
                    message: "source.mode is deprecated".into(),
                    fix: "move it to [outbox] as `mode` (it says how the relay finds rows)".into(),
                }),
            }
        }
        if let Some(mode) = self.outbox.mode {
            self.source.mode = mode;
        }

        // `inbox.table` names the inbox table; `outbox.inbox_table` still does for an
        // outbox process's `--inbox` commands.
        if let Some(table) = self.inbox.as_ref().and_then(|i| i.table.clone()) {
            if key_in("outbox", "inbox_table") && self.outbox.inbox_table != table {
                return Err(ConfigError::Invalid(format!(
                    "inbox.table `{table}` and outbox.inbox_table `{}` disagree: keep \
                     inbox.table only",
                    self.outbox.inbox_table
                )));
            }
            self.outbox.inbox_table = table;
        }

        if self.outbox.relay {
            if !has("pipeline") {
                return Err(ConfigError::Invalid(
                    "the outbox relay needs [pipeline] with a `name` (it names the checkpoint, \
                     the slot and the publication)"
                        .into(),
                ));
            }
            match (has("kafka"), has("http")) {
                (false, false) => {
                    return Err(ConfigError::Invalid(
                        "the outbox relay needs a sink, where it sends the rows: [kafka] with \
                         `bootstrap_servers`, or [http] with an endpoint"
                            .into(),
                    ))
                }
                (true, true) => {
                    return Err(ConfigError::Invalid(
                        "[kafka] and [http] are both set: the outbox relay sends to one sink \
                         (an inbox beside an HTTP relay names its brokers in \
                         inbox.kafka.bootstrap_servers)"
                            .into(),
                    ))
                }
                _ => {}
            }
        } else if self.pipeline.name.is_empty() {
            self.pipeline.name = INBOX_ONLY_NAME.into();
        }
        if self.outbox.relay && self.pipeline.name.is_empty() {
            return Err(ConfigError::Invalid(
                "pipeline.name is missing: the outbox relay needs it".into(),
            ));
        }
        Ok(())
    }

    /// Whether the relay's sink is Kafka (the relay runs without `[http]`).
    pub fn sends_to_kafka(&self) -> bool {
        self.relays_outbox() && self.http.is_none()
    }

    /// How long the sink may take to decide one record: `kafka.message_timeout`, or
    /// `http.timeout` with the HTTP sink. A claimed row's delivery waits this long.
    pub fn sink_timeout(&self) -> std::time::Duration {
        match &self.http {
            Some(http) => http.timeout,
            None => self.kafka.message_timeout,
        }
    }

    /// The brokers of the inbox's Kafka ingress: its own, or `[kafka]`'s.
    pub fn inbox_bootstrap_servers(&self) -> Option<&str> {
        let ingress = self.inbox.as_ref()?.kafka.as_ref()?;
        let servers =
            (ingress.bootstrap_servers.as_deref()).unwrap_or(self.kafka.bootstrap_servers.as_str());
        (!servers.trim().is_empty()).then_some(servers)
    }
}
