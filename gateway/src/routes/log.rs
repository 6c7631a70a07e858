//! `--enable-log-requests`: one info line per generation request as it is handed to the
//! engine, for operators tracing what a client sent.

use engine::api::SamplingParams;
use engine::handle::ModelHandle;

/// The request log's settings.
#[derive(Debug, Clone, Copy)]
pub struct RequestLog {
    /// `--max-log-len`: the most characters of the prompt a line shows (all without it).
    pub max_len: Option<usize>,
}

impl RequestLog {
    /// Logs a request: its id, route, model, prompt length and text (cut at `max_len`
    /// characters) and its sampling parameters.
    pub fn log(
        &self,
        request_id: impl std::fmt::Display,
        route: &str,
        model: &ModelHandle,
        prompt: &[u32],
        params: &SamplingParams,
    ) {
        let text = model.decode(prompt, false).unwrap_or_default();
        let shown: String = match self.max_len {
            Some(max) => text.chars().take(max).collect(),
            None => text,
        };
        tracing::info!(
            request_id = %request_id,
            route,
            model = %model.card().name,
            prompt_tokens = prompt.len(),
            prompt = ?shown,
            params = ?params,
            "received request"
        );
    }
}
