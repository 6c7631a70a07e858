//! The engine handle the gateway holds: cheap to clone, thread-safe, async at the edge.
//!
//! Each decoder runs on its own engine thread ([`crate::scheduler`]); each embedding model on its
//! own worker thread that batches concurrent requests. [`GenerationStream`] turns the engine's
//! token events into text deltas (incremental detokenisation and stop strings run here, on the
//! async side) and cancels its sequence when dropped.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use tokenizers::Tokenizer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::oneshot;

use crate::api::{
    ChatTemplateOptions, Delta, Finish, FinishReason, GenerateRequest, ModelCard, StopReason, Task,
};
use crate::block_manager::HashContext;
use crate::chat_template::{ChatTemplate, NO_TEMPLATE_MESSAGE};
use crate::detok::{IncrementalDetokenizer, StopMatcher};
use crate::device::{DTypeRequest, Device, DeviceRequest};
use crate::error::{EngineError, Result};
use crate::metrics::ModelMetrics;
use crate::model::{ActivationMode, EmbeddingModel, KvBudget, LoadedDecoder, LoadedEncoder};
use crate::scheduler::{
    Command, Engine, EngineStats, SchedulerConfig, SeqEvent, Shared, Submission,
};

/// Settings for the serving machinery, from the CLI.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub max_model_len: Option<usize>,
    pub max_num_seqs: usize,
    pub max_num_active_seqs: Option<usize>,
    pub max_num_batched_tokens: usize,
    /// KV cache capacity in tokens (all sequences together). `None`: the CPU default
    /// ([`crate::model::DEFAULT_CPU_KV_TOKENS`]), or on a GPU what `gpu_memory_utilization`
    /// leaves after weights and activations.
    pub kv_cache_tokens: Option<usize>,
    pub block_size: usize,
    pub enable_prefix_caching: bool,
    pub threads: Option<usize>,
    /// Activation precision of the decoders' quantised matmuls.
    pub activation_mode: ActivationMode,
    /// Where decoders run (`--device`).
    pub device: DeviceRequest,
    /// GPU models' type (`--dtype`); the CPU computes in f32 over the stored weights.
    pub dtype: DTypeRequest,
    /// Share of GPU memory for weights, activations and KV (`--gpu-memory-utilization`).
    pub gpu_memory_utilization: f32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_model_len: None,
            max_num_seqs: 256,
            max_num_active_seqs: None,
            max_num_batched_tokens: 2048,
            kv_cache_tokens: None,
            block_size: 16,
            enable_prefix_caching: true,
            threads: None,
            activation_mode: ActivationMode::default(),
            device: DeviceRequest::Auto,
            dtype: DTypeRequest::Auto,
            gpu_memory_utilization: 0.9,
        }
    }
}

/// One model to serve: a path (GGUF file or HF folder) and the name clients use.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub path: String,
    pub served_name: String,
}

/// A checkpoint already in memory, for [`EngineHandle::from_loaded`].
pub enum LoadedModel {
    Decoder(LoadedDecoder),
    Encoder {
        encoder: LoadedEncoder,
        chat_template: Option<String>,
    },
}

/// What kind of model a handle serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    Decoder,
    Encoder,
}

/// All served models, routed by name.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Vec<ModelHandle>>,
}

/// One served model.
#[derive(Clone)]
pub struct ModelHandle {
    inner: Arc<ModelInner>,
}

struct ModelInner {
    card: ModelCard,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    metrics: Arc<ModelMetrics>,
    backend: Backend,
}

enum Backend {
    Decoder(DecoderBackend),
    Encoder(EncoderBackend),
}

struct DecoderBackend {
    commands: Sender<Command>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    max_num_seqs: usize,
    /// Ids the model can embed (prompt validation).
    model_vocab: usize,
    /// The checkpoint's vision or audio encoders.
    media: Option<Box<crate::models::media::MediaEncoders>>,
}

struct EncoderBackend {
    jobs: SyncSender<EmbedJob>,
    alive: Arc<AtomicBool>,
    max_seq_len: usize,
    hidden_size: usize,
}

