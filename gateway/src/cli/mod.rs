//! The command line: `gateway serve | contract | preload | upgrade-check`. `serve` takes every flag of
//! `vllm serve` 0.31 as vLLM spells it: [`vllm_flags`] is the table of what each does here,
//! [`vllm_args`] builds parsing, `--help`, the `--config` YAML reader and the README's table
//! from it; the flags it honours are the fields of [`ServeArgs`].

use std::path::PathBuf;

pub mod values;
pub mod vllm_args;
pub mod vllm_flags;

pub use vllm_args::{parse, CliError, Parsed, Review};

use clap::{ArgAction, Args, Parser, Subcommand};
use engine::device::{DTypeRequest, DeviceRequest};
use engine::model::ActivationMode;

#[derive(Debug, Parser)]
#[command(
    name = "gateway",
    version,
    about = "OpenAI-compatible inference server with a strict multimodal trust policy"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the models over HTTP.
    Serve(Box<ServeArgs>),
    /// Run the contract suite (trust gate and validation matrix) against a deployment.
    Contract(ContractArgs),
    /// Load a model's weights once and hold them for `serve --load-format ipc_cache`.
    Preload(PreloadArgs),
    /// Run the upgrade's acceptance checks against a deployment: one pass/fail table.
    UpgradeCheck(UpgradeCheckArgs),
}

#[derive(Debug, Clone, Args)]
pub struct PreloadArgs {
    /// The checkpoint to hold: a GGUF file, an HF folder, or a hub id (found in the local
    /// Hugging Face cache or downloaded into it, as `serve` does). Without it, the default
    /// chat model.
    #[arg(long = "model", value_name = "PATH")]
    pub model: Option<String>,
    #[command(flatten)]
    pub hub: HubArgs,
    /// The name `serve` gives the model (it finds this daemon by it); default: the path, or
    /// the default chat model's name.
    #[arg(long = "served-model-name", value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Must match the engines' `--dtype`.
    #[arg(
        long = "dtype",
        value_name = "auto|bfloat16|float16|float32",
        default_value = "auto"
    )]
    pub dtype: DTypeRequest,
    /// Where the held weights live: `cpu` (shared memory), or `cuda[:N]` (the files' bytes in
    /// shared memory and the converted device weights on that GPU, exported to engines on it).
    #[arg(long = "device", value_name = "cpu|cuda[:N]", default_value = "cpu")]
    pub device: DeviceRequest,
    /// The socket folder (created mode 0700); default `$XDG_RUNTIME_DIR/gateway-weight-cache`
    /// or a per-user folder in the temp folder.
    #[arg(long = "weight-cache-socket-dir", value_name = "DIR")]
    pub socket_dir: Option<PathBuf>,
    /// Health server host (only with --weight-cache-health-port).
    #[arg(long = "weight-cache-health-host", default_value = "127.0.0.1")]
    pub health_host: String,
    /// Serve `GET /health` on this port: 200 once the weights are held and every part runs.
    #[arg(long = "weight-cache-health-port")]
    pub health_port: Option<u16>,
    /// On SIGTERM with engines still attached, release the weights after this many seconds
    /// anyway (default: wait until they detach).
    #[arg(long = "force", value_name = "SECONDS")]
    pub force: Option<f64>,
    /// Where `scripts/fetch-models.sh` put the default models.
    #[arg(
        long = "models-cache",
        env = "MODELS_CACHE",
        default_value = "models-cache"
    )]
    pub models_cache: PathBuf,
}

/// Where hub ids come from, for `serve` and `preload` alike.
#[derive(Debug, Clone, Default, Args)]
pub struct HubArgs {
    /// The revision (branch, tag or commit) of hub ids (default main).
    #[arg(long = "revision", value_name = "REV")]
    pub revision: Option<String>,
    /// The Hugging Face cache folder hub ids are looked up in and downloaded into (default:
    /// $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub).
    #[arg(long = "download-dir", value_name = "DIR")]
    pub download_dir: Option<PathBuf>,
    /// The token hub downloads send (default: $HF_TOKEN, else the token file
    /// `huggingface-cli login` writes); bare, the token file.
    #[arg(long = "hf-token", value_name = "TOKEN", num_args = 0..=1, default_missing_value = "")]
    pub hf_token: Option<String>,
}

