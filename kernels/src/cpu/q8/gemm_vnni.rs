//! The AVX-512 VNNI matrix product of the interleaved 32-weight types against many activation
//! rows (prefill): the counterpart of `crate::cpu::kquant::gemm_vnni` for [`Q8Block`]
//! activations.
//!
//! A group of eight weight rows is unpacked once into signed bytes (and each block's
//! `128·Σq` per row), the activations are laid out once per product in panels of sixteen rows
//! offset to unsigned (`x + 128`), and one `vpdpbusd` multiplies a panel line by four weights
//! of one row broadcast from memory. Each block's integer sum is the exact `Σ q·x` of the row
//! kernels (`super::rows8_vnni`), and it ends as there: one fused multiply-add by `d_w·d_x`
//! into the row's sum, and `m_w·s_x` into its own accumulator for the types with a minimum, so
//! a row gives the same bits from either.

use std::arch::x86_64::*;

use super::rows8_vnni::tile_quants;
use super::type_code::{block_bytes, code, has_min};
use super::{Q8Block, Q8_BLOCK};
use crate::cpu::kquant::gemm_vnni::{offset_lines, steps, store, Line, PANEL};
use crate::DType;

/// Rows per interleaved group.
const GROUP: usize = 8;
/// Four-weight steps per block.
const STEPS: usize = Q8_BLOCK / 4;

/// Up to sixteen activation rows of `nb` [`Q8Block`]s, laid out for [`product`].
pub(crate) struct Panel {
    /// Per block and four-weight step, one line: the rows' four quants plus 128 (row `j` in
    /// bytes `4j..4j + 4`); absent rows are zero.
    q: Vec<Line>,
    /// Per block, the rows' `d` and `s`.
    d: Vec<[f32; PANEL]>,
    s: Vec<[f32; PANEL]>,
}

impl Panel {
    /// The panel of `rows` (at most [`PANEL`]) activation rows of `nb` blocks each.
    pub(crate) fn new(x: &[Q8Block], rows: usize, nb: usize) -> Panel {
        assert!(
            rows <= PANEL && x.len() >= rows * nb,
            "Panel::new: {rows} rows"
        );
        let q = offset_lines(rows, nb, |j, b| &x[j * nb + b].qs);
        let mut d = vec![[0f32; PANEL]; nb];
        let mut s = vec![[0f32; PANEL]; nb];
        for j in 0..rows {
            for b in 0..nb {
                let blk = &x[j * nb + b];
                d[b][j] = blk.d;
                s[b][j] = blk.s;
            }
        }
        Panel { q, d, s }
    }
}

/// Eight weight rows (one interleaved group) of a 32-weight type unpacked for [`product`].
#[derive(Default)]
pub(crate) struct Unpacked8 {
    /// Per block, the rows' signed quants: step `c` (weights `4c..4c + 4`) of row `i` at
    /// bytes `32c + 4i`, a block in four lines.
    q: Vec<Line>,
    /// Per block, each row's `128·Σq`, the term the offset activations add.
    offset: Vec<[i32; GROUP]>,
    /// Per block, the rows' `d` and (Q4_1, Q5_1) `m`.
    d: Vec<[f32; GROUP]>,
    m: Vec<[f32; GROUP]>,
}

