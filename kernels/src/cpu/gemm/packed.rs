//! B of the packed GEMM: a k × n matrix in column panels of [`NR`] floats, and views of
//! whole panels of it for a product over some of its columns.

#[cfg(target_arch = "x86_64")]
use super::avx512;
#[cfg(target_arch = "x86_64")]
use super::Kernel;
use super::NR;
use crate::cpu::features::{cpu_isa, Isa};
use crate::KernelError;

/// Floats per 64-byte cache line.
const LINE: usize = 16;

/// `B` (k × n) packed into `ceil(n / NR)` panels; panel `p` holds rows `0..k` of columns
/// `p*NR .. p*NR+NR` (zero-padded), one NR-wide row after the other.
#[derive(Debug, Clone, Default)]
pub struct PackedB {
    pub(super) k: usize,
    pub(super) n: usize,
    /// Backing store, over-allocated so that the panels can start on a cache line.
    buf: Vec<f32>,
    start: usize,
}

impl PackedB {
    fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    pub(super) fn data(&self) -> &[f32] {
        &self.buf[self.start..]
    }

    /// The whole matrix, as the GEMM reads it.
    pub fn all(&self) -> PackedCols<'_> {
        PackedCols {
            k: self.k,
            n: self.n,
            data: self.packed(),
        }
    }

    /// Columns `first .. first + n` (`first` a multiple of [`NR`]), as the GEMM reads them:
    /// a product over part of a fused weight (e.g. only the keys and values of a fused
    /// query-key-value projection).
    ///
    /// # Errors
    /// [`KernelError::Shape`] if `first` is not on a panel boundary or the range passes `n`.
    pub fn cols(&self, first: usize, n: usize) -> Result<PackedCols<'_>, KernelError> {
        if !first.is_multiple_of(NR) || first + n > self.n {
            return Err(KernelError::Shape(format!(
                "packed columns {first}..{} of {} (panels of {NR})",
                first + n,
                self.n
            )));
        }
        let start = first / NR * NR * self.k;
        let len = n.div_ceil(NR) * NR * self.k;
        Ok(PackedCols {
            k: self.k,
            n,
            data: &self.packed()[start..start + len],
        })
    }

    /// The packed panels, one after the other (see the layouts of the packers).
    pub(crate) fn packed(&self) -> &[f32] {
        let len = self.panels() * NR * self.k;
        &self.data()[..len]
    }

    /// Sizes the store for a k × n matrix and returns the panel area. Only the padding
    /// columns of the last panel are zeroed: the packers write every other element.
    fn reshape(&mut self, k: usize, n: usize) -> &mut [f32] {
        self.k = k;
        self.n = n;
        let len = n.div_ceil(NR) * NR * k;
        if self.buf.len() < len + LINE {
            self.buf.resize(len + LINE, 0.0);
        }
        let misalign = (self.buf.as_ptr() as usize / std::mem::size_of::<f32>()) % LINE;
        self.start = (LINE - misalign) % LINE;
        let area = &mut self.buf[self.start..self.start + len];
        if !n.is_multiple_of(NR) {
            let last = (n / NR) * NR * k;
            area[last..].fill(0.0);
        }
        area
    }

    /// Packs a PyTorch `Linear` weight (`n` rows of `k` inputs, row-major), so that
    /// `x · B = x · Wᵀ`.
    pub fn from_linear(w: &[f32], n: usize, k: usize) -> Self {
        let mut b = PackedB::default();
        b.pack_transposed(w, k, k, n);
        b
    }

    /// Packs `B[kk][nn] = src[nn * ld + kk]` (B given column by column, e.g. keys for Q·Kᵀ).
    pub fn pack_transposed(&mut self, src: &[f32], ld: usize, k: usize, n: usize) {
        self.pack_transposed_at(cpu_isa(), src, ld, k, n);
    }

    /// [`PackedB::pack_transposed`] with `isa`'s instructions.
    pub(crate) fn pack_transposed_at(
        &mut self,
        isa: Isa,
        src: &[f32],
        ld: usize,
        k: usize,
        n: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        let gather = Kernel::for_isa(isa).gathers() && ld <= i32::MAX as usize / NR;
        #[cfg(not(target_arch = "x86_64"))]
        let _ = isa;
        let dst = self.reshape(k, n);
        for (p, panel) in dst
            .chunks_exact_mut(NR * k.max(1))
            .enumerate()
            .take(n.div_ceil(NR))
        {
            #[cfg(target_arch = "x86_64")]
            {
                let base = p * NR * ld;
                if gather && n - p * NR >= NR && k > 0 && base + (NR - 1) * ld + k <= src.len() {
                    // SAFETY: the CPU runs AVX-512F (`gathers`); the panel's 16 columns of `k`
                    // floats, `ld` apart, lie inside `src` (checked just above) and the panel
                    // holds `k * NR` floats; the offsets `j * ld` fit in an i32.
                    unsafe { avx512::gather_panel(&src[base..], ld, k, panel) };
                    continue;
                }
            }
            for j in 0..NR.min(n - p * NR) {
                let col = &src[(p * NR + j) * ld..(p * NR + j) * ld + k];
                for (kk, &v) in col.iter().enumerate() {
                    panel[kk * NR + j] = v;
                }
            }
        }
    }

    /// Packs `B[kk][nn] = src[kk * ld + nn]` (B given row by row, e.g. values for P·V).
    pub fn pack_rows(&mut self, src: &[f32], ld: usize, k: usize, n: usize) {
        let dst = self.reshape(k, n);
        for (p, panel) in dst
            .chunks_exact_mut(NR * k.max(1))
            .enumerate()
            .take(n.div_ceil(NR))
        {
            let width = NR.min(n - p * NR);
            for kk in 0..k {
                let row = &src[kk * ld + p * NR..kk * ld + p * NR + width];
                panel[kk * NR..kk * NR + width].copy_from_slice(row);
            }
        }
    }
}

/// Whole panels of a [`PackedB`]: `k` rows, `n` columns, panel after panel.
#[derive(Debug, Clone, Copy)]
pub struct PackedCols<'a> {
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) data: &'a [f32],
}

impl PackedCols<'_> {
    pub(super) fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }
}
