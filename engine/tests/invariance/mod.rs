//! Batch invariance of a decoder (the GPU one on the emulator or a device): one sequence's
//! logits, bit for bit, against its own run alone one token at a time, when its prompt is
//! prefilled whole or in chunks, alone or among other sequences (steps of 2 to 6 chunks and
//! up to 75 rows, the sequence at different rows and on both sides of a GEMM chunk's edge),
//! and after a prefix-cache hit (its first blocks written by another sequence's prefill, its
//! own prefill starting after them). Every logits row the sequence gets is compared.
//!
//! Also a backend that records the GEMMs it is given, for the check that the decoder issues
//! them at one shape per weight whatever the step.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::ops::Range;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use engine::model::{CausalLm, KvBudget, SeqChunk};
use kernels::gpu::{
    Arg, Backend, DeviceInfo, DevicePtr, Gemm, Gpu, GpuDType, Launch, Result, Step,
};

pub const BLOCK: usize = 16;
const BLOCKS: usize = 64;
/// The subject's prompt and decoded tokens: the prompt spans three attention tiles and three
/// cache blocks; the prefix-cache hit reuses its first two blocks.
const PROMPT: usize = 37;
const DECODE: usize = 4;
const CACHED: usize = 2 * BLOCK;

/// A sequence of the test: all its tokens (prompt then decoded ones) and its block table.
struct Seq {
    tokens: Vec<u32>,
    table: Vec<u32>,
}

/// Hands out cache blocks in a scrambled order, never the same block twice.
struct Blocks {
    next: usize,
}

impl Blocks {
    fn take(&mut self, n: usize) -> Vec<u32> {
        assert!(self.next + n <= BLOCKS, "the test's cache is too small");
        // 37 is prime to BLOCKS: a permutation of the block ids.
        let ids = (self.next..self.next + n)
            .map(|i| (i * 37 % BLOCKS) as u32)
            .collect();
        self.next += n;
        ids
    }
}

fn tokens(n: usize, seed: u32, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(7919) ^ seed.wrapping_mul(104_729)).wrapping_add(3) % vocab)
        .collect()
}

/// Adds a sequence; returns its index.
fn new_seq(seqs: &mut Vec<Seq>, tokens: Vec<u32>, table: Vec<u32>) -> usize {
    seqs.push(Seq { tokens, table });
    seqs.len() - 1
}

/// One chunk of a step: sequence, positions, and whether its last row's logits are wanted.
type Part = (usize, Range<usize>, bool);

/// Runs one step; returns the logits of each part that wanted them.
fn step(model: &mut dyn CausalLm, seqs: &[Seq], parts: &[Part]) -> Vec<Option<Vec<f32>>> {
    let batch: Vec<SeqChunk<'_>> = parts
        .iter()
        .map(|(s, r, want)| SeqChunk {
            lora: None,
            tokens: &seqs[*s].tokens[r.clone()],
            start_pos: r.start,
            block_table: &seqs[*s].table,
            want_logits: *want,
            media: None,
        })
        .collect();
    model.forward(&batch).unwrap()
}

/// The outcome of [`check`]: how many of the subject's logits rows were compared.
pub struct Checked {
    pub rows: usize,
    pub steps: usize,
}

