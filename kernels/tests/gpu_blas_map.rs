//! The CUDA backend's GEMM mapping (`kernels::gpu::blas_map`) against a host reference of
//! `cublasGemmEx`'s documented column-major contract, for every shape the decoder issues and
//! for edge shapes: the mapped call applied to random host data must write exactly what a
//! direct row-major computation of our [`Gemm`] writes, and must pass cuBLAS's argument rules.

use kernels::gpu::blas_map::{gemm_ex, BlasCompute, BlasOp, BlasType, GemmEx};
use kernels::gpu::{DevicePtr, Gemm, GpuDType};

/// Host "device" memory: byte buffers at made-up, far-apart base addresses, so the reference
/// resolves a pointer the way the device would, offsets into a buffer included.
struct Memory {
    buffers: Vec<(u64, Vec<u8>)>,
}

impl Memory {
    fn resolve(&self, p: DevicePtr) -> (usize, usize) {
        for (i, (base, bytes)) in self.buffers.iter().enumerate() {
            if p.0 >= *base && p.0 <= base + bytes.len() as u64 {
                return (i, (p.0 - base) as usize);
            }
        }
        panic!("pointer {:#x} is in no buffer", p.0);
    }
}

fn size(t: BlasType) -> usize {
    match t {
        BlasType::R32F => 4,
        BlasType::R16BF | BlasType::R16F => 2,
    }
}

/// Element `i` of type `t` at byte `off` of `buf`; out of the buffer panics, as a device read
/// out of bounds would be a failure.
fn load(buf: &[u8], off: usize, t: BlasType, i: usize) -> f32 {
    let at = off + i * size(t);
    let b = &buf[at..at + size(t)];
    match t {
        BlasType::R32F => f32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        BlasType::R16BF => half::bf16::from_ne_bytes([b[0], b[1]]).to_f32(),
        BlasType::R16F => half::f16::from_ne_bytes([b[0], b[1]]).to_f32(),
    }
}

