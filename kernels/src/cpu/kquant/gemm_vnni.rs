//! The AVX-512 VNNI matrix product of the interleaved super-block types (Q4_K, Q5_K, Q6_K,
//! IQ4_XS) against many activation rows (prefill).
//!
//! The row kernels (`super::rows8_vnni`) unpack each weight vector's nibbles for every four
//! activation rows, so unpacking costs as much as the products. Here a strip of weight rows is
//! unpacked once into signed bytes (and its scales into dwords), and the activations are laid
//! out once per product in panels of sixteen rows, each 64-byte line holding four quants of
//! each row: one `vpdpbusd` then multiplies a line by four weights of one row broadcast from
//! memory, and the inner loop is nothing else.
//!
//! The activations enter as `x + 128` (unsigned, as `vpdpbusd` needs), and the unpacking
//! precomputes each row's `128·Σ_s sc[s]·Σ_{i∈s} q_i` per super-block, so the integer sum of a
//! super-block is the exact `Σ_s sc[s]·Σ_{i∈s} q_i·x_i` of every other kernel, and it ends
//! the same way: one fused multiply-add by `d·d_x` into the row's sum, the minimums' term
//! (Q4_K, Q5_K) summed apart and added last. A row's output is the same bits as the row
//! kernels give it, so a row's result does not depend on whether its batch took this path.

use std::arch::x86_64::*;

use super::q45k_lanes::fifth_bit;
use super::q8k::Q8KBlock;
use super::rows8::GROUP;
use super::rows8_vnni::{iq4xs_scales, q45k_scales, q6k_quants};
use super::{IQ4_LEVELS, QK_K};
use crate::DType;

/// Activation rows per panel: the sixteen dwords of a 512-bit vector.
pub(crate) const PANEL: usize = 16;
/// Four-weight steps per super-block.
const STEPS: usize = QK_K / 4;

/// Whether this product covers `dtype` (in the interleaved layout).
pub(crate) fn takes(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS
    )
}

/// 64 bytes on a cache line of their own.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u8; 64]);

/// The panel lines of up to [`PANEL`] activation rows of `nb` blocks of `N` quants each:
/// per block and four-weight step, one line holding each row's four quants plus 128 (row `j`
/// in bytes `4j..4j + 4`), absent rows zero. `quants(j, b)`: row `j`'s block `b`.
pub(crate) fn offset_lines<'x, const N: usize>(
    rows: usize,
    nb: usize,
    quants: impl Fn(usize, usize) -> &'x [i8; N],
) -> Vec<Line> {
    let steps = N / 4;
    let mut q = vec![Line([0; 64]); nb * steps];
    for j in 0..rows {
        for b in 0..nb {
            let qs = quants(j, b);
            for (s, line) in q[b * steps..(b + 1) * steps].iter_mut().enumerate() {
                for (o, &v) in line.0[4 * j..4 * j + 4].iter_mut().zip(&qs[4 * s..]) {
                    *o = (v as u8) ^ 0x80;
                }
            }
        }
    }
    q
}

/// `a[i] += Σ_s line_s · w_s[i]` by bytes: each panel line (sixteen rows' four offset quants)
/// times four signed weights of row `i`, broadcast from `w` (`w` holds, per line, the eight
/// rows' four weights).
///
/// # Safety
/// AVX-512 F/VNNI must be available; `w` must point to `8 · lines.len()` readable dwords.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
pub(crate) unsafe fn steps(a: &mut [__m512i; GROUP], lines: &[Line], w: *const i32) {
    for (s, line) in lines.iter().enumerate() {
        // SAFETY: a line is 64 aligned bytes; `w` as the caller vouches.
        unsafe {
            let x = _mm512_load_si512(line.0.as_ptr() as *const __m512i);
            let w = w.add(s * GROUP);
            for (i, ai) in a.iter_mut().enumerate() {
                *ai = _mm512_dpbusd_epi32(*ai, x, _mm512_set1_epi32(*w.add(i)));
            }
        }
    }
}

