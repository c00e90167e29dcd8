//! Row images: the outbox columns checked against a table map, one inserted row read
//! from a write rows event and converted to an [`OutboxEvent`], and the column type
//! classes that match `information_schema` against the binlog.

use std::fmt;

use bytes::Bytes;
use mysql_async::binlog::events::{OptionalMetaExtractor, TableMapEvent};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;
use mysql_async::Value;
use mysql_common::io::ParseBuf;
use outboxd_connector::{ConnectorError, ErrorReason, OutboxEvent, OutboxLayout};
use outboxd_connector_kit::row::{self, RowSource, Value as Cell};
use outboxd_connector_kit::{ColumnMap, Field};

use crate::time::{fraction, iso8601_utc};

/// The class of a binlog column type, comparable with [`info_class`].
pub(super) fn binlog_class(t: ColumnType) -> Option<&'static str> {
    use ColumnType::*;
    Some(match t {
        MYSQL_TYPE_TINY => "tinyint",
        MYSQL_TYPE_SHORT => "smallint",
        MYSQL_TYPE_INT24 => "mediumint",
        MYSQL_TYPE_LONG => "int",
        MYSQL_TYPE_LONGLONG => "bigint",
        MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING => "varchar",
        MYSQL_TYPE_STRING => "char",
        MYSQL_TYPE_BLOB | MYSQL_TYPE_TINY_BLOB | MYSQL_TYPE_MEDIUM_BLOB | MYSQL_TYPE_LONG_BLOB => {
            "blob"
        }
        MYSQL_TYPE_JSON => "json",
        MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 => "timestamp",
        MYSQL_TYPE_DATETIME | MYSQL_TYPE_DATETIME2 => "datetime",
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => "date",
        MYSQL_TYPE_TIME | MYSQL_TYPE_TIME2 => "time",
        MYSQL_TYPE_DECIMAL | MYSQL_TYPE_NEWDECIMAL => "decimal",
        MYSQL_TYPE_FLOAT => "float",
        MYSQL_TYPE_DOUBLE => "double",
        MYSQL_TYPE_YEAR => "year",
        MYSQL_TYPE_BIT => "bit",
        MYSQL_TYPE_ENUM => "enum",
        MYSQL_TYPE_SET => "set",
        MYSQL_TYPE_GEOMETRY => "geometry",
        _ => return None,
    })
}

/// The class of an `information_schema.COLUMNS.DATA_TYPE`; `None` when unknown.
pub(super) fn info_class(data_type: &str) -> Option<&'static str> {
    Some(match data_type.to_ascii_lowercase().as_str() {
        "tinyint" => "tinyint",
        "smallint" => "smallint",
        "mediumint" => "mediumint",
        "int" | "integer" => "int",
        "bigint" => "bigint",
        "varchar" | "varbinary" => "varchar",
        "char" | "binary" => "char",
        "tinytext" | "text" | "mediumtext" | "longtext" | "tinyblob" | "blob" | "mediumblob"
        | "longblob" => "blob",
        "json" => "json",
        "timestamp" => "timestamp",
        "datetime" => "datetime",
        "date" => "date",
        "time" => "time",
        "decimal" | "numeric" => "decimal",
        "float" => "float",
        "double" | "real" => "double",
        "year" => "year",
        "bit" => "bit",
        "enum" => "enum",
        "set" => "set",
        "geometry" | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring"
        | "multipolygon" | "geometrycollection" => "geometry",
        _ => return None,
    })
}

/// Where each outbox column is (the kit's [`ColumnMap`]), checked against the binlog's
/// table map.
#[derive(Clone, Debug)]
pub(super) struct OutboxColumns {
    pub(super) count: usize,
    pub(super) map: ColumnMap,
}

