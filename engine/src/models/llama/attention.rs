//! Causal multi-head attention (with grouped KV heads) over the paged KV cache.
//!
//! The keys and values of the current chunk must already be in the cache. A query at
//! position `p` attends to positions `0..=p` of its own sequence (`p - w + 1..=p` in a layer
//! with a sliding window `w`), read through the sequence's block table; positions outside the
//! window are never read, so a window works the same after chunked prefill or a prefix-cache
//! hit. Every query, in a decode step or a prefill chunk of any length, takes the same path:
//! direct dot products against the cached keys block by block (all the query heads of a KV
//! head at once: each row read once for them), a softmax, and the values summed in position
//! order, parallel over (chunk, KV head, query). A query's output thus
//! depends on its position and the cache only, not on how its prompt was split into chunks
//! or what else ran in the step (batch invariance).

use std::cell::RefCell;

use kernels::ops;
use rayon::prelude::*;

use crate::model::KvBuf;

/// An element type of the host KV cache: rows are read as f32 (scores through
/// [`ops::dots_heads`], weighted sums through [`ops::axpy_rows_heads`]).
trait KvElem: Copy + Send + Sync {
    /// `n` rows of `hd` elements, `stride` apart in `src`, as f32: the rows themselves for
    /// f32 (with their stride), else converted into `scratch` (stride `hd`).
    fn rows<'a>(
        src: &'a [Self],
        hd: usize,
        stride: usize,
        n: usize,
        scratch: &'a mut [f32],
    ) -> (&'a [f32], usize);
}

impl KvElem for f32 {
    fn rows<'a>(
        src: &'a [f32],
        _: usize,
        stride: usize,
        _: usize,
        _: &'a mut [f32],
    ) -> (&'a [f32], usize) {
        (src, stride)
    }
}

/// Rows of a 16-bit cache converted to f32 into `scratch`.
fn convert_rows<'a, T>(
    src: &[T],
    hd: usize,
    stride: usize,
    n: usize,
    scratch: &'a mut [f32],
) -> (&'a [f32], usize)
where
    [T]: half::slice::HalfFloatSliceExt,
{
    use half::slice::HalfFloatSliceExt;
    for j in 0..n {
        src[j * stride..j * stride + hd].convert_to_f32_slice(&mut scratch[j * hd..(j + 1) * hd]);
    }
    (&scratch[..n * hd], hd)
}

/// The 16-bit caches: rows converted to f32.
macro_rules! half_kv_elem {
    ($($t:ty),*) => {$(
        impl KvElem for $t {
            fn rows<'a>(
                src: &'a [Self],
                hd: usize,
                stride: usize,
                n: usize,
                scratch: &'a mut [f32],
            ) -> (&'a [f32], usize) {
                convert_rows(src, hd, stride, n, scratch)
            }
        }
    )*};
}
half_kv_elem!(half::f16, half::bf16);

/// Queries per task: enough to amortise a task, few enough to balance a short chunk.
const QUERY_BLOCK: usize = 16;
/// Most key and value bytes an attention task asks the cache for ahead of use: half of a
/// core's L2 on the CPUs measured (1 MiB on Zen 4).
const PREFETCH_BYTES: usize = 512 * 1024;

/// The tokens of one sequence within the step's activation matrix.
pub(crate) struct ChunkSpan<'a> {
    /// Row of the first token in the step's activations.
    pub row: usize,
    pub len: usize,
    pub start_pos: usize,
    pub block_table: &'a [u32],
}

/// Shape of the attention and of one layer's cache buffers.
pub(crate) struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub scale: f32,
    /// The layer's sliding window (`None`: every earlier position).
    pub window: Option<usize>,
    /// Scores become `c · tanh(s / c)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
}

impl AttnShape {
    /// The first position a query at `pos` sees.
    fn first_visible(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }

