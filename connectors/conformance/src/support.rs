//! Small helpers the scenarios share.

use std::time::{Duration, Instant};

use outboxd_connector::{
    ClaimRequest, ClaimScope, ClaimedEvent, Connector, ConnectorError, ReadMode, TableAdmin,
    TableKind,
};

use bytes::Bytes;

use crate::Harness;

/// A harness whose outbox is initialised for `mode`.
pub(crate) async fn initialised<H: Harness>(prefix: &str, mode: ReadMode) -> H {
    let h = H::create(prefix).await;
    h.init(mode).await.expect("init");
    h
}

/// The store of `h`.
pub(crate) async fn store<H: Harness>(h: &H) -> <H::Connector as Connector>::Store {
    h.connector().open_store().await.expect("open store")
}

/// The table `store`'s operator actions say they change.
pub(crate) fn table_of<S: TableAdmin>(_store: &S) -> TableKind {
    S::TABLE
}

/// `store`'s janitor refuses `rule`, the other table's, as a definite error.
pub(crate) async fn refuses_rule<S: TableAdmin>(store: &S, rule: &outboxd_connector::JanitorRule) {
    match store.janitor_batch(rule, 100).await {
        Ok(n) => panic!("the other table's janitor rule removed {n} rows"),
        Err(e) => assert!(!e.is_transient(), "{e}"),
    }
}

pub(crate) fn due_failed(limit: usize, strict_order: bool) -> ClaimRequest {
    ClaimRequest {
        scope: ClaimScope::DueFailed,
        limit,
        strict_order,
    }
}

pub(crate) fn poll(limit: usize, strict_order: bool) -> ClaimRequest {
    ClaimRequest {
        scope: ClaimScope::NewAndDueFailed,
        limit,
        strict_order,
    }
}

pub(crate) fn ids_of(claimed: &[ClaimedEvent]) -> Vec<i64> {
    claimed.iter().map(|c| c.event.id).collect()
}

/// Retries `open` while it fails transiently (another session still holding the slot or
/// lock for a moment), up to 30 seconds.
pub(crate) async fn open_when_free<T, F, Fut>(mut open: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ConnectorError>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match open().await {
            Ok(opened) => return opened,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot open: {e}"),
        }
    }
}

/// The headers every inserted row has, as the engine stores them.
pub(crate) fn stored_headers<H: Harness>() -> Vec<(String, Bytes)> {
    H::STORED_HEADERS
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Bytes::from_static(v.as_bytes())))
        .collect()
}
