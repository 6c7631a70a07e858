//! `/v1/chat/completions` request and response types (OpenAI and vLLM compatible).

use serde::Serialize;
use serde_json::{Map, Value};

use super::sampling::request_with_sampling;
use super::Usage;

/// One message of `messages` as the client sent it.
///
/// An object is kept as its key/value pairs in the order sent, without building a map: a map
/// with insertion order hashes every key with a fresh SipHash state, and every request pays
/// for its messages before the trust gate can refuse it. Lookups take the last value of a
/// key, as a map would. Anything else than an object is remembered only as such; the
/// message checks refuse it with their own message.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatMessage {
    Object(Vec<(MessageKey, Value)>),
    NotAnObject,
}

/// A key of a message object: the two every message has are kept without an allocation.
#[derive(Debug, Clone, PartialEq)]
pub enum MessageKey {
    Role,
    Content,
    Other(String),
}

impl MessageKey {
    pub fn as_str(&self) -> &str {
        match self {
            MessageKey::Role => "role",
            MessageKey::Content => "content",
            MessageKey::Other(key) => key,
        }
    }

    /// The tag for `key`, or `None` for a key kept as text.
    fn known(key: &str) -> Option<Self> {
        match key {
            "role" => Some(MessageKey::Role),
            "content" => Some(MessageKey::Content),
            _ => None,
        }
    }
}

impl<'de> serde::Deserialize<'de> for MessageKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = MessageKey;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a message key")
            }
            fn visit_str<E>(self, key: &str) -> Result<MessageKey, E> {
                Ok(MessageKey::known(key).unwrap_or_else(|| MessageKey::Other(key.to_owned())))
            }
            fn visit_string<E>(self, key: String) -> Result<MessageKey, E> {
                Ok(MessageKey::known(&key).unwrap_or(MessageKey::Other(key)))
            }
        }
        d.deserialize_string(V)
    }
}

impl ChatMessage {
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            ChatMessage::Object(fields) => fields
                .iter()
                .rev()
                .find(|(k, _)| k.as_str() == key)
                .map(|(_, v)| v),
            ChatMessage::NotAnObject => None,
        }
    }

    /// The message as a JSON object for the chat template (`content` replaced when given).
    pub fn to_value(&self, content: Option<&str>) -> Value {
        let ChatMessage::Object(fields) = self else {
            return Value::Null;
        };
        let mut map = Map::with_capacity(fields.len());
        for (k, v) in fields {
            map.insert(k.as_str().to_owned(), v.clone());
        }
        if let Some(text) = content {
            map.insert("content".into(), Value::String(text.to_string()));
        }
        Value::Object(map)
    }
}

impl<'de> serde::Deserialize<'de> for ChatMessage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ChatMessage;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a chat message")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<ChatMessage, A::Error> {
                let mut fields = Vec::with_capacity(m.size_hint().unwrap_or(2).min(16));
                while let Some(entry) = m.next_entry::<MessageKey, Value>()? {
                    fields.push(entry);
                }
                Ok(ChatMessage::Object(fields))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut s: A,
            ) -> Result<ChatMessage, A::Error> {
                while s.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(ChatMessage::NotAnObject)
            }
            fn visit_bool<E>(self, _: bool) -> Result<ChatMessage, E> {
                Ok(ChatMessage::NotAnObject)
            }
            fn visit_i64<E>(self, _: i64) -> Result<ChatMessage, E> {
                Ok(ChatMessage::NotAnObject)
            }
            fn visit_u64<E>(self, _: u64) -> Result<ChatMessage, E> {
                Ok(ChatMessage::NotAnObject)
            }
            fn visit_f64<E>(self, _: f64) -> Result<ChatMessage, E> {
                Ok(ChatMessage::NotAnObject)
            }
            fn visit_str<E>(self, _: &str) -> Result<ChatMessage, E> {
                Ok(ChatMessage::NotAnObject)
            }
            fn visit_unit<E>(self) -> Result<ChatMessage, E> {
                Ok(ChatMessage::NotAnObject)
            }
        }
        d.deserialize_any(V)
    }
}

request_with_sampling! {
pub struct ChatRequest via ChatRequestWire {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    /// Kept raw so a non-integer gets the contract's exact message. (This and the other
    /// rarely sent object fields are boxed: a JSON value is 80 bytes with ordered maps, and the
    /// request is moved a few times while it is parsed.)
    pub top_logprobs: Option<Box<Value>>,
    pub tools: Option<Box<Value>>,
    pub tool_choice: Option<Box<Value>>,
    pub chat_template: Option<String>,
    pub chat_template_kwargs: Option<Box<Map<String, Value>>>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub echo: Option<bool>,
    pub add_special_tokens: Option<bool>,
    pub mm_processor_kwargs: Option<super::RawKwargs>,
    pub media_io_kwargs: Option<super::RawKwargs>,
    pub documents: Option<Box<Value>>,
    pub parallel_tool_calls: Option<Box<Value>>,
    pub reasoning_effort: Option<Box<Value>>,
    pub include_reasoning: Option<Box<Value>>,
}
}

#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    /// The prompt's logprobs when asked for: on the response, not a choice, as vLLM (the
    /// choices share one prompt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Value>,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Option<Value>,
}

#[derive(Debug, Serialize)]
pub struct ChatMessageOut {
    /// `--response-role`.
    pub role: String,
    /// With `--reasoning-parser`: the reply's `<think>` part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// `null` when the reply is tool calls only.
    pub content: Option<String>,
    pub tool_calls: Vec<crate::parsers::tools::ToolCall>,
}

#[derive(Debug, Serialize, Default)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

#[derive(Debug, Serialize)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Serialize)]
pub struct ChatChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Value>,
}

#[derive(Debug, Serialize, Default)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known keys are kept as tags, other keys as text; lookups take the last value of a key
    /// and the template sees every key in the order sent, escaped keys included.
    #[test]
    fn message_keys() {
        let msg: ChatMessage = serde_json::from_str(
            r#"{"role":"user","name":"a","content":"hi","ro\u006ce":"tool","x":[1]}"#,
        )
        .unwrap();
        let ChatMessage::Object(fields) = &msg else {
            panic!("not an object")
        };
        let keys: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["role", "name", "content", "role", "x"]);
        assert_eq!(fields[0].0, MessageKey::Role);
        assert_eq!(fields[3].0, MessageKey::Role);
        assert_eq!(fields[1].0, MessageKey::Other("name".into()));
        assert_eq!(msg.get("role"), Some(&Value::from("tool")));
        assert_eq!(msg.get("content"), Some(&Value::from("hi")));
        assert_eq!(msg.get("missing"), None);
        let value = msg.to_value(Some("joined"));
        assert_eq!(
            value,
            serde_json::json!({"role": "tool", "name": "a", "content": "joined", "x": [1]})
        );
        let order: Vec<&String> = value.as_object().unwrap().keys().collect();
        assert_eq!(order, ["role", "name", "content", "x"]);
        let not: ChatMessage = serde_json::from_str("[1, 2]").unwrap();
        assert_eq!(not, ChatMessage::NotAnObject);
    }
}
