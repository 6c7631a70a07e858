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

/// RoPE whose frequencies depend on how long the sequences served are: chosen once, for the
/// longest sequence the server admits (`--max-model-len`), so that an answer never depends on
/// what else is running or on how far a sequence has got.
#[derive(Debug, Clone, PartialEq)]
pub enum ContextRope {
    /// Phi-3's LongRoPE: per-frequency divisors `long` when the served context exceeds
    /// `original`, else `short` (llama.cpp chooses by its context size the same way;
    /// transformers by each forward's length, which agrees for a sequence of the full length).
    LongRope {
        short: Vec<f32>,
        long: Vec<f32>,
        original: usize,
    },
    /// Dynamic NTK: for a context `n` past `original`, the base becomes
    /// `base · (factor · n / original − (factor − 1))^(d / (d − 2))` (transformers' formula at
    /// `n`; vLLM's at `n = original · factor`, the default context here).
    Dynamic {
        base: f32,
        factor: f64,
        original: usize,
        dim: usize,
    },
}

impl ContextRope {
    /// The RoPE base and per-frequency divisors for sequences of up to `max_len` tokens.
    pub fn for_context(&self, max_len: usize) -> (Option<f32>, Option<Vec<f32>>) {
        match self {
            ContextRope::LongRope {
                short,
                long,
                original,
            } => (
                None,
                Some(if max_len > *original { long } else { short }.clone()),
            ),
            ContextRope::Dynamic {
                base,
                factor,
                original,
                dim,
            } => {
                if max_len <= *original {
                    return (Some(*base), None);
                }
                let d = *dim as f64;
                let grow = factor * max_len as f64 / *original as f64 - (factor - 1.0);
                (Some((*base as f64 * grow.powf(d / (d - 2.0))) as f32), None)
            }
        }
    }
}

/// LongRoPE from `rope_scaling` (`longrope`, or its old name `su`): both factor lists, the
/// pretrained context, and the attention factor (given, else `√(1 + ln f / ln original)` with
/// `f` the scaling `factor` or `max_position_embeddings / original`).
pub(super) fn longrope(s: &Value, t: &Value, head_dim: usize) -> Result<(ContextRope, f32)> {
    let list = |key: &str| -> Result<Vec<f32>> {
        let v: Vec<f32> = s
            .get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_f64)
                    .map(|x| x as f32)
                    .collect()
            })
            .unwrap_or_default();
        if v.len() != head_dim / 2 || v.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
            return Err(cfg_error(format!(
                "rope_scaling `longrope` needs `{key}`: {} positive numbers (head_dim / 2)",
                head_dim / 2
            )));
        }
        Ok(v)
    };
    let original = t
        .get("original_max_position_embeddings")
        .or_else(|| s.get("original_max_position_embeddings"))
        .and_then(Value::as_u64)
        .filter(|n| *n > 1)
        .ok_or_else(|| {
            cfg_error("rope_scaling `longrope` needs `original_max_position_embeddings`")
        })? as f64;
    let max_position = t
        .get("max_position_embeddings")
        .and_then(Value::as_f64)
        .unwrap_or(original);
    let factor = s
        .get("factor")
        .and_then(Value::as_f64)
        .unwrap_or(max_position / original);
    let attention = match s.get("attention_factor").and_then(Value::as_f64) {
        Some(a) => a,
        None if factor <= 1.0 => 1.0,
        None => (1.0 + factor.ln() / original.ln()).sqrt(),
    };
    Ok((
        ContextRope::LongRope {
            short: list("short_factor")?,
            long: list("long_factor")?,
            original: original as usize,
        },
        attention as f32,
    ))
}

/// Dynamic NTK from `rope_scaling`: its `factor` over `max_position_embeddings`, and the
/// context it serves by default (`max_position_embeddings · factor`, as vLLM).
pub(super) fn dynamic(
    s: &Value,
    base: f32,
    head_dim: usize,
    max_position: usize,
) -> Result<(ContextRope, usize)> {
    let factor = s
        .get("factor")
        .and_then(Value::as_f64)
        .filter(|f| *f >= 1.0)
        .ok_or_else(|| cfg_error("rope_scaling `dynamic` needs a `factor` of at least 1"))?;
    if head_dim <= 2 {
        return Err(cfg_error("rope_scaling `dynamic` needs a head dim above 2"));
    }
    Ok((
        ContextRope::Dynamic {
            base,
            factor,
            original: max_position,
            dim: head_dim,
        },
        (max_position as f64 * factor) as usize,
    ))
}
