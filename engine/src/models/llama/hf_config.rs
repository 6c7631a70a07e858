//! The decoder's settings from an HF `config.json`: every field that changes the numbers is
//! read and honoured, or the load fails naming it.

use serde_json::Value;

use super::rope_scaling::{
    dynamic, llama3_factors, longrope, original_context, yarn_factors, ContextRope,
};
use super::rules::DecoderRules;
use super::{LlamaConfig, MlpActivation};
use crate::error::{EngineError, Result};

/// More layers than any published decoder has (the largest have a few hundred).
const MAX_LAYERS: usize = 4096;

pub fn cfg_error(msg: impl Into<String>) -> EngineError {
    EngineError::load("config.json", msg)
}

/// The text model's settings: top level, or `text_config` where the checkpoint nests them.
pub fn text_section(config: &Value) -> &Value {
    config
        .get("text_config")
        .filter(|v| v.is_object())
        .unwrap_or(config)
}

fn need_usize(v: &Value, key: &str) -> Result<usize> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .filter(|n| *n > 0)
        .ok_or_else(|| cfg_error(format!("`{key}` is missing or not a positive integer")))
}

/// The decoder's settings from `config.json`: the hyper-parameters, M-RoPE's sections, and the
/// per-frequency RoPE divisors a scaling type computes (`llama3`), as GGUF's `rope_freqs`.
pub struct HfDecoderConfig {
    pub cfg: LlamaConfig,
    pub mrope_section: Option<Vec<usize>>,
    pub rope_factors: Option<Vec<f32>>,
    /// RoPE that depends on the served context (LongRoPE, dynamic NTK).
    pub context_rope: Option<ContextRope>,
}

/// The MLP activation `config.json` names under `key` (`hidden_act`; Gemma's is
/// `hidden_activation`).
pub fn activation(t: &Value, key: &str) -> Result<MlpActivation> {
    let name = t.get(key).and_then(Value::as_str);
    match name {
        None | Some("silu" | "swish") => Ok(MlpActivation::Silu),
        Some("gelu_pytorch_tanh" | "gelu_new") => Ok(MlpActivation::GeluTanh),
        Some(other) => Err(cfg_error(format!(
            "hidden_act `{other}` is not supported (supported: silu, gelu_pytorch_tanh)"
        ))),
    }
}

/// The RoPE settings of the layers that attend globally, and the local layers' base where
/// they turn differently. Transformers 5 keeps per-layer-type settings under
/// `rope_parameters.{full,sliding}_attention`; older files keep `rope_theta`, `rope_scaling`
/// and Gemma 3's `rope_local_base_freq` at the top level.
fn rope_sections(t: &Value) -> Result<(Option<&Value>, f32, Option<f32>)> {
    let params = t.get("rope_parameters").filter(|v| v.is_object());
    let theta = |v: Option<&Value>| v.and_then(|v| v.get("rope_theta")).and_then(Value::as_f64);
    if let Some(full) = params.and_then(|p| p.get("full_attention")) {
        let local = params.and_then(|p| p.get("sliding_attention"));
        if let Some(kind) = local
            .and_then(|l| l.get("rope_type"))
            .and_then(Value::as_str)
            .filter(|k| *k != "default")
        {
            return Err(cfg_error(format!(
                "rope_parameters.sliding_attention: rope type `{kind}` is not supported on sliding-window layers (default only)"
            )));
        }
        let base = theta(Some(full)).unwrap_or(10000.0) as f32;
        return Ok((Some(full), base, theta(local).map(|b| b as f32)));
    }
    let scaling = t.get("rope_scaling").filter(|v| v.is_object()).or(params);
    let base = t
        .get("rope_theta")
        .and_then(Value::as_f64)
        .or_else(|| theta(scaling))
        .unwrap_or(10000.0) as f32;
    let local = t
        .get("rope_local_base_freq")
        .and_then(Value::as_f64)
        .map(|b| b as f32);
    Ok((scaling, base, local))
}