/// `tile[i] = acc[i] + offs[i]`, the end of every row kernel (`offs` zero where the type
/// has no minimum term).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn store(
    acc: &[__m512; GROUP],
    offs: &[__m512; GROUP],
    tile: &mut [[f32; PANEL]; GROUP],
) {
    for i in 0..GROUP {
        // SAFETY: sixteen floats each.
        unsafe { _mm512_storeu_ps(tile[i].as_mut_ptr(), _mm512_add_ps(acc[i], offs[i])) };
    }
}

/// Up to sixteen activation rows of `nb` [`Q8KBlock`]s, laid out for the product.
pub(crate) struct Panel {
    /// Per super-block and four-weight step, the rows' four quants plus 128 (row `j` in bytes
    /// `4j..4j + 4`); absent rows are zero.
    q: Vec<Line>,
    /// Per super-block, the rows' scales.
    d: Vec<[f32; PANEL]>,
    /// Per super-block and pair of 32-weight sub-blocks `(2p, 2p + 1)`, each row's two
    /// activation sums (each of 32 quants, within ±4064) as the i16 halves of a dword.
    bsum: Vec<[u32; PANEL]>,
}

impl Panel {
    /// The panel of `rows` (at most [`PANEL`]) activation rows of `nb` blocks each.
    pub(crate) fn new(x: &[Q8KBlock], rows: usize, nb: usize) -> Panel {
        assert!(
            rows <= PANEL && x.len() >= rows * nb,
            "Panel::new: {rows} rows"
        );
        let q = offset_lines(rows, nb, |j, b| &x[j * nb + b].qs);
        let mut d = vec![[0f32; PANEL]; nb];
        let mut bsum = vec![[0u32; PANEL]; nb * 4];
        for j in 0..rows {
            for b in 0..nb {
                let blk = &x[j * nb + b];
                d[b][j] = blk.d;
                for p in 0..4 {
                    let pair = |s: usize| blk.bsums[2 * s] as i32 + blk.bsums[2 * s + 1] as i32;
                    let (lo, hi) = (pair(2 * p) as u16, pair(2 * p + 1) as u16);
                    bsum[b * 4 + p][j] = u32::from(lo) | (u32::from(hi) << 16);
                }
            }
        }
        Panel { q, d, bsum }
    }
}

/// Eight weight rows (one interleaved group) unpacked for [`product`].
#[derive(Default)]
pub(crate) struct Unpacked8 {
    /// Per super-block and four-weight step, the rows' four signed quants (row `i` in bytes
    /// `4i..4i + 4`), two steps a line.
    q: Vec<Line>,
    /// Per super-block and scale group (32 weights; 16 for Q6_K), the rows' scales.
    sc: Vec<[i32; GROUP]>,
    /// Per super-block, each row's `128·Σ_s sc[s]·Σ_{i∈s} q_i`, the term the offset
    /// activations add.
    offset: Vec<[i32; GROUP]>,
    /// Per super-block, the rows' `d` and `dmin`.
    d: Vec<[f32; GROUP]>,
    dmin: Vec<[f32; GROUP]>,
    /// Per super-block and pair of sub-blocks `(2p, 2p + 1)`, the rows' two minimums as the
    /// i16 halves of a dword (Q4_K, Q5_K).
    mins: Vec<[u32; GROUP]>,
}

/// Scale groups per super-block of `dtype`.
fn scale_groups(dtype: DType) -> usize {
    if dtype == DType::Q6_K {
        16
    } else {
        8
    }
}

