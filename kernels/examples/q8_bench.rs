//! One quantised matmul, f32 activations against q8 activations, interleaved call by call so
//! that both see the same machine load. Prints the best and mean time of each.
//!
//! ```text
//! cargo run --release -p kernels --example q8_bench -- \
//!     [ROWS] [COLS] [REPS] [TYPE] [M] [THREADS] [q8]
//! ```
//! TYPE is any quantised type by name (`q4_1`, `q4_k`, `iq4_xs`, ...). Defaults: 1536 x 576
//! (SmolLM2's FFN up), 200 reps, Q4_1, one activation row, one thread. The K-quants need COLS a
//! multiple of 256 (SmolLM2's FFN down: 576 x 1536).
//! `KERNELS_CPU_LEVEL=scalar|avx2|avxvnni|avx512|avx512vnni` caps the kernels' level;
//! Q4_K, Q5_K, Q6_K and IQ4_XS weights are interleaved as loaders do
//! (`KERNELS_INTERLEAVE=never|always` overrides).

use std::time::Instant;

use kernels::{interleave_rows, matmul, matmul_q8, DType, QMatrix};

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> Result<T, String> {
    args.get(i).map_or(Ok(default), |v| {
        v.parse()
            .map_err(|_| format!("argument {i}: cannot parse '{v}'"))
    })
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = arg(&args, 1, 1536)?;
    let k: usize = arg(&args, 2, 576)?;
    let reps: usize = arg(&args, 3, 200)?;
    let dtype = match args.get(4) {
        None => DType::Q4_1,
        Some(name) => DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| format!("unknown type {name}"))?,
    };
    let m: usize = arg(&args, 5, 1)?;
    let threads: usize = arg(&args, 6, 1)?;
    // `q8` as the seventh argument times the integer path alone (for `perf stat`).
    let q8_only = args.get(7).is_some_and(|a| a == "q8");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| e.to_string())?;
    // Deterministic bytes. The leading scales of the 32-weight types are kept small and finite
    // (f16 0x2020 ≈ 0.0083); the super-block types' scales take the pattern, which may make
    // some outputs inf or NaN without changing the time.
    let bytes: Vec<u8> = (0..n * dtype.row_bytes(k))
        .map(|i| {
            let head = if dtype == DType::Q4_1 { 4 } else { 2 };
            if i % dtype.block_bytes() < head {
                0x20
            } else {
                (i * 37 % 251) as u8
            }
        })
        .collect();
    let interleave = kernels::interleaving_pays(dtype);
    let mut packed = vec![0u8; bytes.len()];
    let w = if interleave {
        interleave_rows(dtype, n, k, &bytes, &mut packed).map_err(|e| e.to_string())?;
        QMatrix::interleaved(dtype, n, k, &packed)
    } else {
        QMatrix::new(dtype, n, k, &bytes)
    }
    .map_err(|e| e.to_string())?;
    let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut out = vec![0f32; m * n];
    let (mut best, mut total) = ([f64::MAX; 2], [0f64; 2]);
    pool.install(|| -> Result<(), String> {
        for _ in 0..reps {
            for (i, best_i) in best.iter_mut().enumerate() {
                if q8_only && i == 0 {
                    continue;
                }
                let t = Instant::now();
                if i == 0 {
                    matmul(&x, m, &w, &mut out, false)
                } else {
                    matmul_q8(&x, m, &w, &mut out, false)
                }
                .map_err(|e| e.to_string())?;
                let e = t.elapsed().as_secs_f64();
                *best_i = best_i.min(e);
                total[i] += e;
            }
        }
        Ok(())
    })?;
    let blocks = (n * k / 32) as f64;
    for (i, name) in ["f32", "q8"].iter().enumerate() {
        println!(
            "{name} activations, {dtype} {n}x{k}{}, m={m}, {threads} thread(s), {}: best {:.1} us \
             ({:.2} ns/weight block, {:.1} GB/s of weights), mean {:.1} us",
            if interleave { " interleaved" } else { "" },
            kernels::cpu_level(),
            best[i] * 1e6,
            best[i] * 1e9 / blocks / m as f64,
            (n * dtype.row_bytes(k)) as f64 / best[i] / 1e9,
            total[i] / reps as f64 * 1e6
        );
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("q8_bench: {e}");
        std::process::exit(1);
    }
}
