//! The engine handle the gateway holds: cheap to clone, thread-safe, async at the edge.
//!
//! Each decoder runs on its own engine thread ([`crate::scheduler`]); each embedding model on its
//! own worker thread that batches concurrent requests. [`GenerationStream`] turns the engine's
//! token events into text deltas (incremental detokenisation and stop strings run here, on the
//! async side) and cancels its sequence when dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, SyncSender};
use std::sync::Arc;
use std::time::Instant;

use tokenizers::Tokenizer;
use tokio::sync::mpsc::unbounded_channel;

use crate::api::{ChatTemplateOptions, Constraint, GenerateRequest, ModelCard};
use crate::block_manager::HashContext;
use crate::chat_template::{ChatTemplate, NO_TEMPLATE_MESSAGE};
use crate::detok::{IncrementalDetokenizer, StopMatcher};
use crate::device::{DTypeRequest, Device, DeviceRequest};
use crate::error::{EngineError, Result};
use crate::load::LoadedDecoder;
use crate::metrics::ModelMetrics;
use crate::model::{ActivationMode, LoadedEncoder};
use crate::scheduler::{Command, EngineStats, Shared, Submission};

mod embed;
mod footprint;
mod front_door;
mod load;
mod lora;
mod media_worker;
mod pad;
mod place;
mod pool;
mod start;
mod stream;

use embed::EmbedJob;
pub use front_door::{
    off_reactor, Choice, Prompt, PromptOptions, PromptSource, Started, SubmitOptions,
};
use load::load;
pub use lora::AdapterCard;
use media_worker::MediaWorker;
pub use pool::{pair_indices, PoolInput, PoolOptions, PoolTask, Pooled};
use start::{start_decoder, start_encoder};
pub use stream::GenerationStream;

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
    /// The KV cache's element type (`--kv-cache-dtype`): CPU decoders store f32, f16 or bf16;
    /// a GPU model's cache takes the model's type.
    pub kv_cache_dtype: crate::model::KvDtype,
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
    /// Where weights come from (`--load-format`).
    pub load_format: crate::weight_cache::LoadFormat,
    /// `--model-loader-extra-config`, for `--load-format ipc_cache`.
    pub loader: crate::weight_cache::LoaderConfig,
    /// Seed of the sampler unseeded requests draw from (`--seed`); `None`: a fresh one.
    pub seed: Option<u64>,
    /// A chat template that replaces every generation model's own (`--chat-template`); one
    /// that does not compile stops the start.
    pub chat_template: Option<String>,
    /// How each model is served (`--runner`, `--convert`): a decoder may be served as an
    /// embedding model.
    pub run_as: crate::load::RunAs,
    /// `--enable-lora` (`None`: off) and its adapters.
    pub lora: Option<crate::lora::LoraConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_model_len: None,
            max_num_seqs: 256,
            max_num_active_seqs: None,
            max_num_batched_tokens: 2048,
            kv_cache_tokens: None,
            kv_cache_dtype: crate::model::KvDtype::Auto,
            block_size: 16,
            enable_prefix_caching: true,
            threads: None,
            activation_mode: ActivationMode::default(),
            device: DeviceRequest::Auto,
            dtype: DTypeRequest::Auto,
            gpu_memory_utilization: 0.9,
            load_format: crate::weight_cache::LoadFormat::Auto,
            loader: crate::weight_cache::LoaderConfig::default(),
            seed: None,
            chat_template: None,
            run_as: crate::load::RunAs::default(),
            lora: None,
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

/// One served model, or a decoder seen through one of its LoRA adapters.
#[derive(Clone)]
pub struct ModelHandle {
    inner: Arc<ModelInner>,
    lora: Option<Arc<lora::AdapterView>>,
}

struct ModelInner {
    card: ModelCard,
    tokenizer: Arc<Tokenizer>,
    /// The most bytes of text one token stands for (the longest vocabulary entry).
    max_token_bytes: usize,
    template: Option<ChatTemplate>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    metrics: Arc<ModelMetrics>,
    backend: Backend,
}

/// Slots taken for a request's choices before the first starts; what no choice used is given
/// back on drop.
pub(crate) struct Reserved {
    shared: Arc<Shared>,
    group: u64,
    left: usize,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.shared.slots.release(self.group, self.left);
    }
}