/// cuBLAS's status for arguments it refuses.
#[derive(Debug, PartialEq)]
enum Status {
    InvalidValue(&'static str),
    NotSupported(&'static str),
}

/// `cublasGemmEx` as its documentation states it, column-major: `C = alpha·op(A)·op(B) +
/// beta·C` with `op(A)` `m × k`, `op(B)` `k × n`, `C` `m × n`; element `(i, j)` of a stored
/// matrix with leading dimension `ld` is at `i + j·ld`; `op` is the matrix itself for
/// `CUBLAS_OP_N` and its transpose for `CUBLAS_OP_T`, so the stored `A` is `m × k` (N) or
/// `k × m` (T). With `beta == 0`, `C` is not read. Arguments are checked first, as cuBLAS does.
fn reference_gemm_ex(mem: &mut Memory, x: &GemmEx) -> Result<(), Status> {
    if x.m < 0 || x.n < 0 || x.k < 0 {
        return Err(Status::InvalidValue("negative dimension"));
    }
    let (m, n, k) = (x.m as usize, x.n as usize, x.k as usize);
    let rows_a = if x.transa == BlasOp::N { m } else { k };
    let rows_b = if x.transb == BlasOp::N { k } else { n };
    if (x.lda as i64) < rows_a.max(1) as i64 {
        return Err(Status::InvalidValue("lda < max(1, rows of A)"));
    }
    if (x.ldb as i64) < rows_b.max(1) as i64 {
        return Err(Status::InvalidValue("ldb < max(1, rows of B)"));
    }
    if (x.ldc as i64) < m.max(1) as i64 {
        return Err(Status::InvalidValue("ldc < max(1, m)"));
    }
    // The type combinations CUBLAS_COMPUTE_32F supports with f32 scalars.
    let supported = x.a_type == x.b_type
        && match x.a_type {
            BlasType::R32F => x.c_type == BlasType::R32F,
            BlasType::R16BF | BlasType::R16F => x.c_type == BlasType::R32F || x.c_type == x.a_type,
        };
    if !supported || x.compute != BlasCompute::F32 {
        return Err(Status::NotSupported("type combination"));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (ai, aoff) = mem.resolve(x.a);
    let (bi, boff) = mem.resolve(x.b);
    let (ci, coff) = mem.resolve(x.c);
    let (lda, ldb, ldc) = (x.lda as usize, x.ldb as usize, x.ldc as usize);
    let op_a = |l: usize, i: usize| match x.transa {
        BlasOp::N => i + l * lda,
        BlasOp::T => l + i * lda,
    };
    let op_b = |l: usize, j: usize| match x.transb {
        BlasOp::N => l + j * ldb,
        BlasOp::T => j + l * ldb,
    };
    let mut out = Vec::new();
    for j in 0..n {
        for i in 0..m {
            let mut dot = 0f32;
            for l in 0..k {
                let a = load(&mem.buffers[ai].1, aoff, x.a_type, op_a(l, i));
                let b = load(&mem.buffers[bi].1, boff, x.b_type, op_b(l, j));
                dot += a * b;
            }
            let at = i + j * ldc;
            let v = if x.beta == 0.0 {
                x.alpha * dot
            } else {
                x.alpha * dot + x.beta * load(&mem.buffers[ci].1, coff, x.c_type, at)
            };
            out.push((at, v));
        }
    }
    let c = &mut mem.buffers[ci].1;
    for (at, v) in out {
        let p = coff + at * 4;
        c[p..p + 4].copy_from_slice(&v.to_ne_bytes());
    }
    Ok(())
}

/// Row-major `C = alpha·A·Bᵀ + beta·C` straight from [`Gemm`]'s definition, on f32 copies of
/// the operands, summing over `k` in the same order as the reference.
fn direct(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    for i in 0..g.m {
        for j in 0..g.n {
            let mut dot = 0f32;
            for l in 0..g.k {
                dot += a[i * g.lda + l] * b[j * g.ldb + l];
            }
            let out = &mut c[i * g.ldc + j];
            *out = if g.beta == 0.0 {
                g.alpha * dot
            } else {
                g.alpha * dot + g.beta * *out
            };
        }
    }
}

/// A small xorshift: reproducible random data with no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Values of `dtype` (rounded to it), as f32 and as stored bytes.
fn operand(rng: &mut Rng, len: usize, dtype: GpuDType) -> (Vec<f32>, Vec<u8>) {
    let mut vals = Vec::with_capacity(len);
    let mut bytes = Vec::with_capacity(len * dtype.size());
    for _ in 0..len {
        let v = rng.next();
        match dtype {
            GpuDType::F32 => {
                vals.push(v);
                bytes.extend_from_slice(&v.to_ne_bytes());
            }
            GpuDType::BF16 => {
                let h = half::bf16::from_f32(v);
                vals.push(h.to_f32());
                bytes.extend_from_slice(&h.to_ne_bytes());
            }
            GpuDType::F16 => {
                let h = half::f16::from_f32(v);
                vals.push(h.to_f32());
                bytes.extend_from_slice(&h.to_ne_bytes());
            }
        }
    }
    (vals, bytes)
}

/// One case: shape, strides, where each operand starts in its buffer (elements), and scalars.
#[derive(Debug, Clone, Copy)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
    /// Element offsets of A, B and C in their buffers (sub-matrix views).
    offsets: [usize; 3],
    alpha: f32,
    beta: f32,
}

impl Case {
    fn dense(m: usize, n: usize, k: usize) -> Self {
        Case {
            m,
            n,
            k,
            lda: k,
            ldb: k,
            ldc: n,
            offsets: [0; 3],
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

const BASES: [u64; 3] = [0x1000_0000, 0x2000_0000, 0x3000_0000];

/// Runs `case` through the mapping and the reference and compares every byte of C's buffer
/// (the padding between rows and around the view included) with the direct computation.
fn check(case: Case, dtype: GpuDType, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed | 1);
    let [oa, ob, oc] = case.offsets;
    // Each buffer holds the view plus its offset and a tail, so a read or write that strays
    // past the view lands on data the direct computation does not touch.
    let len = |rows: usize, ld: usize, off: usize| off + rows.max(1) * ld.max(1) + 7;
    let (a_vals, a_bytes) = operand(&mut rng, len(case.m, case.lda, oa), dtype);
    let (b_vals, b_bytes) = operand(&mut rng, len(case.n, case.ldb, ob), dtype);
    let (c_vals, c_bytes) = if case.beta == 0.0 {
        // C is not to be read: NaN shows if it is.
        let n = len(case.m, case.ldc, oc);
        (
            vec![f32::NAN; n],
            (0..n).flat_map(|_| f32::NAN.to_ne_bytes()).collect(),
        )
    } else {
        operand(&mut rng, len(case.m, case.ldc, oc), GpuDType::F32)
    };
    let es = dtype.size();
    let g = Gemm {
        m: case.m,
        n: case.n,
        k: case.k,
        dtype,
        a: DevicePtr(BASES[0] + (oa * es) as u64),
        lda: case.lda,
        b: DevicePtr(BASES[1] + (ob * es) as u64),
        ldb: case.ldb,
        c: DevicePtr(BASES[2] + (oc * 4) as u64),
        ldc: case.ldc,
        alpha: case.alpha,
        beta: case.beta,
    };
    let mut want = c_vals.clone();
    direct(&g, &a_vals[oa..], &b_vals[ob..], &mut want[oc..]);

    let mut mem = Memory {
        buffers: vec![
            (BASES[0], a_bytes),
            (BASES[1], b_bytes),
            (BASES[2], c_bytes),
        ],
    };
    match gemm_ex(&g).map_err(|e| format!("mapping refused {case:?}: {e}"))? {
        Some(x) => reference_gemm_ex(&mut mem, &x)
            .map_err(|s| format!("cuBLAS would refuse {x:?} for {case:?}: {s:?}"))?,
        None => {
            if case.m != 0 && case.n != 0 {
                return Err(format!("no call for a non-empty C: {case:?}"));
            }
        }
    }
    let got: Vec<f32> = mem.buffers[2]
        .1
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()) {
            return Err(format!(
                "{dtype} {case:?}: C element {i} is {g}, the row-major product gives {w}"
            ));
        }
    }
    Ok(())
}

const DTYPES: [GpuDType; 3] = [GpuDType::F32, GpuDType::BF16, GpuDType::F16];

/// The decoder's projections (engine/src/models/llama/gpu.rs: `m` rows of activations times
/// an `n × k` weight, dense, beta 0) for a SmolLM2-shaped and a GQA Llama-shaped model
/// scaled down, at one row (a decode step) and at many (prefill and batched decode).
#[test]
fn decoder_projections_match_the_row_major_product() {
    // (hidden, heads, kv heads, head dim, ffn, vocab): SmolLM2-135M's attention and MLP
    // widths, and a small GQA model with a q dim unlike its hidden size.
    let models = [(576, 9, 3, 64, 1536, 256), (96, 4, 2, 32, 160, 301)];
    let mut seed = 1;
    for (h, heads, kv, hd, ffn, vocab) in models {
        let qkv = (heads + 2 * kv) * hd;
        let q_dim = heads * hd;
        for rows in [1, 3, 17] {
            for (n, k) in [(qkv, h), (h, q_dim), (2 * ffn, h), (h, ffn), (vocab, h)] {
                for dtype in DTYPES {
                    seed += 1;
                    check(Case::dense(rows, n, k), dtype, seed).unwrap();
                }
            }
        }
    }
}

/// Edge shapes and views the decoder does not issue today but `Gemm` allows: single rows,
/// columns and depth, empty depth, strided sub-matrices of larger buffers, beta 1 and other
/// scalars.
#[test]
fn edge_shapes_and_strided_views_match_the_row_major_product() {
    let strided = |m, n, k| Case {
        lda: k + 5,
        ldb: k + 3,
        ldc: n + 2,
        offsets: [3, 11, 4],
        ..Case::dense(m, n, k)
    };
    let cases = [
        Case::dense(1, 1, 1),
        Case::dense(1, 7, 5),
        Case::dense(7, 1, 5),
        Case::dense(6, 5, 1),
        Case::dense(4, 9, 0),
        Case {
            lda: 0,
            ldb: 0,
            ..Case::dense(3, 2, 0)
        },
        strided(1, 1, 1),
        strided(1, 13, 8),
        strided(13, 1, 8),
        strided(9, 6, 1),
        strided(5, 12, 33),
        Case {
            beta: 1.0,
            ..Case::dense(5, 12, 33)
        },
        Case {
            beta: 1.0,
            ..strided(8, 3, 16)
        },
        Case {
            alpha: 0.5,
            beta: -2.0,
            ..strided(3, 8, 16)
        },
        Case::dense(0, 4, 4),
        Case::dense(4, 0, 4),
    ];
    let mut seed = 100;
    for case in cases {
        for dtype in DTYPES {
            seed += 1;
            check(case, dtype, seed).unwrap();
        }
    }
}

#[test]
fn strides_too_small_for_the_shape_are_refused() {
    for case in [
        Case {
            lda: 3,
            ..Case::dense(2, 2, 4)
        },
        Case {
            ldb: 3,
            ..Case::dense(2, 2, 4)
        },
        Case {
            ldc: 1,
            ..Case::dense(2, 2, 4)
        },
    ] {
        let g = Gemm {
            m: case.m,
            n: case.n,
            k: case.k,
            dtype: GpuDType::F32,
            a: DevicePtr(BASES[0]),
            lda: case.lda,
            b: DevicePtr(BASES[1]),
            ldb: case.ldb,
            c: DevicePtr(BASES[2]),
            ldc: case.ldc,
            alpha: 1.0,
            beta: 0.0,
        };
        assert!(gemm_ex(&g).is_err(), "{case:?} was mapped");
    }
}
