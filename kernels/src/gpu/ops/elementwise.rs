//! Launchers for the elementwise kernels: `embedding.cu` (token and media rows into the residual
//! stream), `rope.cu` (QKV bias, Q/K norms and rotary embeddings), `kv_cache.cu` (keys and
//! values into the paged cache), `glu.cu` (SiLU·mul or GELU·mul) and `logits.cu`
//! (soft-capping); with the host-side tables they need ([`rope_inv_freq`], [`slot_mapping`]).

use super::{grid_x, grid_yz, int, opt};
use crate::gpu::{Arg, DevicePtr, Gpu, GpuDType, GpuError, Launch, Result};

/// Threads per block of the row kernels.
const ROW_BLOCK: usize = 256;

/// Elements each thread should handle at least before a row is split over more blocks.
const PER_THREAD: usize = 4;

/// The launch of a row kernel: block `x` per row, the row's `width` columns split over `y`
/// blocks, so that a step of a single token still spreads over several SMs.
fn row_launch(rows: usize, width: usize) -> Result<Launch> {
    let block = width.div_ceil(32).clamp(1, ROW_BLOCK / 32) * 32;
    let split = width.div_ceil(block * PER_THREAD).clamp(1, 65535);
    Ok(Launch::new(
        [grid_x("rows", rows)?, grid_yz("column blocks", split)?, 1],
        block as u32,
    ))
}

fn nonzero(what: &str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(GpuError::Invalid(format!("{what} is zero")));
    }
    Ok(())
}

/// Row `t` of the f32 residual stream `x` (`n_tokens × hidden`) becomes the embedding of
/// `tokens[t]` (a row of `table`, `vocab × hidden` of `dtype`, converted to f32 and multiplied
/// by `scale`), or, when
/// `media_slot[t] >= 0`, row `media_slot[t]` of `media` (f32, `hidden` wide: an encoder's output
/// for a placeholder token).
///
/// The caller guarantees every token id is below the vocabulary size and every media slot
/// below the number of media rows: the kernel does not know either bound.
#[derive(Debug, Clone, Copy)]
pub struct Embed {
    /// Storage type of `table`.
    pub dtype: GpuDType,
    /// `vocab × hidden` of `dtype`.
    pub table: DevicePtr,
    /// `n_tokens` i32 token ids.
    pub tokens: DevicePtr,
    /// `n_tokens` i32: a media row for the token, or −1 for its table row. `None`: all tokens
    /// use the table.
    pub media_slot: Option<DevicePtr>,
    /// f32 media rows, `hidden` wide; set exactly when `media_slot` is.
    pub media: Option<DevicePtr>,
    /// f32 output, `n_tokens × hidden`.
    pub x: DevicePtr,
    pub n_tokens: usize,
    pub hidden: usize,
    /// Multiplies the table rows (not the media rows): Gemma's √hidden, else 1.
    pub scale: f32,
}

impl Embed {
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        if self.media_slot.is_some() != self.media.is_some() {
            return Err(GpuError::Invalid(
                "embed: media_slot and media go together".into(),
            ));
        }
        nonzero("embed: hidden", self.hidden)?;
        gpu.launch(
            &format!("embed_{}", self.dtype.suffix()),
            row_launch(self.n_tokens, self.hidden)?,
            &[
                Arg::Ptr(self.table),
                Arg::Ptr(self.tokens),
                opt(self.media_slot),
                opt(self.media),
                Arg::Ptr(self.x),
                Arg::I32(int("hidden", self.hidden)?),
                Arg::F32(self.scale),
            ],
        )
    }
}

/// The inverse frequencies of rotary embeddings, `rope_dim / 2` of them: the angle of
/// frequency `i` at position `pos` is `(pos as f32 · freq_scale) · inv_freq[i]` (the [`RopeQk`]
/// kernel's rule, with `freq_scale` passed to it).
///
/// Each is computed as [`crate::ops::rope_angles`] does: `1 / base^(2i / rope_dim)` in f64,
/// rounded to f32, divided by `factors[i]` (Llama 3 `rope_freqs`) in f32, so the kernel's
/// angles are the CPU's bit for bit.
///
/// # Panics
/// If `factors` is shorter than `rope_dim / 2`.
pub fn rope_inv_freq(base: f32, rope_dim: usize, factors: Option<&[f32]>) -> Vec<f32> {
    let half = rope_dim / 2;
    if let Some(f) = factors {
        assert!(
            f.len() >= half,
            "rope_inv_freq: {} factors for {half} frequencies",
            f.len()
        );
    }
    (0..half)
        .map(|i| {
            let mut inv = (1.0 / f64::from(base).powf((2 * i) as f64 / rope_dim as f64)) as f32;
            if let Some(f) = factors {
                inv /= f[i];
            }
            inv
        })
        .collect()
}

