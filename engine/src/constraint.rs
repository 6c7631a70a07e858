//! Structured outputs and the other per-request token rules (`logit_bias`,
//! `allowed_token_ids`, `bad_words`), applied to one sequence's logits before sampling.
//!
//! Grammars go through llguidance, the engine vLLM's `guidance` backend uses. One
//! [`GuideFactory`] per model holds the token trie built from the tokenizer's vocabulary (built
//! on the first constrained request, on the caller's thread); a request's grammar is compiled
//! into a [`Matcher`] when it is submitted, also on the caller's thread, so the engine thread
//! only computes masks and advances matchers.
//!
//! A sequence's rules live in its [`crate::sampling::SequenceSampler`], which lives as long as
//! the sequence: a preempted sequence is recomputed without sampling again, so its matcher is
//! advanced exactly once per generated token.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use tokenizers::Tokenizer;

use crate::api::{Constraint, SamplingParams};
use crate::error::{EngineError, Result};

mod closer;

use closer::{json_schema_of, refuse_a_budget_below_the_shortest_reply, Closer};

/// Compiles grammars for one model's vocabulary.
pub struct GuideFactory {
    factory: ParserFactory,
    env: TokEnv,
    /// The trie's EOS id; every model EOS id maps to it when the matcher advances.
    eos: u32,
}

impl std::fmt::Debug for GuideFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuideFactory")
            .field("vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .field("eos", &self.eos)
            .finish()
    }
}

/// The vocabulary as llguidance sees it: each id's bytes, and our tokenizer for the text the
/// grammar forces.
struct VocabEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            match self.tokenizer.encode(text, false) {
                Ok(enc) => enc.get_ids().to_vec(),
                Err(_) => self.trie.greedy_tokenize(text.as_bytes()),
            }
        })
    }
}

/// The first line of an llguidance error (the rest dumps the parser's state, too much for a
/// client or a log line).
fn first_line(e: &impl std::fmt::Display) -> String {
    let text = e.to_string();
    text.lines().next().unwrap_or_default().to_string()
}

fn special_name(id: usize) -> Vec<u8> {
    let mut name = format!(".<[{id}]>").into_bytes();
    name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
    name
}

impl GuideFactory {
    /// Build the token trie over `model_vocab` ids (logit rows past the tokenizer's
    /// vocabulary become special tokens no grammar allows). `eos_token` is the model's EOS
    /// text, which the grammar's end maps to.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        model_vocab: usize,
        eos_token: Option<&str>,
    ) -> Result<Self> {
        let unsupported = |why: String| {
            EngineError::invalid(
                format!("structured outputs are not available for this model: {why}"),
                None,
            )
        };
        let json = tokenizer
            .to_string(false)
            .map_err(|e| unsupported(format!("cannot serialise the tokenizer: {e}")))?;
        let json: serde_json::Value = serde_json::from_str(&json)
            .map_err(|e| unsupported(format!("cannot read the tokenizer: {e}")))?;
        // llguidance asserts on vocabularies it does not understand; that is a refusal here.
        let mut words = catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
            .map_err(|_| unsupported("unrecognised vocabulary".into()))?
            .map_err(|e| unsupported(e.to_string()))?;
        let n = words
            .len()
            .max(model_vocab)
            .max(tokenizer.get_vocab_size(true));
        words.resize(n, Vec::new());
        for (id, w) in words.iter_mut().enumerate() {
            if w.is_empty() {
                *w = special_name(id);
            }
        }
        let eos = eos_token
            .and_then(|t| tokenizer.token_to_id(t))
            .ok_or_else(|| unsupported("the model names no EOS token".into()))?;
        let trie = TokTrie::from(&TokRxInfo::new(n as u32, eos), &words);
        let env: TokEnv = Arc::new(VocabEnv { trie, tokenizer });
        let mut factory = catch_unwind(AssertUnwindSafe(|| ParserFactory::new_simple(&env)))
            .map_err(|_| unsupported("the grammar engine failed to start".into()))?
            .map_err(|e| unsupported(e.to_string()))?;
        factory.quiet();
        Ok(GuideFactory { factory, env, eos })
    }

    /// Compile `c` into a fresh matcher; an unsupported or malformed grammar is an
    /// `InvalidRequest` naming what is wrong.
    pub fn compile(&self, c: &Constraint) -> Result<Matcher> {
        let (what, grammar) = grammar_of(c)?;
        // vLLM's other backends take GBNF; say so rather than leave a Lark parse error alone.
        let hint = match c {
            Constraint::Grammar(text) if text.contains("::=") => {
                " (GBNF rules `name ::= ...` are not supported: write the grammar in Lark syntax, `name: ...`)"
            }
            _ => "",
        };
        let invalid = |e: String| EngineError::invalid(format!("Invalid {what}: {e}{hint}"), None);
        let parser = catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(grammar)))
            .map_err(|_| invalid("the grammar compiler failed".into()))?
            .map_err(|e| invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(e) => Err(invalid(e)),
            None => Ok(matcher),
        }
    }
}

