//! Server-sent events as the OpenAI streaming API uses them: `data: <payload>` events
//! separated by blank lines, the last one `data: [DONE]`.

use serde_json::Value;

/// One event's payload.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// `data: [DONE]`.
    Done,
    /// A JSON payload.
    Json(Value),
    /// A payload that is not JSON.
    Other(String),
}

/// Splits an SSE body into the payloads of its `data:` events (multi-line data joined
/// by `\n`; comments and other fields ignored).
pub fn parse(body: &str) -> Vec<Event> {
    let mut events = Vec::new();
    let mut data: Vec<&str> = Vec::new();
    for line in body.lines().chain(std::iter::once("")) {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            if !data.is_empty() {
                events.push(classify(&data.join("\n")));
                data.clear();
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("data:") {
            data.push(rest.strip_prefix(' ').unwrap_or(rest));
        }
    }
    events
}

fn classify(payload: &str) -> Event {
    if payload.trim() == "[DONE]" {
        return Event::Done;
    }
    match serde_json::from_str(payload) {
        Ok(value) => Event::Json(value),
        Err(_) => Event::Other(payload.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_chunks_and_done() {
        let body = "data: {\"a\":1}\n\n: comment\n\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n";
        let events = parse(body);
        assert_eq!(
            events,
            vec![
                Event::Json(serde_json::json!({"a": 1})),
                Event::Json(serde_json::json!({"b": 2})),
                Event::Done
            ]
        );
    }

    #[test]
    fn keeps_a_last_event_without_a_blank_line_and_non_json() {
        let events = parse("data: oops\n\ndata: [DONE]");
        assert_eq!(events, vec![Event::Other("oops".into()), Event::Done]);
    }

    #[test]
    fn plain_json_has_no_events() {
        assert!(parse("{\"error\":{}}").is_empty());
    }
}
