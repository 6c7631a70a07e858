//! Starting a served model: a decoder's engine thread (KV cache on its device, scheduler,
//! metrics) or an encoder's embedding worker, and the model's card.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{mpsc, Arc};

use super::embed::{embed_worker, AliveFlag};
use super::footprint;
use super::media_worker::MediaWorker;
use super::{
    Backend, DecoderBackend, EncoderBackend, EngineConfig, ModelHandle, ModelInner, ModelSpec,
};
use crate::api::{ModelCard, Task};
use crate::chat_template::ChatTemplate;
use crate::error::{EngineError, Result};
use crate::load::LoadedDecoder;
use crate::metrics::ModelMetrics;
use crate::model::{EncoderHead, KvBudget, LoadedEncoder};
use crate::scheduler::{Engine, SchedulerConfig, Shared};

pub(super) fn resolve_max_len(config: &EngineConfig, model_max: usize) -> usize {
    config.max_model_len.map_or(model_max, |m| m.min(model_max))
}

/// The model's chat template: the configured one (`--chat-template`), which must compile, or
/// the checkpoint's, which is dropped with a warning when it does not.
fn compile_template(
    spec: &ModelSpec,
    config: &EngineConfig,
    source: Option<String>,
    bos: &Option<String>,
    eos: &Option<String>,
) -> Result<Option<ChatTemplate>> {
    if let Some(given) = &config.chat_template {
        return ChatTemplate::new(given, bos.clone(), eos.clone())
            .map(Some)
            .map_err(|e| {
                EngineError::load(
                    spec.path.clone(),
                    format!("the --chat-template does not compile: {e}"),
                )
            });
    }
    let Some(source) = source else {
        return Ok(None);
    };
    match ChatTemplate::new(&source, bos.clone(), eos.clone()) {
        Ok(t) => Ok(Some(t)),
        Err(e) => {
            tracing::warn!(model = %spec.served_name, "the checkpoint's chat template does not compile: {e}");
            Ok(None)
        }
    }
}

/// What a decoder's KV cache may take under `config`, with `active` sequences in a step.
pub(super) fn kv_budget(config: &EngineConfig, active: usize) -> KvBudget {
    KvBudget {
        tokens: config.kv_cache_tokens,
        gpu_memory_utilization: config.gpu_memory_utilization,
        max_batched_tokens: config.max_num_batched_tokens,
        max_seqs: active,
        dtype: config.kv_cache_dtype,
    }
}

