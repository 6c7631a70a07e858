//! Chat messages: shape checks of content parts (CONTRACT section 4) and the conversion into
//! what the chat template sees.

use media::Modality;
use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};
use crate::policy::MediaCounts;
use crate::protocol::chat::ChatMessage;

/// One media item found in the messages.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaItem {
    pub modality: Modality,
    /// The URL (`data:`, `http(s):`, `file:`); `None` for a uuid-only reference.
    pub url: Option<String>,
    pub uuid: Option<String>,
}

/// What checking the messages found: the media they reference and, per message with a list of
/// parts, its text parts joined. The template's copy is only built once the policy layers have
/// passed the request ([`ParsedMessages::template_messages`]).
#[derive(Debug, Default)]
pub struct ParsedMessages {
    pub media: Vec<MediaItem>,
    joined_text: Vec<Option<String>>,
}

impl ParsedMessages {
    /// The messages as the chat template sees them: content parts flattened to their text.
    pub fn template_messages(&self, messages: &[ChatMessage]) -> Vec<Value> {
        messages
            .iter()
            .zip(&self.joined_text)
            .map(|(msg, joined)| msg.to_value(joined.as_deref()))
            .collect()
    }

    /// The messages for a model that takes media: a message with media parts keeps its list
    /// of parts, as `{"type": "text", "text": ...}` and `{"type": "image" | "video" |
    /// "audio"}`, so the template places one placeholder per item where the client put it;
    /// other messages as [`ParsedMessages::template_messages`] gives them.
    pub fn template_messages_with_media(&self, messages: &[ChatMessage]) -> Vec<Value> {
        messages
            .iter()
            .zip(self.template_messages(messages))
            .map(|(msg, flat)| {
                let Some(Value::Array(parts)) = msg.get("content") else {
                    return flat;
                };
                let converted: Vec<Value> = parts
                    .iter()
                    .filter_map(|part| {
                        let ty = part.get("type").and_then(Value::as_str)?;
                        match ty {
                            "text" | "input_text" => Some(serde_json::json!({
                                "type": "text",
                                "text": part.get("text").cloned().unwrap_or(Value::Null)
                            })),
                            "refusal" => Some(serde_json::json!({
                                "type": "text",
                                "text": part.get("refusal").cloned().unwrap_or(Value::Null)
                            })),
                            "image_url" => Some(serde_json::json!({"type": "image"})),
                            "video_url" => Some(serde_json::json!({"type": "video"})),
                            "audio_url" | "input_audio" => {
                                Some(serde_json::json!({"type": "audio"}))
                            }
                            _ => None,
                        }
                    })
                    .collect();
                if converted.iter().all(|p| p["type"] == "text") {
                    return flat;
                }
                let mut obj = flat;
                if let Value::Object(map) = &mut obj {
                    map.insert("content".into(), Value::Array(converted));
                }
                obj
            })
            .collect()
    }

    pub fn counts(&self) -> MediaCounts {
        let mut c = MediaCounts::new();
        for m in &self.media {
            *c.entry(m.modality.as_str().to_string()).or_default() += 1;
        }
        c
    }
}

fn bad(msg: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(msg, Some(param))
}

fn url_field<'a>(part: &'a Map<String, Value>, key: &str, i: usize) -> ApiResult<Option<&'a str>> {
    match part.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => match o.get("url") {
            Some(Value::String(u)) => Ok(Some(u)),
            _ => Err(bad(
                format!("messages[{i}]: `{key}` must be an object with a string `url`."),
                "messages",
            )),
        },
        Some(_) => Err(bad(
            format!("messages[{i}]: `{key}` must be an object like {{\"url\": \"...\"}}, not a bare value."),
            "messages",
        )),
    }
}

fn parse_part(
    part: &Value,
    i: usize,
    texts: &mut Vec<String>,
    media: &mut Vec<MediaItem>,
) -> ApiResult<()> {
    let Some(obj) = part.as_object() else {
        return Err(bad(
            format!("messages[{i}]: each content part must be an object."),
            "messages",
        ));
    };
    let Some(ty) = obj.get("type").and_then(Value::as_str) else {
        return Err(bad(
            format!("messages[{i}]: a content part needs a string `type`."),
            "type",
        ));
    };
    let uuid = obj.get("uuid").and_then(Value::as_str).map(str::to_string);
    let (modality, url) = match ty {
        "text" | "input_text" => {
            let Some(t) = obj.get("text").and_then(Value::as_str) else {
                return Err(bad(
                    format!("messages[{i}]: a text part needs a string `text`."),
                    "messages",
                ));
            };
            texts.push(t.to_string());
            return Ok(());
        }
        "refusal" => {
            if let Some(t) = obj.get("refusal").and_then(Value::as_str) {
                texts.push(t.to_string());
            }
            return Ok(());
        }
        "image_url" => (
            Modality::Image,
            url_field(obj, "image_url", i)?.map(str::to_string),
        ),
        "audio_url" => (
            Modality::Audio,
            url_field(obj, "audio_url", i)?.map(str::to_string),
        ),
        "video_url" => (
            Modality::Video,
            url_field(obj, "video_url", i)?.map(str::to_string),
        ),
        "input_audio" => {
            let url = match obj.get("input_audio") {
                None | Some(Value::Null) => None,
                Some(Value::Object(a)) => {
                    let data = a.get("data").and_then(Value::as_str);
                    let format = a.get("format").and_then(Value::as_str);
                    match (data, format) {
                        (Some(d), Some(f)) => Some(format!("data:audio/{f};base64,{d}")),
                        _ => {
                            return Err(bad(
                                format!(
                                "messages[{i}]: `input_audio` needs string `data` and `format`."
                            ),
                                "messages",
                            ))
                        }
                    }
                }
                Some(_) => {
                    return Err(bad(
                        format!(
                        "messages[{i}]: `input_audio` must be an object with `data` and `format`."
                    ),
                        "messages",
                    ))
                }
            };
            (Modality::Audio, url)
        }
        other => {
            return Err(bad(
                format!("messages[{i}]: unknown content part type '{other}'."),
                "type",
            ))
        }
    };
    if url.is_none() && uuid.is_none() {
        return Err(bad(
            format!("messages[{i}]: a {modality} part needs a URL (or a uuid of cached media)."),
            "messages",
        ));
    }
    media.push(MediaItem {
        modality,
        url,
        uuid,
    });
    Ok(())
}