/// Per layer, the sliding window it attends within: `layer_types` where the file lists them,
/// else the family's rule ([`DecoderRules::sliding_layer`]); a family without one never slides.
fn layer_windows(rules: &DecoderRules, t: &Value, n_layers: usize) -> Result<Vec<Option<usize>>> {
    let Some(sliding_layer) = rules.sliding_layer else {
        return Ok(Vec::new());
    };
    let class_default = rules.default_window;
    let window = match t.get("sliding_window") {
        None => class_default,
        Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|w| *w > 0)
                .ok_or_else(|| cfg_error("`sliding_window` must be a positive integer"))?
                as usize,
        ),
    };
    let sliding: Vec<bool> = if let Some(types) = t.get("layer_types").and_then(Value::as_array) {
        if types.len() != n_layers {
            return Err(cfg_error(format!(
                "layer_types lists {} layers, num_hidden_layers is {n_layers}",
                types.len()
            )));
        }
        types
            .iter()
            .map(|ty| match ty.as_str() {
                Some("full_attention") => Ok(false),
                Some("sliding_attention") => Ok(true),
                other => Err(cfg_error(format!(
                    "layer type {} is not supported (supported: full_attention, sliding_attention)",
                    other.map_or_else(|| ty.to_string(), |s| format!("`{s}`"))
                ))),
            })
            .collect::<Result<_>>()?
    } else if window.is_none() {
        return Ok(Vec::new());
    } else {
        (0..n_layers).map(|i| sliding_layer(t, i)).collect()
    };
    if !sliding.iter().any(|&s| s) {
        return Ok(Vec::new());
    }
    let Some(w) = window else {
        return Err(cfg_error(
            "some layers are sliding_attention layers but `sliding_window` is null",
        ));
    };
    Ok(sliding.into_iter().map(|s| s.then_some(w)).collect())
}

