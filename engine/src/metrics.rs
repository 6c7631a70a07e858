//! Engine metrics under vLLM's names, recorded through the `metrics` facade (the gateway
//! installs the Prometheus recorder). Every series carries vLLM's labels `model_name` and
//! `engine`: routers (the Gateway API Inference Extension's endpoint picker, llm-d) select
//! series by them. Each model here has one engine, so `engine` is always `0`, as on a vLLM
//! server without data parallelism.

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Label};

use crate::api::FinishReason;

pub const NUM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
pub const NUM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
pub const KV_CACHE_USAGE_PERC: &str = "vllm:kv_cache_usage_perc";
/// The same usage under vLLM's older name, exported for models whose cache is on a GPU.
pub const GPU_CACHE_USAGE_PERC: &str = "vllm:gpu_cache_usage_perc";
/// An info series (value 1) whose labels say where each model runs and how its cache is cut:
/// vLLM's `block_size`, `num_gpu_blocks` (the engine's KV blocks on whatever device holds them,
/// as vLLM's V1 engine counts them, CPU included), `num_cpu_blocks` (0: nothing is swapped),
/// `enable_prefix_caching` (`True` / `False`, as Python prints it) and `engine`, plus ours:
/// `model_name` and `device`.
pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
/// 1 per served model, labelled with the path that loaded its weights (`disk`, `ipc_cache`).
pub const WEIGHTS_SOURCE: &str = "gateway:weights_source";
pub const PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries_total";
pub const PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits_total";
pub const PROMPT_TOKENS: &str = "vllm:prompt_tokens_total";
pub const GENERATION_TOKENS: &str = "vllm:generation_tokens_total";
pub const REQUEST_SUCCESS: &str = "vllm:request_success_total";
pub const TIME_TO_FIRST_TOKEN: &str = "vllm:time_to_first_token_seconds";
pub const INTER_TOKEN_LATENCY: &str = "vllm:inter_token_latency_seconds";
pub const E2E_REQUEST_LATENCY: &str = "vllm:e2e_request_latency_seconds";
pub const REQUEST_QUEUE_TIME: &str = "vllm:request_queue_time_seconds";
pub const NUM_PREEMPTIONS: &str = "vllm:num_preemptions_total";
/// LoRA serving state, as vLLM exports it for routers: a gauge whose value is the time (Unix
/// seconds) of its last update, labelled `max_lora` and the comma-joined names of the adapters
/// of running and of waiting requests. A new label set is a new series; readers take the one
/// with the latest value.
pub const LORA_REQUESTS_INFO: &str = "vllm:lora_requests_info";
// The adapter cache counts its own loads and evictions (named where it counts them, so that the
// adapters do not depend on this module, which depends on the API that names adapters).
pub use crate::lora::{LORA_EVICTIONS, LORA_LOADS};
/// Structured replies closed early so that `max_tokens` would not cut them (ours: vLLM has none).
pub const FORCED_CLOSINGS: &str = "gateway:structured_output_forced_closings_total";

/// vLLM's bucket boundaries for time to first token, so its Grafana dashboards read ours.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's bucket boundaries for inter-token latency.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's bucket boundaries for whole-request intervals (end to end, queue time).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Every engine histogram with its bucket boundaries, for the exporter the gateway installs.
pub fn histogram_buckets() -> [(&'static str, &'static [f64]); 4] {
    [
        (TIME_TO_FIRST_TOKEN, TTFT_BUCKETS),
        (INTER_TOKEN_LATENCY, ITL_BUCKETS),
        (E2E_REQUEST_LATENCY, REQUEST_LATENCY_BUCKETS),
        (REQUEST_QUEUE_TIME, REQUEST_LATENCY_BUCKETS),
    ]
}

