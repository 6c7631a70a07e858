//! The sampler's semantics, written once: how one step's logits become the next token, with
//! vLLM's order of operations. The engine's CPU sampler runs these functions, and the GPU
//! sampling kernel (`cuda/sampling.cu`) is tested against them.
//!
//! Order of operations (as vLLM's v1 sampler):
//! 1. logprobs, when requested, come from the raw model distribution (`log_softmax` of the
//!    logits before any penalty or sampling transform: vLLM's default `raw_logprobs` mode):
//!    [`log_normaliser`], [`logprob`], [`top_k_indices`];
//! 2. `min_tokens`: EOS (unless `ignore_eos`) and `stop_token_ids` are masked until that many
//!    tokens were generated ([`mask`]);
//! 3. the request's token rules (the engine's: `allowed_token_ids`, `bad_words`, then
//!    `logit_bias`; vLLM applies them with `min_tokens`, before the penalties);
//! 4. penalties ([`apply_penalties`]): repetition (HF semantics, over prompt and output tokens: a
//!    positive logit is divided by the penalty, a negative one multiplied), then frequency and
//!    presence (over output tokens: `logit -= frequency * count + presence * (count > 0)`);
//! 5. the structured-output grammar's mask (the engine's). A mask commutes with every transform
//!    here, so its place only matters for logprobs, which stay raw;
//! 6. greedy (temperature below [`GREEDY_EPS`]) takes the arg-max ([`argmax`]); otherwise
//!    temperature, min_p, top_k, top_p, then one draw from the remaining distribution with a
//!    uniform in [0, 1) ([`draw`]).

use std::cmp::Ordering;

/// Below this temperature sampling is greedy (vLLM's `_SAMPLING_EPS`).
pub const GREEDY_EPS: f32 = 1e-5;

/// A row's sampling parameters, as the engine's `SamplingParams` holds them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleParams {
    /// Greedy below [`GREEDY_EPS`].
    pub temperature: f32,
    /// Off when ≤ 0 or ≥ the vocabulary size.
    pub top_k: i32,
    /// Off when ≥ 1.
    pub top_p: f32,
    /// Off when ≤ 0.
    pub min_p: f32,
    /// Off when 1 (or ≤ 0).
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// How many top logprobs to return (the device sampler returns at most
    /// [`crate::gpu::ops::MAX_LOGPROBS`]); `None`: no logprobs at all.
    pub logprobs: Option<usize>,
}

impl Default for SampleParams {
    fn default() -> Self {
        SampleParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logprobs: None,
        }
    }
}

impl SampleParams {
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_EPS
    }
}

/// Best first: larger value, then lower id.
pub fn total_cmp_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// `log_softmax` normaliser (max and log-sum-exp) in f64, NaN ignored; `None` when no logit
/// is finite.
pub fn log_normaliser(logits: &[f32]) -> Option<(f64, f64)> {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return None;
    }
    let max = max as f64;
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| (v as f64 - max).exp())
        .sum();
    Some((max, sum.ln()))
}

/// The logprob of a raw logit `v` under the normaliser `(max, lse)` (NaN: −inf).
pub fn logprob(v: f32, (max, lse): (f64, f64)) -> f32 {
    if v.is_nan() {
        f32::NEG_INFINITY
    } else {
        (v as f64 - max - lse) as f32
    }
}

/// Indices of the `k` largest values, best first (ties broken by lower id; NaN as −inf).
pub fn top_k_indices(values: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut pairs: Vec<(u32, f32)> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, if v.is_nan() { f32::NEG_INFINITY } else { v }))
        .collect();
    let k = k.min(pairs.len());
    if k == 0 {
        return Vec::new();
    }
    if k < pairs.len() {
        pairs.select_nth_unstable_by(k - 1, total_cmp_desc);
        pairs.truncate(k);
    }
    pairs.sort_unstable_by(total_cmp_desc);
    pairs
}

