//! Turning one step's logits into the next token, with vLLM's semantics.
//!
//! The semantics (the order of operations, masks, penalties, filters, logprobs) are written
//! once, in [`kernels::sampling`]; this is the per-sequence state around them: the request's
//! parameters, its seeded RNG, the penalty bookkeeping, and the token rules and grammar
//! ([`crate::constraint`]), which run at steps 3 and 5 of that order.
//!
//! A seeded request draws from its own `StdRng` (one draw per sampled token), so the same seed
//! gives the same tokens whatever else runs in the batch; unseeded requests share the engine's
//! RNG.

use std::collections::{HashMap, HashSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use kernels::gpu::ops::{SampleRow, SampledRow};
use kernels::sampling::{self as semantics, SampleParams};
pub use kernels::sampling::{argmax, top_k_indices, GREEDY_EPS};

use crate::api::{PromptLogprob, SamplingParams, StepLogprobs, TokenLogprob};
use crate::constraint::TokenRules;
use crate::error::{EngineError, Result};

/// The outcome of sampling one token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprobs: Option<StepLogprobs>,
}

/// Per-sequence sampling state: parameters, the seeded RNG and penalty bookkeeping. It lives as
/// long as the sequence (across preemption), so a recomputed sequence continues identically.
#[derive(Debug)]
pub struct SequenceSampler {
    params: SamplingParams,
    rng: Option<StdRng>,
    output_counts: HashMap<u32, u32>,
    /// Distinct prompt tokens; only built when a repetition penalty is set.
    prompt_set: HashSet<u32>,
    generated: usize,
    /// Structured output and the other token rules; `None` when the request has none.
    rules: Option<Box<TokenRules>>,
}

/// A prompt token's entry from the logits of the position before it: its raw logprob, its
/// rank (vLLM's: 1 + the tokens at least as likely, itself excluded) and the top `k`
/// alternatives, all from the same `log_softmax` as the sampled tokens' logprobs.
pub fn prompt_logprob(logits: &[f32], token: u32, k: usize) -> Result<PromptLogprob> {
    let norm = semantics::log_normaliser(logits)
        .ok_or_else(|| EngineError::Internal("the model produced no finite logit".into()))?;
    let logprob_of = |v: f32| semantics::logprob(v, norm);
    let own = logits
        .get(token as usize)
        .copied()
        .ok_or_else(|| EngineError::Internal(format!("prompt token {token} is past the logits")))?;
    let rank = if own.is_nan() {
        logits.len()
    } else {
        logits.iter().filter(|&&v| v >= own).count().max(1)
    };
    let top = top_k_indices(logits, k)
        .into_iter()
        .map(|(id, v)| TokenLogprob {
            id,
            logprob: logprob_of(v),
        })
        .collect();
    Ok(PromptLogprob {
        token_id: token,
        logprob: logprob_of(own),
        rank,
        top,
    })
}