impl Unpacked8 {
    /// Unpack one group of `nb` tiles of `dtype` (see [`takes`]).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI must be available.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn fill(&mut self, dtype: DType, tiles: &[u8], nb: usize) {
        let tile = GROUP * dtype.block_bytes();
        assert!(takes(dtype) && tiles.len() >= nb * tile, "Unpacked8::fill");
        let groups = scale_groups(dtype);
        self.q.resize(nb * STEPS / 2, Line([0; 64]));
        self.sc.resize(nb * groups, [0; GROUP]);
        self.offset.resize(nb, [0; GROUP]);
        self.d.resize(nb, [0.0; GROUP]);
        self.dmin.resize(nb, [0.0; GROUP]);
        self.mins.resize(nb * 4, [0; GROUP]);
        for b in 0..nb {
            let t = &tiles[b * tile..(b + 1) * tile];
            // SAFETY: `t` is one whole tile of `dtype`; the features are enabled here.
            unsafe {
                match dtype {
                    DType::Q4_K => self.q45k::<false>(t, b),
                    DType::Q5_K => self.q45k::<true>(t, b),
                    DType::Q6_K => self.q6k(t, b),
                    _ => self.iq4xs(t, b),
                }
            }
        }
    }

    /// Store step `s` of super-block `b` (eight rows' four quants) and add its rows' quant
    /// sums to `sums`.
    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
    #[inline]
    fn put(&mut self, b: usize, s: usize, q: __m256i, sums: &mut __m256i) {
        let line = &mut self.q[(b * STEPS + s) / 2].0[32 * (s % 2)..][..32];
        // SAFETY: 32 writable bytes.
        unsafe { _mm256_storeu_si256(line.as_mut_ptr() as *mut __m256i, q) };
        *sums = _mm256_dpbusd_epi32(*sums, _mm256_set1_epi8(1), q);
    }

    /// The rows' scales of group `g` of super-block `b` (lanes = rows), and the offset term.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn put_scale(&mut self, b: usize, g: usize, sc: __m256i, qsum: __m256i, off: &mut __m256i) {
        let groups = self.sc.len() / self.offset.len();
        // SAFETY: 8 dwords.
        unsafe {
            _mm256_storeu_si256(self.sc[b * groups + g].as_mut_ptr() as *mut __m256i, sc);
        }
        *off = _mm256_add_epi32(*off, _mm256_mullo_epi32(sc, qsum));
    }

    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn put_end(&mut self, b: usize, off: __m256i, d: *const u8, dmin: Option<*const u8>) {
        // SAFETY: 8 dwords each; `d` (`dmin`) points at eight f16 of a tile.
        unsafe {
            let off = _mm256_slli_epi32::<7>(off);
            _mm256_storeu_si256(self.offset[b].as_mut_ptr() as *mut __m256i, off);
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(d as *const __m128i));
            _mm256_storeu_ps(self.d[b].as_mut_ptr(), dv);
            if let Some(m) = dmin {
                let mv = _mm256_cvtph_ps(_mm_loadu_si128(m as *const __m128i));
                _mm256_storeu_ps(self.dmin[b].as_mut_ptr(), mv);
            }
        }
    }

    /// # Safety
    /// `t` must be one Q4_K (Q5_K with `FIVE`) tile; the features must be available.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn q45k<const FIVE: bool>(&mut self, t: &[u8], b: usize) {
        let tile = GROUP * if FIVE { 176 } else { 144 };
        assert!(t.len() >= tile);
        let t = t.as_ptr();
        let qs = if FIVE { 384 } else { 128 };
        let nib = _mm256_set1_epi8(0x0F);
        let sixteen = _mm256_set1_epi8(16);
        let mut off = _mm256_setzero_si256();
        // SAFETY: every offset below is inside the tile.
        unsafe {
            let load = |at: usize| _mm256_loadu_si256(t.add(at) as *const __m256i);
            let [sc_lo, sc_hi, mn_lo, mn_hi] = q45k_scales(t);
            let byte = |v: __m256i, j: usize| -> __m256i {
                match j {
                    0 => _mm256_and_si256(v, _mm256_set1_epi32(0xFF)),
                    1 => _mm256_and_si256(_mm256_srli_epi32::<8>(v), _mm256_set1_epi32(0xFF)),
                    2 => _mm256_and_si256(_mm256_srli_epi32::<16>(v), _mm256_set1_epi32(0xFF)),
                    _ => _mm256_srli_epi32::<24>(v),
                }
            };
            let sc: [__m256i; 8] =
                std::array::from_fn(|k| byte(if k < 4 { sc_lo } else { sc_hi }, k % 4));
            let mn: [__m256i; 8] =
                std::array::from_fn(|k| byte(if k < 4 { mn_lo } else { mn_hi }, k % 4));
            for p in 0..4 {
                let pair = _mm256_or_si256(mn[2 * p], _mm256_slli_epi32::<16>(mn[2 * p + 1]));
                _mm256_storeu_si256(self.mins[b * 4 + p].as_mut_ptr() as *mut __m256i, pair);
            }
            for c in 0..4 {
                let (mut lo_sum, mut hi_sum) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for s in 0..8 {
                    let v = load(qs + 256 * c + 32 * s);
                    let mut lo = _mm256_and_si256(v, nib);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
                    if FIVE {
                        let h = load(128 + 32 * s);
                        lo = _mm256_or_si256(lo, fifth_bit(h, 2 * c, sixteen));
                        hi = _mm256_or_si256(hi, fifth_bit(h, 2 * c + 1, sixteen));
                    }
                    self.put(b, 16 * c + s, lo, &mut lo_sum);
                    self.put(b, 16 * c + 8 + s, hi, &mut hi_sum);
                }
                self.put_scale(b, 2 * c, sc[2 * c], lo_sum, &mut off);
                self.put_scale(b, 2 * c + 1, sc[2 * c + 1], hi_sum, &mut off);
            }
            self.put_end(b, off, t, Some(t.add(16)));
        }
    }

    /// # Safety
    /// `t` must be one Q6_K tile; the features must be available.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn q6k(&mut self, t: &[u8], b: usize) {
        assert!(t.len() >= GROUP * 210);
        let t = t.as_ptr();
        let bias = _mm256_set1_epi8(32);
        let mut off = _mm256_setzero_si256();
        // SAFETY: every offset below is inside the tile.
        unsafe {
            // Group `g`'s scales of rows 0..8 at `16 + 8g`.
            let scale = |g: usize| {
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(t.add(16 + 8 * g) as *const __m128i))
            };
            for n in 0..2 {
                let mut sums = [_mm256_setzero_si256(); 8];
                for s in 0..8 {
                    let q = q6k_quants(t.add(144 + 96 * (8 * n + s)));
                    for (k, &qk) in q.iter().enumerate() {
                        // Weights `128n + 32k + 4s..+4`: group `8n + 2k + s / 4`.
                        let step = 32 * n + 8 * k + s;
                        self.put(b, step, _mm256_sub_epi8(qk, bias), &mut sums[2 * k + s / 4]);
                    }
                }
                for (i, &sum) in sums.iter().enumerate() {
                    let g = 8 * n + i;
                    self.put_scale(b, g, scale(g), sum, &mut off);
                }
            }
            self.put_end(b, off, t, None);
        }
    }

    /// # Safety
    /// `t` must be one IQ4_XS tile; the features must be available.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn iq4xs(&mut self, t: &[u8], b: usize) {
        assert!(t.len() >= GROUP * 136);
        let t = t.as_ptr();
        let nib = _mm256_set1_epi8(0x0F);
        let levels = IQ4_LEVELS.map(|v| v as u8);
        let mut off = _mm256_setzero_si256();
        // SAFETY: every offset below is inside the tile; `levels` is 16 bytes.
        unsafe {
            let table =
                _mm256_broadcastsi128_si256(_mm_loadu_si128(levels.as_ptr() as *const __m128i));
            let load = |at: usize| _mm256_loadu_si256(t.add(at) as *const __m256i);
            let scales = iq4xs_scales(t);
            for (s, &sc) in scales.iter().enumerate() {
                let mut sum = _mm256_setzero_si256();
                for q in 0..4 {
                    let v = load(64 + 128 * s + 32 * q);
                    let wl = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nib));
                    let wh = _mm256_shuffle_epi8(
                        table,
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib),
                    );
                    self.put(b, 8 * s + q, wl, &mut sum);
                    self.put(b, 8 * s + 4 + q, wh, &mut sum);
                }
                self.put_scale(b, s, sc, sum, &mut off);
            }
            self.put_end(b, off, t, None);
        }
    }
}

