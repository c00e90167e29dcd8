//! The contract between the outboxd core and a database connector.
//!
//! A connector is three things for one database engine:
//!
//! - a [`ChangeStream`]: the log tail, yielding **committed** transactions that inserted
//!   outbox rows, each with the log [`Position`] of its commit;
//! - an [`OutboxStore`]: the SQL side — status write-back and the checkpoint row;
//! - an [`InboxStore`]: the receiving half — messages stored before they are
//!   acknowledged, deduplicated, claimed and completed by the core's inbox workers;
//! - the operator's actions on either table, one [`TableAdmin`] each;
//! - administration (`init`, `check`), reported with [`CheckReport`];
//!
//! tied together by a [`Connector`], which the core opens and reopens.
//!
//! The core never names an engine and a connector never names Kafka: everything that
//! crosses this boundary is defined here.

mod admin;
mod check;
mod claim;
mod connector;
mod error;
mod event;
mod headers;
mod inbox;
mod last_error;
mod layout;
mod position;
pub mod secret;
mod store;
mod stream;

pub use admin::{
    HeldKey, JanitorAction, JanitorRule, RetrySelector, RowDetail, RowQuery, RowSummary,
    StatusCount, StatusSummary, TableAdmin, TableKind,
};
pub use check::{CheckLine, CheckReport, CheckStatus};
pub use claim::{
    ClaimRequest, ClaimScope, ClaimToken, ClaimedEvent, ClaimedWriteBack, ParkedEvent, ReapPolicy,
    ReapReport, RetrySchedule,
};
pub use connector::{ConfiguredConnector, Connector, ReadMode, ENV_SOURCE_PASSWORD};
pub use error::{ConnectorError, ErrorKind, ErrorReason};
pub use event::OutboxEvent;
pub use headers::headers_from_json;
pub use inbox::{
    ClaimedMessage, Completed, InboxMessage, InboxOutcome, InboxStore, Ingested, OwnMessageState,
};
pub use last_error::{
    last_error_text, parked_behind_key, parked_by_operator, resolved_by_operator,
    resolved_without_handling, short_duration, LAST_ERROR_MAX_CHARS,
};
pub use layout::{ColumnNames, Features, OutboxLayout, RowLifecycle, DEBEZIUM_ROW_ID};
pub use position::{ParsePositionError, Position};
pub use secret::{Secret, SecretError};
pub use store::{
    Delivered, DeliveryFailure, NewOutboxRow, OutboxStore, OwnRowState, OwnRowsToDelete, RowId,
    TransactionEnd, WriteBack,
};
pub use stream::{
    ChangeItem, ChangeStream, CommittedTransaction, TransactionPart, PART_BYTES, PART_EVENTS,
};
