//! Generation options whose effect the case can see (CONTRACT sections 4-5). Each case first
//! asks for a greedy baseline reply that ends on its own (EOS before `max_tokens`), then
//! repeats the request with one option and checks how the reply changed relative to the
//! baseline, so a server that accepts an option and ignores it fails.

use serde_json::{json, Value};

use super::{set, Case, Ctx, FlowOutcome};
use crate::expect::summarize;
use crate::http::{Client, Reply, RequestSpec};
use crate::routes::Route;

/// A chat prompt small instruct models answer in a few tokens and then end with EOS.
const SHORT_ANSWER_PROMPT: &str = "Hi";
/// Room for the baseline answer; it must end (finish_reason "stop") well before this.
const BASELINE_MAX_TOKENS: u64 = 40;

/// The greedy reply to [`SHORT_ANSWER_PROMPT`].
#[derive(Debug, Clone)]
struct Baseline {
    text: String,
    tokens: u64,
}

fn chat_body(model: &str) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": SHORT_ANSWER_PROMPT}],
        "max_tokens": BASELINE_MAX_TOKENS,
        "temperature": 0
    })
}

/// What the cases read from a chat completion.
#[derive(Debug)]
struct Answer {
    text: String,
    finish_reason: String,
    stop_reason: Value,
    completion_tokens: u64,
}

fn answer(reply: &Reply) -> Result<Answer, String> {
    let json = reply
        .json
        .as_ref()
        .filter(|_| reply.status == 200)
        .ok_or_else(|| format!("expected a 200 chat completion, got {}", summarize(reply)))?;
    let choice = json.pointer("/choices/0").ok_or("no choices[0]")?;
    let number = |path: &str| {
        json.pointer(path)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("no number at {path}"))
    };
    Ok(Answer {
        text: choice
            .pointer("/message/content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        stop_reason: choice.get("stop_reason").cloned().unwrap_or(Value::Null),
        completion_tokens: number("/usage/completion_tokens")?,
    })
}

async fn chat(client: &Client, body: Value) -> Result<Answer, String> {
    let reply = client
        .send(&RequestSpec::post_json(Route::Chat.path(), body))
        .await
        .map_err(|err| err.to_string())?;
    answer(&reply)
}

async fn baseline(client: &Client, model: &str) -> Result<Baseline, String> {
    let got = chat(client, chat_body(model)).await?;
    if got.finish_reason != "stop" || got.completion_tokens < 4 {
        return Err(format!(
            "the baseline reply to {SHORT_ANSWER_PROMPT:?} must end with EOS after at least 4 \
             tokens to show an option's effect; got finish_reason {:?} after {} tokens",
            got.finish_reason, got.completion_tokens
        ));
    }
    Ok(Baseline {
        text: got.text,
        tokens: got.completion_tokens,
    })
}

/// Runs `check` against the baseline and turns its verdict into the case's outcome.
async fn with_baseline<F, Fut>(client: Client, model: String, check: F) -> FlowOutcome
where
    F: FnOnce(Client, String, Baseline) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let result = match baseline(&client, &model).await {
        Ok(base) => check(client, model, base).await,
        Err(why) => Err(why),
    };
    match result {
        Ok(got) => FlowOutcome {
            got,
            failures: Vec::new(),
        },
        Err(why) => FlowOutcome {
            got: why.clone(),
            failures: vec![why],
        },
    }
}

async fn min_tokens(client: Client, model: String, base: Baseline) -> Result<String, String> {
    let wanted = base.tokens + 5;
    let got = chat(&client, set(chat_body(&model), "min_tokens", json!(wanted))).await?;
    if got.completion_tokens < wanted {
        return Err(format!(
            "min_tokens={wanted}: {} tokens (the baseline ended with EOS after {})",
            got.completion_tokens, base.tokens
        ));
    }
    Ok(format!(
        "baseline {} tokens, min_tokens={wanted} gave {}",
        base.tokens, got.completion_tokens
    ))
}

/// A two-character stop string early in the baseline text (where greedy tokens are the most
/// confident, so batch-dependent rounding does not change them), with the byte offset of its
/// first occurrence.
fn stop_string(text: &str) -> Option<(String, usize)> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    (2..chars.len().saturating_sub(2)).find_map(|start| {
        let (at, _) = chars[start];
        let end = chars.get(start + 2).map_or(text.len(), |(i, _)| *i);
        let candidate = &text[at..end];
        (!candidate.trim().is_empty() && text.find(candidate) == Some(at))
            .then(|| (candidate.to_string(), at))
    })
}

async fn stop_strings(client: Client, model: String, base: Baseline) -> Result<String, String> {
    let (stop, at) = stop_string(&base.text)
        .ok_or_else(|| format!("no usable stop string in the baseline {:?}", base.text))?;
    let body = set(chat_body(&model), "stop", json!([stop]));
    let cut = chat(&client, body.clone()).await?;
    let mut failures = Vec::new();
    if cut.text != base.text[..at] {
        failures.push(format!(
            "stop={stop:?}: text {:?}, expected {:?}",
            cut.text,
            &base.text[..at]
        ));
    }
    if cut.finish_reason != "stop" || cut.stop_reason != json!(stop) {
        failures.push(format!(
            "stop={stop:?}: finish_reason {:?} stop_reason {}, expected \"stop\" and the string",
            cut.finish_reason, cut.stop_reason
        ));
    }
    let kept = chat(
        &client,
        set(body, "include_stop_str_in_output", json!(true)),
    )
    .await?;
    let expected = &base.text[..at + stop.len()];
    if kept.text != expected {
        failures.push(format!(
            "include_stop_str_in_output: text {:?}, expected {expected:?}",
            kept.text
        ));
    }
    if failures.is_empty() {
        Ok(format!("stop={stop:?} cut the reply to {:?}", cut.text))
    } else {
        Err(failures.join("; "))
    }
}