/// In place on the f32 fused-projection rows `qkv` (`n_tokens` rows of
/// `(n_heads + 2·n_kv_heads)·head_dim`, laid out `[q heads | k heads | v heads]`), as the CPU
/// decoder does between the QKV projection and attention: add `bias` (all three parts), apply
/// RMSNorm per q head (`q_norm`) and per k head (`k_norm`), then rotate the first `rope_dim`
/// elements of every q and k head by the token's position(s).
///
/// Positions are `pos_axes` i32 per token (negative ones count as 0): with 1, every frequency
/// uses it; with 3 (M-RoPE: temporal, row, column), frequencies `i < sections[0]` use the first,
/// `i < sections[0] + sections[1]` the second, the rest the third.
#[derive(Debug, Clone, Copy)]
pub struct RopeQk {
    /// f32 `n_tokens × (n_heads + 2·n_kv_heads)·head_dim`, updated in place.
    pub qkv: DevicePtr,
    /// f32 `(n_heads + 2·n_kv_heads)·head_dim`: the q, k and v biases, concatenated.
    pub bias: Option<DevicePtr>,
    /// f32 `head_dim`: the weight of each q head's RMSNorm (Qwen3).
    pub q_norm: Option<DevicePtr>,
    /// f32 `head_dim`: the weight of each k head's RMSNorm.
    pub k_norm: Option<DevicePtr>,
    /// f32 `rope_dim / 2`, from [`rope_inv_freq`].
    pub inv_freq: DevicePtr,
    /// i32 `n_tokens × pos_axes`.
    pub positions: DevicePtr,
    /// 1, or 3 for M-RoPE.
    pub pos_axes: usize,
    /// M-RoPE: how many frequencies take the temporal and the row position (the column
    /// position takes the rest). Ignored when `pos_axes` is 1.
    pub sections: [usize; 2],
    pub n_tokens: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Rotated elements at the start of each head: even, at most `head_dim`.
    pub rope_dim: usize,
    /// Pairs `(i, i + rope_dim/2)` (GPT-NeoX / HF layout) rather than `(2i, 2i + 1)`.
    pub neox: bool,
    /// Linear RoPE scaling: positions are multiplied by it (1 / factor; 1 without scaling).
    pub freq_scale: f32,
    /// RMSNorm epsilon of `q_norm`/`k_norm`.
    pub eps: f32,
}

impl RopeQk {
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        nonzero("rope: head_dim", self.head_dim)?;
        nonzero("rope: n_heads", self.n_heads)?;
        nonzero("rope: n_kv_heads", self.n_kv_heads)?;
        if !self.rope_dim.is_multiple_of(2) || self.rope_dim > self.head_dim {
            return Err(GpuError::Invalid(format!(
                "rope: rope_dim {} must be even and at most head_dim {}",
                self.rope_dim, self.head_dim
            )));
        }
        if self.pos_axes != 1 && self.pos_axes != 3 {
            return Err(GpuError::Invalid(format!(
                "rope: {} positions per token (1, or 3 for M-RoPE)",
                self.pos_axes
            )));
        }
        let heads = self.n_heads + 2 * self.n_kv_heads;
        let stride = heads
            .checked_mul(self.head_dim)
            .ok_or_else(|| GpuError::Invalid("rope: row width overflows".into()))?;
        // One warp per head at a time: more warps than heads would idle.
        let warps = heads.clamp(1, 8);
        let shared = int(
            "rope: shared bytes",
            self.rope_dim * std::mem::size_of::<f32>(),
        )?;
        gpu.launch(
            "rope_qk",
            Launch::new([grid_x("tokens", self.n_tokens)?, 1, 1], warps as u32 * 32)
                .with_shared(shared as u32),
            &[
                Arg::Ptr(self.qkv),
                opt(self.bias),
                opt(self.q_norm),
                opt(self.k_norm),
                Arg::Ptr(self.inv_freq),
                Arg::Ptr(self.positions),
                Arg::I32(int("qkv stride", stride)?),
                Arg::I32(int("n_heads", self.n_heads)?),
                Arg::I32(int("n_kv_heads", self.n_kv_heads)?),
                Arg::I32(int("head_dim", self.head_dim)?),
                Arg::I32(int("rope_dim", self.rope_dim)?),
                Arg::I32(i32::from(self.neox)),
                Arg::I32(int("pos_axes", self.pos_axes)?),
                Arg::I32(int("section 0", self.sections[0])?),
                Arg::I32(int("section 1", self.sections[1])?),
                Arg::F32(self.freq_scale),
                Arg::F32(self.eps),
            ],
        )
    }
}

