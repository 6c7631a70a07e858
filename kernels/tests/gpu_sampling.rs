//! `sampling.cu` against the sampler's semantics as [`kernels::sampling`] writes them (the
//! functions the engine's CPU sampler runs).
//!
//! Tokens must match exactly, except where the reference's draw target (or top_p limit) lies
//! within 1e-9 (relative) of a boundary between two candidates: the kernel sums the same f64
//! weights in another order, so such a row may legitimately land on the neighbour. Such a row
//! must take a token the reference gives with the target or limit moved by that margin; those
//! rows are counted and must be rare. Everything else (greedy, top_k, min_p, penalties, masks,
//! the top logprobs' ids) is exact, and logprobs agree to 1e-5.
#![cfg(feature = "emu")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "gpu/util.rs"]
mod util;

use kernels::gpu::ops::{
    SampleFailure, SampleParams, SampleRow, SampledRow, Sampler, GREEDY_EPS, MAX_LOGPROBS,
};
use kernels::gpu::Gpu;
use kernels::sampling::{self as semantics, argmax, top_k_indices, Probe};
use util::*;

checks!(
    sample_small_vocab,
    sample_large_vocab,
    greedy_and_logprobs,
    failing_rows_leave_others_alone,
    repeated_penalty_entries_merge,
    block_sizes_agree
);

// ---------------------------------------------------------------------------------------------
// The CPU reference (engine/src/sampling.rs).

fn raw_logprob_of(raw: &[f32], id: u32) -> f32 {
    semantics::logprob(
        raw[id as usize],
        semantics::log_normaliser(raw).expect("a finite logit"),
    )
}

/// The path a row took, for the coverage counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Path {
    Greedy,
    IdOrder,
    Sorted,
    TopPCut,
}

#[derive(Debug)]
struct Expected {
    outcome: Result<SampledRow, SampleFailure>,
    /// The draw (or top_p cut) is within rounding of a candidate boundary.
    ambiguous: bool,
    /// When ambiguous: the tokens on either side of the boundary.
    accept: Vec<u32>,
    paths: Vec<Path>,
}

