//! The machine's f32 multiply-add ceiling, for reading the encoder's GEMM figures against:
//! each thread runs independent chains of fused multiply-adds (12 accumulators, more than
//! enough to hide the FMA latency, and few enough that with the two constants they fit in
//! AVX2's 16 registers without spilling) with the widest vectors the CPU has (AVX-512, else AVX2),
//! on 1 and then on N threads at once. On a VM whose vCPUs are hyperthreads of one core the
//! N-thread figure is about the 1-thread one, not N times it.
//!
//! Run: `cargo run --release -p engine --example fma_peak -- [--threads N] [--seconds S]`
//! Prints one JSON line: GFLOP/s per thread count and the vector width used.

use std::time::Instant;

/// Multiply-adds per accumulator per timed block.
const BLOCK: u64 = 1 << 20;
/// Independent accumulators per thread.
const ACC: usize = 12;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ACC, BLOCK};
    use std::arch::x86_64::*;

    /// `blocks` blocks of [`ACC`] independent FMA chains of 16 lanes; returns a value that
    /// depends on every result (so nothing is optimised away).
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn run_avx512(blocks: u64) -> f32 {
        let mut acc = [_mm512_set1_ps(0.5); ACC];
        let (m, a) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        for _ in 0..blocks * BLOCK {
            for v in acc.iter_mut() {
                *v = _mm512_fmadd_ps(*v, m, a);
            }
        }
        acc.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
    }

    /// As [`run_avx512`] with 8-lane vectors.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn run_avx2(blocks: u64) -> f32 {
        let mut acc = [_mm256_set1_ps(0.5); ACC];
        let (m, a) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
        for _ in 0..blocks * BLOCK {
            for v in acc.iter_mut() {
                *v = _mm256_fmadd_ps(*v, m, a);
            }
        }
        let mut sum = 0.0;
        for v in acc {
            let mut lanes = [0.0f32; 8];
            // SAFETY: `lanes` holds the 8 floats the store writes.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
            sum += lanes.iter().sum::<f32>();
        }
        sum
    }
}

/// Runs `blocks` timed blocks on one thread.
type Runner = fn(u64) -> f32;

/// The vector width in floats and a runner, or `None` without AVX2/FMA.
fn kernel() -> Option<(usize, Runner)> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected just above.
            return Some((16, |b| unsafe { x86::run_avx512(b) }));
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX2 and FMA were detected just above.
            return Some((8, |b| unsafe { x86::run_avx2(b) }));
        }
    }
    None
}

/// GFLOP/s of `threads` threads each running `blocks` blocks.
fn measure(run: Runner, lanes: usize, threads: usize, blocks: u64) -> f64 {
    let start = Instant::now();
    let sums: Vec<f32> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(move || run(blocks))).collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let secs = start.elapsed().as_secs_f64();
    assert!(sums.iter().all(|v| v.is_finite()), "FMA chains diverged");
    let flops = threads as f64 * (blocks * BLOCK) as f64 * (ACC * lanes * 2) as f64;
    flops / secs / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let threads = arg("--threads").map_or(2, |t| t.max(1.0) as usize);
    let seconds = arg("--seconds").unwrap_or(2.0).max(0.1);
    let Some((lanes, run)) = kernel() else {
        eprintln!("fma_peak: this CPU has neither AVX-512F nor AVX2+FMA");
        std::process::exit(2);
    };
    // Size the run from a short calibration so that each measurement takes about `seconds`.
    let probe = measure(run, lanes, 1, 4);
    let per_block = (BLOCK * (ACC * lanes * 2) as u64) as f64 / (probe * 1e9);
    let blocks = ((seconds / per_block) as u64).max(1);
    let one = measure(run, lanes, 1, blocks);
    let many = measure(run, lanes, threads, blocks);
    println!(
        "{{\"vector_floats\": {lanes}, \"gflops_1_thread\": {one:.1}, \"threads\": {threads}, \"gflops_n_threads\": {many:.1}, \"scaling\": {:.2}}}",
        many / one
    );
}