/// Register the descriptions of every engine metric with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        NUM_REQUESTS_RUNNING,
        "Number of requests in the model execution batch."
    );
    describe_gauge!(
        NUM_REQUESTS_WAITING,
        "Number of requests waiting to be processed."
    );
    describe_gauge!(
        KV_CACHE_USAGE_PERC,
        Unit::Percent,
        "KV-cache usage. 1 means 100 percent usage."
    );
    describe_gauge!(
        GPU_CACHE_USAGE_PERC,
        Unit::Percent,
        "GPU KV-cache usage. 1 means 100 percent usage."
    );
    describe_gauge!(
        WEIGHTS_SOURCE,
        "Which path loaded each model's weights: label source is disk or ipc_cache."
    );
    describe_gauge!(
        CACHE_CONFIG_INFO,
        "Information of the KV cache: the device that holds it, its block size and count."
    );
    describe_counter!(
        PREFIX_CACHE_QUERIES,
        Unit::Count,
        "Prefix cache queries, in terms of number of queried tokens."
    );
    describe_counter!(
        PREFIX_CACHE_HITS,
        Unit::Count,
        "Prefix cache hits, in terms of number of cached tokens."
    );
    describe_counter!(
        PROMPT_TOKENS,
        Unit::Count,
        "Number of prefill tokens processed."
    );
    describe_counter!(
        GENERATION_TOKENS,
        Unit::Count,
        "Number of generation tokens processed."
    );
    describe_counter!(
        REQUEST_SUCCESS,
        Unit::Count,
        "Count of successfully processed requests."
    );
    describe_histogram!(
        TIME_TO_FIRST_TOKEN,
        Unit::Seconds,
        "Histogram of time to first token in seconds."
    );
    describe_histogram!(
        INTER_TOKEN_LATENCY,
        Unit::Seconds,
        "Histogram of inter-token latency in seconds."
    );
    describe_histogram!(
        E2E_REQUEST_LATENCY,
        Unit::Seconds,
        "Histogram of e2e request latency in seconds."
    );
    describe_histogram!(
        REQUEST_QUEUE_TIME,
        Unit::Seconds,
        "Histogram of time spent in WAITING phase for request."
    );
    describe_counter!(
        NUM_PREEMPTIONS,
        Unit::Count,
        "Cumulative number of preemption from the engine."
    );
    describe_gauge!(LORA_REQUESTS_INFO, "Running stats on lora requests.");
    describe_counter!(
        LORA_LOADS,
        Unit::Count,
        "Reads of a LoRA adapter's factors from its folder (at load, and after an eviction)."
    );
    describe_counter!(
        LORA_EVICTIONS,
        Unit::Count,
        "LoRA adapters whose factors were dropped from memory to stay within --max-cpu-loras."
    );
    describe_counter!(
        FORCED_CLOSINGS,
        Unit::Count,
        "Structured-output replies completed with the shortest valid ending because max_tokens was about to cut them."
    );
}

/// The vLLM label value of a finish reason.
pub fn finish_label(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
    }
}

/// vLLM's engine index; one engine per model here.
pub const ENGINE_INDEX: &str = "0";

/// The labels of every per-model series.
fn model_labels(model_name: &str) -> Vec<Label> {
    vec![
        Label::new("model_name", model_name.to_string()),
        Label::new("engine", ENGINE_INDEX),
    ]
}

/// Metric handles of one served model.
#[derive(Debug)]
pub struct ModelMetrics {
    model_name: String,
    running: Gauge,
    waiting: Gauge,
    kv_usage: Gauge,
    /// Set once the model's cache is placed on a GPU.
    gpu_usage: std::sync::OnceLock<Gauge>,
    prefix_queries: Counter,
    prefix_hits: Counter,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue_time: Histogram,
    preemptions: Counter,
    forced_closings: Counter,
    /// The labels of the latest `vllm:lora_requests_info` update and when it was made.
    lora_info: std::sync::Mutex<Option<([String; 3], std::time::Instant)>>,
}

impl ModelMetrics {
    pub fn new(model_name: &str) -> Self {
        let name = model_name.to_string();
        let labels = model_labels(model_name);
        ModelMetrics {
            running: metrics::gauge!(NUM_REQUESTS_RUNNING, labels.clone()),
            waiting: metrics::gauge!(NUM_REQUESTS_WAITING, labels.clone()),
            kv_usage: metrics::gauge!(KV_CACHE_USAGE_PERC, labels.clone()),
            gpu_usage: std::sync::OnceLock::new(),
            prefix_queries: metrics::counter!(PREFIX_CACHE_QUERIES, labels.clone()),
            prefix_hits: metrics::counter!(PREFIX_CACHE_HITS, labels.clone()),
            prompt_tokens: metrics::counter!(PROMPT_TOKENS, labels.clone()),
            generation_tokens: metrics::counter!(GENERATION_TOKENS, labels.clone()),
            ttft: metrics::histogram!(TIME_TO_FIRST_TOKEN, labels.clone()),
            itl: metrics::histogram!(INTER_TOKEN_LATENCY, labels.clone()),
            e2e: metrics::histogram!(E2E_REQUEST_LATENCY, labels.clone()),
            queue_time: metrics::histogram!(REQUEST_QUEUE_TIME, labels.clone()),
            preemptions: metrics::counter!(NUM_PREEMPTIONS, labels.clone()),
            forced_closings: metrics::counter!(FORCED_CLOSINGS, labels.clone()),
            lora_info: std::sync::Mutex::new(None),
            model_name: name,
        }
    }

