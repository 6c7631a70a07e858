//! Safe wrappers over the `gemm` crate for dense f32 products with row strides.

/// `c[i, j] = alpha · Σ_t a[i, t] · b[j, t]` (`A · Bᵀ`), all row-major: `a` is `m × k` with row
/// stride `a_rs`, `b` is `n × k` with row stride `b_rs`, `c` is `m × n` with row stride `c_rs`.
///
/// # Panics
/// If a slice is shorter than its shape and stride need.
#[allow(clippy::too_many_arguments)]
pub fn gemm_abt(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    a_rs: usize,
    b: &[f32],
    b_rs: usize,
    c: &mut [f32],
    c_rs: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    check(a.len(), m, k, a_rs, "a");
    check(b.len(), n, k, b_rs, "b");
    check(c.len(), m, n, c_rs, "c");
    // SAFETY: the three checks above bound every element the product reads or writes; `c` is
    // borrowed mutably, so nothing else aliases it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_rs as isize,
            false,
            a.as_ptr(),
            1,
            a_rs as isize,
            b.as_ptr(),
            b_rs as isize,
            1,
            0.0f32,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// `c[i, j] = Σ_t a[i, t] · b[t, j]` (`A · B`), all row-major: `a` is `m × k` (row stride
/// `a_rs`), `b` is `k × n` (row stride `b_rs`), `c` is `m × n` (row stride `c_rs`).
///
/// # Panics
/// If a slice is shorter than its shape and stride need.
#[allow(clippy::too_many_arguments)]
pub fn gemm_ab(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: usize,
    b: &[f32],
    b_rs: usize,
    c: &mut [f32],
    c_rs: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    check(a.len(), m, k, a_rs, "a");
    check(b.len(), k, n, b_rs, "b");
    check(c.len(), m, n, c_rs, "c");
    // SAFETY: as in `gemm_abt`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_rs as isize,
            false,
            a.as_ptr(),
            1,
            a_rs as isize,
            b.as_ptr(),
            1,
            b_rs as isize,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

fn check(len: usize, rows: usize, cols: usize, rs: usize, what: &str) {
    assert!(
        rs >= cols && len >= (rows - 1) * rs + cols,
        "gemm: {what} ({len} floats) cannot hold {rows} x {cols} with row stride {rs}"
    );
}
