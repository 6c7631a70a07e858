//! cuBLAS for the CUDA backend: one handle on the backend's stream, set up so that a GEMM's
//! algorithm depends on its shape only, and the `cublasGemmEx` call.
//!
//! cuBLAS gives bit-identical results for the same call with one stream active, on one
//! architecture, SM count and library version. Besides the call's shape, types, strides and
//! pointer alignment, its choice of algorithm reads the workspace it may use and the handle's
//! math mode; both are fixed here, once: a workspace of our own (`cublasSetWorkspace`, set
//! after `cublasSetStream`, which resets it to a pool whose size cuBLAS decides) and the
//! default math mode with reductions kept in the compute type. The decoder issues every GEMM
//! at one shape per weight (`ops::gemm`), so no call's algorithm can depend on the batch.

use std::ffi::c_void;

use cudarc::cublas::result as blas;
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::{result, sys};

use super::blas_map::{self, BlasCompute, BlasOp, BlasType};
use super::{Gemm, GpuError, Result};

/// The workspace cuBLAS documents for Hopper (it asks 4 MiB on earlier architectures); the
/// decoder's headroom counts it.
const WORKSPACE_BYTES: usize = 32 << 20;

fn blas_err(call: &'static str) -> impl Fn(blas::CublasError) -> GpuError {
    move |e| GpuError::Blas {
        call,
        message: format!("{e:?}"),
    }
}

/// A cuBLAS handle and the workspace it owns. The device's context must be current for
/// every call, [`Blas::destroy`] included.
pub(crate) struct Blas {
    handle: blas_sys::cublasHandle_t,
    workspace: sys::CUdeviceptr,
}

impl Blas {
    /// A handle on `stream` with its fixed workspace and math mode.
    pub(crate) fn create(stream: sys::CUstream) -> Result<Blas> {
        let handle = blas::create_handle().map_err(blas_err("cublasCreate"))?;
        // SAFETY: a plain device allocation, freed in `destroy`.
        let workspace = match unsafe { result::malloc_sync(WORKSPACE_BYTES) } {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the handle was just created and is not used again.
                let _ = unsafe { blas::destroy_handle(handle) };
                return Err(GpuError::Driver {
                    call: "cuMemAlloc",
                    message: format!("the cuBLAS workspace: {e:?}"),
                });
            }
        };
        let blas = Blas { handle, workspace };
        if let Err(e) = blas.configure(stream) {
            // SAFETY: nothing else holds the handle or the workspace.
            unsafe { blas.destroy() };
            return Err(e);
        }
        Ok(blas)
    }

    fn configure(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: the handle, stream and workspace are valid; the workspace outlives the
        // handle (`destroy` frees it after the handle).
        unsafe {
            blas::set_stream(self.handle, stream as blas_sys::cudaStream_t)
                .map_err(blas_err("cublasSetStream"))?;
            blas_sys::cublasSetWorkspace_v2(
                self.handle,
                self.workspace as *mut c_void,
                WORKSPACE_BYTES,
            )
            .result()
            .map_err(blas_err("cublasSetWorkspace"))?;
            // The default math (tensor cores where the types allow; f32 operands stay f32 by
            // the compute type) plus the flag that keeps split reductions in f32.
            blas_sys::cublasSetMathMode(
                self.handle,
                blas_sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
            )
            .result()
            .map_err(blas_err("cublasSetMathMode"))
        }
    }

    /// Release the handle, then its workspace.
    ///
    /// # Safety
    /// Nothing uses this value afterwards, and the stream's work with it has finished.
    pub(crate) unsafe fn destroy(&self) {
        // SAFETY: per the contract.
        unsafe {
            let _ = blas::destroy_handle(self.handle);
            let _ = result::free_sync(self.workspace);
        }
    }

    /// `g` as one `cublasGemmEx` call on the handle's stream.
    pub(crate) fn gemm(&self, g: &Gemm) -> Result<()> {
        let Some(x) = blas_map::gemm_ex(g)? else {
            return Ok(());
        };
        let op = |o: BlasOp| match o {
            BlasOp::N => blas_sys::cublasOperation_t::CUBLAS_OP_N,
            BlasOp::T => blas_sys::cublasOperation_t::CUBLAS_OP_T,
        };
        let ty = |t: BlasType| match t {
            BlasType::R32F => blas_sys::cudaDataType::CUDA_R_32F,
            BlasType::R16BF => blas_sys::cudaDataType::CUDA_R_16BF,
            BlasType::R16F => blas_sys::cudaDataType::CUDA_R_16F,
        };
        let compute = match x.compute {
            BlasCompute::F32 => blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        };
        // SAFETY: the caller guarantees the pointers and strides; alpha and beta are host
        // scalars (the handle's default pointer mode) that outlive the call.
        unsafe {
            blas::gemm_ex(
                self.handle,
                op(x.transa),
                op(x.transb),
                x.m,
                x.n,
                x.k,
                (&x.alpha as *const f32).cast(),
                x.a.0 as *const c_void,
                ty(x.a_type),
                x.lda,
                x.b.0 as *const c_void,
                ty(x.b_type),
                x.ldb,
                (&x.beta as *const f32).cast(),
                x.c.0 as *mut c_void,
                ty(x.c_type),
                x.ldc,
                compute,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| GpuError::Blas {
            call: "cublasGemmEx",
            message: format!("{e:?} for {g:?}"),
        })
    }
}
