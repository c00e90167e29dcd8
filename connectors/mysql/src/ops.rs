//! Claims, reaper and operator actions on the MySQL outbox (to follow the PostgreSQL
//! implementation).

use std::collections::HashSet;
use std::time::Duration;

use outboxd_connector::{
    ClaimRequest, ClaimedEvent, ClaimedWriteBack, ConnectorError, JanitorAction, OutboxAdmin,
    OutboxEvent, ReapPolicy, ReapReport, RetrySchedule, RetrySelector, StatusSummary,
};

use crate::store::MysqlOutboxStore;

fn unsupported(what: &str) -> ConnectorError {
    ConnectorError::definite(format!("{what} is not supported on MySQL yet"))
}

impl MysqlOutboxStore {
    pub(crate) async fn claim_rows(
        &self,
        _request: ClaimRequest,
    ) -> Result<Vec<ClaimedEvent>, ConnectorError> {
        Err(unsupported("claiming rows"))
    }

    pub(crate) async fn complete_claimed_rows(
        &self,
        _batch: ClaimedWriteBack<'_>,
    ) -> Result<u64, ConnectorError> {
        Err(unsupported("writing back claimed rows"))
    }

    pub(crate) async fn reap_rows(
        &self,
        _policy: ReapPolicy,
    ) -> Result<ReapReport, ConnectorError> {
        Err(unsupported("reaping"))
    }

    pub(crate) async fn schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        Err(unsupported("the retry schedule"))
    }

    pub(crate) async fn blocked(
        &self,
        _keys: Option<&[String]>,
    ) -> Result<HashSet<String>, ConnectorError> {
        Ok(HashSet::new())
    }
}

impl OutboxAdmin for MysqlOutboxStore {
    async fn status_summary(&self) -> Result<StatusSummary, ConnectorError> {
        Err(unsupported("status"))
    }

    async fn retry_rows(&self, _selector: &RetrySelector) -> Result<u64, ConnectorError> {
        Err(unsupported("retry"))
    }

    async fn park_row(&self, _id: i64, _reason: &str) -> Result<bool, ConnectorError> {
        Err(unsupported("park"))
    }

    async fn resolve_row(&self, _id: i64, _reason: &str) -> Result<bool, ConnectorError> {
        Err(unsupported("resolve"))
    }

    async fn janitor_batch(
        &self,
        _retention: Duration,
        _action: &JanitorAction,
        _batch: usize,
    ) -> Result<u64, ConnectorError> {
        Err(unsupported("janitor"))
    }

    async fn scan_init(
        &self,
        _after_id: i64,
        _limit: usize,
    ) -> Result<Vec<OutboxEvent>, ConnectorError> {
        Err(unsupported("recover"))
    }
}
