//! A real request per served model, with its output checked: a generating model answers a
//! chat (or, without a chat template, a completion) with non-empty text in the right shape; an
//! embedding model returns one finite, non-zero vector per input, all of the size it states
//! (`embedding_size` on this server's model cards; where a deployment states none, the
//! vectors must at least agree with each other).

use contract::expect::summarize;
use contract::http::{Client, Reply, RequestSpec};
use contract::models::Models;
use serde_json::{json, Value};

use super::rows::{Row, Status};

const SECTION: &str = "output";

/// One row per model the deployment lists.
pub async fn rows(client: &Client, models: &Models, listing: &Value) -> Vec<Row> {
    let mut rows = Vec::new();
    for card in &models.cards {
        let id = card.id.as_str();
        let row = if card.generates() {
            Row::judged(SECTION, id, generate(client, id).await)
        } else if card.embeds() {
            let stated = listing
                .get("data")
                .and_then(Value::as_array)
                .and_then(|cards| cards.iter().find(|c| c.get("id") == Some(&json!(id))))
                .and_then(|c| c.get("embedding_size"))
                .and_then(Value::as_u64);
            Row::judged(SECTION, id, embed(client, id, stated).await)
        } else {
            Row::new(
                SECTION,
                id,
                Status::Skip,
                format!("no output check for tasks {:?}", card.tasks),
            )
        };
        rows.push(row);
    }
    rows
}

async fn post(client: &Client, path: &str, body: Value) -> Result<Reply, String> {
    client
        .send(&RequestSpec::post_json(path, body))
        .await
        .map_err(|e| format!("POST {path}: {e}"))
}

/// Chat, else completion: non-empty text, the object and id the route promises, a finish
/// reason and at least one completion token counted.
async fn generate(client: &Client, model: &str) -> Result<String, String> {
    let chat = json!({
        "model": model,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 8,
        "temperature": 0,
    });
    let reply = post(client, "/v1/chat/completions", chat).await?;
    if reply.status == 200 {
        return text_answer(
            &reply,
            "chat.completion",
            "chatcmpl-",
            "/choices/0/message/content",
        )
        .map(|text| format!("chat answered {text:?}"));
    }
    let chat_error = summarize(&reply);
    let completion = json!({
        "model": model,
        "prompt": "The colour of the sky is",
        "max_tokens": 8,
        "temperature": 0,
    });
    let reply = post(client, "/v1/completions", completion).await?;
    if reply.status != 200 {
        return Err(format!(
            "chat answered {chat_error}; completion answered {}",
            summarize(&reply)
        ));
    }
    text_answer(&reply, "text_completion", "cmpl-", "/choices/0/text")
        .map(|text| format!("completion answered {text:?} (chat: {chat_error})"))
}

fn text_answer(
    reply: &Reply,
    object: &str,
    id_prefix: &str,
    text_at: &str,
) -> Result<String, String> {
    let json = reply.json.as_ref().ok_or("the body is not JSON")?;
    let at = |pointer: &str| json.pointer(pointer);
    if at("/object").and_then(Value::as_str) != Some(object) {
        return Err(format!("object {:?}, expected {object:?}", at("/object")));
    }
    if !at("/id")
        .and_then(Value::as_str)
        .is_some_and(|id| id.starts_with(id_prefix))
    {
        return Err(format!(
            "id {:?} does not start with {id_prefix}",
            at("/id")
        ));
    }
    if !at("/choices/0/finish_reason").is_some_and(Value::is_string) {
        return Err("no finish_reason".into());
    }
    if at("/usage/completion_tokens")
        .and_then(Value::as_u64)
        .is_none_or(|n| n == 0)
    {
        return Err(format!(
            "usage.completion_tokens {:?}, expected at least 1",
            at("/usage/completion_tokens")
        ));
    }
    match at(text_at).and_then(Value::as_str) {
        Some(text) if !text.trim().is_empty() => Ok(text.to_string()),
        other => Err(format!("{text_at} is {other:?}: no text")),
    }
}

/// Two inputs of different lengths: two vectors of one size (the stated one, when stated).
async fn embed(client: &Client, model: &str, stated: Option<u64>) -> Result<String, String> {
    let body = json!({
        "model": model,
        "input": ["A colour.", "The sky over the harbour was the colour of the sea."],
        "encoding_format": "float",
    });
    let reply = post(client, "/v1/embeddings", body).await?;
    if reply.status != 200 {
        return Err(format!("embeddings answered {}", summarize(&reply)));
    }
    let data = reply
        .json
        .as_ref()
        .and_then(|j| j.get("data"))
        .and_then(Value::as_array)
        .ok_or("no data list")?;
    if data.len() != 2 {
        return Err(format!("{} vectors for 2 inputs", data.len()));
    }
    let mut sizes = Vec::new();
    for item in data {
        let vector: Vec<f64> = item
            .get("embedding")
            .and_then(Value::as_array)
            .ok_or("an item without an embedding list")?
            .iter()
            .map(|x| x.as_f64().filter(|x| x.is_finite()))
            .collect::<Option<_>>()
            .ok_or("an embedding with a value that is not a finite number")?;
        if vector.iter().all(|x| *x == 0.0) {
            return Err(format!("an all-zero vector of {}", vector.len()));
        }
        sizes.push(vector.len() as u64);
    }
    match (sizes.as_slice(), stated) {
        ([a, b], _) if a != b => Err(format!("vectors of {a} and {b} values")),
        ([a, _], Some(stated)) if *a != stated => Err(format!(
            "vectors of {a} values; the model card states embedding_size {stated}"
        )),
        ([a, _], Some(_)) => Ok(format!("2 vectors of the stated {a} values")),
        ([a, _], None) => Ok(format!(
            "2 vectors of {a} values (the deployment states no size)"
        )),
        _ => Err("no vectors".into()),
    }
}
