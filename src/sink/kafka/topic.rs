//! Topic routing: the `kafka.topic_template` with its placeholders.

/// A topic name template: literal text with `{message_type}`, `{pipeline}` and
/// `{routing}` (the row's routing column, `outbox.columns.routing`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<TemplatePart>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum TemplatePart {
    Literal(String),
    MessageType,
    Pipeline,
    Routing,
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
                other => {
                    return Err(format!(
                        "kafka.topic_template `{template}` uses unknown placeholder `{{{other}}}`; \
                         known: {{message_type}}, {{pipeline}}, {{routing}}"
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
        Ok(Self { parts })
    }

    /// Whether the template uses `{routing}`.
    pub fn uses_routing(&self) -> bool {
        self.parts.contains(&TemplatePart::Routing)
    }

    /// The topic for an event of `message_type` with `routing` in `pipeline` (an absent
    /// routing value renders empty; [`TopicTemplate::uses_routing`] lets the sink refuse
    /// such an event first).
    pub fn render(&self, message_type: &str, routing: Option<&str>, pipeline: &str) -> String {
        let mut topic = String::with_capacity(48);
        for part in &self.parts {
            match part {
                TemplatePart::Literal(s) => topic.push_str(s),
                TemplatePart::MessageType => topic.push_str(message_type),
                TemplatePart::Pipeline => topic.push_str(pipeline),
                TemplatePart::Routing => topic.push_str(routing.unwrap_or_default()),
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
        let t = TopicTemplate::parse("outbox.{message_type}").unwrap();
        assert_eq!(t.render("order.created", None, "p"), "outbox.order.created");
        let t = TopicTemplate::parse("{pipeline}-events").unwrap();
        assert_eq!(t.render("x", None, "orders"), "orders-events");
        assert_eq!(
            TopicTemplate::parse("fixed")
                .unwrap()
                .render("x", None, "p"),
            "fixed"
        );
        assert!(TopicTemplate::parse("a.{message_type").is_err());
        assert!(TopicTemplate::parse("a.{biz}")
            .unwrap_err()
            .contains("{biz}"));
        assert!(TopicTemplate::parse("").is_err());
        let t = TopicTemplate::parse("outbox.event.{routing}").unwrap();
        assert!(t.uses_routing());
        assert_eq!(t.render("x", Some("order"), "p"), "outbox.event.order");
    }
}