/// The whitespace JSON may hold between its tokens unless the request chose otherwise: none,
/// one space, or a newline with an indent of up to 20 spaces or tabs (the bound llama.cpp's
/// JSON grammars set). llguidance's default is any run of whitespace, on which a weak model can
/// spend its whole `max_tokens` and end with JSON that does not parse.
pub const BOUNDED_JSON_WHITESPACE: &str = r"( |
[ 	]{0,20})";

/// `schema` with the bounded whitespace, unless its `x-guidance` options already say how
/// whitespace goes (the gateway's `disable_any_whitespace` / `whitespace_pattern`, tool-call
/// arguments' compact JSON).
fn bounded_whitespace(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = match schema {
        serde_json::Value::Bool(true) => serde_json::json!({}),
        other => other.clone(),
    };
    if let Some(obj) = schema.as_object_mut() {
        let opts = obj
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(opts) = opts.as_object_mut() {
            let chosen = ["whitespace_pattern", "whitespace_flexible"]
                .iter()
                .any(|k| opts.contains_key(*k));
            if !chosen {
                opts.insert("whitespace_pattern".into(), BOUNDED_JSON_WHITESPACE.into());
            }
        }
    }
    schema
}

/// The llguidance grammar of a constraint, with a name for error messages.
fn grammar_of(c: &Constraint) -> Result<(&'static str, TopLevelGrammar)> {
    Ok(match c {
        Constraint::JsonObject => (
            "JSON object constraint",
            TopLevelGrammar::from_json_schema(bounded_whitespace(
                &serde_json::json!({"type": "object"}),
            )),
        ),
        Constraint::JsonSchema(schema) => {
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(EngineError::invalid(
                    "Invalid JSON schema: a schema must be an object or a boolean",
                    None,
                ));
            }
            (
                "JSON schema",
                TopLevelGrammar::from_json_schema(bounded_whitespace(schema)),
            )
        }
        Constraint::Regex(rx) => ("regex", TopLevelGrammar::from_regex(rx)),
        Constraint::Choice(choices) => {
            if choices.is_empty() {
                return Err(EngineError::invalid(
                    "Invalid choice: the list of choices is empty",
                    None,
                ));
            }
            // Lark string literals take JSON escapes, so JSON quoting is exact.
            let alternatives: Vec<String> = choices
                .iter()
                .map(|s| serde_json::Value::String(s.clone()).to_string())
                .collect();
            (
                "choice",
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | "))),
            )
        }
        Constraint::Grammar(text) => (
            "grammar",
            TopLevelGrammar::from_lark_or_grammar_list(text)
                .map_err(|e| EngineError::invalid(format!("Invalid grammar: {e}"), None))?,
        ),
    })
}

/// A request's token rules, compiled for the engine thread.
#[derive(Default)]
pub struct TokenRules {
    guide: Option<Guide>,
    /// Token sequences of the bad words (each at least one token).
    bad_words: Vec<Vec<u32>>,
    /// Sorted and deduplicated.
    allowed: Option<Vec<u32>>,
    logit_bias: Vec<(u32, f32)>,
    /// Generated tokens, kept only when a bad word spans several tokens.
    output: Vec<u32>,
}