fn overloaded(max_num_seqs: usize) -> EngineError {
    EngineError::Overloaded(format!(
        "the engine already holds {max_num_seqs} sequences (max_num_seqs) and every request present has its fair share"
    ))
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
    /// The worker running the checkpoint's vision or audio encoders.
    media: Option<MediaWorker>,
    /// The LoRA adapters it runs (`--enable-lora` on a model that can).
    lora: Option<Arc<crate::lora::LoraRegistry>>,
}

struct EncoderBackend {
    jobs: SyncSender<EmbedJob>,
    alive: Arc<AtomicBool>,
    max_seq_len: usize,
    hidden_size: usize,
    head: crate::model::EncoderHead,
    /// Sentence vectors are normalised unless a request says otherwise.
    normalize: bool,
    /// The tokenizer's pad token (`padding: "max_length"`), if it names one.
    pad_id: Option<u32>,
}

impl Drop for DecoderBackend {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
    }
}

/// The most sequences in one step (`--max-num-active-seqs`, at most `--max-num-seqs`), once
/// the scheduler's limits are checked.
fn active_seqs(config: &EngineConfig) -> Result<usize> {
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
    Ok(active)
}

impl EngineHandle {
    /// Resolve the device, load every model (decoders onto the device) and start the engine
    /// threads. Errors name the file or the device that failed.
    pub fn start(models: &[ModelSpec], config: &EngineConfig) -> Result<Self> {
        Self::start_with(models, config, crate::fault::gpu_opener())
    }

    /// [`EngineHandle::start`] with GPUs opened through `opener` (tests open the emulator, or
    /// a fault injector around it). Every step of bringing a decoder up on the GPU is named:
    /// under `--device auto` a failed step serves the model on the CPU with one log line
    /// saying why; under `--device cuda` it fails the start naming the step.
    pub fn start_with(
        models: &[ModelSpec],
        config: &EngineConfig,
        opener: &dyn kernels::gpu::Opener,
    ) -> Result<Self> {
        // Only decoders run on a GPU: with none, `auto` opens no device (no context, no kernel
        // compile); an explicit `cuda` is still checked, so a wrong flag does not pass unseen.
        // The device is settled before anything loads, so a bad flag fails at once.
        let has_decoder = models.iter().any(|m| {
            matches!(
                crate::load::served_kind(std::path::Path::new(&m.path), config.run_as),
                Ok(crate::load::CheckpointKind::Gguf | crate::load::CheckpointKind::Decoder)
            )
        });
        let device = match (config.device, &config.lora) {
            // The GPU decoder runs no adapters: LoRA deployments run on the CPU.
            (DeviceRequest::Cuda(_), Some(_)) => {
                return Err(EngineError::BackendUnavailable(
                    "--enable-lora: the GPU decoder does not run LoRA adapters; serve with --device cpu (or auto, which places LoRA deployments on the CPU)".into(),
                ))
            }
            (DeviceRequest::Auto, Some(_)) if has_decoder => {
                tracing::info!("--device auto: --enable-lora serves the decoders on the CPU (the GPU decoder runs no adapters)");
                Device::Cpu
            }
            _ if has_decoder || matches!(config.device, DeviceRequest::Cuda(_)) => {
                crate::device::resolve_with(config.device, opener)?
            }
            _ => Device::Cpu,
        };
        if matches!(device, Device::Cpu) && config.dtype != DTypeRequest::Auto {
            return Err(EngineError::BackendUnavailable(format!(
                "--dtype {} applies to GPU models; the CPU engine computes in f32 over the checkpoint's stored weights (use --dtype auto)",
                config.dtype
            )));
        }
        let active = active_seqs(config)?;
        let mut loaded = Vec::with_capacity(models.len());
        let mut kv_ready = Vec::with_capacity(models.len());
        let mut weights = Vec::with_capacity(models.len());
        let device_label = device.label();
        for spec in models {
            tracing::info!(path = %spec.path, name = %spec.served_name, "loading model");
            // Models load one after another before anything serves, so what the process
            // kept across a load is that model's.
            let before = footprint::rss_anon();
            let (mut model, cached) = load(spec, config, &device_label)?;
            weights.push(footprint::weights(
                std::path::Path::new(&spec.path),
                before,
                footprint::rss_anon(),
            ));
            if let LoadedModel::Decoder(d) = &mut model {
                let max_len = start::resolve_max_len(config, d.model.info().max_position);
                d.model.fit_context(max_len);
            }
            let kv = match (&device, model) {
                (Device::Gpu(gpu), LoadedModel::Decoder(mut d)) => {
                    d.model.set_activation_mode(config.activation_mode);
                    let placed = place::place_on_gpu(d.model.as_mut(), gpu, config, active, cached);
                    let kv = match placed {
                        Ok(placed) => {
                            d.model = placed.model;
                            Some(placed.kv_blocks)
                        }
                        Err(e) if config.device == DeviceRequest::Auto => {
                            tracing::warn!(
                                "--device auto: serving {} on the CPU: {} {e}",
                                spec.served_name,
                                gpu.info().label()
                            );
                            None
                        }
                        Err(e) => {
                            return Err(EngineError::load(
                                spec.path.clone(),
                                format!("--device {}: {} {e}", config.device, gpu.info().label()),
                            ))
                        }
                    };
                    loaded.push((spec.clone(), LoadedModel::Decoder(d)));
                    kv
                }
                (_, model) => {
                    loaded.push((spec.clone(), model));
                    None
                }
            };
            kv_ready.push(kv);
        }
        Self::start_loaded(loaded, kv_ready, weights, config)
    }

