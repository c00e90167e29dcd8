//! What every engine's inbox store shares: the status literals, how a message's payload
//! and headers are stored and read back, and the SQL handler's named placeholders.

use outboxd_connector::{headers_from_json, ClaimedMessage, ConnectorError, InboxMessage};

/// Stored, not handled yet.
pub const PENDING: &str = "PENDING";
/// Claimed by a worker (`claimed_at`, `claim_token`).
pub const PROCESSING: &str = "PROCESSING";
/// Handled.
pub const DONE: &str = "DONE";
/// A handler attempt failed; due again at `next_retry_time`.
pub const FAILED: &str = crate::status::FAILED;
/// Out of attempts, or cannot succeed by retrying: waits for an operator.
pub const MANUAL_REQUIRED: &str = crate::status::MANUAL_REQUIRED;

/// The statuses of a row that is not finished: a later message of its `biz_key` waits.
pub const OPEN: [&str; 4] = [PENDING, PROCESSING, FAILED, MANUAL_REQUIRED];

/// The `headers` column's value: a JSON object of the message's headers.
pub fn headers_json(message: &InboxMessage) -> String {
    headers_object(&message.headers)
}

/// Headers as a JSON object of strings.
fn headers_object(headers: &[(String, String)]) -> String {
    let object: serde_json::Map<String, serde_json::Value> = (headers.iter())
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    serde_json::Value::Object(object).to_string()
}

/// A stored `headers` value read back; text that is not a JSON object reads as none.
pub fn headers_from_column(json: Option<&str>) -> Vec<(String, String)> {
    let Some(entries) = json.and_then(headers_from_json) else {
        return Vec::new();
    };
    (entries.into_iter())
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect()
}

/// The payload as stored in a JSON column. A rejected message's body need not be JSON
/// (that may be why it was rejected): it is kept as a JSON string of its text, so the
/// operator still sees what arrived.
pub fn json_payload(message: &InboxMessage) -> String {
    let text = String::from_utf8_lossy(&message.payload);
    if message.rejected.is_some() && serde_json::from_str::<serde::de::IgnoredAny>(&text).is_err() {
        return serde_json::Value::String(text.into_owned()).to_string();
    }
    text.into_owned()
}

/// A field of a claimed message that the SQL handler's statement can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageField {
    /// `:id`
    Id,
    /// `:source`
    Source,
    /// `:message_id`
    MessageId,
    /// `:message_type`
    MessageType,
    /// `:biz_key`
    BizKey,
    /// `:payload`
    Payload,
    /// `:headers`
    Headers,
}

