//! Quantised activations and integer dot products (the fast decode path).
//!
//! An activation row is cut into blocks of 32 values; each block keeps an f32 scale
//! `d = max|x| / 127`, 32 `i8` quants `q = round(x / d)` and the block sum `s = d·Σq` (the
//! layout ggml calls Q8_1, with f32 instead of f16 scales). A weight block times an activation
//! block is then one integer dot product and two multiplies:
//!
//! - Q4_1 (`w = d_w·q_w + m_w`, `q_w` in 0..16): `d_w·d_x·Σ q_w·q_x + m_w·s_x`;
//! - Q4_0 (`w = d_w·(q_w − 8)`): the same with `m_w = −8·d_w`;
//! - Q8_0 (`w = d_w·q_w`, `q_w` signed): `d_w·d_x·Σ q_w·q_x`.
//!
//! The integer sums are exact on every SIMD level (the products fit: `15·127·2` and
//! `128·127·2` stay inside the `i16` pair sums of `maddubs`); only the order of the final f32
//! accumulation differs between levels.
//!
//! Rounding is half-to-even through the `1.5·2^23` trick, which is plain f32 arithmetic and so
//! gives the same quants in any implementation.

use crate::DType;

/// Values per activation block.
pub const Q8_BLOCK: usize = 32;

/// 32 quantised activations: `x[i] ≈ d·qs[i]`, and `s = d·Σ qs`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[repr(C)]
pub struct Q8Block {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; Q8_BLOCK],
}

/// Whether the integer kernels handle weights of `dtype`.
pub fn q8_supports(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// Adding then subtracting this rounds an f32 of magnitude below 2^22 to the nearest integer,
/// ties to even (under the default rounding mode, which Rust assumes).
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Quantise `x` (a multiple of 32 values) into `out` (`x.len() / 32` blocks).
///
/// # Panics
/// If the lengths disagree (a bug in the caller).
pub fn quantize_row_q8(x: &[f32], out: &mut [Q8Block]) {
    assert!(
        x.len() == out.len() * Q8_BLOCK,
        "quantize_row_q8: {} values into {} blocks",
        x.len(),
        out.len()
    );
    for (blk, c) in out.iter_mut().zip(x.chunks_exact(Q8_BLOCK)) {
        let mut amax = 0f32;
        for &v in c {
            let a = v.abs();
            // NaN never wins: the block then quantises as if it were absent.
            if a > amax {
                amax = a;
            }
        }
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in blk.qs.iter_mut().zip(c) {
            let r = ((v * id + ROUND_MAGIC) - ROUND_MAGIC).clamp(-127.0, 127.0);
            // In range after the clamp (NaN casts to 0).
            let r = r as i32;
            *q = r as i8;
            sum += r;
        }
        blk.d = d;
        blk.s = d * sum as f32;
    }
}

/// Which integer dot-product instructions the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q8Level {
    /// Portable Rust loops.
    Scalar,
    /// AVX2 `maddubs` + `madd` (with FMA and F16C).
    Avx2,
    /// AVX-VNNI `vpdpbusd` on 256-bit vectors.
    AvxVnni,
    /// AVX-512 VNNI `vpdpbusd`: two 4-bit blocks per 512-bit vector, Q8_0 on 256-bit vectors.
    Avx512Vnni,
}

