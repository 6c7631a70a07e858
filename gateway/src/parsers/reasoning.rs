//! `--reasoning-parser`: the `<think>...</think>` family splits a reply's reasoning
//! (`reasoning_content`) from its answer (`content`), whole or streamed, as vLLM's parsers do.
//!
//! * `deepseek_r1`: the chat template opens `<think>` in the prompt, so the reply starts inside
//!   it (a leading `<think>` is tolerated); without `</think>` the whole reply is reasoning.
//! * `qwen3`: the reply opens `<think>` itself; a reply without both tags is all content.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    DeepseekR1,
    Qwen3,
}

impl ReasoningParser {
    pub const NAMES: &'static [&'static str] = &["deepseek_r1", "qwen3"];

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "deepseek_r1" => Some(ReasoningParser::DeepseekR1),
            "qwen3" => Some(ReasoningParser::Qwen3),
            _ => None,
        }
    }

    /// `(reasoning, content)` of a whole reply.
    pub fn split(self, text: &str) -> (Option<String>, Option<String>) {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        match self {
            ReasoningParser::DeepseekR1 => {
                let body = text.strip_prefix(OPEN).unwrap_or(text);
                match body.split_once(CLOSE) {
                    Some((reasoning, content)) => (non_empty(reasoning), non_empty(content)),
                    None => (non_empty(body), None),
                }
            }
            ReasoningParser::Qwen3 => {
                let (Some(start), true) = (text.find(OPEN), text.contains(CLOSE)) else {
                    return (None, Some(text.to_string()));
                };
                let after = &text[start + OPEN.len()..];
                match after.split_once(CLOSE) {
                    Some((reasoning, content)) => (non_empty(reasoning), non_empty(content)),
                    None => (None, Some(text.to_string())),
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the reply shows whether it opens `<think>`.
    Start,
    Thinking,
    Answering,
}

/// Splits a streamed reply delta by delta. Text that may be the start of a tag is held back
/// until the next delta shows whether it is one.
#[derive(Debug)]
pub struct StreamSplit {
    parser: ReasoningParser,
    state: State,
    pending: String,
}

impl StreamSplit {
    pub fn new(parser: ReasoningParser) -> Self {
        StreamSplit {
            parser,
            state: State::Start,
            pending: String::new(),
        }
    }

    /// The `(reasoning, content)` a delta adds (either may be empty).
    pub fn push(&mut self, delta: &str) -> (String, String) {
        self.pending.push_str(delta);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            match self.state {
                State::Start => {
                    if self.pending.starts_with(OPEN) {
                        self.pending.drain(..OPEN.len());
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(self.pending.as_str()) {
                        break; // maybe the tag, still arriving
                    } else {
                        self.state = match self.parser {
                            ReasoningParser::DeepseekR1 => State::Thinking,
                            ReasoningParser::Qwen3 => State::Answering,
                        };
                    }
                }
                State::Thinking => match self.pending.find(CLOSE) {
                    Some(at) => {
                        reasoning.push_str(&self.pending[..at]);
                        self.pending.drain(..at + CLOSE.len());
                        self.state = State::Answering;
                    }
                    None => {
                        let keep = partial_tag_len(&self.pending, CLOSE);
                        let emit = self.pending.len() - keep;
                        reasoning.push_str(&self.pending[..emit]);
                        self.pending.drain(..emit);
                        break;
                    }
                },
                State::Answering => {
                    content.push_str(&self.pending);
                    self.pending.clear();
                    break;
                }
            }
        }
        (reasoning, content)
    }

    /// What is still held back when the reply ends.
    pub fn finish(&mut self) -> (String, String) {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Thinking => (rest, String::new()),
            State::Start if self.parser == ReasoningParser::DeepseekR1 => (rest, String::new()),
            _ => (String::new(), rest),
        }
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `tag`.
pub(crate) fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_replies_split_as_vllm_does() {
        let r1 = ReasoningParser::DeepseekR1;
        assert_eq!(
            r1.split("hmm</think>Paris"),
            (Some("hmm".into()), Some("Paris".into()))
        );
        assert_eq!(
            r1.split("<think>hmm</think>Paris").0.as_deref(),
            Some("hmm")
        );
        assert_eq!(
            r1.split("still thinking"),
            (Some("still thinking".into()), None)
        );
        let q = ReasoningParser::Qwen3;
        assert_eq!(
            q.split("<think>hmm</think>Paris"),
            (Some("hmm".into()), Some("Paris".into()))
        );
        assert_eq!(q.split("Paris"), (None, Some("Paris".into())));
    }

    #[test]
    fn streams_split_whatever_the_deltas() {
        let text = "<think>let me see</think>Paris is the capital";
        for parser in [ReasoningParser::DeepseekR1, ReasoningParser::Qwen3] {
            let want = parser.split(text);
            for size in 1..=text.len() {
                let mut split = StreamSplit::new(parser);
                let (mut reasoning, mut content) = (String::new(), String::new());
                let bytes: Vec<char> = text.chars().collect();
                for chunk in bytes.chunks(size) {
                    let (r, c) = split.push(&chunk.iter().collect::<String>());
                    reasoning += &r;
                    content += &c;
                }
                let (r, c) = split.finish();
                reasoning += &r;
                content += &c;
                assert_eq!(
                    (Some(reasoning), Some(content)),
                    want,
                    "{parser:?}, deltas of {size}"
                );
            }
        }
        let mut plain = StreamSplit::new(ReasoningParser::Qwen3);
        assert_eq!(plain.push("Paris"), (String::new(), "Paris".into()));
    }
}
