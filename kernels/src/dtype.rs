//! Weight storage types and matrix views.

use thiserror::Error;

/// Errors from building kernel inputs (shape and size mismatches).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KernelError {
    #[error("{dtype} row length {cols} is not a multiple of its block size {block}")]
    RowNotBlockAligned {
        dtype: DType,
        cols: usize,
        block: usize,
    },
    #[error("{dtype} matrix {rows}x{cols} needs {expected} bytes, got {got}")]
    SizeMismatch {
        dtype: DType,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("shape mismatch: {0}")]
    Shape(String),
}

/// Element storage of a weight matrix. Block layouts follow ggml's `ggml-common.h` (all
/// scales little-endian f16 unless said otherwise):
/// - `Q8_0`: 32 weights = `d` + 32 × i8; `w = d·q`.
/// - `Q4_0`: 32 weights = `d` + 16 bytes; weight `j < 16` is the low nibble of byte `j`,
///   weight `16 + j` its high nibble; `w = d·(q − 8)`.
/// - `Q4_1`: 32 weights = `d`, `m` + 16 bytes (nibbles as Q4_0); `w = d·q + m`.
/// - `Q5_0`: 32 weights = `d`, `qh` (u32) + 16 bytes of nibbles as Q4_0; bit `j` of `qh` is
///   the fifth bit of weight `j`; `w = d·(q − 16)`.
/// - `Q5_1`: 32 weights = `d`, `m`, `qh` + 16 bytes (as Q5_0); `w = d·q + m`.
/// - `IQ4_NL`: 32 weights = `d` + 16 bytes (nibbles as Q4_0) indexing a fixed table of 16
///   signed levels; `w = d·table[q]`.
/// - The K-quants hold 256 weights in sub-blocks of 16 or 32 with their own small scales:
///   `Q2_K` (2-bit, 4-bit scale and min per 16), `Q3_K` (3-bit, 6-bit signed scale per 16),
///   `Q4_K` / `Q5_K` (4/5-bit, 6-bit scale and min per 32), `Q6_K` (6-bit, i8 scale per 16);
///   `IQ4_XS` is IQ4_NL's table with a 6-bit scale per 32. The bit packing of each is in
///   `cpu/kquant.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    IQ4_NL,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_XS,
}

impl DType {
    /// Every type, float types first.
    pub const ALL: [DType; 15] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::IQ4_NL,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_XS,
    ];

    /// Weights per block.
    pub const fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4_NL => {
                32
            }
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS => {
                256
            }
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::IQ4_NL => 18,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::IQ4_XS => 136,
        }
    }

    /// Bytes of one row of `cols` weights (`cols` must be block-aligned).
    pub const fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_elems() * self.block_bytes()
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::IQ4_NL => "IQ4_NL",
            DType::Q2_K => "Q2_K",
            DType::Q3_K => "Q3_K",
            DType::Q4_K => "Q4_K",
            DType::Q5_K => "Q5_K",
            DType::Q6_K => "Q6_K",
            DType::IQ4_XS => "IQ4_XS",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A weight matrix (`rows` output features × `cols` input features) in its storage type,
/// borrowed from wherever the bytes live (usually a memory map): row-major as files store it,
/// or in the interleaved layout of [`QMatrix::interleaved`].
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    dtype: DType,
    rows: usize,
    cols: usize,
    data: &'a [u8],
    interleaved: bool,
}

impl<'a> QMatrix<'a> {
    /// Check the shape against the byte length.
    pub fn new(
        dtype: DType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        let block = dtype.block_elems();
        if !cols.is_multiple_of(block) {
            return Err(KernelError::RowNotBlockAligned { dtype, cols, block });
        }
        let expected = rows * dtype.row_bytes(cols);
        if data.len() != expected {
            return Err(KernelError::SizeMismatch {
                dtype,
                rows,
                cols,
                expected,
                got: data.len(),
            });
        }
        Ok(QMatrix {
            dtype,
            rows,
            cols,
            data,
            interleaved: false,
        })
    }

    /// A matrix whose bytes [`interleave_rows`] reordered (groups of eight rows side by side),
    /// the layout the AVX-512 VNNI kernels of the quantised types but Q2_K and Q3_K read best;
    /// every other kernel reads it too (a group at a time brought back to rows), with the same
    /// results.
    pub fn interleaved(
        dtype: DType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        check_interleavable(dtype, rows, cols)?;
        Ok(QMatrix {
            interleaved: true,
            ..Self::new(dtype, rows, cols, data)?
        })
    }

    /// Whether the bytes are in the interleaved layout.
    pub fn is_interleaved(&self) -> bool {
        self.interleaved
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The bytes of row `r`.
    ///
    /// # Panics
    /// If the matrix is interleaved (its rows are not contiguous: a bug in the caller).
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert!(!self.interleaved, "QMatrix::row on an interleaved matrix");
        let rb = self.dtype.row_bytes(self.cols);
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Dequantise row `r` into `out` (length `cols`).
    pub fn dequantize_row_into(&self, r: usize, out: &mut [f32]) {
        if self.interleaved {
            crate::cpu::dequantize_interleaved_row(self.dtype, self.data, self.cols, r, out);
        } else {
            crate::dequantize_row(self.dtype, self.row(r), out);
        }
    }
}

/// Whether a `rows x cols` matrix of `dtype` can take the interleaved layout.
fn check_interleavable(dtype: DType, rows: usize, cols: usize) -> Result<(), KernelError> {
    if !crate::cpu::has_interleaved_layout(dtype)
        || !rows.is_multiple_of(8)
        || !cols.is_multiple_of(dtype.block_elems())
    {
        return Err(KernelError::Shape(format!(
            "a {rows} x {cols} {dtype} matrix has no interleaved layout (the quantised types \
             but Q2_K and Q3_K, in whole blocks, with rows in multiples of eight)"
        )));
    }
    Ok(())
}

/// Reorder the bytes of a row-major `rows x cols` matrix of `dtype` (`src`) into the
/// interleaved layout of [`QMatrix::interleaved`] (`dst`, the same length).
pub fn interleave_rows(
    dtype: DType,
    rows: usize,
    cols: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    check_interleavable(dtype, rows, cols)?;
    let expected = rows * dtype.row_bytes(cols);
    if src.len() != expected || dst.len() != expected {
        return Err(KernelError::SizeMismatch {
            dtype,
            rows,
            cols,
            expected,
            got: if src.len() != expected {
                src.len()
            } else {
                dst.len()
            },
        });
    }
    crate::cpu::interleave(dtype, rows, cols, src, dst);
    Ok(())
}

/// Whether a loader should call [`interleave_rows`] for `dtype`: where this CPU's kernels read
/// it faster (AVX-512 VNNI: the quantised types but Q2_K and Q3_K), unless
/// [`crate::INTERLEAVE_VAR`] says otherwise.
pub fn interleaving_pays(dtype: DType) -> bool {
    crate::cpu::interleaving_pays(dtype)
}