struct EmbedJob {
    inputs: Vec<Vec<u32>>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>>>,
}

impl Drop for DecoderBackend {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
    }
}

fn resolve_max_len(config: &EngineConfig, model_max: usize) -> usize {
    config.max_model_len.map_or(model_max, |m| m.min(model_max))
}

impl EngineHandle {
    /// Resolve the device, load every model (decoders onto the device) and start the engine
    /// threads. Errors name the file or the device that failed.
    pub fn start(models: &[ModelSpec], config: &EngineConfig) -> Result<Self> {
        let device = crate::device::resolve(config.device)?;
        if matches!(device, Device::Cpu) && config.dtype != DTypeRequest::Auto {
            return Err(EngineError::BackendUnavailable(format!(
                "--dtype {} applies to GPU models; the CPU engine computes in f32 over the checkpoint's stored weights (use --dtype auto)",
                config.dtype
            )));
        }
        let mut loaded = Vec::with_capacity(models.len());
        for spec in models {
            tracing::info!(path = %spec.path, name = %spec.served_name, device = %device.label(), "loading model");
            let mut model = load(&spec.path)?;
            if let (Device::Gpu(gpu), LoadedModel::Decoder(d)) = (&device, &mut model) {
                d.model.set_activation_mode(config.activation_mode);
                d.model = d.model.to_gpu(gpu, config.dtype).map_err(|e| match e {
                    EngineError::BackendUnavailable(why) => EngineError::load(
                        spec.path.clone(),
                        format!("cannot run on {}: {why}", gpu.info().label()),
                    ),
                    other => other,
                })?;
            }
            loaded.push((spec.clone(), model));
        }
        Self::from_loaded(loaded, config)
    }

    /// Start serving models that are already loaded (tests, or a caller with its own loader).
    pub fn from_loaded(
        models: Vec<(ModelSpec, LoadedModel)>,
        config: &EngineConfig,
    ) -> Result<Self> {
        let active = config.max_num_active_seqs.unwrap_or(config.max_num_seqs);
        if active > config.max_num_seqs {
            return Err(EngineError::invalid(
                format!(
                    "max_num_active_seqs ({active}) must not exceed max_num_seqs ({})",
                    config.max_num_seqs
                ),
                Some("max_num_active_seqs"),
            ));
        }
        if config.block_size == 0 {
            return Err(EngineError::invalid(
                "block_size must be at least 1",
                Some("block_size"),
            ));
        }
        let mut handles: Vec<ModelHandle> = Vec::with_capacity(models.len());
        for (spec, model) in models {
            if handles
                .iter()
                .any(|h| h.inner.card.name == spec.served_name)
            {
                return Err(EngineError::invalid(
                    format!("model name '{}' is served twice", spec.served_name),
                    Some("served_model_name"),
                ));
            }
            let handle = match model {
                LoadedModel::Decoder(d) => start_decoder(&spec, d, config, active)?,
                LoadedModel::Encoder {
                    encoder,
                    chat_template,
                } => start_encoder(&spec, encoder, chat_template, config)?,
            };
            handles.push(handle);
        }
        Ok(EngineHandle {
            inner: Arc::new(handles),
        })
    }

    pub fn models(&self) -> Vec<ModelCard> {
        self.inner.iter().map(|m| m.inner.card.clone()).collect()
    }

    pub fn model(&self, name: &str) -> Option<ModelHandle> {
        self.inner
            .iter()
            .find(|m| m.inner.card.name == name)
            .cloned()
    }

    /// True while every engine thread is alive.
    pub fn is_healthy(&self) -> bool {
        self.inner.iter().all(ModelHandle::is_healthy)
    }
}

