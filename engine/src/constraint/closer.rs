//! Closing a JSON reply before `max_tokens` cuts it: the shortest valid ending
//! (`crate::json_close`), forced one token per step from the sampled token that would leave
//! too few tokens for it.

use std::collections::VecDeque;

use llguidance::toktrie::TokEnv;
use llguidance::Matcher;

use crate::api::Constraint;
use crate::error::{EngineError, Result};

/// Ends a JSON reply that would otherwise be cut by `max_tokens`: once a free token would
/// leave too few tokens for the shortest valid completion, the rest of the reply is that
/// completion (`json_close`), one forced token per step.
pub(super) struct Closer {
    pub(super) schema: serde_json::Value,
    pub(super) env: TokEnv,
    /// Tokens the sequence may generate in all.
    pub(super) budget: usize,
    pub(super) generated: Vec<u32>,
    pub(super) forced: VecDeque<u32>,
    /// True once the reply was closed early by the budget.
    pub(super) closed: bool,
}

/// Completions are only worked out this close to the budget (in tokens): no schema's shortest
/// completion in practice needs more, and before it the closer costs nothing.
const CLOSE_WINDOW: usize = 256;

/// How many tokens before the last moment a reply closes when the ending after the sampled
/// token cannot be worked out (inside a `pattern` string, say).
const UNKNOWN_MARGIN: usize = 8;

impl Closer {
    pub(super) fn new(schema: serde_json::Value, env: TokEnv, budget: usize) -> Self {
        Closer {
            schema,
            env,
            budget,
            generated: Vec::new(),
            forced: VecDeque::new(),
            closed: false,
        }
    }

    /// The tokens of the shortest valid completion after `tokens`, if this can tell.
    pub(super) fn completion_after(&self, tokens: &[u32]) -> Option<Vec<u32>> {
        let trie = self.env.tok_trie();
        let text = String::from_utf8_lossy(&trie.decode(tokens)).into_owned();
        let tail = crate::json_close::shortest_completion(&self.schema, &text)?;
        Some(self.env.tokenize_bytes(tail.as_bytes()))
    }

    pub(super) fn remaining(&self) -> usize {
        self.budget.saturating_sub(self.generated.len())
    }

    /// The token to emit in place of `token` (see `TokenRules::close_before`), or `None`.
    pub(super) fn close_before(
        &mut self,
        matcher: &mut Matcher,
        token: u32,
        eos_ids: &[u32],
    ) -> Option<u32> {
        if !self.forced.is_empty() || eos_ids.contains(&token) || self.remaining() > CLOSE_WINDOW {
            return None;
        }
        let mut after = self.generated.clone();
        after.push(token);
        let left_after = self.remaining().saturating_sub(1);
        let after = self.completion_after(&after);
        if after.as_ref().is_some_and(|tail| tail.len() <= left_after) {
            return None;
        }
        let now = self.completion_after(&self.generated)?;
        if now.is_empty() || now.len() > self.remaining() {
            return None;
        }
        // Where the ending after this token cannot be worked out, close only once the budget
        // is near (within a few tokens of what closing needs now).
        if after.is_none() && now.len() + UNKNOWN_MARGIN < self.remaining() {
            return None;
        }
        // Only a completion the grammar takes whole is forced.
        if matcher.validate_tokens(&now).ok()? != now.len() {
            return None;
        }
        self.forced = now.into();
        self.closed = true;
        self.forced.front().copied()
    }
}

/// The JSON Schema a JSON constraint holds (`json_object` is any object).
pub(super) fn json_schema_of(c: &Constraint) -> Option<serde_json::Value> {
    match c {
        Constraint::JsonObject => Some(serde_json::json!({"type": "object"})),
        Constraint::JsonSchema(s) => Some(s.clone()),
        _ => None,
    }
}

/// A `max_tokens` that cannot hold the shortest reply the schema accepts is the request's
/// error, not a reply cut short.
pub(super) fn refuse_a_budget_below_the_shortest_reply(
    closer: &Closer,
    max_tokens: usize,
) -> Result<()> {
    if let Some(shortest) = closer.completion_after(&[]) {
        if shortest.len() > max_tokens {
            return Err(EngineError::invalid(
                format!(
                    "max_tokens ({max_tokens}) is too small for the shortest JSON the schema accepts ({} tokens)",
                    shortest.len()
                ),
                Some("max_tokens"),
            ));
        }
    }
    Ok(())
}
