//! Dense f32 matrix multiply for the encoder: `C = A · B (+ bias)` with B pre-packed.
//!
//! B is packed once (weights at load time, attention keys/values per head) into column panels
//! of [`NR`] floats, row after row, so the micro-kernel reads it with aligned, sequential loads.
//! A is read in place (row-major with a stride). The micro-kernel computes an [`MR`]×[`NR`]
//! tile with AVX2+FMA, or an [`MR`]×(up to [`NP_MAX`] panels) tile with AVX-512, where the CPU
//! has it (run-time detection), and a portable loop elsewhere.
//!
//! Every element of C is accumulated over k in the same order whatever the other rows are, so
//! a row of C does not depend on which batch it was computed in (batched and one-by-one
//! results are bit-identical). Large products are split over row blocks on the current rayon
//! pool.

use rayon::prelude::*;

use super::ops::Activation;
use crate::error::{EngineError, Result};

/// Rows per micro-tile.
pub(crate) const MR: usize = 6;
/// Columns per packed panel (and per AVX2 micro-tile).
pub(crate) const NR: usize = 16;
/// Most panels one micro-tile covers (the AVX-512 kernel: 6 × 48, 18 accumulators).
const NP_MAX: usize = 3;
/// Most depth of one k block for a tile of [`NP_MAX`] panels: the AVX-512 tile's three panels
/// (`KC * 3 * NR` floats, 36 KiB) stay in a 48 KiB L1 while every row group of the block meets
/// them. Narrower tiles go proportionally deeper.
const KC: usize = 192;
/// Largest row block one task handles.
const MC_MAX: usize = 96;
/// Pack A when the product has at least this many column panels.
const PACK_A_MIN_PANELS: usize = 16;
/// Below this many multiply-adds a product runs on the calling thread.
const PAR_MIN_FLOPS: usize = 1 << 18;
/// Floats per 64-byte cache line.
const LINE: usize = 16;

/// `B` (k × n) packed into `ceil(n / NR)` panels; panel `p` holds rows `0..k` of columns
/// `p*NR .. p*NR+NR` (zero-padded), one NR-wide row after the other.
#[derive(Debug, Clone, Default)]
pub(crate) struct PackedB {
    k: usize,
    n: usize,
    /// Backing store, over-allocated so that the panels can start on a cache line.
    buf: Vec<f32>,
    start: usize,
}

impl PackedB {
    fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    fn data(&self) -> &[f32] {
        &self.buf[self.start..]
    }

    /// The packed panels, one after the other (see the layouts of the packers).
    pub(super) fn packed(&self) -> &[f32] {
        let len = self.panels() * NR * self.k;
        &self.data()[..len]
    }

    /// Sizes the store for a k × n matrix and returns the panel area. Only the padding
    /// columns of the last panel are zeroed: the packers write every other element.
    fn reshape(&mut self, k: usize, n: usize) -> &mut [f32] {
        self.k = k;
        self.n = n;
        let len = n.div_ceil(NR) * NR * k;
        if self.buf.len() < len + LINE {
            self.buf.resize(len + LINE, 0.0);
        }
        let misalign = (self.buf.as_ptr() as usize / std::mem::size_of::<f32>()) % LINE;
        self.start = (LINE - misalign) % LINE;
        let area = &mut self.buf[self.start..self.start + len];
        if !n.is_multiple_of(NR) {
            let last = (n / NR) * NR * k;
            area[last..].fill(0.0);
        }
        area
    }

    /// Packs a PyTorch `Linear` weight (`n` rows of `k` inputs, row-major), so that
    /// `x · B = x · Wᵀ`.
    pub(crate) fn from_linear(w: &[f32], n: usize, k: usize) -> Self {
        let mut b = PackedB::default();
        b.pack_transposed(w, k, k, n);
        b
    }

    /// Packs `B[kk][nn] = src[nn * ld + kk]` (B given column by column, e.g. keys for Q·Kᵀ).
    pub(crate) fn pack_transposed(&mut self, src: &[f32], ld: usize, k: usize, n: usize) {
        #[cfg(target_arch = "x86_64")]
        let gather = Kernel::detect().gathers() && ld <= i32::MAX as usize / NR;
        let dst = self.reshape(k, n);
        for (p, panel) in dst
            .chunks_exact_mut(NR * k.max(1))
            .enumerate()
            .take(n.div_ceil(NR))
        {
            #[cfg(target_arch = "x86_64")]
            {
                let base = p * NR * ld;
                if gather && n - p * NR >= NR && k > 0 && base + (NR - 1) * ld + k <= src.len() {
                    // SAFETY: AVX-512F was detected (`gathers`); the panel's 16 columns of `k`
                    // floats, `ld` apart, lie inside `src` (checked just above) and the panel
                    // holds `k * NR` floats; the offsets `j * ld` fit in an i32.
                    unsafe { avx512::gather_panel(&src[base..], ld, k, panel) };
                    continue;
                }
            }
            for j in 0..NR.min(n - p * NR) {
                let col = &src[(p * NR + j) * ld..(p * NR + j) * ld + k];
                for (kk, &v) in col.iter().enumerate() {
                    panel[kk * NR + j] = v;
                }
            }
        }
    }

