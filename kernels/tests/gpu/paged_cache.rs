//! A paged KV cache of one layer for the attention checks (`tests/gpu_attention*.rs`, each
//! including this file beside `util.rs`): shuffled block tables, NaN in every slot no
//! sequence owns, an f64 reference over the values as stored, and the row check.
#![allow(dead_code)]

use kernels::gpu::ops::PagedAttention;
use kernels::gpu::{Gpu, GpuBuffer, GpuDType};

use crate::util::*;

/// What a layer may add to causal attention.
#[derive(Debug, Clone, Copy, Default)]
pub struct Extras {
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}

/// A paged cache of one layer with shuffled block tables.
pub struct Cache {
    n_kv: usize,
    hd: usize,
    block_size: usize,
    /// Host copies, already rounded to the cache's type.
    k: Vec<f32>,
    v: Vec<f32>,
    tables: Vec<Vec<u32>>,
    max_blocks: usize,
    kb: GpuBuffer,
    vb: GpuBuffer,
    tb: GpuBuffer,
}

impl Cache {
    /// Room for sequences of `lens` positions, blocks handed out in a shuffled order.
    pub fn new(
        gpu: &Gpu,
        rng: &mut Rng,
        t: GpuDType,
        lens: &[usize],
        n_kv: usize,
        hd: usize,
        block_size: usize,
    ) -> Cache {
        let per: Vec<usize> = lens.iter().map(|l| l.div_ceil(block_size)).collect();
        let total: usize = per.iter().sum::<usize>() + 3;
        let mut ids: Vec<u32> = (0..total as u32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        let mut next = ids.into_iter();
        let tables: Vec<Vec<u32>> = per
            .iter()
            .map(|&n| next.by_ref().take(n).collect())
            .collect();
        let max_blocks = per.iter().copied().max().unwrap_or(1).max(1);
        let elems = total * block_size * n_kv * hd;
        let k: Vec<f32> = rng
            .vec(elems, 1.0)
            .into_iter()
            .map(|x| round(t, x))
            .collect();
        let v: Vec<f32> = rng
            .vec(elems, 1.0)
            .into_iter()
            .map(|x| round(t, x))
            .collect();
        // Slots that hold no position of any sequence are NaN: a stray read poisons the row.
        let mut k = k;
        let mut v = v;
        let row = n_kv * hd;
        let mut owned = vec![false; total * block_size];
        for (row_blocks, &len) in tables.iter().zip(lens) {
            for p in 0..len {
                owned[row_blocks[p / block_size] as usize * block_size + p % block_size] = true;
            }
        }
        for (slot, _) in owned.iter().enumerate().filter(|(_, &o)| !o) {
            k[slot * row..(slot + 1) * row].fill(f32::NAN);
            v[slot * row..(slot + 1) * row].fill(f32::NAN);
        }
        let flat: Vec<i32> = tables
            .iter()
            .flat_map(|row| {
                let mut r: Vec<i32> = row.iter().map(|&b| b as i32).collect();
                // Padding points at a real block: a kernel that reads past the context
                // reads wrong values rather than failing the launch.
                r.resize(max_blocks, 0);
                r
            })
            .collect();
        Cache {
            n_kv,
            hd,
            block_size,
            kb: upload_as(gpu, t, &k),
            vb: upload_as(gpu, t, &v),
            tb: gpu.upload(&flat).unwrap(),
            k,
            v,
            tables,
            max_blocks,
        }
    }

    /// The attention call over this cache for `q` (rows of `q_stride`) into `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        t: GpuDType,
        s: &Shape,
        q: &GpuBuffer,
        q_stride: usize,
        out: &GpuBuffer,
        out_stride: usize,
        scale: f32,
    ) -> PagedAttention {
        PagedAttention {
            dtype: t,
            out: out.ptr(),
            q: q.ptr(),
            k_cache: self.kb.ptr(),
            v_cache: self.vb.ptr(),
            block_tables: self.tb.ptr(),
            q_stride,
            out_stride,
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv,
            head_dim: s.hd,
            block_size: s.block_size,
            max_blocks: self.max_blocks,
            scale,
            window: None,
            softcap: None,
        }
    }

