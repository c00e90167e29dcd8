//! Topic routing: the `kafka.topic_template` with its placeholders.

use outboxd_connector::OutboxEvent;

/// A topic name template: literal text with `{message_type}`, `{pipeline}`, `{routing}`
/// (the row's routing column, `outbox.columns.routing`), and `{schema}` and `{table}` (the
/// outbox table the row is in, as `outbox.table` or `outbox.tables` names it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicTemplate {
    /// The template as configured, for messages.
    text: String,
    parts: Vec<TemplatePart>,
    /// `(schema, table)` of each outbox table, by [`OutboxEvent::table`]; the schema is
    /// empty for an unqualified name.
    tables: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum TemplatePart {
    Literal(String),
    MessageType,
    Pipeline,
    Routing,
    Schema,
    Table,
}

impl TopicTemplate {
    /// Parses a template; unknown placeholders and unbalanced braces are errors.
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(TemplatePart::Literal(rest[..open].to_owned()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("kafka.topic_template `{template}` has an unclosed `{{`"))?;
            let name = &rest[open + 1..open + close];
            parts.push(match name {
                "message_type" => TemplatePart::MessageType,
                "pipeline" => TemplatePart::Pipeline,
                "routing" => TemplatePart::Routing,
                "schema" => TemplatePart::Schema,
                "table" => TemplatePart::Table,
                other => {
                    return Err(format!(
                        "kafka.topic_template `{template}` uses unknown placeholder `{{{other}}}`; \
                         known: {{message_type}}, {{pipeline}}, {{routing}}, {{schema}}, {{table}}"
                    ))
                }
            });
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(TemplatePart::Literal(rest.to_owned()));
        }
        if parts.is_empty() {
            return Err("kafka.topic_template is empty".into());
        }
        Ok(Self {
            text: template.to_owned(),
            parts,
            tables: vec![(String::new(), String::new())],
        })
    }

    /// The template as configured.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// What every topic of `pipeline` starts with: the template up to its first
    /// placeholder that depends on the row (or its outbox table), `{pipeline}` rendered.
    /// `true` when that is the whole topic (no such placeholder).
    pub fn fixed_prefix(&self, pipeline: &str) -> (String, bool) {
        let mut fixed = String::new();
        for part in &self.parts {
            match part {
                TemplatePart::Literal(s) => fixed.push_str(s),
                TemplatePart::Pipeline => fixed.push_str(pipeline),
                TemplatePart::MessageType
                | TemplatePart::Routing
                | TemplatePart::Schema
                | TemplatePart::Table => return (fixed, false),
            }
        }
        (fixed, true)
    }

    /// The template for a pipeline reading `tables` (`outbox.table` or `outbox.tables`, in
    /// order). With `{schema}`, every name must say its schema: the engine's default schema
    /// is not known here, and a topic must not depend on a role's `search_path`.
    pub fn with_tables(mut self, tables: &[String]) -> Result<Self, String> {
        self.tables = tables
            .iter()
            .map(|name| match name.split_once('.') {
                Some((schema, table)) => (schema.to_owned(), table.to_owned()),
                None => (String::new(), name.clone()),
            })
            .collect();
        if self.parts.contains(&TemplatePart::Schema) {
            if let Some((_, table)) = self.tables.iter().find(|(schema, _)| schema.is_empty()) {
                return Err(format!(
                    "kafka.topic_template uses {{schema}} and the outbox table `{table}` is not \
                     schema-qualified: name it as `<schema>.{table}` in outbox.table(s)"
                ));
            }
        }
        Ok(self)
    }

    /// Whether the template uses `{routing}`.
    pub fn uses_routing(&self) -> bool {
        self.parts.contains(&TemplatePart::Routing)
    }

    /// Whether `event` goes by this template (its `topic` column is empty) and the
    /// template needs the routing value it lacks: such an event cannot be routed, and the
    /// sink refuses it rather than send it to a name without its routing part.
    pub fn lacks_routing(&self, event: &OutboxEvent) -> bool {
        event.topic.as_deref().is_none_or(str::is_empty)
            && self.uses_routing()
            && event.routing.as_deref().is_none_or(str::is_empty)
    }

    /// The topic for `event` in `pipeline` (an absent routing value renders empty;
    /// [`TopicTemplate::uses_routing`] lets the sink refuse such an event first).
    pub fn render(&self, event: &OutboxEvent, pipeline: &str) -> String {
        let (schema, table) = self
            .tables
            .get(usize::from(event.table))
            .map_or(("", ""), |(s, t)| (s.as_str(), t.as_str()));
        let mut topic = String::with_capacity(48);
        for part in &self.parts {
            match part {
                TemplatePart::Literal(s) => topic.push_str(s),
                TemplatePart::MessageType => topic.push_str(&event.message_type),
                TemplatePart::Pipeline => topic.push_str(pipeline),
                TemplatePart::Routing => {
                    topic.push_str(event.routing.as_deref().unwrap_or_default())
                }
                TemplatePart::Schema => topic.push_str(schema),
                TemplatePart::Table => topic.push_str(table),
            }
        }
        topic
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_template_renders_placeholders() {
        let event = |message_type: &str, routing: Option<&str>, table: u16| {
            let mut e = crate::testing::event(1, "k");
            e.message_type = message_type.into();
            e.routing = routing.map(Into::into);
            e.table = table;
            e
        };
        let t = TopicTemplate::parse("outbox.{message_type}").unwrap();
        assert_eq!(
            t.render(&event("order.created", None, 0), "p"),
            "outbox.order.created"
        );
        let t = TopicTemplate::parse("{pipeline}-events").unwrap();
        assert_eq!(t.render(&event("x", None, 0), "orders"), "orders-events");
        assert_eq!(
            TopicTemplate::parse("fixed")
                .unwrap()
                .render(&event("x", None, 0), "p"),
            "fixed"
        );
        assert!(TopicTemplate::parse("a.{message_type").is_err());
        assert!(TopicTemplate::parse("a.{biz}")
            .unwrap_err()
            .contains("{biz}"));
        assert!(TopicTemplate::parse("").is_err());
        let t = TopicTemplate::parse("outbox.event.{routing}").unwrap();
        assert!(t.uses_routing());
        assert_eq!(
            t.render(&event("x", Some("order"), 0), "p"),
            "outbox.event.order"
        );
    }

    #[test]
    fn schema_and_table_name_the_rows_outbox_table() {
        let tables = ["tenant_a.outbox".to_owned(), "tenant_b.events".to_owned()];
        let t = TopicTemplate::parse("{schema}.{table}.{message_type}")
            .unwrap()
            .with_tables(&tables)
            .unwrap();
        let mut e = crate::testing::event(1, "k");
        e.message_type = "created".into();
        assert_eq!(t.render(&e, "p"), "tenant_a.outbox.created");
        e.table = 1;
        assert_eq!(t.render(&e, "p"), "tenant_b.events.created");
        // {table} alone works with unqualified names; {schema} needs every name qualified.
        let t = TopicTemplate::parse("{table}")
            .unwrap()
            .with_tables(&["orders_outbox".into()])
            .unwrap();
        e.table = 0;
        assert_eq!(t.render(&e, "p"), "orders_outbox");
        let err = TopicTemplate::parse("{schema}.x")
            .unwrap()
            .with_tables(&["outbox".into()])
            .unwrap_err();
        assert!(
            err.contains("`outbox`") && err.contains("schema-qualified"),
            "{err}"
        );
    }
}
