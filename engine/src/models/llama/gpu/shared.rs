//! The decoder's device weights as named slots of one shared region: packed by the weight
//! cache's daemon from the weights it uploaded, and taken back as views by an engine that
//! mapped the region, so the engine's start converts and copies nothing.
//!
//! Each slot's expected size comes from the engine's own host model, so a region packed for
//! another shape or type is refused naming the slot instead of being read out of place.

use kernels::gpu::{Gpu, GpuBuffer, GpuDType, PackedWeights};

use super::super::{Layer, LlamaModel, Weight};
use super::weights::{GpuLayer, GpuWeights};
use crate::error::{EngineError, Result};

/// Every buffer of `w`, named, in a fixed order.
pub(super) fn named(w: &GpuWeights) -> Vec<(String, &GpuBuffer)> {
    let mut out: Vec<(String, &GpuBuffer)> = vec![("embed".into(), &w.embed)];
    if let Some(h) = &w.lm_head {
        out.push(("lm_head".into(), h));
    }
    out.push(("out_norm".into(), &w.out_norm));
    for (i, l) in w.layers.iter().enumerate() {
        let fixed = [
            ("attn_norm", &l.attn_norm),
            ("wqkv", &l.wqkv),
            ("wo", &l.wo),
            ("ffn_norm", &l.ffn_norm),
            ("wgu", &l.wgu),
            ("wdown", &l.wdown),
        ];
        let optional = [
            ("bias", &l.bias),
            ("q_norm", &l.q_norm),
            ("k_norm", &l.k_norm),
            ("post_attn_norm", &l.post_attn_norm),
            ("post_ffn_norm", &l.post_ffn_norm),
        ];
        out.extend(fixed.map(|(n, b)| (format!("layers.{i}.{n}"), b)));
        out.extend(
            optional
                .iter()
                .filter_map(|(n, b)| b.as_ref().map(|b| (format!("layers.{i}.{n}"), b))),
        );
    }
    out
}

/// `w` packed into one region other processes can map.
pub(super) fn pack(gpu: &Gpu, w: &GpuWeights) -> Result<PackedWeights> {
    PackedWeights::pack(gpu, &named(w)).map_err(|e| {
        EngineError::load(
            gpu.info().label(),
            format!("cannot pack the device weights for sharing: {e}"),
        )
    })
}

/// The weights of `model` as `dtype`, as views of `packed`'s slots.
pub(super) fn unpack(
    model: &LlamaModel,
    dtype: GpuDType,
    packed: &PackedWeights,
) -> Result<GpuWeights> {
    let take = |name: String, bytes: usize| {
        packed.take(&name, bytes).map_err(|e| {
            EngineError::load(
                packed.region.gpu().info().label(),
                format!("the shared device weights do not fit this model: {e}"),
            )
        })
    };
    let matrix = |ws: &[&Weight]| ws.iter().map(|w| w.rows).sum::<usize>() * ws[0].cols;
    let m = |ws: &[&Weight]| matrix(ws) * dtype.size();
    let v = |n: usize| n * 4;
    let tied = model.output.same_bytes(&model.token_embd);
    let layer = |i: usize, l: &Layer| -> Result<GpuLayer> {
        let name = |n: &str| format!("layers.{i}.{n}");
        let opt = |n: &str, len: Option<usize>| len.map(|len| take(name(n), v(len))).transpose();
        let biased = l.bq.is_some() || l.bk.is_some() || l.bv.is_some();
        Ok(GpuLayer {
            attn_norm: take(name("attn_norm"), v(l.attn_norm.len()))?,
            wqkv: take(name("wqkv"), m(&[&l.wq, &l.wk, &l.wv]))?,
            bias: opt("bias", biased.then(|| l.wq.rows + l.wk.rows + l.wv.rows))?,
            q_norm: opt("q_norm", l.q_norm.as_ref().map(Vec::len))?,
            k_norm: opt("k_norm", l.k_norm.as_ref().map(Vec::len))?,
            wo: take(name("wo"), m(&[&l.wo]))?,
            post_attn_norm: opt("post_attn_norm", l.post_attn_norm.as_ref().map(Vec::len))?,
            post_ffn_norm: opt("post_ffn_norm", l.post_ffn_norm.as_ref().map(Vec::len))?,
            ffn_norm: take(name("ffn_norm"), v(l.ffn_norm.len()))?,
            wgu: take(name("wgu"), m(&[&l.w_gate, &l.w_up]))?,
            wdown: take(name("wdown"), m(&[&l.w_down]))?,
        })
    };
    let weights = GpuWeights {
        embed: take("embed".into(), m(&[&model.token_embd]))?,
        lm_head: (!tied)
            .then(|| take("lm_head".into(), m(&[&model.output])))
            .transpose()?,
        out_norm: take("out_norm".into(), v(model.output_norm.len()))?,
        layers: model
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| layer(i, l))
            .collect::<Result<_>>()?,
        bytes: 0,
    };
    let expected = named(&weights).len();
    if packed.slots.len() != expected {
        return Err(EngineError::load(
            packed.region.gpu().info().label(),
            format!(
                "the shared device weights have {} slots; this model has {expected}",
                packed.slots.len()
            ),
        ));
    }
    Ok(GpuWeights {
        bytes: super::weights::matrix_bytes(model, dtype),
        ..weights
    })
}