    /// Positions `0..end` of `seq` become NaN, on the device and in the host copy.
    pub fn poison_before(&mut self, gpu: &Gpu, t: GpuDType, seq: usize, end: usize) {
        let row = self.n_kv * self.hd;
        for p in 0..end {
            let at = self.at(seq, p, 0);
            self.k[at..at + row].fill(f32::NAN);
            self.v[at..at + row].fill(f32::NAN);
        }
        self.kb = upload_as(gpu, t, &self.k);
        self.vb = upload_as(gpu, t, &self.v);
    }

    pub fn at(&self, seq: usize, pos: usize, kvh: usize) -> usize {
        let b = self.tables[seq][pos / self.block_size] as usize;
        ((b * self.block_size + pos % self.block_size) * self.n_kv + kvh) * self.hd
    }

    /// softmax(q·Kᵀ·scale)·V over positions `0..ctx` of `seq`, in f64.
    pub fn reference(&self, q: &[f32], seq: usize, ctx: usize, kvh: usize, scale: f32) -> Vec<f32> {
        self.reference_with(q, seq, ctx, kvh, scale, Extras::default())
    }

    /// As [`Cache::reference`], over the last `window` of the positions only, with scores
    /// `c · tanh(s / c)` for a cap `c`.
    pub fn reference_with(
        &self,
        q: &[f32],
        seq: usize,
        ctx: usize,
        kvh: usize,
        scale: f32,
        extras: Extras,
    ) -> Vec<f32> {
        let hd = self.hd;
        let first = extras.window.map_or(0, |w| ctx.saturating_sub(w));
        let scores: Vec<f64> = (first..ctx)
            .map(|p| {
                let k = &self.k[self.at(seq, p, kvh)..][..hd];
                let s = q
                    .iter()
                    .zip(k)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * scale as f64;
                match extras.softcap {
                    Some(c) => c as f64 * (s / c as f64).tanh(),
                    None => s,
                }
            })
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = w.iter().sum();
        let mut out = vec![0f64; hd];
        for (p, wp) in (first..ctx).zip(&w) {
            let v = &self.v[self.at(seq, p, kvh)..][..hd];
            for (o, x) in out.iter_mut().zip(v) {
                *o += wp / total * *x as f64;
            }
        }
        out.into_iter().map(|x| x as f32).collect()
    }
}

pub struct Shape {
    pub n_heads: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub block_size: usize,
}

/// Query rows with a stride wider than the heads, as the fused QKV rows are.
pub fn queries(rng: &mut Rng, rows: usize, s: &Shape) -> (Vec<f32>, usize) {
    let stride = s.n_heads * s.hd + 2 * s.n_kv * s.hd;
    (rng.vec(rows * stride, 1.0), stride)
}

/// Query rows `q` (stride `q_stride`) against the reference: `rows` are `(row, seq, ctx)`;
/// every head of those rows must match, and every other element of `out` stay poisoned.
#[allow(clippy::too_many_arguments)]
pub fn check_rows(
    what: &str,
    t: GpuDType,
    s: &Shape,
    cache: &Cache,
    q: &[f32],
    q_stride: usize,
    got: &[f32],
    out_stride: usize,
    rows: &[(usize, usize, usize)],
    scale: f32,
    extras: Extras,
) {
    let group = s.n_heads / s.n_kv;
    let mut written = vec![false; got.len()];
    let (mut want_all, mut got_all) = (Vec::new(), Vec::new());
    for &(r, seq, ctx) in rows {
        for h in 0..s.n_heads {
            let qh = &q[r * q_stride + h * s.hd..][..s.hd];
            let want = cache.reference_with(qh, seq, ctx, h / group, scale, extras);
            want_all.extend(want.iter().map(|&x| round(t, x)));
            let at = r * out_stride + h * s.hd;
            got_all.extend_from_slice(&got[at..at + s.hd]);
            written[at..at + s.hd].fill(true);
        }
    }
    let stray = got
        .iter()
        .zip(&written)
        .position(|(x, &w)| !w && !x.is_nan());
    assert!(stray.is_none(), "{what}: element {stray:?} written");
    assert_close(what, t, &got_all, &want_all);
}