async fn stop_token_ids(client: Client, model: String, base: Baseline) -> Result<String, String> {
    let reply = client
        .send(&RequestSpec::post_json(
            "/tokenize",
            json!({"model": model, "prompt": base.text, "add_special_tokens": false}),
        ))
        .await
        .map_err(|err| err.to_string())?;
    let ids: Vec<u64> = reply
        .json
        .as_ref()
        .and_then(|json| json.get("tokens"))
        .and_then(Value::as_array)
        .map(|tokens| tokens.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let stop_id = *ids
        .get(2)
        .ok_or_else(|| format!("/tokenize of the baseline gave {}", summarize(&reply)))?;
    let got = chat(
        &client,
        set(chat_body(&model), "stop_token_ids", json!([stop_id])),
    )
    .await?;
    if got.completion_tokens >= base.tokens
        || got.finish_reason != "stop"
        || got.stop_reason != json!(stop_id)
    {
        return Err(format!(
            "stop_token_ids=[{stop_id}]: {} tokens, finish_reason {:?}, stop_reason {} (the \
             baseline had {} tokens)",
            got.completion_tokens, got.finish_reason, got.stop_reason, base.tokens
        ));
    }
    Ok(format!(
        "stop_token_ids=[{stop_id}] ended after {} tokens",
        got.completion_tokens
    ))
}

/// The reply's text and the concatenation of its logprob tokens (which always show special
/// tokens).
async fn text_and_tokens(client: &Client, body: Value) -> Result<(String, String), String> {
    let reply = client
        .send(&RequestSpec::post_json(Route::Chat.path(), body))
        .await
        .map_err(|err| err.to_string())?;
    let text = answer(&reply)?.text;
    let tokens = reply
        .json
        .as_ref()
        .and_then(|json| json.pointer("/choices/0/logprobs/content"))
        .and_then(Value::as_array)
        .map(|steps| {
            steps
                .iter()
                .filter_map(|step| step.get("token").and_then(Value::as_str))
                .collect::<String>()
        })
        .ok_or_else(|| format!("no logprobs content in {}", summarize(&reply)))?;
    Ok((text, tokens))
}

async fn skip_special_tokens(
    client: Client,
    model: String,
    base: Baseline,
) -> Result<String, String> {
    // Past EOS (ignore_eos) the reply goes on through the template's special tokens; each
    // reply is checked against its own tokens, so batch-dependent rounding cannot flip it.
    let body = set(
        set(
            set(chat_body(&model), "ignore_eos", json!(true)),
            "max_tokens",
            json!(base.tokens + 4),
        ),
        "logprobs",
        json!(true),
    );
    let (shown, shown_tokens) = text_and_tokens(
        &client,
        set(body.clone(), "skip_special_tokens", json!(false)),
    )
    .await?;
    let (skipped, skipped_tokens) =
        text_and_tokens(&client, set(body, "skip_special_tokens", json!(true))).await?;
    let mut failures = Vec::new();
    if shown != shown_tokens {
        failures.push(format!(
            "skip_special_tokens=false: text {shown:?} is not its tokens {shown_tokens:?}"
        ));
    }
    if skipped.len() >= skipped_tokens.len() {
        failures.push(format!(
            "skip_special_tokens=true: text {skipped:?} still shows every token of \
             {skipped_tokens:?}"
        ));
    }
    if failures.is_empty() {
        Ok(format!("shown {shown:?}, skipped {skipped:?}"))
    } else {
        Err(failures.join("; "))
    }
}

macro_rules! effect_case {
    ($model:expr, $name:expr, $expected:expr, $check:path) => {{
        let model = $model.clone();
        Case::flow(
            $name,
            Route::Chat.route(),
            $expected,
            Box::new(move |client| Box::pin(with_baseline(client, model, $check))),
        )
    }};
}

pub fn cases(ctx: &Ctx) -> Vec<Case> {
    let model = match ctx.chat_model() {
        Ok(model) => model,
        Err(why) => {
            return vec![Case::decided(
                "effects generation options",
                Route::Chat.route(),
                "a generation model",
                Err(why),
            )]
        }
    };
    vec![
        effect_case!(
            model,
            "effects chat min_tokens holds EOS back",
            "at least min_tokens tokens where the baseline ended earlier",
            min_tokens
        ),
        effect_case!(
            model,
            "effects chat stop string cuts the reply; include_stop_str_in_output keeps it",
            "the baseline cut before the stop string, stop_reason = the string",
            stop_strings
        ),
        effect_case!(
            model,
            "effects chat stop_token_ids ends at the token",
            "fewer tokens than the baseline, stop_reason = the token id",
            stop_token_ids
        ),
        effect_case!(
            model,
            "effects chat skip_special_tokens=false shows special tokens",
            "past EOS the special tokens' text appears only with skip_special_tokens=false",
            skip_special_tokens
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_is_an_early_first_occurrence() {
        let text = "Hello! How can I assist you today?";
        let (stop, at) = stop_string(text).expect("a stop string");
        assert_eq!(text.find(&stop), Some(at));
        assert_eq!((stop.as_str(), at), ("ll", 2));
        assert!(stop_string("ab").is_none());
    }
}
