//! Causal multi-head attention (with grouped KV heads) over the paged KV cache.
//!
//! One task per (chunk, query head, block of queries), run in parallel. Each query at
//! position `p` attends to cache positions `0..=p` of its own sequence, read through the
//! sequence's block table; the keys and values of the current chunk must already be in the
//! cache.

use std::cell::RefCell;

use kernels::ops;
use rayon::prelude::*;

/// Queries per task (bounds the work of one task for long prefill chunks).
const QUERY_BLOCK: usize = 16;

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
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes only the (token, head) slices of its own queries, which no other
// task touches; the buffer outlives the parallel region.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Taking `self` makes closures capture the whole (Send + Sync) wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[t, h, :] = softmax(q[t, h] · K[..=pos]ᵀ · scale) · V[..=pos]` for every token `t` of
/// every chunk. `q` and `out` are `rows × n_heads·head_dim`; `k_cache`/`v_cache` are one
/// layer's cache buffers (`[block][slot][kv head][head_dim]`).
///
/// The caller has checked every block table against the cache (positions covered, block ids
/// in range).
pub(crate) fn attend(
    shape: &AttnShape,
    chunks: &[ChunkSpan<'_>],
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let q_stride = shape.n_heads * hd;
    let kv_stride = shape.n_kv_heads * hd;
    let group = shape.n_heads / shape.n_kv_heads;
    let mut tasks = Vec::new();
    for (c, ch) in chunks.iter().enumerate() {
        for h in 0..shape.n_heads {
            let mut i = 0;
            while i < ch.len {
                let e = (i + QUERY_BLOCK).min(ch.len);
                tasks.push((c, h, i, e));
                i = e;
            }
        }
    }
    assert!(out.len() >= chunks.iter().map(|c| c.row + c.len).max().unwrap_or(0) * q_stride);
    let out_ptr = OutPtr(out.as_mut_ptr());
    tasks.par_iter().for_each(|&(c, h, i0, i1)| {
        let ch = &chunks[c];
        let kvh = h / group;
        let bs = shape.block_size;
        SCORES.with(|scores| {
            let mut scores = scores.borrow_mut();
            let mut acc = vec![0f32; hd];
            for i in i0..i1 {
                let pos = ch.start_pos + i;
                let ctx = pos + 1;
                if scores.len() < ctx {
                    scores.resize(ctx, 0.0);
                }
                let t = ch.row + i;
                let qv = &q[t * q_stride + h * hd..][..hd];
                let s = &mut scores[..ctx];
                for (j, sj) in s.iter_mut().enumerate() {
                    let off =
                        (ch.block_table[j / bs] as usize * bs + j % bs) * kv_stride + kvh * hd;
                    *sj = ops::dot(qv, &k_cache[off..off + hd]) * shape.scale;
                }
                ops::softmax(s);
                acc.fill(0.0);
                for (j, &p) in s.iter().enumerate() {
                    let off =
                        (ch.block_table[j / bs] as usize * bs + j % bs) * kv_stride + kvh * hd;
                    ops::axpy(p, &v_cache[off..off + hd], &mut acc);
                }
                // SAFETY: row t, head h of `out` is written by this task only (tasks partition
                // (chunk, head, query) triples and chunks own disjoint rows); the bounds were
                // asserted above.
                unsafe {
                    let dst = out_ptr.get().add(t * q_stride + h * hd);
                    std::ptr::copy_nonoverlapping(acc.as_ptr(), dst, hd);
                }
            }
        });
    });
}