    /// Packs `B[kk][nn] = src[kk * ld + nn]` (B given row by row, e.g. values for P·V).
    pub(crate) fn pack_rows(&mut self, src: &[f32], ld: usize, k: usize, n: usize) {
        let dst = self.reshape(k, n);
        for (p, panel) in dst
            .chunks_exact_mut(NR * k.max(1))
            .enumerate()
            .take(n.div_ceil(NR))
        {
            let width = NR.min(n - p * NR);
            for kk in 0..k {
                let row = &src[kk * ld + p * NR..kk * ld + p * NR + width];
                panel[kk * NR..kk * NR + width].copy_from_slice(row);
            }
        }
    }
}

/// Whether the products run on the AVX-512 kernel (the CPU has it and
/// `ENGINE_F32_GEMM_LEVEL` does not cap it).
pub(crate) fn avx512_enabled() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(Kernel::detect(), Kernel::Avx512)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// What is done to each finished element of C: `act(acc + bias)`.
#[derive(Clone, Copy, Default)]
pub(crate) struct Epilogue<'a> {
    pub(crate) bias: Option<&'a [f32]>,
    /// Applied to each tile as it is finished, while it is still in L1.
    pub(crate) act: Option<Activation>,
}

/// `C[m × n] = A[m × k] · B (+ bias)`, where `A` has row stride `lda` and `C` row stride `ldc`
/// (`ldc >= n`; only the first `n` columns of each C row are written). Splits large products
/// over the current rayon pool when `parallel` is set.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    bias: Option<&[f32]>,
    parallel: bool,
) -> Result<()> {
    let post = Epilogue { bias, act: None };
    gemm_post(m, a, lda, b, c, ldc, post, parallel)
}

/// [`gemm`] with an activation applied to every element of the result.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_post(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    post: Epilogue<'_>,
    parallel: bool,
) -> Result<()> {
    let bias = post.bias;
    let (k, n) = (b.k, b.n);
    if m == 0 || n == 0 {
        return Ok(());
    }
    let a_needed = (m - 1) * lda + k;
    if lda < k || ldc < n || a.len() < a_needed || c.len() < (m - 1) * ldc + n {
        return Err(EngineError::Internal(format!(
            "gemm shapes: m={m} k={k} n={n} lda={lda} ldc={ldc} a={} c={}",
            a.len(),
            c.len()
        )));
    }
    if bias.is_some_and(|bias| bias.len() < n) {
        return Err(EngineError::Internal(format!(
            "gemm bias shorter than n={n}"
        )));
    }
    let c = &mut c[..(m - 1) * ldc + n];
    let kernel = Kernel::detect();
    let threads = rayon::current_num_threads();
    if !parallel || threads < 2 || m * n * k < PAR_MIN_FLOPS || m <= MR {
        gemm_rows(kernel, 0, m, a, lda, b, c, ldc, post);
        return Ok(());
    }
    // Enough row blocks to balance the threads, each a whole number of micro-tiles.
    let mc = m
        .div_ceil(4 * threads)
        .next_multiple_of(MR)
        .clamp(MR, MC_MAX);
    c.par_chunks_mut(mc * ldc)
        .enumerate()
        .for_each(|(blk, c_blk)| {
            let r0 = blk * mc;
            let rows = mc.min(m - r0);
            gemm_rows(kernel, r0, rows, a, lda, b, c_blk, ldc, post);
        });
    Ok(())
}

/// Rows `r0 .. r0 + rows` of the product into `c` (which starts at row `r0`), in blocks of at
/// most [`MC_MAX`] rows so that a block of A stays in L2 while it meets every B panel.
#[allow(clippy::too_many_arguments)]
fn gemm_rows(
    kernel: Kernel,
    r0: usize,
    rows: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    post: Epilogue<'_>,
) {
    let mut done = 0;
    while done < rows {
        let block = MC_MAX.min(rows - done);
        let c_blk = &mut c[done * ldc..];
        gemm_block(kernel, r0 + done, block, a, lda, b, c_blk, ldc, post);
        done += block;
    }
}