/// Append the cache slot of each position `start_pos..start_pos + n_tokens` of a sequence to
/// `out`: `block_table[p / block_size] · block_size + p % block_size`, the slot-major index the
/// [`KvWrite`] kernel (and the CPU cache) uses.
///
/// # Panics
/// If `block_size` is zero, `block_table` does not cover the positions, or a slot does not fit
/// an i32.
pub fn slot_mapping(
    block_table: &[u32],
    start_pos: usize,
    n_tokens: usize,
    block_size: usize,
    out: &mut Vec<i32>,
) {
    assert!(block_size > 0, "slot_mapping: block_size is zero");
    out.extend((start_pos..start_pos + n_tokens).map(|p| {
        let slot = block_table[p / block_size] as usize * block_size + p % block_size;
        i32::try_from(slot).unwrap_or_else(|_| panic!("slot_mapping: slot {slot} overflows i32"))
    }));
}

/// Store a step's keys and values in one layer's paged cache: for row `t` with
/// `s = slots[t] >= 0`, `k_cache[s·kv_dim..][..kv_dim] = qkv[t·qkv_stride + k_offset..]` and the
/// same for values from `v_offset`, converted to `dtype`. Rows with a negative slot (padding)
/// are skipped. The caches are `[num_blocks][block_size][n_kv_heads][head_dim]`, so
/// `kv_dim = n_kv_heads·head_dim` elements per slot; slots come from [`slot_mapping`].
#[derive(Debug, Clone, Copy)]
pub struct KvWrite {
    /// Storage type of the caches.
    pub dtype: GpuDType,
    /// f32 rows of the fused projection (after [`RopeQk`]).
    pub qkv: DevicePtr,
    pub k_cache: DevicePtr,
    pub v_cache: DevicePtr,
    /// `n_tokens` i32 slots, −1 for padding; no two rows share a slot.
    pub slots: DevicePtr,
    pub n_tokens: usize,
    /// f32 elements between rows of `qkv`.
    pub qkv_stride: usize,
    /// Where the keys start in a row (`n_heads·head_dim` in the fused layout).
    pub k_offset: usize,
    /// Where the values start in a row.
    pub v_offset: usize,
    /// `n_kv_heads·head_dim`.
    pub kv_dim: usize,
}

impl KvWrite {
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        nonzero("kv_write: kv_dim", self.kv_dim)?;
        for (what, off) in [("k_offset", self.k_offset), ("v_offset", self.v_offset)] {
            if off.saturating_add(self.kv_dim) > self.qkv_stride {
                return Err(GpuError::Invalid(format!(
                    "kv_write: {what} {off} + kv_dim {} is past the row stride {}",
                    self.kv_dim, self.qkv_stride
                )));
            }
        }
        gpu.launch(
            &format!("kv_write_{}", self.dtype.suffix()),
            row_launch(self.n_tokens, self.kv_dim)?,
            &[
                Arg::Ptr(self.qkv),
                Arg::Ptr(self.k_cache),
                Arg::Ptr(self.v_cache),
                Arg::Ptr(self.slots),
                Arg::I32(int("qkv_stride", self.qkv_stride)?),
                Arg::I32(int("k_offset", self.k_offset)?),
                Arg::I32(int("v_offset", self.v_offset)?),
                Arg::I32(int("kv_dim", self.kv_dim)?),
            ],
        )
    }
}

