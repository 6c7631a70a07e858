//! The 256-weight super-block types (the K-quants Q2_K..Q6_K, and IQ4_XS): their bit packing,
//! dequantisation, and integer dot products against activations quantised to [`Q8KBlock`]s.
//!
//! Every one of them reads, for weight `i` of a super-block and its 16-weight group
//! `g = i / 16`, as `w_i = (d·sc[g])·q[i] − (dmin·m[g])`: small integer quants `q`, small
//! integer group scales `sc` and minimums `m`, and two f16 super-block scales. [`unpack`]
//! brings each layout to that form, so the portable kernels are one loop for all types and
//! the dequantisation multiplies in the order ggml's reference does (its results are bitwise
//! equal). Byte layouts, as `ggml-common.h` defines them:
//!
//! - `Q2_K` (84 bytes): `scales[16]` (low nibble = scale, high nibble = min of group `g`),
//!   `qs[64]`, `d`, `dmin`. Weight `128n + 32j + l` is bits `2j..2j+2` of `qs[32n + l]`.
//! - `Q3_K` (110): `hmask[32]`, `qs[64]`, `scales[12]`, `d`. The low two bits as Q2_K; weight
//!   `128n + 32j + l` subtracts 4 unless bit `4n + j` of `hmask[l]` is set. Scale `g` is six
//!   bits: its low four from nibble `g / 8` of `scales[g % 8]`, its high two from bits
//!   `2(g / 4)..` of `scales[8 + g % 4]`; stored plus 32.
//! - `Q4_K` (144): `d`, `dmin`, `scales[12]`, `qs[128]`. Weights `64c..64c + 32` are the low
//!   nibbles of `qs[32c..32c + 32]`, the next 32 the high nibbles. Eight 6-bit scales and
//!   mins, one per 32: for `j < 4` the low six bits of `scales[j]` and `scales[j + 4]`; above,
//!   a nibble of `scales[j + 4]` plus the top two bits of `scales[j − 4]` and `scales[j]`.
//! - `Q5_K` (176): `d`, `dmin`, `scales[12]` (as Q4_K), `qh[32]`, `qs[128]` (as Q4_K); bit
//!   `b` of `qh[l]` is the fifth bit of weight `32b + l`.
//! - `Q6_K` (210): `ql[128]`, `qh[64]`, `scales[16]` (i8), `d`; quants are stored plus 32. In
//!   each half `n`, weight `128n + 32k + l` takes a nibble of `ql[64n + l]` (`k` = 0, 2: low,
//!   high) or `ql[64n + 32 + l]` (`k` = 1, 3) and bits `2k..2k+2` of `qh[32n + l]` above it.
//! - `IQ4_XS` (136): `d`, `scales_h` (u16), `scales_l[4]`, `qs[128]`; sub-block `b` of 32
//!   has the 6-bit scale (nibble `b % 2` of `scales_l[b / 2]`, bits `2b..2b+2` of `scales_h`
//!   above it) minus 32, and its weights index [`IQ4_LEVELS`] as IQ4_NL's do.

use super::dequant::f16_at;
use crate::DType;

#[cfg(target_arch = "x86_64")]
pub(crate) mod gemm_vnni;
#[cfg(target_arch = "x86_64")]
mod q45k_lanes;
#[cfg(target_arch = "x86_64")]
mod q6k_lanes;
mod q8k;
mod rows8;
#[cfg(target_arch = "x86_64")]
mod rows8_avx2;
#[cfg(target_arch = "x86_64")]
mod rows8_vnni;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod x86;

pub(crate) use q8k::{dot_q8k, max_xk, Q8KArgs};
pub use q8k::{quantize_row_q8k, Q8KBlock};
pub(crate) use rows8::by_groups;
pub(crate) use rows8::{
    dequantize_row as dequantize_interleaved_row, has_layout as has_interleaved_layout,
    pack as interleave, unpack_group as unpack_interleaved_group,
};

/// The variable that overrides where loaders interleave: `never` (keep every matrix as the
/// file stores it: no copy, the weight cache's pages stay shared), `always` (wherever the
/// layout exists, even where only the portable path reads it: tests), unset or `auto` where
/// this CPU's kernels read it faster.
pub const INTERLEAVE_VAR: &str = "KERNELS_INTERLEAVE";

/// Whether a loader should interleave `dtype` (see [`INTERLEAVE_VAR`]): by default where this
/// CPU's kernels read it faster: every type with the layout on every SIMD level (AVX-512
/// VNNI's kernels, and the AVX2 ones the other levels run); at the portable level each group
/// would be brought back to rows on every use. Read at each call: loaders ask once per model.
pub(crate) fn interleaving_pays(dtype: DType) -> bool {
    use crate::cpu::features::CpuLevel;
    let auto = || crate::cpu::features::cpu_isa().level() != CpuLevel::Scalar;
    has_interleaved_layout(dtype)
        && match std::env::var(INTERLEAVE_VAR).as_deref().map(str::trim) {
            Ok("never") => false,
            Ok("always") => true,
            Ok("auto") | Ok("") | Err(_) => auto(),
            Ok(other) => {
                tracing::warn!(
                    variable = INTERLEAVE_VAR,
                    value = other,
                    "unknown value ignored (never|always|auto): interleaving where it pays"
                );
                auto()
            }
        }
}