/// One row block: for each tile of panels, every k block, every row group. The tile's panels
/// for one k block stay in L1 while the row groups pass over them; the block of A (packed
/// once for all k) stays in L2.
#[allow(clippy::too_many_arguments)]
fn gemm_block(
    kernel: Kernel,
    r0: usize,
    rows: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    post: Epilogue<'_>,
) {
    let (k, n) = (b.k, b.n);
    let data = b.data();
    let panels = b.panels();
    // A product of fewer panels than a wide tile can go deeper for the same L1 footprint (e.g.
    // P·V's 32 columns). The depth depends on the shape only, not on the kernel, so that every
    // SIMD kernel sums in the same order.
    let tile_panels = NP_MAX.min(panels).max(1);
    let blocks = k.div_ceil(KC * NP_MAX / tile_panels).max(1);
    let kc_even = k.div_ceil(blocks);
    let groups = rows.div_ceil(MR);
    // Packing A costs about one pass over the block; it pays when many panels reuse it.
    let pack = panels >= PACK_A_MIN_PANELS;
    A_PACK.with(|cell| {
        let mut a_pack = cell.borrow_mut();
        if pack {
            if a_pack.len() < groups * MR * k {
                a_pack.resize(groups * MR * k, 0.0);
            }
            pack_a(a, lda, r0, rows, k, &mut a_pack[..groups * MR * k]);
        }
        let mut p = 0;
        while p < panels {
            let np = kernel.panels_per_tile().min(panels - p);
            let cols = (np * NR).min(n - p * NR);
            let mut k0 = 0;
            loop {
                let kc = kc_even.min(k - k0);
                let first = k0 == 0;
                let last = k0 + kc >= k;
                let panel = &data[(p * k + k0) * NR..((p + np - 1) * k + k0 + kc) * NR];
                let bias_tile = match (last, post.bias) {
                    (true, Some(bias)) => Some(&bias[p * NR..p * NR + cols]),
                    _ => None,
                };
                for g in 0..groups {
                    let tile_rows = MR.min(rows - g * MR);
                    let (a_src, a_rows, a_step): (&[f32], [usize; MR], usize) = if pack {
                        (
                            &a_pack[g * MR * k..(g + 1) * MR * k],
                            std::array::from_fn(|r| k0 * MR + r),
                            MR,
                        )
                    } else {
                        // Rows past the end repeat the tile's first row; their results are
                        // computed but not stored.
                        let offsets = std::array::from_fn(|r| {
                            let row = if r < tile_rows {
                                r0 + g * MR + r
                            } else {
                                r0 + g * MR
                            };
                            row * lda + k0
                        });
                        (a, offsets, 1)
                    };
                    let tile = Tile {
                        kc,
                        a: a_src,
                        a_rows,
                        a_step,
                        panel,
                        np,
                        panel_stride: k * NR,
                        c_off: g * MR * ldc + p * NR,
                        ldc,
                        rows: tile_rows,
                        cols,
                        first,
                        bias: bias_tile,
                    };
                    kernel.run(&tile, c);
                    if let (true, Some(act)) = (last, post.act) {
                        for r in 0..tile_rows {
                            let off = tile.c_off + r * ldc;
                            act.apply(&mut c[off..off + cols]);
                        }
                    }
                }
                k0 += kc;
                if k0 >= k {
                    break;
                }
            }
            p += np;
        }
    });
}

