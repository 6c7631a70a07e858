//! RoPE scaling types whose frequencies are not one uniform scale: Llama 3.1's `llama3` and
//! YaRN, as per-frequency divisors (GGUF's `rope_freqs`) computed from `config.json` the way
//! transformers computes them.

use serde_json::Value;

use super::hf_config::cfg_error;
use crate::error::Result;

/// The context the model was pretrained at, as transformers reads it for `llama3` and `yarn`:
/// a top-level `original_max_position_embeddings` (Phi-3 keeps it there), else the scaling's
/// own, else `max_position_embeddings`.
pub(super) fn original_context(t: &Value, s: &Value) -> f64 {
    t.get("original_max_position_embeddings")
        .or_else(|| s.get("original_max_position_embeddings"))
        .or_else(|| t.get("max_position_embeddings"))
        .and_then(Value::as_f64)
        .unwrap_or(2048.0)
}

/// YaRN (transformers' `_compute_yarn_parameters`) as per-frequency divisors and the
/// attention factor: frequencies that turn fewer than `beta_slow` times over the original
/// context are interpolated (divided by `factor`), more than `beta_fast` times kept, with a
/// linear ramp between; cos and sin are scaled by `attention_factor` (by default
/// `0.1 ln(factor) + 1`, or the `mscale` / `mscale_all_dim` ratio).
pub(super) fn yarn_factors(
    s: &Value,
    base: f32,
    head_dim: usize,
    original: f64,
    t: &Value,
) -> Result<(Vec<f32>, f32)> {
    let num = |key: &str| s.get(key).and_then(Value::as_f64);
    if num("partial_rotary_factor").is_some_and(|p| p != 1.0) {
        return Err(cfg_error(
            "rope_scaling `yarn` with a partial_rotary_factor is not supported",
        ));
    }
    let factor = match num("factor") {
        Some(f) => f,
        None => {
            t.get("max_position_embeddings")
                .and_then(Value::as_f64)
                .unwrap_or(original)
                / original
        }
    };
    if factor <= 0.0 {
        return Err(cfg_error("rope_scaling `yarn` needs a positive `factor`"));
    }
    let mscale = |scale: f64, m: f64| {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * scale.ln() + 1.0
        }
    };
    let attention = match (
        num("attention_factor"),
        num("mscale"),
        num("mscale_all_dim"),
    ) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
            mscale(factor, m) / mscale(factor, all)
        }
        _ => mscale(factor, 1.0),
    };
    // `or` as transformers reads them: 0 or absent take the defaults.
    let beta_fast = num("beta_fast").filter(|v| *v != 0.0).unwrap_or(32.0);
    let beta_slow = num("beta_slow").filter(|v| *v != 0.0).unwrap_or(1.0);
    let truncate = s.get("truncate").and_then(Value::as_bool).unwrap_or(true);
    let dim = head_dim as f64;
    let base = base as f64;
    let correction = |rotations: f64| {
        dim * (original / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
    if low == high {
        high += 0.001;
    }
    let factors = (0..head_dim / 2)
        .map(|i| {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            // New frequency = old · ((1 − keep) / factor + keep): the divisor is its inverse.
            (1.0 / ((1.0 - keep) / factor + keep)) as f32
        })
        .collect();
    Ok((factors, attention as f32))
}

/// Llama 3.1's RoPE scaling as per-frequency divisors (GGUF's `rope_freqs`, which the angle
/// divides by): frequencies whose wavelength is under `original_max_position_embeddings /
/// high_freq_factor` keep theirs, those over `original / low_freq_factor` are divided by
/// `factor`, and those between blend the two smoothly.
pub(super) fn llama3_factors(
    s: &Value,
    base: f32,
    head_dim: usize,
    original: f64,
) -> Result<Vec<f32>> {
    let need = |key: &str| {
        s.get(key)
            .and_then(Value::as_f64)
            .filter(|v| *v > 0.0)
            .ok_or_else(|| cfg_error(format!("rope_scaling `llama3` needs a positive `{key}`")))
    };
    let factor = need("factor")?;
    let low = need("low_freq_factor")?;
    let high = need("high_freq_factor")?;
    if high <= low {
        return Err(cfg_error(format!(
            "rope_scaling `llama3`: high_freq_factor ({high}) must exceed low_freq_factor ({low})"
        )));
    }
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    Ok((0..head_dim / 2)
        .map(|i| {
            let freq = (base as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let divisor = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            divisor as f32
        })
        .collect())
}