/// Reads the decoder's hyper-parameters from `config.json`.
/// The registry has matched the architecture to `rules` already.
pub fn read_hf_config(
    config: &Value,
    vocab_from_weights: usize,
    rules: &DecoderRules,
) -> Result<HfDecoderConfig> {
    let arch = crate::hf::architecture(config).to_string();
    let t = text_section(config);
    let hidden = need_usize(t, "hidden_size")?;
    let n_layers = need_usize(t, "num_hidden_layers")?;
    // Per-layer settings are sized by it before any weight is read.
    if n_layers > MAX_LAYERS {
        return Err(cfg_error(format!(
            "num_hidden_layers {n_layers} is beyond any decoder this serves (at most {MAX_LAYERS})"
        )));
    }
    let n_heads = need_usize(t, "num_attention_heads")?;
    let n_kv_heads = t
        .get("num_key_value_heads")
        .and_then(Value::as_u64)
        .map_or(n_heads, |n| n as usize);
    if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return Err(cfg_error(format!(
            "{n_heads} attention heads are not a multiple of {n_kv_heads} KV heads"
        )));
    }
    let head_dim = match t.get("head_dim").and_then(Value::as_u64) {
        Some(d) => d as usize,
        None if hidden.is_multiple_of(n_heads) => hidden / n_heads,
        None => {
            return Err(cfg_error(format!(
                "hidden size {hidden} is not a multiple of {n_heads} heads"
            )))
        }
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(cfg_error(format!("head dim {head_dim} must be even")));
    }
    let ffn = need_usize(t, "intermediate_size")?;
    let partial = t
        .get("partial_rotary_factor")
        .or_else(|| {
            t.get("rope_parameters")
                .and_then(|r| r.get("partial_rotary_factor"))
        })
        .and_then(Value::as_f64);
    if partial.is_some_and(|p| p != 1.0) {
        return Err(cfg_error(format!(
            "partial_rotary_factor {} is not supported (RoPE over the whole head only)",
            partial.unwrap_or(1.0)
        )));
    }
    let eps = t
        .get("rms_norm_eps")
        .and_then(Value::as_f64)
        .unwrap_or(1e-6) as f32;
    let (scaling, rope_base, local_rope_base) = rope_sections(t)?;
    let mut rope_freq_scale = 1.0f32;
    let mut rope_attn_factor = 1.0f32;
    let mut rope_factors = None;
    let mut mrope_section = None;
    let mut context_rope = None;
    let mut max_position = t
        .get("max_position_embeddings")
        .and_then(Value::as_u64)
        .map_or(2048, |n| n as usize);
    if let Some(s) = scaling {
        let kind = s
            .get("rope_type")
            .or_else(|| s.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if let Some(sec) = s.get("mrope_section").and_then(Value::as_array) {
            let sec: Vec<usize> = sec
                .iter()
                .filter_map(Value::as_u64)
                .map(|n| n as usize)
                .collect();
            if sec.len() != 3 || sec.iter().sum::<usize>() * 2 != head_dim {
                return Err(cfg_error(format!(
                    "mrope_section {sec:?} must have three parts summing to head_dim / 2 = {}",
                    head_dim / 2
                )));
            }
            mrope_section = Some(sec);
        }
        match kind {
            "default" | "mrope" => {}
            "linear" => {
                let f = s.get("factor").and_then(Value::as_f64).unwrap_or(1.0);
                if f <= 0.0 {
                    return Err(cfg_error("rope_scaling.factor must be positive"));
                }
                rope_freq_scale = (1.0 / f) as f32;
            }
            "llama3" => {
                let original = original_context(t, s);
                rope_factors = Some(llama3_factors(s, rope_base, head_dim, original)?);
            }
            "yarn" => {
                let original = original_context(t, s);
                let (factors, attn) = yarn_factors(s, rope_base, head_dim, original, t)?;
                rope_factors = Some(factors);
                rope_attn_factor = attn;
            }
            "longrope" | "su" => {
                let (rope, attn) = longrope(s, t, head_dim)?;
                rope_factors = rope.for_context(max_position).1;
                context_rope = Some(rope);
                rope_attn_factor = attn;
            }
            "dynamic" => {
                let (rope, context) = dynamic(s, rope_base, head_dim, max_position)?;
                max_position = context;
                context_rope = Some(rope);
            }
            other => {
                return Err(cfg_error(format!(
                    "rope scaling `{other}` is not supported (supported: default, linear, llama3, yarn, longrope, dynamic, mrope)"
                )))
            }
        }
    }
    let vocab = t
        .get("vocab_size")
        .or_else(|| config.get("vocab_size"))
        .and_then(Value::as_u64)
        .map_or(vocab_from_weights, |n| n as usize);
    let traits = (rules.hf_traits)(t, hidden)?;
    let mut windows = layer_windows(rules, t, n_layers)?;
    let local_rope_base =
        local_rope_base.filter(|_| rules.local_rope && windows.iter().any(Option::is_some));
    // Windows that cover the whole context change nothing (unless the layer's RoPE differs).
    if local_rope_base.is_none() && windows.iter().flatten().all(|&w| w >= max_position) {
        windows.clear();
    }
    Ok(HfDecoderConfig {
        cfg: LlamaConfig {
            architecture: arch,
            hidden,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn,
            vocab,
            eps,
            rope_base,
            rope_dim: head_dim,
            rope_neox: true,
            rope_freq_scale,
            rope_attn_factor,
            max_position,
            mrope_section: mrope_section.as_deref().map(|s| [s[0], s[1], s[2]]),
            traits,
            local_rope_base,
            windows,
        },
        mrope_section,
        rope_factors,
        context_rope,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `config.json` read with the rules of the family the registry finds for it.
    fn read(config: &Value, vocab: usize) -> Result<HfDecoderConfig> {
        let (rules, _) = crate::families::hf_decoder(config)?;
        read_hf_config(config, vocab, rules)
    }
    use serde_json::json;

    fn base() -> Value {
        json!({
            "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "vocab_size": 100, "rope_theta": 1000000.0
        })
    }

    #[test]
    fn reads_the_text_settings() {
        let HfDecoderConfig {
            cfg,
            mrope_section: mrope,
            rope_factors,
            ..
        } = read(&base(), 0).unwrap();
        assert_eq!(rope_factors, None);
        assert_eq!((cfg.head_dim, cfg.n_kv_heads, cfg.vocab), (16, 2, 100));
        assert!(cfg.rope_neox);
        assert_eq!(cfg.rope_base, 1e6);
        assert_eq!(mrope, None);
        let mut vl = base();
        vl["architectures"] = json!(["Qwen2VLForConditionalGeneration"]);
        vl["rope_scaling"] = json!({"type": "mrope", "mrope_section": [4, 2, 2]});
        assert_eq!(read(&vl, 0).unwrap().mrope_section, Some(vec![4, 2, 2]));
        // Nested text settings (transformers 5 layout).
        let nested =
            json!({"architectures": ["Qwen2VLForConditionalGeneration"], "text_config": base()});
        assert_eq!(read(&nested, 0).unwrap().cfg.hidden, 64);
    }

    #[test]
    fn sliding_windows_per_layer_by_family_and_layer_types() {
        let windows = |v: &Value| read(v, 0).unwrap().cfg.windows;
        let mut v = base();
        v["architectures"] = json!(["MistralForCausalLM"]);
        v["max_position_embeddings"] = json!(32768);
        v["sliding_window"] = json!(4096);
        assert_eq!(windows(&v), vec![Some(4096); 2]);
        assert_eq!(read(&v, 0).unwrap().cfg.max_position, 32768);
        // A window as long as the context is no window; absent, transformers' default.
        v["sliding_window"] = json!(32768);
        assert!(windows(&v).is_empty());
        v["sliding_window"] = Value::Null;
        assert!(windows(&v).is_empty());
        v.as_object_mut().unwrap().remove("sliding_window");
        assert_eq!(windows(&v), vec![Some(4096); 2]);
        // Qwen2 slides only with use_sliding_window, from max_window_layers.
        let mut v = base();
        v["sliding_window"] = json!(16);
        assert!(windows(&v).is_empty());
        v["use_sliding_window"] = json!(true);
        v["max_window_layers"] = json!(1);
        assert_eq!(windows(&v), vec![None, Some(16)]);
        // layer_types wins; Llama never slides.
        v["layer_types"] = json!(["sliding_attention", "full_attention"]);
        assert_eq!(windows(&v), vec![Some(16), None]);
        v["architectures"] = json!(["LlamaForCausalLM"]);
        assert!(windows(&v).is_empty());
        let mut v = base();
        v["architectures"] = json!(["Gemma2ForCausalLM"]);
        v["num_hidden_layers"] = json!(4);
        v["sliding_window"] = json!(8);
        assert_eq!(windows(&v), vec![Some(8), None, Some(8), None]);
        v["architectures"] = json!(["Gemma3ForCausalLM"]);
        v["sliding_window_pattern"] = json!(2);
        assert_eq!(windows(&v), vec![Some(8), None, Some(8), None]);
    }

    #[test]
    fn gemma_traits_with_transformers_defaults() {
        let mut v = base();
        v["architectures"] = json!(["Gemma2ForCausalLM"]);
        v["sliding_window"] = json!(8);
        let cfg = read(&v, 0).unwrap().cfg;
        let t = &cfg.traits;
        assert_eq!(t.embed_scale, Some(8.0));
        assert!(t.norm_offset && t.sandwich_norms);
        assert_eq!(t.activation, MlpActivation::GeluTanh);
        assert_eq!((t.attn_softcap, t.final_softcap), (Some(50.0), Some(30.0)));
        assert_eq!(t.attn_scale, Some(1.0 / 16.0));
        v["final_logit_softcapping"] = Value::Null;
        v["query_pre_attn_scalar"] = json!(64);
        let cfg = read(&v, 0).unwrap().cfg;
        assert_eq!(cfg.traits.final_softcap, None);
        assert_eq!(cfg.traits.attn_scale, Some(0.125));
        // Gemma 3: local layers turn with their own base, in either layout.
        let mut v = base();
        v["architectures"] = json!(["Gemma3ForCausalLM"]);
        v["sliding_window"] = json!(8);
        v["rope_theta"] = json!(1000000.0);
        v["rope_local_base_freq"] = json!(10000.0);
        let cfg = read(&v, 0).unwrap().cfg;
        assert_eq!((cfg.rope_base, cfg.local_rope_base), (1e6, Some(1e4)));
        assert_eq!(cfg.traits.attn_softcap, None);
        let mut v = base();
        v["architectures"] = json!(["Gemma3ForCausalLM"]);
        v["sliding_window"] = json!(8);
        v.as_object_mut().unwrap().remove("rope_theta");
        v["rope_parameters"] = json!({
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}});
        let cfg = read(&v, 0).unwrap().cfg;
        assert_eq!((cfg.rope_base, cfg.local_rope_base), (1e6, Some(1e4)));
        assert_eq!(cfg.rope_freq_scale, 0.125);
        // The field belongs to Gemma 3 only.
        let mut v = base();
        v["rope_local_base_freq"] = json!(10.0);
        assert_eq!(read(&v, 0).unwrap().cfg.local_rope_base, None);
    }

    #[test]
    fn llama3_divisors_run_from_one_to_the_factor() {
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
        v["rope_theta"] = json!(10000.0);
        let f = read(&v, 0).unwrap().rope_factors.unwrap();
        assert_eq!(f.len(), 8);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[7], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
        assert!(
            f.iter().any(|&x| x > 1.0 && x < 8.0),
            "a blended band: {f:?}"
        );
    }

    #[test]
    fn refuses_what_it_cannot_run_with_a_reason() {
        let msg = |v: Value| read(&v, 0).err().map(|e| e.to_string()).unwrap_or_default();
        let mut v = base();
        v["architectures"] = json!(["GPT2LMHeadModel"]);
        assert!(msg(v).contains("GPT2LMHeadModel"));
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "longrope", "factor": 4.0});
        assert!(msg(v).contains("longrope"));
        let mut v = base();
        v["hidden_act"] = json!("relu2");
        assert!(msg(v).contains("hidden_act `relu2`"));
        let mut v = base();
        v["layer_types"] = json!(["chunked_attention", "full_attention"]);
        assert!(msg(v).contains("`chunked_attention`"));
        let mut v = base();
        v["layer_types"] = json!(["sliding_attention", "full_attention"]);
        v["sliding_window"] = Value::Null;
        assert!(msg(v).contains("sliding_window"));
        let mut v = base();
        v["architectures"] = json!(["Gemma3ForCausalLM"]);
        v["use_bidirectional_attention"] = json!(true);
        assert!(msg(v).contains("use_bidirectional_attention"));
        let mut v = base();
        v["partial_rotary_factor"] = json!(0.75);
        assert!(msg(v).contains("partial_rotary_factor 0.75"));
        let mut v = base();
        v["rope_parameters"] = json!({"rope_type": "default", "partial_rotary_factor": 0.5});
        assert!(msg(v).contains("partial_rotary_factor 0.5"));
        let mut v = base();
        v["rope_scaling"] = json!({"type": "mrope", "mrope_section": [4, 4, 4]});
        assert!(msg(v).contains("mrope_section"));
        let mut v = base();
        v["num_hidden_layers"] = json!(1u64 << 40);
        assert!(msg(v).contains("num_hidden_layers"));
        let mut v = base();
        v["num_key_value_heads"] = json!(3);
        assert!(msg(v).contains("KV heads"));
        let mut v = base();
        v.as_object_mut().unwrap().remove("hidden_size");
        assert!(msg(v).contains("hidden_size"));
    }
}
