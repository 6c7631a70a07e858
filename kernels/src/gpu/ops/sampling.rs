//! `sampling.cu`: the next token of each row of logits, chosen on the device with the semantics
//! that [`crate::sampling`] writes down (vLLM's order of operations), so that only a
//! few words per row come back to the host.
//!
//! [`Sampler`] is the engine's entry point: it packs a batch of [`SampleRow`]s into one upload,
//! launches one block per row on the logits already on the device, and reads every row's
//! outcome back in one download. [`SampleTokens`] is the raw launch over packed buffers.
//!
//! The host keeps the parts that decide the sequence's randomness and bookkeeping: it draws
//! the row's uniform from the sequence's own RNG (one draw per non-greedy sample, as the CPU
//! sampler does), lists the penalised tokens with their output counts, and the ids that
//! `min_tokens` masks.

use super::{grid_x, int};
use crate::gpu::{Arg, DevicePtr, Gpu, GpuBuffer, GpuError, Launch, Result};
pub use crate::sampling::{SampleParams, GREEDY_EPS};

/// The most top logprobs a row may ask for (the kernel's fixed output width).
pub const MAX_LOGPROBS: usize = 20;

/// Threads per row: enough to spread a 256k vocabulary at 256 elements a thread.
const THREADS: u32 = 1024;

/// Candidates a block keeps in shared memory for the searches after top_k / min_p; past this
/// they run over the whole row. 16 bytes each (weight, key, id), next to the kernel's 25 KiB
/// of static shared memory, inside the 48 KiB a launch may use without opting in.
const LIST_CAP: usize = 1024;
const LIST_ENTRY_BYTES: usize = 16;

/// Output words per row: token, status, logprob, then the top ids and logprobs.
const OUT_WORDS: usize = 3 + 2 * MAX_LOGPROBS;

const STATUS_OK: i32 = 0;
const STATUS_NO_FINITE_LOGIT: i32 = 1;
const STATUS_NOTHING_TO_SAMPLE: i32 = 2;

/// One row to sample: row `i` of a batch reads row `i` of the logits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampleRow {
    pub params: SampleParams,
    /// `(token, output count)` for every distinct token of prompt ∪ output: the repetition
    /// penalty applies to all of them, frequency and presence to those with a count ≥ 1 (prompt
    /// tokens that are not in the output have count 0). A repeated token is merged (counts
    /// added); tokens outside the vocabulary are ignored, as on the CPU.
    pub penalties: Vec<(u32, u32)>,
    /// Tokens set to −inf before the penalties: EOS and stop ids while the sequence has
    /// generated fewer than `min_tokens`.
    pub masked: Vec<u32>,
    /// The draw in [0, 1): `rng.random::<f64>()` from the sequence's RNG (its own when
    /// seeded, else the engine's), taken only for rows that are not greedy, as the CPU sampler
    /// does. Unused when greedy.
    pub uniform: f64,
}

/// A row's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledRow {
    pub token: u32,
    /// The token's logprob under the raw distribution, when logprobs were asked for.
    pub logprob: Option<f32>,
    /// The raw distribution's top entries, best first (ties by lower id); empty without
    /// logprobs.
    pub top: Vec<(u32, f32)>,
}

/// Why a row has no token. The messages are the CPU sampler's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SampleFailure {
    /// Logprobs were asked for and no raw logit is finite (or one is +inf).
    #[error("the model produced no finite logit")]
    NoFiniteLogit,
    /// Nothing is left to sample from after masking, penalties and the filters.
    #[error("no finite logit to sample from (vocab {vocab})")]
    NothingToSample { vocab: usize },
}

/// The 4-byte per-row parameters, in the kernel's argument order: temperature, top_k, top_p,
/// ln(min_p), n_logprobs, repetition, frequency, presence.
const PER_ROW_FIELDS: usize = 8;

fn per_row_fields(p: &SampleParams) -> [[u8; 4]; PER_ROW_FIELDS] {
    // The CPU's floor is `max + min_p.ln()`: the logarithm is taken here, in the same f32
    // arithmetic, and −inf (no floor) when min_p is off.
    let ln_min_p = if p.min_p > 0.0 {
        p.min_p.ln()
    } else {
        f32::NEG_INFINITY
    };
    [
        p.temperature.to_ne_bytes(),
        p.top_k.to_ne_bytes(),
        p.top_p.to_ne_bytes(),
        ln_min_p.to_ne_bytes(),
        p.logprobs.map_or(-1i32, |k| k as i32).to_ne_bytes(),
        p.repetition_penalty.to_ne_bytes(),
        p.frequency_penalty.to_ne_bytes(),
        p.presence_penalty.to_ne_bytes(),
    ]
}

