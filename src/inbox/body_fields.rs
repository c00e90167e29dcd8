//! Reads a few named fields of a JSON body (the message type, the business key) without
//! building the document: one pass that validates the whole body and keeps only the
//! values asked for, so a request's memory stays its body's size plus those values, and
//! a 1 MiB body of tiny members costs no tree of a million nodes.
//!
//! A path is a list of member names from the top-level object down (`["data",
//! "order_id"]`). A field's value must be a string or a number (its decimal text);
//! anything else, or a path member given twice in one object (which other JSON readers
//! resolve differently: first or last), is an error, so that what outboxd reads is what
//! every reader of the payload reads.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

/// Why the fields could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BodyFieldsError {
    /// The body is not JSON (or not an object where a path goes through).
    #[error("the body is not a JSON object: {0}")]
    NotJson(String),
    /// A field holds something other than a string or a number, or is repeated.
    #[error("{0}")]
    BadField(String),
}

/// The values at `paths` in the JSON object `body`, in order; `None` where absent. Validates
/// the whole body.
pub(crate) fn read(body: &[u8], paths: &[&[&str]]) -> Result<Vec<Option<String>>, BodyFieldsError> {
    // serde_json checks UTF-8 only in the strings it keeps, not in those it skips: a body
    // with a stray byte in a skipped member would pass as JSON that is not.
    if let Err(e) = std::str::from_utf8(body) {
        return Err(BodyFieldsError::NotJson(format!("not UTF-8: {e}")));
    }
    let mut found = vec![None; paths.len()];
    let wanted: Vec<(usize, &[&str])> = paths.iter().copied().enumerate().collect();
    let mut de = serde_json::Deserializer::from_slice(body);
    let outcome = Object {
        wanted: &wanted,
        found: &mut found,
        at: 0,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match outcome {
        Ok(()) => Ok(found),
        Err(e) if e.is_data() && e.to_string().starts_with(FIELD_ERROR) => {
            Err(BodyFieldsError::BadField(field_message(&e)))
        }
        Err(e) => Err(BodyFieldsError::NotJson(e.to_string())),
    }
}

/// Prefix of the errors this module raises itself (to tell them from serde_json's).
const FIELD_ERROR: &str = "field ";

fn field_message(e: &serde_json::Error) -> String {
    // serde_json appends " at line L column C"; the field's own words are enough.
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(cut) => text[..cut].to_owned(),
        None => text,
    }
}

/// One object level: `wanted` are the paths (with their index in the answer) that pass
/// through this object, `at` the depth of their member name here.
struct Object<'w, 'f> {
    wanted: &'w [(usize, &'w [&'w str])],
    found: &'f mut [Option<String>],
    at: usize,
}

impl<'de> DeserializeSeed<'de> for Object<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Object<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen: Vec<bool> = vec![false; self.wanted.len()];
        while let Some(name) = map.next_key::<Key>()? {
            let name = name.0;
            let matching: Vec<usize> = (self.wanted.iter().enumerate())
                .filter(|(_, (_, path))| path.get(self.at).is_some_and(|p| *p == name))
                .map(|(i, _)| i)
                .collect();
            if matching.is_empty() {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            if matching.iter().any(|i| seen[*i]) {
                return Err(de::Error::custom(format!(
                    "{FIELD_ERROR}`{}` appears twice",
                    self.wanted[matching[0]].1[..=self.at].join(".")
                )));
            }
            for i in &matching {
                seen[*i] = true;
            }
            // A path that ends here takes the value; the others go one level down.
            let ends = matching
                .iter()
                .find(|i| self.wanted[**i].1.len() == self.at + 1);
            match ends {
                Some(i) => {
                    let (index, path) = self.wanted[*i];
                    let value = map.next_value_seed(Scalar { path })?;
                    self.found[index] = Some(value);
                }
                None => {
                    let deeper: Vec<(usize, &[&str])> =
                        matching.iter().map(|i| self.wanted[*i]).collect();
                    map.next_value_seed(Object {
                        wanted: &deeper,
                        found: &mut *self.found,
                        at: self.at + 1,
                    })?;
                }
            }
        }
        Ok(())
    }
}

