//! Every argument of `vllm serve` 0.31 and what this server answers to it: the one table that
//! parsing, `gateway serve --help`, the `--config` YAML reader and the README's flag table are
//! built from ([`super::vllm_args`] does the building).
//!
//! An operator's manifest written for vLLM must either start this server or stop it with one
//! line naming the flag and why, never with a generic "unexpected argument". So each argument
//! has one of these answers:
//!
//! * honoured: a flag of [`super::ServeArgs`] does what vLLM documents;
//! * only some values: the values listed are what this server does anyway (accepted quietly);
//!   any other value is refused, with the reason;
//! * no effect: it tunes the internals of vLLM's implementation (CUDA graphs, torch.compile,
//!   kernel backends, distributed workers); accepted, and named in one start-up warning;
//! * refused: it asks for something this server does not build; the start stops naming it;
//! * deprecated: accepted with no effect and a warning naming vLLM's replacement.
//!
//! Flags vLLM itself removed or renamed are in [`REMOVED`] and [`REMOVED_VALUES`]: refused with
//! what replaced them, as vLLM 0.31 refuses them.

/// How an argument is written on the command line (from the kind and nargs of vLLM's parser).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The positional model.
    Positional,
    /// `-h` / `--help`.
    Help,
    /// `--x VALUE`.
    Value,
    /// `--x [VALUE]`.
    MaybeValue,
    /// `--x V1 V2 ...` (nargs `+`, or repeated).
    Values,
    /// `--x`, store-true.
    Switch,
    /// `--x` / `--no-x`.
    Bool,
}

/// What this server does with an argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A flag of `ServeArgs` handles it; the text says what it does here.
    Honoured(&'static str),
    /// Accepted quietly with one of these values (what this server does anyway; for `--x` /
    /// `--no-x` flags, `true` or `false`); any other value is refused with the text.
    Only(&'static [&'static str], &'static str),
    /// Accepted without effect; the text says why. Named in one start-up warning.
    NoEffect(&'static str),
    /// Refused whenever given; the text says why.
    Refused(&'static str),
    /// Deprecated by vLLM: accepted without effect, with a warning; the text names the
    /// replacement.
    Deprecated(&'static str),
}

/// One argument of `vllm serve`.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    /// vLLM's argument group (its `--help` heading).
    pub group: &'static str,
    /// The spellings as vLLM's parser lists them, comma-separated: the long name first, then
    /// the `--no-` form and short aliases.
    pub names: &'static str,
    pub kind: Kind,
    pub answer: Answer,
}

impl Flag {
    /// The long name without dashes (`tensor-parallel-size`), or `model_tag` for the
    /// positional model.
    pub fn long(&self) -> &'static str {
        let long = self.spellings().find(|s| s.starts_with("--"));
        long.unwrap_or(self.names).trim_start_matches('-')
    }

    /// Every spelling (`--x`, `--no-x`, `-x`).
    pub fn spellings(&self) -> impl Iterator<Item = &'static str> {
        self.names.split(',')
    }

    /// Short aliases (`-tp`), which vLLM's parser takes with one dash.
    pub fn shorts(&self) -> impl Iterator<Item = &'static str> {
        self.spellings()
            .filter(|s| s.starts_with('-') && !s.starts_with("--"))
    }
}

const fn f(group: &'static str, names: &'static str, kind: Kind, answer: Answer) -> Flag {
    Flag {
        group,
        names,
        kind,
        answer,
    }
}

use Answer::{Deprecated, Honoured, NoEffect, Only, Refused};
use Kind::{Bool, Help, MaybeValue, Positional, Switch, Value, Values};

const OFF: &[&str] = &["false"];
const ON: &[&str] = &["true"];
const EITHER: &[&str] = &["true", "false"];
const EMPTY: &[&str] = &[""];
const EMPTY_JSON: &[&str] = &["{}"];
const ONE: &[&str] = &["1"];
const ZERO: &[&str] = &["0"];

const ONE_DEVICE: &str =
    "not built: this server runs a model on one device (one engine process per model)";
const ONE_DEVICE_TUNING: &str =
    "only shapes parallel execution across devices; this server runs a model on one device";
const MULTI_NODE: &str = "only meaningful across several nodes or engine processes; this server \
                          runs one process";
const CUDA_GRAPHS: &str =
    "tunes vLLM's torch.compile and CUDA graphs; this server has neither (its kernels run eagerly)";
const KERNELS: &str =
    "picks among vLLM's kernel backends; this server has one implementation of each operation";
const MAMBA: &str = "tunes Mamba / linear-attention models, which this server does not build";
const MOE: &str = "tunes mixture-of-experts serving, which this server does not build";
const DATA_PARALLEL: &str =
    "tunes data-parallel engines; this server runs one engine per model (--data-parallel-size 1)";
const OFFLOAD_ONLY: &str = "only shapes weight offloading (--cpu-offload-gb), which is not built";
const NO_PYTHON: &str =
    "this server runs no Python code, so Python plugins and classes cannot load";
const MM_CACHE: &str = "tunes vLLM's multimodal processor cache; this server caches media by \
                        the parts' uuid in its own bounded cache";
const ENCODER_FP8: &str = "only shapes fp8 media encoders, which are not built";
const METRICS_ONLY: &str = "an extra metric of vLLM's internals, not exported here";
const NOT_BUILT: &str = "not built by this server";

