//! Refused kwargs stop a request before any media is fetched (CONTRACT section 2, order
//! steps 3 and 5). The suite cannot see the media server; the caller that runs it counts
//! hits and checks none arrived.

use serde_json::{json, Value};

use super::gate::{benign, with_kwargs};
use super::{Case, Ctx};
use crate::expect::{Expect, GateField};
use crate::http::RequestSpec;
use crate::routes::Route;

/// Paths under `media_base_url` the cases point at.
pub const IMAGE_PATH: &str = "/contract/image.png";
pub const VIDEO_PATH: &str = "/contract/video.mp4";
pub const AUDIO_PATH: &str = "/contract/audio.wav";

fn messages(base: &str, parts: &[&str]) -> Value {
    let mut content = vec![json!({"type": "text", "text": "Describe this."})];
    for part in parts {
        content.push(match *part {
            "image" => {
                json!({"type": "image_url", "image_url": {"url": format!("{base}{IMAGE_PATH}")}})
            }
            "video" => {
                json!({"type": "video_url", "video_url": {"url": format!("{base}{VIDEO_PATH}")}})
            }
            _ => json!({"type": "audio_url", "audio_url": {"url": format!("{base}{AUDIO_PATH}")}}),
        });
    }
    json!([{"role": "user", "content": content}])
}

/// Media parts, `mm_processor_kwargs`, `media_io_kwargs`, and the field the gate names.
type MediaCombo = (
    &'static [&'static str],
    Option<Value>,
    Option<Value>,
    GateField,
);

/// The media cases (empty unless `media_base_url` is set and some variant is refused).
pub fn cases(ctx: &Ctx) -> Vec<Case> {
    let Some(base) = ctx.cfg.media_base_url.as_deref() else {
        return Vec::new();
    };
    let base = base.trim_end_matches('/');
    let mm = GateField::MmProcessorKwargs;
    let media = GateField::MediaIoKwargs;
    let combos: [MediaCombo; 5] = [
        (&["image"], Some(benign(mm)), None, mm),
        (&["image"], None, Some(benign(media)), media),
        (
            &["video"],
            None,
            Some(json!({"video": {"num_frames": 8}})),
            media,
        ),
        (&["audio"], Some(json!({"sampling_rate": 16000})), None, mm),
        (
            &["image", "video"],
            Some(benign(mm)),
            Some(benign(media)),
            mm,
        ),
    ];
    let mut cases = Vec::new();
    for variant in ctx.refused_variants() {
        for (parts, mm_value, media_value, field) in &combos {
            for route in [Route::Chat, Route::Embeddings] {
                let label = parts.join("+");
                let name = format!(
                    "media[{}] {} {label} URL + {}: gate 400, nothing fetched",
                    variant.label,
                    route.path(),
                    field.name()
                );
                let mut body = json!({
                    "model": route.model(ctx).unwrap_or_else(|_| ctx.unknown_model()),
                    "messages": messages(base, parts),
                });
                if route == Route::Chat {
                    body = super::set(body, "max_tokens", json!(2));
                }
                let body = with_kwargs(body, mm_value.as_ref(), media_value.as_ref());
                cases.push(Case::single(
                    name,
                    RequestSpec::post_json(route.path(), body).with_auth(variant.auth.clone()),
                    Expect::gate_rejection(*field),
                ));
            }
        }
    }
    cases
}