/// Dispatch a model path to its loader.
fn load(path: &str) -> Result<LoadedModel> {
    let p = Path::new(path);
    if !p.exists() {
        return Err(EngineError::load(path, "no such file or directory"));
    }
    match crate::hf::detect(p) {
        crate::hf::CheckpointKind::Gguf => {
            let file = if p.is_dir() {
                single_gguf(p)?
            } else {
                p.to_path_buf()
            };
            Ok(LoadedModel::Decoder(crate::gguf::load_decoder(&file)?))
        }
        crate::hf::CheckpointKind::Encoder => {
            let encoder = crate::hf::load_encoder(p)?;
            Ok(LoadedModel::Encoder {
                encoder,
                chat_template: crate::hf::read_chat_template(p),
            })
        }
        crate::hf::CheckpointKind::Decoder => Ok(LoadedModel::Decoder(crate::hf::load_decoder(p)?)),
        crate::hf::CheckpointKind::Unknown => Err(EngineError::load(
            path,
            "not a recognised model: expected a .gguf file or an HF folder with config.json",
        )),
    }
}

fn single_gguf(dir: &Path) -> Result<std::path::PathBuf> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| EngineError::load(dir.display().to_string(), e.to_string()))?;
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "gguf"))
        .ok_or_else(|| EngineError::load(dir.display().to_string(), "no .gguf file in the folder"))
}

fn compile_template(
    spec: &ModelSpec,
    source: Option<String>,
    bos: &Option<String>,
    eos: &Option<String>,
) -> Option<ChatTemplate> {
    let source = source?;
    match ChatTemplate::new(&source, bos.clone(), eos.clone()) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(model = %spec.served_name, "the checkpoint's chat template does not compile: {e}");
            None
        }
    }
}

fn start_decoder(
    spec: &ModelSpec,
    mut d: LoadedDecoder,
    config: &EngineConfig,
    active: usize,
) -> Result<ModelHandle> {
    d.model.set_activation_mode(config.activation_mode);
    let info = d.model.info().clone();
    let device = d.model.device();
    let max_model_len = resolve_max_len(config, info.max_position);
    let cfg = SchedulerConfig {
        max_num_seqs: config.max_num_seqs,
        max_num_active_seqs: active,
        max_num_batched_tokens: config.max_num_batched_tokens,
        block_size: config.block_size,
        kv_budget: KvBudget {
            tokens: config.kv_cache_tokens,
            gpu_memory_utilization: config.gpu_memory_utilization,
            max_batched_tokens: config.max_num_batched_tokens,
            max_seqs: active,
        },
        max_model_len,
        enable_prefix_caching: config.enable_prefix_caching,
        threads: config.threads,
    };
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
    metrics.placed(&device, config.block_size, num_blocks);
    std::thread::Builder::new()
        .name(format!("engine-{}", spec.served_name))
        .spawn(move || engine.run())
        .map_err(|e| EngineError::Internal(format!("cannot start the engine thread: {e}")))?;
    let template = compile_template(spec, d.chat_template, &d.bos_token, &d.eos_token);
    tracing::info!(
        model = %spec.served_name,
        architecture = %d.architecture,
        max_model_len,
        device = %device,
        kv_blocks = num_blocks,
        block_size = config.block_size,
        activations = %config.activation_mode,
        q8_kernels = ?kernels::q8_level(),
        "decoder ready"
    );
    Ok(ModelHandle {
        inner: Arc::new(ModelInner {
            card: ModelCard {
                name: spec.served_name.clone(),
                root: spec.path.clone(),
                max_model_len,
                device,
                tasks: vec![Task::Generate],
                input_modalities: std::iter::once("text")
                    .chain(d.media.as_ref().map(|m| m.modalities()).unwrap_or_default())
                    .map(str::to_string)
                    .collect(),
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
                media: d.media,
            }),
        }),
    })
}

