//! Row-chunked GEMMs: a step's projection `C = A · Wᵀ` over any number of rows, issued as
//! GEMMs of exactly [`GEMM_ROWS`] rows each, so that cuBLAS sees one shape per weight whatever
//! the step's batch.
//!
//! cuBLAS picks its kernel (tile sizes, split-K, stream-K) by the problem's shape among other
//! things, and different kernels sum a dot product in different orders: with the step's row
//! count as `M`, a request's logits would change with what else ran in its step. With every
//! call at `M = GEMM_ROWS` (and the same `N`, `K`, strides and 16-byte alignment per weight)
//! the choice is made once per weight, so no split of `K` can depend on the batch. What the
//! API does not promise is that every row of one call is summed alike (a stream-K kernel may
//! split its tiles unevenly); with 64-row chunks a chunk's rows are few enough to share one
//! tile in the kernels' usual tile sizes, and the hardware run of `scripts/gpu-check.sh`
//! (section invariance) checks the outcome bit for bit.
//!
//! The last chunk reads and writes rows past `m` (up to [`padded_rows`]): the caller's buffers
//! hold them, and keeps the padding rows of `A` finite (zero), so that nothing but zeros and
//! finite products lands in rows no one reads.

use crate::gpu::{Gemm, Gpu, GpuError, Result};

/// Rows of every GEMM a step issues (see the module's doc for the choice). Smaller chunks
/// re-read each weight more often in a long prefill; larger ones turn small decode steps from
/// memory-bound into compute-bound GEMMs.
pub const GEMM_ROWS: usize = 64;

/// Rows a GEMM's `A` and `C` buffers need for `rows` rows: the next multiple of [`GEMM_ROWS`].
pub fn padded_rows(rows: usize) -> usize {
    rows.next_multiple_of(GEMM_ROWS)
}

/// The fixed-size GEMMs that compute `g` (`g.m` rows, any number): each has `m = GEMM_ROWS`,
/// and `g`'s other fields with `a` and `c` moved to its first row. None for `g.m == 0`.
pub fn row_chunks(g: &Gemm) -> Result<Vec<Gemm>> {
    let es = g.dtype.size();
    if g.lda < g.k || g.ldc < g.n {
        return Err(GpuError::Invalid(format!("gemm strides too small: {g:?}")));
    }
    Ok((0..g.m.div_ceil(GEMM_ROWS))
        .map(|i| {
            let row = i * GEMM_ROWS;
            Gemm {
                m: GEMM_ROWS,
                a: g.a.offset(row * g.lda * es),
                c: g.c.offset(row * g.ldc * 4),
                ..*g
            }
        })
        .collect())
}

/// Issue `g` as [`row_chunks`]: `g.a` and `g.c` must hold [`padded_rows`]`(g.m)` rows.
pub fn gemm_in_row_chunks(gpu: &Gpu, g: &Gemm) -> Result<()> {
    for chunk in row_chunks(g)? {
        gpu.gemm(&chunk)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::gpu::{DevicePtr, GpuDType};

    fn gemm(m: usize) -> Gemm {
        Gemm {
            m,
            n: 96,
            k: 40,
            dtype: GpuDType::BF16,
            a: DevicePtr(1 << 20),
            lda: 48,
            b: DevicePtr(1 << 24),
            ldb: 40,
            c: DevicePtr(1 << 28),
            ldc: 100,
            alpha: 1.0,
            beta: 0.0,
        }
    }

    #[test]
    fn every_chunk_has_the_same_shape_whatever_the_rows() {
        let shapes = |g: &Gemm| (g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.b, g.dtype);
        let want = shapes(&Gemm {
            m: GEMM_ROWS,
            ..gemm(1)
        });
        for m in [
            1,
            2,
            GEMM_ROWS - 1,
            GEMM_ROWS,
            GEMM_ROWS + 1,
            3 * GEMM_ROWS + 5,
        ] {
            let g = gemm(m);
            let chunks = row_chunks(&g).unwrap();
            assert_eq!(chunks.len(), m.div_ceil(GEMM_ROWS), "{m} rows");
            assert_eq!(chunks.len() * GEMM_ROWS, padded_rows(m));
            for (i, c) in chunks.iter().enumerate() {
                assert_eq!(shapes(c), want, "{m} rows, chunk {i}");
                // Row i·GEMM_ROWS of A (bf16, stride 48) and of C (f32, stride 100).
                assert_eq!(c.a.0 - g.a.0, (i * GEMM_ROWS * 48 * 2) as u64);
                assert_eq!(c.c.0 - g.c.0, (i * GEMM_ROWS * 100 * 4) as u64);
            }
        }
        assert!(row_chunks(&gemm(0)).unwrap().is_empty());
        assert!(row_chunks(&Gemm { lda: 39, ..gemm(3) }).is_err());
    }

    #[test]
    fn chunk_offsets_keep_the_16_byte_alignment_cublas_checks() {
        // Any row stride: a chunk starts GEMM_ROWS rows on, a multiple of 16 bytes for every
        // element size, so cuBLAS's alignment-dependent choice is the same for every chunk.
        for lda in [1usize, 3, 7, 576] {
            for dtype in [GpuDType::F32, GpuDType::BF16, GpuDType::F16] {
                let g = Gemm {
                    dtype,
                    lda,
                    k: 1,
                    ldc: lda,
                    n: 1,
                    ..gemm(200)
                };
                for c in row_chunks(&g).unwrap() {
                    assert_eq!((c.a.0 - g.a.0) % 16, 0);
                    assert_eq!((c.c.0 - g.c.0) % 16, 0);
                }
            }
        }
    }
}
