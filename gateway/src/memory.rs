//! The deployment's memory bound: the most resident memory the process can reach under its
//! flags, as a sum of terms (README, "Operating it"). The start-up log prints it with its
//! terms; the soak checks that the process stays under it.
//!
//! What one request holds is sized here once, from its shape (`body_bytes`,
//! `generation_bytes`, `pooling_bytes`, `media_tensor_bytes`): the routes hold those figures
//! on the request's account against `--max-request-memory`
//! ([`crate::http::request_memory`]), and the bound takes them at their largest.

use std::fmt;

use engine::api::ModelCard;
use policies::LimitMmPerPrompt;
use preprocess::pipeline::{ModelMediaSpec, PipelineConfig};

/// The runtime, the allocator's own books, the metrics registry and the HTTP stack, beside
/// the program's file.
const RUNTIME_BYTES: u64 = 64 << 20;

/// Stack of every thread (tokio's and Rust's default), counted whole.
const THREAD_STACK_BYTES: u64 = 2 << 20;

/// Threads tokio's blocking pool may start (its default).
const BLOCKING_THREADS: u64 = 512;

/// A connection's buffers: hyper's HTTP/1 read and write buffers (up to about 400 KiB each)
/// or an HTTP/2 connection's flow-control window, and its task.
const CONNECTION_BYTES: u64 = 1 << 20;

/// What a request body can grow into while it is parsed and processed, per byte: the body
/// itself, its typed form (a JSON string of a few bytes, `"",`, becomes a 24-byte `String`),
/// a data URL's decoded bytes, and the token ids of its text (a byte is at most one token: a
/// u32 id and a u32 segment).
const BODY_EXPANSION: u64 = 9 + 8;

/// Fewest body bytes one input of a request takes (`"",` or `[1],`): it bounds how many
/// inputs an embedding request can hold.
const MIN_INPUT_BYTES: u64 = 3;

/// What the bound is computed from: the flags and what the started engine reports.
pub struct Inputs<'a> {
    pub cards: &'a [ModelCard],
    /// Each served model's media processors, for models that take media.
    pub media_specs: &'a [ModelMediaSpec],
    /// The media pipeline's sizes, when a served model takes media.
    pub pipeline: Option<&'a PipelineConfig>,
    pub limits: &'a LimitMmPerPrompt,
    pub max_concurrent_requests: usize,
    /// `--max-request-memory`: what requests in flight may hold together.
    pub max_request_memory: usize,
    pub max_request_body_bytes: usize,
    pub max_num_seqs: usize,
    /// `--max-logprobs`: the alternatives a token's logprob entry may list.
    pub max_logprobs: usize,
    pub max_connections: usize,
    pub threads: usize,
    /// The program's file (mapped, resident once touched).
    pub program_bytes: u64,
}

/// The bound's terms, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryBound {
    pub fixed: u64,
    pub weights: u64,
    pub kv_cache: u64,
    pub engine_steps: u64,
    pub media_budget: u64,
    pub requests: u64,
    pub connections: u64,
    pub threads: u64,
}

impl MemoryBound {
    pub fn of(i: &Inputs<'_>) -> MemoryBound {
        let sum = |f: fn(&ModelCard) -> u64| i.cards.iter().map(f).fold(0u64, u64::saturating_add);
        let body = i.max_request_body_bytes as u64;
        // One request at its largest: its body as parsed, its sequences (a generation
        // request's choices, at most --max-num-seqs, with --max-logprobs; an embedding
        // request's inputs, as many as its body can hold), and its media as processed.
        let sequences = i
            .cards
            .iter()
            .map(|c| {
                if c.tasks.contains(&engine::api::Task::Generate) {
                    generation_bytes(c, i.max_num_seqs, Some(i.max_logprobs))
                } else {
                    pooling_bytes(c, body / MIN_INPUT_BYTES)
                }
            })
            .max()
            .unwrap_or(0);
        let media = i.pipeline.map_or(0, |_| per_request_media(i));
        let per_request = body_bytes(body)
            .saturating_add(sequences)
            .saturating_add(media);
        // Fetched media is held against the fetcher's budget, decoded media against the
        // pipeline's, both server-wide.
        let media_budget = i.pipeline.map_or(0, |p| {
            (p.max_decoded_bytes as u64)
                .saturating_add(p.uuid_cache_bytes as u64)
                .saturating_add(p.fetch.fetched_budget() as u64)
        });
        // Tokio's workers and blocking pool, each model's compute pool and its engine, media
        // or embedding thread, the media decoders (on tokio's blocking pool).
        let threads = (i.threads as u64)
            .saturating_add(BLOCKING_THREADS)
            .saturating_add((i.cards.len() as u64).saturating_mul(i.threads as u64 + 2));
        MemoryBound {
            fixed: i.program_bytes.saturating_add(RUNTIME_BYTES),
            weights: sum(|c| c.memory.weights),
            kv_cache: sum(|c| c.memory.kv_cache),
            engine_steps: sum(|c| c.memory.step),
            media_budget,
            requests: (i.max_concurrent_requests as u64)
                .saturating_mul(per_request)
                .min(i.max_request_memory as u64),
            connections: (i.max_connections as u64).saturating_mul(CONNECTION_BYTES),
            threads: threads.saturating_mul(THREAD_STACK_BYTES),
        }
    }

