//! Dense f32 matrix multiply (the encoder's): `C = A · B (+ bias)` with B pre-packed.
//!
//! B is packed once (weights at load time, attention keys/values per head) into column panels
//! of [`NR`] floats, row after row, so the micro-kernel reads it with aligned, sequential loads.
//! A is read in place (row-major with a stride). The micro-kernel computes an [`MR`]×[`NR`]
//! tile with AVX2+FMA, or an [`MR`]×(up to [`NP_MAX`] panels) tile with AVX-512, as the
//! [`Isa`] allows, and a portable loop elsewhere.
//!
//! Every element of C is accumulated over k in the same order whatever the other rows are, so
//! a row of C does not depend on which batch it was computed in (batched and one-by-one
//! results are bit-identical). Large products are split over row blocks on the current rayon
//! pool.

use rayon::prelude::*;

pub use self::packed::{PackedB, PackedCols};

use super::encoder::Activation;
use super::features::{cpu_isa, CpuLevel, Isa};
use crate::KernelError;

/// Rows per micro-tile.
pub const MR: usize = 6;
/// Columns per packed panel (and per AVX2 micro-tile).
pub const NR: usize = 16;
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
/// What is done to each finished element of C: `act(acc + bias)`.
#[derive(Clone, Copy, Default)]
pub struct Epilogue<'a> {
    pub bias: Option<&'a [f32]>,
    /// Applied to each tile as it is finished, while it is still in L1.
    pub act: Option<Activation>,
}

/// `C[m × n] = A[m × k] · B (+ bias)`, where `A` has row stride `lda` and `C` row stride `ldc`
/// (`ldc >= n`; only the first `n` columns of each C row are written). Splits large products
/// over the current rayon pool when `parallel` is set.
///
/// # Errors
/// [`KernelError::Shape`] if the operands are shorter than the shapes need.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    bias: Option<&[f32]>,
    parallel: bool,
) -> Result<(), KernelError> {
    let post = Epilogue { bias, act: None };
    gemm_packed_post(m, a, lda, b, c, ldc, post, parallel)
}

/// [`gemm_packed`] with the bias and an activation applied to every element of the result.
///
/// # Errors
/// As [`gemm_packed`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed_post(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    post: Epilogue<'_>,
    parallel: bool,
) -> Result<(), KernelError> {
    gemm_at(cpu_isa(), m, a, lda, b.all(), c, ldc, post, parallel)
}

/// [`gemm_packed_post`] over some of B's columns ([`PackedB::cols`]): `C[m × b.n]`, with
/// `post.bias` holding the bias of those columns.
///
/// # Errors
/// As [`gemm_packed`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed_cols(
    m: usize,
    a: &[f32],
    lda: usize,
    b: PackedCols<'_>,
    c: &mut [f32],
    ldc: usize,
    post: Epilogue<'_>,
    parallel: bool,
) -> Result<(), KernelError> {
    gemm_at(cpu_isa(), m, a, lda, b, c, ldc, post, parallel)
}

/// [`gemm_packed_post`] on `isa`'s micro-kernel.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_at(
    isa: Isa,
    m: usize,
    a: &[f32],
    lda: usize,
    b: PackedCols<'_>,
    c: &mut [f32],
    ldc: usize,
    post: Epilogue<'_>,
    parallel: bool,
) -> Result<(), KernelError> {
    let bias = post.bias;
    let (k, n) = (b.k, b.n);
    if m == 0 || n == 0 {
        return Ok(());
    }
    let a_needed = (m - 1) * lda + k;
    if lda < k || ldc < n || a.len() < a_needed || c.len() < (m - 1) * ldc + n {
        return Err(KernelError::Shape(format!(
            "gemm: m={m} k={k} n={n} lda={lda} ldc={ldc} a={} c={}",
            a.len(),
            c.len()
        )));
    }
    if bias.is_some_and(|bias| bias.len() < n) {
        return Err(KernelError::Shape(format!("gemm: bias shorter than n={n}")));
    }
    let c = &mut c[..(m - 1) * ldc + n];
    let threads = rayon::current_num_threads();
    if !parallel || threads < 2 || m * n * k < PAR_MIN_FLOPS || m <= MR {
        gemm_rows(isa, 0, m, a, lda, b, c, ldc, post);
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
            gemm_rows(isa, r0, rows, a, lda, b, c_blk, ldc, post);
        });
    Ok(())
}

/// Rows `r0 .. r0 + rows` of the product into `c` (which starts at row `r0`), in blocks of at
/// most [`MC_MAX`] rows so that a block of A stays in L2 while it meets every B panel.
#[allow(clippy::too_many_arguments)]
fn gemm_rows(
    isa: Isa,
    r0: usize,
    rows: usize,
    a: &[f32],
    lda: usize,
    b: PackedCols<'_>,
    c: &mut [f32],
    ldc: usize,
    post: Epilogue<'_>,
) {
    let mut done = 0;
    while done < rows {
        let block = MC_MAX.min(rows - done);
        let c_blk = &mut c[done * ldc..];
        gemm_block(isa, r0 + done, block, a, lda, b, c_blk, ldc, post);
        done += block;
    }
}

