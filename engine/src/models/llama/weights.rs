//! A decoder layer's tensors and where the loaders find them: the parts of a layer, their
//! names in GGUF files and HF checkpoints, and what a checkpoint format must provide.

use kernels::DType;

use super::LlamaConfig;
use crate::error::Result;
use crate::model::WeightSummary;

/// A weight matrix inside the memory map.
#[derive(Debug, Clone, Copy)]
pub(super) struct Weight {
    /// Which memory map holds it (GGUF: the one file; safetensors: the shard).
    pub(super) file: usize,
    pub(super) dtype: DType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) start: usize,
    pub(super) len: usize,
    /// The bytes are in the kernels' interleaved layout (`super::interleave`).
    pub(super) interleaved: bool,
}

impl Weight {
    /// Whether both are the same bytes (a tied LM head is the embedding table).
    pub(super) fn same_bytes(&self, other: &Weight) -> bool {
        self.file == other.file && self.start == other.start && self.len == other.len
    }

    /// Rows `first..first + rows` of this row-major matrix, as a view of the same bytes (the
    /// parts of a fused `qkv` or `gate_up` matrix).
    pub(super) fn rows_view(&self, first: usize, rows: usize) -> Weight {
        debug_assert!(
            !self.interleaved,
            "views are taken at load, before interleaving"
        );
        let row_bytes = self.len / self.rows.max(1);
        Weight {
            rows,
            start: self.start + first * row_bytes,
            len: rows * row_bytes,
            ..*self
        }
    }
}

/// One decoder layer's tensors.
pub(super) struct Layer {
    pub(super) attn_norm: Vec<f32>,
    pub(super) wq: Weight,
    pub(super) wk: Weight,
    pub(super) wv: Weight,
    pub(super) wo: Weight,
    pub(super) bq: Option<Vec<f32>>,
    pub(super) bk: Option<Vec<f32>>,
    pub(super) bv: Option<Vec<f32>>,
    pub(super) q_norm: Option<Vec<f32>>,
    pub(super) k_norm: Option<Vec<f32>>,
    pub(super) ffn_norm: Vec<f32>,
    /// Gemma 2/3: norms of the attention's and the MLP's outputs, before each residual add.
    pub(super) post_attn_norm: Option<Vec<f32>>,
    pub(super) post_ffn_norm: Option<Vec<f32>>,
    pub(super) w_gate: Weight,
    pub(super) w_up: Weight,
    pub(super) w_down: Weight,
}

impl Layer {
    /// Its matrices (at their stored size) and f32 vectors into `s`.
    pub(super) fn count(&self, s: &mut WeightSummary) {
        for w in [
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.w_gate,
            &self.w_up,
            &self.w_down,
        ] {
            s.add(w.dtype, w.len as u64);
        }
        let vectors = [
            Some(&self.attn_norm),
            Some(&self.ffn_norm),
            self.bq.as_ref(),
            self.bk.as_ref(),
            self.bv.as_ref(),
            self.q_norm.as_ref(),
            self.k_norm.as_ref(),
            self.post_attn_norm.as_ref(),
            self.post_ffn_norm.as_ref(),
        ];
        for v in vectors.into_iter().flatten() {
            count_f32(s, v);
        }
    }
}

/// A vector the model holds as f32.
pub(super) fn count_f32(s: &mut WeightSummary, v: &[f32]) {
    s.add(DType::F32, std::mem::size_of_val(v) as u64);
}

/// Where a loader finds a layer's tensors: the parts of a layer and their names in GGUF
/// files and in HF checkpoints.
#[derive(Debug, Clone, Copy)]
pub(super) enum Part {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    FfnNorm,
    PostAttnNorm,
    PostFfnNorm,
    Gate,
    Up,
    Down,
}

