//! `out = x · Wᵀ` for quantised or float weights and f32 (or 8-bit quantised) activations.
//!
//! Every output element is one kernel's dot product of one weight row and one activation row,
//! computed in the same order however many rows the call has and wherever the row sits in it:
//! a row's result does not depend on the batch (batch invariance, which the serving
//! guarantees rest on). Parallel over weight rows; activation rows go in groups that share
//! each weight row's loads, and large calls walk the weight rows in sub-blocks that stay in
//! cache while every group meets them.

use rayon::prelude::*;

use super::dot::{block_sums, dot_rows, needs_block_sums, DotArgs, MAX_R};
use super::features::{cpu_isa, Isa};
use super::kquant::max_xk;
use super::kquant::{
    dot_q8k, is_super_block, quantize_row_q8k, unpack_interleaved_group, Q8KArgs, Q8KBlock, QK_K,
};
use super::q8::Q8_BLOCK;
use super::q8::{
    dot_q8, q8_blocks, q8_supports, quantize_row_q8, unsigned_quants, wants_unsigned, Q8Args,
    Q8Block, MAX_X,
};
use crate::{KernelError, QMatrix};

#[cfg(target_arch = "x86_64")]
use super::panel;

/// Weight rows per task (at least).
const FUSED_CHUNK_MIN: usize = 16;
/// Weight rows per integer-kernel call (its outputs go through a per-task buffer).
const Q8_SUB_ROWS: usize = 64;
/// Weight rows the integer kernels take per pass (at most); task sizes are multiples of it.
const ROW_PASS: usize = 8;
const _: () = assert!(Q8_SUB_ROWS.is_multiple_of(ROW_PASS));
/// Weight rows the f32 path walks before moving to the next group of activation rows.
const F32_SUB_ROWS: usize = 16;

/// One weight matrix and where its product goes (`m × w.rows()`, row-major).
pub struct MatmulJob<'w, 'o> {
    pub w: QMatrix<'w>,
    pub out: &'o mut [f32],
}

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint (row, column) ranges of the outputs; the pointers outlive the
// parallel region (it is joined before the mutable borrows end).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `out = x · Wᵀ` (or `out += x · Wᵀ` when `accumulate`), with `x` holding `m` rows of
/// `w.cols()` floats and `out` `m` rows of `w.rows()`.
pub fn matmul(
    x: &[f32],
    m: usize,
    w: &QMatrix<'_>,
    out: &mut [f32],
    accumulate: bool,
) -> Result<(), KernelError> {
    matmul_multi(x, m, &mut [MatmulJob { w: *w, out }], accumulate)
}

/// Several products of the same activations (e.g. Q, K and V) in one parallel region.
pub fn matmul_multi(
    x: &[f32],
    m: usize,
    jobs: &mut [MatmulJob<'_, '_>],
    accumulate: bool,
) -> Result<(), KernelError> {
    matmul_multi_at(cpu_isa(), x, m, jobs, accumulate)
}

/// [`matmul_multi`] on `isa`'s kernels.
pub(crate) fn matmul_multi_at(
    isa: Isa,
    x: &[f32],
    m: usize,
    jobs: &mut [MatmulJob<'_, '_>],
    accumulate: bool,
) -> Result<(), KernelError> {
    let Some(k) = check_shapes(x, m, jobs)? else {
        return Ok(());
    };
    fused(isa, x, m, k, jobs, accumulate);
    Ok(())
}

/// [`matmul`] with the activations quantised first ([`Q8Block`]s of 32 for the 32-weight
/// block types, [`Q8KBlock`]s of 256 for the K-quants and IQ4_XS) and integer dot products
/// against the weight blocks. Faster than the f32 path where the weights dominate (decode), at
/// the cost of quantisation error in the activations (relative error about `1/254` of each
/// block's largest value). Float weights fall back to [`matmul`].
pub fn matmul_q8(
    x: &[f32],
    m: usize,
    w: &QMatrix<'_>,
    out: &mut [f32],
    accumulate: bool,
) -> Result<(), KernelError> {
    matmul_multi_q8(x, m, &mut [MatmulJob { w: *w, out }], accumulate)
}