/// One row block: for each tile of panels, every k block, every row group. The tile's panels
/// for one k block stay in L1 while the row groups pass over them; the block of A (packed
/// once for all k) stays in L2.
#[allow(clippy::too_many_arguments)]
fn gemm_block(
    isa: Isa,
    r0: usize,
    rows: usize,
    a: &[f32],
    lda: usize,
    b: PackedCols<'_>,
    c: &mut [f32],
    ldc: usize,
    post: Epilogue<'_>,
) {
    let kernel = Kernel::for_isa(isa);
    let (k, n) = (b.k, b.n);
    let data = b.data;
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
                let gelu = last && post.act == Some(Activation::GeluErf);
                // Whole row groups of packed A in one call where the kernel takes them: the
                // per-tile checks and calls then cost once per panel, not once per tile.
                let mut done = 0;
                if pack && matches!(post.act, None | Some(Activation::GeluErf)) {
                    let tile = Tile {
                        kc,
                        a: &a_pack[..groups * MR * k],
                        a_rows: std::array::from_fn(|r| k0 * MR + r),
                        a_step: MR,
                        panel,
                        np,
                        panel_stride: k * NR,
                        c_off: p * NR,
                        ldc,
                        rows: MR,
                        cols,
                        first,
                        bias: bias_tile,
                        gelu,
                    };
                    done = kernel.run_groups(&tile, rows / MR, MR * k, c);
                }
                for g in done..groups {
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
                        gelu,
                    };
                    let applied = kernel.run(&tile, c);
                    if let (true, Some(act), false) = (last, post.act, applied) {
                        for r in 0..tile_rows {
                            let off = tile.c_off + r * ldc;
                            act.apply_at(isa, &mut c[off..off + cols]);
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
#[derive(Clone, Copy)]
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
    /// Last k block of an erf-GELU product: a kernel may apply the GELU to its registers
    /// before the store (and says so), saving a pass over the tile.
    gelu: bool,
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
    /// The micro-kernel for `isa`: the level's widest vectors.
    fn for_isa(isa: Isa) -> Self {
        match isa.level() {
            CpuLevel::Scalar => Kernel::Portable,
            #[cfg(target_arch = "x86_64")]
            CpuLevel::Avx2 | CpuLevel::AvxVnni => Kernel::Avx2Fma,
            #[cfg(target_arch = "x86_64")]
            CpuLevel::Avx512 | CpuLevel::Avx512Vnni => Kernel::Avx512,
            #[cfg(not(target_arch = "x86_64"))]
            _ => Kernel::Portable,
        }
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

    /// Runs `groups` full tiles down the rows, starting with `t` (whole panel, MR rows): group
    /// `g` reads A `g * a_stride` further on and writes C `g * MR` rows further down, and any
    /// [`Tile::gelu`] is applied. Returns how many groups ran: all, or none where this kernel
    /// does not take them (the caller then runs each tile).
    fn run_groups(self, t: &Tile<'_>, groups: usize, a_stride: usize, c: &mut [f32]) -> usize {
        #[cfg(target_arch = "x86_64")]
        if let (Kernel::Avx2Fma, 1, true, true, 1..) = (
            self,
            t.np,
            t.rows == MR,
            t.cols == NR && t.a_step == MR,
            groups,
        ) {
            let last_a = (groups - 1) * a_stride;
            let last_c = t.c_off + (groups - 1) * MR * t.ldc;
            let in_bounds = t.kc > 0
                && t.panel.len() >= t.kc * NR
                && t.a_rows
                    .iter()
                    .all(|&off| last_a + off + (t.kc - 1) * MR < t.a.len())
                && last_c + (MR - 1) * t.ldc + NR <= c.len();
            if in_bounds {
                // SAFETY: `Avx2Fma` comes from an `Isa` with AVX2 and FMA; the last group's A
                // rows, the panel and the last group's C tile (the furthest of each) were
                // checked just above.
                unsafe { avx2::tiles_store(t, groups, a_stride, c) };
                return groups;
            }
        }
        let _ = (t, groups, a_stride, c);
        0
    }

    /// Runs the tile; returns whether the GELU of a [`Tile::gelu`] tile was applied.
    fn run(self, t: &Tile<'_>, c: &mut [f32]) -> bool {
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
                // SAFETY: `Avx512` comes from an `Isa` of an AVX-512 level; the bounds of A, the panels and
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
                return false;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if let (Kernel::Avx2Fma | Kernel::Avx512, 1, true) = (self, t.np, in_bounds) {
            if t.rows == MR && t.cols == NR && t.c_off + (MR - 1) * t.ldc + NR <= c.len() {
                // SAFETY: both kernels come from an `Isa` of a level with AVX2 and FMA; the bounds of A, the panel
                // and the full C tile were checked just above.
                unsafe { avx2::tile_store(t, c) };
                return t.gelu;
            } else {
                let mut acc = [[0.0f32; NR * NP_MAX]; MR];
                // SAFETY: as above; the result goes to `acc`, not to C.
                unsafe { avx2::tile_acc(t, &mut acc) };
                store_partial(t, &acc, c);
            }
            return false;
        }
        let mut acc = [[0.0f32; NR * NP_MAX]; MR];
        portable_tile(t, &mut acc);
        store_partial(t, &acc, c);
        false
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
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod packed;
#[cfg(test)]
pub(crate) mod tests;