fn start_encoder(
    spec: &ModelSpec,
    e: LoadedEncoder,
    chat_template: Option<String>,
    config: &EngineConfig,
) -> Result<ModelHandle> {
    let info = e.model.info().clone();
    let max_model_len = resolve_max_len(config, info.max_seq_len);
    let (tx, rx) = mpsc::sync_channel(config.max_num_seqs.max(1));
    let alive = Arc::new(AtomicBool::new(true));
    let worker_alive = alive.clone();
    let batch_tokens = config.max_num_batched_tokens.max(1);
    let model = e.model;
    std::thread::Builder::new()
        .name(format!("embed-{}", spec.served_name))
        .spawn(move || {
            let _guard = AliveFlag(worker_alive);
            embed_worker(model, rx, batch_tokens);
        })
        .map_err(|err| {
            EngineError::Internal(format!("cannot start the embedding thread: {err}"))
        })?;
    let template = compile_template(spec, chat_template, &None, &None);
    tracing::info!(model = %spec.served_name, architecture = %e.architecture, max_model_len, "encoder ready");
    Ok(ModelHandle {
        inner: Arc::new(ModelInner {
            card: ModelCard {
                name: spec.served_name.clone(),
                root: spec.path.clone(),
                max_model_len,
                device: "cpu".into(),
                tasks: vec![Task::Embed, Task::Score],
                input_modalities: vec!["text".into()],
            },
            tokenizer: Arc::new(e.tokenizer),
            template,
            bos_token: None,
            eos_token: None,
            metrics: Arc::new(ModelMetrics::new(&spec.served_name)),
            backend: Backend::Encoder(EncoderBackend {
                jobs: tx,
                alive,
                max_seq_len: max_model_len,
                hidden_size: info.hidden_size,
            }),
        }),
    })
}

struct AliveFlag(Arc<AtomicBool>);

impl Drop for AliveFlag {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Batch queued embedding jobs up to `batch_tokens` tokens and run them together.
fn embed_worker(model: Box<dyn EmbeddingModel>, rx: Receiver<EmbedJob>, batch_tokens: usize) {
    let mut pending: Option<EmbedJob> = None;
    loop {
        let first = match pending.take() {
            Some(j) => j,
            None => match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            },
        };
        let mut tokens: usize = first.inputs.iter().map(Vec::len).sum();
        let mut jobs = vec![first];
        while tokens < batch_tokens {
            match rx.try_recv() {
                Ok(j) => {
                    let t: usize = j.inputs.iter().map(Vec::len).sum();
                    if tokens + t > batch_tokens {
                        pending = Some(j);
                        break;
                    }
                    tokens += t;
                    jobs.push(j);
                }
                Err(_) => break,
            }
        }
        jobs.retain(|j| !j.reply.is_closed());
        if jobs.is_empty() {
            continue;
        }
        let batch: Vec<Vec<u32>> = jobs.iter().flat_map(|j| j.inputs.iter().cloned()).collect();
        let result = catch_unwind(AssertUnwindSafe(|| model.embed(&batch)));
        match result {
            Ok(Ok(vectors)) if vectors.len() == batch.len() => {
                let mut it = vectors.into_iter();
                for job in jobs {
                    let mine: Vec<Vec<f32>> = it.by_ref().take(job.inputs.len()).collect();
                    let _ = job.reply.send(Ok(mine));
                }
            }
            other => {
                let msg = match other {
                    Ok(Ok(v)) => format!(
                        "embedding model returned {} vectors for {} inputs",
                        v.len(),
                        batch.len()
                    ),
                    Ok(Err(e)) => format!("embedding failed: {e}"),
                    Err(_) => "embedding model panicked".to_string(),
                };
                tracing::error!("{msg}");
                for job in jobs {
                    let _ = job.reply.send(Err(EngineError::Internal(msg.clone())));
                }
            }
        }
    }
}

impl ModelHandle {
    pub fn card(&self) -> &ModelCard {
        &self.inner.card
    }

    pub fn kind(&self) -> ModelKind {
        match self.inner.backend {
            Backend::Decoder(_) => ModelKind::Decoder,
            Backend::Encoder(_) => ModelKind::Encoder,
        }
    }

    /// True while this model's engine (or embedding) thread is alive.
    pub fn is_healthy(&self) -> bool {
        match &self.inner.backend {
            Backend::Decoder(d) => d.shared.alive.load(Ordering::SeqCst),
            Backend::Encoder(e) => e.alive.load(Ordering::SeqCst),
        }
    }

