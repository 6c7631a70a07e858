//! The contract suite against a trusted-client profile (CONTRACT section 8): an API key
//! for everyone, keys the policy trusts (plain and as a SHA-256); untrusted keys keep the
//! default refusal, trusted ones are held to the policy's bounds.

mod common;

use std::time::Duration;

use common::{assert_report, must, Gateway, TempDir};
use contract::cases::Case;
use contract::expect::{Expect, GateField, Message, Param};
use contract::http::{Auth, Client, RequestSpec};
use contract::routes::{self, Route};
use contract::{ServerMode, SuiteConfig};
use serde_json::{json, Value};

const UNTRUSTED_KEY: &str = "contract-untrusted-key";
const TRUSTED_KEY: &str = "contract-trusted-key";
/// Trusted through its digest in the policy file.
const HASHED_KEY: &str = "contract-hashed-trusted-key";
/// `printf '%s' contract-hashed-trusted-key | sha256sum`
const HASHED_KEY_SHA256: &str = "34bd2abb803d076085ad6dfeebdc3363397216ecac7859ae997d3f22f1b94cb3";

/// The policy: the trusted keys, and bounds the suite's benign values satisfy
/// (`mm_processor_kwargs` stays open to unlisted keys so `{"video": {}}` passes).
fn policy() -> String {
    format!(
        r#"trusted_keys:
  - "{TRUSTED_KEY}"
  - "sha256:{HASHED_KEY_SHA256}"
bounds:
  video:
    type: object
    properties:
      num_frames: {{type: integer, minimum: 1, maximum: 64}}
      fps: {{type: number, exclusiveMinimum: 0, maximum: 4}}
    additionalProperties: false
  image:
    type: object
    properties:
      image_mode: {{enum: ["RGB", "RGBA", "L"]}}
    additionalProperties: false
  mm_processor_kwargs:
    type: object
    properties:
      num_crops: {{type: integer, minimum: 1, maximum: 16}}
"#
    )
}

fn body(route: Route, model: &str, field: GateField, value: Value) -> Value {
    contract::cases::set(route.body(model), field.name(), value)
}

/// A 400 from the bounds: names the field and mentions each of `words`.
fn bound_violation(field: GateField, words: &'static [&'static str]) -> Expect {
    Expect::error(
        400,
        "BadRequestError",
        Param::exact(field.name()),
        Message::NonEmpty,
    )
    .with(contract::expect::not_gate())
    .with(move |reply| {
        let message = reply.error_message().unwrap_or_default();
        match words.iter().find(|word| !message.contains(**word)) {
            None => Ok(()),
            Some(word) => Err(format!("message {message:?} does not mention {word:?}")),
        }
    })
}

/// Profile-specific checks beyond the suite: hashed keys and bounds.
fn bounds_cases(chat: &str, embed: &str) -> Vec<Case> {
    let trusted = Auth::Key(TRUSTED_KEY.into());
    let media = GateField::MediaIoKwargs;
    let mm = GateField::MmProcessorKwargs;
    let too_many_frames = json!({"video": {"num_frames": 1000}});
    vec![
        Case::single(
            "profile hashed trusted key may send mm_processor_kwargs",
            RequestSpec::post_json(
                Route::Chat.path(),
                body(Route::Chat, chat, mm, json!({"num_crops": 4})),
            )
            .with_auth(Auth::Key(HASHED_KEY.into())),
            routes::chat_completion(),
        ),
        Case::single(
            "profile trusted key, video num_frames above the bound: 400 naming it",
            RequestSpec::post_json(
                Route::Chat.path(),
                body(Route::Chat, chat, media, too_many_frames.clone()),
            )
            .with_auth(trusted.clone()),
            bound_violation(media, &["num_frames", "64"]),
        ),
        Case::single(
            "profile trusted key on embeddings, video num_frames above the bound: 400",
            RequestSpec::post_json(
                Route::Embeddings.path(),
                body(Route::Embeddings, embed, media, too_many_frames.clone()),
            )
            .with_auth(trusted.clone()),
            bound_violation(media, &["num_frames", "64"]),
        ),
        Case::single(
            "profile trusted key, unlisted video key: 400 naming it",
            RequestSpec::post_json(
                Route::Chat.path(),
                body(
                    Route::Chat,
                    chat,
                    media,
                    json!({"video": {"decoder_threads": 64}}),
                ),
            )
            .with_auth(trusted.clone()),
            bound_violation(media, &["decoder_threads"]),
        ),
        Case::single(
            "profile trusted key, num_crops above the bound: 400 naming it",
            RequestSpec::post_json(
                Route::Chat.path(),
                body(Route::Chat, chat, mm, json!({"num_crops": 99})),
            )
            .with_auth(trusted),
            bound_violation(mm, &["num_crops", "16"]),
        ),
        Case::single(
            "profile untrusted key, out-of-bounds kwargs: still the gate's refusal",
            RequestSpec::post_json(
                Route::Chat.path(),
                body(Route::Chat, chat, media, too_many_frames),
            )
            .with_auth(Auth::Key(UNTRUSTED_KEY.into())),
            Expect::gate_rejection(media),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_deployment_meets_the_contract() {
    let dir = must(TempDir::new("profile"));
    let policy_path = must(dir.write("policy.yaml", &policy()));
    let policy_arg = policy_path.display().to_string();
    let gateway = must(
        Gateway::start(&[
            "--api-key",
            UNTRUSTED_KEY,
            "--trusted-client-policy",
            &policy_arg,
        ])
        .await,
    );
    let mut cfg = SuiteConfig::new(&gateway.base_url);
    cfg.mode = ServerMode::Profile {
        trusted_key: TRUSTED_KEY.into(),
        untrusted_key: UNTRUSTED_KEY.into(),
    };
    let mut report = contract::run(&cfg).await;
    for label in ["gate[trusted-key]", "gate[untrusted-key]", "auth "] {
        assert!(
            report.cases.iter().any(|case| case.name.starts_with(label)),
            "no {label} cases ran"
        );
    }

    let client = must(
        Client::new(
            &gateway.base_url,
            Some(UNTRUSTED_KEY.into()),
            Duration::from_secs(60),
        )
        .map_err(|err| err.to_string()),
    );
    let models = contract::models::discover(&client, &cfg).await;
    let chat = models.chat.clone().unwrap_or_default();
    let embed = models.embedding.clone().unwrap_or_default();
    let extra = contract::runner::run_cases(&client, bounds_cases(&chat, &embed), 4).await;
    report.cases.extend(extra.cases);
    assert_report(&report, "trusted-client profile");
}