/// The products of one unpacked group `u` of `dtype` and one panel: `tile[i][j] = w_i · x_j`.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI must be available; `u` and `p` must have been
/// filled for `nb` super-blocks of `dtype`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn product(
    dtype: DType,
    u: &Unpacked8,
    p: &Panel,
    nb: usize,
    tile: &mut [[f32; PANEL]; GROUP],
) {
    assert!(
        u.q.len() >= nb * STEPS / 2
            && u.sc.len() >= nb * scale_groups(dtype)
            && u.offset.len() >= nb
            && p.q.len() >= nb * STEPS
            && p.d.len() >= nb
            && p.bsum.len() >= nb * 4,
        "product: {nb} super-blocks"
    );
    // SAFETY: the sizes were checked above; the features are enabled here.
    unsafe {
        let offs = match dtype {
            DType::Q4_K | DType::Q5_K => minimums(u, p, nb),
            _ => [_mm512_setzero_ps(); GROUP],
        };
        let acc = if dtype == DType::Q6_K {
            sums::<16>(u, p, nb)
        } else {
            sums::<8>(u, p, nb)
        };
        store(&acc, &offs, tile);
    }
}

/// Each row's `Σ_b d_b·d_x·sumi_b` over the panel's rows, in super-block order.
///
/// # Safety
/// As for [`product`], with `G` the type's scale groups.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn sums<const G: usize>(u: &Unpacked8, p: &Panel, nb: usize) -> [__m512; GROUP] {
    let per = STEPS / G;
    let mut acc = [_mm512_setzero_ps(); GROUP];
    let wq = u.q.as_ptr() as *const i32;
    for b in 0..nb {
        // SAFETY: `b < nb`, within the sizes `product` checked.
        unsafe {
            let mut sumi: [__m512i; GROUP] =
                std::array::from_fn(|i| _mm512_set1_epi32(-u.offset[b][i]));
            for g in 0..G {
                let mut a = [_mm512_setzero_si512(); GROUP];
                let s0 = b * STEPS + g * per;
                steps(&mut a, &p.q[s0..s0 + per], wq.add(s0 * GROUP));
                let sc = &u.sc[b * G + g];
                for i in 0..GROUP {
                    sumi[i] = _mm512_add_epi32(
                        sumi[i],
                        _mm512_mullo_epi32(a[i], _mm512_set1_epi32(sc[i])),
                    );
                }
            }
            let dx = _mm512_loadu_ps(p.d[b].as_ptr());
            for i in 0..GROUP {
                let dd = _mm512_mul_ps(_mm512_set1_ps(u.d[b][i]), dx);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[i]), dd, acc[i]);
            }
        }
    }
    acc
}

