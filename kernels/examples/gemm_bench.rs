//! Micro-benchmark of the encoder's packed f32 GEMM on one thread, at the shapes of a
//! MiniLM-L6 layer (hidden 384, intermediate 1536) over a chunk of tokens, with the epilogues
//! the encoder uses: `cargo run --release -p kernels --example gemm_bench -- [ROWS]`.
//! Prints GFLOP/s per shape, from process CPU time (meaningful on a busy machine) and wall time,
//! to read against `fma_peak`'s one-thread ceiling.

use std::time::Instant;

use kernels::{gemm_packed_post, Activation, Epilogue, PackedB};

/// Process CPU seconds (user + system) from /proc, or 0 where it cannot be read.
fn cpu_seconds() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let Some(rest) = s.rsplit(')').next() else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let m: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1140);
    let shapes = [
        ("qkv", 384usize, 1152usize, None),
        ("attn_out", 384, 384, None),
        ("up", 384, 1536, None),
        ("up+gelu", 384, 1536, Some(Activation::GeluErf)),
        ("down", 1536, 384, None),
    ];
    let (mut flops_all, mut cpu_all) = (0.0, 0.0);
    for (name, k, n, act) in shapes {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 13) % 89) as f32 / 440.0 - 0.1)
            .collect();
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let bias: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.1).collect();
        let b = PackedB::from_linear(&w, n, k);
        let mut out = vec![0f32; m * n];
        let post = Epilogue {
            bias: Some(&bias),
            act,
        };
        let flops = 2.0 * (m * n * k) as f64;
        let reps = (100e9 / flops).clamp(3.0, 5000.0) as usize;
        let _ = gemm_packed_post(m, &x, k, &b, &mut out, n, post, false);
        let (c0, t0) = (cpu_seconds(), Instant::now());
        for _ in 0..reps {
            if let Err(e) = gemm_packed_post(m, &x, k, &b, &mut out, n, post, false) {
                eprintln!("{e}");
                return;
            }
        }
        let cpu = cpu_seconds() - c0;
        let wall = t0.elapsed().as_secs_f64();
        flops_all += flops * reps as f64;
        cpu_all += cpu;
        println!(
            "{name:9} m={m} k={k} n={n}: {:.1} GFLOP/s (cpu), {:.1} (wall)",
            flops * reps as f64 / cpu / 1e9,
            flops * reps as f64 / wall / 1e9
        );
    }
    println!("all: {:.1} GFLOP/s (cpu)", flops_all / cpu_all / 1e9);
}