/// [`matmul_multi`] on the integer path of [`matmul_q8`]: the activations are quantised once
/// for all jobs. If any job's weights have no integer kernel, the whole call takes the f32
/// path.
pub fn matmul_multi_q8(
    x: &[f32],
    m: usize,
    jobs: &mut [MatmulJob<'_, '_>],
    accumulate: bool,
) -> Result<(), KernelError> {
    matmul_multi_q8_at(cpu_isa(), x, m, jobs, accumulate)
}

/// [`matmul_multi_q8`] on `isa`'s kernels.
pub(crate) fn matmul_multi_q8_at(
    isa: Isa,
    x: &[f32],
    m: usize,
    jobs: &mut [MatmulJob<'_, '_>],
    accumulate: bool,
) -> Result<(), KernelError> {
    let Some(k) = check_shapes(x, m, jobs)? else {
        return Ok(());
    };
    if !jobs.iter().all(|j| q8_supports(j.w.dtype())) || !k.is_multiple_of(Q8_BLOCK) {
        return matmul_multi_at(isa, x, m, jobs, accumulate);
    }
    fused_q8(isa, x, m, k, jobs, accumulate);
    Ok(())
}

/// The common `k`, or `None` when there is nothing to do.
fn check_shapes(
    x: &[f32],
    m: usize,
    jobs: &[MatmulJob<'_, '_>],
) -> Result<Option<usize>, KernelError> {
    let Some(first) = jobs.first() else {
        return Ok(None);
    };
    let k = first.w.cols();
    if x.len() != m * k {
        return Err(KernelError::Shape(format!(
            "activations have {} floats, expected {m} x {k}",
            x.len()
        )));
    }
    for j in jobs.iter() {
        if j.w.cols() != k {
            return Err(KernelError::Shape(format!(
                "weights of {} columns in a batch over {k}",
                j.w.cols()
            )));
        }
        if j.out.len() != m * j.w.rows() {
            return Err(KernelError::Shape(format!(
                "output has {} floats, expected {m} x {}",
                j.out.len(),
                j.w.rows()
            )));
        }
    }
    Ok((m > 0).then_some(k))
}

/// (job, first row, end row) work items covering every job.
fn split_rows(
    jobs: &[MatmulJob<'_, '_>],
    chunk_for: impl Fn(usize) -> usize,
) -> Vec<(usize, usize, usize)> {
    let mut tasks = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let n = job.w.rows();
        let chunk = chunk_for(n).max(1);
        let mut r = 0;
        while r < n {
            let e = (r + chunk).min(n);
            tasks.push((j, r, e));
            r = e;
        }
    }
    tasks
}

