//! `--config FILE` (YAML, flag names as keys) supplies values; flags on the command line
//! override them.

mod common;

use std::time::Duration;

use common::{assert_report, must, Gateway, TempDir};
use contract::cases::{set, Case};
use contract::expect::{Expect, GateField};
use contract::http::{Client, RequestSpec};
use contract::routes::{self, Route};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_applies_and_flags_override_it() {
    let dir = must(TempDir::new("config"));
    let config = must(dir.write(
        "gateway.yaml",
        "trust-request-mm-kwargs: true\nmax-logprobs: 5\n",
    ));
    let config_arg = config.display().to_string();
    let gateway = must(Gateway::start(&["--config", &config_arg, "--max-logprobs", "3"]).await);
    let client = must(
        Client::new(&gateway.base_url, None, Duration::from_secs(60))
            .map_err(|err| err.to_string()),
    );
    let cfg = contract::SuiteConfig::new(&gateway.base_url);
    let models = contract::models::discover(&client, &cfg).await;
    let chat = models.chat.clone().unwrap_or_default();
    let with_logprobs = |n: u64| {
        set(
            set(Route::Chat.body(&chat), "logprobs", json!(true)),
            "top_logprobs",
            json!(n),
        )
    };
    let cases = vec![
        Case::single(
            "config trust-request-mm-kwargs: true lets kwargs through",
            RequestSpec::post_json(
                Route::Chat.path(),
                set(
                    Route::Chat.body(&chat),
                    GateField::MmProcessorKwargs.name(),
                    json!({"num_crops": 4}),
                ),
            ),
            routes::chat_completion(),
        ),
        Case::single(
            "config max-logprobs 5 overridden by --max-logprobs 3: top_logprobs 4 refused",
            RequestSpec::post_json(Route::Chat.path(), with_logprobs(4)),
            Expect::bad_request("top_logprobs"),
        ),
        Case::single(
            "config --max-logprobs 3: top_logprobs 3 accepted",
            RequestSpec::post_json(Route::Chat.path(), with_logprobs(3)),
            routes::chat_completion(),
        ),
    ];
    let report = contract::runner::run_cases(&client, cases, 3).await;
    assert_report(&report, "--config");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_trust_flag_wins() {
    let gateway =
        must(Gateway::start(&["--trust-request-mm-kwargs", "--no-trust-request-mm-kwargs"]).await);
    let client = must(
        Client::new(&gateway.base_url, None, Duration::from_secs(60))
            .map_err(|err| err.to_string()),
    );
    let cfg = contract::SuiteConfig::new(&gateway.base_url);
    let models = contract::models::discover(&client, &cfg).await;
    let chat = models.chat.clone().unwrap_or_default();
    let embed = models.embedding.clone().unwrap_or_default();
    let cases = vec![
        Case::single(
            "--no-trust-request-mm-kwargs after --trust-request-mm-kwargs: chat refused",
            RequestSpec::post_json(
                Route::Chat.path(),
                set(
                    Route::Chat.body(&chat),
                    GateField::MmProcessorKwargs.name(),
                    json!({"num_crops": 4}),
                ),
            ),
            Expect::gate_rejection(GateField::MmProcessorKwargs),
        ),
        Case::single(
            "--no-trust-request-mm-kwargs after --trust-request-mm-kwargs: embeddings refused",
            RequestSpec::post_json(
                Route::Embeddings.path(),
                set(
                    Route::Embeddings.body(&embed),
                    GateField::MediaIoKwargs.name(),
                    json!({"video": {}}),
                ),
            ),
            Expect::gate_rejection(GateField::MediaIoKwargs),
        ),
    ];
    let report = contract::runner::run_cases(&client, cases, 2).await;
    assert_report(&report, "--no-trust-request-mm-kwargs");
}
