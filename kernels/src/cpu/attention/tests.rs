//! The fused attention against the generic path on the scalar kernels.

use super::*;
use crate::cpu::encoder::softmax_rows_at;
use crate::cpu::gemm::gemm_at;
use crate::cpu::gemm::tests::values;
use crate::Epilogue;

/// The generic path on the scalar kernels: two products and a row softmax.
fn reference(q: &[f32], k: &[f32], v: &[f32], ld: usize, len: usize, hd: usize) -> Vec<f32> {
    let scale = 1.0 / (hd as f32).sqrt();
    let mut keys = PackedB::default();
    keys.pack_transposed_at(Isa::SCALAR, k, ld, hd, len);
    let mut s = vec![0.0; len * len];
    let plain = Epilogue::default();
    gemm_at(
        Isa::SCALAR,
        len,
        q,
        ld,
        keys.all(),
        &mut s,
        len,
        plain,
        false,
    )
    .unwrap();
    softmax_rows_at(Isa::SCALAR, &mut s, len, scale);
    let mut vals = PackedB::default();
    vals.pack_rows(v, ld, len, hd);
    let mut out = vec![0.0; len * hd];
    gemm_at(
        Isa::SCALAR,
        len,
        &s,
        len,
        vals.all(),
        &mut out,
        hd,
        plain,
        false,
    )
    .unwrap();
    out
}

/// The fused kernel of `isa` (an AVX2 or AVX-512 level) against the generic path.
fn fused_matches_the_two_products(isa: Isa) {
    assert!(fused_at(isa, 32) && fused_at(isa, 64), "{isa:?}");
    for hd in [32, 64] {
        // Every shape of the last panel and of the last query block.
        for len in [1, 2, 5, 6, 7, 15, 16, 17, 33, 47, 48, 49, 100, 204, 256] {
            let ld = 3 * 12 * hd + 5;
            // Spread the scores: the test values are in [-1, 1).
            let qkv: Vec<f32> = values(len * ld, (len * hd) as u32)
                .iter()
                .map(|x| 2.0 * x)
                .collect();
            let (q, k, v) = (&qkv[..], &qkv[hd..], &qkv[2 * hd..]);
            let want = reference(q, k, v, ld, len, hd);
            let (mut keys, mut vals, mut scores) =
                (PackedB::default(), PackedB::default(), Vec::new());
            let mut got = vec![f32::NAN; len * hd];
            let scale = 1.0 / (hd as f32).sqrt();
            attend_at(
                isa,
                q,
                k,
                v,
                ld,
                len,
                hd,
                scale,
                &mut keys,
                &mut vals,
                &mut scores,
                &mut got,
            )
            .unwrap();
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (x - y).abs() <= 2e-6 * (1.0 + y.abs()),
                    "hd={hd} len={len} [{i}]: {x} vs {y}"
                );
            }
        }
    }
}

mod fused_matches_the_two_products {
    level_tests!(super::fused_matches_the_two_products => Avx2, AvxVnni, Avx512, Avx512Vnni);
}

/// On the portable level the kernel is not offered, and refuses a call.
fn refused_without_simd(isa: Isa) {
    assert!(!fused_at(isa, 32) && !fused_at(isa, 64), "{isa:?}");
    let (mut keys, mut vals, mut scores) = (PackedB::default(), PackedB::default(), Vec::new());
    let qkv = values(2 * 96, 1);
    let mut out = vec![0.0; 2 * 32];
    let r = attend_at(
        isa,
        &qkv,
        &qkv,
        &qkv,
        96,
        2,
        32,
        0.2,
        &mut keys,
        &mut vals,
        &mut scores,
        &mut out,
    );
    assert!(r.is_err(), "{isa:?}");
}

mod refused_without_simd {
    level_tests!(super::refused_without_simd => Scalar);
}

#[test]
fn bad_shapes_are_errors() {
    let (mut keys, mut vals, mut scores) = (PackedB::default(), PackedB::default(), Vec::new());
    let mut out = vec![0.0; 32];
    let short = vec![0.0; 40];
    let r = fused_attention(
        &short,
        &short,
        &short,
        96,
        2,
        32,
        0.2,
        &mut keys,
        &mut vals,
        &mut scores,
        &mut out,
    );
    assert!(r.is_err());
    // Other head sizes are never fused.
    assert!(!fused_attention_available(48));
}
