//! Wire types, one file per route family. Requests parse straight from the body bytes
//! (see [`crate::http::extract`]); unknown fields are accepted and ignored.

pub mod chat;
pub mod completion;
pub mod fields;
pub mod pooling;
pub mod sampling;
pub mod structured;
pub mod tokenize;

use serde::Serialize;
use serde_json::value::RawValue;

/// `mm_processor_kwargs` / `media_io_kwargs` as the client sent them: the JSON text, checked
/// for syntax by the parse but not built into a value. The gate refuses most requests that
/// carry one from its text alone ([`is_non_empty_object`]); a value is built only for the
/// requests that go on (see [`crate::policy::RequestKwargs`]).
pub type RawKwargs = Box<RawValue>;

/// True when the JSON text is an object with at least one key.
pub fn is_non_empty_object(raw: &RawValue) -> bool {
    let text = raw.get().trim_ascii_start();
    text.strip_prefix('{')
        .is_some_and(|rest| !rest.trim_ascii_start().starts_with('}'))
}

#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
    pub completion_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
        }
    }

    /// With `prompt_tokens_details` when `enabled` (`--enable-prompt-tokens-details`) and
    /// prompt tokens came from the prefix cache, as vLLM sends it.
    pub fn with_cached(mut self, cached_tokens: usize, enabled: bool) -> Self {
        if enabled && cached_tokens > 0 {
            self.prompt_tokens_details = Some(PromptTokensDetails { cached_tokens });
        }
        self
    }
}

/// Seconds since the epoch, for `created`.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