/// Where each array lies in the packed input buffer (byte offsets), for `n_rows` rows with
/// `n_penalties` penalty entries and `n_masked` masked ids in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleLayout {
    pub n_rows: usize,
    pub n_penalties: usize,
    pub n_masked: usize,
}

impl SampleLayout {
    // f64 uniforms first (8-byte aligned), then the 4-byte arrays.
    fn uniform(&self) -> usize {
        0
    }

    /// The `k`-th per-row 4-byte array (in [`per_row_fields`] order).
    fn per_row(&self, k: usize) -> usize {
        8 * self.n_rows + 4 * k * self.n_rows
    }

    fn penalty_offsets(&self) -> usize {
        self.per_row(PER_ROW_FIELDS)
    }

    fn mask_offsets(&self) -> usize {
        self.penalty_offsets() + 4 * (self.n_rows + 1)
    }

    fn penalty_ids(&self) -> usize {
        self.mask_offsets() + 4 * (self.n_rows + 1)
    }

    fn penalty_counts(&self) -> usize {
        self.penalty_ids() + 4 * self.n_penalties
    }

    fn mask_ids(&self) -> usize {
        self.penalty_counts() + 4 * self.n_penalties
    }

    /// Bytes of the packed inputs.
    pub fn input_bytes(&self) -> usize {
        self.mask_ids() + 4 * self.n_masked
    }

    /// Bytes of the packed outputs: per row a token, a status and a logprob, then
    /// [`MAX_LOGPROBS`] top ids and as many top logprobs (4 bytes each, arrays of `n_rows`).
    pub fn output_bytes(&self) -> usize {
        4 * OUT_WORDS * self.n_rows
    }
}

/// A batch packed for the kernel: the input bytes to upload, and their layout.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedBatch {
    pub layout: SampleLayout,
    pub bytes: Vec<u8>,
}

impl PackedBatch {
    /// Packs `rows` for a vocabulary of `vocab`: checks the parameters the kernel cannot
    /// (logprobs ≤ [`MAX_LOGPROBS`]), merges repeated penalty tokens and drops ids outside
    /// the vocabulary.
    pub fn new(rows: &[SampleRow], vocab: usize) -> Result<Self> {
        let n = rows.len();
        let mut penalties: Vec<Vec<(u32, u32)>> = Vec::with_capacity(n);
        let mut masked: Vec<Vec<u32>> = Vec::with_capacity(n);
        for (i, r) in rows.iter().enumerate() {
            if let Some(k) = r.params.logprobs {
                if k > MAX_LOGPROBS {
                    return Err(GpuError::Invalid(format!(
                        "sampling row {i}: {k} logprobs asked for, at most {MAX_LOGPROBS}"
                    )));
                }
            }
            let mut p: Vec<(u32, u32)> = r
                .penalties
                .iter()
                .copied()
                .filter(|&(id, _)| (id as usize) < vocab)
                .collect();
            p.sort_unstable_by_key(|e| e.0);
            let mut merged: Vec<(u32, u32)> = Vec::with_capacity(p.len());
            for (id, c) in p {
                match merged.last_mut() {
                    Some(last) if last.0 == id => last.1 = last.1.saturating_add(c),
                    _ => merged.push((id, c)),
                }
            }
            penalties.push(merged);
            masked.push(
                r.masked
                    .iter()
                    .copied()
                    .filter(|&id| (id as usize) < vocab)
                    .collect(),
            );
        }
        let layout = SampleLayout {
            n_rows: n,
            n_penalties: penalties.iter().map(Vec::len).sum(),
            n_masked: masked.iter().map(Vec::len).sum(),
        };
        let mut bytes = Vec::with_capacity(layout.input_bytes());
        for r in rows {
            bytes.extend_from_slice(&r.uniform.to_ne_bytes());
        }
        for k in 0..PER_ROW_FIELDS {
            for r in rows {
                bytes.extend_from_slice(&per_row_fields(&r.params)[k]);
            }
        }
        fn push_i32(bytes: &mut Vec<u8>, v: usize, what: &str) -> Result<()> {
            bytes.extend_from_slice(&int(what, v)?.to_ne_bytes());
            Ok(())
        }
        let mut at = 0;
        push_i32(&mut bytes, 0, "penalty offset")?;
        for p in &penalties {
            at += p.len();
            push_i32(&mut bytes, at, "penalty offset")?;
        }
        at = 0;
        push_i32(&mut bytes, 0, "mask offset")?;
        for m in &masked {
            at += m.len();
            push_i32(&mut bytes, at, "mask offset")?;
        }
        // Ids are below the vocabulary, which fits an int (checked by the launch).
        for p in &penalties {
            for &(id, _) in p {
                bytes.extend_from_slice(&(id as i32).to_ne_bytes());
            }
        }
        for p in &penalties {
            for &(_, c) in p {
                bytes.extend_from_slice(&(c.min(i32::MAX as u32) as i32).to_ne_bytes());
            }
        }
        for m in &masked {
            for &id in m {
                bytes.extend_from_slice(&(id as i32).to_ne_bytes());
            }
        }
        debug_assert_eq!(bytes.len(), layout.input_bytes());
        Ok(PackedBatch { layout, bytes })
    }
}