/// The activation of a gated MLP's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GluActivation {
    /// `silu(g) = g / (1 + e^−g)` (SwiGLU, as [`crate::ops::silu_mul`]).
    #[default]
    Silu,
    /// GELU with the tanh approximation (GeGLU, `gelu_pytorch_tanh`).
    GeluTanh,
}

/// `out[t][i] = act(gate_up[t][i]) · gate_up[t][ffn + i]`, stored as `dtype`.
#[derive(Debug, Clone, Copy)]
pub struct Glu {
    /// Storage type of `out`.
    pub dtype: GpuDType,
    /// f32 `n_tokens × 2·ffn`: each row the gate, then the up projection.
    pub gate_up: DevicePtr,
    /// `n_tokens × ffn` of `dtype`.
    pub out: DevicePtr,
    pub n_tokens: usize,
    pub ffn: usize,
    pub activation: GluActivation,
}

impl Glu {
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        nonzero("glu: ffn", self.ffn)?;
        int("glu: 2·ffn", 2 * self.ffn)?;
        gpu.launch(
            &format!("glu_{}", self.dtype.suffix()),
            row_launch(self.n_tokens, self.ffn)?,
            &[
                Arg::Ptr(self.gate_up),
                Arg::Ptr(self.out),
                Arg::I32(int("ffn", self.ffn)?),
                Arg::I32(i32::from(self.activation == GluActivation::GeluTanh)),
            ],
        )
    }
}

/// `logits[i] = cap · tanh(logits[i] / cap)` for `i < n`, in place (f32).
#[derive(Debug, Clone, Copy)]
pub struct LogitsSoftcap {
    pub logits: DevicePtr,
    /// Number of f32 values (all rows together).
    pub n: usize,
    /// Positive and finite.
    pub cap: f32,
}

impl LogitsSoftcap {
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        if !(self.cap > 0.0 && self.cap.is_finite()) {
            return Err(GpuError::Invalid(format!(
                "logits_softcap: cap {} must be positive and finite",
                self.cap
            )));
        }
        let n = i64::try_from(self.n)
            .map_err(|_| GpuError::Invalid(format!("logits_softcap: n = {}", self.n)))?;
        // A grid-stride loop: a few blocks per SM are enough for a memory-bound pass.
        let blocks = self.n.div_ceil(ROW_BLOCK).min(4096);
        gpu.launch(
            "logits_softcap",
            Launch::new([grid_x("logit blocks", blocks)?, 1, 1], ROW_BLOCK as u32),
            &[Arg::Ptr(self.logits), Arg::I64(n), Arg::F32(self.cap)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_block_table() {
        let mut out = vec![7];
        slot_mapping(&[5, 2, 9], 3, 6, 4, &mut out);
        // Positions 3..9: block 0 (id 5) offset 3, block 1 (id 2) offsets 0..4, block 2 (id 9)
        // offset 0.
        assert_eq!(out, vec![7, 23, 8, 9, 10, 11, 36]);
        slot_mapping(&[1], 0, 0, 16, &mut out);
        assert_eq!(out.len(), 7);
    }

    #[test]
    fn inv_freq_matches_rope_angles() {
        let factors: Vec<f32> = (0..32).map(|i| 1.0 + i as f32 / 7.0).collect();
        for (scale, f) in [
            (1.0, None),
            (0.25, Some(&factors[..])),
            (1.0, Some(&factors[..])),
        ] {
            let inv = rope_inv_freq(500000.0, 64, f);
            let (mut c, mut s) = (vec![0f32; 32], vec![0f32; 32]);
            for pos in [0usize, 1, 17, 4095, 30001] {
                crate::ops::rope_angles(pos, 500000.0, 64, scale, f, &mut c, &mut s);
                for i in 0..32 {
                    let a = (pos as f32 * scale) * inv[i];
                    assert_eq!(f64::from(a).cos() as f32, c[i], "pos {pos} freq {i}");
                    assert_eq!(f64::from(a).sin() as f32, s[i], "pos {pos} freq {i}");
                }
            }
        }
    }
}