struct Guide {
    matcher: Matcher,
    eos: u32,
    /// The next token's mask, computed ahead while the forward pass runs
    /// ([`TokenRules::prepare_mask`]).
    ready: Option<llguidance::toktrie::SimpleVob>,
    /// JSON constraints: what closes the reply when `max_tokens` is about to run out.
    closer: Option<Closer>,
}

impl std::fmt::Debug for TokenRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRules")
            .field("guided", &self.guide.is_some())
            .field("bad_words", &self.bad_words)
            .field("allowed", &self.allowed.as_ref().map(Vec::len))
            .field("logit_bias", &self.logit_bias.len())
            .finish()
    }
}

/// Check a request's token rules against the model and compile them. `vocab` is the model's
/// logit width; `guides` gives the model's grammar compiler (only called for a constraint).
/// `None` when the request has no such rules.
pub fn prepare(
    params: &SamplingParams,
    tokenizer: &Tokenizer,
    vocab: usize,
    guides: impl FnOnce() -> Result<Arc<GuideFactory>>,
) -> Result<Option<Box<TokenRules>>> {
    let bad: Vec<u32> = params
        .logit_bias
        .iter()
        .map(|&(id, _)| id)
        .filter(|&id| id as usize >= vocab)
        .collect();
    if !bad.is_empty() {
        return Err(EngineError::invalid(
            format!(
                "token_id(s) {bad:?} in logit_bias contain out-of-vocab token ids. Vocabulary size: {vocab}"
            ),
            Some("logit_bias"),
        ));
    }
    let allowed = match &params.allowed_token_ids {
        None => None,
        Some(ids) if ids.is_empty() => {
            return Err(EngineError::invalid(
                "allowed_token_ids is not None and empty!",
                Some("allowed_token_ids"),
            ))
        }
        Some(ids) if ids.iter().any(|&id| id as usize >= vocab) => {
            return Err(EngineError::invalid(
                "allowed_token_ids contains out-of-vocab token id!",
                Some("allowed_token_ids"),
            ))
        }
        Some(ids) => {
            let mut ids = ids.clone();
            ids.sort_unstable();
            ids.dedup();
            Some(ids)
        }
    };
    let bad_words = bad_word_ids(&params.bad_words, tokenizer, vocab)?;
    let guide = match &params.constraint {
        None => None,
        Some(c) => {
            let factory = guides()?;
            let closer = json_schema_of(c)
                .map(|schema| Closer::new(schema, factory.env.clone(), params.max_tokens));
            if let Some(closer) = &closer {
                refuse_a_budget_below_the_shortest_reply(closer, params.max_tokens)?;
            }
            Some(Guide {
                matcher: factory.compile(c)?,
                eos: factory.eos,
                ready: None,
                closer,
            })
        }
    };
    if guide.is_none() && bad_words.is_empty() && allowed.is_none() && params.logit_bias.is_empty()
    {
        return Ok(None);
    }
    Ok(Some(Box::new(TokenRules {
        guide,
        bad_words,
        allowed,
        logit_bias: params.logit_bias.clone(),
        output: Vec::new(),
    })))
}

/// vLLM's `SamplingParams.update_from_tokenizer`: each word as given (left-stripped) and with
/// a leading space, the spaced form only when it is a different first token of the same
/// length (a word that starts text and one inside it tokenise differently).
fn bad_word_ids(words: &[String], tokenizer: &Tokenizer, vocab: usize) -> Result<Vec<Vec<u32>>> {
    let mut out: Vec<Vec<u32>> = Vec::new();
    for word in words {
        let word = word.trim_start();
        let mut plain: Option<Vec<u32>> = None;
        for prefix in ["", " "] {
            let ids = tokenizer
                .encode(format!("{prefix}{word}"), false)
                .map_err(|e| EngineError::Internal(format!("tokenisation failed: {e}")))?
                .get_ids()
                .to_vec();
            if ids.is_empty() {
                continue;
            }
            match &plain {
                None => {
                    plain = Some(ids.clone());
                    out.push(ids);
                }
                Some(p) if p[0] != ids[0] && p.len() == ids.len() => out.push(ids),
                Some(_) => {}
            }
        }
    }
    let bad: Vec<u32> = out
        .iter()
        .flatten()
        .copied()
        .filter(|&id| id as usize >= vocab)
        .collect();
    if !bad.is_empty() {
        return Err(EngineError::invalid(
            format!(
                "The model vocabulary size is {vocab}, but the following tokens were specified as bad: {bad:?}. All token id values should be integers satisfying: 0 <= token_id <= {}.",
                vocab.saturating_sub(1)
            ),
            Some("bad_words"),
        ));
    }
    Ok(out)
}