/// Every argument of `vllm serve` 0.31.0, in the order of vLLM's parser.
#[rustfmt::skip]
pub static FLAGS: &[Flag] = &[
    f("positional arguments", "model_tag", Positional, Honoured("the model: a GGUF file, an HF folder or a hub id (`org/name`, or `org/name:QUANT` for a GGUF repository), from the local Hugging Face cache or downloaded into it")),
    f("options", "-h,--help", Help, Honoured("lists every flag and what this server does with it")),
    f("options", "--headless", Switch, Refused(MULTI_NODE)),
    f("options", "--api-server-count,-asc", Value, Only(ONE, "one API server process serves all requests here (it is multi-threaded)")),
    f("options", "--config", Value, Honoured("a YAML file of flags (keys without the dashes, either separator); the command line wins")),
    f("options", "--grpc", Switch, Refused("vLLM's gRPC front end is not built: this server speaks HTTP")),
    f("options", "--disable-log-stats", Switch, Only(ON, "no periodic stats lines are logged here: /metrics has the figures")),
    f("options", "--aggregate-engine-logging", Switch, NoEffect(DATA_PARALLEL)),
    f("options", "--fail-on-environ-validation,--no-fail-on-environ-validation", Bool, NoEffect("validates vLLM's VLLM_* environment variables, which this server does not read")),
    f("options", "--shutdown-timeout", Value, Honoured("seconds requests in flight may finish after SIGTERM (default 30 here, 0 in vLLM)")),
    f("options", "--gdn-prefill-backend", Value, NoEffect(MAMBA)),
    f("options", "--kda-prefill-backend", Value, NoEffect(MAMBA)),
    f("options", "--kda-decode-backend", Value, NoEffect(MAMBA)),
    f("options", "--enable-log-requests,--no-enable-log-requests", Bool, Honoured("one info line per generation request: id, route, model, prompt length and sampling fields")),
    f("Frontend", "--lora-modules", Values, Honoured("adapters served from the start, with --enable-lora: `name=path` or JSON `{\"name\", \"path\", \"base_model_name\"}`; each is listed in /v1/models with its base as `parent`")),
    f("Frontend", "--chat-template", Value, Honoured("a Jinja chat template (a file, or the template itself) for every generation model served")),
    f("Frontend", "--chat-template-content-format", Value, Only(&["auto"], "only `auto` is built: messages reach the template as the template reads them")),
    f("Frontend", "--trust-request-chat-template,--no-trust-request-chat-template", Bool, Honoured("accept a per-request `chat_template`")),
    f("Frontend", "--trust-request-mm-kwargs,--no-trust-request-mm-kwargs", Bool, Honoured("let every client send mm_processor_kwargs / media_io_kwargs (CONTRACT section 2)")),
    f("Frontend", "--default-chat-template-kwargs", Value, Honoured("chat template kwargs every request gets (a JSON object; the request's win)")),
    f("Frontend", "--response-role", Value, Honoured("the role of chat replies (default `assistant`)")),
    f("Frontend", "--return-tokens-as-token-ids,--no-return-tokens-as-token-ids", Bool, Only(OFF, "not built yet: logprob tokens are returned as their text")),
    f("Frontend", "--enable-auto-tool-choice,--no-enable-auto-tool-choice", Bool, Honoured("`tool_choice: auto`, with --tool-call-parser")),
    f("Frontend", "--exclude-tools-when-tool-choice-none,--no-exclude-tools-when-tool-choice-none", Bool, Only(OFF, "not built yet: with `tool_choice: none` the tools still reach the chat template")),
    f("Frontend", "--tool-call-parser", Value, Honoured("hermes, llama3_json, mistral or pythonic")),
    f("Frontend", "--tool-parser-plugin", Value, Only(EMPTY, NO_PYTHON)),
    f("Frontend", "--tool-strict-level", Value, Only(&["auto"], "only `auto` is built: a named or required tool call is constrained to its schema")),
    f("Frontend", "--tool-server", Value, Refused("built-in tool servers (MCP, demo tools) are not built")),
    f("Frontend", "--max-log-len", Value, Honoured("with --enable-log-requests: the most prompt characters a request's log line shows")),
    f("Frontend", "--enable-prompt-tokens-details,--no-enable-prompt-tokens-details", Bool, Honoured("`usage.prompt_tokens_details.cached_tokens` on chat and completion responses whose prompt was partly served from the prefix cache")),
    f("Frontend", "--enable-per-request-metrics,--no-enable-per-request-metrics", Bool, Only(OFF, NOT_BUILT)),
    f("Frontend", "--enable-server-load-tracking,--no-enable-server-load-tracking", Bool, Only(OFF, "the /load endpoint is not built")),
    f("Frontend", "--enable-force-include-usage,--no-enable-force-include-usage", Bool, Only(OFF, "not built yet: usage is sent where the request asks for it")),
    f("Frontend", "--sse-keep-alive-interval", Value, Only(ZERO, "SSE keep-alive comments are not built")),
    f("Frontend", "--enable-tokenizer-info-endpoint,--no-enable-tokenizer-info-endpoint", Bool, Only(OFF, "the /tokenizer_info endpoint is not built")),
    f("Frontend", "--enable-log-outputs,--no-enable-log-outputs", Bool, Only(OFF, "logging generated outputs is not built")),
    f("Frontend", "--enable-log-deltas,--no-enable-log-deltas", Bool, NoEffect("only shapes --enable-log-outputs, which is not built")),
    f("Frontend", "--cohere-is-reasoning-model,--no-cohere-is-reasoning-model", Bool, NoEffect("shapes vLLM's Cohere-format endpoint, which this server does not serve")),
    f("Frontend", "--cohere-format", Value, NoEffect("shapes vLLM's Cohere-format endpoint, which this server does not serve")),
    f("Frontend", "--anthropic-disabled-thinking-effort", Value, NoEffect("shapes vLLM's Anthropic-format endpoint, which this server does not serve")),
    f("Frontend", "--log-error-stack,--no-log-error-stack", Bool, NoEffect("Python stack traces; this server logs its errors without them")),
    f("Frontend", "--tokens-only,--no-tokens-only", Bool, Only(OFF, "a tokens-only server is not built")),
    f("Frontend", "--enable-scale-out,--no-enable-scale-out", Bool, Only(OFF, NOT_BUILT)),
    f("Frontend", "--fingerprint-mode", Value, NoEffect("this server sends no system_fingerprint")),
    f("Frontend", "--fingerprint-value", Value, NoEffect("this server sends no system_fingerprint")),
    f("Frontend", "--host", Value, Honoured("the address to listen on (default 0.0.0.0)")),
    f("Frontend", "--port", Value, Honoured("the port to listen on (default 8000)")),
    f("Frontend", "--data-parallel-supervisor-port", Value, NoEffect(DATA_PARALLEL)),
    f("Frontend", "--dp-supervisor-probe-interval-s", Value, NoEffect(DATA_PARALLEL)),
    f("Frontend", "--dp-supervisor-probe-timeout-s", Value, NoEffect(DATA_PARALLEL)),
    f("Frontend", "--dp-supervisor-probe-failure-threshold", Value, NoEffect(DATA_PARALLEL)),
    f("Frontend", "--uds", Value, Refused("listening on a Unix socket is not built")),
    f("Frontend", "--uvicorn-log-level", Value, Honoured("the log level (critical, error, warning, info, debug, trace); RUST_LOG wins")),
    f("Frontend", "--disable-uvicorn-access-log,--no-disable-uvicorn-access-log", Bool, Honoured("turns the per-request access log (debug level) off")),
    f("Frontend", "--disable-access-log-for-endpoints", Value, Honoured("paths, comma-separated, left out of the access log")),
    f("Frontend", "--allow-credentials,--no-allow-credentials", Bool, Honoured("CORS: Access-Control-Allow-Credentials")),
    f("Frontend", "--allowed-origins", Value, Honoured("CORS: allowed origins, a JSON list; any CORS flag turns CORS on (off by default here, as from vLLM 0.32)")),
    f("Frontend", "--allowed-methods", Value, Honoured("CORS: allowed methods, a JSON list")),
    f("Frontend", "--allowed-headers", Value, Honoured("CORS: allowed request headers, a JSON list")),
    f("Frontend", "--api-key", Values, Honoured("keys clients must send as `Authorization: Bearer`; also VLLM_API_KEY")),
    f("Frontend", "--ssl-keyfile", Value, Honoured("the HTTPS private key (PEM: PKCS#8, PKCS#1 or SEC1), with --ssl-certfile; TLS through rustls")),
    f("Frontend", "--ssl-certfile", Value, Honoured("the HTTPS certificate chain (PEM; it may hold the key too): the port serves HTTPS only, through rustls (TLS 1.2 and 1.3, HTTP/1.1 and HTTP/2)")),
    f("Frontend", "--ssl-ca-certs", Value, Honoured("the CA certificates (PEM) that client certificates are checked against, with --ssl-cert-reqs 1 or 2")),
    f("Frontend", "--enable-ssl-refresh,--no-enable-ssl-refresh", Bool, Honoured("the certificate, key and CA files are read again when they change (checked every second); new connections get them")),
    f("Frontend", "--ssl-cert-reqs", Value, Honoured("client certificates: 0 none (the default), 1 optional (one sent must check out against --ssl-ca-certs), 2 required")),
    f("Frontend", "--ssl-ciphers", Value, Refused("OpenSSL cipher strings are not read: rustls offers only its own modern suites (TLS 1.3, and TLS 1.2 with ECDHE and AEAD ciphers)")),
    f("Frontend", "--root-path", Value, Honoured("the path prefix a proxy serves this server under: requests with it are served as without it")),
    f("Frontend", "--middleware", Values, Refused(NO_PYTHON)),
    f("Frontend", "--enable-request-id-headers,--no-enable-request-id-headers", Bool, Only(EITHER, "responses always carry X-Request-Id here")),
    f("Frontend", "--disable-fastapi-docs,--no-disable-fastapi-docs", Bool, Only(EITHER, "this server serves no /docs, /redoc or /openapi.json pages")),
    f("Frontend", "--h11-max-incomplete-event-size", Value, NoEffect("a limit of Python's h11 parser; hyper applies its own, and --max-request-body-bytes bounds bodies")),
    f("Frontend", "--h11-max-header-count", Value, NoEffect("a limit of Python's h11 parser; hyper applies its own")),
    f("Frontend", "--enable-offline-docs,--no-enable-offline-docs", Bool, NoEffect("this server serves no /docs pages")),
    f("Frontend", "--enable-flash-late-interaction,--no-enable-flash-late-interaction", Bool, NoEffect(KERNELS)),
    f("ModelConfig", "--model", Value, Honoured("the model, as the positional one (repeatable here: several models, routed by name)")),
    f("ModelConfig", "--runner", Value, Honoured("auto (a decoder folder whose sentence-transformers files name a Pooling module, an architecture that only embeds such as Qwen3Model, and an encoder pool; other decoders generate), generate or pooling")),
    f("ModelConfig", "--convert", Value, Honoured("auto, none or embed (an HF decoder folder served as an embedding model); classify and reward are not built")),
    f("ModelConfig", "--tokenizer", Value, Honoured("accepted when it names the model itself; a tokenizer apart from the model's is not built yet")),
    f("ModelConfig", "--tokenizer-mode", Value, Only(&["auto", "hf"], "only the checkpoint's own tokenizer (`auto`, `hf`) is built")),
    f("ModelConfig", "--trust-remote-code,--no-trust-remote-code", Bool, Honoured("no effect here, and the start-up log says so: no code from a checkpoint runs")),
    f("ModelConfig", "--dtype", Value, Honoured("GPU models' type: auto, bfloat16, float16 (half), float32 (float)")),
    f("ModelConfig", "--seed", Value, Honoured("seeds the sampler of requests without a seed (default: a fresh seed each start; vLLM's is 0)")),
    f("ModelConfig", "--hf-config-path", Value, Refused("a config apart from the checkpoint's own is not built")),
    f("ModelConfig", "--allowed-local-media-path", Value, Honoured("the folder `file:` media URLs may be read from")),
    f("ModelConfig", "--allowed-media-domains", Values, Honoured("the hosts media may be fetched from")),
    f("ModelConfig", "--revision", Value, Honoured("the branch, tag or commit of hub ids (cache lookup and download)")),
    f("ModelConfig", "--code-revision", Value, NoEffect("no code from a checkpoint runs here")),
    f("ModelConfig", "--tokenizer-revision", Value, Honoured("accepted when it is the model's own revision")),
    f("ModelConfig", "--max-model-len", Value, Honoured("the longest sequence (`32k`, `32K`, `auto` or -1 for the model's own limit)")),
    f("ModelConfig", "--quantization,-q", Value, Only(&["gguf"], "weights are served in the checkpoint's own format (GGUF quantisations, or safetensors as stored); other quantization methods are not built")),
    f("ModelConfig", "--quantization-config", Value, Refused("quantization methods other than the checkpoint's own are not built")),
    f("ModelConfig", "--allow-deprecated-quantization,--no-allow-deprecated-quantization", Bool, NoEffect("only shapes quantization methods this server does not build")),
    f("ModelConfig", "--enforce-eager,--no-enforce-eager", Bool, NoEffect(CUDA_GRAPHS)),
    f("ModelConfig", "--enable-return-routed-experts,--no-enable-return-routed-experts", Bool, Only(OFF, MOE)),
    f("ModelConfig", "--return-sampling-mask,--no-return-sampling-mask", Bool, Only(OFF, NOT_BUILT)),
    f("ModelConfig", "--max-logprobs", Value, Honoured("the most logprobs a request may ask for")),
    f("ModelConfig", "--logprobs-mode", Value, Only(&["raw_logprobs"], "logprobs are the model's raw log-probabilities here (vLLM's default); the other modes are not built")),
    f("ModelConfig", "--use-fp64-gumbel,--no-use-fp64-gumbel", Bool, NoEffect("tunes vLLM's GPU sampler; this server samples in its own way")),
    f("ModelConfig", "--enable-trace-replay,--no-enable-trace-replay", Bool, Only(OFF, NOT_BUILT)),
    f("ModelConfig", "--disable-sliding-window,--no-disable-sliding-window", Bool, Only(OFF, "sliding windows are always attended as the checkpoint says")),
    f("ModelConfig", "--disable-cascade-attn,--no-disable-cascade-attn", Bool, NoEffect(KERNELS)),
    f("ModelConfig", "--skip-tokenizer-init,--no-skip-tokenizer-init", Bool, Only(OFF, "serving without a tokenizer is not built")),
    f("ModelConfig", "--enable-prompt-embeds,--no-enable-prompt-embeds", Bool, Only(OFF, "prompt embeddings as input are not built")),
    f("ModelConfig", "--served-model-name", Values, Honoured("the names clients use: for one model every name is accepted, the first is the `model` of responses and /v1/models lists each (vLLM's aliases); with several --model, one name each, in order")),
    f("ModelConfig", "--config-format", Value, Only(&["auto", "hf"], "only Hugging Face config.json (and GGUF metadata) is read")),
    f("ModelConfig", "--hf-token", MaybeValue, Honoured("the token hub downloads send (default: HF_TOKEN, else the token file); bare, the token file")),
    f("ModelConfig", "--hf-overrides", Value, Only(EMPTY_JSON, "overriding the checkpoint's config is not built")),
    f("ModelConfig", "--model-class-overrides", Value, Only(EMPTY_JSON, NO_PYTHON)),
    f("ModelConfig", "--pooler-config", Value, Refused("not built: pooling follows the checkpoint's sentence-transformers config")),
    f("ModelConfig", "--generation-config", Value, Honoured("`auto` (default): the model's generation_config.json (or a GGUF's `general.sampling.*`) sets the sampling defaults and its max_new_tokens the default max_tokens; `vllm`: vLLM's own; a folder: its generation_config.json, whose max_new_tokens also caps max_tokens; in every mode the file's eos_token_id is a stop token")),
    f("ModelConfig", "--override-generation-config", Value, Honoured("a JSON object merged over the generation config; its max_new_tokens caps max_tokens")),
    f("ModelConfig", "--enable-sleep-mode,--no-enable-sleep-mode", Bool, Only(OFF, "sleep mode is not built")),
    f("ModelConfig", "--sleep-preserve-parameter-names", Values, NoEffect("only shapes sleep mode, which is not built")),
    f("ModelConfig", "--enable-cumem-allocator,--no-enable-cumem-allocator", Bool, NoEffect("tunes vLLM's CUDA memory allocator")),
    f("ModelConfig", "--enable-nccl-comm-suspend,--no-enable-nccl-comm-suspend", Bool, NoEffect(MULTI_NODE)),
    f("ModelConfig", "--model-impl", Value, Only(&["auto", "vllm"], "this server's own model code is the only implementation")),
    f("ModelConfig", "--logits-processors", Values, Refused(NO_PYTHON)),
    f("ModelConfig", "--io-processor-plugin", Value, Refused(NO_PYTHON)),
    f("ModelConfig", "--renderer-num-workers", Value, NoEffect("tunes vLLM's prompt renderer processes; this server renders on its async workers")),
    f("LoadConfig", "--load-format", Value, Honoured("auto, safetensors, gguf or ipc_cache")),
    f("LoadConfig", "--download-dir", Value, Honoured("the Hugging Face cache folder hub ids are looked up in and downloaded into")),
    f("LoadConfig", "--safetensors-load-strategy", Value, NoEffect("safetensors files are memory-mapped here")),
    f("LoadConfig", "--safetensors-prefetch-num-threads", Value, NoEffect("safetensors files are memory-mapped here")),
    f("LoadConfig", "--safetensors-prefetch-block-size", Value, NoEffect("safetensors files are memory-mapped here")),
    f("LoadConfig", "--model-loader-extra-config", Value, Honoured("settings of --load-format ipc_cache, a JSON object")),
    f("LoadConfig", "--ignore-patterns", Values, NoEffect("only shapes downloads, which are not built")),
    f("LoadConfig", "--use-tqdm-on-load,--no-use-tqdm-on-load", Bool, NoEffect("a progress bar; the start-up log says when the weights are loaded")),
    f("LoadConfig", "--pt-load-map-location", Value, NoEffect("PyTorch .pt checkpoints are not read here")),
    f("AttentionConfig", "--attention-backend", Value, NoEffect(KERNELS)),
    f("MambaConfig", "--mamba-backend", Value, NoEffect(MAMBA)),
    f("MambaConfig", "--mamba-ssu-algorithm", Value, NoEffect(MAMBA)),
    f("MambaConfig", "--enable-mamba-cache-stochastic-rounding,--no-enable-mamba-cache-stochastic-rounding", Bool, NoEffect(MAMBA)),
    f("MambaConfig", "--mamba-cache-philox-rounds", Value, NoEffect(MAMBA)),
    f("StructuredOutputsConfig", "--reasoning-parser", Value, Honoured("deepseek_r1 or qwen3")),
    f("StructuredOutputsConfig", "--reasoning-parser-plugin", Value, Only(EMPTY, NO_PYTHON)),
    f("ParallelConfig", "--distributed-executor-backend", Value, NoEffect(ONE_DEVICE_TUNING)),
    f("ParallelConfig", "--pipeline-parallel-size,-pp", Value, Only(ONE, ONE_DEVICE)),
    f("ParallelConfig", "--master-addr", Value, NoEffect(MULTI_NODE)),
    f("ParallelConfig", "--master-port", Value, NoEffect(MULTI_NODE)),
    f("ParallelConfig", "--nnodes,-n", Value, Only(ONE, MULTI_NODE)),
    f("ParallelConfig", "--node-rank,-r", Value, Only(ZERO, MULTI_NODE)),
    f("ParallelConfig", "--distributed-timeout-seconds", Value, NoEffect(MULTI_NODE)),
    f("ParallelConfig", "--cpu-distributed-timeout-seconds", Value, NoEffect(MULTI_NODE)),
    f("ParallelConfig", "--numa-bind,--no-numa-bind", Bool, NoEffect("NUMA binding of vLLM's worker processes; this server runs in one process")),
    f("ParallelConfig", "--numa-bind-nodes", Values, NoEffect("NUMA binding of vLLM's worker processes; this server runs in one process")),
    f("ParallelConfig", "--numa-bind-cpus", Values, NoEffect("NUMA binding of vLLM's worker processes; this server runs in one process")),
    f("ParallelConfig", "--device-ids", Value, Refused("not built: pick the GPU with --device cuda:N")),
    f("ParallelConfig", "--tensor-parallel-size,-tp", Value, Only(ONE, ONE_DEVICE)),
    f("ParallelConfig", "--decode-context-parallel-size,-dcp", Value, Only(ONE, ONE_DEVICE)),
    f("ParallelConfig", "--dcp-comm-backend", Value, NoEffect(ONE_DEVICE_TUNING)),
    f("ParallelConfig", "--dcp-q-replicate,--no-dcp-q-replicate", Bool, NoEffect(ONE_DEVICE_TUNING)),
    f("ParallelConfig", "--dcp-kv-cache-interleave-size", Value, NoEffect(ONE_DEVICE_TUNING)),
    f("ParallelConfig", "--cp-kv-cache-interleave-size", Value, NoEffect(ONE_DEVICE_TUNING)),
    f("ParallelConfig", "--prefill-context-parallel-size,-pcp", Value, Only(ONE, ONE_DEVICE)),
    f("ParallelConfig", "--data-parallel-size,-dp", Value, Only(ONE, ONE_DEVICE)),
    f("ParallelConfig", "--data-parallel-rank,-dpn", Value, NoEffect(DATA_PARALLEL)),
    f("ParallelConfig", "--data-parallel-start-rank,-dpr", Value, NoEffect(DATA_PARALLEL)),
    f("ParallelConfig", "--data-parallel-size-local,-dpl", Value, NoEffect(DATA_PARALLEL)),
    f("ParallelConfig", "--data-parallel-address,-dpa", Value, NoEffect(DATA_PARALLEL)),
    f("ParallelConfig", "--data-parallel-rpc-port,-dpp", Value, NoEffect(DATA_PARALLEL)),
    f("ParallelConfig", "--data-parallel-backend,-dpb", Value, NoEffect(DATA_PARALLEL)),
    f("ParallelConfig", "--data-parallel-hybrid-lb,--no-data-parallel-hybrid-lb,-dph", Bool, NoEffect(DATA_PARALLEL)),
    f("ParallelConfig", "--data-parallel-external-lb,--no-data-parallel-external-lb,-dpe", Bool, NoEffect(DATA_PARALLEL)),
    f("ParallelConfig", "--data-parallel-multi-port-external-lb,-dpm", Switch, NoEffect(DATA_PARALLEL)),
    f("ParallelConfig", "--enable-expert-parallel,--no-enable-expert-parallel,-ep", Bool, NoEffect(MOE)),
    f("ParallelConfig", "--enable-batch-sharded-sampling,--no-enable-batch-sharded-sampling", Bool, NoEffect(ONE_DEVICE_TUNING)),
    f("ParallelConfig", "--enable-ep-weight-filter,--no-enable-ep-weight-filter", Bool, NoEffect(MOE)),
    f("ParallelConfig", "--all2all-backend", Value, NoEffect(MOE)),
    f("ParallelConfig", "--enable-dbo,--no-enable-dbo", Bool, NoEffect(MOE)),
    f("ParallelConfig", "--ubatch-size", Value, NoEffect(MOE)),
    f("ParallelConfig", "--enable-elastic-ep,--no-enable-elastic-ep", Bool, NoEffect(MOE)),
    f("ParallelConfig", "--elastic-ep-max-dp-size", Value, NoEffect(MOE)),
    f("ParallelConfig", "--dbo-decode-token-threshold", Value, NoEffect(MOE)),
    f("ParallelConfig", "--dp-sync-interval", Value, NoEffect(DATA_PARALLEL)),
    f("ParallelConfig", "--dbo-prefill-token-threshold", Value, NoEffect(MOE)),
    f("ParallelConfig", "--disable-nccl-for-dp-synchronization,--no-disable-nccl-for-dp-synchronization", Bool, NoEffect(DATA_PARALLEL)),
    f("ParallelConfig", "--enable-eplb,--no-enable-eplb", Bool, NoEffect(MOE)),
    f("ParallelConfig", "--eplb-config", Value, NoEffect(MOE)),
    f("ParallelConfig", "--expert-placement-strategy", Value, NoEffect(MOE)),
    f("ParallelConfig", "--max-parallel-loading-workers", Value, NoEffect("tunes vLLM's worker processes' loading; weights are memory-mapped here")),
    f("ParallelConfig", "--ray-workers-use-nsight,--no-ray-workers-use-nsight", Bool, NoEffect(MULTI_NODE)),
    f("ParallelConfig", "--disable-custom-all-reduce,--no-disable-custom-all-reduce", Bool, NoEffect(ONE_DEVICE_TUNING)),
    f("ParallelConfig", "--worker-cls", Value, Only(&["auto"], NO_PYTHON)),
    f("ParallelConfig", "--worker-extension-cls", Value, Only(EMPTY, NO_PYTHON)),
    f("ParallelConfig", "--enable-fault-tolerance,--no-enable-fault-tolerance", Bool, Only(OFF, "engine recovery is not built: a dead engine thread exits the process (status 70) for its supervisor")),
    f("ParallelConfig", "--fault-tolerance-config", Value, NoEffect("only shapes --enable-fault-tolerance, which is not built")),
    f("CacheConfig", "--block-size", Value, Honoured("tokens per KV cache block (default 16)")),
    f("CacheConfig", "--gpu-memory-utilization,--device-memory-utilization", Value, Honoured("the share of GPU memory for weights, activations and the KV cache")),
    f("CacheConfig", "--kv-cache-memory-bytes", Value, Refused("not built: size the KV cache in tokens with --kv-cache-tokens")),
    f("CacheConfig", "--kv-cache-dtype", Value, Honoured("auto, float32, float16 or bfloat16; fp8 caches are refused")),
    f("CacheConfig", "--num-gpu-blocks-override", Value, Honoured("the KV cache's size in blocks (unless --kv-cache-tokens is given)")),
    f("CacheConfig", "--enable-prefix-caching,--no-enable-prefix-caching", Bool, Honoured("prefix caching (on by default)")),
    f("CacheConfig", "--prefix-caching-hash-algo", Value, NoEffect("prefix blocks are keyed by this server's own hash (CONTRACT section 7)")),
    f("CacheConfig", "--prefix-cache-retention-interval", Value, NoEffect("tunes vLLM's prefix-cache eviction; freed blocks are evicted least recently used first here")),
    f("CacheConfig", "--kv-cache-dtype-skip-layers", Values, NoEffect("only shapes fp8 KV caches, which are not built")),
    f("CacheConfig", "--kv-sharing-fast-prefill,--no-kv-sharing-fast-prefill", Bool, NoEffect(KERNELS)),
    f("CacheConfig", "--swa-bounded-replay,--no-swa-bounded-replay", Bool, NoEffect("tunes vLLM's sliding-window cache manager")),
    f("CacheConfig", "--mamba-cache-dtype", Value, NoEffect(MAMBA)),
    f("CacheConfig", "--mamba-ssm-cache-dtype", Value, NoEffect(MAMBA)),
    f("CacheConfig", "--mamba-block-size", Value, NoEffect(MAMBA)),
    f("CacheConfig", "--prefix-match-unit", Value, NoEffect(MAMBA)),
    f("CacheConfig", "--mamba-cache-mode", Value, NoEffect(MAMBA)),
    f("CacheConfig", "--enable-mamba-shared-prefix-checkpoint,--no-enable-mamba-shared-prefix-checkpoint", Bool, NoEffect(MAMBA)),
    f("CacheConfig", "--replayssm-buffer-len", Value, NoEffect(MAMBA)),
    f("CacheConfig", "--use-replayssm,--no-use-replayssm", Bool, NoEffect(MAMBA)),
    f("CacheConfig", "--kv-offloading-size", Value, Refused("KV cache offloading is not built")),
    f("CacheConfig", "--kv-offloading-backend", Value, NoEffect("only shapes --kv-offloading-size, which is not built")),
    f("OffloadConfig", "--offload-backend", Value, NoEffect(OFFLOAD_ONLY)),
    f("OffloadConfig", "--cpu-offload-gb", Value, Only(ZERO, "offloading weights to the CPU is not built (`--device cpu` serves a model wholly on the CPU)")),
    f("OffloadConfig", "--cpu-offload-params", Values, NoEffect(OFFLOAD_ONLY)),
    f("OffloadConfig", "--offload-group-size", Value, NoEffect(OFFLOAD_ONLY)),
    f("OffloadConfig", "--offload-num-in-group", Value, NoEffect(OFFLOAD_ONLY)),
    f("OffloadConfig", "--offload-prefetch-step", Value, NoEffect(OFFLOAD_ONLY)),
    f("OffloadConfig", "--offload-params", Values, NoEffect(OFFLOAD_ONLY)),
    f("MultiModalConfig", "--language-model-only,--no-language-model-only", Bool, Only(OFF, "serving a multimodal checkpoint without its encoders is not built")),
    f("MultiModalConfig", "--limit-mm-per-prompt", Value, Honoured("items per modality one prompt may hold, a JSON object")),
    f("MultiModalConfig", "--enable-mm-embeds,--no-enable-mm-embeds", Bool, Only(OFF, "media embeddings as input are not built")),
    f("MultiModalConfig", "--media-io-kwargs", Value, Honoured("deployment defaults for media loading, keyed by modality")),
    f("MultiModalConfig", "--mm-processor-kwargs", Value, Honoured("deployment defaults for the multimodal processor")),
    f("MultiModalConfig", "--mm-processor-cache-gb", Value, NoEffect(MM_CACHE)),
    f("MultiModalConfig", "--mm-processor-cache-type", Value, NoEffect(MM_CACHE)),
    f("MultiModalConfig", "--mm-hasher-algorithm", Value, NoEffect(MM_CACHE)),
    f("MultiModalConfig", "--mm-shm-cache-max-object-size-mb", Value, NoEffect(MM_CACHE)),
    f("MultiModalConfig", "--mm-encoder-only,--no-mm-encoder-only", Bool, Only(OFF, "an encoder-only (disaggregated) server is not built")),
    f("MultiModalConfig", "--mm-encoder-tp-mode", Value, NoEffect(ONE_DEVICE_TUNING)),
    f("MultiModalConfig", "--mm-encoder-attn-backend", Value, NoEffect(KERNELS)),
    f("MultiModalConfig", "--mm-encoder-attn-dtype", Value, Refused("fp8 media encoders are not built")),
    f("MultiModalConfig", "--mm-encoder-fp8-scale-path", Value, NoEffect(ENCODER_FP8)),
    f("MultiModalConfig", "--mm-encoder-fp8-scale-save-path", Value, NoEffect(ENCODER_FP8)),
    f("MultiModalConfig", "--mm-encoder-fp8-scale-save-margin", Value, NoEffect(ENCODER_FP8)),
    f("MultiModalConfig", "--interleave-mm-strings,--no-interleave-mm-strings", Bool, Only(OFF, "interleaving media placeholders in string prompts is not built")),
    f("MultiModalConfig", "--skip-mm-profiling,--no-skip-mm-profiling", Bool, NoEffect("vLLM's start-up memory profiling of encoders; this server does none")),
    f("MultiModalConfig", "--video-pruning-rate", Value, Refused("video token pruning is not built")),
    f("MultiModalConfig", "--video-pruning-method", Value, NoEffect("only shapes --video-pruning-rate, which is not built")),
    f("MultiModalConfig", "--mm-tensor-ipc", Value, NoEffect("media tensors stay in one process here")),
    f("MultiModalConfig", "--mm-processor-device", Value, NoEffect("media is preprocessed on the CPU here")),
    f("MultiModalConfig", "--mm-ipc-gpu-memory-gb", Value, NoEffect("media tensors stay in one process here")),
    f("MultiModalConfig", "--mm-device-do-normalize,--no-mm-device-do-normalize", Bool, NoEffect("media is preprocessed on the CPU here")),
    f("LoRAConfig", "--enable-lora,--no-enable-lora", Bool, Honoured("LoRA adapters (PEFT folders) on the q/k/v/o and gate/up/down projections of CPU decoders; sequences of different adapters and none share a batch")),
    f("LoRAConfig", "--max-loras", Value, Honoured("the most adapters in one engine step (default 1); sequences of another adapter wait their turn")),
    f("LoRAConfig", "--max-lora-rank", Value, Honoured("the largest adapter rank served (default 16); a larger one is refused naming both")),
    f("LoRAConfig", "--lora-dtype", Value, Only(&["auto"], "adapters run in float32 on the CPU decoder")),
    f("LoRAConfig", "--enable-tower-connector-lora,--no-enable-tower-connector-lora", Bool, Only(OFF, "adapters apply to the language model only, not to media encoders")),
    f("LoRAConfig", "--max-cpu-loras", Value, Honoured("the most adapters whose factors are held in memory (default --max-loras); past it the least recently used adapter no running request holds is evicted, stays served, and is read again from its folder when a request names it")),
    f("LoRAConfig", "--fully-sharded-loras,--no-fully-sharded-loras", Bool, NoEffect(ONE_DEVICE_TUNING)),
    f("LoRAConfig", "--lora-target-modules", Values, Refused("restricting adapters to some modules is not built: an adapter applies to every module it targets")),
    f("LoRAConfig", "--default-mm-loras", Value, Refused("adapters picked by a prompt's modality are not built: a request names its adapter as its `model`")),
    f("LoRAConfig", "--specialize-active-lora,--no-specialize-active-lora", Bool, NoEffect(KERNELS)),
    f("LoRAConfig", "--enable-mixed-moe-lora-format,--no-enable-mixed-moe-lora-format", Bool, NoEffect(MOE)),
    f("LoRAConfig", "--enable-moe-shared-loras,--no-enable-moe-shared-loras", Bool, NoEffect(MOE)),
    f("LoRAConfig", "--max-lora-cls-labels", Value, NoEffect("sizes classification-head adapters, which are not served here")),
    f("LoggingConfig", "--logging-config", Value, NoEffect("a Python logging configuration; here --log-level or RUST_LOG sets the log filter")),
    f("LoggingConfig", "--log-level", Value, Honoured("the log level (CRITICAL, ERROR, WARNING, INFO, DEBUG, NOTSET); RUST_LOG wins")),
    f("LoggingConfig", "--log-config-file", Value, Deprecated("deprecated in vLLM 0.31 (to be removed in 0.33): use --logging-config; a Python logging file has no effect here (--log-level or RUST_LOG sets the log filter)")),
    f("ObservabilityConfig", "--show-hidden-metrics-for-version", Value, NoEffect("this server hides no deprecated metrics")),
    f("ObservabilityConfig", "--otlp-traces-endpoint", Value, Refused("OpenTelemetry tracing is not built")),
    f("ObservabilityConfig", "--collect-detailed-traces", Values, NoEffect("only shapes --otlp-traces-endpoint, which is not built")),
    f("ObservabilityConfig", "--per-request-spec-decode-metrics", Value, NoEffect("only shapes speculative decoding, which is not built")),
    f("ObservabilityConfig", "--kv-cache-metrics,--no-kv-cache-metrics", Bool, NoEffect(METRICS_ONLY)),
    f("ObservabilityConfig", "--kv-cache-metrics-sample", Value, NoEffect(METRICS_ONLY)),
    f("ObservabilityConfig", "--cudagraph-metrics,--no-cudagraph-metrics", Bool, NoEffect(CUDA_GRAPHS)),
    f("ObservabilityConfig", "--enable-layerwise-nvtx-tracing,--no-enable-layerwise-nvtx-tracing", Bool, NoEffect("NVTX ranges for vLLM's profiler")),
    f("ObservabilityConfig", "--enable-mfu-metrics,--no-enable-mfu-metrics", Bool, NoEffect(METRICS_ONLY)),
    f("ObservabilityConfig", "--enable-logging-iteration-details,--no-enable-logging-iteration-details", Bool, NoEffect("per-step logging of vLLM's scheduler")),
    f("ObservabilityConfig", "--jit-monitor-mode", Value, NoEffect(CUDA_GRAPHS)),
    f("ObservabilityConfig", "--jit-monitor-verbose,--no-jit-monitor-verbose", Bool, NoEffect(CUDA_GRAPHS)),
    f("SchedulerConfig", "--max-num-batched-tokens", Value, Honoured("tokens one engine step may compute (default 2048; `8k` and `8K` spellings)")),
    f("SchedulerConfig", "--max-num-scheduled-tokens", Value, NoEffect("a cap of vLLM's asynchronous scheduler; --max-num-batched-tokens bounds a step here")),
    f("SchedulerConfig", "--max-num-seqs", Value, Honoured("sequences a model holds, running and waiting (default 256)")),
    f("SchedulerConfig", "--max-num-active-seqs", Value, Honoured("sequences in the running batch")),
    f("SchedulerConfig", "--max-num-queued-reqs", Value, Refused("not built: --max-num-seqs and --max-concurrent-requests bound what waits")),
    f("SchedulerConfig", "--max-num-queued-tokens", Value, Refused("not built: --max-num-seqs and --max-concurrent-requests bound what waits")),
    f("SchedulerConfig", "--long-prefill-token-threshold", Value, NoEffect("tunes vLLM's scheduler; prefill chunks here are bounded by --max-num-batched-tokens")),
    f("SchedulerConfig", "--long-prefill-token-threshold-adaptive,--no-long-prefill-token-threshold-adaptive", Bool, NoEffect("tunes vLLM's scheduler; prefill chunks here are bounded by --max-num-batched-tokens")),
    f("SchedulerConfig", "--scheduling-policy", Value, Only(&["fcfs"], "only first-come-first-served scheduling is built")),
    f("SchedulerConfig", "--enable-chunked-prefill,--no-enable-chunked-prefill", Bool, Only(ON, "prefill is always chunked here (at most --max-num-batched-tokens a step)")),
    f("SchedulerConfig", "--disable-chunked-mm-input,--no-disable-chunked-mm-input", Bool, NoEffect("tunes vLLM's scheduling of media tokens")),
    f("SchedulerConfig", "--scheduler-cls", Value, Refused(NO_PYTHON)),
    f("SchedulerConfig", "--scheduler-reserve-full-isl,--no-scheduler-reserve-full-isl", Bool, NoEffect("tunes vLLM's admission of long prompts")),
    f("SchedulerConfig", "--watermark", Value, NoEffect("tunes vLLM's KV block reservation")),
    f("SchedulerConfig", "--prefill-schedule-interval", Value, NoEffect("tunes vLLM's scheduler")),
    f("SchedulerConfig", "--disable-hybrid-kv-cache-manager,--no-disable-hybrid-kv-cache-manager", Bool, NoEffect("tunes vLLM's KV cache manager")),
    f("SchedulerConfig", "--async-scheduling,--no-async-scheduling", Bool, NoEffect("tunes vLLM's scheduler")),
    f("SchedulerConfig", "--stream-interval", Value, Only(ONE, "not built: every token is streamed as it comes")),
    f("CompilationConfig", "--cudagraph-capture-sizes", Values, NoEffect(CUDA_GRAPHS)),
    f("CompilationConfig", "--max-cudagraph-capture-size", Value, NoEffect(CUDA_GRAPHS)),
    f("KernelConfig", "--ir-op-priority", Value, NoEffect(KERNELS)),
    f("KernelConfig", "--enable-flashinfer-autotune,--no-enable-flashinfer-autotune", Bool, NoEffect(KERNELS)),
    f("KernelConfig", "--moe-backend", Value, NoEffect(MOE)),
    f("KernelConfig", "--linear-backend", Value, NoEffect(KERNELS)),
    f("KernelConfig", "--sparse-indexer-topk-backend", Value, NoEffect(KERNELS)),
    f("VllmConfig", "--speculative-config,-sc", Value, Refused("speculative decoding is not built")),
    f("VllmConfig", "--spec-method", Value, Refused("speculative decoding is not built")),
    f("VllmConfig", "--spec-model", Value, Refused("speculative decoding is not built")),
    f("VllmConfig", "--spec-tokens", Value, Refused("speculative decoding is not built")),
    f("VllmConfig", "--watermark-config", Value, Refused("watermarking outputs is not built")),
    f("VllmConfig", "--diffusion-config,-dc", Value, Refused("diffusion models are not built")),
    f("VllmConfig", "--kv-transfer-config", Value, Refused("KV transfer (disaggregated prefill) is not built")),
    f("VllmConfig", "--kv-events-config", Value, Refused("KV cache events are not built")),
    f("VllmConfig", "--ec-transfer-config", Value, Refused("encoder cache transfer (disaggregated encoders) is not built")),
    f("VllmConfig", "--ec-manager-config", Value, NoEffect("tunes vLLM's encoder cache manager")),
    f("VllmConfig", "--compilation-config,-cc", Value, NoEffect(CUDA_GRAPHS)),
    f("VllmConfig", "--attention-config,-ac", Value, NoEffect(KERNELS)),
    f("VllmConfig", "--engram-config", Value, NoEffect(KERNELS)),
    f("VllmConfig", "--reasoning-config", Value, Refused("reasoning budgets are not built")),
    f("VllmConfig", "--kernel-config", Value, NoEffect(KERNELS)),
    f("VllmConfig", "--additional-config", Value, NoEffect("settings for vLLM's platform plugins")),
    f("VllmConfig", "--structured-outputs-config", Value, NoEffect("this server has one structured-output engine (llguidance), set per request")),
    f("VllmConfig", "--aux-output-config", Value, NoEffect(MOE)),
    f("VllmConfig", "--profiler-config", Value, NoEffect("vLLM's torch profiler; see BENCHMARKS.md for this server's")),
    f("VllmConfig", "--optimization-level", Value, NoEffect(CUDA_GRAPHS)),
    f("VllmConfig", "--performance-mode", Value, NoEffect(CUDA_GRAPHS)),
    f("VllmConfig", "--weight-transfer-config", Value, Refused("weight transfer from a trainer is not built")),
];