/// Check every message's shape; flatten text parts into a string (joined with newlines) the
/// way the chat template expects, and collect media items in order.
pub fn parse_messages(messages: &[ChatMessage]) -> ApiResult<ParsedMessages> {
    if messages.is_empty() {
        return Err(bad("messages must not be empty.", "messages"));
    }
    let mut out = ParsedMessages::default();
    for (i, msg) in messages.iter().enumerate() {
        if *msg == ChatMessage::NotAnObject {
            return Err(bad(format!("messages[{i}] must be an object."), "messages"));
        }
        if !msg.get("role").is_some_and(Value::is_string) {
            return Err(bad(
                format!("messages[{i}] needs a string `role`."),
                "messages",
            ));
        }
        let joined = match msg.get("content") {
            None | Some(Value::Null) | Some(Value::String(_)) => None,
            Some(Value::Array(parts)) => {
                let mut texts = Vec::new();
                for part in parts {
                    parse_part(part, i, &mut texts, &mut out.media)?;
                }
                Some(texts.join("\n"))
            }
            Some(_) => {
                return Err(bad(
                    format!("messages[{i}].content must be a string or a list of content parts."),
                    "messages",
                ))
            }
        };
        out.joined_text.push(joined);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs(v: Value) -> Vec<ChatMessage> {
        serde_json::from_value(v).unwrap()
    }

    fn param(v: Value) -> Option<String> {
        match parse_messages(&msgs(v)) {
            Err(ApiError::BadRequest { param, .. }) => param,
            Err(e) => panic!("{e:?}"),
            Ok(_) => None,
        }
    }

    #[test]
    fn text_parts_flatten() {
        let sent = json!([
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c", "name": "bot", "role": "assistant"},
        ]);
        let m = msgs(sent.clone());
        let p = parse_messages(&m).unwrap();
        let t = p.template_messages(&m);
        assert_eq!(t[0]["content"], "a\nb");
        assert_eq!(t[1], sent[1]);
        // Key order as sent, a repeated key keeping its first place and its last value.
        let keys: Vec<&String> = t[1].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["role", "content", "name"]);
        assert!(p.media.is_empty());
    }

    #[test]
    fn media_collected_and_shapes_checked() {
        let p = parse_messages(&msgs(json!([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/a.png"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            {"type": "video_url", "video_url": {"url": "http://x/v.mp4"}, "uuid": "v1"}
        ]}])))
        .unwrap();
        assert_eq!(p.media.len(), 3);
        assert_eq!(
            p.media[1].url.as_deref(),
            Some("data:audio/wav;base64,AAAA")
        );
        assert_eq!(p.counts().get("video"), Some(&1));
        assert_eq!(param(json!([{"role": "user", "content": [{"type": "video_url", "video_url": "http://x"}]}])).as_deref(), Some("messages"));
        assert_eq!(
            param(json!([{"role": "user", "content": [{"type": "hologram"}]}])).as_deref(),
            Some("type")
        );
        assert_eq!(param(json!([])).as_deref(), Some("messages"));
        assert_eq!(
            param(json!([{"content": "x"}])).as_deref(),
            Some("messages")
        );
        assert_eq!(
            param(json!([{"role": "user", "content": 5}])).as_deref(),
            Some("messages")
        );
        for not_object in [
            json!(["x"]),
            json!([[1, {"a": 2}]]),
            json!([null]),
            json!([3.5]),
        ] {
            let err = parse_messages(&msgs(not_object.clone())).err();
            assert!(
                matches!(&err, Some(ApiError::BadRequest { message, .. }) if message == "messages[0] must be an object."),
                "{not_object} -> {err:?}"
            );
        }
        let m = msgs(json!([{"role": 7, "content": "x"}]));
        assert_eq!(m[0].get("role"), Some(&json!(7)));
        assert_eq!(
            param(json!([{"role": 7, "content": "x"}])).as_deref(),
            Some("messages")
        );
    }
}