impl TokenRules {
    /// True when there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.guide.is_none()
            && self.bad_words.is_empty()
            && self.allowed.is_none()
            && self.logit_bias.is_empty()
    }

    /// `allowed_token_ids`, `bad_words`, then `logit_bias`: vLLM applies these before the
    /// penalties, so the sampler calls this first.
    pub fn apply_rules(&self, logits: &mut [f32]) {
        if let Some(allowed) = &self.allowed {
            let mut next = allowed.iter().peekable();
            for (i, l) in logits.iter_mut().enumerate() {
                if next.next_if(|&&id| id as usize == i).is_none() {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for word in &self.bad_words {
            let (last, prefix) = match word.split_last() {
                Some(x) => x,
                None => continue,
            };
            if self.output.ends_with(prefix) {
                if let Some(l) = logits.get_mut(*last as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for &(id, bias) in &self.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
    }

    /// The structured-output grammar's mask (EOS allowed by the grammar allows every id in
    /// `eos_ids`). A mask only removes tokens, so where it runs among the other transforms
    /// changes nothing but the logprobs, which stay the raw model's.
    pub fn apply_grammar(&mut self, logits: &mut [f32], eos_ids: &[u32]) -> Result<()> {
        if let Some(g) = &mut self.guide {
            let mask = match g.ready.take() {
                Some(mask) => mask,
                None => g.matcher.compute_mask_or_eos().map_err(|e| {
                    EngineError::Internal(format!("structured output mask: {}", first_line(&e)))
                })?,
            };
            // The trie knows one EOS; the model may end on any of its EOS ids.
            let eos_kept: Vec<(usize, f32)> = if mask.is_allowed(g.eos) {
                eos_ids
                    .iter()
                    .filter_map(|&id| logits.get(id as usize).map(|&l| (id as usize, l)))
                    .collect()
            } else {
                Vec::new()
            };
            // A forced completion allows its next token only (the logprobs stay the model's).
            if let Some(next) = g.closer.as_ref().and_then(|c| c.forced.front()) {
                let keep = logits.get(*next as usize).copied();
                logits.fill(f32::NEG_INFINITY);
                if let Some(l) = keep {
                    logits[*next as usize] = if l.is_finite() { l } else { 0.0 };
                }
                return Ok(());
            }
            let words = mask.as_slice();
            for (w, chunk) in logits.chunks_mut(32).enumerate() {
                let bits = words.get(w).copied().unwrap_or(0);
                if bits == u32::MAX {
                    continue;
                }
                if bits == 0 {
                    chunk.fill(f32::NEG_INFINITY);
                    continue;
                }
                for (b, l) in chunk.iter_mut().enumerate() {
                    if bits & (1 << b) == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            for (id, l) in eos_kept {
                logits[id] = l;
            }
        }
        Ok(())
    }

    /// Computes the next token's grammar mask now (the engine does it on another thread while
    /// the forward pass runs); [`TokenRules::apply_grammar`] then uses it. A failure is left for
    /// `apply_grammar` to report.
    pub fn prepare_mask(&mut self) {
        if let Some(g) = &mut self.guide {
            if g.ready.is_none() {
                g.ready = g.matcher.compute_mask_or_eos().ok();
            }
        }
    }

    /// True when a grammar mask is computed per token.
    pub fn is_guided(&self) -> bool {
        self.guide.is_some()
    }

    /// The token to emit in place of `token`, sampled under the grammar's mask, when taking it
    /// would leave too few tokens for the shortest valid completion: the first token of that
    /// completion, whose rest is forced from then on. `None`: keep `token`.
    pub fn close_before(&mut self, token: u32, eos_ids: &[u32]) -> Option<u32> {
        let g = self.guide.as_mut()?;
        g.closer
            .as_mut()?
            .close_before(&mut g.matcher, token, eos_ids)
    }

    /// True when the budget closed the reply early ([`TokenRules::close_before`]).
    pub fn was_closed(&self) -> bool {
        self.guide
            .as_ref()
            .and_then(|g| g.closer.as_ref())
            .is_some_and(|c| c.closed)
    }

    /// The number of tokens the sequence may generate (`max_tokens` as the scheduler clamped
    /// it to the context).
    pub fn set_budget(&mut self, budget: usize) {
        if let Some(c) = self.guide.as_mut().and_then(|g| g.closer.as_mut()) {
            c.budget = budget;
        }
    }

    /// Advance with the sampled token.
    pub fn record(&mut self, token: u32, eos_ids: &[u32]) -> Result<()> {
        if self.bad_words.iter().any(|w| w.len() > 1) {
            self.output.push(token);
        }
        if let Some(g) = &mut self.guide {
            // A mask computed ahead belongs to the position just filled.
            g.ready = None;
            if let Some(c) = &mut g.closer {
                if c.forced.front() == Some(&token) {
                    c.forced.pop_front();
                }
                c.generated.push(token);
            }
            if g.matcher.is_stopped() {
                return Ok(());
            }
            let t = if eos_ids.contains(&token) {
                g.eos
            } else {
                token
            };
            g.matcher.consume_token(t).map_err(|e| {
                EngineError::Internal(format!(
                    "structured output rejected token {token}: {}",
                    first_line(&e)
                ))
            })?;
        }
        Ok(())
    }

    /// True once the grammar can take no further token: the sequence is complete.
    pub fn is_complete(&self) -> bool {
        self.guide.as_ref().is_some_and(|g| g.matcher.is_stopped())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rules(bias: Vec<(u32, f32)>, allowed: Option<Vec<u32>>, bad: Vec<Vec<u32>>) -> TokenRules {
        TokenRules {
            logit_bias: bias,
            allowed,
            bad_words: bad,
            ..Default::default()
        }
    }

    #[test]
    fn allowed_ids_and_bias() {
        let r = rules(vec![(0, 5.0), (2, -1.0)], Some(vec![0, 2]), Vec::new());
        let mut l = vec![1.0; 4];
        r.apply_rules(&mut l);
        assert_eq!(l, vec![6.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]);
    }

    #[test]
    fn bad_words_ban_the_last_token_after_the_rest() {
        let mut r = rules(Vec::new(), None, vec![vec![3], vec![1, 2]]);
        let mut l = vec![0.0; 4];
        r.apply_rules(&mut l);
        assert_eq!(l, vec![0.0, 0.0, 0.0, f32::NEG_INFINITY]);
        r.record(1, &[]).unwrap();
        let mut l = vec![0.0; 4];
        r.apply_rules(&mut l);
        assert_eq!(l, vec![0.0, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        r.record(0, &[]).unwrap();
        let mut l = vec![0.0; 4];
        r.apply_rules(&mut l);
        assert_eq!(l[2], 0.0);
    }

    #[test]
    fn logit_bias_comes_before_the_penalties() {
        let p = SamplingParams {
            temperature: 0.0,
            repetition_penalty: 2.0,
            logit_bias: vec![(1, 3.0)],
            ..Default::default()
        };
        let tok = tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default());
        let rules = prepare(&p, &tok, 3, || {
            Err(EngineError::Internal("no grammar here".into()))
        })
        .unwrap();
        let mut s = crate::sampling::SequenceSampler::new(&p, &[1]).with_rules(rules);
        let mut l = vec![0.0, 1.0, 0.5];
        s.sample(&mut l, &[], &mut rand::SeedableRng::seed_from_u64(7))
            .unwrap();
        // vLLM: (1 + 3) / 2, not 1 / 2 + 3.
        assert_eq!(l, vec![0.0, 2.0, 0.5]);
    }
}