thread_local! {
    /// Per-thread buffer for packed blocks of A.
    static A_PACK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Packs rows `r0..r0+rows`, columns `0..kc` of A into groups of [`MR`] rows laid out
/// `[group][k][row]`, so the micro-kernel reads A as one sequential stream. Rows past the end
/// of the last group are zero.
fn pack_a(a: &[f32], lda: usize, r0: usize, rows: usize, kc: usize, out: &mut [f32]) {
    for (g, group) in out.chunks_exact_mut(MR * kc).enumerate() {
        let valid = MR.min(rows - g * MR);
        if valid == MR {
            let row = |r: usize| {
                let start = (r0 + g * MR + r) * lda;
                &a[start..start + kc]
            };
            let (a0, a1, a2, a3, a4, a5) = (row(0), row(1), row(2), row(3), row(4), row(5));
            for (p, dst) in group.chunks_exact_mut(MR).enumerate() {
                dst.copy_from_slice(&[a0[p], a1[p], a2[p], a3[p], a4[p], a5[p]]);
            }
        } else {
            group.fill(0.0);
            for r in 0..valid {
                let start = (r0 + g * MR + r) * lda;
                for (p, &v) in a[start..start + kc].iter().enumerate() {
                    group[p * MR + r] = v;
                }
            }
        }
    }
}

/// One micro-tile: `C[rows × cols] (+)= A[rows, k0..k0+kc] · panel`.
struct Tile<'a> {
    kc: usize,
    /// A, packed (see [`pack_a`]) or in place.
    a: &'a [f32],
    /// Offset into `a` of each of the MR rows at the block's first k.
    a_rows: [usize; MR],
    /// Distance in `a` from one k to the next (MR when packed, 1 in place).
    a_step: usize,
    /// The tile's panels: `kc × NR` packed floats each, `panel_stride` apart.
    panel: &'a [f32],
    /// Panels in the tile (1 ..= [`NP_MAX`]).
    np: usize,
    /// Distance in `panel` from one panel's first float to the next's.
    panel_stride: usize,
    /// Offset into `c` of the tile's top-left element.
    c_off: usize,
    ldc: usize,
    rows: usize,
    cols: usize,
    /// First k block: overwrite C instead of accumulating into it.
    first: bool,
    /// Last k block: add the bias (`cols` values).
    bias: Option<&'a [f32]>,
}