impl Unpacked8 {
    /// Unpack one group of `nb` tiles of `dtype` (a 32-weight type).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI must be available.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn fill(&mut self, dtype: DType, tiles: &[u8], nb: usize) {
        assert!(
            super::q8_blocks(dtype) && tiles.len() >= nb * GROUP * dtype.block_bytes(),
            "Unpacked8::fill"
        );
        self.q.resize(nb * 4, Line([0; 64]));
        self.offset.resize(nb, [0; GROUP]);
        self.d.resize(nb, [0.0; GROUP]);
        self.m.resize(nb, [0.0; GROUP]);
        // SAFETY: the tiles are whole (asserted); the features are enabled here.
        unsafe {
            match code(dtype) {
                0 => self.blocks::<0>(tiles, nb),
                1 => self.blocks::<1>(tiles, nb),
                2 => self.blocks::<2>(tiles, nb),
                3 => self.blocks::<3>(tiles, nb),
                4 => self.blocks::<4>(tiles, nb),
                _ => self.blocks::<5>(tiles, nb),
            }
        }
    }

    /// # Safety
    /// `tiles` must hold `nb` tiles of type `T`; the features must be available.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn blocks<const T: u8>(&mut self, tiles: &[u8], nb: usize) {
        let tile = GROUP * block_bytes(T);
        let ones = _mm256_set1_epi8(1);
        for b in 0..nb {
            let t = tiles[b * tile..(b + 1) * tile].as_ptr();
            // SAFETY: `t` is a whole tile; the stores are inside this block's four lines and
            // eight-lane arrays.
            unsafe {
                let q = tile_quants::<T>(t);
                let mut sum = _mm256_setzero_si256();
                for (c, &qc) in q.iter().enumerate() {
                    let at = self.q[4 * b + c / 2].0[32 * (c % 2)..].as_mut_ptr();
                    _mm256_storeu_si256(at as *mut __m256i, qc);
                    sum = _mm256_dpbusd_epi32(sum, ones, qc);
                }
                let off = _mm256_slli_epi32::<7>(sum);
                _mm256_storeu_si256(self.offset[b].as_mut_ptr() as *mut __m256i, off);
                let d = _mm256_cvtph_ps(_mm_loadu_si128(t as *const __m128i));
                _mm256_storeu_ps(self.d[b].as_mut_ptr(), d);
                if has_min(T) {
                    let m = _mm256_cvtph_ps(_mm_loadu_si128(t.add(16) as *const __m128i));
                    _mm256_storeu_ps(self.m[b].as_mut_ptr(), m);
                }
            }
        }
    }
}

/// The products of one unpacked group `u` of `dtype` and one panel: `tile[i][j] = w_i · x_j`.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI must be available; `u` and `p` must have been
/// filled for `nb` blocks of `dtype`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn product(
    dtype: DType,
    u: &Unpacked8,
    p: &Panel,
    nb: usize,
    tile: &mut [[f32; PANEL]; GROUP],
) {
    assert!(
        u.q.len() >= nb * 4
            && u.offset.len() >= nb
            && u.d.len() >= nb
            && u.m.len() >= nb
            && p.q.len() >= nb * STEPS
            && p.d.len() >= nb
            && p.s.len() >= nb,
        "product: {nb} blocks"
    );
    let min = matches!(dtype, DType::Q4_1 | DType::Q5_1);
    let mut acc = [_mm512_setzero_ps(); GROUP];
    let mut offs = [_mm512_setzero_ps(); GROUP];
    let wq = u.q.as_ptr() as *const i32;
    for b in 0..nb {
        // SAFETY: `b < nb`, within the sizes checked above.
        unsafe {
            let mut a = [_mm512_setzero_si512(); GROUP];
            let s0 = b * STEPS;
            steps(&mut a, &p.q[s0..s0 + STEPS], wq.add(s0 * GROUP));
            let dx = _mm512_loadu_ps(p.d[b].as_ptr());
            for i in 0..GROUP {
                let sums = _mm512_sub_epi32(a[i], _mm512_set1_epi32(u.offset[b][i]));
                let dd = _mm512_mul_ps(_mm512_set1_ps(u.d[b][i]), dx);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), dd, acc[i]);
            }
            if min {
                let sx = _mm512_loadu_ps(p.s[b].as_ptr());
                for (i, off) in offs.iter_mut().enumerate() {
                    *off = _mm512_fmadd_ps(_mm512_set1_ps(u.m[b][i]), sx, *off);
                }
            }
        }
    }
    store(&acc, &offs, tile);
}
