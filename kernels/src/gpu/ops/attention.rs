//! `attention_decode.cu` and `attention_prefill.cu`: paged attention over one layer's KV cache.
//!
//! Both read queries as f32 rows (head `h` of row `t` at `q[t·q_stride + h·head_dim]`), the
//! cache as `[num_blocks][block_size][n_kv_heads][head_dim]` of the model's type through i32
//! block tables (`n_seqs × max_blocks`, row-major), and write the output rows in the model's
//! type. Query head `h` reads KV head `h / (n_heads / n_kv_heads)`. The step's own keys and
//! values must already be in the cache. A layer with a sliding window reads only the
//! positions its queries see; soft-capped scores are capped before the softmax.
//!
//! The prefill kernel gives a query row the same bits whatever tile it is in, a one-row tile
//! included (see `attention_prefill.cu`), so the GPU decoder runs every row through it,
//! decode rows as one-row tiles: a sequence's output then does not depend on the step. The
//! decode kernel sums in another order (a faster one for single rows); the decoder does not
//! use it.

use super::{grid_x, grid_yz, int};
use crate::gpu::{Arg, DevicePtr, Gpu, GpuDType, GpuError, Launch, Result};

/// Query rows per prefill tile (`TILE` in `attention_prefill.cu`).
pub const PREFILL_TILE: usize = 16;

/// Dynamic shared memory of the prefill kernel for `head_dim`: the kernel lays it out with the
/// same formula (`shared_floats` at `lanes_per_key` in `attention_prefill.cu`; the two must
/// change together): the tile's queries, the probabilities, and one pass of values and of keys
/// (rows padded by one float), with 32, 16 or 8 keys per pass, the most that fit 48 KiB.
pub fn prefill_shared_bytes(head_dim: usize) -> usize {
    const TILE: usize = PREFILL_TILE;
    let floats = |lpk: usize| {
        let kpp = 32 / lpk;
        TILE * head_dim + 4 * kpp * (TILE / 4) + kpp * head_dim + 32 * (head_dim / lpk + 1)
    };
    let mut lpk = 1;
    while lpk < 4 && 4 * floats(lpk) > 48 * 1024 {
        lpk *= 2;
    }
    4 * floats(lpk)
}

/// The shapes both kernels share, checked once.
fn check_shape(
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
) -> Result<()> {
    if n_heads == 0 || n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return Err(GpuError::Invalid(format!(
            "{n_heads} query heads are not a multiple of {n_kv_heads} KV heads"
        )));
    }
    if head_dim == 0 || head_dim > 256 || !head_dim.is_multiple_of(8) {
        return Err(GpuError::Invalid(format!(
            "head_dim {head_dim}: the attention kernels take a multiple of 8 up to 256"
        )));
    }
    if block_size == 0 {
        return Err(GpuError::Invalid("block_size is zero".into()));
    }
    Ok(())
}

/// What decode and prefill share: one layer's queries, cache and output, and their shapes.
#[derive(Debug, Clone, Copy)]
pub struct PagedAttention {
    pub dtype: GpuDType,
    /// Output rows of `out_stride` elements of `dtype`.
    pub out: DevicePtr,
    /// f32 query rows of `q_stride` floats (the fused QKV rows: Q comes first).
    pub q: DevicePtr,
    /// One layer's keys and values, each 16-byte aligned (rows are read 16 bytes at a time).
    pub k_cache: DevicePtr,
    pub v_cache: DevicePtr,
    /// i32 `n_seqs × max_blocks`.
    pub block_tables: DevicePtr,
    pub q_stride: usize,
    pub out_stride: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub max_blocks: usize,
    pub scale: f32,
    /// A sliding window: a query at position `p` sees positions `p - w + 1 ..= p` only.
    /// `None`: every earlier position.
    pub window: Option<usize>,
    /// Scores (already scaled) become `c · tanh(s / c)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
}

impl PagedAttention {
    /// What the kernels assume and cannot check themselves.
    fn check(&self) -> Result<()> {
        check_shape(
            self.n_heads,
            self.n_kv_heads,
            self.head_dim,
            self.block_size,
        )?;
        let row = self.n_heads * self.head_dim;
        if self.q_stride < row || self.out_stride < row {
            return Err(GpuError::Invalid(format!(
                "attention rows of {row} values do not fit strides q {} / out {}",
                self.q_stride, self.out_stride
            )));
        }
        if self.max_blocks == 0 {
            return Err(GpuError::Invalid("block tables with no column".into()));
        }
        if self.window == Some(0) {
            return Err(GpuError::Invalid("a sliding window of 0 positions".into()));
        }
        if let Some(c) = self.softcap.filter(|c| !(*c > 0.0 && c.is_finite())) {
            return Err(GpuError::Invalid(format!(
                "attention softcap {c} must be positive and finite"
            )));
        }
        // Cache rows are read 16 bytes at a time (head_dim is a multiple of 8 elements).
        if !self.k_cache.0.is_multiple_of(16) || !self.v_cache.0.is_multiple_of(16) {
            return Err(GpuError::Invalid(format!(
                "KV cache at {:#x} / {:#x}: the attention kernels need 16-byte alignment",
                self.k_cache.0, self.v_cache.0
            )));
        }
        Ok(())
    }