/// One launch of `sample_tokens`: row `i` of `logits` (`n_rows × vocab` f32, left unchanged)
/// is sampled with the parameters of row `i` of the packed `inputs` ([`PackedBatch`]), through
/// `work` (`n_rows × vocab` f32 scratch), and its outcome written to the packed `outputs`
/// ([`SampleLayout::output_bytes`]; decoded by [`unpack`]).
#[derive(Debug, Clone, Copy)]
pub struct SampleTokens {
    pub logits: DevicePtr,
    pub work: DevicePtr,
    pub vocab: usize,
    pub layout: SampleLayout,
    pub inputs: DevicePtr,
    pub outputs: DevicePtr,
    /// Threads per row: a multiple of 32, at most 1024.
    pub threads: u32,
}

impl SampleTokens {
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        check_threads(self.threads)?;
        let l = &self.layout;
        let n = l.n_rows;
        let inp = |off: usize| Arg::Ptr(self.inputs.offset(off));
        let out = |word: usize| Arg::Ptr(self.outputs.offset(4 * word * n));
        gpu.launch(
            "sample_tokens",
            Launch::new([grid_x("sampled rows", n)?, 1, 1], self.threads)
                .with_shared((LIST_CAP * LIST_ENTRY_BYTES) as u32),
            &[
                Arg::Ptr(self.logits),
                Arg::Ptr(self.work),
                Arg::I32(int("vocab", self.vocab)?),
                inp(l.per_row(0)),
                inp(l.per_row(1)),
                inp(l.per_row(2)),
                inp(l.per_row(3)),
                inp(l.uniform()),
                inp(l.per_row(4)),
                inp(l.per_row(5)),
                inp(l.per_row(6)),
                inp(l.per_row(7)),
                inp(l.penalty_offsets()),
                inp(l.penalty_ids()),
                inp(l.penalty_counts()),
                inp(l.mask_offsets()),
                inp(l.mask_ids()),
                Arg::I32(LIST_CAP as i32),
                out(0),
                out(2),
                out(3),
                out(3 + MAX_LOGPROBS),
                out(1),
            ],
        )
    }
}

fn check_threads(threads: u32) -> Result<()> {
    if threads == 0 || !threads.is_multiple_of(32) || threads > 1024 {
        return Err(GpuError::Invalid(format!(
            "sampling: {threads} threads per row (a multiple of 32, at most 1024)"
        )));
    }
    Ok(())
}