/// Weights per super-block.
pub const QK_K: usize = 256;

/// The 16 signed levels that IQ4_NL and IQ4_XS nibbles index.
pub(crate) const IQ4_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Whether `dtype` is stored in 256-weight super-blocks.
pub(crate) fn is_super_block(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS
    )
}

/// One super-block as `w_i = (d·sc[i / 16])·q[i] − (dmin·m[i / 16])`.
pub(crate) struct Unpacked {
    pub d: f32,
    /// Zero for the types without minimums.
    pub dmin: f32,
    pub sc: [i16; 16],
    pub m: [i16; 16],
    pub q: [i8; QK_K],
}

impl Default for Unpacked {
    fn default() -> Self {
        Unpacked {
            d: 0.0,
            dmin: 0.0,
            sc: [0; 16],
            m: [0; 16],
            q: [0; QK_K],
        }
    }
}

/// Scale and minimum `j` (of 8) of a Q4_K / Q5_K block's 12 packed bytes.
#[inline]
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// All eight scales and minimums of a Q4_K / Q5_K block's 12 packed bytes, four at a time
/// through 32-bit masks: what [`scale_min_k4`] gives for each `j`.
#[inline]
pub(crate) fn scales_mins_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (u0, u1, u2) = (word(0), word(4), word(8));
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    // Scales 0-3 and minimums 0-3 are six bits of bytes 0-3 and 4-7; scales 4-7 and minimums
    // 4-7 take a nibble of bytes 8-11 and the top two bits of bytes 0-3 and 4-7.
    let sc_lo = u0 & LOW6;
    let sc_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
    let mn_lo = u1 & LOW6;
    let mn_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
    let join = |lo: u32, hi: u32| {
        let (l, h) = (lo.to_le_bytes(), hi.to_le_bytes());
        [l[0], l[1], l[2], l[3], h[0], h[1], h[2], h[3]]
    };
    (join(sc_lo, sc_hi), join(mn_lo, mn_hi))
}

/// The 16 signed scales of a Q3_K block's 12 packed bytes.
#[inline]
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    // Four scales per u32 at once: scale `g`'s low nibble is nibble `g / 8` of byte `g % 8`,
    // its high two bits are bits `2(g / 4)..` of byte `8 + g % 4`.
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a, b, h) = (word(0), word(1), word(2));
    const NIB: u32 = 0x0F0F_0F0F;
    const TWO: u32 = 0x0303_0303;
    let packed = [
        (a & NIB) | ((h & TWO) << 4),
        (b & NIB) | (((h >> 2) & TWO) << 4),
        ((a >> 4) & NIB) | (((h >> 4) & TWO) << 4),
        ((b >> 4) & NIB) | (((h >> 6) & TWO) << 4),
    ];
    let mut out = [0i8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(packed) {
        for (v, byte) in o.iter_mut().zip(w.to_le_bytes()) {
            // At most 63: the subtraction stays in range.
            *v = byte as i8 - 32;
        }
    }
    out
}

/// The 8 signed scales (one per 32 weights) of an IQ4_XS block.
#[inline]
pub(crate) fn iq4xs_scales(blk: &[u8]) -> [i8; 8] {
    let high = u16::from_le_bytes([blk[2], blk[3]]);
    let mut out = [0i8; 8];
    for (b, o) in out.iter_mut().enumerate() {
        let low = (blk[4 + b / 2] >> (4 * (b % 2))) & 0x0F;
        let hi = ((high >> (2 * b)) & 3) as u8;
        *o = (low | (hi << 4)) as i8 - 32;
    }
    out
}