impl Q8Level {
    /// Whether this machine can run the level.
    pub fn available(self) -> bool {
        match self {
            Q8Level::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Q8Level::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Q8Level::AvxVnni => Q8Level::Avx2.available() && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Q8Level::Avx512Vnni => {
                Q8Level::Avx2.available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every level this machine can run, slowest first.
    pub fn all_available() -> Vec<Q8Level> {
        [
            Q8Level::Scalar,
            Q8Level::Avx2,
            Q8Level::AvxVnni,
            Q8Level::Avx512Vnni,
        ]
        .into_iter()
        .filter(|l| l.available())
        .collect()
    }
}

/// The level the integer kernels use here, detected once. `KERNELS_FORCE_SCALAR=1` forces
/// the scalar path, as for the f32 kernels; `KERNELS_Q8_LEVEL=scalar|avx2|avxvnni|avx512vnni`
/// caps it (for benchmarks and tests; a level the machine lacks is ignored).
pub fn q8_level() -> Q8Level {
    use std::sync::OnceLock;
    static LEVEL: OnceLock<Q8Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        if crate::simd_level() == crate::SimdLevel::Scalar {
            return Q8Level::Scalar;
        }
        let wanted = std::env::var("KERNELS_Q8_LEVEL").ok().and_then(|v| {
            Some(match v.as_str() {
                "scalar" => Q8Level::Scalar,
                "avx2" => Q8Level::Avx2,
                "avxvnni" => Q8Level::AvxVnni,
                "avx512vnni" => Q8Level::Avx512Vnni,
                _ => return None,
            })
        });
        if let Some(l) = wanted.filter(|l| l.available()) {
            return l;
        }
        // AVX-512 VNNI first: where both exist it is the same instruction.
        [Q8Level::Avx512Vnni, Q8Level::AvxVnni, Q8Level::Avx2]
            .into_iter()
            .find(|l| l.available())
            .unwrap_or(Q8Level::Scalar)
    })
}

/// Most weight rows one kernel call handles.
pub(crate) const MAX_W: usize = 2;
/// Most activation rows one kernel call handles.
pub(crate) const MAX_X: usize = 4;

/// Inputs of one kernel call: `w_rows` consecutive weight rows against `x_rows` consecutive
/// quantised activation rows.
pub(crate) struct Q8Args<'a> {
    pub dtype: DType,
    /// Weight bytes starting at the first row; row `i` at `i * w_stride`.
    pub w: &'a [u8],
    pub w_stride: usize,
    /// Activation blocks starting at the first row; row `j` is `x[j * nb..][..nb]`.
    pub x: &'a [Q8Block],
    /// Blocks per row (`k / 32`).
    pub nb: usize,
}

/// `out[i * x_rows + j] = w_i · x_j` for `i < w_rows` (any number of rows), `j < x_rows`,
/// taking `w_step` (1 or 2) weight rows per pass.
///
/// # Panics
/// If the shape is not one the kernels are built for, the slices are shorter than the
/// arguments claim, or `level` is not available here (bugs in the caller).
pub(crate) fn dot_q8(
    level: Q8Level,
    a: &Q8Args<'_>,
    w_rows: usize,
    w_step: usize,
    x_rows: usize,
    out: &mut [f32],
) {
    assert!(q8_supports(a.dtype), "dot_q8: {} weights", a.dtype);
    assert!(
        (1..=MAX_W).contains(&w_step) && (1..=MAX_X).contains(&x_rows),
        "dot_q8: {w_step} x {x_rows}"
    );
    let row_bytes = a.nb * a.dtype.block_bytes();
    assert!(
        a.w_stride >= row_bytes
            && (w_rows == 0 || a.w.len() >= (w_rows - 1) * a.w_stride + row_bytes),
        "dot_q8: weights too short"
    );
    assert!(a.x.len() >= x_rows * a.nb, "dot_q8: activations too short");
    assert!(out.len() >= w_rows * x_rows, "dot_q8: output too short");
    match level {
        #[cfg(target_arch = "x86_64")]
        Q8Level::Avx2 | Q8Level::AvxVnni | Q8Level::Avx512Vnni => {
            // Checked here (cached by std, once per call of many rows) so that a level the
            // machine lacks can never run.
            assert!(level.available(), "dot_q8: {level:?} is not available");
            // SAFETY: the features each module enables were detected just above, and the
            // bounds the kernels read within were asserted above.
            unsafe { x86::dispatch(level, a, w_rows, w_step, x_rows, out) }
        }
        _ => scalar(a, w_rows, x_rows, out),
    }
}

/// `Σ q_w·q_x` of weight block `blk` (its quants as stored: nibbles for Q4, `i8` for Q8_0)
/// and activation quants `xq`, with the weight's `(d, m)` (`m` already `−8d` for Q4_0, 0 for
/// Q8_0).
pub(crate) fn block_int_dot(dtype: DType, blk: &[u8], xq: &[i8; 32]) -> (i32, f32, f32) {
    let d = crate::dequant::f16_at(blk, 0);
    match dtype {
        DType::Q4_0 | DType::Q4_1 => {
            let (m, qoff) = if dtype == DType::Q4_1 {
                (crate::dequant::f16_at(blk, 2), 4)
            } else {
                (-8.0 * d, 2)
            };
            let mut s = 0i32;
            for (j, &b) in blk[qoff..qoff + 16].iter().enumerate() {
                s += i32::from(b & 0x0F) * i32::from(xq[j]);
                s += i32::from(b >> 4) * i32::from(xq[16 + j]);
            }
            (s, d, m)
        }
        _ => {
            let mut s = 0i32;
            for (&b, &x) in blk[2..34].iter().zip(xq) {
                s += i32::from(b as i8) * i32::from(x);
            }
            (s, d, 0.0)
        }
    }
}

