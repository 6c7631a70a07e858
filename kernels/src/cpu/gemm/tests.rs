//! The packed GEMM against a naive product, each micro-kernel on every level this CPU runs.

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
pub(crate) fn values(len: usize, seed: u32) -> Vec<f32> {
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

/// `isa`'s micro-kernel against the naive product: odd shapes; panel counts 1, 2, 3, 19
/// (three-panel tiles, then one) and 96; partial last panels and partial row groups; A packed
/// (many panels) with two k blocks; with and without the threads.
fn kernel_matches_naive(isa: Isa) {
    for &(m, k, n) in &[
        (1, 1, 1),
        (7, 5, 17),
        (6, 16, 16),
        (13, 300, 33),
        (64, 384, 48),
        (100, 520, 20),
        (5, 7, 16),
        (13, 32, 40),
        (20, 64, 32),
        (23, 400, 290),
        (97, 700, 300),
        (12, 384, 1536),
    ] {
        let a = values(m * k, 11);
        let w = values(n * k, 12);
        let bias = values(n, 13);
        let b = PackedB::from_linear(&w, n, k);
        let want = naive(m, k, n, &a, &w, Some(&bias));
        for parallel in [false, true] {
            let mut c = vec![f32::NAN; m * n];
            gemm_at(
                isa,
                m,
                &a,
                k,
                b.all(),
                &mut c,
                n,
                with_bias(&bias),
                parallel,
            )
            .unwrap();
            for (x, y) in c.iter().zip(&want) {
                assert!(
                    (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                    "{isa:?} m={m} k={k} n={n}: {x} vs {y}"
                );
            }
        }
    }
}

mod kernel_matches_naive {
    level_tests!(super::kernel_matches_naive => Scalar, Avx2, Avx512);
}

/// Both SIMD kernels fuse each multiply-add in the same k order, so they agree bit for bit.
#[test]
#[cfg_attr(not(host_avx512), ignore = "CPU lacks avx512f+bw+vl")]
fn avx2_and_avx512_kernels_agree_exactly() {
    let levels = [CpuLevel::Avx2, CpuLevel::Avx512];
    let isas = levels.map(|l| Isa::new(l).unwrap_or_else(|| panic!("the build saw {l} here")));
    for &(m, k, n) in &[(13, 32, 40), (97, 700, 300), (12, 384, 1536)] {
        let a = values(m * k, 11);
        let b = PackedB::from_linear(&values(n * k, 12), n, k);
        let bias = values(n, 13);
        let [x, y] = isas.map(|isa| {
            let mut c = vec![f32::NAN; m * n];
            gemm_at(isa, m, &a, k, b.all(), &mut c, n, with_bias(&bias), false).unwrap();
            c
        });
        assert_eq!(x, y, "m={m} k={k} n={n}");
    }
}

#[test]
fn rows_do_not_depend_on_the_batch() {
    let (m, k, n) = (50, 700, 40);
    let a = values(m * k, 4);
    let b = PackedB::from_linear(&values(n * k, 5), n, k);
    let mut all = vec![0.0; m * n];
    gemm_packed(m, &a, k, &b, &mut all, n, None, true).unwrap();
    for i in [0, 7, 49] {
        let mut one = vec![0.0; n];
        gemm_packed(1, &a[i * k..(i + 1) * k], k, &b, &mut one, n, None, false).unwrap();
        assert_eq!(&all[i * n..(i + 1) * n], one.as_slice(), "row {i}");
    }
}

/// A product over some of B's panels gives those columns of the full product, written at a
/// column offset of a wider C: exactly when the range has at least [`NP_MAX`] panels (the k
/// blocks, and so the order of the sums, depend on the panel count below that).
#[test]
fn column_ranges_match_the_full_product() {
    let (m, k, n) = (13, 200, 3 * 48);
    let a = values(m * k, 21);
    let b = PackedB::from_linear(&values(n * k, 22), n, k);
    let bias = values(n, 23);
    let mut full = vec![0.0; m * n];
    gemm_packed(m, &a, k, &b, &mut full, n, Some(&bias), false).unwrap();
    for (first, cols) in [(0, 48), (48, 96), (32, 17), (128, 16)] {
        let mut c = vec![f32::NAN; m * n];
        let post = with_bias(&bias[first..first + cols]);
        let view = b.cols(first, cols).unwrap();
        gemm_packed_cols(m, &a, k, view, &mut c[first..], n, post, false).unwrap();
        let exact = cols.div_ceil(NR) >= NP_MAX;
        for i in 0..m {
            let row = i * n;
            let got = &c[row + first..row + first + cols];
            let want = &full[row + first..row + first + cols];
            if exact {
                assert_eq!(got, want, "columns {first}+{cols}, row {i}");
            }
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{first}+{cols}: {g} vs {w}"
                );
            }
            assert!(
                c[row..row + first].iter().all(|v| v.is_nan()),
                "left untouched"
            );
        }
    }
    assert!(b.cols(8, 16).is_err(), "not on a panel boundary");
    assert!(b.cols(128, 32).is_err(), "past n");
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
    gemm_packed(m, &a_wide, 4, &b, &mut c, 3, None, false).unwrap();
    for i in 0..m {
        for j in 0..n {
            let want: f32 = (0..k).map(|p| a_wide[i * 4 + p] * b_wide[p * 5 + j]).sum();
            assert!((c[i * 3 + j] - want).abs() < 1e-5);
        }
        assert_eq!(c[i * 3 + 2], 0.0, "column past n untouched");
    }
}