impl Part {
    pub(super) fn gguf(self) -> &'static str {
        match self {
            Part::AttnNorm => "attn_norm.weight",
            Part::Q => "attn_q.weight",
            Part::K => "attn_k.weight",
            Part::V => "attn_v.weight",
            Part::O => "attn_output.weight",
            Part::QBias => "attn_q.bias",
            Part::KBias => "attn_k.bias",
            Part::VBias => "attn_v.bias",
            Part::QNorm => "attn_q_norm.weight",
            Part::KNorm => "attn_k_norm.weight",
            Part::FfnNorm => "ffn_norm.weight",
            Part::PostAttnNorm => "post_attention_norm.weight",
            Part::PostFfnNorm => "post_ffw_norm.weight",
            Part::Gate => "ffn_gate.weight",
            Part::Up => "ffn_up.weight",
            Part::Down => "ffn_down.weight",
        }
    }

    /// The HF name; `sandwich`: Gemma 2/3's four norms per layer, where
    /// `post_attention_layernorm` norms the attention's output rather than the MLP's input.
    pub(super) fn hf(self, sandwich: bool) -> &'static str {
        match self {
            Part::FfnNorm if sandwich => "pre_feedforward_layernorm.weight",
            Part::PostAttnNorm => "post_attention_layernorm.weight",
            Part::PostFfnNorm => "post_feedforward_layernorm.weight",
            Part::AttnNorm => "input_layernorm.weight",
            Part::Q => "self_attn.q_proj.weight",
            Part::K => "self_attn.k_proj.weight",
            Part::V => "self_attn.v_proj.weight",
            Part::O => "self_attn.o_proj.weight",
            Part::QBias => "self_attn.q_proj.bias",
            Part::KBias => "self_attn.k_proj.bias",
            Part::VBias => "self_attn.v_proj.bias",
            Part::QNorm => "self_attn.q_norm.weight",
            Part::KNorm => "self_attn.k_norm.weight",
            Part::FfnNorm => "post_attention_layernorm.weight",
            Part::Gate => "mlp.gate_proj.weight",
            Part::Up => "mlp.up_proj.weight",
            Part::Down => "mlp.down_proj.weight",
        }
    }
}

/// What the layer builder needs from a checkpoint format.
pub(super) trait WeightSource {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight>;
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>>;
    fn optional_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>>;
}

/// One decoder layer, its tensors named by `name`. Gemma's HF norms store `w - 1` (the norm
/// multiplies by `1 + w`): with `cfg.traits.norm_offset` the 1 is added here, once, in f32 as
/// transformers adds it.
pub(super) fn load_layer(
    l: &impl WeightSource,
    cfg: &LlamaConfig,
    name: impl Fn(Part) -> String,
) -> Result<Layer> {
    let (h, hd) = (cfg.hidden, cfg.head_dim);
    let (q_dim, kv_dim) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
    let norm = |part: Part, n: usize| -> Result<Vec<f32>> {
        l.vector(&name(part), n).map(|w| offset_norm(cfg, w))
    };
    let optional_norm = |part: Part, n: usize| -> Result<Option<Vec<f32>>> {
        Ok(l.optional_vector(&name(part), n)?
            .map(|w| offset_norm(cfg, w)))
    };
    let sandwich = cfg.traits.sandwich_norms;
    Ok(Layer {
        attn_norm: norm(Part::AttnNorm, h)?,
        wq: l.matrix(&name(Part::Q), q_dim, h)?,
        wk: l.matrix(&name(Part::K), kv_dim, h)?,
        wv: l.matrix(&name(Part::V), kv_dim, h)?,
        wo: l.matrix(&name(Part::O), h, q_dim)?,
        bq: l.optional_vector(&name(Part::QBias), q_dim)?,
        bk: l.optional_vector(&name(Part::KBias), kv_dim)?,
        bv: l.optional_vector(&name(Part::VBias), kv_dim)?,
        q_norm: optional_norm(Part::QNorm, hd)?,
        k_norm: optional_norm(Part::KNorm, hd)?,
        ffn_norm: norm(Part::FfnNorm, h)?,
        post_attn_norm: if sandwich {
            Some(norm(Part::PostAttnNorm, h)?)
        } else {
            None
        },
        post_ffn_norm: if sandwich {
            Some(norm(Part::PostFfnNorm, h)?)
        } else {
            None
        },
        w_gate: l.matrix(&name(Part::Gate), cfg.ffn, h)?,
        w_up: l.matrix(&name(Part::Up), cfg.ffn, h)?,
        w_down: l.matrix(&name(Part::Down), h, cfg.ffn)?,
    })
}

/// A norm's weights as the kernels take them (see [`load_layer`]).
pub(super) fn offset_norm(cfg: &LlamaConfig, mut w: Vec<f32>) -> Vec<f32> {
    if cfg.traits.norm_offset {
        w.iter_mut().for_each(|v| *v += 1.0);
    }
    w
}