/// Decodes the packed outputs (as 4-byte words) of `rows` rows.
pub fn unpack(
    words: &[u32],
    rows: &[SampleRow],
    vocab: usize,
) -> Result<Vec<std::result::Result<SampledRow, SampleFailure>>> {
    let n = rows.len();
    if words.len() != OUT_WORDS * n {
        return Err(GpuError::Invalid(format!(
            "sampling: {} output words for {n} rows",
            words.len()
        )));
    }
    let at = |array: usize, i: usize| words[array * n + i];
    rows.iter()
        .enumerate()
        .map(|(i, r)| match at(1, i) as i32 {
            STATUS_OK => {
                let token = at(0, i);
                if token as usize >= vocab {
                    return Err(GpuError::Invalid(format!(
                        "sampling row {i}: token {} outside the vocabulary",
                        token as i32
                    )));
                }
                let k = r.params.logprobs.map_or(0, |k| k.min(vocab));
                let top = (0..k)
                    .map(|j| {
                        let id = words[3 * n + i * MAX_LOGPROBS + j];
                        let lp =
                            f32::from_bits(words[(3 + MAX_LOGPROBS) * n + i * MAX_LOGPROBS + j]);
                        (id, lp)
                    })
                    .collect();
                Ok(Ok(SampledRow {
                    token,
                    logprob: r.params.logprobs.map(|_| f32::from_bits(at(2, i))),
                    top,
                }))
            }
            STATUS_NO_FINITE_LOGIT => Ok(Err(SampleFailure::NoFiniteLogit)),
            STATUS_NOTHING_TO_SAMPLE => Ok(Err(SampleFailure::NothingToSample { vocab })),
            s => Err(GpuError::Invalid(format!(
                "sampling row {i}: unknown status {s}"
            ))),
        })
        .collect()
}

/// Samples batches of rows over a vocabulary of `vocab`, owning the device buffers (packed
/// inputs and outputs, and the `rows × vocab` f32 scratch the rows are transformed in), which
/// grow to the largest batch seen.
pub struct Sampler {
    gpu: Gpu,
    vocab: usize,
    threads: u32,
    inputs: Option<GpuBuffer>,
    outputs: Option<GpuBuffer>,
    work: Option<GpuBuffer>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("vocab", &self.vocab)
            .field("threads", &self.threads)
            .finish()
    }
}

/// `buf` with at least `bytes`, reallocated when smaller (to the next power of two when
/// `round`: the small packed buffers, whose size changes with every batch).
fn ensure(gpu: &Gpu, buf: &mut Option<GpuBuffer>, bytes: usize, round: bool) -> Result<DevicePtr> {
    match buf {
        Some(b) if b.len_bytes() >= bytes => Ok(b.ptr()),
        _ => {
            // Free the old buffer before taking the new one.
            *buf = None;
            let bytes = if round {
                bytes.max(256).next_power_of_two()
            } else {
                bytes
            };
            let b = gpu.alloc(bytes)?;
            let p = b.ptr();
            *buf = Some(b);
            Ok(p)
        }
    }
}

impl Sampler {
    pub fn new(gpu: &Gpu, vocab: usize) -> Result<Self> {
        if vocab == 0 {
            return Err(GpuError::Invalid(
                "sampling: the vocabulary is empty".into(),
            ));
        }
        int("vocab", vocab)?;
        Ok(Sampler {
            gpu: gpu.clone(),
            vocab,
            threads: THREADS,
            inputs: None,
            outputs: None,
            work: None,
        })
    }

    /// Threads per row (default 1024): a multiple of 32, at most 1024.
    pub fn with_threads(mut self, threads: u32) -> Result<Self> {
        check_threads(threads)?;
        self.threads = threads;
        Ok(self)
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Samples row `i` of `logits` (`rows.len() × vocab` f32 on the device, row stride
    /// `vocab`, left unchanged) with `rows[i]`: one upload, one launch, one download. The outer
    /// error is the device's; a row that has no token reports why in its own entry.
    pub fn sample(
        &mut self,
        logits: DevicePtr,
        rows: &[SampleRow],
    ) -> Result<Vec<std::result::Result<SampledRow, SampleFailure>>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let packed = PackedBatch::new(rows, self.vocab)?;
        let l = packed.layout;
        let work_bytes = rows
            .len()
            .checked_mul(self.vocab * 4)
            .ok_or_else(|| GpuError::Invalid("sampling: scratch size overflows".into()))?;
        let inputs = ensure(&self.gpu, &mut self.inputs, l.input_bytes(), true)?;
        let outputs = ensure(&self.gpu, &mut self.outputs, l.output_bytes(), true)?;
        let work = ensure(&self.gpu, &mut self.work, work_bytes, false)?;
        self.gpu.write(inputs, &packed.bytes)?;
        SampleTokens {
            logits,
            work,
            vocab: self.vocab,
            layout: l,
            inputs,
            outputs,
            threads: self.threads,
        }
        .launch(&self.gpu)?;
        let words = self.gpu.read::<u32>(outputs, OUT_WORDS * rows.len())?;
        unpack(&words, rows, self.vocab)
    }
}