    /// Start serving models that are already loaded (tests, or a caller with its own loader).
    pub fn from_loaded(
        models: Vec<(ModelSpec, LoadedModel)>,
        config: &EngineConfig,
    ) -> Result<Self> {
        let none = vec![None; models.len()];
        // Loaded elsewhere: only the files are known of their weights.
        let weights = models
            .iter()
            .map(|(spec, _)| footprint::weight_file_bytes(std::path::Path::new(&spec.path)))
            .collect();
        Self::start_loaded(models, none, weights, config)
    }

    /// Start the models; `kv_ready[i]` is the block count of a cache model `i` already holds,
    /// `weights[i]` its weights' bytes as loaded.
    fn start_loaded(
        models: Vec<(ModelSpec, LoadedModel)>,
        kv_ready: Vec<Option<usize>>,
        weights: Vec<u64>,
        config: &EngineConfig,
    ) -> Result<Self> {
        let active = active_seqs(config)?;
        let mut handles: Vec<ModelHandle> = Vec::with_capacity(models.len());
        for (((spec, model), kv), weights) in models.into_iter().zip(kv_ready).zip(weights) {
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
                LoadedModel::Decoder(d) => start_decoder(&spec, d, config, active, kv, weights)?,
                LoadedModel::Encoder {
                    encoder,
                    chat_template,
                } => start_encoder(&spec, encoder, chat_template, config, weights)?,
            };
            handles.push(handle);
        }
        let engine = EngineHandle {
            inner: Arc::new(handles),
        };
        if let Some(lora) = &config.lora {
            engine.load_static_loras(lora)?;
        }
        Ok(engine)
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

impl ModelHandle {
    /// The model's card; through an adapter, the base's named after the adapter.
    pub fn card(&self) -> &ModelCard {
        self.lora.as_ref().map_or(&self.inner.card, |v| &v.card)
    }

    pub fn kind(&self) -> ModelKind {
        match self.inner.backend {
            Backend::Decoder(_) => ModelKind::Decoder,
            Backend::Encoder(_) => ModelKind::Encoder,
        }
    }

    /// The fewest tokens a text of `bytes` bytes can encode to: no token stands for more than
    /// the longest vocabulary entry, and normalisers are given a factor of two. A prompt this
    /// bound already proves too long is refused before it is tokenised.
    pub fn min_tokens_for(&self, bytes: usize) -> usize {
        bytes / (2 * self.inner.max_token_bytes.max(1))
    }

