//! Incremental detokenisation and stop strings.
//!
//! [`IncrementalDetokenizer`] turns generated ids into text one id at a time. It decodes a small
//! window (a few already emitted ids plus the new ones) and emits only what the new ids added,
//! holding everything back while the window's text ends in U+FFFD (an incomplete UTF-8
//! character split over byte tokens). The window starts with the prompt's last ids so that the
//! first generated token decodes in context (a leading space is kept, as vLLM does).
//!
//! [`StopMatcher`] finds stop strings in that text across token boundaries. Text that could still
//! be the beginning of a stop string is held back until it is known not to be; the output is cut
//! at the stop string (kept when `include_stop_str_in_output`).

use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::error::{EngineError, Result};

/// Prompt ids used as decoding context for the first generated ids (vLLM's
/// `INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET`).
const CONTEXT_IDS: usize = 5;

const REPLACEMENT: char = '\u{FFFD}';

/// Streams text out of generated token ids without ever splitting a UTF-8 character.
pub struct IncrementalDetokenizer {
    tokenizer: Arc<Tokenizer>,
    ids: Vec<u32>,
    /// Start of the decode window.
    prefix_offset: usize,
    /// Ids before this were already turned into emitted text.
    read_offset: usize,
    skip_special_tokens: bool,
}

impl std::fmt::Debug for IncrementalDetokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IncrementalDetokenizer")
            .field("ids", &self.ids)
            .field("prefix_offset", &self.prefix_offset)
            .field("read_offset", &self.read_offset)
            .finish()
    }
}

fn decode(tok: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
    if ids.is_empty() {
        return Ok(String::new());
    }
    tok.decode(ids, skip_special_tokens)
        .map_err(|e| EngineError::Internal(format!("detokenisation failed: {e}")))
}

impl IncrementalDetokenizer {
    /// `prompt_ids`: the prompt, whose last few ids serve as decoding context.
    pub fn new(tokenizer: Arc<Tokenizer>, prompt_ids: &[u32], skip_special_tokens: bool) -> Self {
        let start = prompt_ids.len().saturating_sub(CONTEXT_IDS);
        let mut context = prompt_ids[start..].to_vec();
        // A context that itself ends in a partial character would shift the emitted text.
        let clean = decode(&tokenizer, &context, skip_special_tokens)
            .map(|t| !t.ends_with(REPLACEMENT))
            .unwrap_or(false);
        if !clean {
            context.clear();
        }
        let n = context.len();
        IncrementalDetokenizer {
            tokenizer,
            ids: context,
            prefix_offset: 0,
            read_offset: n,
            skip_special_tokens,
        }
    }

    /// Add one generated id; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let prefix = decode(
            &self.tokenizer,
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special_tokens,
        )?;
        let full = decode(
            &self.tokenizer,
            &self.ids[self.prefix_offset..],
            self.skip_special_tokens,
        )?;
        if full.len() <= prefix.len() || full.ends_with(REPLACEMENT) {
            return Ok(String::new());
        }
        let mut cut = prefix.len();
        while !full.is_char_boundary(cut) {
            cut += 1;
        }
        let new = full[cut..].to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(new)
    }

    /// The text of ids still held back (an incomplete character at the very end comes out as
    /// U+FFFD, as a full decode would show it).
    pub fn flush(&mut self) -> Result<String> {
        if self.read_offset >= self.ids.len() {
            return Ok(String::new());
        }
        let prefix = decode(
            &self.tokenizer,
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special_tokens,
        )?;
        let full = decode(
            &self.tokenizer,
            &self.ids[self.prefix_offset..],
            self.skip_special_tokens,
        )?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        let mut cut = prefix.len().min(full.len());
        while !full.is_char_boundary(cut) {
            cut += 1;
        }
        Ok(full[cut..].to_string())
    }
}

/// Finds stop strings in streamed text.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    include_in_output: bool,
    held: String,
}

