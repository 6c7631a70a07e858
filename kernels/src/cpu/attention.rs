//! Self-attention of one head of one sequence, `softmax(scale · Q Kᵀ) V`, fused on AVX-512
//! and on AVX2 for head sizes of 32 and 64: for each block of six queries, the scores of the
//! block against every key, their softmax and the product with the values run back to back on
//! a few KiB that stay in L1, and the normalisation is applied once to the block's six output
//! rows instead of to every probability. Elsewhere (the portable level, other head sizes) the
//! caller runs the generic path: two products through [`super::gemm`] with a row softmax
//! between them.

use super::features::{cpu_isa, CpuLevel, Isa};
use super::gemm::PackedB;
use crate::KernelError;

/// Queries per block (the rows of one micro-tile).
const QB: usize = 6;
/// Keys per packed panel.
const NR: usize = 16;

/// Whether [`fused_attention`] serves this head size here (an AVX2 or AVX-512 level).
pub fn fused_attention_available(head_dim: usize) -> bool {
    fused_at(cpu_isa(), head_dim)
}

/// Whether the fused kernel serves this head size on `isa`.
pub(crate) fn fused_at(isa: Isa, head_dim: usize) -> bool {
    matches!(head_dim, 32 | 64) && isa.level() != CpuLevel::Scalar
}

/// `out[len × hd] = softmax(scale · Q Kᵀ) V` for one head of one sequence. Row `i` of Q, K and
/// V starts at `i * ld` in `q`, `k` and `v` (the head's `hd` values). `keys`, `values` and
/// `scores` are scratch space kept by the caller between calls.
///
/// # Errors
/// [`KernelError::Shape`] if the operands are short or the kernel does not serve this head
/// size here ([`fused_attention_available`]).
#[allow(clippy::too_many_arguments)]
pub fn fused_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    ld: usize,
    len: usize,
    hd: usize,
    scale: f32,
    keys: &mut PackedB,
    values: &mut PackedB,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let isa = cpu_isa();
    attend_at(isa, q, k, v, ld, len, hd, scale, keys, values, scores, out)
}