    /// The scheduler's state after its latest step (decoders only).
    pub fn engine_stats(&self) -> Option<EngineStats> {
        match &self.inner.backend {
            Backend::Decoder(d) => Some(d.shared.stats()),
            Backend::Encoder(_) => None,
        }
    }

    /// Width of the vectors `embed` returns (encoders only).
    pub fn hidden_size(&self) -> Option<usize> {
        match &self.inner.backend {
            Backend::Encoder(e) => Some(e.hidden_size),
            Backend::Decoder(_) => None,
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.inner
            .tokenizer
            .encode(text, add_special_tokens)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| EngineError::Internal(format!("tokenisation failed: {e}")))
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let vocab = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::invalid(
                format!("Token id {bad} is out of vocabulary"),
                Some("prompt"),
            ));
        }
        self.inner
            .tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| EngineError::Internal(format!("detokenisation failed: {e}")))
    }

    /// The vocabulary entry of `id` (e.g. `ĠParis` for byte-level BPE).
    pub fn token_str(&self, id: u32) -> Option<String> {
        self.inner.tokenizer.id_to_token(id)
    }

    /// The text `id` decodes to on its own, special tokens included (e.g. ` Paris`).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.tokenizer.decode(&[id], false).ok()
    }

    /// The modalities this model's encoders take besides text (empty for text-only models).
    /// The model card advertises them once the gateway feeds media through
    /// [`ModelHandle::prepare_media`].
    pub fn media_modalities(&self) -> Vec<&'static str> {
        match &self.inner.backend {
            Backend::Decoder(DecoderBackend { media: Some(m), .. }) => m.modalities(),
            _ => Vec::new(),
        }
    }

    /// Expands the rendered prompt's media placeholders and runs the encoders (CPU work: call
    /// it off the async reactor). Returns the ids to submit and the media for
    /// [`GenerateRequest::media`].
    pub fn prepare_media(
        &self,
        ids: &[u32],
        items: &[crate::models::media::MediaInput<'_>],
    ) -> Result<(Vec<u32>, Arc<crate::api::PromptMedia>)> {
        match &self.inner.backend {
            Backend::Decoder(DecoderBackend { media: Some(m), .. }) => {
                let (ids, media) = m.prepare(ids, items)?;
                Ok((ids, Arc::new(media)))
            }
            _ => Err(EngineError::invalid(
                format!(
                    "The model `{}` accepts text input only.",
                    self.inner.card.name
                ),
                Some("messages"),
            )),
        }
    }

    pub fn vocab_size(&self) -> usize {
        let tok = self.inner.tokenizer.get_vocab_size(true);
        match &self.inner.backend {
            Backend::Decoder(d) => tok.min(d.model_vocab),
            Backend::Encoder(_) => tok,
        }
    }

    pub fn render_chat(
        &self,
        messages: &serde_json::Value,
        opts: &ChatTemplateOptions,
    ) -> Result<String> {
        if let Some(source) = &opts.chat_template {
            return crate::chat_template::render_once(
                source,
                self.inner.bos_token.clone(),
                self.inner.eos_token.clone(),
                messages,
                opts,
            );
        }
        match &self.inner.template {
            Some(t) => t.render(messages, opts),
            None => Err(EngineError::invalid(NO_TEMPLATE_MESSAGE, None)),
        }
    }

    pub fn generate(&self, req: GenerateRequest) -> Result<GenerationStream> {
        let Backend::Decoder(d) = &self.inner.backend else {
            return Err(EngineError::UnsupportedTask {
                task: "generate".into(),
            });
        };
        if !self.is_healthy() {
            return Err(EngineError::Stopped);
        }
        let prompt_len = req.prompt_ids.len();
        if let Some(m) = &req.media {
            m.check(prompt_len)
                .map_err(|msg| EngineError::invalid(msg, Some("messages")))?;
        }
        if prompt_len == 0 {
            return Err(EngineError::invalid(
                "The prompt cannot be empty",
                Some("prompt"),
            ));
        }
        let max_len = self.inner.card.max_model_len;
        if prompt_len >= max_len {
            return Err(EngineError::invalid(
                format!(
                    "This model's maximum context length is {max_len} tokens. However, your request has {prompt_len} input tokens. Please reduce the length of the input messages."
                ),
                Some("messages"),
            ));
        }
        if let Some(bad) = req
            .prompt_ids
            .iter()
            .find(|&&id| id as usize >= d.model_vocab)
        {
            return Err(EngineError::invalid(
                format!("Token id {bad} is out of vocabulary"),
                Some("prompt"),
            ));
        }
        let reserved = d
            .shared
            .held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < d.max_num_seqs).then_some(n + 1)
            });
        if reserved.is_err() {
            return Err(EngineError::Overloaded(format!(
                "the engine already holds {} sequences (max_num_seqs)",
                d.max_num_seqs
            )));
        }
        let seq_id = d.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = unbounded_channel();
        let params = req.params;
        let stream = GenerationStream {
            events: rx,
            cancel: Some((d.commands.clone(), seq_id)),
            detok: IncrementalDetokenizer::new(
                self.inner.tokenizer.clone(),
                &req.prompt_ids,
                params.skip_special_tokens,
            ),
            stops: StopMatcher::new(&params.stop, params.include_stop_str_in_output),
            include_stop_str_in_output: params.include_stop_str_in_output,
            min_tokens: params.min_tokens,
            prompt_tokens: prompt_len,
            completion_tokens: 0,
            cached_tokens: 0,
            done: false,
            metrics: self.inner.metrics.clone(),
            started: Instant::now(),
        };
        let submission = Submission {
            seq_id,
            request_id: req.request_id,
            prompt_ids: req.prompt_ids,
            params,
            hash_ctx: HashContext {
                cache_salt: req.cache_salt,
                media: req
                    .media
                    .as_ref()
                    .map(|m| m.items.clone())
                    .unwrap_or_default(),
                ..Default::default()
            },
            media: req.media,
            events: tx,
            arrived: Instant::now(),
        };
        if d.commands
            .send(Command::Submit(Box::new(submission)))
            .is_err()
        {
            d.shared.held.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::Stopped);
        }
        Ok(stream)
    }

    pub async fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>> {
        let Backend::Encoder(e) = &self.inner.backend else {
            return Err(EngineError::UnsupportedTask {
                task: "embed".into(),
            });
        };
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let vocab = self.inner.tokenizer.get_vocab_size(true);
        for (i, input) in inputs.iter().enumerate() {
            if input.is_empty() {
                return Err(EngineError::invalid(
                    format!("input {i} is empty"),
                    Some("input"),
                ));
            }
            if input.len() > e.max_seq_len {
                return Err(EngineError::invalid(
                    format!(
                        "This model's maximum context length is {} tokens. However, input {i} has {} tokens.",
                        e.max_seq_len,
                        input.len()
                    ),
                    Some("input"),
                ));
            }
            if let Some(bad) = input.iter().find(|&&id| id as usize >= vocab) {
                return Err(EngineError::invalid(
                    format!("Token id {bad} is out of vocabulary"),
                    Some("input"),
                ));
            }
        }
        let (reply, wait) = oneshot::channel();
        match e.jobs.try_send(EmbedJob { inputs, reply }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(EngineError::Overloaded(
                    "the embedding queue is full".into(),
                ))
            }
            Err(TrySendError::Disconnected(_)) => return Err(EngineError::Stopped),
        }
        wait.await
            .map_err(|_| EngineError::Internal("the embedding worker stopped".into()))?
    }
}