fn fused(
    isa: Isa,
    x: &[f32],
    m: usize,
    k: usize,
    jobs: &mut [MatmulJob<'_, '_>],
    accumulate: bool,
) {
    let nb = k / 32;
    let need_sums = jobs.iter().any(|j| needs_block_sums(j.w.dtype()));
    let mut xsum = Vec::new();
    if need_sums {
        xsum.resize(m * nb, 0.0);
        for (xr, sr) in x.chunks_exact(k).zip(xsum.chunks_exact_mut(nb.max(1))) {
            block_sums(xr, sr);
        }
    }
    let threads = rayon::current_num_threads().max(1);
    let total_rows: usize = jobs.iter().map(|j| j.w.rows()).sum();
    // About four tasks per thread over all jobs, for load balance, in whole groups of an
    // interleaved matrix's rows.
    let target = (total_rows / (threads * 4))
        .max(FUSED_CHUNK_MIN)
        .next_multiple_of(ROW_PASS);
    let tasks = split_rows(jobs, |_| target);
    let ws: Vec<(QMatrix<'_>, usize, OutPtr)> = jobs
        .iter_mut()
        .map(|j| (j.w, j.w.rows(), OutPtr(j.out.as_mut_ptr())))
        .collect();
    let xsum = &xsum;
    tasks.par_iter().for_each(|&(j, r0, r1)| {
        let (w, n, out) = ws[j];
        let mut vals = [0f32; MAX_R];
        let row_bytes = w.dtype().row_bytes(k);
        let mut unpacked = Vec::new();
        let mut sub = r0;
        while sub < r1 {
            let sub_end = (sub + F32_SUB_ROWS).min(r1);
            // The rows `sub..sub_end` as stored row by row.
            let rows_here: &[u8] = if w.is_interleaved() {
                unpacked.resize((sub_end - sub) * row_bytes, 0);
                interleaved_rows(&w, sub, sub_end, &mut unpacked);
                &unpacked
            } else {
                &w.data()[sub * row_bytes..sub_end * row_bytes]
            };
            let mut g = 0;
            while g < m {
                let rows = (m - g).min(MAX_R);
                for row in sub..sub_end {
                    let args = DotArgs {
                        dtype: w.dtype(),
                        w: &rows_here[(row - sub) * row_bytes..][..row_bytes],
                        k,
                        x: &x[g * k..],
                        x_stride: k,
                        xsum: if need_sums { &xsum[g * nb..] } else { &[] },
                        xsum_stride: nb,
                    };
                    dot_rows(isa, &args, &mut vals[..rows]);
                    for (i, v) in vals[..rows].iter().enumerate() {
                        let idx = (g + i) * n + row;
                        // SAFETY: `idx < m * n` (the output length checked by
                        // `check_shapes`), and no other task writes column `row` of this
                        // job's output.
                        unsafe {
                            let p = out.0.add(idx);
                            if accumulate {
                                *p += *v;
                            } else {
                                *p = *v;
                            }
                        }
                    }
                }
                g += rows;
            }
            sub = sub_end;
        }
    });
}

/// Rows `r0..r1` (whole groups) of an interleaved matrix, brought back to rows, into `out`.
fn interleaved_rows(w: &QMatrix<'_>, r0: usize, r1: usize, out: &mut [u8]) {
    const GROUP: usize = 8;
    let row_bytes = w.dtype().row_bytes(w.cols());
    let nb = w.cols() / w.dtype().block_elems();
    for (g, o) in (r0 / GROUP..r1.div_ceil(GROUP)).zip(out.chunks_mut(GROUP * row_bytes)) {
        let tiles = &w.data()[g * GROUP * row_bytes..(g + 1) * GROUP * row_bytes];
        unpack_interleaved_group(w.dtype(), nb, tiles, o);
    }
}

/// Activation rows from which [`fused_q8`] quantises them in parallel.
const PAR_QUANT_ROWS: usize = 16;

/// Each row of `k` floats of `x` into its `nb` blocks of `out`.
fn quantize_rows<B: Send>(
    x: &[f32],
    k: usize,
    out: &mut [B],
    nb: usize,
    par: bool,
    quantize: impl Fn(&[f32], &mut [B]) + Sync,
) {
    if par {
        x.par_chunks_exact(k)
            .zip(out.par_chunks_exact_mut(nb))
            .for_each(|(xr, qr)| quantize(xr, qr));
    } else {
        for (xr, qr) in x.chunks_exact(k).zip(out.chunks_exact_mut(nb)) {
            quantize(xr, qr);
        }
    }
}

fn fused_q8(
    isa: Isa,
    x: &[f32],
    m: usize,
    k: usize,
    jobs: &mut [MatmulJob<'_, '_>],
    accumulate: bool,
) {
    // Each weight family reads its own activation blocks: quantise only those needed.
    let nb = k / Q8_BLOCK;
    let nbk = k / QK_K;
    // Each row is quantised on its own (the same bits whoever does it): in parallel where
    // the rows are many, on this thread where a parallel region would cost more than it saves.
    let par = m >= PAR_QUANT_ROWS;
    let mut xq = Vec::new();
    if jobs.iter().any(|j| q8_blocks(j.w.dtype())) {
        xq = vec![Q8Block::default(); m * nb];
        quantize_rows(x, k, &mut xq, nb, par, quantize_row_q8);
    }
    let mut xqk = Vec::new();
    if jobs.iter().any(|j| is_super_block(j.w.dtype())) {
        xqk = vec![Q8KBlock::default(); m * nbk];
        quantize_rows(x, k, &mut xqk, nbk, par, quantize_row_q8k);
    }
    let threads = rayon::current_num_threads().max(1);
    let total_rows: usize = jobs.iter().map(|j| j.w.rows()).sum();
    // About four tasks per thread over all jobs, in whole passes of the kernels (eight rows:
    // a task's last pass then takes a full vector wherever the matrix allows).
    let target = (total_rows / (threads * 4))
        .max(FUSED_CHUNK_MIN)
        .next_multiple_of(ROW_PASS);
    let tasks = split_rows(jobs, |_| target);
    let ws: Vec<(QMatrix<'_>, usize, OutPtr)> = jobs
        .iter_mut()
        .map(|j| (j.w, j.w.rows(), OutPtr(j.out.as_mut_ptr())))
        .collect();
    // The panel product lays out its own offset quants.
    #[cfg(target_arch = "x86_64")]
    let by_panels = |w: &QMatrix<'_>| m >= panel::MIN_ROWS && panel::takes(isa, w);
    #[cfg(not(target_arch = "x86_64"))]
    let by_panels = |_: &QMatrix<'_>| false;
    let mut xu = Vec::new();
    if jobs
        .iter()
        .any(|j| wants_unsigned(isa, j.w.dtype(), j.w.is_interleaved()) && !by_panels(&j.w))
    {
        xu = unsigned_quants(&xq);
    }
    #[cfg(target_arch = "x86_64")]
    let panels = panel::Panels::new(isa, jobs, m, (&xq, nb), (&xqk, nbk));
    let (xq, xqk, xu) = (&xq, &xqk, &xu);
    #[cfg(target_arch = "x86_64")]
    let panels = &panels;
    tasks.par_iter().for_each(|&(j, r0, r1)| {
        let (w, n, out) = ws[j];
        let dtype = w.dtype();
        let row_bytes = dtype.row_bytes(k);
        let super_block = is_super_block(dtype);
        #[cfg(target_arch = "x86_64")]
        if by_panels(&w) {
            let dst = panel::Out {
                out: out.0,
                n,
                m,
                accumulate,
            };
            // SAFETY: this task alone writes columns `r0..r1` (whole groups: the task sizes
            // are multiples of eight, and the matrix holds whole groups) of the job's `m x n`
            // output; the panels were made from these activations for every job that takes
            // them.
            unsafe { panel::rows(&w, r0, r1, panels, &dst) };
            return;
        }
        let x_max = if super_block {
            max_xk(isa, dtype, w.is_interleaved())
        } else {
            MAX_X
        };
        // Zeroing a buffer for 64 activation rows on every decode task would cost more than
        // some of the products: the small one on the stack, the wide one (prefill) on the heap.
        let mut small = [0f32; Q8_SUB_ROWS * MAX_X];
        let mut wide = Vec::new();
        let vals: &mut [f32] = if x_max > MAX_X {
            wide.resize(Q8_SUB_ROWS * x_max, 0f32);
            &mut wide
        } else {
            &mut small
        };
        let mut row = r0;
        while row < r1 {
            let wr = (r1 - row).min(Q8_SUB_ROWS);
            let wbytes = &w.data()[row * row_bytes..(row + wr) * row_bytes];
            let mut g = 0;
            while g < m {
                let xr = (m - g).min(x_max);
                if super_block {
                    let args = Q8KArgs {
                        dtype,
                        w: wbytes,
                        w_stride: row_bytes,
                        x: &xqk[g * nbk..(g + xr) * nbk],
                        nb: nbk,
                        interleaved: w.is_interleaved(),
                    };
                    dot_q8k(isa, &args, wr, xr, vals);
                } else {
                    let args = Q8Args {
                        dtype,
                        w: wbytes,
                        w_stride: row_bytes,
                        x: &xq[g * nb..(g + xr) * nb],
                        nb,
                        interleaved: w.is_interleaved(),
                        xu: if xu.is_empty() {
                            &[]
                        } else {
                            &xu[g * nb..(g + xr) * nb]
                        },
                    };
                    dot_q8(isa, &args, wr, xr, vals);
                }
                for jx in 0..xr {
                    // SAFETY: elements `row..row + wr` of output row `g + jx` are inside the
                    // output (its length `m * n` was checked by `check_shapes`), and no other
                    // task writes these columns of this job's output.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(out.0.add((g + jx) * n + row), wr)
                    };
                    let src = vals[jx..].iter().step_by(xr);
                    if accumulate {
                        dst.iter_mut().zip(src).for_each(|(d, v)| *d += v);
                    } else {
                        dst.iter_mut().zip(src).for_each(|(d, v)| *d = *v);
                    }
                }
                g += xr;
            }
            row += wr;
        }
    });
}