/// [`fused_attention`] for `isa`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_at(
    isa: Isa,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    ld: usize,
    len: usize,
    hd: usize,
    scale: f32,
    keys: &mut PackedB,
    values: &mut PackedB,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    if len == 0 {
        return Ok(());
    }
    let rows_end = (len - 1) * ld + hd;
    if !fused_at(isa, hd)
        || ld < hd
        || q.len() < rows_end
        || k.len() < rows_end
        || v.len() < rows_end
        || out.len() < len * hd
    {
        return Err(KernelError::Shape(format!(
            "fused attention: len={len} hd={hd} ld={ld} q={} k={} v={} out={}",
            q.len(),
            k.len(),
            v.len(),
            out.len()
        )));
    }
    keys.pack_transposed_at(isa, k, ld, hd, len);
    values.pack_rows(v, ld, len, hd);
    let width = len.next_multiple_of(NR);
    if scores.len() < QB * width {
        scores.resize(QB * width, 0.0);
    }
    let (kp, vp) = (keys.packed(), values.packed());
    if kp.len() < width * hd || vp.len() < len * hd {
        return Err(KernelError::Shape("fused attention: short packing".into()));
    }
    #[cfg(target_arch = "x86_64")]
    {
        let s = &mut scores[..QB * width];
        let wide = matches!(isa.level(), CpuLevel::Avx512 | CpuLevel::Avx512Vnni);
        // SAFETY: `isa` is a SIMD level that runs here (`fused_at`: AVX-512 where `wide`, else
        // AVX2 and FMA); the lengths of Q, K, V, the packings, the scores block and `out` were
        // checked above, as both kernels need.
        unsafe {
            match (wide, hd) {
                (true, 32) => avx512::attend::<2>(q, ld, len, kp, vp, scale, s, out),
                (true, _) => avx512::attend::<4>(q, ld, len, kp, vp, scale, s, out),
                (false, 32) => avx2::attend::<2>(q, ld, len, kp, vp, scale, s, out),
                (false, _) => avx2::attend::<4>(q, ld, len, kp, vp, scale, s, out),
            }
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{NR, QB};
    use crate::cpu::encoder::exp512;
    use std::arch::x86_64::*;

    /// One head of one sequence, `D` vectors of 16 per row (`hd = 16 * D`).
    ///
    /// # Safety
    /// The CPU has AVX-512F; `q` holds `(len-1) * ld + hd` floats; `kp` the keys packed
    /// transposed (`len.next_multiple_of(16) * hd` floats, panels of 16 keys); `vp` the
    /// values packed by rows (`len * hd` floats, `D` panels of 16 columns); `s` holds
    /// `QB * len.next_multiple_of(16)` floats; `out` holds `len * hd`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub(super) unsafe fn attend<const D: usize>(
        q: &[f32],
        ld: usize,
        len: usize,
        kp: &[f32],
        vp: &[f32],
        scale: f32,
        s: &mut [f32],
        out: &mut [f32],
    ) {
        let hd = D * NR;
        let panels = len.div_ceil(NR);
        let width = panels * NR;
        let tail = len - (panels - 1) * NR;
        let tail_mask = (u32::MAX >> (32 - tail)) as __mmask16;
        // SAFETY: every pointer below stays inside the slices, as documented above: query rows
        // below `len`, `hd` values each; key panels `p < panels`, depth below `hd`; value rows
        // below `len`; score rows below QB, `width` each; output rows below `len`.
        unsafe {
            let (q, kp, vp, s, out) = (
                q.as_ptr(),
                kp.as_ptr(),
                vp.as_ptr(),
                s.as_mut_ptr(),
                out.as_mut_ptr(),
            );
            let sc = _mm512_set1_ps(scale);
            let mut i0 = 0;
            while i0 < len {
                let rows = QB.min(len - i0);
                // Rows past the end repeat the block's last query; never stored.
                let qr: [*const f32; QB] =
                    std::array::from_fn(|r| q.add((i0 + r.min(rows - 1)) * ld));
                let mut p = 0;
                while p < panels {
                    match panels - p {
                        1 => scores_tile::<1>(&qr, hd, kp, p, sc, s, width),
                        2 => scores_tile::<2>(&qr, hd, kp, p, sc, s, width),
                        _ => scores_tile::<3>(&qr, hd, kp, p, sc, s, width),
                    }
                    p += 3;
                }
                // Softmax of each row without the division; keys past `len` are masked off.
                let mut inv = [0.0f32; QB];
                for (r, inv_r) in inv.iter_mut().enumerate() {
                    let row = s.add(r * width);
                    let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
                    for c in 0..panels - 1 {
                        mx = _mm512_max_ps(mx, _mm512_loadu_ps(row.add(c * NR)));
                    }
                    let last = row.add((panels - 1) * NR);
                    mx = _mm512_max_ps(
                        mx,
                        _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), tail_mask, last),
                    );
                    let max = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
                    let mut sum = _mm512_setzero_ps();
                    for c in 0..panels - 1 {
                        let e = exp512(_mm512_sub_ps(_mm512_loadu_ps(row.add(c * NR)), max));
                        sum = _mm512_add_ps(sum, e);
                        _mm512_storeu_ps(row.add(c * NR), e);
                    }
                    let e = _mm512_maskz_mov_ps(
                        tail_mask,
                        exp512(_mm512_sub_ps(_mm512_loadu_ps(last), max)),
                    );
                    sum = _mm512_add_ps(sum, e);
                    _mm512_storeu_ps(last, e);
                    *inv_r = 1.0 / _mm512_reduce_add_ps(sum);
                }
                // The block's outputs: probabilities times values, then the normalisation.
                let mut acc = [[_mm512_setzero_ps(); D]; QB];
                for j in 0..len {
                    let vr: [__m512; D] =
                        std::array::from_fn(|d| _mm512_loadu_ps(vp.add(d * NR * len + j * NR)));
                    for r in 0..QB {
                        let x = _mm512_set1_ps(*s.add(r * width + j));
                        for d in 0..D {
                            acc[r][d] = _mm512_fmadd_ps(x, vr[d], acc[r][d]);
                        }
                    }
                }
                for r in 0..rows {
                    let iv = _mm512_set1_ps(inv[r]);
                    for d in 0..D {
                        _mm512_storeu_ps(
                            out.add((i0 + r) * hd + d * NR),
                            _mm512_mul_ps(acc[r][d], iv),
                        );
                    }
                }
                i0 += rows;
            }
        }
    }

    /// `scale · Q Kᵀ` of the block's QB queries against the keys of panels `p .. p + NP`, into
    /// the score rows (`width` apart).
    ///
    /// # Safety
    /// As [`attend`]: the query rows hold `hd` floats, panels `p .. p + NP` exist.
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(clippy::needless_range_loop)]
    unsafe fn scores_tile<const NP: usize>(
        qr: &[*const f32; QB],
        hd: usize,
        kp: *const f32,
        p: usize,
        sc: __m512,
        s: *mut f32,
        width: usize,
    ) {
        // SAFETY: as documented above.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); NP]; QB];
            let base = kp.add(p * hd * NR);
            for d in 0..hd {
                let b: [__m512; NP] =
                    std::array::from_fn(|j| _mm512_loadu_ps(base.add(j * hd * NR + d * NR)));
                for r in 0..QB {
                    let x = _mm512_set1_ps(*qr[r].add(d));
                    for j in 0..NP {
                        acc[r][j] = _mm512_fmadd_ps(x, b[j], acc[r][j]);
                    }
                }
            }
            for r in 0..QB {
                for j in 0..NP {
                    _mm512_storeu_ps(
                        s.add(r * width + (p + j) * NR),
                        _mm512_mul_ps(acc[r][j], sc),
                    );
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(test)]
mod tests;
