//! The engine registry: the one file of the core that names database engines.
//!
//! Everything else is generic over the engine's connector, a [`ConfiguredConnector`] (the
//! contract in `outboxd-connector`): the relay, the claim worker and the CLI never learn
//! which database they talk to. Adding an engine is its crate under `connectors/` (a
//! connector type implementing `Connector` and `ConfiguredConnector`, passing the
//! conformance suite) plus one line in the `engines!` list below; the line gives its
//! `source.kind`, and its `[source]` keys are its `ConfiguredConnector::Config`.

use std::future::Future;

use outboxd_connector::{ConfiguredConnector, ConnectorError, OutboxLayout};
use serde::Deserialize;

/// Work that runs with whichever engine the configuration names: the registry builds the
/// connector and hands it over, so the work is written once, generic over the engine.
pub(crate) trait WithEngine {
    /// What the work returns.
    type Output;

    /// Runs the work with `connector`.
    fn run<C: ConfiguredConnector>(self, connector: C) -> impl Future<Output = Self::Output>;
}

/// Declares the engines: the `[source]` enum tagged by `kind`, and the dispatch from it.
macro_rules! engines {
    ($( $(#[$doc:meta])* $kind:literal => $variant:ident($connector:ty), )+) => {
        /// `[source]`, selected by `kind`: the chosen engine's own keys.
        #[derive(Clone, Debug, Deserialize)]
        #[serde(tag = "kind")]
        pub enum SourceConfig {
            $( $(#[$doc])* #[serde(rename = $kind)] $variant(<$connector as ConfiguredConnector>::Config), )+
        }

        impl SourceConfig {
            /// The `source.kind` of this configuration.
            pub fn kind(&self) -> &'static str {
                match self {
                    $( Self::$variant(_) => $kind, )+
                }
            }

            /// Fills the engine's secrets from the environment or their files.
            pub(crate) fn resolve_secrets(
                &mut self,
                var: &dyn Fn(&str) -> Option<String>,
            ) -> Result<(), outboxd_connector::SecretError> {
                match self {
                    $( Self::$variant(config) => <$connector as ConfiguredConnector>::resolve_secrets(config, var), )+
                }
            }

            /// Checks the ranges of the engine's keys.
            pub(crate) fn validate(&self) -> Result<(), String> {
                match self {
                    $( Self::$variant(config) => <$connector as ConfiguredConnector>::validate(config), )+
                }
            }

            /// Builds the engine's connector for `pipeline` and runs `work` with it.
            pub(crate) async fn with_connector<W: WithEngine>(
                &self,
                pipeline: &str,
                layout: OutboxLayout,
                work: W,
            ) -> Result<W::Output, ConnectorError> {
                match self {
                    $( Self::$variant(config) => {
                        let connector =
                            <$connector as ConfiguredConnector>::from_config(config.clone(), pipeline, layout)?;
                        Ok(work.run(connector).await)
                    } )+
                }
            }
        }
    };
}

engines! {
    /// PostgreSQL logical replication (pgoutput).
    "postgres" => Postgres(outboxd_postgres::PostgresConnector),
    /// MySQL 8 or MariaDB binlog (ROW events), read as a replica.
    "mysql" => Mysql(outboxd_mysql::MysqlConnector),
}