/// The flags of `gateway serve` that this server declares itself: those of `vllm serve` it
/// honours (each a row of [`vllm_flags::FLAGS`] answered `Honoured`) and its own. A `--x` /
/// `--no-x` flag of vLLM's is declared as `--x[=BOOL]`: the parser writes `--no-x` as
/// `--x=false`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The model, as `vllm serve MODEL` takes it: a GGUF file, an HF checkpoint folder, or a
    /// Hugging Face hub id (from the local hub cache, downloaded into it when absent). Served
    /// first, before any --model.
    #[arg(value_name = "MODEL")]
    pub model_arg: Option<String>,
    /// Model to serve: a GGUF file, an HF checkpoint folder or a hub id (repeatable). Without any (and no MODEL), the two default models are served from the
    /// models cache.
    #[arg(long = "model", value_name = "PATH")]
    pub model: Vec<String>,
    #[command(flatten)]
    pub hub: HubArgs,
    /// The tokenizer: accepted when it names the model itself (its path or hub id); a
    /// tokenizer apart from the model's is not built yet.
    #[arg(long = "tokenizer", value_name = "NAME")]
    pub tokenizer: Option<String>,
    /// The tokenizer's revision: accepted when it is the model's own (--revision, default
    /// main).
    #[arg(long = "tokenizer-revision", value_name = "REV")]
    pub tokenizer_revision: Option<String>,
    /// Names clients use: for one model, every name given (the first answers); for several
    /// --model, one name each, in the same order.
    #[arg(long = "served-model-name", value_name = "NAME", num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// `auto` (a decoder folder whose sentence-transformers files name a Pooling module, an
    /// architecture that only embeds such as `Qwen3Model`, and an encoder pool; other
    /// decoders generate), `generate` or `pooling`.
    #[arg(long = "runner", default_value = "auto", value_parser = ["auto", "draft", "generate", "pooling"])]
    pub runner: String,
    /// `auto`, `none` or `embed` (an HF decoder folder served as an embedding model);
    /// `classify` and `reward` are not built.
    #[arg(long = "convert", default_value = "auto", value_parser = ["auto", "none", "embed", "classify", "reward"])]
    pub convert: String,
    /// No effect, and the start-up log says so: no code from a checkpoint runs here.
    #[arg(long = "trust-remote-code", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", action = ArgAction::Set)]
    pub trust_remote_code: bool,
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// HTTPS: the server's certificate chain (PEM); the private key may be in the same file.
    #[arg(long = "ssl-certfile", value_name = "FILE")]
    pub ssl_certfile: Option<PathBuf>,
    /// HTTPS: the private key (PEM: PKCS#8, PKCS#1 or SEC1), with --ssl-certfile.
    #[arg(long = "ssl-keyfile", value_name = "FILE")]
    pub ssl_keyfile: Option<PathBuf>,
    /// HTTPS: the CA certificates (PEM) client certificates are checked against.
    #[arg(long = "ssl-ca-certs", value_name = "FILE")]
    pub ssl_ca_certs: Option<PathBuf>,
    /// HTTPS client certificates: 0 none asked for, 1 optional (a bad one is refused), 2
    /// required (needs --ssl-ca-certs).
    #[arg(long = "ssl-cert-reqs", value_name = "0|1|2", default_value_t = 0)]
    pub ssl_cert_reqs: u8,
    /// HTTPS: reload the certificate, key and CA files when they change; new connections
    /// get them (checked every second).
    #[arg(long = "enable-ssl-refresh", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", action = ArgAction::Set)]
    pub enable_ssl_refresh: bool,
    /// Serve under this path prefix too (behind a proxy that forwards it): `/PREFIX/v1/...`
    /// is answered as `/v1/...`.
    #[arg(long = "root-path", value_name = "PATH")]
    pub root_path: Option<String>,
    /// API key(s) clients must send as `Authorization: Bearer <key>`. Also read from
    /// VLLM_API_KEY.
    #[arg(long = "api-key", env = "VLLM_API_KEY", value_delimiter = ',', num_args = 1..)]
    pub api_key: Vec<String>,
    /// CORS: the origins allowed, a JSON list (e.g. '["https://a.example"]' or '["*"]'). Any
    /// of the CORS flags turns CORS on; without them no CORS headers are sent.
    #[arg(long = "allowed-origins", value_name = "JSON")]
    pub allowed_origins: Option<String>,
    /// CORS: the methods allowed, a JSON list (default '["*"]').
    #[arg(long = "allowed-methods", value_name = "JSON")]
    pub allowed_methods: Option<String>,
    /// CORS: the request headers allowed, a JSON list (default '["*"]').
    #[arg(long = "allowed-headers", value_name = "JSON")]
    pub allowed_headers: Option<String>,
    /// CORS: send Access-Control-Allow-Credentials.
    #[arg(long = "allow-credentials", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", action = ArgAction::Set)]
    pub allow_credentials: Option<bool>,
    /// The log level: critical, error, warning, info (default), debug or trace. RUST_LOG wins.
    #[arg(long = "uvicorn-log-level", value_parser = ["critical", "error", "warning", "info", "debug", "trace"])]
    pub uvicorn_log_level: Option<String>,
    /// The log level as vLLM's logger names it: CRITICAL, ERROR, WARNING, INFO, DEBUG or
    /// NOTSET. RUST_LOG wins; with --uvicorn-log-level, the more detailed of the two.
    #[arg(long = "log-level", ignore_case = true, value_parser = ["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET"])]
    pub log_level: Option<String>,
    /// Log one line per generation request (id, route, model, prompt length, sampling fields).
    #[arg(long = "enable-log-requests", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", action = ArgAction::Set)]
    pub enable_log_requests: bool,
    /// With --enable-log-requests: the most characters of a prompt a log line shows.
    #[arg(long = "max-log-len", value_name = "N")]
    pub max_log_len: Option<usize>,
    /// Turn off the per-request access log (a debug-level line per request).
    #[arg(long = "disable-uvicorn-access-log", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", action = ArgAction::Set)]
    pub disable_uvicorn_access_log: bool,
    /// Paths left out of the access log, comma-separated (e.g. /health,/metrics).
    #[arg(long = "disable-access-log-for-endpoints", value_name = "PATHS")]
    pub disable_access_log_for_endpoints: Option<String>,
    /// Let every client send mm_processor_kwargs / media_io_kwargs (vLLM's meaning: no bounds).
    #[arg(long = "trust-request-mm-kwargs", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", action = ArgAction::Set)]
    pub trust_request_mm_kwargs: bool,
    /// Deployment defaults for the multimodal processor (a flat JSON object).
    #[arg(long = "mm-processor-kwargs", value_name = "JSON")]
    pub mm_processor_kwargs: Option<String>,
    /// Deployment defaults for media loading, keyed by modality, e.g. '{"video": {"num_frames": 40}}'.
    #[arg(long = "media-io-kwargs", value_name = "JSON")]
    pub media_io_kwargs: Option<String>,
    /// Items per modality allowed in one prompt, e.g. '{"image": 2}'.
    #[arg(long = "limit-mm-per-prompt", value_name = "JSON")]
    pub limit_mm_per_prompt: Option<String>,
    /// Folder under which `file:` media URLs may be read (empty: none).
    #[arg(long = "allowed-local-media-path", value_name = "DIR")]
    pub allowed_local_media_path: Option<PathBuf>,
    /// Hosts media may be fetched from (exact match after URL normalisation).
    #[arg(long = "allowed-media-domains", value_name = "HOST", num_args = 1.., value_delimiter = ',')]
    pub allowed_media_domains: Vec<String>,
    /// Allow media URLs that resolve to loopback, private or other non-global addresses.
    #[arg(long = "allow-private-media-hosts")]
    pub allow_private_media_hosts: bool,
    /// Accept a per-request `chat_template`.
    #[arg(long = "trust-request-chat-template", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", action = ArgAction::Set)]
    pub trust_request_chat_template: bool,
    /// The chat template of every generation model served, instead of the checkpoint's: a
    /// file, or the Jinja template itself.
    #[arg(long = "chat-template", value_name = "FILE|TEMPLATE")]
    pub chat_template: Option<String>,
    /// The role of chat replies.
    #[arg(long = "response-role", default_value = "assistant")]
    pub response_role: String,
    /// Let the model decide on tool calls (`tool_choice: auto`, the default with tools); needs
    /// --tool-call-parser.
    #[arg(long = "enable-auto-tool-choice", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", action = ArgAction::Set)]
    pub enable_auto_tool_choice: bool,
    /// How tool calls are found in a reply: hermes, llama3_json, mistral or pythonic.
    #[arg(long = "tool-call-parser", value_name = "NAME")]
    pub tool_call_parser: Option<String>,
    /// Split `<think>` reasoning from the answer: deepseek_r1 or qwen3.
    #[arg(long = "reasoning-parser", value_name = "NAME")]
    pub reasoning_parser: Option<String>,
    /// Chat template kwargs every request gets (a JSON object; the request's win).
    #[arg(long = "default-chat-template-kwargs", value_name = "JSON")]
    pub default_chat_template_kwargs: Option<String>,
    /// Send `usage.prompt_tokens_details.cached_tokens` on chat and completion responses whose
    /// prompt was partly served from the prefix cache (without it, never: as vLLM).
    #[arg(long = "enable-prompt-tokens-details", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", action = ArgAction::Set)]
    pub enable_prompt_tokens_details: bool,
    /// The longest sequence (prompt and output): a count (`32k` = 32,000, `32K` = 32,768), or
    /// `auto` / -1 for the model's own limit.
    #[arg(long = "max-model-len", value_parser = values::model_len, allow_negative_numbers = true)]
    pub max_model_len: Option<values::ModelLen>,
    /// Request defaults: `auto` (the model's generation_config.json, or a GGUF's sampling
    /// metadata), `vllm` (vLLM's own), or a folder with a generation_config.json (whose
    /// max_new_tokens also caps max_tokens).
    #[arg(
        long = "generation-config",
        value_name = "auto|vllm|FOLDER",
        default_value = "auto"
    )]
    pub generation_config: String,
    /// A JSON object merged over the generation config, e.g. '{"temperature": 0.5}'.
    #[arg(long = "override-generation-config", value_name = "JSON")]
    pub override_generation_config: Option<String>,
    /// Seed of the sampler that requests without a `seed` draw from (default: a fresh one
    /// each start).
    #[arg(long = "seed", allow_negative_numbers = true)]
    pub seed: Option<i64>,
    /// Sequences the engine holds (running and waiting).
    #[arg(long = "max-num-seqs", default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Sequences admitted into the running batch (<= --max-num-seqs).
    #[arg(long = "max-num-active-seqs")]
    pub max_num_active_seqs: Option<usize>,
    /// Tokens one engine step may compute (default 2048; `8k`, `8K` also).
    #[arg(long = "max-num-batched-tokens", value_parser = values::human_int)]
    pub max_num_batched_tokens: Option<usize>,
    /// Tokens per KV cache block (default 16).
    #[arg(long = "block-size")]
    pub block_size: Option<usize>,
    /// Prefix caching (on by default).
    #[arg(long = "enable-prefix-caching", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", action = ArgAction::Set)]
    pub enable_prefix_caching: Option<bool>,
    /// The KV cache's size in blocks of --block-size tokens (--kv-cache-tokens wins).
    #[arg(long = "num-gpu-blocks-override")]
    pub num_gpu_blocks_override: Option<usize>,
    #[arg(long = "max-logprobs", default_value_t = 20)]
    pub max_logprobs: usize,
    /// Trusted-client profile: trusted API keys and JSON Schema bounds (YAML or JSON).
    #[arg(long = "trusted-client-policy", value_name = "FILE")]
    pub trusted_client_policy: Option<PathBuf>,
    /// YAML file of flags (`max-num-seqs: 8`; either separator; `true` / `false` for `--x` /
    /// `--no-x`; lists for several values). Flags on the command line win.
    #[arg(long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Largest request body accepted, in bytes.
    #[arg(long = "max-request-body-bytes", default_value_t = 64 * 1024 * 1024)]
    pub max_request_body_bytes: usize,
    /// Seconds a request may take to produce its response head.
    #[arg(long = "request-timeout", default_value_t = 600)]
    pub request_timeout: u64,
    /// Seconds a connection may take to send a request's headers, counted from when it is
    /// ready for the next request: slow senders and idle keep-alive connections are closed
    /// after it.
    #[arg(long = "header-read-timeout", default_value_t = 10)]
    pub header_read_timeout: u64,
    /// Open connections at once (default: 90 % of the open-file limit, raised to its hard
    /// maximum at start-up, less a reserve); more are closed as they arrive.
    #[arg(long = "max-connections")]
    pub max_connections: Option<usize>,
    /// Seconds to drain on SIGTERM/SIGINT: the server stops accepting, `/health` answers 503,
    /// requests in flight may finish until then, and the process then exits 0 whatever is
    /// still open.
    #[arg(long = "shutdown-timeout", default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Requests in flight at once; more get 503 with Retry-After instead of queueing.
    #[arg(long = "max-concurrent-requests", default_value_t = 1024)]
    pub max_concurrent_requests: usize,
    /// Bytes all requests in flight may hold together (bodies as parsed, sequences and their
    /// logprobs, pooled outputs, media tensors), reserved before the work: a request that does
    /// not fit beside the others gets 503 with Retry-After, one larger than the whole budget a
    /// 400. `8G` = 8 GiB (README: the memory bound).
    #[arg(long = "max-request-memory", default_value = "8G", value_parser = values::human_int)]
    pub max_request_memory: usize,
    /// KV cache capacity in tokens, all sequences together (default: 65536 on the CPU; on a
    /// GPU, what --gpu-memory-utilization leaves after weights and activations).
    #[arg(long = "kv-cache-tokens")]
    pub kv_cache_tokens: Option<usize>,
    /// The KV cache's element type: `auto` (f32 on the CPU; a GPU model's cache takes the
    /// model's type), `float32`, `float16` or `bfloat16` (CPU decoders: half the memory; on SmolLM2 the
    /// top logprobs move by up to 0.02 with float16 and 0.08 with bfloat16).
    #[arg(
        long = "kv-cache-dtype",
        default_value = "auto",
        value_name = "auto|float32|float16|bfloat16"
    )]
    pub kv_cache_dtype: engine::model::KvDtype,
    /// Where decoders run: `auto` (CUDA device 0 when a driver, a device, NVRTC and cuBLAS are
    /// present, else the CPU, with a log line saying why), `cpu`, `cuda` or `cuda:N`.
    #[arg(
        long = "device",
        value_name = "auto|cpu|cuda[:N]",
        default_value = "auto"
    )]
    pub device: DeviceRequest,
    /// GPU models' weights, activations and KV cache: `auto` (bfloat16, or float16 for float16
    /// checkpoints), `bfloat16`, `float16` (`half`), or `float32` (exact, for parity checks).
    #[arg(
        long = "dtype",
        value_name = "auto|bfloat16|float16|float32",
        default_value = "auto"
    )]
    pub dtype: DTypeRequest,
    /// Where weights come from: `auto` (the checkpoint's own format), `safetensors`, `gguf`,
    /// or `ipc_cache` (a `gateway preload` daemon on this machine).
    #[arg(
        long = "load-format",
        value_name = "auto|safetensors|gguf|ipc_cache",
        default_value = "auto"
    )]
    pub load_format: engine::weight_cache::LoadFormat,
    /// Settings of `--load-format ipc_cache` as a JSON object: mode (zero_copy|copy),
    /// fallback (bool), socket_dir, connect_timeout_s, state_timeout_s.
    #[arg(long = "model-loader-extra-config", value_name = "JSON")]
    pub model_loader_extra_config: Option<String>,
    /// Share of GPU memory this server may use for weights, activations and the KV cache.
    #[arg(
        long = "gpu-memory-utilization",
        alias = "device-memory-utilization",
        default_value_t = 0.9
    )]
    pub gpu_memory_utilization: f32,
    /// Compute threads (default: all cores).
    #[arg(long = "threads")]
    pub threads: Option<usize>,
    /// Activation precision of CPU decoders' quantised matmuls: `q8` quantises decode
    /// activations to 8 bits and uses integer dot products, as llama.cpp does (faster; top-5
    /// logprobs move by up to ~0.6 from an f32 reference); `f32` keeps them exact. GPU decoders
    /// compute in the `--dtype` type instead.
    #[arg(
        long = "activation-precision",
        value_name = "f32|q8",
        default_value = "q8"
    )]
    pub activation_precision: ActivationMode,
    /// Where `scripts/fetch-models.sh` put the default models.
    #[arg(
        long = "models-cache",
        env = "MODELS_CACHE",
        default_value = "models-cache"
    )]
    pub models_cache: PathBuf,
    /// Serve LoRA adapters (PEFT folders) on the decoder: requests name one as their `model`.
    /// Decoders then run on the CPU (the GPU decoder runs no adapters).
    #[arg(long = "enable-lora", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", action = ArgAction::Set)]
    pub enable_lora: bool,
    /// Adapters served from the start, with --enable-lora: `name=path`, or
    /// '{"name": ..., "path": ..., "base_model_name": ...}' (several values, or repeated).
    #[arg(long = "lora-modules", value_name = "NAME=PATH|JSON", num_args = 1..)]
    pub lora_modules: Vec<String>,
    /// The most adapters in one engine step; sequences of another adapter wait their turn.
    #[arg(long = "max-loras", default_value_t = 1)]
    pub max_loras: usize,
    /// The largest adapter rank served (1, 8, 16, 32, 64, 128, 256, 320 or 512).
    #[arg(long = "max-lora-rank", default_value_t = 16)]
    pub max_lora_rank: usize,
    /// The most adapters whose factors are held in memory (default: --max-loras); past it the
    /// least recently used idle adapter is evicted and read again when a request names it.
    #[arg(long = "max-cpu-loras")]
    pub max_cpu_loras: Option<usize>,
}

