//! Counting media items in chat messages, for `--limit-mm-per-prompt`.

use std::collections::BTreeMap;

use serde_json::Value;

/// Items per modality (`image`, `audio`, `video`).
pub type MediaCounts = BTreeMap<String, usize>;

/// The modality a content part's `type` carries, if it carries media.
pub fn part_modality(part_type: &str) -> Option<&'static str> {
    match part_type {
        "image_url" | "image" | "image_pil" | "image_embeds" => Some("image"),
        "input_audio" | "audio_url" | "audio" | "audio_embeds" => Some("audio"),
        "video_url" | "video" => Some("video"),
        _ => None,
    }
}

/// Count media parts across all messages (typed parts only; shape errors are found later).
pub fn count_media_parts(messages: &[Value]) -> MediaCounts {
    let mut counts = MediaCounts::new();
    for msg in messages {
        let Some(Value::Array(parts)) = msg.get("content") else {
            continue;
        };
        for part in parts {
            if let Some(m) = part
                .get("type")
                .and_then(Value::as_str)
                .and_then(part_modality)
            {
                *counts.entry(m.to_string()).or_default() += 1;
            }
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_across_messages() {
        let msgs = vec![
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "hi"}]}),
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "y"}}, {"type": "video_url", "video_url": {"url": "z"}}]}),
            json!({"role": "user", "content": "plain"}),
        ];
        let c = count_media_parts(&msgs);
        assert_eq!(c.get("image"), Some(&2));
        assert_eq!(c.get("video"), Some(&1));
        assert_eq!(c.get("audio"), None);
    }
}