impl OutboxColumns {
    pub(super) fn new(
        names: &[String],
        shape: &[u8],
        table: &str,
        layout: &OutboxLayout,
    ) -> Result<Self, ConnectorError> {
        let map = ColumnMap::resolve(
            |name| names.iter().position(|c| c.eq_ignore_ascii_case(name)),
            layout,
            table,
            "schemas/mysql/outbox.sql",
        )?;
        use ColumnType::*;
        let ints: &[ColumnType] = &[
            MYSQL_TYPE_TINY,
            MYSQL_TYPE_SHORT,
            MYSQL_TYPE_INT24,
            MYSQL_TYPE_LONG,
            MYSQL_TYPE_LONGLONG,
        ];
        let strings: &[ColumnType] = &[
            MYSQL_TYPE_VARCHAR,
            MYSQL_TYPE_VAR_STRING,
            MYSQL_TYPE_STRING,
            MYSQL_TYPE_BLOB,
            MYSQL_TYPE_TINY_BLOB,
            MYSQL_TYPE_MEDIUM_BLOB,
            MYSQL_TYPE_LONG_BLOB,
            MYSQL_TYPE_JSON,
            MYSQL_TYPE_ENUM,
        ];
        let times: &[ColumnType] = &[
            MYSQL_TYPE_TIMESTAMP2,
            MYSQL_TYPE_TIMESTAMP,
            MYSQL_TYPE_DATETIME2,
            MYSQL_TYPE_DATETIME,
        ];
        let expected = [
            (Field::Id, ints, "an integer"),
            (Field::MessageId, strings, "a string"),
            (Field::MessageType, strings, "a string"),
            (Field::BizKey, strings, "a string"),
            (Field::Payload, strings, "JSON, a string or a blob"),
            (Field::CreatedAt, times, "a TIMESTAMP or DATETIME"),
            (Field::Status, strings, "a string"),
            (Field::RetryCount, ints, "an integer"),
            (Field::MaxRetryCount, ints, "an integer"),
        ];
        for (field, kinds, what) in expected {
            let Some(column) = map.get(field) else {
                // Not read under this layout (ColumnMap::resolve requires what is).
                continue;
            };
            let fits = Some(column).is_some_and(|i| {
                shape
                    .get(i)
                    .is_some_and(|t| kinds.iter().any(|k| *k as u8 == *t))
            });
            if !fits {
                return Err(ConnectorError::definite(format!(
                    "outbox table `{table}`: column `{}` is not {what} in the binlog's \
                     table map (were the column names read for another version of the table? \
                     set binlog_row_metadata = FULL)",
                    field.label()
                ))
                .with_reason(ErrorReason::SchemaMismatch));
            }
        }
        Ok(Self {
            count: shape.len(),
            map,
        })
    }
}

/// One inserted row, addressed by table column, as the kit's row conversion reads it.
pub(super) struct RowView<'a> {
    /// The row's values by table column; `None` for a column outside the row image.
    pub(super) values: &'a [Option<BinlogValue<'a>>],
    pub(super) table: &'a str,
    pub(super) columns: &'a OutboxColumns,
}

impl RowView<'_> {
    fn unexpected(&self, name: &str, value: &dyn fmt::Debug) -> ConnectorError {
        ConnectorError::definite(format!(
            "outbox `{}`: column `{name}` has an unexpected value {value:?}",
            self.table
        ))
    }
}

impl RowSource for RowView<'_> {
    /// Strings and blobs as stored, JSON as JSON text, integers as integers; `created_at`
    /// as ISO 8601 (TIMESTAMP in UTC, `+00:00`; DATETIME without offset).
    fn value(&self, field: Field) -> Result<Cell, ConnectorError> {
        let Some(column) = self.columns.map.get(field) else {
            return Ok(Cell::Null);
        };
        let name = field.label();
        let value = self
            .values
            .get(column)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                ConnectorError::definite(format!(
                    "outbox `{}`: the binlog row lacks column `{name}`: set binlog_row_image = FULL",
                    self.table
                ))
            })?;
        let time = field == Field::CreatedAt;
        let iso = |text: String| Ok(Cell::Bytes(Bytes::from(text)));
        match value {
            BinlogValue::Value(Value::NULL) => Ok(Cell::Null),
            BinlogValue::Value(Value::Date(y, mo, d, h, mi, s, us)) if time => iso(format!(
                "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{}",
                fraction(*us)
            )),
            BinlogValue::Value(Value::Int(secs)) if time => iso(iso8601_utc(*secs, 0)),
            BinlogValue::Value(Value::Bytes(b)) if time => {
                // TIMESTAMP2: `seconds[.micros]` since the epoch.
                let text = std::str::from_utf8(b).unwrap_or_default();
                let (secs, micros) = text.split_once('.').unwrap_or((text, "0"));
                match (secs.parse::<i64>(), micros.parse::<u32>()) {
                    (Ok(secs), Ok(micros)) => iso(iso8601_utc(secs, micros)),
                    _ => Err(ConnectorError::definite(format!(
                        "outbox `{}`: column `{name}` = `{text}` is not a timestamp",
                        self.table
                    ))),
                }
            }
            other if time => Err(self.unexpected(name, other)),
            BinlogValue::Value(Value::Bytes(b)) => Ok(Cell::Bytes(Bytes::copy_from_slice(b))),
            BinlogValue::Value(Value::Int(i)) => Ok(Cell::Int(*i)),
            BinlogValue::Value(Value::UInt(u)) => i64::try_from(*u).map(Cell::Int).map_err(|_| {
                ConnectorError::definite(format!(
                    "outbox `{}`: column `{name}` is out of range",
                    self.table
                ))
            }),
            BinlogValue::Jsonb(json) => {
                let json = serde_json::Value::try_from(json.clone()).map_err(|e| {
                    ConnectorError::definite(format!(
                        "outbox `{}`: column `{name}` holds JSON that cannot be rendered",
                        self.table
                    ))
                    .with_source(e)
                })?;
                Ok(Cell::Bytes(Bytes::from(json.to_string())))
            }
            other => Err(self.unexpected(name, other)),
        }
    }
}