/// Start a decoder's engine thread. `kv_allocated`: the blocks of the cache its GPU bring-up
/// already allocated (`None`: allocate it now).
pub(super) fn start_decoder(
    spec: &ModelSpec,
    mut d: LoadedDecoder,
    config: &EngineConfig,
    active: usize,
    kv_allocated: Option<usize>,
    weights: u64,
) -> Result<ModelHandle> {
    d.model.set_activation_mode(config.activation_mode);
    let info = d.model.info().clone();
    let device = d.model.device();
    let max_model_len = resolve_max_len(config, info.max_position);
    // The file pages a copy made at load replaced are not resident: the copy, measured around
    // the load, counts instead.
    let weights = weights.saturating_sub(d.model.weight_summary().released());
    let mut memory = footprint::decoder(
        &d,
        &footprint::DecoderShape {
            weights,
            max_batched_tokens: config.max_num_batched_tokens,
            active,
            max_model_len,
            threads: footprint::threads(config.threads),
            max_token_bytes: max_token_bytes(&d.tokenizer),
        },
    );
    // Before the engine thread starts: a --chat-template that does not compile stops the start.
    let template = compile_template(spec, config, d.chat_template, &d.bos_token, &d.eos_token)?;
    let lora = config.lora.as_ref().and_then(|l| {
        let targets = d.model.lora_targets()?;
        // The memory bound's weights hold --max-cpu-loras adapters at --max-lora-rank, and
        // one more being read while they are held.
        let adapters = (l.settings.max_cpu_loras as u64 + 1)
            .saturating_mul(targets.max_adapter_bytes(l.settings.max_lora_rank));
        memory.weights = memory.weights.saturating_add(adapters);
        Some(Arc::new(crate::lora::LoraRegistry::new(
            targets,
            l.settings,
            &spec.served_name,
        )))
    });
    let cfg = SchedulerConfig {
        max_num_seqs: config.max_num_seqs,
        max_num_active_seqs: active,
        max_num_batched_tokens: config.max_num_batched_tokens,
        block_size: config.block_size,
        kv_budget: kv_budget(config, active),
        kv_allocated,
        max_model_len,
        enable_prefix_caching: config.enable_prefix_caching,
        threads: config.threads,
        seed: config.seed,
        lora: lora.clone(),
    };
    let weights = d.model.weight_summary();
    tracing::info!(
        model = %spec.served_name,
        device = %device,
        types = %weights,
        resident = %crate::model::human_bytes(weights.total()),
        interleaved = %crate::model::human_bytes(weights.interleaved()),
        "weights held"
    );
    let metrics = Arc::new(ModelMetrics::new(&spec.served_name));
    let shared = Arc::new(Shared::default());
    let (tx, rx) = mpsc::channel();
    let (engine, num_blocks) = Engine::new(d.model, cfg, rx, shared.clone(), metrics.clone())
        .map_err(|e| match e {
            EngineError::InvalidRequest { message, .. } => {
                EngineError::load(spec.path.clone(), message)
            }
            other => other,
        })?;
    metrics.placed(
        &device,
        config.block_size,
        num_blocks,
        config.enable_prefix_caching,
    );
    if device == "cpu" {
        memory.kv_cache =
            footprint::kv_bytes(&info, num_blocks, config.block_size, config.kv_cache_dtype);
    }
    std::thread::Builder::new()
        .name(format!("engine-{}", spec.served_name))
        .spawn(move || engine.run())
        .map_err(|e| EngineError::Internal(format!("cannot start the engine thread: {e}")))?;
    let media = d
        .media
        .map(|encoders| MediaWorker::start(&spec.served_name, *encoders, config.max_num_seqs))
        .transpose()?;
    tracing::info!(
        model = %spec.served_name,
        architecture = %d.architecture,
        max_model_len,
        device = %device,
        kv_blocks = num_blocks,
        block_size = config.block_size,
        // GPU decoders compute in their --dtype type; the precision flag is the CPU's.
        activations = %if device == "cpu" { config.activation_mode.as_str() } else { "dtype" },
        cpu_kernels = %kernels::cpu_level(),
        "decoder ready"
    );
    Ok(ModelHandle {
        inner: Arc::new(ModelInner {
            max_token_bytes: memory.max_token_bytes as usize,
            card: ModelCard {
                name: spec.served_name.clone(),
                root: spec.path.clone(),
                max_model_len,
                device,
                tasks: vec![Task::Generate],
                input_modalities: std::iter::once("text")
                    .chain(
                        media
                            .as_ref()
                            .map(MediaWorker::modalities)
                            .unwrap_or_default()
                            .iter()
                            .map(|m| m.as_str()),
                    )
                    .map(str::to_string)
                    .collect(),
                memory,
                weight_types: stored_types(spec),
            },
            tokenizer: Arc::new(d.tokenizer),
            template,
            bos_token: d.bos_token,
            eos_token: d.eos_token,
            metrics,
            backend: Backend::Decoder(DecoderBackend {
                commands: tx,
                shared,
                next_id: AtomicU64::new(1),
                max_num_seqs: config.max_num_seqs,
                model_vocab: info.vocab_size,
                media,
                lora,
            }),
        }),
        lora: None,
    })
}

