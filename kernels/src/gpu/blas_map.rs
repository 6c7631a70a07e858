//! Our row-major [`Gemm`] as the arguments of one column-major `cublasGemmEx` call.
//!
//! It is a pure function, built with or without the `cuda` feature, so the tests can apply a
//! host reference of cuBLAS's documented contract to the exact arguments the CUDA backend
//! passes, on machines without a GPU: a swapped transpose or dimension fails there rather than
//! on the first real device.
//!
//! A row-major `r × c` matrix with row stride `ld` is, read column-major with the same `ld`,
//! its `c × r` transpose. So row-major `C = A·Bᵀ` (`C` is `m × n`) is column-major
//! `Cᵀ = B·Aᵀ`: cuBLAS's `A` is our `B` (`n × k` row-major, a `k × n` column-major matrix,
//! read transposed), its `B` is our `A` (`m × k` row-major, `k × m` column-major, read as
//! is), and its `m`, `n` are our `n`, `m`.

use super::{DevicePtr, Gemm, GpuDType, GpuError, Result};

/// `cublasOperation_t`: how cuBLAS reads a stored operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlasOp {
    /// `CUBLAS_OP_N`: as stored.
    N,
    /// `CUBLAS_OP_T`: transposed.
    T,
}

/// `cudaDataType` of a cuBLAS operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlasType {
    /// `CUDA_R_32F`
    R32F,
    /// `CUDA_R_16BF`
    R16BF,
    /// `CUDA_R_16F`
    R16F,
}

impl BlasType {
    fn of(dtype: GpuDType) -> Self {
        match dtype {
            GpuDType::F32 => BlasType::R32F,
            GpuDType::BF16 => BlasType::R16BF,
            GpuDType::F16 => BlasType::R16F,
        }
    }
}

/// `cublasComputeType_t`. Only plain f32 accumulation: `CUBLAS_COMPUTE_32F` keeps f32
/// operands in full f32 (no TF32), as [`Gemm`] promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlasCompute {
    /// `CUBLAS_COMPUTE_32F`
    F32,
}

/// The arguments of one `cublasGemmEx` call, in its order, with `alpha` and `beta` as host
/// f32 scalars (the handle's default pointer mode; the scale type of `CUBLAS_COMPUTE_32F`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmEx {
    pub transa: BlasOp,
    pub transb: BlasOp,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub alpha: f32,
    pub a: DevicePtr,
    pub a_type: BlasType,
    pub lda: i32,
    pub b: DevicePtr,
    pub b_type: BlasType,
    pub ldb: i32,
    pub beta: f32,
    pub c: DevicePtr,
    pub c_type: BlasType,
    pub ldc: i32,
    pub compute: BlasCompute,
}

/// The `cublasGemmEx` call computing `g`, or `None` when `C` is empty (nothing to do).
/// Refuses strides too small for the shapes and dimensions over `i32`.
pub fn gemm_ex(g: &Gemm) -> Result<Option<GemmEx>> {
    if g.lda < g.k || g.ldb < g.k || g.ldc < g.n {
        return Err(GpuError::Invalid(format!("gemm strides too small: {g:?}")));
    }
    if g.m == 0 || g.n == 0 {
        return Ok(None);
    }
    let int = |v: usize| {
        i32::try_from(v).map_err(|_| GpuError::Invalid(format!("gemm dimension {v} too big")))
    };
    let ty = BlasType::of(g.dtype);
    // cuBLAS wants every leading dimension at least 1 even when nothing is read (k = 0); the
    // stride of a matrix with no columns is never used, so raising it changes no result.
    Ok(Some(GemmEx {
        transa: BlasOp::T,
        transb: BlasOp::N,
        m: int(g.n)?,
        n: int(g.m)?,
        k: int(g.k)?,
        alpha: g.alpha,
        a: g.b,
        a_type: ty,
        lda: int(g.ldb.max(1))?,
        b: g.a,
        b_type: ty,
        ldb: int(g.lda.max(1))?,
        beta: g.beta,
        c: g.c,
        c_type: BlasType::R32F,
        ldc: int(g.ldc)?,
        compute: BlasCompute::F32,
    }))
}