/// Output of one sequence. Dropping it cancels the sequence and frees its KV blocks.
pub struct GenerationStream {
    events: UnboundedReceiver<SeqEvent>,
    cancel: Option<(Sender<Command>, u64)>,
    detok: IncrementalDetokenizer,
    stops: StopMatcher,
    include_stop_str_in_output: bool,
    min_tokens: usize,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
    done: bool,
    metrics: Arc<ModelMetrics>,
    started: Instant,
}

impl GenerationStream {
    /// The next increment; `None` after the delta that carries `finish`.
    pub async fn next(&mut self) -> Option<Result<Delta>> {
        if self.done {
            return None;
        }
        let Some(first) = self.events.recv().await else {
            self.done = true;
            self.cancel = None;
            return Some(Err(EngineError::Internal(
                "the engine stopped before the sequence finished".into(),
            )));
        };
        let mut delta = Delta::default();
        if let Err(e) = self.apply(first, &mut delta) {
            self.abort();
            return Some(Err(e));
        }
        while delta.finish.is_none() {
            match self.events.try_recv() {
                Ok(ev) => {
                    if let Err(e) = self.apply(ev, &mut delta) {
                        self.abort();
                        return Some(Err(e));
                    }
                }
                Err(_) => break,
            }
        }
        Some(Ok(delta))
    }