impl ServeArgs {
    /// The log filter `--uvicorn-log-level` and `--log-level` ask for (the more detailed of
    /// the two), `info` without them.
    pub fn log_filter(&self) -> &'static str {
        let rank = |level: &str| match level.to_ascii_lowercase().as_str() {
            "critical" | "error" => 0,
            "warning" => 1,
            "info" => 2,
            "debug" => 3,
            "trace" | "notset" => 4,
            _ => 2,
        };
        let most = [&self.uvicorn_log_level, &self.log_level]
            .into_iter()
            .flatten()
            .map(|l| rank(l))
            .max()
            .unwrap_or(2);
        ["error", "warn", "info", "debug", "trace"][most]
    }
}

#[derive(Debug, Clone, Args)]
pub struct ContractArgs {
    /// The deployment to check, e.g. http://127.0.0.1:8000
    #[arg(long = "base-url")]
    pub base_url: String,
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// How the deployment was started: default, trusted, or profile.
    #[arg(long = "mode", default_value = "default")]
    pub mode: String,
    /// For --mode profile: a key the profile trusts and one it does not.
    #[arg(long = "trusted-key")]
    pub trusted_key: Option<String>,
    #[arg(long = "untrusted-key")]
    pub untrusted_key: Option<String>,
    /// The chat model to use (default: discovered from /v1/models).
    #[arg(long = "model")]
    pub model: Option<String>,
    #[arg(long = "embedding-model")]
    pub embedding_model: Option<String>,
    /// Write the report as JSON here too.
    #[arg(long = "json-report")]
    pub json_report: Option<PathBuf>,
}