/// A member name, owned (names are short; a borrowed one is not possible when escaped).
struct Key(String);

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Key)
    }
}

/// A field's value: a string, or a number's decimal text.
struct Scalar<'p> {
    path: &'p [&'p str],
}

impl<'de> DeserializeSeed<'de> for Scalar<'_> {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Scalar<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{FIELD_ERROR}`{}` to be a string or a number",
            self.path.join(".")
        )
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<String, E> {
        Err(self.wrong())
    }
    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Err(self.wrong())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        // Drained first so the error names the field rather than a syntax position.
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Err(self.wrong())
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<String, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Err(self.wrong())
    }
}

impl Scalar<'_> {
    fn wrong<E: de::Error>(&self) -> E {
        E::custom(format!(
            "{FIELD_ERROR}`{}` must be a string or a number",
            self.path.join(".")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPE: &[&str] = &["type"];
    const KEY: &[&str] = &["data", "order_id"];

    #[test]
    fn reads_top_level_and_nested_fields() {
        let body = br#"{"type": "order.paid", "pad": [1, {"x": null}], "data": {"order_id": 42, "more": "x"}}"#;
        assert_eq!(
            read(body, &[TYPE, KEY]),
            Ok(vec![Some("order.paid".into()), Some("42".into())])
        );
        assert_eq!(read(br#"{"a": 1}"#, &[TYPE, KEY]), Ok(vec![None, None]));
        assert_eq!(read(br#"{"data": {}}"#, &[KEY]), Ok(vec![None]));
        // Escapes in names and values are decoded.
        assert_eq!(
            read(br#"{"typ\u0065": "a\"b"}"#, &[TYPE]),
            Ok(vec![Some("a\"b".into())])
        );
        assert_eq!(read(b"{}", &[]), Ok(vec![]));
    }

    #[test]
    fn refuses_what_readers_would_disagree_on() {
        let bad = |body: &[u8]| read(body, &[TYPE, KEY]);
        assert!(
            matches!(bad(br#"{"type": "a", "type": "b"}"#), Err(BodyFieldsError::BadField(e)) if e.contains("twice"))
        );
        assert!(
            matches!(bad(br#"{"data": {"order_id": 1, "order_id": 2}}"#), Err(BodyFieldsError::BadField(e)) if e.contains("data.order_id"))
        );
        assert!(
            matches!(bad(br#"{"type": {"a": 1}}"#), Err(BodyFieldsError::BadField(e)) if e == "field `type` must be a string or a number")
        );
        assert!(matches!(
            bad(br#"{"type": true}"#),
            Err(BodyFieldsError::BadField(_))
        ));
        assert!(matches!(
            bad(br#"{"data": 5}"#),
            Err(BodyFieldsError::NotJson(_))
        ));
        assert!(matches!(bad(b"[1, 2]"), Err(BodyFieldsError::NotJson(_))));
        assert!(matches!(
            bad(b"{\"type\": \"a\"} trailing"),
            Err(BodyFieldsError::NotJson(_))
        ));
        assert!(matches!(
            bad(b"{not json"),
            Err(BodyFieldsError::NotJson(_))
        ));
        assert!(matches!(bad(b""), Err(BodyFieldsError::NotJson(_))));
        // A byte that is not UTF-8 in a member nobody reads is still not JSON.
        assert!(matches!(
            bad(b"{\"pad\": \"\xf6\"}"),
            Err(BodyFieldsError::NotJson(_))
        ));
    }

    /// Deep nesting is refused by serde_json's recursion limit, not a stack overflow.
    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = format!("{{\"data\": {}{}}}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(read(deep.as_bytes(), &[TYPE, KEY]).is_err());
        let deep_objects = format!("{}{}", "{\"data\":".repeat(10_000), "}".repeat(10_000));
        assert!(read(deep_objects.as_bytes(), &[&["data"; 3]]).is_err());
    }
}