/// Each column's type and whether it is unsigned (a numeric column, per the table map's
/// optional metadata; signed when the server does not say), in table order.
pub(super) fn column_kinds(tme: &TableMapEvent<'_>) -> std::io::Result<Vec<(ColumnType, bool)>> {
    let meta = OptionalMetaExtractor::new(tme.iter_optional_meta())?;
    let mut unsigned = meta.iter_signedness();
    let count = usize::try_from(tme.columns_count()).unwrap_or(usize::MAX);
    let mut kinds = Vec::with_capacity(count.min(4096));
    for i in 0..count {
        let kind = match tme.get_column_type(i) {
            Ok(Some(kind)) => kind,
            Ok(None) => return Err(invalid("a column without a type in the table map")),
            Err(e) => return Err(invalid(&e.to_string())),
        };
        let is_unsigned = kind.is_numeric_type() && unsigned.next().unwrap_or(false);
        kinds.push((kind, is_unsigned));
    }
    Ok(kinds)
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

/// Reads one row image of a write rows event from `rows` into `values`, by table column
/// (`None` for a column outside the image).
///
/// Written here rather than taken from `mysql_common`'s `BinlogRow`, which builds a
/// `Column` (schema, table and name strings, flags, a shared slice made unique) for every
/// column of every row: half of the binlog task's CPU in a drain (docs/benchmarks.md). The
/// values are parsed by `mysql_common`'s own value parser, borrowed from the event, in
/// the layout `BinlogRow` reads (a null bitmap over the image's columns, then the
/// values): only the per-row metadata is left out. A write rows event carries no shared
/// (partial JSON) image.
pub(super) fn read_row_image<'d>(
    rows: &mut ParseBuf<'d>,
    tme: &'d TableMapEvent<'static>,
    kinds: &[(ColumnType, bool)],
    present: &[bool],
    values: &mut Vec<Option<BinlogValue<'d>>>,
) -> std::io::Result<()> {
    values.clear();
    let in_image = present.iter().filter(|p| **p).count();
    let bitmap: &[u8] = rows.parse(in_image.div_ceil(8))?;
    let mut image_column = 0;
    for (i, &(kind, is_unsigned)) in kinds.iter().enumerate() {
        if !present.get(i).copied().unwrap_or(false) {
            values.push(None);
            continue;
        }
        let null = bitmap
            .get(image_column / 8)
            .is_none_or(|byte| byte & (1 << (image_column % 8)) != 0);
        image_column += 1;
        if null {
            values.push(Some(BinlogValue::Value(Value::NULL)));
            continue;
        }
        let meta = tme.get_column_metadata(i).unwrap_or(&[]);
        values.push(Some(rows.parse::<BinlogValue<'d>>((
            kind,
            meta,
            is_unsigned,
            false,
        ))?));
    }
    Ok(())
}

/// One inserted outbox row as an event; `None` when its status is not INIT.
pub(super) fn to_event(row: &RowView<'_>) -> Result<Option<OutboxEvent>, ConnectorError> {
    row::event_from_insert(row, &row.columns.map, row.table)
}
