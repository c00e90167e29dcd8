//! The outbox table as the server finds it by its configured name: the one resolution
//! that `init`, `check` and the replication stream share.
//!
//! The configured name, quoted as every statement of this crate writes it
//! ([`crate::schema::qualified`]), is read as a `regclass`: an unqualified name is found
//! through the role's `search_path`, as the application's `INSERT INTO outbox` finds it,
//! and a quoted one keeps its case. The stream then knows the outbox in the log by the
//! OID found here, never by comparing names it spelled itself.

use std::fmt;

use outboxd_connector::ConnectorError;
use tokio_postgres::Client;

use crate::client::classify_pg_error;
use crate::schema::qualified;
use crate::store::get;

/// The outbox table the server resolved the configured name to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OutboxTable {
    /// `pg_class.oid`, the relation OID of pgoutput's Relation and Insert messages.
    pub(crate) oid: u32,
    pub(crate) schema: String,
    pub(crate) name: String,
}

impl OutboxTable {
    /// The table `configured` (an `outbox.table` value) names on this connection, `None`
    /// when there is none.
    pub(crate) async fn resolve(
        client: &Client,
        configured: &str,
    ) -> Result<Option<Self>, ConnectorError> {
        let row = client
            .query_opt(
                "SELECT c.oid, n.nspname::text, c.relname::text FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
                &[&qualified(configured)],
            )
            .await
            .map_err(|e| {
                classify_pg_error(&e, &format!("looking up the outbox table `{configured}`"))
            })?;
        match row {
            Some(row) => Ok(Some(Self {
                oid: get(&row, 0)?,
                schema: get(&row, 1)?,
                name: get(&row, 2)?,
            })),
            None => Ok(None),
        }
    }
}

/// `schema.name`, for messages.
impl fmt::Display for OutboxTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}
