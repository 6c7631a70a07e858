//! The trust-gate matrix: route x field x value x mode (CONTRACT section 2).

use serde_json::{json, Value};

use super::{set, Case, Ctx, Variant};
use crate::expect::{not_gate, Expect, GateField};
use crate::http::RequestSpec;
use crate::routes::Route;

/// Which kwargs field(s) a case sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fields {
    Mm,
    Media,
    Both,
}

/// The values tried for each field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    Null,
    Empty,
    /// `{"video": {}}`: non-empty, since the outer object has a key.
    VideoEmpty,
    /// A harmless non-empty value.
    Benign,
}

impl Sample {
    pub const ALL: [Sample; 4] = [
        Sample::Null,
        Sample::Empty,
        Sample::VideoEmpty,
        Sample::Benign,
    ];

    pub fn value(self, field: GateField) -> Value {
        match self {
            Sample::Null => Value::Null,
            Sample::Empty => json!({}),
            Sample::VideoEmpty => json!({"video": {}}),
            Sample::Benign => benign(field),
        }
    }
}

/// The benign non-empty value for `field`.
pub fn benign(field: GateField) -> Value {
    match field {
        GateField::MmProcessorKwargs => json!({"num_crops": 4}),
        GateField::MediaIoKwargs => json!({"image": {"image_mode": "RGB"}}),
    }
}

/// Non-empty in the gate's sense: an object with at least one key.
pub fn is_non_empty(value: Option<&Value>) -> bool {
    value
        .and_then(Value::as_object)
        .is_some_and(|map| !map.is_empty())
}

/// The field the gate must name for these values when the client is not trusted
/// (`mm_processor_kwargs` first).
pub fn refused_field(mm: Option<&Value>, media: Option<&Value>) -> Option<GateField> {
    if is_non_empty(mm) {
        Some(GateField::MmProcessorKwargs)
    } else if is_non_empty(media) {
        Some(GateField::MediaIoKwargs)
    } else {
        None
    }
}

/// Adds the kwargs (when `Some`) to a body.
pub fn with_kwargs(body: Value, mm: Option<&Value>, media: Option<&Value>) -> Value {
    let body = match mm {
        Some(mm) => set(body, GateField::MmProcessorKwargs.name(), mm.clone()),
        None => body,
    };
    match media {
        Some(media) => set(body, GateField::MediaIoKwargs.name(), media.clone()),
        None => body,
    }
}

fn describe(mm: Option<&Value>, media: Option<&Value>) -> String {
    match (mm, media) {
        (None, None) => "no kwargs".into(),
        (Some(mm), None) => format!("mm_processor_kwargs={mm}"),
        (None, Some(media)) => format!("media_io_kwargs={media}"),
        (Some(mm), Some(media)) => {
            format!("mm_processor_kwargs={mm} media_io_kwargs={media}")
        }
    }
}

/// One gate case: `route`'s valid body (or `body_for`'s), plus the kwargs.
fn gate_case(
    ctx: &Ctx,
    variant: &Variant,
    route: Route,
    form: &str,
    body_for: fn(Route, &str) -> Value,
    mm: Option<Value>,
    media: Option<Value>,
) -> Case {
    let name = format!(
        "gate[{}] {}{form} {}",
        variant.label,
        route.path(),
        describe(mm.as_ref(), media.as_ref())
    );
    let refused = if variant.trusted {
        None
    } else {
        refused_field(mm.as_ref(), media.as_ref())
    };
    let expect = match (refused, form.is_empty()) {
        (Some(field), _) => Expect::gate_rejection(field),
        (None, true) => route.success(ctx).with(not_gate()),
        // The chat-style form needs a chat template, which an embedding model may lack
        // (then a 400 from rendering, which comes after the gate): only "not refused".
        (None, false) => Expect::new("not the gate's refusal, not a 5xx")
            .with(not_gate())
            .with(|reply| {
                if reply.status < 500 {
                    Ok(())
                } else {
                    Err(format!("status {}", reply.status))
                }
            }),
    };
    let auth = variant.auth.clone();
    Case::with_model(name, route.route(), route.model(ctx), move |model| {
        let body = with_kwargs(body_for(route, model), mm.as_ref(), media.as_ref());
        (
            RequestSpec::post_json(route.path(), body).with_auth(auth),
            expect,
        )
    })
}

fn plain_body(route: Route, model: &str) -> Value {
    route.body(model)
}

/// The chat-style (`messages`) form of tokenize and embeddings.
fn messages_body(route: Route, model: &str) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "Hello there"}],
        "add_generation_prompt": route == Route::Tokenize,
    })
}

/// The matrix for every variant of the configured mode.
pub fn cases(ctx: &Ctx) -> Vec<Case> {
    let mm = GateField::MmProcessorKwargs;
    let media = GateField::MediaIoKwargs;
    let mut cases = Vec::new();
    for variant in ctx.variants() {
        for route in Route::GATED {
            cases.push(gate_case(ctx, &variant, route, "", plain_body, None, None));
            for fields in [Fields::Mm, Fields::Media, Fields::Both] {
                for sample in Sample::ALL {
                    let mm_value =
                        matches!(fields, Fields::Mm | Fields::Both).then(|| sample.value(mm));
                    let media_value =
                        matches!(fields, Fields::Media | Fields::Both).then(|| sample.value(media));
                    cases.push(gate_case(
                        ctx,
                        &variant,
                        route,
                        "",
                        plain_body,
                        mm_value,
                        media_value,
                    ));
                }
            }
            // Mixed: only one of the two is non-empty.
            for (mm_value, media_value) in [
                (json!({}), benign(media)),
                (Value::Null, json!({"video": {}})),
                (benign(mm), json!({})),
            ] {
                cases.push(gate_case(
                    ctx,
                    &variant,
                    route,
                    "",
                    plain_body,
                    Some(mm_value),
                    Some(media_value),
                ));
            }
        }
        // The chat-style forms of tokenize and embeddings are gated too.
        for route in [Route::Tokenize, Route::Embeddings] {
            for (mm_value, media_value) in [
                (Some(benign(mm)), None),
                (None, Some(benign(media))),
                (Some(json!({})), None),
            ] {
                cases.push(gate_case(
                    ctx,
                    &variant,
                    route,
                    " (messages)",
                    messages_body,
                    mm_value,
                    media_value,
                ));
            }
        }
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_empty_means_an_object_with_a_key() {
        assert!(!is_non_empty(None));
        assert!(!is_non_empty(Some(&Value::Null)));
        assert!(!is_non_empty(Some(&json!({}))));
        assert!(is_non_empty(Some(&json!({"video": {}}))));
        assert!(is_non_empty(Some(&json!({"num_crops": 4}))));
    }

    #[test]
    fn mm_processor_kwargs_is_named_first() {
        let full = json!({"a": 1});
        assert_eq!(
            refused_field(Some(&full), Some(&full)),
            Some(GateField::MmProcessorKwargs)
        );
        assert_eq!(
            refused_field(Some(&json!({})), Some(&full)),
            Some(GateField::MediaIoKwargs)
        );
        assert_eq!(refused_field(Some(&Value::Null), None), None);
    }

    #[test]
    fn kwargs_are_added_only_when_given() {
        let body = with_kwargs(json!({"model": "m"}), None, Some(&Value::Null));
        assert_eq!(body, json!({"model": "m", "media_io_kwargs": null}));
    }
}
