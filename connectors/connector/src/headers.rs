use std::fmt;

use bytes::Bytes;

/// The outbox row's `headers` column (a JSON object, as text) as Kafka record headers, in
/// the object's order: string values as their text, other values as JSON text. `None`
/// when the text is not a JSON object. Every connector builds
/// [`OutboxEvent::headers`](crate::OutboxEvent::headers) with it, so a row gets the same
/// headers from every engine and from the log and claim paths alike.
pub fn headers_from_json(json: &str) -> Option<Vec<(String, Bytes)>> {
    let Ordered(entries) = serde_json::from_str(json).ok()?;
    Some(
        entries
            .into_iter()
            .map(|(name, value)| {
                let bytes = match value {
                    serde_json::Value::String(s) => Bytes::from(s),
                    other => Bytes::from(other.to_string()),
                };
                (name, bytes)
            })
            .collect(),
    )
}

/// A JSON object's entries in document order (serde_json's map would sort them).
struct Ordered(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Ordered, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Ordered(entries))
            }
        }
        d.deserialize_map(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_become_headers_in_document_order() {
        let h = headers_from_json(r#"{"z": "1", "a": 2, "m": {"x": null}, "n": null}"#).unwrap();
        let names: Vec<&str> = h.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["z", "a", "m", "n"]);
        assert_eq!(h[0].1, Bytes::from("1"));
        assert_eq!(h[1].1, Bytes::from("2"));
        assert_eq!(h[2].1, Bytes::from(r#"{"x":null}"#));
        assert_eq!(h[3].1, Bytes::from("null"));
        assert!(headers_from_json("[1]").is_none());
        assert!(headers_from_json("not json").is_none());
        assert_eq!(headers_from_json("{}").unwrap(), vec![]);
    }
}