impl MessageField {
    const ALL: [(&'static str, MessageField); 7] = [
        ("id", MessageField::Id),
        ("source", MessageField::Source),
        ("message_id", MessageField::MessageId),
        ("message_type", MessageField::MessageType),
        ("biz_key", MessageField::BizKey),
        ("payload", MessageField::Payload),
        ("headers", MessageField::Headers),
    ];

    /// The field's value as text, the one type every engine binds the same way.
    pub fn text(self, message: &ClaimedMessage) -> String {
        match self {
            MessageField::Id => message.id.to_string(),
            MessageField::Source => message.source.clone(),
            MessageField::MessageId => message.message_id.clone(),
            MessageField::MessageType => message.message_type.clone(),
            MessageField::BizKey => message.biz_key.clone(),
            MessageField::Payload => String::from_utf8_lossy(&message.payload).into_owned(),
            MessageField::Headers => headers_object(&message.headers),
        }
    }
}

/// The SQL handler's statement with its `:name` placeholders replaced by the engine's
/// positional ones (`placeholder(1)` → `$1` or `?`), and the field of each position.
///
/// Text in single quotes, double quotes or backquotes is left alone, and so is `::`
/// (PostgreSQL's cast), so `:payload::jsonb` binds the payload and casts it. An unknown
/// name is a definite error that lists the known ones.
pub fn bind_named(
    statement: &str,
    placeholder: impl Fn(usize) -> String,
) -> Result<(String, Vec<MessageField>), ConnectorError> {
    let mut sql = String::with_capacity(statement.len());
    let mut fields = Vec::new();
    let mut chars = statement.char_indices().peekable();
    let mut quote: Option<char> = None;
    while let Some((at, c)) = chars.next() {
        if let Some(q) = quote {
            sql.push(c);
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' | '`' => {
                quote = Some(c);
                sql.push(c);
            }
            ':' if chars.peek().map(|(_, n)| *n) == Some(':') => {
                sql.push_str("::");
                chars.next();
            }
            ':' if chars
                .peek()
                .is_some_and(|(_, n)| n.is_ascii_alphabetic() || *n == '_') =>
            {
                let start = at + 1;
                let mut end = start;
                while let Some((i, n)) = chars.peek().copied() {
                    if n.is_ascii_alphanumeric() || n == '_' {
                        end = i + n.len_utf8();
                        chars.next();
                    } else {
                        break;
                    }
                }
                let name = &statement[start..end];
                let Some((_, field)) = MessageField::ALL.iter().find(|(n, _)| *n == name) else {
                    let known: Vec<String> = MessageField::ALL
                        .iter()
                        .map(|(n, _)| format!(":{n}"))
                        .collect();
                    return Err(ConnectorError::definite(format!(
                        "the inbox SQL handler's statement names `:{name}`, which is not a field \
                         of a message; use {}",
                        known.join(", ")
                    )));
                };
                fields.push(*field);
                sql.push_str(&placeholder(fields.len()));
            }
            _ => sql.push(c),
        }
    }
    Ok((sql, fields))
}

/// The `WHERE` of the statements on `outboxd verify --inbox`'s own messages: `source` and
/// message ids as literals (`FALSE` for none).
fn own_messages_where(
    source: &str,
    message_ids: &[String],
    literal: impl Fn(&str) -> String,
) -> String {
    if message_ids.is_empty() {
        return "FALSE".into();
    }
    let ids = crate::store::in_literals("message_id", message_ids, &literal);
    format!("source = {} AND {ids}", literal(source))
}

/// The `SELECT` of [`InboxStore::own_messages`](outboxd_connector::InboxStore::own_messages)
/// on `table` (quoted): message id, status, retry count.
pub fn own_messages_select(
    table: &str,
    source: &str,
    message_ids: &[String],
    literal: impl Fn(&str) -> String,
) -> String {
    format!(
        "SELECT message_id, status, retry_count FROM {table} WHERE {}",
        own_messages_where(source, message_ids, literal)
    )
}

/// The `DELETE` of [`InboxStore::delete_own_messages`](outboxd_connector::InboxStore::delete_own_messages).
pub fn own_messages_delete(
    table: &str,
    source: &str,
    message_ids: &[String],
    literal: impl Fn(&str) -> String,
) -> String {
    format!(
        "DELETE FROM {table} WHERE {}",
        own_messages_where(source, message_ids, literal)
    )
}

/// The SQL handler statement that records an effect in scratch table `table` (quoted).
pub fn scratch_insert(table: &str) -> String {
    format!("INSERT INTO {table} (message_id, biz_key) VALUES (:message_id, :biz_key)")
}

/// Reads scratch table `table` (quoted): `(message_id, biz_key)` in the handler's order.
pub fn scratch_select(table: &str) -> String {
    format!("SELECT message_id, biz_key FROM {table} ORDER BY n")
}

/// Drops scratch table `table` (quoted), if it is there.
pub fn scratch_drop(table: &str) -> String {
    format!("DROP TABLE IF EXISTS {table}")
}

/// Refuses a scratch table name that is not a plain lowercase identifier (it is spliced
/// into DDL, quoted, but still: verify makes it, and nothing else should reach here).
pub fn check_scratch_name(name: &str) -> Result<(), ConnectorError> {
    let plain = !name.is_empty()
        && name.len() <= 60
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    match plain {
        true => Ok(()),
        false => Err(ConnectorError::definite(format!(
            "scratch table name {name:?} is not a plain lowercase identifier"
        ))),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn own_message_statements_name_the_source_and_the_ids() {
        let literal = |v: &str| format!("'{v}'");
        let ids = ["a".to_owned(), "b".to_owned()];
        assert_eq!(
            super::own_messages_select("inbox", "verify", &ids, literal),
            "SELECT message_id, status, retry_count FROM inbox WHERE source = 'verify' AND \
             message_id IN ('a', 'b')"
        );
        assert_eq!(
            super::own_messages_delete("inbox", "verify", &[], literal),
            "DELETE FROM inbox WHERE FALSE"
        );
        assert!(super::check_scratch_name("outboxd_verify_0a1b").is_ok());
        assert!(super::check_scratch_name("x; DROP TABLE inbox").is_err());
        assert!(super::check_scratch_name("Upper").is_err());
    }
    use super::*;

    #[test]
    fn named_placeholders_become_positional_outside_quotes_and_casts() {
        let (sql, fields) = bind_named(
            "INSERT INTO t(k, p, s) VALUES (:biz_key, :payload::jsonb, ':id')",
            |n| format!("${n}"),
        )
        .unwrap();
        assert_eq!(sql, "INSERT INTO t(k, p, s) VALUES ($1, $2::jsonb, ':id')");
        assert_eq!(fields, [MessageField::BizKey, MessageField::Payload]);

        let (sql, fields) = bind_named("CALL f(:id, :id)", |_| "?".into()).unwrap();
        assert_eq!(sql, "CALL f(?, ?)");
        assert_eq!(fields, [MessageField::Id, MessageField::Id]);
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_known_ones() {
        let e = bind_named("SELECT :nope", |_| "?".into()).unwrap_err();
        assert!(!e.is_transient());
        assert!(e.message().contains(":nope"), "{e}");
        assert!(e.message().contains(":biz_key"), "{e}");
    }

    #[test]
    fn a_rejected_body_that_is_not_json_is_kept_as_a_json_string() {
        let mut m = InboxMessage {
            source: "s".into(),
            message_id: String::new(),
            message_type: "t".into(),
            biz_key: "k".into(),
            payload: b"not json".to_vec(),
            headers: vec![("a".into(), "1".into())],
            rejected: Some("no message id".into()),
        };
        assert_eq!(json_payload(&m), "\"not json\"");
        m.payload = br#"{"a":1}"#.to_vec();
        assert_eq!(json_payload(&m), r#"{"a":1}"#);
        assert_eq!(headers_json(&m), r#"{"a":"1"}"#);
        assert_eq!(
            headers_from_column(Some(r#"{"a":"1","b":2}"#)),
            [("a".to_owned(), "1".to_owned()), ("b".into(), "2".into())]
        );
        assert!(headers_from_column(Some("[1]")).is_empty());
    }
}