/// Runs the schedules of the module's doc on `model` (a fresh KV cache of 64 blocks of 16);
/// panics naming the first schedule and position whose logits differ in any bit.
pub fn check(model: &mut dyn CausalLm, label: &str) -> Checked {
    let vocab = model.info().vocab_size as u32;
    assert_eq!(
        model
            .allocate_kv(BLOCK, &KvBudget::tokens(BLOCKS * BLOCK))
            .unwrap(),
        BLOCKS
    );
    let mut blocks = Blocks { next: 0 };
    let all = tokens(PROMPT + DECODE, 1, vocab);
    let total = all.len();
    let mut seqs: Vec<Seq> = Vec::new();
    let blocks_for = |n: usize| n.div_ceil(BLOCK);
    let mut steps = 0;

    // The reference: the subject alone, one token at a time: logits at every position.
    let s = new_seq(&mut seqs, all.clone(), blocks.take(blocks_for(total)));
    let mut reference = BTreeMap::new();
    for p in 0..total {
        let out = step(model, &seqs, &[(s, p..p + 1, true)]);
        reference.insert(p, out.into_iter().next().flatten().unwrap());
        steps += 1;
    }

    // Each schedule: its steps, the subject being the sequence `subject` of each.
    let mut rows = 0;
    let mut run = |name: &str, seqs: &[Seq], subject: usize, schedule: &[Vec<Part>]| {
        for (i, parts) in schedule.iter().enumerate() {
            let out = step(model, seqs, parts);
            for ((seq, range, want), got) in parts.iter().zip(out) {
                assert_eq!(*want, got.is_some(), "{name}, step {i}: logits wanted");
                let (Some(got), true) = (got, *seq == subject) else {
                    continue;
                };
                let pos = range.end - 1;
                let want = &reference[&pos];
                let differ = got
                    .iter()
                    .zip(want)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                let largest = got
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    differ == 0,
                    "{label}: {name}, step {i}: the logits at position {pos} differ from the \
                     sequence's own run in {differ} of {} values (largest difference {largest:e})",
                    got.len()
                );
                rows += 1;
            }
            steps += 1;
        }
    };
    let decode_alone = |s: usize| -> Vec<Vec<Part>> {
        (PROMPT..total).map(|p| vec![(s, p..p + 1, true)]).collect()
    };

    // Prefilled whole, alone; then decoded alone.
    let s = new_seq(&mut seqs, all.clone(), blocks.take(blocks_for(total)));
    let mut schedule = vec![vec![(s, 0..PROMPT, true)]];
    schedule.extend(decode_alone(s));
    run("whole prefill alone", &seqs, s, &schedule);

    // Prefilled in three chunks (each wanting its last row's logits), alone.
    let s = new_seq(&mut seqs, all.clone(), blocks.take(blocks_for(total)));
    let mut schedule = vec![
        vec![(s, 0..5, true)],
        vec![(s, 5..21, true)],
        vec![(s, 21..PROMPT, true)],
    ];
    schedule.extend(decode_alone(s));
    run("chunked prefill alone", &seqs, s, &schedule);

    // Among others: the prompt in a 75-row step (its rows 28..65 straddle the first GEMM
    // chunk's edge, and its attention tiles start at another row), then decode steps of 4, 2,
    // 5 and 6 chunks with the subject's row at 66 (in the second GEMM chunk), 0, 5 and 4
    // (before a 10-row prefill).
    let f: Vec<usize> = [(32, 2), (13, 3), (66, 4), (4, 5), (10, 6)]
        .into_iter()
        .map(|(n, seed)| {
            let table = blocks.take(blocks_for(n));
            new_seq(&mut seqs, tokens(n, seed, vocab), table)
        })
        .collect();
    let s = new_seq(&mut seqs, all.clone(), blocks.take(blocks_for(total)));
    let d = |p: usize| p..p + 1;
    let schedule = vec![
        vec![
            (f[0], 0..28, true),
            (s, 0..PROMPT, true),
            (f[1], 0..10, false),
        ],
        vec![
            (f[0], 28..29, true),
            (f[1], 10..11, true),
            (f[2], 0..64, true),
            (s, d(37), true),
        ],
        vec![(s, d(38), true), (f[0], 29..30, true)],
        vec![
            (f[3], 0..3, false),
            (f[2], 64..65, true),
            (f[1], 11..12, true),
            (s, d(39), true),
            (f[0], 30..31, true),
        ],
        vec![
            (f[1], 12..13, true),
            (f[0], 31..32, false),
            (f[2], 65..66, true),
            (f[3], 3..4, true),
            (s, d(40), true),
            (f[4], 0..10, true),
        ],
    ];
    run("among other sequences", &seqs, s, &schedule);

    // A prefix-cache hit: another sequence prefills the subject's first two blocks (in a
    // step with a third sequence); the subject's table starts with those blocks and its own
    // prefill, in a batch, starts after them; then it decodes among others.
    let shared = blocks.take(blocks_for(CACHED));
    let x = new_seq(&mut seqs, all[..CACHED].to_vec(), shared.clone());
    let g = new_seq(&mut seqs, tokens(30, 7, vocab), blocks.take(blocks_for(30)));
    let mut table = shared;
    table.extend(blocks.take(blocks_for(total) - blocks_for(CACHED)));
    let s = new_seq(&mut seqs, all.clone(), table);
    let mut schedule = vec![
        vec![(g, 0..20, true), (x, 0..CACHED, false)],
        vec![(g, 20..29, true), (s, CACHED..PROMPT, true)],
        vec![(s, d(37), true), (g, 29..30, true)],
    ];
    schedule.extend((38..total).map(|p| vec![(s, d(p), true)]));
    run("after a prefix-cache hit", &seqs, s, &schedule);

    assert!(rows > 0);
    Checked { rows, steps }
}

/// A backend that passes everything to another and records the GEMMs.
pub struct Recording {
    inner: Gpu,
    gemms: Mutex<Vec<Gemm>>,
}

impl Recording {
    pub fn over(inner: Gpu) -> Arc<Recording> {
        Arc::new(Recording {
            inner,
            gemms: Mutex::new(Vec::new()),
        })
    }

    pub fn gemms(&self) -> Vec<Gemm> {
        self.gemms.lock().unwrap().clone()
    }
}

impl Backend for Recording {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.inner.backend().alloc(bytes)
    }
    unsafe fn free(&self, ptr: DevicePtr) {
        // SAFETY: the pointer came from `alloc`, which is the inner backend's.
        unsafe { self.inner.backend().free(ptr) }
    }
    fn upload(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.inner.backend().upload(dst, src)
    }
    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        self.inner.backend().download(src, dst)
    }
    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.inner.backend().copy(dst, src, bytes)
    }
    fn memset(&self, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()> {
        self.inner.backend().memset(dst, byte, bytes)
    }
    fn launch(&self, kernel: &str, shape: Launch, args: &[Arg]) -> Result<()> {
        self.inner.backend().launch(kernel, shape, args)
    }
    fn gemm(&self, g: &Gemm) -> Result<()> {
        self.gemms.lock().unwrap().push(*g);
        self.inner.backend().gemm(g)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.backend().synchronize()
    }
    fn memory(&self) -> Result<(usize, usize)> {
        self.inner.backend().memory()
    }
    fn alloc_exportable(&self, bytes: usize) -> Result<(DevicePtr, usize, OwnedFd)> {
        self.inner.backend().alloc_exportable(bytes)
    }
    fn import(&self, handle: BorrowedFd<'_>, bytes: usize) -> Result<DevicePtr> {
        self.inner.backend().import(handle, bytes)
    }
    unsafe fn release_shared(&self, ptr: DevicePtr, bytes: usize) {
        // SAFETY: as the caller promised, for the inner backend that made the mapping.
        unsafe { self.inner.backend().release_shared(ptr, bytes) }
    }
    fn enter(&self, step: Option<Step>) {
        self.inner.backend().enter(step)
    }
}

/// What must not change between two GEMMs of one weight: everything but where the rows are.
pub fn gemm_shape(g: &Gemm) -> (usize, usize, usize, GpuDType, usize, usize, usize) {
    (g.m, g.n, g.k, g.dtype, g.lda, g.ldb, g.ldc)
}