/// Each row's minimums' term `−Σ_b dmin_b·d_x·Σ_s m[s]·bsum[s]`, in super-block order.
///
/// # Safety
/// As for [`product`] (Q4_K or Q5_K).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn minimums(u: &Unpacked8, p: &Panel, nb: usize) -> [__m512; GROUP] {
    assert!(u.mins.len() >= nb * 4 && u.dmin.len() >= nb);
    let mut offs = [_mm512_setzero_ps(); GROUP];
    for b in 0..nb {
        // SAFETY: `b < nb`, within the sizes checked.
        unsafe {
            let bs: [__m512i; 4] = std::array::from_fn(|q| {
                _mm512_loadu_si512(p.bsum[b * 4 + q].as_ptr() as *const __m512i)
            });
            let dx = _mm512_loadu_ps(p.d[b].as_ptr());
            for (i, off) in offs.iter_mut().enumerate() {
                let mut m = _mm512_setzero_si512();
                for (q, &bq) in bs.iter().enumerate() {
                    let pair = _mm512_set1_epi32(u.mins[b * 4 + q][i] as i32);
                    m = _mm512_dpwssd_epi32(m, pair, bq);
                }
                let dm = _mm512_mul_ps(_mm512_set1_ps(u.dmin[b][i]), dx);
                *off = _mm512_sub_ps(*off, _mm512_mul_ps(dm, _mm512_cvtepi32_ps(m)));
            }
        }
    }
    offs
}