pub(super) fn start_encoder(
    spec: &ModelSpec,
    e: LoadedEncoder,
    chat_template: Option<String>,
    config: &EngineConfig,
    weights: u64,
) -> Result<ModelHandle> {
    let info = e.model.info().clone();
    let max_model_len = resolve_max_len(config, info.max_seq_len);
    let threads = footprint::threads(config.threads);
    let token_bytes = max_token_bytes(&e.tokenizer);
    let memory = footprint::encoder(
        &e,
        weights,
        config.max_num_batched_tokens.max(1),
        threads,
        token_bytes,
    );
    let (tx, rx) = mpsc::sync_channel(config.max_num_seqs.max(1));
    let alive = Arc::new(AtomicBool::new(true));
    let worker_alive = alive.clone();
    let batch_tokens = config.max_num_batched_tokens.max(1);
    let model = e.model;
    let metrics = Arc::new(ModelMetrics::new(&spec.served_name));
    let worker_metrics = metrics.clone();
    // Its own pool: in a pool shared with a decoder, each of a decode step's many small
    // parallel jobs would queue behind an embedding batch's large ones, so the decoder would
    // get far less than half the CPU; with two pools the OS shares the cores between them.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name({
            let name = spec.served_name.clone();
            move |i| format!("embed-{name}-{i}")
        })
        .build()
        .map_err(|err| EngineError::Internal(format!("cannot build the embedding pool: {err}")))?;
    std::thread::Builder::new()
        .name(format!("embed-{}", spec.served_name))
        .spawn(move || {
            let _guard = AliveFlag(worker_alive);
            pool.install(|| embed_worker(model, rx, batch_tokens, worker_metrics));
        })
        .map_err(|err| {
            EngineError::Internal(format!("cannot start the embedding thread: {err}"))
        })?;
    let template = compile_template(spec, config, chat_template, &None, &None)?;
    let pad_id = crate::hf::pad_token_id(std::path::Path::new(&spec.path), &e.tokenizer);
    tracing::info!(model = %spec.served_name, architecture = %e.architecture, max_model_len, "encoder ready");
    Ok(ModelHandle {
        inner: Arc::new(ModelInner {
            max_token_bytes: token_bytes,
            card: ModelCard {
                name: spec.served_name.clone(),
                root: spec.path.clone(),
                max_model_len,
                device: "cpu".into(),
                tasks: encoder_tasks(&info.head),
                input_modalities: vec!["text".into()],
                memory,
                weight_types: stored_types(spec),
            },
            tokenizer: Arc::new(e.tokenizer),
            template,
            bos_token: None,
            eos_token: None,
            metrics,
            backend: Backend::Encoder(EncoderBackend {
                jobs: tx,
                alive,
                max_seq_len: max_model_len,
                hidden_size: info.hidden_size,
                head: info.head.clone(),
                normalize: info.normalize,
                pad_id,
            }),
        }),
        lora: None,
    })
}

/// What an encoder serves: an embedding model embeds and scores (by cosine); a classifier
/// classifies, and scores pairs with its head when it has a single label (a cross-encoder).
fn encoder_tasks(head: &EncoderHead) -> Vec<Task> {
    match head {
        EncoderHead::Embed => vec![Task::Embed, Task::Score],
        EncoderHead::Classify(c) if c.labels.len() == 1 => vec![Task::Classify, Task::Score],
        EncoderHead::Classify(_) => vec![Task::Classify],
    }
}

/// The longest vocabulary entry in bytes (added tokens included).
fn max_token_bytes(tokenizer: &tokenizers::Tokenizer) -> usize {
    tokenizer
        .get_vocab(true)
        .keys()
        .map(String::len)
        .max()
        .unwrap_or(1)
}

/// The bytes per stored tensor type of `spec`'s checkpoint, for its card. A model loaded from
/// elsewhere (tests) may have no files at its path: its card then lists none.
fn stored_types(spec: &ModelSpec) -> crate::model::WeightSummary {
    crate::weight_cache::stored_types::of_checkpoint(std::path::Path::new(&spec.path))
        .unwrap_or_else(|e| {
            tracing::warn!(model = %spec.served_name, error = %e, "cannot read the checkpoint's tensor types");
            Default::default()
        })
}