#[derive(Clone, Copy, Debug)]
enum Kernel {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    /// AVX-512F (with AVX2 and FMA, which every AVX-512 CPU has, for single panels).
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// An accumulator tile as wide as the widest micro-tile.
type Acc = [[f32; NR * NP_MAX]; MR];

impl Kernel {
    /// The best kernel the CPU has, detected once; `ENGINE_F32_GEMM_LEVEL=portable|avx2` caps
    /// it (for benchmarks and tests).
    fn detect() -> Self {
        static KERNEL: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *KERNEL.get_or_init(|| {
            let cap = std::env::var("ENGINE_F32_GEMM_LEVEL").ok();
            if cap.as_deref() == Some("portable") {
                return Kernel::Portable;
            }
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    if std::arch::is_x86_feature_detected!("avx512f")
                        && cap.as_deref() != Some("avx2")
                    {
                        return Kernel::Avx512;
                    }
                    return Kernel::Avx2Fma;
                }
            }
            Kernel::Portable
        })
    }

    /// Whether [`PackedB::pack_transposed`] can gather a panel's rows with AVX-512.
    #[cfg(target_arch = "x86_64")]
    fn gathers(self) -> bool {
        matches!(self, Kernel::Avx512)
    }

    /// Panels one micro-tile of this kernel covers.
    fn panels_per_tile(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => NP_MAX,
            _ => 1,
        }
    }

    fn run(self, t: &Tile<'_>, c: &mut [f32]) {
        // The kernels read a[a_rows[r] + p * a_step] for p < kc and kc * NR floats of each
        // panel; checked here once so that they can use unchecked loads.
        let last_step = t.kc.saturating_sub(1) * t.a_step;
        let in_bounds = t.panel.len() >= (t.np - 1) * t.panel_stride + t.kc * NR
            && t.a_rows.iter().all(|&off| off + last_step < t.a.len());
        #[cfg(target_arch = "x86_64")]
        if let (Kernel::Avx512, 1..=NP_MAX, true) = (self, t.np, in_bounds) {
            let full = t.rows == MR
                && t.cols == t.np * NR
                && t.c_off + (MR - 1) * t.ldc + t.cols <= c.len();
            let edge = (1..=MR).contains(&t.rows)
                && t.cols > (t.np - 1) * NR
                && t.cols <= t.np * NR
                && t.c_off + (t.rows - 1) * t.ldc + t.cols <= c.len();
            if full || edge {
                // SAFETY: AVX-512F was detected at run time; the bounds of A, the panels and
                // of the C tile (whole, or its valid rows and columns for the masked stores)
                // were checked just above.
                unsafe {
                    match (t.np, full) {
                        (1, true) => avx512::tile_store::<1>(t, c),
                        (2, true) => avx512::tile_store::<2>(t, c),
                        (_, true) => avx512::tile_store::<NP_MAX>(t, c),
                        (1, false) => avx512::tile_store_masked::<1>(t, c),
                        (2, false) => avx512::tile_store_masked::<2>(t, c),
                        (_, false) => avx512::tile_store_masked::<NP_MAX>(t, c),
                    }
                }
                return;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if let (Kernel::Avx2Fma | Kernel::Avx512, 1, true) = (self, t.np, in_bounds) {
            if t.rows == MR && t.cols == NR && t.c_off + (MR - 1) * t.ldc + NR <= c.len() {
                // SAFETY: AVX2 and FMA were detected at run time; the bounds of A, the panel
                // and the full C tile were checked just above.
                unsafe { avx2::tile_store(t, c) };
            } else {
                let mut acc = [[0.0f32; NR * NP_MAX]; MR];
                // SAFETY: as above; the result goes to `acc`, not to C.
                unsafe { avx2::tile_acc(t, &mut acc) };
                store_partial(t, &acc, c);
            }
            return;
        }
        let mut acc = [[0.0f32; NR * NP_MAX]; MR];
        portable_tile(t, &mut acc);
        store_partial(t, &acc, c);
    }
}

/// Merges an accumulator tile into C for the valid rows and columns.
fn store_partial(t: &Tile<'_>, acc: &Acc, c: &mut [f32]) {
    for (r, acc_row) in acc.iter().enumerate().take(t.rows) {
        let row = &mut c[t.c_off + r * t.ldc..t.c_off + r * t.ldc + t.cols];
        for (j, out) in row.iter_mut().enumerate() {
            let mut v = if t.first {
                acc_row[j]
            } else {
                *out + acc_row[j]
            };
            if let Some(bias) = t.bias {
                v += bias[j];
            }
            *out = v;
        }
    }
}

fn portable_tile(t: &Tile<'_>, acc: &mut Acc) {
    for p in 0..t.kc {
        for j in 0..t.np {
            let brow = &t.panel[j * t.panel_stride + p * NR..][..NR];
            for (r, acc_row) in acc.iter_mut().enumerate() {
                let x = t.a[t.a_rows[r] + p * t.a_step];
                for (o, &bv) in acc_row[j * NR..(j + 1) * NR].iter_mut().zip(brow) {
                    *o += x * bv;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Acc, Tile, MR, NR};
    use std::arch::x86_64::*;

    /// The accumulators of one tile, as (low 8, high 8) column halves per row.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `a_rows[r] + (kc-1) * a_step < a.len()` for every row and
    /// the panel holds `kc * NR` floats.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_compute(t: &Tile<'_>) -> [[__m256; 2]; MR] {
        // SAFETY: every pointer below stays inside `a` or the panel, as documented above.
        unsafe {
            let a = t.a.as_ptr();
            let p0 = a.add(t.a_rows[0]);
            let p1 = a.add(t.a_rows[1]);
            let p2 = a.add(t.a_rows[2]);
            let p3 = a.add(t.a_rows[3]);
            let p4 = a.add(t.a_rows[4]);
            let p5 = a.add(t.a_rows[5]);
            let step = t.a_step;
            let mut idx = 0;
            let mut c00 = _mm256_setzero_ps();
            let mut c01 = _mm256_setzero_ps();
            let mut c10 = _mm256_setzero_ps();
            let mut c11 = _mm256_setzero_ps();
            let mut c20 = _mm256_setzero_ps();
            let mut c21 = _mm256_setzero_ps();
            let mut c30 = _mm256_setzero_ps();
            let mut c31 = _mm256_setzero_ps();
            let mut c40 = _mm256_setzero_ps();
            let mut c41 = _mm256_setzero_ps();
            let mut c50 = _mm256_setzero_ps();
            let mut c51 = _mm256_setzero_ps();
            let mut bp = t.panel.as_ptr();
            for _ in 0..t.kc {
                let b0 = _mm256_loadu_ps(bp);
                let b1 = _mm256_loadu_ps(bp.add(8));
                let x = _mm256_broadcast_ss(&*p0.add(idx));
                c00 = _mm256_fmadd_ps(x, b0, c00);
                c01 = _mm256_fmadd_ps(x, b1, c01);
                let x = _mm256_broadcast_ss(&*p1.add(idx));
                c10 = _mm256_fmadd_ps(x, b0, c10);
                c11 = _mm256_fmadd_ps(x, b1, c11);
                let x = _mm256_broadcast_ss(&*p2.add(idx));
                c20 = _mm256_fmadd_ps(x, b0, c20);
                c21 = _mm256_fmadd_ps(x, b1, c21);
                let x = _mm256_broadcast_ss(&*p3.add(idx));
                c30 = _mm256_fmadd_ps(x, b0, c30);
                c31 = _mm256_fmadd_ps(x, b1, c31);
                let x = _mm256_broadcast_ss(&*p4.add(idx));
                c40 = _mm256_fmadd_ps(x, b0, c40);
                c41 = _mm256_fmadd_ps(x, b1, c41);
                let x = _mm256_broadcast_ss(&*p5.add(idx));
                c50 = _mm256_fmadd_ps(x, b0, c50);
                c51 = _mm256_fmadd_ps(x, b1, c51);
                bp = bp.add(NR);
                idx += step;
            }
            [
                [c00, c01],
                [c10, c11],
                [c20, c21],
                [c30, c31],
                [c40, c41],
                [c50, c51],
            ]
        }
    }

    /// The full tile straight into C.
    ///
    /// # Safety
    /// As [`tile_compute`], and `c_off + (MR-1)*ldc + NR <= c.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_store(t: &Tile<'_>, c: &mut [f32]) {
        // SAFETY: bounds as documented above.
        unsafe {
            let acc = tile_compute(t);
            let cp = c.as_mut_ptr().add(t.c_off);
            for (r, halves) in acc.iter().enumerate().take(MR) {
                for (h, &v) in halves.iter().enumerate() {
                    let dst = cp.add(r * t.ldc + h * 8);
                    let mut out = if t.first {
                        v
                    } else {
                        _mm256_add_ps(_mm256_loadu_ps(dst), v)
                    };
                    if let Some(bias) = t.bias {
                        out = _mm256_add_ps(out, _mm256_loadu_ps(bias.as_ptr().add(h * 8)));
                    }
                    _mm256_storeu_ps(dst, out);
                }
            }
        }
    }

    /// The tile into an accumulator array (for edge tiles).
    ///
    /// # Safety
    /// As [`tile_store`], without the condition on C.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_acc(t: &Tile<'_>, out: &mut Acc) {
        // SAFETY: bounds as documented above; `out` rows hold NR = 16 floats.
        unsafe {
            let acc = tile_compute(t);
            for (r, halves) in acc.iter().enumerate() {
                _mm256_storeu_ps(out[r].as_mut_ptr(), halves[0]);
                _mm256_storeu_ps(out[r].as_mut_ptr().add(8), halves[1]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Tile, MR, NR};
    use std::arch::x86_64::*;

    /// The accumulators of one tile of `NP` panels, per row.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `a_rows[r] + (kc-1) * a_step < a.len()` for every row and the
    /// panel slice holds `(NP-1) * panel_stride + kc * NR` floats.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::needless_range_loop)]
    unsafe fn tile_compute<const NP: usize>(t: &Tile<'_>) -> [[__m512; NP]; MR] {
        // SAFETY: every pointer below stays inside `a` or the panels, as documented above.
        unsafe {
            let a = t.a.as_ptr();
            let rows: [*const f32; MR] = [
                a.add(t.a_rows[0]),
                a.add(t.a_rows[1]),
                a.add(t.a_rows[2]),
                a.add(t.a_rows[3]),
                a.add(t.a_rows[4]),
                a.add(t.a_rows[5]),
            ];
            let (step, stride) = (t.a_step, t.panel_stride);
            let mut acc = [[_mm512_setzero_ps(); NP]; MR];
            let mut bp = t.panel.as_ptr();
            let mut idx = 0;
            for _ in 0..t.kc {
                let mut b = [_mm512_setzero_ps(); NP];
                for j in 0..NP {
                    b[j] = _mm512_loadu_ps(bp.add(j * stride));
                }
                for r in 0..MR {
                    let x = _mm512_set1_ps(*rows[r].add(idx));
                    for j in 0..NP {
                        acc[r][j] = _mm512_fmadd_ps(x, b[j], acc[r][j]);
                    }
                }
                bp = bp.add(NR);
                idx += step;
            }
            acc
        }
    }

    /// The full tile straight into C.
    ///
    /// # Safety
    /// As [`tile_compute`], and `c_off + (MR-1)*ldc + NP*NR <= c.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile_store<const NP: usize>(t: &Tile<'_>, c: &mut [f32]) {
        // SAFETY: bounds as documented above; the bias holds `cols` = NP*NR values.
        unsafe {
            let cp = c.as_mut_ptr().add(t.c_off);
            // Ask for the tile's lines of C (for writing) before the k loop, so that their
            // misses overlap the multiply-adds instead of stalling the stores at the end.
            for r in 0..MR {
                for j in 0..NP {
                    _mm_prefetch::<_MM_HINT_ET0>(cp.add(r * t.ldc + j * NR) as *const i8);
                }
                _mm_prefetch::<_MM_HINT_ET0>(cp.add(r * t.ldc + NP * NR - 1) as *const i8);
            }
            let acc = tile_compute::<NP>(t);
            for (r, row) in acc.iter().enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    let dst = cp.add(r * t.ldc + j * NR);
                    let mut out = if t.first {
                        v
                    } else {
                        _mm512_add_ps(_mm512_loadu_ps(dst), v)
                    };
                    if let Some(bias) = t.bias {
                        out = _mm512_add_ps(out, _mm512_loadu_ps(bias.as_ptr().add(j * NR)));
                    }
                    _mm512_storeu_ps(dst, out);
                }
            }
        }
    }

    /// An edge tile (fewer rows, or a last panel with fewer columns) straight into C: only
    /// its `rows` rows are stored, and the last panel's columns past `cols` are masked off.
    ///
    /// # Safety
    /// As [`tile_compute`], and `(NP-1)*NR < cols <= NP*NR`, `1 <= rows <= MR`,
    /// `c_off + (rows-1)*ldc + cols <= c.len()`; the bias (if any) holds `cols` values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile_store_masked<const NP: usize>(t: &Tile<'_>, c: &mut [f32]) {
        // SAFETY: bounds as documented above. Masked-off lanes are neither read nor written,
        // so every access stays inside the tile's valid rows and columns.
        unsafe {
            let acc = tile_compute::<NP>(t);
            let last = t.cols - (NP - 1) * NR;
            let last_mask = (u32::MAX >> (32 - last)) as __mmask16;
            let cp = c.as_mut_ptr().add(t.c_off);
            for (r, row) in acc.iter().enumerate().take(t.rows) {
                for (j, &v) in row.iter().enumerate() {
                    let m = if j + 1 == NP { last_mask } else { !0 };
                    let dst = cp.add(r * t.ldc + j * NR);
                    let mut out = if t.first {
                        v
                    } else {
                        _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst), v)
                    };
                    if let Some(bias) = t.bias {
                        out =
                            _mm512_add_ps(out, _mm512_maskz_loadu_ps(m, bias.as_ptr().add(j * NR)));
                    }
                    _mm512_mask_storeu_ps(dst, m, out);
                }
            }
        }
    }

    /// One panel of a transposed pack: `panel[kk * NR + j] = src[j * ld + kk]` for `j < NR`,
    /// `kk < k`, one 16-lane gather per `kk`.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `(NR - 1) * ld + k <= src.len()`, `(NR - 1) * ld` fits in an
    /// i32 and `panel` holds `k * NR` floats.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gather_panel(src: &[f32], ld: usize, k: usize, panel: &mut [f32]) {
        let ld = ld as i32;
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let offsets = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(ld));
        // SAFETY: every address read is src[j * ld + kk] with j < 16 and kk < k, inside `src`;
        // every store writes panel[kk * NR .. kk * NR + 16], inside `panel`.
        unsafe {
            let base = src.as_ptr();
            let out = panel.as_mut_ptr();
            for kk in 0..k {
                let v = _mm512_i32gather_ps::<4>(offsets, base.add(kk).cast());
                _mm512_storeu_ps(out.add(kk * NR), v);
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn naive(m: usize, k: usize, n: usize, a: &[f32], w: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    s += a[i * k + p] as f64 * w[j * k + p] as f64;
                }
                c[i * n + j] = s as f32 + bias.map_or(0.0, |b| b[j]);
            }
        }
        c
    }

    fn with_bias(bias: &[f32]) -> Epilogue<'_> {
        Epilogue {
            bias: Some(bias),
            act: None,
        }
    }

    /// Deterministic test values in [-1, 1).
    pub(in crate::models::bert) fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_naive_for_odd_shapes() {
        for &(m, k, n) in &[
            (1, 1, 1),
            (7, 5, 17),
            (13, 300, 33),
            (64, 384, 48),
            (100, 520, 20),
            (6, 16, 16),
            // Enough panels for A to be packed, with edge rows and columns and two k blocks.
            (97, 700, 300),
        ] {
            let a = values(m * k, 1);
            let w = values(n * k, 2);
            let bias = values(n, 3);
            let b = PackedB::from_linear(&w, n, k);
            for parallel in [false, true] {
                let mut c = vec![f32::NAN; m * n];
                gemm(m, &a, k, &b, &mut c, n, Some(&bias), parallel).unwrap();
                let want = naive(m, k, n, &a, &w, Some(&bias));
                for (x, y) in c.iter().zip(&want) {
                    assert!(
                        (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                        "m={m} k={k} n={n}: {x} vs {y}"
                    );
                }
            }
        }
    }

    #[test]
    fn portable_kernel_matches_naive() {
        let (m, k, n) = (23, 400, 290);
        let a = values(m * k, 8);
        let w = values(n * k, 9);
        let bias = values(n, 10);
        let b = PackedB::from_linear(&w, n, k);
        let mut c = vec![f32::NAN; m * n];
        gemm_rows(
            Kernel::Portable,
            0,
            m,
            &a,
            k,
            &b,
            &mut c,
            n,
            with_bias(&bias),
        );
        let want = naive(m, k, n, &a, &w, Some(&bias));
        for (x, y) in c.iter().zip(&want) {
            assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    #[test]
    fn every_kernel_the_cpu_has_matches_naive_and_the_simd_ones_agree_exactly() {
        let mut kernels = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                kernels.push(Kernel::Avx2Fma);
                if std::arch::is_x86_feature_detected!("avx512f") {
                    kernels.push(Kernel::Avx512);
                }
            }
        }
        // Panel counts 1, 2, 3, 19 (three-panel tiles, then one) and 96; partial last panels
        // and partial row groups; two k blocks.
        for &(m, k, n) in &[
            (5, 7, 16),
            (13, 32, 40),
            (20, 64, 32),
            (97, 700, 300),
            (12, 384, 1536),
        ] {
            let a = values(m * k, 11);
            let w = values(n * k, 12);
            let bias = values(n, 13);
            let b = PackedB::from_linear(&w, n, k);
            let want = naive(m, k, n, &a, &w, Some(&bias));
            let mut simd: Option<Vec<f32>> = None;
            for &kernel in &kernels {
                let mut c = vec![f32::NAN; m * n];
                gemm_rows(kernel, 0, m, &a, k, &b, &mut c, n, with_bias(&bias));
                for (x, y) in c.iter().zip(&want) {
                    assert!(
                        (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                        "{kernel:?} m={m} k={k} n={n}: {x} vs {y}"
                    );
                }
                if !matches!(kernel, Kernel::Portable) {
                    // Both SIMD kernels fuse each multiply-add in the same k order.
                    match &simd {
                        Some(first) => assert_eq!(first, &c, "{kernel:?} m={m} k={k} n={n}"),
                        None => simd = Some(c),
                    }
                }
            }
        }
    }

    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let (m, k, n) = (50, 700, 40);
        let a = values(m * k, 4);
        let b = PackedB::from_linear(&values(n * k, 5), n, k);
        let mut all = vec![0.0; m * n];
        gemm(m, &a, k, &b, &mut all, n, None, true).unwrap();
        for i in [0, 7, 49] {
            let mut one = vec![0.0; n];
            gemm(1, &a[i * k..(i + 1) * k], k, &b, &mut one, n, None, false).unwrap();
            assert_eq!(&all[i * n..(i + 1) * n], one.as_slice(), "row {i}");
        }
    }

    #[test]
    fn strided_operands_and_row_packing() {
        // A is the left 3 columns of a 4-wide matrix; B is given row-major with stride 5.
        let (m, k, n) = (4, 3, 2);
        let a_wide = values(m * 4, 6);
        let b_wide = values(k * 5, 7);
        let mut b = PackedB::default();
        b.pack_rows(&b_wide, 5, k, n);
        assert_eq!((b.k, b.n), (k, n));
        let mut c = vec![0.0; m * 3];
        gemm(m, &a_wide, 4, &b, &mut c, 3, None, false).unwrap();
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|p| a_wide[i * 4 + p] * b_wide[p * 5 + j]).sum();
                assert!((c[i * 3 + j] - want).abs() < 1e-5);
            }
            assert_eq!(c[i * 3 + 2], 0.0, "column past n untouched");
        }
    }

    #[test]
    fn transposed_packing_lays_out_every_panel() {
        // Strided columns (as keys inside the fused QKV rows), whole panels (gathered where
        // the CPU has AVX-512) and a partial last one (zero-padded).
        let (k, n, ld) = (32, 37, 1152);
        let src = values((n - 1) * ld + k, 14);
        let mut b = PackedB::default();
        b.pack_transposed(&src, ld, k, n);
        let data = b.data();
        for p in 0..n.div_ceil(NR) {
            for kk in 0..k {
                for j in 0..NR {
                    let col = p * NR + j;
                    let want = if col < n { src[col * ld + kk] } else { 0.0 };
                    assert_eq!(
                        data[(p * k + kk) * NR + j],
                        want,
                        "panel {p} k {kk} col {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let b = PackedB::from_linear(&[1.0; 6], 2, 3);
        let mut c = vec![0.0; 2];
        assert!(gemm(2, &[1.0; 3], 3, &b, &mut c, 2, None, false).is_err());
    }
}
