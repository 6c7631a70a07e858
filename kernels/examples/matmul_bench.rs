//! Micro-benchmark of the matmul paths: `cargo run --release -p kernels --example matmul_bench`.
//! Prints per-shape time per call (process CPU time, so it is meaningful on a busy machine).

use std::time::Instant;

use kernels::{matmul, DType, QMatrix};

/// Process CPU seconds (user + system) from /proc, or wall-clock-free fallback of 0.
fn cpu_seconds() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which is in parentheses).
    let Some(rest) = s.rsplit(')').next() else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build();
    let Ok(pool) = pool else {
        eprintln!("thread pool failed");
        return;
    };
    let shapes = [
        (DType::Q4_1, 64usize, 576usize),
        (DType::Q4_1, 1536, 576),
        (DType::Q4_1, 576, 1536),
        (DType::Q8_0, 49152, 576),
    ];
    for (dtype, n, k) in shapes {
        let bytes: Vec<u8> = (0..n * dtype.row_bytes(k))
            .map(|i| (i * 31 % 251) as u8 & 0x3F)
            .collect();
        let Ok(w) = QMatrix::new(dtype, n, k, &bytes) else {
            eprintln!("bad shape");
            return;
        };
        for m in [1usize, 4, 16, 128] {
            let x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 * 0.01).collect();
            let mut out = vec![0f32; m * n];
            let reps = (2_000_000_000 / (n * k * m)).clamp(3, 2000);
            let (c0, t0) = (cpu_seconds(), Instant::now());
            pool.install(|| {
                for _ in 0..reps {
                    let _ = matmul(&x, m, &w, &mut out, false);
                }
            });
            let cpu = (cpu_seconds() - c0) / reps as f64;
            let wall = t0.elapsed().as_secs_f64() / reps as f64;
            let gmac = (n * k * m) as f64 / cpu / 1e9;
            println!(
                "{dtype} {n}x{k} m={m}: cpu {:.3} ms/call, wall {:.3} ms, {gmac:.2} GMAC/s per core",
                cpu * 1e3,
                wall * 1e3
            );
        }
    }
}