/// Bring super-block `blk` (`dtype.block_bytes()` bytes) of a super-block type to the common
/// form.
///
/// # Panics
/// If `dtype` is not a super-block type or `blk` is short (bugs in the caller).
pub(crate) fn unpack(dtype: DType, blk: &[u8], u: &mut Unpacked) {
    assert!(
        is_super_block(dtype) && blk.len() >= dtype.block_bytes(),
        "unpack: {} bytes of {dtype}",
        blk.len()
    );
    u.dmin = 0.0;
    u.m = [0; 16];
    match dtype {
        DType::Q2_K => {
            let (scales, qs) = (&blk[..16], &blk[16..80]);
            u.d = f16_at(blk, 80);
            u.dmin = f16_at(blk, 82);
            for ((s, m), &b) in u.sc.iter_mut().zip(u.m.iter_mut()).zip(scales) {
                *s = i16::from(b & 0x0F);
                *m = i16::from(b >> 4);
            }
            for n in 0..2 {
                for j in 0..4 {
                    for l in 0..32 {
                        u.q[128 * n + 32 * j + l] = ((qs[32 * n + l] >> (2 * j)) & 3) as i8;
                    }
                }
            }
        }
        DType::Q3_K => {
            let (hmask, qs) = (&blk[..32], &blk[32..96]);
            u.d = f16_at(blk, 108);
            for (s, v) in u.sc.iter_mut().zip(q3k_scales(&blk[96..108])) {
                *s = i16::from(v);
            }
            for n in 0..2 {
                for j in 0..4 {
                    let bit = 1u8 << (4 * n + j);
                    for l in 0..32 {
                        let low = ((qs[32 * n + l] >> (2 * j)) & 3) as i8;
                        let sub = if hmask[l] & bit != 0 { 0 } else { 4 };
                        u.q[128 * n + 32 * j + l] = low - sub;
                    }
                }
            }
        }
        DType::Q4_K | DType::Q5_K => {
            u.d = f16_at(blk, 0);
            u.dmin = f16_at(blk, 2);
            let scales = &blk[4..16];
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, scales);
                u.sc[2 * j] = i16::from(s);
                u.sc[2 * j + 1] = i16::from(s);
                u.m[2 * j] = i16::from(m);
                u.m[2 * j + 1] = i16::from(m);
            }
            let (qh, qs): (Option<&[u8]>, &[u8]) = if dtype == DType::Q5_K {
                (Some(&blk[16..48]), &blk[48..176])
            } else {
                (None, &blk[16..144])
            };
            for c in 0..4 {
                for l in 0..32 {
                    let b = qs[32 * c + l];
                    let (mut lo, mut hi) = (b & 0x0F, b >> 4);
                    if let Some(qh) = qh {
                        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                    }
                    u.q[64 * c + l] = lo as i8;
                    u.q[64 * c + 32 + l] = hi as i8;
                }
            }
        }
        DType::Q6_K => {
            let (ql, qh, scales) = (&blk[..128], &blk[128..192], &blk[192..208]);
            u.d = f16_at(blk, 208);
            for (s, &b) in u.sc.iter_mut().zip(scales) {
                *s = i16::from(b as i8);
            }
            for n in 0..2 {
                let (ql, qh) = (&ql[64 * n..], &qh[32 * n..]);
                let q = &mut u.q[128 * n..];
                for l in 0..32 {
                    let h = qh[l];
                    q[l] = ((ql[l] & 0x0F) | ((h & 3) << 4)) as i8 - 32;
                    q[32 + l] = ((ql[32 + l] & 0x0F) | (((h >> 2) & 3) << 4)) as i8 - 32;
                    q[64 + l] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                    q[96 + l] = ((ql[32 + l] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                }
            }
        }
        DType::IQ4_XS => {
            u.d = f16_at(blk, 0);
            let qs = &blk[8..136];
            for (b, s) in iq4xs_scales(blk).into_iter().enumerate() {
                u.sc[2 * b] = i16::from(s);
                u.sc[2 * b + 1] = i16::from(s);
                for j in 0..16 {
                    let v = qs[16 * b + j];
                    u.q[32 * b + j] = IQ4_LEVELS[usize::from(v & 0x0F)];
                    u.q[32 * b + 16 + j] = IQ4_LEVELS[usize::from(v >> 4)];
                }
            }
        }
        _ => unreachable!("checked above"),
    }
}

/// Dequantise whole super-blocks of `dtype` from `bytes` into `out` (a multiple of 256).
pub(crate) fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    let mut u = Unpacked::default();
    let has_min = matches!(dtype, DType::Q2_K | DType::Q4_K | DType::Q5_K);
    for (blk, o) in bytes
        .chunks_exact(dtype.block_bytes())
        .zip(out.chunks_exact_mut(QK_K))
    {
        unpack(dtype, blk, &mut u);
        for (g, (og, qg)) in o.chunks_exact_mut(16).zip(u.q.chunks_exact(16)).enumerate() {
            let dl = u.d * f32::from(u.sc[g]);
            if has_min {
                let ml = u.dmin * f32::from(u.m[g]);
                for (w, &q) in og.iter_mut().zip(qg) {
                    *w = dl * f32::from(q) - ml;
                }
            } else {
                for (w, &q) in og.iter_mut().zip(qg) {
                    *w = dl * f32::from(q);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_mins_k4_unpacks_as_scale_min_k4() {
        let mut state = 0x9E37_79B9u32;
        for _ in 0..2000 {
            let s: [u8; 12] = std::array::from_fn(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 24) as u8
            });
            let (sc, mn) = scales_mins_k4(&s);
            for j in 0..8 {
                assert_eq!((sc[j], mn[j]), scale_min_k4(j, &s), "{s:?} {j}");
            }
        }
    }
}