/// `gateway upgrade-check --base-url URL [...] [-- VLLM SERVE ARGS...]`.
#[derive(Debug, Clone, Args)]
pub struct UpgradeCheckArgs {
    /// The deployment to check (this server or vLLM 0.31), e.g. http://127.0.0.1:8000
    #[arg(long = "base-url")]
    pub base_url: String,
    /// The key the deployment wants (default: the --api-key of its command line, if any).
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// The deployment's `vllm serve --config` YAML, reviewed with the arguments after `--`.
    #[arg(long = "config", value_name = "DEPLOYMENT.yaml")]
    pub config: Option<PathBuf>,
    /// The weight-cache daemon's health URL (`gateway preload --weight-cache-health-port`).
    #[arg(long = "weight-cache-health", value_name = "URL")]
    pub weight_cache_health: Option<String>,
    /// Write the rows as JSON here too.
    #[arg(long = "json", value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Seconds each request may take.
    #[arg(long = "timeout", value_name = "SECONDS", default_value_t = 60)]
    pub timeout_s: u64,
    /// The deployment's `vllm serve` arguments (a leading `vllm serve` is dropped).
    #[arg(last = true, value_name = "VLLM SERVE ARGS")]
    pub serve_args: Vec<String>,
}

#[cfg(test)]
mod tests;