    /// The kernel arguments around the work list: `(out, q, k, v, tables)` and the shapes.
    fn args(&self, work: &[DevicePtr]) -> Result<Vec<Arg>> {
        self.check()?;
        let mut args = vec![
            Arg::Ptr(self.out),
            Arg::Ptr(self.q),
            Arg::Ptr(self.k_cache),
            Arg::Ptr(self.v_cache),
            Arg::Ptr(self.block_tables),
        ];
        args.extend(work.iter().map(|&p| Arg::Ptr(p)));
        args.extend([
            Arg::I32(int("q_stride", self.q_stride)?),
            Arg::I32(int("out_stride", self.out_stride)?),
            Arg::I32(int("n_heads", self.n_heads)?),
            Arg::I32(int("n_kv_heads", self.n_kv_heads)?),
            Arg::I32(int("head_dim", self.head_dim)?),
            Arg::I32(int("block_size", self.block_size)?),
            Arg::I32(int("max_blocks", self.max_blocks)?),
            Arg::F32(self.scale),
            // 0 stands for no window and no cap in the kernels.
            Arg::I32(int("window", self.window.unwrap_or(0))?),
            Arg::F32(self.softcap.unwrap_or(0.0)),
        ]);
        Ok(args)
    }

    /// Decode: each of `n_queries` rows attends to its own sequence's first `q_ctx[t]`
    /// positions. `q_seq` (i32 per row) names its block-table row; `q_ctx` (i32 per row) how
    /// many positions precede it, itself included (its position + 1): it sees all of them, or
    /// the last `w` with a window `w`.
    pub fn decode(
        &self,
        gpu: &Gpu,
        q_seq: DevicePtr,
        q_ctx: DevicePtr,
        n_queries: usize,
    ) -> Result<()> {
        let args = self.args(&[q_seq, q_ctx])?;
        gpu.launch(
            &format!("attn_decode_{}", self.dtype.suffix()),
            Launch::new(
                [
                    grid_x("queries", n_queries)?,
                    grid_yz("heads", self.n_heads)?,
                    1,
                ],
                128,
            ),
            &args,
        )
    }

    /// Prefill: `tiles` (i32 `n_tiles × 4`) from [`prefill_tiles`]; query `i` of a tile sees
    /// `ctx0 + i` positions (the last `w` of them with a window `w`).
    pub fn prefill(&self, gpu: &Gpu, tiles: DevicePtr, n_tiles: usize) -> Result<()> {
        let args = self.args(&[tiles])?;
        let shared = prefill_shared_bytes(self.head_dim);
        gpu.launch(
            &format!("attn_prefill_{}", self.dtype.suffix()),
            Launch::new(
                [
                    grid_x("tiles", n_tiles)?,
                    grid_yz("heads", self.n_heads)?,
                    1,
                ],
                128,
            )
            .with_shared(shared as u32),
            &args,
        )
    }
}

/// One prefill chunk, for [`prefill_tiles`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillChunk {
    /// Activation row of the chunk's first token.
    pub first_row: usize,
    pub n_rows: usize,
    /// The chunk's block-table row.
    pub seq: usize,
    /// Position of the chunk's first token (it sees `start_pos + 1` positions).
    pub start_pos: usize,
}

/// Cut chunks into prefill tiles of at most [`PREFILL_TILE`] rows, appending 4 i32 per tile
/// to `out`: first row, rows, block-table row, context length of the first row.
pub fn prefill_tiles(chunks: &[PrefillChunk], out: &mut Vec<i32>) {
    for c in chunks {
        let mut i = 0;
        while i < c.n_rows {
            let n = PREFILL_TILE.min(c.n_rows - i);
            out.extend([
                (c.first_row + i) as i32,
                n as i32,
                c.seq as i32,
                (c.start_pos + i + 1) as i32,
            ]);
            i += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_each_chunk_in_order() {
        let mut out = Vec::new();
        prefill_tiles(
            &[
                PrefillChunk {
                    first_row: 2,
                    n_rows: 35,
                    seq: 1,
                    start_pos: 10,
                },
                PrefillChunk {
                    first_row: 37,
                    n_rows: 3,
                    seq: 0,
                    start_pos: 0,
                },
            ],
            &mut out,
        );
        assert_eq!(
            out,
            vec![2, 16, 1, 11, 18, 16, 1, 27, 34, 3, 1, 43, 37, 3, 0, 1]
        );
    }

    #[test]
    fn the_stage_fits_48_kib_for_every_head_size() {
        for hd in (8..=256).step_by(8) {
            assert!(prefill_shared_bytes(hd) <= 48 * 1024, "head_dim {hd}");
        }
    }
}
