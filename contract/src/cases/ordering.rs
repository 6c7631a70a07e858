//! The order of checks (CONTRACT section 2): validation, then the model check (before
//! the gate on chat/completions/tokenize, after it on the pooling family), then the gate,
//! then tokenization.

use serde_json::{json, Value};

use super::gate::{benign, with_kwargs};
use super::{set, Case, Ctx, Variant};
use crate::expect::{Expect, GateField};
use crate::http::RequestSpec;
use crate::routes::Route;

const MM: GateField = GateField::MmProcessorKwargs;
const MEDIA: GateField = GateField::MediaIoKwargs;

/// A validation error for `route` that must come before the gate: the field to break,
/// its bad value, and the `param` the 400 names.
pub fn invalid_field(route: Route) -> (&'static str, Value) {
    match route {
        Route::Chat | Route::Completions => ("temperature", json!(5)),
        Route::Tokenize => ("add_special_tokens", json!([1])),
        Route::Embeddings | Route::Pooling => ("encoding_format", json!("hex")),
        Route::Score | Route::Classify => ("truncate_prompt_tokens", json!("many")),
        Route::Rerank => ("top_n", json!("many")),
    }
}

fn with_unknown_model(route: Route, unknown: &str) -> Value {
    route.body(unknown)
}

fn case(name: String, route: Route, variant: &Variant, body: Value, expect: Expect) -> Case {
    Case::single(
        name,
        RequestSpec::post_json(route.path(), body).with_auth(variant.auth.clone()),
        expect,
    )
}

pub fn cases(ctx: &Ctx) -> Vec<Case> {
    let unknown = ctx.unknown_model();
    let mut cases = Vec::new();
    for variant in ctx.variants() {
        let label = variant.label;
        for route in Route::GATED {
            let path = route.path();
            // The model check against the gate.
            for field in [MM, MEDIA] {
                let kwargs = benign(field);
                let (mm, media) = match field {
                    GateField::MmProcessorKwargs => (Some(&kwargs), None),
                    GateField::MediaIoKwargs => (None, Some(&kwargs)),
                };
                let body = with_kwargs(with_unknown_model(route, &unknown), mm, media);
                let (expect, what) = if route.pooling_family() && !variant.trusted {
                    (Expect::gate_rejection(field), "gate 400 beats 404")
                } else {
                    (Expect::unknown_model(&unknown), "404 comes first")
                };
                cases.push(case(
                    format!(
                        "order[{label}] {path} unknown model + {}: {what}",
                        field.name()
                    ),
                    route,
                    &variant,
                    body,
                    expect,
                ));
            }
            // Validation before the gate (and before the model check).
            let (field, bad) = invalid_field(route);
            let kwargs = benign(MM);
            cases.push(Case::with_model(
                format!(
                    "order[{label}] {path} invalid {field} + mm_processor_kwargs: validation first"
                ),
                route.route(),
                route.model(ctx),
                |model| {
                    let body = with_kwargs(
                        set(route.body(model), field, bad.clone()),
                        Some(&kwargs),
                        None,
                    );
                    (
                        RequestSpec::post_json(path, body).with_auth(variant.auth.clone()),
                        Expect::bad_request(field),
                    )
                },
            ));
            let body = with_kwargs(set(route.body(&unknown), field, bad), Some(&kwargs), None);
            cases.push(case(
                format!("order[{label}] {path} invalid {field} + unknown model + mm_processor_kwargs: validation first"),
                route,
                &variant,
                body,
                Expect::bad_request(field),
            ));
        }
        // Streaming validation errors come before the gate too.
        cases.push(Case::with_model(
            format!("order[{label}] /v1/chat/completions stream_options without stream + mm_processor_kwargs: validation first"),
            Route::Chat.route(),
            ctx.chat_model(),
            |model| {
                let body = with_kwargs(
                    set(Route::Chat.body(model), "stream_options", json!({"include_usage": true})),
                    Some(&benign(MM)),
                    None,
                );
                (
                    RequestSpec::post_json(Route::Chat.path(), body).with_auth(variant.auth.clone()),
                    Expect::bad_request("stream_options"),
                )
            },
        ));
        // Tokenization comes after the gate: an out-of-vocabulary id is not seen first.
        if !variant.trusted {
            cases.push(Case::with_model(
                format!("order[{label}] /v1/completions out-of-vocabulary prompt id + mm_processor_kwargs: gate first"),
                Route::Completions.route(),
                ctx.chat_model(),
                |model| {
                    let body = with_kwargs(
                        set(Route::Completions.body(model), "prompt", json!([1, 2, 100_000_000])),
                        Some(&benign(MM)),
                        None,
                    );
                    (
                        RequestSpec::post_json(Route::Completions.path(), body)
                            .with_auth(variant.auth.clone()),
                        Expect::gate_rejection(MM),
                    )
                },
            ));
        }
    }
    // Without kwargs, the pooling family still answers 404 for an unknown model.
    for route in Route::GATED {
        cases.push(Case::single(
            format!("order {} unknown model, no kwargs: 404", route.path()),
            RequestSpec::post_json(route.path(), route.body(&unknown)),
            Expect::unknown_model(&unknown),
        ));
    }
    cases
}