/// Flags vLLM 0.31 no longer has, with what replaced them. A manifest that still carries one
/// is refused with this text, as vLLM refuses it (an unknown flag).
#[rustfmt::skip]
pub static REMOVED: &[(&str, &str)] = &[
    ("--enable-mamba-fine-grained-prefix-cache", "renamed --enable-mamba-shared-prefix-checkpoint in vLLM 0.31"),
    ("--disable-log-requests", "removed before vLLM 0.30: requests are not logged by default, and --enable-log-requests logs them"),
    ("--swap-space", "removed before vLLM 0.30: preempted sequences are recomputed, so there is no CPU swap space; drop it"),
    ("--max-seq-len-to-capture", "removed before vLLM 0.30: CUDA graph sizes are set with --max-cudagraph-capture-size or --compilation-config"),
    ("--guided-decoding-backend", "removed before vLLM 0.30: use --structured-outputs-config '{\"backend\": ...}'"),
    ("--preemption-mode", "removed before vLLM 0.30: preempted sequences are always recomputed; drop it"),
    ("--num-scheduler-steps", "removed before vLLM 0.30 with multi-step scheduling; drop it"),
    ("--tokenizer-pool-size", "removed before vLLM 0.30 with the tokenizer pool; drop it"),
    ("--speculative-model", "removed before vLLM 0.30: use --speculative-config '{\"model\": ...}'"),
    ("--num-speculative-tokens", "removed before vLLM 0.30: use --speculative-config '{\"num_speculative_tokens\": ...}'"),
    ("--rope-scaling", "removed before vLLM 0.30: use --hf-overrides '{\"rope_scaling\": ...}'"),
    ("--rope-theta", "removed before vLLM 0.30: use --hf-overrides '{\"rope_theta\": ...}'"),
    ("--enable-reasoning", "removed before vLLM 0.30: --reasoning-parser alone turns reasoning output on"),
    ("--task", "removed before vLLM 0.30: use --runner (generate, pooling) and --convert (embed, classify)"),
    ("--worker-use-ray", "removed before vLLM 0.30: use --distributed-executor-backend ray"),
    ("--engine-use-ray", "removed before vLLM 0.30: use --distributed-executor-backend ray"),
];

/// Values vLLM 0.31 removed from a flag that still exists, with what replaced them.
pub static REMOVED_VALUES: &[(&str, &str, &str)] = &[(
    "tokenizer-mode",
    "slow",
    "removed in vLLM 0.31: use auto or hf",
)];

/// The row of a long name (without dashes, `-` as the separator).
pub fn find(long: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|flag| flag.long() == long)
}

/// The row a short alias (`-tp`) stands for.
pub fn find_short(short: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|flag| flag.shorts().any(|s| s == short))
}

/// What replaced a removed flag (`--swap-space`, with `-` separators).
pub fn removed(flag: &str) -> Option<&'static str> {
    REMOVED
        .iter()
        .find(|(name, _)| *name == flag)
        .map(|(_, why)| *why)
}