/// Index of the largest value (first on ties), ignoring NaN and −inf; `None` if nothing is.
pub fn argmax(values: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in values.iter().enumerate() {
        if v.is_nan() || v == f32::NEG_INFINITY {
            continue;
        }
        match best {
            Some((_, b)) if v <= b => {}
            _ => best = Some((i, v)),
        }
    }
    best.map(|(i, _)| i as u32)
}

/// Set `ids` to −inf (ids past the vocabulary are ignored).
pub fn mask(logits: &mut [f32], ids: impl IntoIterator<Item = u32>) {
    for id in ids {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Whether `p` penalises anything at all.
pub fn has_penalties(p: &SampleParams) -> bool {
    has_repetition(p) || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0
}

fn has_repetition(p: &SampleParams) -> bool {
    p.repetition_penalty != 1.0 && p.repetition_penalty > 0.0
}

/// The penalties of `p` over `entries`: `(token, output count)` for every token of prompt ∪
/// output (prompt-only tokens count 0). A token listed twice is penalised once, its counts
/// added; tokens past the vocabulary are ignored.
pub fn apply_penalties(logits: &mut [f32], p: &SampleParams, entries: &[(u32, u32)]) {
    if !has_penalties(p) || entries.is_empty() {
        return;
    }
    let mut merged = entries.to_vec();
    merged.sort_unstable_by_key(|&(id, _)| id);
    merged.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 += later.1;
        }
        same
    });
    if has_repetition(p) {
        let rp = p.repetition_penalty;
        for &(id, _) in &merged {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = if *l > 0.0 { *l / rp } else { *l * rp };
            }
        }
    }
    if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
        for &(id, count) in merged.iter().filter(|e| e.1 > 0) {
            if let Some(l) = logits.get_mut(id as usize) {
                *l -= p.frequency_penalty * count as f32 + p.presence_penalty;
            }
        }
    }
}

/// Temperature, min_p, top_k, top_p, then one draw with the uniform `u` in [0, 1). `None` when
/// nothing is left to draw from. `logits` is scratch.
pub fn draw(logits: &mut [f32], p: &SampleParams, u: f64) -> Option<u32> {
    draw_probed(logits, p, u, Probe::default()).token
}

/// How [`draw_probed`] moves its limits, for tests of an implementation that sums the same
/// weights in another order: the top_p limit and the draw's target are scaled by these.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    pub top_p_scale: f64,
    pub target_scale: f64,
    /// Report whether a prefix sum lies within `1e-9` (relative) of the limit or the target.
    pub check_boundaries: bool,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            top_p_scale: 1.0,
            target_scale: 1.0,
            check_boundaries: false,
        }
    }
}

/// A draw, with what the path through the filters was.
#[derive(Debug, Clone, PartialEq)]
pub struct Draw {
    pub token: Option<u32>,
    /// A prefix sum lies within rounding of the top_p limit or the target (when probed).
    pub near_boundary: bool,
    /// The candidates were in probability order (top_k or top_p), not id order.
    pub sorted: bool,
    /// top_p removed candidates.
    pub top_p_cut: bool,
}

fn near(a: f64, b: f64) -> bool {
    let scale = a.abs().max(b.abs());
    scale > 0.0 && (a - b).abs() <= 1e-9 * scale
}