fn scalar(a: &Q8Args<'_>, w_rows: usize, x_rows: usize, out: &mut [f32]) {
    let bb = a.dtype.block_bytes();
    let has_min = matches!(a.dtype, DType::Q4_0 | DType::Q4_1);
    for i in 0..w_rows {
        let wrow = &a.w[i * a.w_stride..];
        for j in 0..x_rows {
            let xrow = &a.x[j * a.nb..(j + 1) * a.nb];
            let mut acc = 0f32;
            for (b, xb) in xrow.iter().enumerate() {
                let (s, d, m) = block_int_dot(a.dtype, &wrow[b * bb..(b + 1) * bb], &xb.qs);
                acc += d * xb.d * s as f32;
                if has_min {
                    acc += m * xb.s;
                }
            }
            out[i * x_rows + j] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Q8Args, Q8Level};
    use crate::DType;

    /// Q4_0 / Q4_1 against Q8 activations on 512-bit vectors: a pair of blocks per vector.
    ///
    /// Register layout of a pair (blocks `b`, `b + 1`), in 128-bit lanes: weights
    /// `[lo_b, lo_b1, hi_b, hi_b1]` (low nibbles = weights 0..16 of a block, high = 16..32),
    /// activations permuted to match, so `vpdpbusd` lanes 0-3 and 8-11 belong to block `b` and
    /// 4-7, 12-15 to block `b + 1`; the per-block scales are spread the same way.
    pub(super) mod zmm_q4 {
        use super::{DType, Q8Args};
        use crate::q8::Q8Block;
        use std::arch::x86_64::*;

        /// As `avx2::rows` (same contract), for Q4_0 and Q4_1 only.
        ///
        /// # Safety
        /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI must be available; `a` must hold `rows`
        /// weight rows and `X` activation rows of `a.nb` blocks and `out` `rows * X` floats;
        /// `a.dtype` must be Q4_0 or Q4_1.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(in crate::q8) unsafe fn rows<const W: usize, const X: usize>(
            a: &Q8Args<'_>,
            rows: usize,
            out: &mut [f32],
        ) {
            let mut r = 0;
            // SAFETY: each call covers rows `r..r + W` (or `r..r + 1`) below `rows`.
            unsafe {
                while r + W <= rows {
                    dot::<W, X>(a, r, &mut out[r * X..(r + W) * X]);
                    r += W;
                }
                while r < rows {
                    dot::<1, X>(a, r, &mut out[r * X..(r + 1) * X]);
                    r += 1;
                }
            }
        }

        /// # Safety
        /// As for [`rows`], with `r0 + W` at most its `rows`.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[inline]
        unsafe fn dot<const W: usize, const X: usize>(a: &Q8Args<'_>, r0: usize, out: &mut [f32]) {
            let has_min = a.dtype == DType::Q4_1;
            let bb = if has_min { 20 } else { 18 };
            let qoff = if has_min { 4 } else { 2 };
            let nb = a.nb;
            let mut acc = [[_mm512_setzero_ps(); X]; W];
            let mut offs = [[_mm_setzero_ps(); X]; W];
            let mask = _mm512_set1_epi8(0x0F);
            // Activation qwords: [x_b lo, x_b1 lo, x_b hi, x_b1 hi].
            let xperm = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
            // Scale lanes: [s_b x4, s_b1 x4, s_b x4, s_b1 x4] from [s_b, s_b1, s_b, s_b1].
            let sperm = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
            // SAFETY (whole block): weight blocks `b` and `b + 1` (the latter only when
            // `b + 1 < nb`) of rows `r0..r0 + W` and activation blocks `j * nb + b` (and
            // `+ 1`) for `j < X` lie inside what `dot_q8` asserted.
            unsafe {
                let w = a.w.as_ptr().add(r0 * a.w_stride);
                let x = a.x.as_ptr();
                let mut b = 0;
                while b < nb {
                    let pair = b + 1 < nb;
                    let mut wq = [_mm512_setzero_si512(); W];
                    let mut dd = [_mm_setzero_ps(); W];
                    let mut mm = [_mm_setzero_ps(); W];
                    for i in 0..W {
                        let blk0 = w.add(i * a.w_stride + b * bb);
                        let (raw, dm1) = if pair {
                            let blk1 = blk0.add(bb);
                            (
                                _mm256_loadu2_m128i(
                                    blk1.add(qoff) as *const __m128i,
                                    blk0.add(qoff) as *const __m128i,
                                ),
                                (blk1 as *const i32).read_unaligned(),
                            )
                        } else {
                            // A lone last block: the second half is zero weights with zero
                            // scale and minimum.
                            (
                                _mm256_zextsi128_si256(_mm_loadu_si128(
                                    blk0.add(qoff) as *const __m128i
                                )),
                                0,
                            )
                        };
                        let dm0 = (blk0 as *const i32).read_unaligned();
                        wq[i] = _mm512_and_si512(
                            _mm512_inserti64x4::<1>(
                                _mm512_castsi256_si512(raw),
                                _mm256_srli_epi16::<4>(raw),
                            ),
                            mask,
                        );
                        // [d_b, m_b, d_b1, m_b1]
                        let f = _mm_cvtph_ps(_mm_set_epi32(0, 0, dm1, dm0));
                        dd[i] = _mm_shuffle_ps::<0b10_00_10_00>(f, f);
                        mm[i] = if has_min {
                            _mm_shuffle_ps::<0b11_01_11_01>(f, f)
                        } else {
                            _mm_mul_ps(dd[i], _mm_set1_ps(-8.0))
                        };
                    }
                    for j in 0..X {
                        let xb0: *const Q8Block = x.add(j * nb + b);
                        let xb1 = if pair { xb0.add(1) } else { xb0 };
                        let xa = _mm256_loadu_si256((*xb0).qs.as_ptr() as *const __m256i);
                        let xc = _mm256_loadu_si256((*xb1).qs.as_ptr() as *const __m256i);
                        let xv = _mm512_permutex2var_epi64(
                            _mm512_castsi256_si512(xa),
                            xperm,
                            _mm512_castsi256_si512(xc),
                        );
                        let dx = _mm_set_ps((*xb1).d, (*xb0).d, (*xb1).d, (*xb0).d);
                        let sx = _mm_set_ps((*xb1).s, (*xb0).s, (*xb1).s, (*xb0).s);
                        for i in 0..W {
                            let p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(
                                _mm512_setzero_si512(),
                                wq[i],
                                xv,
                            ));
                            let sc = _mm512_permutexvar_ps(
                                sperm,
                                _mm512_castps128_ps512(_mm_mul_ps(dd[i], dx)),
                            );
                            acc[i][j] = _mm512_fmadd_ps(p, sc, acc[i][j]);
                            offs[i][j] = _mm_fmadd_ps(mm[i], sx, offs[i][j]);
                        }
                    }
                    b += 2;
                }
            }
            for i in 0..W {
                for j in 0..X {
                    // Lanes 0 and 1 of `offs` hold the even and odd blocks' minimum terms
                    // (2 and 3 repeat them).
                    let o = offs[i][j];
                    let o = _mm_cvtss_f32(o) + _mm_cvtss_f32(_mm_movehdup_ps(o));
                    out[i * X + j] = _mm512_reduce_add_ps(acc[i][j]) + o;
                }
            }
        }
    }

    /// `dispatch` for the x86 levels.
    ///
    /// # Safety
    /// `level`'s features must be available and `a` must satisfy the bounds `dot_q8` checks.
    pub(super) unsafe fn dispatch(
        level: Q8Level,
        a: &Q8Args<'_>,
        w_rows: usize,
        w_step: usize,
        x_rows: usize,
        out: &mut [f32],
    ) {
        macro_rules! by_shape {
            ($m:ident) => {
                // SAFETY: forwarded from the caller.
                unsafe {
                    match (w_step, x_rows) {
                        (1, 1) => $m::rows::<1, 1>(a, w_rows, out),
                        (1, 2) => $m::rows::<1, 2>(a, w_rows, out),
                        (1, 3) => $m::rows::<1, 3>(a, w_rows, out),
                        (1, _) => $m::rows::<1, 4>(a, w_rows, out),
                        (_, 1) => $m::rows::<2, 1>(a, w_rows, out),
                        (_, 2) => $m::rows::<2, 2>(a, w_rows, out),
                        (_, 3) => $m::rows::<2, 3>(a, w_rows, out),
                        (_, _) => $m::rows::<2, 4>(a, w_rows, out),
                    }
                }
            };
        }
        match level {
            Q8Level::Avx512Vnni if matches!(a.dtype, DType::Q4_0 | DType::Q4_1) => {
                by_shape!(zmm_q4)
            }
            Q8Level::Avx512Vnni => by_shape!(avx512vnni),
            Q8Level::AvxVnni => by_shape!(avxvnni),
            _ => by_shape!(avx2),
        }
    }

    /// One kernel set per instruction choice for the `u8 × i8 → i32x8` dot product (lane `l`
    /// holds the sum of the products of bytes `4l..4l + 4`).
    macro_rules! int_kernels {
        ($name:ident, $features:literal, |$a:ident, $b:ident| $dot:expr) => {
            pub(super) mod $name {
                use super::{DType, Q8Args};
                use std::arch::x86_64::*;

                #[target_feature(enable = $features)]
                #[inline]
                fn dot_u8i8($a: __m256i, $b: __m256i) -> __m256i {
                    $dot
                }

                #[target_feature(enable = $features)]
                #[inline]
                fn hsum(v: __m256) -> f32 {
                    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
                    _mm_cvtss_f32(s)
                }

                /// `out[i * X + j] = w_i · x_j` for `rows` weight rows, `W` per pass, and `X`
                /// activation rows.
                ///
                /// # Safety
                /// The features of this module must be available; `a` must hold `rows`
                /// weight rows and `X` activation rows of `a.nb` blocks, `out` `rows * X`
                /// floats, and `a.dtype` must be Q4_0, Q4_1 or Q8_0 (all checked by
                /// `dot_q8`).
                #[target_feature(enable = $features)]
                pub(super) unsafe fn rows<const W: usize, const X: usize>(
                    a: &Q8Args<'_>,
                    rows: usize,
                    out: &mut [f32],
                ) {
                    let mut r = 0;
                    // SAFETY: each call covers rows `r..r + W` (or `r..r + 1`) below `rows`.
                    unsafe {
                        while r + W <= rows {
                            dot::<W, X>(a, r, &mut out[r * X..(r + W) * X]);
                            r += W;
                        }
                        while r < rows {
                            dot::<1, X>(a, r, &mut out[r * X..(r + 1) * X]);
                            r += 1;
                        }
                    }
                }

                /// `out[i * X + j] = w_{r0 + i} · x_j` for `W` weight rows from `r0` and `X`
                /// activation rows.
                ///
                /// # Safety
                /// As for [`rows`], with `r0 + W` at most its `rows`.
                #[target_feature(enable = $features)]
                #[inline]
                unsafe fn dot<const W: usize, const X: usize>(
                    a: &Q8Args<'_>,
                    r0: usize,
                    out: &mut [f32],
                ) {
                    let mut acc = [[_mm256_setzero_ps(); X]; W];
                    let mut offs = [[0f32; X]; W];
                    // SAFETY: row `r0` is inside the checked rows.
                    let w = unsafe { a.w.as_ptr().add(r0 * a.w_stride) };
                    let x = a.x.as_ptr();
                    let nb = a.nb;
                    // SAFETY (whole block): block `b` of weight row `i` is the bytes
                    // `i * w_stride + b * block_bytes..+ block_bytes`, and activation block
                    // `j * nb + b`, both inside what `dot_q8` asserted for `b < nb`,
                    // `i < W`, `j < X`.
                    // Blocks go in pairs: `t = p0·s0 + p1·s1`, then `acc += t`, so the
                    // loop-carried chain is one add per two blocks, and the rounding is the
                    // same whatever `W` and `X` are (a row gives the same result in any
                    // batch).
                    let mut t = [[_mm256_setzero_ps(); X]; W];
                    unsafe {
                        match a.dtype {
                            DType::Q4_0 | DType::Q4_1 => {
                                let has_min = a.dtype == DType::Q4_1;
                                let bb = if has_min { 20 } else { 18 };
                                let qoff = if has_min { 4 } else { 2 };
                                let mask = _mm_set1_epi8(0x0F);
                                macro_rules! q4_block {
                                    ($bi:expr, $first:expr) => {{
                                        let b = $bi;
                                        let mut wq = [_mm256_setzero_si256(); W];
                                        let mut dw = [0f32; W];
                                        let mut mw = [0f32; W];
                                        for i in 0..W {
                                            let blk = w.add(i * a.w_stride + b * bb);
                                            let raw =
                                                _mm_loadu_si128(blk.add(qoff) as *const __m128i);
                                            let lo = _mm_and_si128(raw, mask);
                                            let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), mask);
                                            wq[i] = _mm256_set_m128i(hi, lo);
                                            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(
                                                (blk as *const i32).read_unaligned(),
                                            ));
                                            dw[i] = _mm_cvtss_f32(dm);
                                            mw[i] = if has_min {
                                                _mm_cvtss_f32(_mm_movehdup_ps(dm))
                                            } else {
                                                -8.0 * dw[i]
                                            };
                                        }
                                        for j in 0..X {
                                            let xb = &*x.add(j * nb + b);
                                            let xq = _mm256_loadu_si256(
                                                xb.qs.as_ptr() as *const __m256i
                                            );
                                            for i in 0..W {
                                                let p = _mm256_cvtepi32_ps(dot_u8i8(wq[i], xq));
                                                let sc = _mm256_set1_ps(dw[i] * xb.d);
                                                t[i][j] = if $first {
                                                    _mm256_mul_ps(p, sc)
                                                } else {
                                                    _mm256_fmadd_ps(p, sc, t[i][j])
                                                };
                                                offs[i][j] += mw[i] * xb.s;
                                            }
                                        }
                                    }};
                                }
                                let mut b = 0;
                                while b < nb {
                                    q4_block!(b, true);
                                    if b + 1 < nb {
                                        q4_block!(b + 1, false);
                                    }
                                    for i in 0..W {
                                        for j in 0..X {
                                            acc[i][j] = _mm256_add_ps(acc[i][j], t[i][j]);
                                        }
                                    }
                                    b += 2;
                                }
                            }
                            _ => {
                                macro_rules! q8_block {
                                    ($bi:expr, $first:expr) => {{
                                        let b = $bi;
                                        let mut wa = [_mm256_setzero_si256(); W];
                                        let mut ws = [_mm256_setzero_si256(); W];
                                        let mut dw = [0f32; W];
                                        for i in 0..W {
                                            let blk = w.add(i * a.w_stride + b * 34);
                                            let q =
                                                _mm256_loadu_si256(blk.add(2) as *const __m256i);
                                            // |w| as unsigned bytes (−128 becomes 128); the
                                            // sign moves onto the activations below.
                                            wa[i] = _mm256_sign_epi8(q, q);
                                            ws[i] = q;
                                            dw[i] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                                                i32::from((blk as *const u16).read_unaligned()),
                                            )));
                                        }
                                        for j in 0..X {
                                            let xb = &*x.add(j * nb + b);
                                            let xq = _mm256_loadu_si256(
                                                xb.qs.as_ptr() as *const __m256i
                                            );
                                            for i in 0..W {
                                                let sx = _mm256_sign_epi8(xq, ws[i]);
                                                let p = _mm256_cvtepi32_ps(dot_u8i8(wa[i], sx));
                                                let sc = _mm256_set1_ps(dw[i] * xb.d);
                                                t[i][j] = if $first {
                                                    _mm256_mul_ps(p, sc)
                                                } else {
                                                    _mm256_fmadd_ps(p, sc, t[i][j])
                                                };
                                            }
                                        }
                                    }};
                                }
                                let mut b = 0;
                                while b < nb {
                                    q8_block!(b, true);
                                    if b + 1 < nb {
                                        q8_block!(b + 1, false);
                                    }
                                    for i in 0..W {
                                        for j in 0..X {
                                            acc[i][j] = _mm256_add_ps(acc[i][j], t[i][j]);
                                        }
                                    }
                                    b += 2;
                                }
                            }
                        }
                    }
                    for i in 0..W {
                        for j in 0..X {
                            out[i * X + j] = hsum(acc[i][j]) + offs[i][j];
                        }
                    }
                }
            }
        };
    }

    int_kernels!(avx2, "avx2,fma,f16c", |a, b| _mm256_madd_epi16(
        _mm256_maddubs_epi16(a, b),
        _mm256_set1_epi16(1)
    ));
    int_kernels!(avxvnni, "avx2,fma,f16c,avxvnni", |a, b| {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b)
    });
    int_kernels!(avx512vnni, "avx2,fma,f16c,avx512vnni,avx512vl", |a, b| {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
    });
}