/// Strided columns (as keys inside the fused QKV rows), whole panels (gathered on AVX-512)
/// and a partial last one (zero-padded).
fn transposed_packing_lays_out_every_panel(isa: Isa) {
    let (k, n, ld) = (32, 37, 1152);
    let src = values((n - 1) * ld + k, 14);
    let mut b = PackedB::default();
    b.pack_transposed_at(isa, &src, ld, k, n);
    let data = b.data();
    for p in 0..n.div_ceil(NR) {
        for kk in 0..k {
            for j in 0..NR {
                let col = p * NR + j;
                let want = if col < n { src[col * ld + kk] } else { 0.0 };
                assert_eq!(
                    data[(p * k + kk) * NR + j],
                    want,
                    "{isa:?} panel {p} k {kk} col {j}"
                );
            }
        }
    }
}

mod transposed_packing_lays_out_every_panel {
    level_tests!(super::transposed_packing_lays_out_every_panel => Scalar, Avx512);
}

#[test]
fn bad_shapes_are_errors() {
    let b = PackedB::from_linear(&[1.0; 6], 2, 3);
    let mut c = vec![0.0; 2];
    assert!(gemm_packed(2, &[1.0; 3], 3, &b, &mut c, 2, None, false).is_err());
}

/// The activation in the epilogue (in the AVX2 kernel's registers, elsewhere over each
/// finished tile) equals a second pass over the product, bit for bit: whole and partial row
/// groups and panels, A packed.
fn epilogue_activation_equals_a_second_pass(isa: Isa) {
    let (m, k, n) = (53, 384, 16 * 17 + 5);
    let a = values(m * k, 31);
    let b = PackedB::from_linear(&values(n * k, 32), n, k);
    let bias = values(n, 33);
    for act in [Activation::GeluErf, Activation::GeluTanh, Activation::Relu] {
        let mut want = vec![0.0; m * n];
        gemm_at(
            isa,
            m,
            &a,
            k,
            b.all(),
            &mut want,
            n,
            with_bias(&bias),
            false,
        )
        .unwrap();
        act.apply_at(isa, &mut want);
        let mut got = vec![f32::NAN; m * n];
        let post = Epilogue {
            bias: Some(&bias),
            act: Some(act),
        };
        gemm_at(isa, m, &a, k, b.all(), &mut got, n, post, false).unwrap();
        assert_eq!(got, want, "{isa:?} {act:?}");
    }
}

mod epilogue_activation_equals_a_second_pass {
    level_tests!(super::epilogue_activation_equals_a_second_pass => Scalar, Avx2, Avx512);
}
