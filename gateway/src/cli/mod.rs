//! The command line: `gateway serve | contract | bench-gate`, flags spelled as `vllm serve`
//! spells them. `--config FILE` (YAML, same keys without the dashes) supplies values that flags
//! on the command line override.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
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
}

#[derive(Debug, Clone, Args)]
pub struct PreloadArgs {
    /// The checkpoint to hold (a GGUF file). Without it, the default chat model.
    #[arg(long = "model", value_name = "PATH")]
    pub model: Option<String>,
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
    /// Where the held weights live: `cpu` (shared memory). The CUDA cache is not built yet.
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

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The model, as `vllm serve MODEL` takes it: a GGUF file, an HF checkpoint folder, or a
    /// Hugging Face hub id found in the local hub cache. Served first, before any --model.
    #[arg(value_name = "MODEL")]
    pub model_arg: Option<String>,
    /// Model to serve: a GGUF file, an HF checkpoint folder or a hub id in the local hub cache
    /// (repeatable). Without any (and no MODEL), the two default models are served from the
    /// models cache.
    #[arg(long = "model", value_name = "PATH")]
    pub model: Vec<String>,
    /// The revision (branch, tag or commit) of hub ids, in the local hub cache (default main).
    #[arg(long = "revision", value_name = "REV")]
    pub revision: Option<String>,
    /// Name clients use for each --model, in the same order.
    #[arg(long = "served-model-name", value_name = "NAME", num_args = 1..)]
    pub served_model_name: Vec<String>,
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// API key(s) clients must send as `Authorization: Bearer <key>` (repeatable). Also read
    /// from VLLM_API_KEY.
    #[arg(long = "api-key", env = "VLLM_API_KEY", value_delimiter = ',')]
    pub api_key: Vec<String>,
    /// Let every client send mm_processor_kwargs / media_io_kwargs (vLLM's meaning: no bounds).
    #[arg(
        long = "trust-request-mm-kwargs",
        overrides_with = "no_trust_request_mm_kwargs"
    )]
    pub trust_request_mm_kwargs: bool,
    #[arg(
        long = "no-trust-request-mm-kwargs",
        overrides_with = "trust_request_mm_kwargs"
    )]
    pub no_trust_request_mm_kwargs: bool,
    /// Deployment defaults for the multimodal processor (a flat JSON object).
    #[arg(long = "mm-processor-kwargs", value_name = "JSON")]
    pub mm_processor_kwargs: Option<String>,
    /// Deployment defaults for media loading, keyed by modality, e.g. '{"video": {"num_frames": 40}}'.
    #[arg(long = "media-io-kwargs", value_name = "JSON")]
    pub media_io_kwargs: Option<String>,
    /// Items per modality allowed in one prompt, e.g. '{"image": 2}'.
    #[arg(long = "limit-mm-per-prompt", value_name = "JSON")]
    pub limit_mm_per_prompt: Option<String>,
    /// Folder under which `file:` media URLs may be read.
    #[arg(long = "allowed-local-media-path", value_name = "DIR")]
    pub allowed_local_media_path: Option<PathBuf>,
    /// Hosts media may be fetched from (exact match after URL normalisation).
    #[arg(long = "allowed-media-domains", value_name = "HOST", num_args = 1.., value_delimiter = ',')]
    pub allowed_media_domains: Vec<String>,
    /// Allow media URLs that resolve to loopback, private or other non-global addresses.
    #[arg(long = "allow-private-media-hosts")]
    pub allow_private_media_hosts: bool,
    /// Accept a per-request `chat_template`.
    #[arg(long = "trust-request-chat-template")]
    pub trust_request_chat_template: bool,
    /// Let the model decide on tool calls (`tool_choice: auto`, the default with tools); needs
    /// --tool-call-parser.
    #[arg(long = "enable-auto-tool-choice")]
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
    #[arg(long = "max-model-len")]
    pub max_model_len: Option<usize>,
    /// Sequences the engine holds (running and waiting).
    #[arg(long = "max-num-seqs", default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Sequences admitted into the running batch (<= --max-num-seqs).
    #[arg(long = "max-num-active-seqs")]
    pub max_num_active_seqs: Option<usize>,
    #[arg(long = "max-num-batched-tokens")]
    pub max_num_batched_tokens: Option<usize>,
    #[arg(long = "max-logprobs", default_value_t = 20)]
    pub max_logprobs: usize,
    /// Trusted-client profile: trusted API keys and JSON Schema bounds (YAML or JSON).
    #[arg(long = "trusted-client-policy", value_name = "FILE")]
    pub trusted_client_policy: Option<PathBuf>,
    /// YAML file with the same keys as the flags (`max-num-seqs: 8`).
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
    #[arg(long = "gpu-memory-utilization", default_value_t = 0.9)]
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

/// Turn a `--config` YAML file into flags placed before the command line's own, so that the
/// command line wins. Keys are the flag names without `--` (snake_case also accepted).
pub fn config_to_args(path: &std::path::Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --config {}: {e}", path.display()))?;
    let doc: serde_yaml::Value = serde_yaml::from_str(&text)
        .map_err(|e| format!("--config {} is not valid YAML: {e}", path.display()))?;
    let serde_yaml::Value::Mapping(map) = doc else {
        return Err(format!(
            "--config {} must be a mapping of flag names to values",
            path.display()
        ));
    };
    let mut out = Vec::new();
    for (k, v) in map {
        let Some(key) = k.as_str() else {
            return Err(format!("--config {}: keys must be strings", path.display()));
        };
        let flag = format!("--{}", key.replace('_', "-"));
        if flag == "--config" {
            return Err("--config files cannot include another --config".into());
        }
        match v {
            serde_yaml::Value::Bool(true) => out.push(flag),
            serde_yaml::Value::Bool(false) => {
                if flag == "--trust-request-mm-kwargs" {
                    out.push("--no-trust-request-mm-kwargs".into());
                }
            }
            serde_yaml::Value::Null => {}
            serde_yaml::Value::Sequence(items) => {
                for item in items {
                    out.push(flag.clone());
                    out.push(yaml_scalar(&item, key)?);
                }
            }
            other => {
                out.push(flag);
                out.push(yaml_scalar(&other, key)?);
            }
        }
    }
    Ok(out)
}