impl SequenceSampler {
    pub fn new(params: &SamplingParams, prompt: &[u32]) -> Self {
        let prompt_set = if params.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            HashSet::new()
        };
        SequenceSampler {
            params: params.clone(),
            rng: params.seed.map(StdRng::seed_from_u64),
            output_counts: HashMap::new(),
            prompt_set,
            generated: 0,
            rules: None,
        }
    }

    /// This sampler with the request's compiled token rules.
    pub fn with_rules(mut self, rules: Option<Box<TokenRules>>) -> Self {
        self.rules = rules.filter(|r| !r.is_empty());
        self
    }

    /// The tokens this sequence may generate (`max_tokens` clamped to the context), which a
    /// JSON reply must close within.
    pub fn with_budget(mut self, budget: usize) -> Self {
        if let Some(r) = &mut self.rules {
            r.set_budget(budget);
        }
        self
    }

    /// True when `max_tokens` closed a structured reply early: it ends as `length`.
    pub fn was_closed_by_budget(&self) -> bool {
        self.rules.as_ref().is_some_and(|r| r.was_closed())
    }

    /// True when the request has token rules (a device sampler cannot apply them: such rows
    /// are sampled on the host).
    pub fn needs_host(&self) -> bool {
        self.rules.is_some()
    }

    /// True when each token needs a grammar mask ([`SequenceSampler::prepare_mask`]).
    pub fn is_guided(&self) -> bool {
        self.rules.as_ref().is_some_and(|r| r.is_guided())
    }

    /// Computes the next token's grammar mask ahead of sampling.
    pub fn prepare_mask(&mut self) {
        if let Some(r) = &mut self.rules {
            r.prepare_mask();
        }
    }

    /// True once the structured-output grammar is complete: the sequence stops.
    pub fn is_complete(&self) -> bool {
        self.rules.as_ref().is_some_and(|r| r.is_complete())
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    pub fn is_greedy(&self) -> bool {
        self.params.temperature < GREEDY_EPS
    }

    /// Tokens generated so far (as recorded).
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Record a generated token (for penalties, `min_tokens`, bad words and the grammar).
    /// Called once per generated token: a recomputed sequence does not record again.
    pub fn record(&mut self, token: u32, eos_ids: &[u32]) -> Result<()> {
        *self.output_counts.entry(token).or_insert(0) += 1;
        self.generated += 1;
        match self.rules.as_mut() {
            Some(r) => r.record(token, eos_ids),
            None => Ok(()),
        }
    }

    /// Sample the next token from `logits` (modified in place). `eos_ids` are the model's EOS
    /// ids; `global` is the engine RNG used when the request has no seed.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        eos_ids: &[u32],
        global: &mut StdRng,
    ) -> Result<Sampled> {
        let vocab = logits.len();
        let logprobs = match self.params.logprobs {
            Some(k) => Some(self.raw_logprobs(logits, k)?),
            None => None,
        };

        if self.generated < self.params.min_tokens {
            semantics::mask(logits, self.min_tokens_masked(eos_ids));
        }
        if let Some(r) = &self.rules {
            r.apply_rules(logits);
        }
        let params = self.sample_params();
        if semantics::has_penalties(&params) {
            semantics::apply_penalties(logits, &params, &self.penalty_entries());
        }
        if let Some(r) = self.rules.as_mut() {
            r.apply_grammar(logits, eos_ids)?;
        }

        let token = if self.is_greedy() {
            argmax(logits)
        } else {
            let u = match self.rng.as_mut() {
                Some(r) => r.random::<f64>(),
                None => global.random::<f64>(),
            };
            semantics::draw(logits, &params, u)
        };
        let token = token.ok_or_else(|| match self.rules {
            Some(_) => EngineError::invalid(
                "no token satisfies the request: its structured output, logit_bias, allowed_token_ids, bad_words and min_tokens exclude every token",
                None,
            ),
            None => EngineError::Internal(format!("no finite logit to sample from (vocab {vocab})")),
        })?;
        // A JSON reply about to outrun max_tokens closes instead (its logprob is the model's).
        let token = self
            .rules
            .as_mut()
            .and_then(|r| r.close_before(token, eos_ids))
            .unwrap_or(token);
        let logprobs = logprobs.map(|(norm, top)| StepLogprobs {
            token_id: token,
            logprob: norm.get(token as usize).unwrap_or(f32::NEG_INFINITY),
            top,
        });
        Ok(Sampled { token, logprobs })
    }

    /// This step's draw as the device sampler takes it (`kernels::gpu::ops::Sampler`): the
    /// parameters, the penalised tokens with their output counts, the ids `min_tokens` masks,
    /// and the uniform, drawn from this sequence's RNG (or `global` when unseeded) exactly when
    /// [`SequenceSampler::sample`] would draw it, so a seeded request gets the same stream on
    /// either device.
    pub fn device_row(&mut self, eos_ids: &[u32], global: &mut StdRng) -> SampleRow {
        let params = self.sample_params();
        let penalties = if semantics::has_penalties(&params) {
            self.penalty_entries()
        } else {
            Vec::new()
        };
        let masked = if self.generated < self.params.min_tokens {
            self.min_tokens_masked(eos_ids).collect()
        } else {
            Vec::new()
        };
        let uniform = if self.is_greedy() {
            0.0
        } else {
            match self.rng.as_mut() {
                Some(r) => r.random::<f64>(),
                None => global.random::<f64>(),
            }
        };
        SampleRow {
            params,
            penalties,
            masked,
            uniform,
        }
    }

    /// The request's parameters as the sampling semantics take them.
    fn sample_params(&self) -> SampleParams {
        let p = &self.params;
        SampleParams {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            frequency_penalty: p.frequency_penalty,
            presence_penalty: p.presence_penalty,
            logprobs: p.logprobs,
        }
    }

    /// `(token, output count)` for every distinct token the penalties look at: the output's,
    /// and the prompt's others (count 0) when a repetition penalty is set.
    fn penalty_entries(&self) -> Vec<(u32, u32)> {
        let mut entries: Vec<(u32, u32)> =
            self.output_counts.iter().map(|(&id, &c)| (id, c)).collect();
        entries.extend(
            self.prompt_set
                .iter()
                .filter(|id| !self.output_counts.contains_key(id))
                .map(|&id| (id, 0)),
        );
        entries
    }

    /// The ids `min_tokens` masks: the stop ids, and EOS unless `ignore_eos`.
    fn min_tokens_masked<'a>(&'a self, eos_ids: &'a [u32]) -> impl Iterator<Item = u32> + 'a {
        let eos = eos_ids.iter().filter(|_| !self.params.ignore_eos);
        self.params.stop_token_ids.iter().chain(eos).copied()
    }

    /// A device sampler's outcome as [`SequenceSampler::sample`] reports it.
    pub fn from_device(&self, row: SampledRow) -> Sampled {
        let logprobs = self.params.logprobs.map(|_| StepLogprobs {
            token_id: row.token,
            logprob: row.logprob.unwrap_or(f32::NEG_INFINITY),
            top: row
                .top
                .iter()
                .map(|&(id, logprob)| TokenLogprob { id, logprob })
                .collect(),
        });
        Sampled {
            token: row.token,
            logprobs,
        }
    }

    /// The raw distribution's logprob of every token (lazily: only the chosen one is read later)
    /// and its top `k` entries.
    fn raw_logprobs(&self, logits: &[f32], k: usize) -> Result<(RawLogprobs, Vec<TokenLogprob>)> {
        let norm = semantics::log_normaliser(logits)
            .ok_or_else(|| EngineError::Internal("the model produced no finite logit".into()))?;
        let raw = RawLogprobs {
            logits: logits.to_vec(),
            norm,
        };
        let top = top_k_indices(logits, k)
            .into_iter()
            .map(|(id, _)| TokenLogprob {
                id,
                logprob: raw.get(id as usize).unwrap_or(f32::NEG_INFINITY),
            })
            .collect();
        Ok((raw, top))
    }
}

