//! The panel products of `fused_q8` (`super::matmul`) on AVX-512 VNNI: where a product's
//! activation rows are many (prefill) and its matrix is interleaved, each weight group is
//! unpacked once per call and multiplied by the activations laid out in panels of sixteen rows
//! (`kquant::gemm_vnni` for the super-block types, `q8::gemm_vnni` for the 32-weight types).
//! Every output is the same bits as the row kernels give it.

use rayon::prelude::*;

use super::features::{CpuLevel, Isa};
use super::kquant::{self, gemm_vnni as kgemm, Q8KBlock};
use super::q8::{self, gemm_vnni as bgemm, Q8Block};
use crate::{DType, MatmulJob, QMatrix};

/// Activation rows from which interleaved matrices take the panel product: it unpacks each
/// weight once per call, which pays when enough rows share it.
pub(crate) const MIN_ROWS: usize = 16;
/// Groups (of eight weight rows) unpacked at a time: each panel of activations is read once
/// per strip while the strip stays in the core's cache.
const STRIP: usize = 4;
const GROUP: usize = 8;
const PANEL: usize = kgemm::PANEL;

/// Whether `w`'s rows take the panel product on `isa`.
pub(crate) fn takes(isa: Isa, w: &QMatrix<'_>) -> bool {
    isa.level() == CpuLevel::Avx512Vnni
        && w.is_interleaved()
        && (kgemm::takes(w.dtype()) || blocks32(w.dtype()))
}

/// The 32-weight types the panel product takes: all but Q4_1, whose row kernel multiplies its
/// nibbles as stored by the activations as they are (no unpacking to share), as fast.
fn blocks32(dtype: DType) -> bool {
    q8::q8_blocks(dtype) && dtype != DType::Q4_1
}

/// The activations in panels, for both block sizes as the jobs need them (empty when no job
/// takes the panel product).
#[derive(Default)]
pub(crate) struct Panels {
    k: Vec<kgemm::Panel>,
    b: Vec<bgemm::Panel>,
}

impl Panels {
    /// `xq` / `xqk`: the `m` rows quantised to 32- / 256-value blocks (`nb` / `nbk` a row),
    /// each empty where no job reads it.
    pub(crate) fn new(
        isa: Isa,
        jobs: &[MatmulJob<'_, '_>],
        m: usize,
        (xq, nb): (&[Q8Block], usize),
        (xqk, nbk): (&[Q8KBlock], usize),
    ) -> Panels {
        let mut p = Panels::default();
        if m < MIN_ROWS {
            return p;
        }
        let wants = |f: fn(DType) -> bool| jobs.iter().any(|j| takes(isa, &j.w) && f(j.w.dtype()));
        if wants(kgemm::takes) {
            p.k = xqk
                .par_chunks(PANEL * nbk)
                .map(|c| kgemm::Panel::new(c, c.len() / nbk, nbk))
                .collect();
        }
        if wants(blocks32) {
            p.b = xq
                .par_chunks(PANEL * nb)
                .map(|c| bgemm::Panel::new(c, c.len() / nb, nb))
                .collect();
        }
        p
    }
}

/// Where a task's products go: `m` rows of `n` outputs from `out`, written or added.
pub(crate) struct Out {
    pub out: *mut f32,
    pub n: usize,
    pub m: usize,
    pub accumulate: bool,
}

/// Weight rows `r0..r1` (whole groups) of the interleaved `w` (which [`takes`] the panel
/// product) against every panel; `nb` its blocks per row.
///
/// # Safety
/// `dst.out` must point to `dst.m · dst.n` floats of which no other thread touches columns
/// `r0..r1`, `dst.n` must be `w.rows()`, and the panels must have been made for `w`'s block
/// size.
pub(crate) unsafe fn rows(w: &QMatrix<'_>, r0: usize, r1: usize, panels: &Panels, dst: &Out) {
    let dtype = w.dtype();
    let nb = w.cols() / dtype.block_elems();
    let group_bytes = GROUP * dtype.row_bytes(w.cols());
    assert!(r0.is_multiple_of(GROUP) && r1.is_multiple_of(GROUP) && r1 <= w.rows());
    let mut tile = [[0f32; PANEL]; GROUP];
    let mut strip_k: Vec<kgemm::Unpacked8> = Vec::new();
    let mut strip_b: Vec<bgemm::Unpacked8> = Vec::new();
    let wide = kquant::is_super_block(dtype);
    if wide {
        strip_k.resize_with(STRIP, Default::default);
    } else {
        strip_b.resize_with(STRIP, Default::default);
    }
    let count = if wide { panels.k.len() } else { panels.b.len() };
    let mut row = r0;
    while row < r1 {
        let gn = ((r1 - row) / GROUP).min(STRIP);
        for g in 0..gn {
            let at = (row / GROUP + g) * group_bytes;
            let tiles = &w.data()[at..at + group_bytes];
            // SAFETY: `takes` saw the level, so the CPU has the features; `tiles` is one whole
            // group.
            unsafe {
                if wide {
                    strip_k[g].fill(dtype, tiles, nb);
                } else {
                    strip_b[g].fill(dtype, tiles, nb);
                }
            }
        }
        for p in 0..count {
            let cols = (dst.m - p * PANEL).min(PANEL);
            for g in 0..gn {
                // SAFETY: as above; the group and the panel were filled for `nb` blocks.
                unsafe {
                    if wide {
                        kgemm::product(dtype, &strip_k[g], &panels.k[p], nb, &mut tile);
                    } else {
                        bgemm::product(dtype, &strip_b[g], &panels.b[p], nb, &mut tile);
                    }
                }
                let r = row + g * GROUP;
                for j in 0..cols {
                    // SAFETY: outputs `r..r + 8` of activation row `p * 16 + j` are inside
                    // the output and in this task's columns, as the caller vouches.
                    let o = unsafe {
                        std::slice::from_raw_parts_mut(
                            dst.out.add((p * PANEL + j) * dst.n + r),
                            GROUP,
                        )
                    };
                    let vals = tile.iter().map(|t| t[j]);
                    if dst.accumulate {
                        o.iter_mut().zip(vals).for_each(|(o, v)| *o += v);
                    } else {
                        o.iter_mut().zip(vals).for_each(|(o, v)| *o = v);
                    }
                }
            }
        }
        row += gn * GROUP;
    }
}