fn yaml_scalar(v: &serde_yaml::Value, key: &str) -> Result<String, String> {
    match v {
        serde_yaml::Value::String(s) => Ok(s.clone()),
        serde_yaml::Value::Number(n) => Ok(n.to_string()),
        serde_yaml::Value::Bool(b) => Ok(b.to_string()),
        // Objects (e.g. media-io-kwargs) are passed on as JSON.
        serde_yaml::Value::Mapping(_) => {
            let json: serde_json::Value = serde_yaml::from_value(v.clone())
                .map_err(|e| format!("--config key {key}: {e}"))?;
            Ok(json.to_string())
        }
        _ => Err(format!("--config key {key}: unsupported value")),
    }
}

/// argv with the `--config` file's values spliced in after the subcommand.
pub fn expand_config(argv: Vec<String>) -> Result<Vec<String>, String> {
    let mut config: Option<PathBuf> = None;
    let mut i = 0;
    while i < argv.len() {
        if argv[i] == "--config" {
            config = argv.get(i + 1).map(PathBuf::from);
            break;
        }
        if let Some(p) = argv[i].strip_prefix("--config=") {
            config = Some(PathBuf::from(p));
            break;
        }
        i += 1;
    }
    let Some(path) = config else { return Ok(argv) };
    // Flags given on the command line win: drop the config file's values for them.
    let family = |flag: &str| {
        flag.trim_start_matches("--no-")
            .trim_start_matches("--")
            .to_string()
    };
    let given: std::collections::HashSet<String> = argv
        .iter()
        .filter(|a| a.starts_with("--"))
        .map(|a| family(a.split('=').next().unwrap_or(a)))
        .collect();
    let mut extra = Vec::new();
    let mut keep = false;
    for a in config_to_args(&path)? {
        if a.starts_with("--") {
            keep = !given.contains(&family(&a));
        }
        if keep {
            extra.push(a);
        }
    }
    // Insert right after the subcommand (argv[0] is the program, argv[1] the subcommand).
    let split = 2.min(argv.len());
    let mut out = argv[..split].to_vec();
    out.extend(extra);
    out.extend_from_slice(&argv[split..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_values_come_first_so_flags_win() {
        let dir = std::env::temp_dir().join(format!("gw-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.yaml");
        std::fs::write(
            &path,
            "max-num-seqs: 8\ntrust_request_mm_kwargs: true\nmedia-io-kwargs:\n  video:\n    num_frames: 40\nmodel: [a.gguf, b]\n",
        )
        .unwrap();
        let argv: Vec<String> = [
            "gateway",
            "serve",
            "--config",
            path.to_str().unwrap(),
            "--max-num-seqs",
            "4",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let expanded = expand_config(argv).unwrap();
        let cli = Cli::try_parse_from(expanded).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(args.max_num_seqs, 4);
        assert_eq!(args.max_logprobs, 20);
        assert!(args.trust_request_mm_kwargs);
        assert_eq!(args.model, vec!["a.gguf".to_string(), "b".to_string()]);
        let media: serde_json::Value =
            serde_json::from_str(args.media_io_kwargs.as_deref().unwrap()).unwrap();
        assert_eq!(media["video"]["num_frames"], 40);
    }

    #[test]
    fn activation_precision_defaults_to_q8_and_parses() {
        let serve = |extra: &[&str]| {
            let argv = ["gateway", "serve"].iter().chain(extra);
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::Serve(args)) => Ok(args.activation_precision),
                Ok(_) => panic!("not serve"),
                Err(e) => Err(e),
            }
        };
        assert_eq!(serve(&[]).unwrap(), ActivationMode::Q8);
        assert_eq!(
            serve(&["--activation-precision", "f32"]).unwrap(),
            ActivationMode::F32
        );
        assert_eq!(
            serve(&["--activation-precision", "q8"]).unwrap(),
            ActivationMode::Q8
        );
        assert!(serve(&["--activation-precision", "fp16"]).is_err());
    }

    #[test]
    fn kv_cache_dtype_defaults_to_auto_and_refuses_fp8_by_name() {
        let serve = |extra: &[&str]| {
            let argv = ["gateway", "serve"].iter().chain(extra);
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::Serve(args)) => Ok(args.kv_cache_dtype),
                Ok(_) => panic!("not serve"),
                Err(e) => Err(e.to_string()),
            }
        };
        use engine::model::KvDtype;
        assert_eq!(serve(&[]).unwrap(), KvDtype::Auto);
        assert_eq!(
            serve(&["--kv-cache-dtype", "bfloat16"]).unwrap(),
            KvDtype::Bfloat16
        );
        assert_eq!(
            serve(&["--kv-cache-dtype", "float16"]).unwrap(),
            KvDtype::Float16
        );
        let err = serve(&["--kv-cache-dtype", "fp8"]).unwrap_err();
        assert!(err.contains("8-bit caches are not built"), "{err}");
    }

    #[test]
    fn no_trust_flag_parses_and_last_wins() {
        let cli = Cli::try_parse_from([
            "gateway",
            "serve",
            "--trust-request-mm-kwargs",
            "--no-trust-request-mm-kwargs",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert!(!args.trust_request_mm_kwargs);
    }
}