/// [`draw`], with its limits moved as `probe` says and the path reported.
pub fn draw_probed(logits: &mut [f32], p: &SampleParams, u: f64, probe: Probe) -> Draw {
    let mut out = Draw {
        token: None,
        near_boundary: false,
        sorted: false,
        top_p_cut: false,
    };
    let inv_t = 1.0 / p.temperature;
    let mut max = f32::NEG_INFINITY;
    for l in logits.iter_mut() {
        if l.is_nan() {
            *l = f32::NEG_INFINITY;
        }
        *l *= inv_t;
        max = max.max(*l);
    }
    if !max.is_finite() {
        return out;
    }
    // min_p: keep tokens whose probability is at least min_p times the top one's.
    let floor = if p.min_p > 0.0 {
        max + p.min_p.ln()
    } else {
        f32::NEG_INFINITY
    };
    let vocab = logits.len();
    let top_k = if p.top_k > 0 {
        (p.top_k as usize).min(vocab)
    } else {
        vocab
    };
    let mut cands: Vec<(u32, f32)> = if top_k < vocab {
        top_k_indices(logits, top_k)
    } else {
        logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect()
    };
    cands.retain(|&(_, l)| l > f32::NEG_INFINITY && l >= floor);
    if cands.is_empty() {
        return out;
    }
    let mut weights: Vec<f64> = cands
        .iter()
        .map(|&(_, l)| ((l - max) as f64).exp())
        .collect();
    let mut total: f64 = weights.iter().sum();
    if p.top_p < 1.0 {
        if top_k >= vocab {
            // Sort by probability (candidates from top_k_indices already are).
            let mut order: Vec<usize> = (0..cands.len()).collect();
            order.sort_unstable_by(|&a, &b| total_cmp_desc(&cands[a], &cands[b]));
            cands = order.iter().map(|&i| cands[i]).collect();
            weights = order.iter().map(|&i| weights[i]).collect();
        }
        let limit = p.top_p as f64 * total * probe.top_p_scale;
        let mut acc = 0.0;
        let mut keep = 0;
        for w in &weights {
            keep += 1;
            acc += w;
            if acc >= limit {
                break;
            }
        }
        if probe.check_boundaries {
            // Any prefix sum near the limit could end the kept prefix there instead.
            let mut run = 0.0;
            for w in &weights {
                run += w;
                out.near_boundary |= near(run, limit);
            }
        }
        out.top_p_cut = keep < cands.len();
        cands.truncate(keep);
        weights.truncate(keep);
        total = acc;
    }
    out.sorted = top_k < vocab || p.top_p < 1.0;
    let target = u * total * probe.target_scale;
    if probe.check_boundaries {
        let mut run = 0.0;
        for w in &weights {
            run += w;
            out.near_boundary |= near(run, target);
        }
    }
    let mut left = target;
    for (i, w) in weights.iter().enumerate() {
        if left < *w {
            out.token = Some(cands[i].0);
            return out;
        }
        left -= w;
    }
    out.token = cands.last().map(|c| c.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_penalty_entries_are_merged() {
        let p = SampleParams {
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            ..SampleParams::default()
        };
        let mut once = vec![4.0, -4.0, 1.0];
        apply_penalties(&mut once, &p, &[(0, 3), (1, 0)]);
        let mut split = vec![4.0, -4.0, 1.0];
        apply_penalties(&mut split, &p, &[(0, 1), (1, 0), (0, 2), (7, 1)]);
        assert_eq!(once, split);
        assert_eq!(once, vec![4.0 / 2.0 - 1.5, -8.0, 1.0]);
    }

    #[test]
    fn draws_follow_the_filters() {
        let logits = [0.0f32, 2.0, 1.0, f32::NAN, -1.0];
        let p = SampleParams {
            top_k: 2,
            ..SampleParams::default()
        };
        // Candidates 1 then 2: a target past 1's weight takes 2.
        let w1 = 1.0;
        let w2 = (-1.0f64).exp();
        let u_second = (w1 + 0.5 * w2) / (w1 + w2);
        assert_eq!(draw(&mut logits.clone(), &p, 0.0), Some(1));
        assert_eq!(draw(&mut logits.clone(), &p, u_second), Some(2));
        let min_p = SampleParams {
            min_p: 0.5,
            ..SampleParams::default()
        };
        assert_eq!(draw(&mut logits.clone(), &min_p, 0.999), Some(1));
        let top_p = SampleParams {
            top_p: 0.1,
            ..SampleParams::default()
        };
        let d = draw_probed(&mut logits.clone(), &top_p, 0.999, Probe::default());
        assert_eq!(d.token, Some(1));
        assert!(d.top_p_cut && d.sorted);
        assert_eq!(draw(&mut [f32::NAN, f32::NEG_INFINITY], &p, 0.5), None);
    }
}