    /// The most sequences the decoder holds at once (`--max-num-seqs`); `None` for encoders.
    /// A request needing more can never be served and is refused, not queued.
    pub fn max_num_seqs(&self) -> Option<usize> {
        match &self.inner.backend {
            Backend::Decoder(d) => Some(d.max_num_seqs),
            Backend::Encoder(_) => None,
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
    pub fn media_modalities(&self) -> Vec<::media::Modality> {
        match &self.inner.backend {
            Backend::Decoder(DecoderBackend { media: Some(m), .. }) => m.modalities(),
            _ => Vec::new(),
        }
    }

    /// How this model's processor turns media into the tensors its encoders take, loaded with
    /// the model from its folder's processor files; `None` for text-only models.
    pub fn media_spec(&self) -> Option<&::media::spec::ModelMediaSpec> {
        match &self.inner.backend {
            Backend::Decoder(DecoderBackend { media: Some(m), .. }) => Some(m.spec()),
            _ => None,
        }
    }

    /// Expands the rendered prompt's media placeholders (one per item, in prompt order) and
    /// runs the encoders on the model's media worker. Returns the ids to submit and the media
    /// for [`GenerateRequest::media`].
    pub async fn prepare_media(
        &self,
        ids: Vec<u32>,
        items: Vec<Arc<::media::ProcessedMedia>>,
    ) -> Result<(Vec<u32>, Arc<crate::api::PromptMedia>)> {
        match &self.inner.backend {
            Backend::Decoder(DecoderBackend { media: Some(m), .. }) => m.prepare(ids, items).await,
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

    /// Compile a structured-output constraint without generating, so a bad grammar is refused
    /// before a response starts. `InvalidRequest` (with no `param`) names what is unsupported.
    /// CPU work of a few milliseconds (more on a model's first constrained request, which builds
    /// its token trie): call it off the async reactor.
    pub fn check_constraint(&self, c: &Constraint) -> Result<()> {
        let Backend::Decoder(d) = &self.inner.backend else {
            return Err(EngineError::UnsupportedTask {
                task: "generate".into(),
            });
        };
        self.guides(d)?.compile(c).map(drop)
    }

    fn guides(&self, d: &DecoderBackend) -> Result<Arc<crate::constraint::GuideFactory>> {
        d.shared
            .guides
            .get_or_init(|| {
                let started = Instant::now();
                let built = crate::constraint::GuideFactory::new(
                    self.inner.tokenizer.clone(),
                    d.model_vocab,
                    self.inner.eos_token.as_deref(),
                );
                tracing::info!(
                    model = %self.inner.card.name,
                    ms = started.elapsed().as_millis() as u64,
                    ok = built.is_ok(),
                    "structured-output token trie built"
                );
                built.map(Arc::new).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| EngineError::invalid(e, None))
    }

    /// Start one sequence, as a request of its own.
    pub fn generate(&self, req: GenerateRequest) -> Result<GenerationStream> {
        self.generate_in(req, None)
    }

    /// Admit a request of `k` sequences whole, or refuse it whole as overload
    /// ([`crate::share`]): its choices then start with [`Self::generate_in`].
    pub(crate) fn reserve(&self, k: usize) -> Result<Reserved> {
        let Backend::Decoder(d) = &self.inner.backend else {
            return Err(EngineError::UnsupportedTask {
                task: "generate".into(),
            });
        };
        let group = d.next_id.fetch_add(1, Ordering::Relaxed);
        if !d.shared.slots.take(group, k, d.max_num_seqs) {
            return Err(overloaded(d.max_num_seqs));
        }
        Ok(Reserved {
            shared: Arc::clone(&d.shared),
            group,
            left: k,
        })
    }

    /// Start one sequence: a choice of a reserved request, or a request of its own.
    pub(crate) fn generate_in(
        &self,
        req: GenerateRequest,
        reserved: Option<&mut Reserved>,
    ) -> Result<GenerationStream> {
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
        if req.params.prompt_logprobs.is_some() && self.inner.card.device != "cpu" {
            return Err(EngineError::invalid(
                format!(
                    "prompt_logprobs are not supported for a model on {}: the GPU decoder computes logits only for the rows it samples",
                    self.inner.card.device
                ),
                Some("prompt_logprobs"),
            ));
        }
        let rules =
            crate::constraint::prepare(&req.params, &self.inner.tokenizer, d.model_vocab, || {
                self.guides(d)
            })?;
        let group = match reserved {
            Some(r) if r.left > 0 => {
                r.left -= 1;
                r.group
            }
            _ => {
                let group = d.next_id.fetch_add(1, Ordering::Relaxed);
                if !d.shared.slots.take(group, 1, d.max_num_seqs) {
                    return Err(overloaded(d.max_num_seqs));
                }
                group
            }
        };
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
            group,
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
                lora: self.lora().map(|a| (a.name.clone(), a.path.clone())),
            },
            media: req.media,
            lora: self.lora().cloned(),
            rules,
            events: tx,
            arrived: Instant::now(),
        };
        if d.commands
            .send(Command::Submit(Box::new(submission)))
            .is_err()
        {
            d.shared.slots.release(group, 1);
            return Err(EngineError::Stopped);
        }
        Ok(stream)
    }
}
