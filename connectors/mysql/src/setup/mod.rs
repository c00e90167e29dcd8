//! `outboxd init` and `outboxd check` for MySQL and MariaDB.
//!
//! `init` creates the tables that are missing (and missing retry/claim indexes of existing
//! ones) and, when the pipeline has no checkpoint yet, records the server's current binlog
//! position as its checkpoint, so the first `run` starts there. It never alters a column or
//! moves an existing checkpoint.
//!
//! `check` says, one line per prerequisite, whether `run` will work and what to do if not.
//!
//! `init.rs`, `check.rs` and `recover.rs` hold one command each; the catalog look-ups and
//! query helpers they share live here.

mod add_columns;
mod check;
mod init;
mod recover;
mod schema_script;

pub(crate) use add_columns::add_columns;
pub(crate) use check::check;
pub(crate) use init::init;
pub(crate) use recover::reset_log_position;
pub(crate) use schema_script::schema_script;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use outboxd_connector::{CheckLine, CheckReport, ConnectorError, ReadMode};

use outboxd_connector_kit::check::{failed_query, outbox_columns_line, payload_type_line, push};
use outboxd_connector_kit::store::table_qualifiers;

use crate::client::{execute, int, query, query_first, text_or_empty};
use crate::log::identity::{ServerIdentity, StoredCheckpoint};
use crate::log::server::{self, ServerInfo};
use crate::log::stream::lock_holder;
use crate::schema::{
    self, outbox_poll_index, qualified, quote_ident, split_qualified, sql_string, table_ident,
};
use crate::store::{checkpoint_sql, load_checkpoint};
use crate::MysqlConnector;

const BINLOG_FIX: &str = "in the server's configuration ([mysqld] / [mariadbd]) set log_bin, \
    binlog_format = ROW, binlog_row_image = FULL and a server_id, then restart the server";

fn is_on(value: &str) -> bool {
    value.eq_ignore_ascii_case("ON") || value == "1"
}

async fn table_exists(
    conn: &mut Conn,
    c: &MysqlConnector,
    table: &str,
) -> Result<bool, ConnectorError> {
    let (db, name) = table_ident(table, &c.config().database);
    let sql = format!(
        "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {}",
        sql_string(&db),
        sql_string(&name)
    );
    Ok(
        query_first(conn, &sql, &format!("looking up table {table}"))
            .await?
            .is_some(),
    )
}

async fn index_exists(
    conn: &mut Conn,
    c: &MysqlConnector,
    table: &str,
    index: &str,
) -> Result<bool, ConnectorError> {
    let (db, name) = table_ident(table, &c.config().database);
    let sql = format!(
        "SELECT 1 FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {} \
         AND INDEX_NAME = {} LIMIT 1",
        sql_string(&db),
        sql_string(&name),
        sql_string(index)
    );
    Ok(
        query_first(conn, &sql, &format!("looking up index {index}"))
            .await?
            .is_some(),
    )
}