    pub fn total(&self) -> u64 {
        [
            self.fixed,
            self.weights,
            self.kv_cache,
            self.engine_steps,
            self.media_budget,
            self.requests,
            self.connections,
            self.threads,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }
}

/// What a body of `len` bytes can grow into while it is parsed and served.
pub fn body_bytes(len: u64) -> u64 {
    len.saturating_mul(BODY_EXPANSION)
}

/// A generation request's sequences: `seqs` of them (its prompts times its choices), each
/// with its ids, block table and text over the model's context and, when it asks for
/// logprobs (`logprobs`: the most alternatives of its token or prompt logprobs), an entry per
/// token of the context with that many alternatives.
pub fn generation_bytes(card: &ModelCard, seqs: usize, logprobs: Option<usize>) -> u64 {
    let each = card
        .memory
        .per_sequence
        .saturating_add(logprobs.map_or(0, |k| logprob_bytes(card, k)));
    (seqs as u64).saturating_mul(each)
}

/// A pooling request's outputs: one per input (an embedding, a score, a label's
/// probabilities).
pub fn pooling_bytes(card: &ModelCard, inputs: u64) -> u64 {
    inputs.saturating_mul(card.memory.per_sequence)
}

/// The processed tensors of a request's media items, at most what the model's placeholders
/// allow in its context.
pub fn media_tensor_bytes(
    spec: &ModelMediaSpec,
    max_model_len: usize,
    images: usize,
    audio: usize,
) -> u64 {
    preprocess::estimate::request_tensor_bytes(spec, max_model_len, images, audio)
}

/// A sequence's logprob entries at most: each of its tokens (prompt and output together fill
/// the context at most) with `k` alternatives and its own, each a token's text, its id and
/// value, as held and as sent.
fn logprob_bytes(c: &ModelCard, k: usize) -> u64 {
    let entry = c
        .memory
        .max_token_bytes
        .saturating_add(48)
        .saturating_mul(2);
    (c.max_model_len as u64)
        .saturating_mul(k as u64 + 1)
        .saturating_mul(entry)
}

/// One request's processed media at most: every item `--limit-mm-per-prompt` allows, as
/// far as the served models' placeholders allow.
fn per_request_media(i: &Inputs<'_>) -> u64 {
    use preprocess::Modality;
    let items = |m: Modality| {
        i.limits
            .limit_for(m.as_str())
            .unwrap_or(usize::MAX)
            .min(i.max_request_body_bytes)
    };
    let max_tokens = i.cards.iter().map(|c| c.max_model_len).max().unwrap_or(0);
    i.media_specs
        .iter()
        .map(|s| {
            media_tensor_bytes(
                s,
                max_tokens,
                items(Modality::Image),
                items(Modality::Audio),
            )
        })
        .max()
        .unwrap_or(0)
}

/// Bytes as GiB with two decimals.
fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl fmt::Display for MemoryBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} = fixed {} + weights {} + KV cache {} + engine steps {} + media budget {} + requests {} + connections {} + thread stacks {}",
            gib(self.total()),
            gib(self.fixed),
            gib(self.weights),
            gib(self.kv_cache),
            gib(self.engine_steps),
            gib(self.media_budget),
            gib(self.requests),
            gib(self.connections),
            gib(self.threads),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::api::{ModelMemory, Task};

    fn card(task: Task, memory: ModelMemory) -> ModelCard {
        ModelCard {
            name: "m".into(),
            root: "m".into(),
            max_model_len: 4096,
            device: "cpu".into(),
            tasks: vec![task],
            input_modalities: vec!["text".into()],
            memory,
            weight_types: Default::default(),
        }
    }

    fn inputs<'a>(cards: &'a [ModelCard], limits: &'a LimitMmPerPrompt) -> Inputs<'a> {
        Inputs {
            cards,
            media_specs: &[],
            pipeline: None,
            limits,
            max_concurrent_requests: 10,
            max_request_memory: usize::MAX,
            max_request_body_bytes: 1000,
            max_num_seqs: 4,
            max_logprobs: 2,
            max_connections: 100,
            threads: 2,
            program_bytes: 7,
        }
    }

    #[test]
    fn every_term_follows_its_flags() {
        let decoder = card(
            Task::Generate,
            ModelMemory {
                weights: 100,
                kv_cache: 1000,
                step: 10,
                per_sequence: 5,
                max_token_bytes: 2,
            },
        );
        let encoder = card(
            Task::Embed,
            ModelMemory {
                weights: 200,
                kv_cache: 0,
                step: 20,
                per_sequence: 3,
                max_token_bytes: 2,
            },
        );
        let cards = [decoder, encoder];
        let limits = LimitMmPerPrompt::default();
        let b = MemoryBound::of(&inputs(&cards, &limits));
        assert_eq!(b.fixed, 7 + RUNTIME_BYTES);
        assert_eq!(b.weights, 300);
        assert_eq!(b.kv_cache, 1000);
        assert_eq!(b.engine_steps, 30);
        assert_eq!(b.media_budget, 0);
        // A request: its body as parsed, and the larger of the decoder's 4 choices (5 bytes
        // each, and 4096 tokens' logprob entries of 3 tokens of (2 + 48) x 2 bytes) and the
        // encoder's 333 inputs (3 bytes each).
        let choice = 5 + 4096 * 3 * 100;
        assert_eq!(b.requests, 10 * (1000 * BODY_EXPANSION + 4 * choice));
        assert_eq!(b.connections, 100 * CONNECTION_BYTES);
        assert_eq!(
            b.threads,
            (2 + BLOCKING_THREADS + 2 * 4) * THREAD_STACK_BYTES
        );
        assert_eq!(
            b.total(),
            b.fixed + 300 + 1000 + 30 + b.requests + b.connections + b.threads
        );
        let shown = b.to_string();
        assert!(shown.contains("KV cache 0.00 GiB"), "{shown}");

        let mut more = inputs(&cards, &limits);
        more.max_concurrent_requests = 20;
        more.max_connections = 200;
        let doubled = MemoryBound::of(&more);
        assert_eq!(doubled.requests, 2 * b.requests);
        assert_eq!(doubled.connections, 2 * b.connections);

        // The request budget caps the requests' term, whatever the other flags allow.
        more.max_request_memory = 12345;
        assert_eq!(MemoryBound::of(&more).requests, 12345);
        more.max_request_memory = usize::MAX;
        assert_eq!(MemoryBound::of(&more).requests, doubled.requests);
    }

    #[test]
    fn media_counts_the_budget_the_fetches_and_the_tensors() {
        let cards = [card(Task::Generate, ModelMemory::default())];
        let limits = LimitMmPerPrompt::from_json(r#"{"image": 1, "video": 0, "audio": 2}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        let spec = ModelMediaSpec {
            image: None,
            video: None,
            audio: Some(media::spec::WhisperFeatureConfig::whisper(128)),
        };
        let pipeline = PipelineConfig::default();
        let mut i = inputs(&cards, &limits);
        i.pipeline = Some(&pipeline);
        let specs = [spec.clone()];
        i.media_specs = &specs;
        let b = MemoryBound::of(&i);
        let audio = spec.audio.as_ref().map_or(0, |a| a.n_mels * a.n_frames()) as u64 * 4;
        // Fetched media is the fetcher's server-wide budget, not each request's.
        assert_eq!(
            b.media_budget,
            (pipeline.max_decoded_bytes + pipeline.uuid_cache_bytes) as u64
                + pipeline.fetch.max_fetched_bytes as u64
        );
        // A decoder's 4 choices hold their logprob entries only (per_sequence 0).
        let per_request = 1000 * BODY_EXPANSION + 4 * 4096 * 3 * 96 + 2 * audio;
        assert_eq!(b.requests, 10 * per_request);
        assert_eq!(
            media_tensor_bytes(&spec, 4096, 1, 2),
            2 * audio,
            "a request's items, as the route holds them"
        );
    }
}