/// What [`StopMatcher::push`] decided.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopCheck {
    /// Text safe to emit now.
    pub text: String,
    /// The stop string that ended the output, if one did.
    pub stopped: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: &[String], include_in_output: bool) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            include_in_output,
            held: String::new(),
        }
    }

    pub fn is_active(&self) -> bool {
        !self.stops.is_empty()
    }

    /// Add text. With `allow_match` false (before `min_tokens`), stop strings are not matched
    /// yet but possible beginnings are still held back.
    pub fn push(&mut self, text: &str, allow_match: bool) -> StopCheck {
        if self.stops.is_empty() {
            return StopCheck {
                text: text.to_string(),
                stopped: None,
            };
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(text);
        if allow_match {
            let mut best: Option<(usize, usize)> = None;
            for (i, s) in self.stops.iter().enumerate() {
                if let Some(pos) = buf.find(s.as_str()) {
                    if best.is_none_or(|(p, _)| pos < p) {
                        best = Some((pos, i));
                    }
                }
            }
            if let Some((pos, i)) = best {
                let stop = self.stops[i].clone();
                let end = if self.include_in_output {
                    pos + stop.len()
                } else {
                    pos
                };
                buf.truncate(end);
                return StopCheck {
                    text: buf,
                    stopped: Some(stop),
                };
            }
        }
        let hold_from = self.hold_point(&buf);
        self.held = buf.split_off(hold_from);
        StopCheck {
            text: buf,
            stopped: None,
        }
    }

    /// Start of the longest suffix of `buf` that is a proper prefix of some stop string.
    fn hold_point(&self, buf: &str) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let earliest = buf.len().saturating_sub(longest.saturating_sub(1));
        for (i, _) in buf.char_indices().filter(|(i, _)| *i >= earliest) {
            let tail = &buf[i..];
            if self
                .stops
                .iter()
                .any(|s| s.len() > tail.len() && s.starts_with(tail))
            {
                return i;
            }
        }
        buf.len()
    }

    /// The end of the output: held-back text is not a stop string after all.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    fn run(m: &mut StopMatcher, pieces: &[&str]) -> (String, Option<String>) {
        let mut out = String::new();
        for p in pieces {
            let c = m.push(p, true);
            out.push_str(&c.text);
            if c.stopped.is_some() {
                return (out, c.stopped);
            }
        }
        out.push_str(&m.flush());
        (out, None)
    }

    #[test]
    fn stop_across_pieces_is_cut() {
        let mut m = StopMatcher::new(&stops(&["END"]), false);
        assert_eq!(m.push("hello E", true).text, "hello ");
        assert_eq!(m.push("N", true).text, "");
        let c = m.push("Dafter", true);
        assert_eq!(c.text, "");
        assert_eq!(c.stopped.as_deref(), Some("END"));
    }

    #[test]
    fn include_stop_keeps_it() {
        let mut m = StopMatcher::new(&stops(&["END"]), true);
        assert_eq!(
            run(&mut m, &["ab E", "ND tail"]),
            ("ab END".to_string(), Some("END".into()))
        );
    }

    #[test]
    fn false_start_is_released() {
        let mut m = StopMatcher::new(&stops(&["abc"]), false);
        assert_eq!(m.push("xab", true).text, "x");
        assert_eq!(m.push("d", true).text, "abd");
        assert_eq!(m.flush(), "");
        let mut m = StopMatcher::new(&stops(&["abc"]), false);
        assert_eq!(run(&mut m, &["a", "b"]), ("ab".to_string(), None));
    }

    #[test]
    fn earliest_stop_wins_and_multibyte_is_safe() {
        let mut m = StopMatcher::new(&stops(&["zz", "é!"]), false);
        assert_eq!(
            run(&mut m, &["caf", "é", "! zz"]),
            ("caf".to_string(), Some("é!".into()))
        );
        let mut m = StopMatcher::new(&stops(&["日本"]), false);
        assert_eq!(m.push("こ日", true).text, "こ");
        assert_eq!(m.push("x", true).text, "日x");
    }

    #[test]
    fn no_match_before_allowed() {
        let mut m = StopMatcher::new(&stops(&["!"]), false);
        let c = m.push("a!b", false);
        assert_eq!(c.text, "a!b");
        assert!(c.stopped.is_none());
        let c = m.push("c!", true);
        assert_eq!(c.text, "c");
        assert_eq!(c.stopped.as_deref(), Some("!"));
    }

    #[test]
    fn no_stops_passes_through() {
        let mut m = StopMatcher::new(&[], false);
        assert!(!m.is_active());
        assert_eq!(m.push("abc", true).text, "abc");
    }
}
