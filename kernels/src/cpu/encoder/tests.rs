//! The encoder's element-wise and row-wise operations, each on every level this CPU runs.

use super::*;

#[test]
fn exp_is_accurate() {
    let mut x = -87.0f32;
    while x < 88.0 {
        let want = (x as f64).exp();
        let got = exp(x) as f64;
        assert!(
            ((got - want) / want).abs() < 5e-7,
            "exp({x}) = {got}, want {want}"
        );
        x += 0.173;
    }
    assert_eq!(exp(0.0), 1.0);
}

#[test]
fn erf_is_accurate() {
    // Reference values of erf.
    for &(x, want) in &[
        (0.0f32, 0.0f64),
        (0.1, 0.112_462_916_018_284_9),
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.5, 0.999_999_256_901_627_7),
        (-1.0, -0.842_700_792_949_714_9),
    ] {
        assert!((erf(x) as f64 - want).abs() < 3e-7, "erf({x}) = {}", erf(x));
    }
}

#[test]
fn activations() {
    let mut v = vec![-3.0, -1.0, 0.0, 1.0, 3.0];
    Activation::GeluErf.apply(&mut v);
    let want = [-0.004_049_7, -0.158_655_25, 0.0, 0.841_344_7, 2.995_950_3];
    for (g, w) in v.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{g} vs {w}");
    }
    let mut v = vec![-1.0, 1.0];
    Activation::GeluTanh.apply(&mut v);
    assert!(
        (v[1] - 0.841_192).abs() < 1e-5 && (v[0] + 0.158_808).abs() < 1e-5,
        "{v:?}"
    );
    let mut v = vec![-1.0, 2.0];
    Activation::Relu.apply(&mut v);
    assert_eq!(v, vec![0.0, 2.0]);
}

/// `isa`'s GELUs (erf, tanh) and ReLU against the scalar formulas, and its row softmax
/// against the definition in f64: 37 values are two whole 16-lane vectors and a masked tail,
/// four whole 8-lane ones and a tail.
fn vector_paths_match_the_scalar_ones(isa: Isa) {
    let x: Vec<f32> = (0..37).map(|i| i as f32 * 0.37 - 6.0).collect();
    type Scalar = fn(f32) -> f32;
    let scalar: [(Activation, Scalar); 3] = [
        (Activation::GeluErf, gelu_erf),
        (Activation::GeluTanh, gelu_tanh),
        (Activation::Relu, |v| v.max(0.0)),
    ];
    for (act, f) in scalar {
        let mut g = x.clone();
        act.apply_at(isa, &mut g);
        for (v, got) in x.iter().zip(&g) {
            let want = f(*v);
            assert!(
                (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{isa:?} {act:?}({v}) = {got}, want {want}"
            );
        }
    }
    // Two rows, so that the second starts mid-vector.
    let mut s: Vec<f32> = x.iter().chain(&x).copied().collect();
    softmax_rows_at(isa, &mut s, 37, 0.5);
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64 * 0.5;
    let e: Vec<f64> = x.iter().map(|&v| (v as f64 * 0.5 - max).exp()).collect();
    let total: f64 = e.iter().sum();
    for (got, want) in s.iter().zip(e.iter().chain(&e)) {
        assert!(
            (*got as f64 - want / total).abs() < 1e-7,
            "{isa:?} softmax: {got} vs {}",
            want / total
        );
    }
}

mod vector_paths_match_the_scalar_ones {
    level_tests!(super::vector_paths_match_the_scalar_ones => Scalar, Avx2, Avx512);
}

/// `isa`'s LayerNorm (with and without the residual) against the definition in f64.
fn layer_norm_matches_f64(isa: Isa) {
    let h = 37;
    let x: Vec<f32> = (0..3 * h)
        .map(|i| ((i * 37) % 101) as f32 / 25.0 - 2.0)
        .collect();
    let res: Vec<f32> = (0..3 * h).map(|i| ((i * 13) % 89) as f32 / 89.0).collect();
    let gamma: Vec<f32> = (0..h).map(|i| 0.5 + i as f32 / h as f32).collect();
    let beta: Vec<f32> = (0..h).map(|i| i as f32 * 0.01 - 0.1).collect();
    for residual in [&res[..], &[]] {
        let mut got = x.clone();
        add_layer_norm_at(isa, &mut got, residual, &gamma, &beta, 1e-12);
        for r in 0..3 {
            let row: Vec<f64> = (0..h)
                .map(|i| {
                    f64::from(x[r * h + i]) + residual.get(r * h + i).map_or(0.0, |&v| f64::from(v))
                })
                .collect();
            let mean = row.iter().sum::<f64>() / h as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / h as f64;
            for i in 0..h {
                let want = (row[i] - mean) / var.sqrt() * f64::from(gamma[i]) + f64::from(beta[i]);
                let g = f64::from(got[r * h + i]);
                assert!(
                    (g - want).abs() < 1e-5,
                    "{isa:?} row {r} [{i}]: {g} vs {want}"
                );
            }
        }
    }
}

mod layer_norm_matches_f64 {
    level_tests!(super::layer_norm_matches_f64 => Scalar, Avx2);
}

#[test]
fn softmax_rows_sum_to_one() {
    let mut x = vec![1.0, 2.0, 3.0, 1000.0, 1000.0, -1000.0];
    softmax_rows(&mut x, 3, 0.5);
    let e: Vec<f64> = [0.5f64, 1.0, 1.5].iter().map(|v| v.exp()).collect();
    let s: f64 = e.iter().sum();
    for (g, w) in x[..3].iter().zip(&e) {
        assert!((*g as f64 - w / s).abs() < 1e-6);
    }
    assert!(
        (x[3] - 0.5).abs() < 1e-6 && (x[4] - 0.5).abs() < 1e-6,
        "{x:?}"
    );
    assert!(x[5] < 1e-30, "{x:?}");
}

#[test]
fn lane_reductions() {
    let v: Vec<f32> = (0..21).map(|i| i as f32 - 3.0).collect();
    assert_eq!(sum_lanes(&v), v.iter().sum::<f32>());
    assert_eq!(max_lanes(&v), 17.0);
    assert_eq!(max_lanes(&[]), f32::NEG_INFINITY);
    assert_eq!(sum_lanes(&[]), 0.0);
}

#[test]
fn layer_norm_matches_definition() {
    let mut x = vec![1.0, 2.0, 3.0, 4.0];
    let res = vec![1.0, 0.0, 0.0, -1.0];
    add_layer_norm(&mut x, &res, &[1.0, 2.0], &[0.0, 1.0], 1e-12);
    // rows after the residual: [2, 2] and [3, 3] -> zero variance -> beta.
    assert_eq!(x, vec![0.0, 1.0, 0.0, 1.0]);
    let mut y = vec![0.0, 2.0];
    add_layer_norm(&mut y, &[], &[1.0, 1.0], &[0.0, 0.0], 0.0);
    assert!((y[0] + 1.0).abs() < 1e-6 && (y[1] - 1.0).abs() < 1e-6);
}