/// The raw logits with their `log_softmax` normaliser.
#[derive(Debug)]
struct RawLogprobs {
    logits: Vec<f32>,
    norm: (f64, f64),
}

impl RawLogprobs {
    fn get(&self, i: usize) -> Option<f32> {
        self.logits
            .get(i)
            .map(|&v| semantics::logprob(v, self.norm))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn params() -> SamplingParams {
        SamplingParams::default()
    }

    fn rng() -> StdRng {
        StdRng::seed_from_u64(7)
    }

    #[test]
    fn greedy_takes_argmax_first_on_ties() {
        let p = SamplingParams {
            temperature: 0.0,
            ..params()
        };
        let mut s = SequenceSampler::new(&p, &[]);
        let mut l = vec![0.0, 3.0, 3.0, -1.0];
        assert_eq!(s.sample(&mut l, &[], &mut rng()).unwrap().token, 1);
        let mut bad = vec![f32::NAN, f32::NEG_INFINITY];
        assert!(s.sample(&mut bad, &[], &mut rng()).is_err());
    }

    #[test]
    fn top_k_one_is_greedy() {
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..params()
        };
        let mut s = SequenceSampler::new(&p, &[]);
        for _ in 0..20 {
            let mut l = vec![0.5, 0.1, 0.9, 0.8];
            assert_eq!(s.sample(&mut l, &[], &mut rng()).unwrap().token, 2);
        }
    }