    /// End the stream after an error: no more deltas, and the engine drops the sequence.
    fn abort(&mut self) {
        self.done = true;
        if let Some((tx, id)) = self.cancel.take() {
            let _ = tx.send(Command::Cancel(id));
        }
    }

    fn apply(&mut self, ev: SeqEvent, delta: &mut Delta) -> Result<()> {
        match ev {
            SeqEvent::Failed(e) => {
                self.done = true;
                self.cancel = None;
                Err(e)
            }
            SeqEvent::Finished(finish) => {
                self.finish(finish, delta);
                Ok(())
            }
            SeqEvent::Token {
                id,
                logprobs,
                cached_tokens,
                finish,
            } => {
                self.completion_tokens += 1;
                self.cached_tokens = cached_tokens;
                delta.token_ids.push(id);
                if let Some(lp) = logprobs {
                    delta.logprobs.push(lp);
                }
                let stop_token = finish.as_ref().is_some_and(|f| {
                    matches!(
                        f.stop_reason,
                        Some(StopReason::Eos) | Some(StopReason::TokenId(_))
                    )
                });
                let piece = if stop_token && !self.include_stop_str_in_output {
                    String::new()
                } else {
                    self.detok.push(id)?
                };
                let allow = self.completion_tokens > self.min_tokens;
                let check = self.stops.push(&piece, allow);
                delta.text.push_str(&check.text);
                if let Some(stop) = check.stopped {
                    let finish = Finish {
                        reason: FinishReason::Stop,
                        stop_reason: Some(StopReason::String(stop)),
                        prompt_tokens: self.prompt_tokens,
                        completion_tokens: self.completion_tokens,
                        cached_tokens: self.cached_tokens,
                    };
                    // The engine may still be generating: cancel it now.
                    if let Some((tx, id)) = self.cancel.take() {
                        let _ = tx.send(Command::Cancel(id));
                    }
                    self.record(FinishReason::Stop);
                    self.done = true;
                    delta.finish = Some(finish);
                    return Ok(());
                }
                if let Some(f) = finish {
                    let tail = self.detok.flush()?;
                    let check = self.stops.push(&tail, allow);
                    delta.text.push_str(&check.text);
                    // The flushed tail (an incomplete character) may still complete a stop string.
                    let f = match check.stopped {
                        Some(stop) => Finish {
                            reason: FinishReason::Stop,
                            stop_reason: Some(StopReason::String(stop)),
                            ..f
                        },
                        None => f,
                    };
                    self.finish(f, delta);
                }
                Ok(())
            }
        }
    }

    fn finish(&mut self, finish: Finish, delta: &mut Delta) {
        delta.text.push_str(&self.stops.flush());
        self.record(finish.reason);
        self.done = true;
        self.cancel = None;
        delta.finish = Some(finish);
    }

    fn record(&self, reason: FinishReason) {
        self.metrics
            .request_finished(reason, self.started.elapsed());
    }
}

impl Drop for GenerationStream {
    fn drop(&mut self) {
        if let Some((tx, id)) = self.cancel.take() {
            let _ = tx.send(Command::Cancel(id));
            if !self.done {
                self.record(FinishReason::Abort);
            }
        }
    }
}