/// `SequenceSampler::sample` for one row, its state given as the row's penalty entries and
/// masked ids.
fn reference(raw: &[f32], row: &SampleRow) -> Expected {
    let p = &row.params;
    let fail = |f| Expected {
        outcome: Err(f),
        ambiguous: false,
        accept: Vec::new(),
        paths: Vec::new(),
    };
    let vocab = raw.len();
    let logprobs = match p.logprobs {
        Some(k) => match semantics::log_normaliser(raw) {
            None => return fail(SampleFailure::NoFiniteLogit),
            Some(norm) => {
                let top: Vec<(u32, f32)> = top_k_indices(raw, k)
                    .into_iter()
                    .map(|(id, _)| (id, semantics::logprob(raw[id as usize], norm)))
                    .collect();
                Some((norm, top))
            }
        },
        None => None,
    };
    let mut logits = raw.to_vec();
    semantics::mask(&mut logits, row.masked.iter().copied());
    semantics::apply_penalties(&mut logits, p, &row.penalties);
    let mut accept = Vec::new();
    let (token, ambiguous, paths) = if p.temperature < GREEDY_EPS {
        (argmax(&logits), false, vec![Path::Greedy])
    } else {
        let probe = Probe {
            check_boundaries: true,
            ..Probe::default()
        };
        let d = semantics::draw_probed(&mut logits.clone(), p, row.uniform, probe);
        if d.near_boundary {
            // The tokens a target or limit moved by the margin would give.
            for a in [1.0 - 1e-9, 1.0, 1.0 + 1e-9] {
                for b in [1.0 - 1e-9, 1.0, 1.0 + 1e-9] {
                    let moved = Probe {
                        top_p_scale: a,
                        target_scale: b,
                        check_boundaries: false,
                    };
                    let t = semantics::draw_probed(&mut logits.clone(), p, row.uniform, moved);
                    accept.extend(t.token);
                }
            }
        }
        let mut paths = Vec::new();
        if d.top_p_cut {
            paths.push(Path::TopPCut);
        }
        paths.push(if d.sorted {
            Path::Sorted
        } else {
            Path::IdOrder
        });
        (d.token, d.near_boundary, paths)
    };
    let Some(token) = token else {
        return fail(SampleFailure::NothingToSample { vocab });
    };
    let (logprob, top) = match logprobs {
        Some((norm, top)) => (Some(semantics::logprob(raw[token as usize], norm)), top),
        None => (None, Vec::new()),
    };
    Expected {
        outcome: Ok(SampledRow {
            token,
            logprob,
            top,
        }),
        ambiguous,
        accept,
        paths,
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs.

fn normal(rng: &mut Rng) -> f32 {
    let u1 = (rng.unit() as f64 + 1.0 / (1u64 << 25) as f64).min(1.0);
    let u2 = rng.unit() as f64;
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    /// N(0, 3²) with a few large outliers, some NaN and −inf.
    Spread,
    /// N(0, 1²): the mass spread over thousands of tokens, so that every filter and the draw's
    /// position matter.
    Soft,
    /// Multiples of 0.25: many exact ties.
    Ties,
    /// N(0, 30²): at low temperatures most weights underflow to zero.
    Wide,
    /// All equal but a few −inf.
    Flat,
}

fn logits_row(rng: &mut Rng, vocab: usize, shape: Shape) -> Vec<f32> {
    let mut v: Vec<f32> = (0..vocab)
        .map(|_| match shape {
            Shape::Spread => 3.0 * normal(rng),
            Shape::Soft => normal(rng),
            Shape::Ties => (2.0 * normal(rng) * 4.0).round() / 4.0,
            Shape::Wide => 30.0 * normal(rng),
            Shape::Flat => 0.5,
        })
        .collect();
    if let Shape::Spread = shape {
        for _ in 0..3 {
            let i = rng.below(vocab);
            v[i] = 10.0 + 10.0 * rng.unit();
        }
    }
    // About 1% NaN and 1% −inf (at least one of each in small rows, now and then).
    for _ in 0..(vocab / 100).max(1) {
        let i = rng.below(vocab);
        v[i] = f32::NAN;
        let i = rng.below(vocab);
        v[i] = f32::NEG_INFINITY;
    }
    v
}

fn uniform(rng: &mut Rng) -> f64 {
    match rng.below(10) {
        0 => 0.0,
        1 => 1e-12,
        2 => 1e-6,
        3 => 1.0 - 1e-6,
        4 => 1.0 - 1e-8,
        _ => (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64,
    }
}

fn pick<T: Copy>(rng: &mut Rng, options: &[T]) -> T {
    options[rng.below(options.len())]
}

/// The ids of the `n` largest raw logits: penalties and masks there change the outcome.
fn best_ids(raw: &[f32], n: usize) -> Vec<u32> {
    top_k_indices(raw, n)
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

fn random_params(rng: &mut Rng, vocab: usize) -> SampleParams {
    let v = vocab as i32;
    SampleParams {
        temperature: pick(rng, &[0.0, 1e-6, 0.01, 0.3, 0.7, 1.0, 1.0, 1.5, 100.0]),
        top_k: pick(rng, &[0, 0, -1, 1, 2, 5, 40, 1500, v - 1, v, v + 10]),
        top_p: pick(rng, &[1.0, 1.0, 0.999, 0.9, 0.5, 0.1, 0.0]),
        min_p: pick(rng, &[0.0, 0.0, 0.01, 0.1, 0.5, 1.0]),
        repetition_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        logprobs: if rng.below(3) == 0 {
            Some(rng.below(MAX_LOGPROBS + 1))
        } else {
            None
        },
    }
}

/// Penalties over some of the best tokens and some others (distinct ids, a few outside the
/// vocabulary), and masks over some of the best.
fn add_state(rng: &mut Rng, raw: &[f32], row: &mut SampleRow) {
    let vocab = raw.len();
    if rng.below(2) == 0 {
        row.params.repetition_penalty = pick(rng, &[1.0, 1.3, 0.8, 2.0]);
        row.params.frequency_penalty = pick(rng, &[0.0, 0.5, -0.3]);
        row.params.presence_penalty = pick(rng, &[0.0, 0.7, 1.5]);
        let mut ids = best_ids(raw, 6);
        for _ in 0..rng.below(20) {
            ids.push(rng.below(vocab) as u32);
        }
        if rng.below(4) == 0 {
            ids.push(vocab as u32 + 3);
        }
        ids.sort_unstable();
        ids.dedup();
        row.penalties.clear();
        for id in ids {
            if rng.below(4) != 0 {
                row.penalties.push((id, rng.below(4) as u32));
            }
        }
    }
    if rng.below(3) == 0 {
        let best = best_ids(raw, 4);
        row.masked = best.into_iter().take(1 + rng.below(4)).collect();
        if rng.below(3) == 0 {
            row.masked.push(rng.below(vocab) as u32);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Running and comparing.

#[derive(Default)]
struct Tally {
    rows: usize,
    /// Rows whose target or limit is within 1e-9 of a boundary.
    ambiguous: usize,
    /// Of those, rows where the kernel took the neighbour.
    excluded: usize,
    failures: usize,
    paths: std::collections::BTreeMap<Path, usize>,
}

impl Tally {
    fn report(&self, name: &str) {
        eprintln!(
            "{name}: {} rows, {} failing as expected, {} near a boundary of which {} took the \
             neighbour, paths {:?}",
            self.rows, self.failures, self.ambiguous, self.excluded, self.paths
        );
        assert!(
            self.excluded * 50 <= self.rows,
            "{name}: {} of {} rows near a boundary",
            self.excluded,
            self.rows
        );
    }
}

fn close(got: f32, want: f32) -> bool {
    if want == f32::NEG_INFINITY {
        return got == want;
    }
    (got - want).abs() <= 1e-5 * want.abs().max(1.0)
}

/// Samples `rows` over `logits` (`rows.len() × vocab`) on the device and compares each row
/// with the reference; the logits must come back unchanged.
fn run(sampler: &mut Sampler, gpu: &Gpu, logits: &[f32], rows: &[SampleRow], tally: &mut Tally) {
    let vocab = sampler.vocab();
    assert_eq!(logits.len(), rows.len() * vocab);
    let lb = gpu.upload(logits).unwrap();
    let got = sampler.sample(lb.ptr(), rows).unwrap();
    let after = lb.read::<f32>().unwrap();
    assert!(
        after
            .iter()
            .zip(logits)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the logits were modified"
    );
    assert_eq!(got.len(), rows.len());
    for (i, (row, got)) in rows.iter().zip(got).enumerate() {
        let raw = &logits[i * vocab..(i + 1) * vocab];
        let want = reference(raw, row);
        tally.rows += 1;
        for p in &want.paths {
            *tally.paths.entry(*p).or_default() += 1;
        }
        let ctx = || {
            format!(
                "row {i} (vocab {vocab}): {:?} u {}",
                row.params, row.uniform
            )
        };
        match (&want.outcome, &got) {
            (Err(w), Err(g)) => {
                assert_eq!(w, g, "{}", ctx());
                tally.failures += 1;
            }
            (Ok(w), Ok(g)) => {
                if want.ambiguous {
                    tally.ambiguous += 1;
                }
                if g.token != w.token {
                    // Only a boundary case may differ, and only to a neighbour.
                    assert!(
                        want.ambiguous && want.accept.contains(&g.token),
                        "{}: token {} want {} (accepted {:?})",
                        ctx(),
                        g.token,
                        w.token,
                        want.accept
                    );
                    tally.excluded += 1;
                }
                match (w.logprob, g.logprob) {
                    (None, None) => {}
                    (Some(_), Some(b)) if g.token != w.token => {
                        let a = raw_logprob_of(raw, g.token);
                        assert!(close(b, a), "{}: logprob {b} want {a}", ctx())
                    }
                    (Some(a), Some(b)) => {
                        assert!(close(b, a), "{}: logprob {b} want {a}", ctx())
                    }
                    other => panic!("{}: logprob {other:?}", ctx()),
                }
                assert_eq!(g.top.len(), w.top.len(), "{}", ctx());
                for (j, (gt, wt)) in g.top.iter().zip(&w.top).enumerate() {
                    assert_eq!(gt.0, wt.0, "{}: top {j} id", ctx());
                    assert!(
                        close(gt.1, wt.1),
                        "{}: top {j} logprob {} want {}",
                        ctx(),
                        gt.1,
                        wt.1
                    );
                }
            }
            _ => panic!("{}: got {got:?}, want {:?}", ctx(), want.outcome),
        }
    }
}

fn random_batch(rng: &mut Rng, vocab: usize, n: usize) -> (Vec<f32>, Vec<SampleRow>) {
    let mut logits = Vec::with_capacity(n * vocab);
    let mut rows = Vec::with_capacity(n);
    for _ in 0..n {
        let shape = pick(
            rng,
            &[
                Shape::Spread,
                Shape::Soft,
                Shape::Soft,
                Shape::Ties,
                Shape::Wide,
                Shape::Flat,
            ],
        );
        let raw = logits_row(rng, vocab, shape);
        let mut row = SampleRow {
            params: random_params(rng, vocab),
            uniform: uniform(rng),
            ..Default::default()
        };
        add_state(rng, &raw, &mut row);
        logits.extend_from_slice(&raw);
        rows.push(row);
    }
    (logits, rows)
}

// ---------------------------------------------------------------------------------------------
// The checks.

/// A vocabulary of 50: every row's candidates fit in shared memory; top_k at or past the
/// vocabulary, masks over most of the row, every parameter mix.
fn sample_small_vocab(gpu: &Gpu) {
    let mut rng = Rng::new("sample_small_vocab");
    let vocab = 50;
    let mut sampler = Sampler::new(gpu, vocab).unwrap();
    let mut tally = Tally::default();
    for n in [24, 3, 40, 24] {
        let (mut logits, mut rows) = random_batch(&mut rng, vocab, n);
        // Everything masked: nothing to sample (with or without logprobs).
        rows[0].masked = (0..vocab as u32).collect();
        rows[0].params.temperature = pick(&mut rng, &[0.0, 1.0]);
        // top_k over the vocabulary, with and without top_p.
        rows[1].params.top_k = vocab as i32 + pick(&mut rng, &[0, 5]);
        rows[1].params.temperature = 0.8;
        rows[2].params = SampleParams {
            temperature: 1.0,
            top_k: vocab as i32,
            top_p: 0.7,
            ..Default::default()
        };
        // Only NaN and −inf left: no logprobs, nothing to sample.
        if n > 3 {
            for (j, l) in logits[3 * vocab..4 * vocab].iter_mut().enumerate() {
                *l = if j % 2 == 0 {
                    f32::NAN
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
        run(&mut sampler, gpu, &logits, &rows, &mut tally);
    }
    tally.report("sample_small_vocab");
}

/// Vocabularies of 32000 and 256000: candidates in shared memory (top_k, min_p) and over the
/// whole row (no filter, top_p alone, top_k past the shared-memory list).
fn sample_large_vocab(gpu: &Gpu) {
    let mut rng = Rng::new("sample_large_vocab");
    let vocab = 32000;
    let mut sampler = Sampler::new(gpu, vocab).unwrap();
    let mut tally = Tally::default();
    let fixed = [
        SampleParams::default(),
        SampleParams {
            top_p: 0.9,
            ..Default::default()
        },
        SampleParams {
            temperature: 0.7,
            top_k: 1500,
            ..Default::default()
        },
        SampleParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.95,
            ..Default::default()
        },
        SampleParams {
            min_p: 0.05,
            ..Default::default()
        },
        SampleParams {
            temperature: 1.2,
            top_k: 2000,
            top_p: 0.8,
            min_p: 0.001,
            logprobs: Some(5),
            ..Default::default()
        },
    ];
    for round in 0..3 {
        // Every fixed mix on other rows each round (keeping the rows' penalties and masks),
        // then random ones.
        let (mut logits, mut rows) = random_batch(&mut rng, vocab, 10);
        for (j, row) in rows.iter_mut().enumerate().take(fixed.len()) {
            row.params = fixed[(j + round) % fixed.len()];
            if (j + round) % 2 == 0 {
                let soft = logits_row(&mut rng, vocab, Shape::Soft);
                logits[j * vocab..(j + 1) * vocab].copy_from_slice(&soft);
            }
        }
        run(&mut sampler, gpu, &logits, &rows, &mut tally);
    }
    // A vocabulary of 256000 (a few rows): 250 elements a thread.
    let vocab = 256_000;
    let mut sampler = Sampler::new(gpu, vocab).unwrap();
    let (logits, mut rows) = random_batch(&mut rng, vocab, 4);
    for (j, row) in rows.iter_mut().enumerate() {
        row.params = fixed[(j + rng.below(2)) % fixed.len()];
    }
    run(&mut sampler, gpu, &logits, &rows, &mut tally);
    tally.report("sample_large_vocab");
}

/// Greedy rows (ties go to the first index; penalties and masks move the arg-max) and
/// logprobs of every width 0..=20, which describe the raw logits whatever the penalties.
fn greedy_and_logprobs(gpu: &Gpu) {
    let mut rng = Rng::new("greedy_and_logprobs");
    let mut tally = Tally::default();
    for vocab in [50usize, 1000] {
        let mut sampler = Sampler::new(gpu, vocab).unwrap();
        let n = MAX_LOGPROBS + 1;
        let mut logits = Vec::new();
        let mut rows = Vec::new();
        for k in 0..n {
            let shape = pick(&mut rng, &[Shape::Spread, Shape::Ties, Shape::Flat]);
            let mut raw = logits_row(&mut rng, vocab, shape);
            if k % 3 == 0 {
                // Ties for the maximum, the first one past a NaN.
                let top = raw
                    .iter()
                    .copied()
                    .filter(|v| !v.is_nan())
                    .fold(0f32, f32::max);
                let a = rng.below(vocab / 2);
                raw[a] = f32::NAN;
                raw[a + 1] = top + 1.0;
                raw[a + 1 + rng.below(vocab / 2 - 1)] = top + 1.0;
            }
            let mut row = SampleRow {
                params: SampleParams {
                    temperature: pick(&mut rng, &[0.0, 1e-6]),
                    logprobs: Some(k),
                    ..Default::default()
                },
                ..Default::default()
            };
            add_state(&mut rng, &raw, &mut row);
            logits.extend_from_slice(&raw);
            rows.push(row);
        }
        run(&mut sampler, gpu, &logits, &rows, &mut tally);
        // The same rows sampled (logprobs still asked for).
        for row in &mut rows {
            row.params.temperature = pick(&mut rng, &[0.5, 1.0]);
            row.params.top_k = pick(&mut rng, &[0, 3, 30]);
            row.uniform = uniform(&mut rng);
        }
        run(&mut sampler, gpu, &logits, &rows, &mut tally);
    }
    tally.report("greedy_and_logprobs");
}

/// Rows that cannot be sampled report why, between rows that can, which are unaffected.
fn failing_rows_leave_others_alone(gpu: &Gpu) {
    let mut rng = Rng::new("failing_rows_leave_others_alone");
    let vocab = 300;
    let mut sampler = Sampler::new(gpu, vocab).unwrap();
    let mut tally = Tally::default();
    let mut logits = Vec::new();
    let mut rows = Vec::new();
    let nan_row = vec![f32::NAN; vocab];
    let neg_row = vec![f32::NEG_INFINITY; vocab];
    let mut inf_row = logits_row(&mut rng, vocab, Shape::Spread);
    inf_row[7] = f32::INFINITY;
    let cases: Vec<(Vec<f32>, SampleParams)> = vec![
        (
            nan_row.clone(),
            SampleParams {
                logprobs: Some(3),
                ..Default::default()
            },
        ),
        (
            neg_row.clone(),
            SampleParams {
                temperature: 0.0,
                ..Default::default()
            },
        ),
        (nan_row, SampleParams::default()),
        (
            neg_row,
            SampleParams {
                top_k: 5,
                top_p: 0.5,
                ..Default::default()
            },
        ),
        // +inf: logprobs fail; greedy takes it; a draw has no finite maximum.
        (
            inf_row.clone(),
            SampleParams {
                logprobs: Some(0),
                ..Default::default()
            },
        ),
        (
            inf_row.clone(),
            SampleParams {
                temperature: 0.0,
                ..Default::default()
            },
        ),
        (inf_row, SampleParams::default()),
        // min_p above 1 leaves nothing.
        (
            logits_row(&mut rng, vocab, Shape::Spread),
            SampleParams {
                min_p: 1.5,
                ..Default::default()
            },
        ),
    ];
    for (raw, params) in cases {
        // A good row before each failing one.
        let good = logits_row(&mut rng, vocab, Shape::Spread);
        logits.extend_from_slice(&good);
        rows.push(SampleRow {
            params: random_params(&mut rng, vocab),
            uniform: uniform(&mut rng),
            ..Default::default()
        });
        logits.extend_from_slice(&raw);
        rows.push(SampleRow {
            params,
            uniform: uniform(&mut rng),
            ..Default::default()
        });
    }
    rows.last_mut().unwrap().params.logprobs = Some(2);
    run(&mut sampler, gpu, &logits, &rows, &mut tally);
    assert!(tally.failures >= 7, "{} failures", tally.failures);
    tally.report("failing_rows_leave_others_alone");
}

/// A token listed twice among the penalties is penalised once, with the counts added.
fn repeated_penalty_entries_merge(gpu: &Gpu) {
    let mut rng = Rng::new("repeated_penalty_entries_merge");
    let vocab = 64;
    let mut sampler = Sampler::new(gpu, vocab).unwrap();
    let mut logits = Vec::new();
    let mut rows = Vec::new();
    let mut merged = Vec::new();
    for _ in 0..8 {
        let raw = logits_row(&mut rng, vocab, Shape::Spread);
        let best = best_ids(&raw, 3);
        let params = SampleParams {
            temperature: 0.0,
            repetition_penalty: 3.0,
            frequency_penalty: 0.4,
            presence_penalty: 0.3,
            logprobs: Some(2),
            ..Default::default()
        };
        let entries: Vec<(u32, u32)> = best.iter().map(|&id| (id, 1)).collect();
        let mut twice = entries.clone();
        twice.extend(best.iter().map(|&id| (id, 2)));
        logits.extend_from_slice(&raw);
        rows.push(SampleRow {
            params,
            penalties: twice,
            ..Default::default()
        });
        merged.push(SampleRow {
            params,
            penalties: best.iter().map(|&id| (id, 3)).collect(),
            ..Default::default()
        });
    }
    let lb = gpu.upload(&logits).unwrap();
    let got = sampler.sample(lb.ptr(), &rows).unwrap();
    for (i, (g, m)) in got.iter().zip(&merged).enumerate() {
        let want = reference(&logits[i * vocab..(i + 1) * vocab], m).outcome;
        assert_eq!(g.clone().map(|r| r.token), want.map(|r| r.token), "row {i}");
    }
}

/// The kernel is correct at any block size (a multiple of 32): the same rows at 32, 256 and
/// 1024 threads.
fn block_sizes_agree(gpu: &Gpu) {
    let mut rng = Rng::new("block_sizes_agree");
    let vocab = 2000;
    let (logits, rows) = random_batch(&mut rng, vocab, 12);
    let mut tally = Tally::default();
    for threads in [32, 256, 1024] {
        let mut sampler = Sampler::new(gpu, vocab)
            .unwrap()
            .with_threads(threads)
            .unwrap();
        run(&mut sampler, gpu, &logits, &rows, &mut tally);
    }
    tally.report("block_sizes_agree");
}