    /// A structured reply closed early by its budget.
    pub fn forced_closing(&self) {
        self.forced_closings.increment(1);
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// Where the model's KV cache lives (`cpu`, `cuda:0`) and how it is cut: the
    /// `vllm:cache_config_info` series, and `vllm:gpu_cache_usage_perc` from now on when the
    /// cache is on a GPU.
    pub fn placed(
        &self,
        device: &str,
        block_size: usize,
        num_blocks: usize,
        enable_prefix_caching: bool,
    ) {
        let mut labels = model_labels(&self.model_name);
        labels.extend([
            Label::new("device", device.to_string()),
            Label::new("block_size", block_size.to_string()),
            Label::new("num_gpu_blocks", num_blocks.to_string()),
            Label::new("num_cpu_blocks", "0"),
            Label::new(
                "enable_prefix_caching",
                if enable_prefix_caching {
                    "True"
                } else {
                    "False"
                },
            ),
        ]);
        metrics::gauge!(CACHE_CONFIG_INFO, labels).set(1.0);
        if device.starts_with("cuda") {
            let _ = self.gpu_usage.set(metrics::gauge!(
                GPU_CACHE_USAGE_PERC,
                model_labels(&self.model_name)
            ));
        }
    }

    /// Scheduler state after a step.
    pub fn queue(&self, running: usize, waiting: usize, kv_usage: f64) {
        self.running.set(running as f64);
        self.waiting.set(waiting as f64);
        self.kv_usage.set(kv_usage);
        if let Some(g) = self.gpu_usage.get() {
            g.set(kv_usage);
        }
    }

    /// LoRA state after a step: `vllm:lora_requests_info` set to the current time, when the
    /// adapters changed or a second has passed since the last update.
    pub fn lora_requests(&self, max_lora: usize, running: String, waiting: String) {
        let labels = [max_lora.to_string(), running, waiting];
        let mut last = self.lora_info.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = last
            .as_ref()
            .is_some_and(|(l, at)| *l == labels && at.elapsed() < Duration::from_secs(1));
        if fresh {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let [max, running, waiting] = labels.clone();
        metrics::gauge!(
            LORA_REQUESTS_INFO,
            "max_lora" => max,
            "running_lora_adapters" => running,
            "waiting_lora_adapters" => waiting
        )
        .set(now);
        *last = Some((labels, std::time::Instant::now()));
    }

    pub fn prefix_cache(&self, queried_tokens: usize, hit_tokens: usize) {
        self.prefix_queries.increment(queried_tokens as u64);
        self.prefix_hits.increment(hit_tokens as u64);
    }

    pub fn prompt_tokens(&self, n: usize) {
        self.prompt_tokens.increment(n as u64);
    }

    pub fn generation_tokens(&self, n: usize) {
        self.generation_tokens.increment(n as u64);
    }

    pub fn first_token(&self, d: Duration) {
        self.ttft.record(d.as_secs_f64());
    }

    pub fn inter_token(&self, d: Duration) {
        self.itl.record(d.as_secs_f64());
    }

    /// A request's wait from arrival to its first scheduling.
    pub fn queued(&self, d: Duration) {
        self.queue_time.record(d.as_secs_f64());
    }

    pub fn preempted(&self) {
        self.preemptions.increment(1);
    }

    /// A request ended (on the async side, where stop strings are known).
    pub fn request_finished(&self, reason: FinishReason, e2e: Duration) {
        let mut labels = model_labels(&self.model_name);
        labels.push(Label::new("finished_reason", finish_label(reason)));
        metrics::counter!(REQUEST_SUCCESS, labels).increment(1);
        self.e2e.record(e2e.as_secs_f64());
    }
}

/// Records which path loaded `model`'s weights.
pub fn weights_source(model: &str, source: &'static str) {
    metrics::gauge!(WEIGHTS_SOURCE, "model_name" => model.to_string(), "source" => source).set(1.0);
}