    /// Scaled (and soft-capped) scores in place.
    fn finish_scores(&self, scores: &mut [f32]) {
        if let Some(cap) = self.softcap {
            scores.iter_mut().for_each(|s| *s = cap * (*s / cap).tanh());
        }
    }
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes only the (token, head) slices of its own queries and heads, which
// no other task touches; the buffer outlives the parallel region.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Taking `self` makes closures capture the whole (Send + Sync) wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

#[derive(Default)]
struct TaskScratch {
    /// The scores of a query's heads, one row of its visible positions each.
    scores: Vec<f32>,
    /// The heads' weighted sums of the values.
    acc: Vec<f32>,
    /// A KV block's keys or values converted to f32 (16-bit caches).
    rows: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<TaskScratch> = RefCell::new(TaskScratch::default());
}

/// `out[t, h, :] = softmax(q[t, h] · K[..=pos]ᵀ · scale) · V[..=pos]` for every token `t` of
/// every chunk. `q` and `out` are `rows × n_heads·head_dim`; `k_cache`/`v_cache` are one
/// layer's cache buffers (`[block][slot][kv head][head_dim]`).
///
/// # Panics
/// If a block table does not cover its chunk's positions or names a block outside the cache
/// (the model validates both before calling), or `out` is too short.
pub(crate) fn attend(
    shape: &AttnShape,
    chunks: &[ChunkSpan<'_>],
    q: &[f32],
    k_cache: &KvBuf,
    v_cache: &KvBuf,
    out: &mut [f32],
) {
    match (k_cache, v_cache) {
        (KvBuf::F32(k), KvBuf::F32(v)) => attend_typed(shape, chunks, q, k, v, out),
        (KvBuf::F16(k), KvBuf::F16(v)) => attend_typed(shape, chunks, q, k, v, out),
        (KvBuf::Bf16(k), KvBuf::Bf16(v)) => attend_typed(shape, chunks, q, k, v, out),
        _ => panic!("K and V caches of different types"),
    }
}

fn attend_typed<T: KvElem>(
    shape: &AttnShape,
    chunks: &[ChunkSpan<'_>],
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    out: &mut [f32],
) {
    let q_stride = shape.n_heads * shape.head_dim;
    let rows = chunks.iter().map(|c| c.row + c.len).max().unwrap_or(0);
    assert!(out.len() >= rows * q_stride && q.len() >= rows * q_stride);
    let mut tasks = Vec::new();
    for (c, ch) in chunks.iter().enumerate() {
        let qb = QUERY_BLOCK;
        for kvh in 0..shape.n_kv_heads {
            let mut i = 0;
            while i < ch.len {
                let e = (i + qb).min(ch.len);
                tasks.push((c, kvh, i, e));
                i = e;
            }
        }
    }
    let out_ptr = OutPtr(out.as_mut_ptr());
    tasks.par_iter().for_each(|&(c, kvh, i0, i1)| {
        let ch = &chunks[c];
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            direct_task(shape, ch, kvh, i0, i1, q, k_cache, v_cache, out_ptr, &mut s);
        });
    });
}

/// Visit KV head `kvh`'s cached rows at positions `from..to` of a sequence block by block:
/// `f(index of the block's first position counted from `from`, the range of the layer buffer
/// that holds the block's rows of that head (`n_kv_heads · head_dim` apart), rows)`.
fn for_each_block(
    shape: &AttnShape,
    table: &[u32],
    kvh: usize,
    from: usize,
    to: usize,
    mut f: impl FnMut(usize, std::ops::Range<usize>, usize),
) {
    let (bs, hd) = (shape.block_size, shape.head_dim);
    let stride = shape.n_kv_heads * hd;
    let mut pos = from;
    while pos < to {
        let (block, within) = (pos / bs, pos % bs);
        let n = (bs - within).min(to - pos);
        let at = (table[block] as usize * bs + within) * stride + kvh * hd;
        f(pos - from, at..at + (n - 1) * stride + hd, n);
        pos += n;
    }
}

#[allow(clippy::too_many_arguments)]
fn direct_task<T: KvElem>(
    shape: &AttnShape,
    ch: &ChunkSpan<'_>,
    kvh: usize,
    i0: usize,
    i1: usize,
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    out: OutPtr,
    s: &mut TaskScratch,
) {
    let hd = shape.head_dim;
    let q_stride = shape.n_heads * hd;
    let kv_stride = shape.n_kv_heads * hd;
    // The query heads that share this KV head are side by side in a token's queries: each
    // key and value row is read once for all of them.
    let group = shape.n_heads / shape.n_kv_heads;
    let width = group * hd;
    let TaskScratch { scores, acc, rows } = s;
    acc.resize(width, 0.0);
    rows.resize(shape.block_size * hd, 0.0);
    for i in i0..i1 {
        let ctx = ch.start_pos + i + 1;
        let lo = shape.first_visible(ctx - 1);
        let len = ctx - lo;
        if scores.len() < group * len {
            scores.resize(group * len, 0.0);
        }
        let t = ch.row + i;
        let qg = &q[t * q_stride + kvh * width..][..width];
        let sc = &mut scores[..group * len];
        // The rows are strided by the other heads' and scattered by blocks, which the
        // hardware prefetchers follow poorly: the task's first token asks for them before the
        // first is used (the later tokens find them in the cache), as many as the core's
        // cache holds (further ones would evict the first before their use).
        if i == i0 {
            let per_row = 2 * hd * std::mem::size_of::<T>();
            let end = ctx.min(lo + PREFETCH_BYTES / per_row);
            for_each_block(shape, ch.block_table, kvh, lo, end, |_, r, n| {
                for j in 0..n {
                    let at = r.start + j * kv_stride;
                    kernels::ops::prefetch(as_bytes(&k_cache[at..at + hd]));
                    kernels::ops::prefetch(as_bytes(&v_cache[at..at + hd]));
                }
            });
        }
        for_each_block(shape, ch.block_table, kvh, lo, ctx, |at, r, n| {
            let (keys, ks) = T::rows(&k_cache[r], hd, kv_stride, n, rows);
            ops::dots_heads(qg, hd, keys, ks, n, &mut sc[at..], len);
        });
        for head in sc.chunks_exact_mut(len) {
            head.iter_mut().for_each(|v| *v *= shape.scale);
            shape.finish_scores(head);
            ops::softmax(head);
        }
        acc.fill(0.0);
        for_each_block(shape, ch.block_table, kvh, lo, ctx, |at, r, n| {
            let (values, vs) = T::rows(&v_cache[r], hd, kv_stride, n, rows);
            ops::axpy_rows_heads(&sc[at..], len, n, values, vs, acc, hd);
        });
        // SAFETY: token t's heads of this KV head are written by this task only; bounds
        // asserted in attend.
        unsafe {
            let dst = out.get().add(t * q_stride + kvh * width);
            std::ptr::copy_nonoverlapping(acc.as_ptr(), dst, width);
        }
    }
}

/// The bytes of a cache slice, for [`kernels::ops::prefetch`].
fn as_bytes<T: KvElem>(v: &[T]) -> &[u8] {
    // SAFETY: the elements are plain numbers (f32, f16, bf16): initialised, no padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