    #[test]
    fn top_p_and_min_p_restrict_support() {
        // Probabilities ~ [0.643, 0.237, 0.087, 0.032].
        let base = vec![3.0, 2.0, 1.0, 0.0];
        let p = SamplingParams {
            top_p: 0.6,
            ..params()
        };
        let mut s = SequenceSampler::new(&p, &[]);
        let mut g = rng();
        for _ in 0..50 {
            assert_eq!(s.sample(&mut base.clone(), &[], &mut g).unwrap().token, 0);
        }
        let p = SamplingParams {
            top_p: 0.85,
            ..params()
        };
        let mut s = SequenceSampler::new(&p, &[]);
        let mut seen = HashSet::new();
        for _ in 0..200 {
            seen.insert(s.sample(&mut base.clone(), &[], &mut g).unwrap().token);
        }
        assert_eq!(seen, HashSet::from([0, 1]));
        // min_p 0.3: tokens with p >= 0.3 * 0.643 = 0.193 -> {0, 1}.
        let p = SamplingParams {
            min_p: 0.3,
            ..params()
        };
        let mut s = SequenceSampler::new(&p, &[]);
        let mut seen = HashSet::new();
        for _ in 0..200 {
            seen.insert(s.sample(&mut base.clone(), &[], &mut g).unwrap().token);
        }
        assert_eq!(seen, HashSet::from([0, 1]));
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let p = params();
        let mut s = SequenceSampler::new(&p, &[]);
        let mut g = rng();
        let mut counts = [0usize; 2];
        let n = 4000;
        for _ in 0..n {
            // p = [0.731, 0.269]
            let mut l = vec![1.0, 0.0];
            counts[s.sample(&mut l, &[], &mut g).unwrap().token as usize] += 1;
        }
        let frac = counts[0] as f64 / n as f64;
        assert!((frac - 0.731).abs() < 0.03, "{frac}");
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_independent_of_global_rng() {
        let p = SamplingParams {
            seed: Some(42),
            ..params()
        };
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |global_seed: u64| {
            let mut s = SequenceSampler::new(&p, &[]);
            let mut g = StdRng::seed_from_u64(global_seed);
            (0..30)
                .map(|_| {
                    let t = s.sample(&mut logits.clone(), &[], &mut g).unwrap().token;
                    s.record(t, &[]).unwrap();
                    t
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(2));
        let other = SamplingParams {
            seed: Some(43),
            ..params()
        };
        let mut s = SequenceSampler::new(&other, &[]);
        let mut g = rng();
        let alt: Vec<u32> = (0..30)
            .map(|_| s.sample(&mut logits.clone(), &[], &mut g).unwrap().token)
            .collect();
        assert_ne!(alt, run(1));
    }

    #[test]
    fn repetition_penalty_hf_semantics() {
        let p = SamplingParams {
            temperature: 0.0,
            repetition_penalty: 2.0,
            ..params()
        };
        let mut s = SequenceSampler::new(&p, &[0]);
        s.record(1, &[]).unwrap();
        let mut l = vec![4.0, -1.0, 1.5, 0.0];
        s.sample(&mut l, &[], &mut rng()).unwrap();
        assert_eq!(l, vec![2.0, -2.0, 1.5, 0.0]);
    }

    #[test]
    fn presence_and_frequency_over_output_only() {
        let p = SamplingParams {
            temperature: 0.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..params()
        };
        let mut s = SequenceSampler::new(&p, &[3]);
        s.record(0, &[]).unwrap();
        s.record(0, &[]).unwrap();
        s.record(1, &[]).unwrap();
        let mut l = vec![1.0, 1.0, 1.0, 1.0];
        s.sample(&mut l, &[], &mut rng()).unwrap();
        assert_eq!(l, vec![0.0, 0.25, 1.0, 1.0]);
    }

    #[test]
    fn min_tokens_masks_eos_and_stop_ids() {
        let p = SamplingParams {
            temperature: 0.0,
            min_tokens: 2,
            stop_token_ids: vec![1],
            ..params()
        };
        let mut s = SequenceSampler::new(&p, &[]);
        let l = vec![9.0, 8.0, 7.0, 0.0];
        let t = s.sample(&mut l.clone(), &[0], &mut rng()).unwrap().token;
        assert_eq!(t, 2);
        s.record(t, &[]).unwrap();
        assert_eq!(s.sample(&mut l.clone(), &[0], &mut rng()).unwrap().token, 2);
        s.record(2, &[]).unwrap();
        assert_eq!(s.sample(&mut l.clone(), &[0], &mut rng()).unwrap().token, 0);
        // ignore_eos leaves EOS unmasked (it is not a stop token then).
        let p = SamplingParams {
            ignore_eos: true,
            ..p
        };
        let mut s = SequenceSampler::new(&p, &[]);
        assert_eq!(s.sample(&mut l.clone(), &[0], &mut rng()).unwrap().token, 0);
    }

    #[test]
    fn logprobs_are_raw_distribution() {
        let p = SamplingParams {
            temperature: 0.0,
            repetition_penalty: 10.0,
            logprobs: Some(2),
            ..params()
        };
        let mut s = SequenceSampler::new(&p, &[0]);
        let mut l = vec![2.0, 1.0, 0.0];
        let out = s.sample(&mut l, &[], &mut rng()).unwrap();
        // The penalty moved the choice to token 1, logprobs still describe the raw logits.
        assert_eq!(out.token, 1);
        let lp = out.logprobs.unwrap();
        let lse = (2f64.exp() + 1f64.exp() + 1.0).ln();
        assert!((lp.logprob as f64 - (1.0 - lse)).abs() < 1e-6);
        assert_eq!(lp.top.len(), 2);
        assert_eq!(lp.top[0].id, 0);
        assert!((lp.top[0].logprob as f64 - (2.0 - lse)).abs() < 1e-6);
        assert_eq!(lp.top[1].id, 1);
    }

    #[test]
    fn prompt_logprob_ranks_the_token_among_the_raw_distribution() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let lse = logits.iter().map(|&v| (v as f64).exp()).sum::<f64>().ln();
        let e = prompt_logprob(&logits, 2, 2).unwrap();
        assert_eq!(e.token_id, 2);
        assert!((e.logprob as f64 - (2.0 - lse)).abs() < 1e-6);
        // Both 3.0s rank ahead of it.
        assert_eq!(e.rank, 3);
        let ids: Vec<u32> = e.top.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![1, 3]);
        assert!((e.top[0].logprob as f64 - (3.0 - lse)).abs() < 1e-6);
        // A tie with the best counts the tie ahead; k = 0 still reports the token.
        let tied = prompt_logprob(&logits, 3, 0).unwrap();
        assert_eq!(tied.rank, 2);
        assert!(tied.top.is_empty());
        assert!(prompt_logprob(&logits, 4, 1).is_err());
    }

    #[test]
    fn top_k_indices_selects_best() {
        let v = vec![0.1, 5.0, f32::NAN, 3.0, 5.0];
        let top = top_k_indices(&v, 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 4, 3]);
        assert!(top_k_indices(&v, 0).is_empty());
        assert_eq!(top_k_indices(&v, 10).len(), 5);
    }
}
