//! `/metrics` as Kubernetes inference routers read it: the Gateway API Inference Extension's
//! endpoint picker and llm-d parse the text format (Go's `expfmt`, which takes a value as a
//! gauge only when the family's `# TYPE` says so), find each family by vLLM's name and take the
//! first series whose labels match the ones they were configured with (none, or
//! `model_name`). What they read: `vllm:num_requests_waiting`, `vllm:num_requests_running`,
//! `vllm:kv_cache_usage_perc` (gauges), `vllm:cache_config_info` (a gauge of 1 whose labels
//! `block_size` and `num_gpu_blocks` size the prefix-cache model), and, where adapters are
//! served, `vllm:lora_requests_info` (a gauge whose labels list them).

use std::collections::BTreeMap;

use super::metrics::{parse_exposition, Sample};
use super::{Case, Ctx, FlowOutcome};
use crate::http::{Client, RequestSpec};

pub const WAITING: &str = "vllm:num_requests_waiting";
pub const RUNNING: &str = "vllm:num_requests_running";
pub const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
pub const CACHE_CONFIG: &str = "vllm:cache_config_info";
pub const LORA_INFO: &str = "vllm:lora_requests_info";

/// The labels vLLM puts on every per-engine series.
const ENGINE_LABELS: [&str; 2] = ["model_name", "engine"];
/// The labels of `vllm:lora_requests_info`.
const LORA_LABELS: [&str; 3] = ["max_lora", "running_lora_adapters", "waiting_lora_adapters"];

/// A scrape parsed the way the picker parses it: every sample, and each family's type.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    pub samples: Vec<Sample>,
    /// `# TYPE` of each family, by name.
    pub types: BTreeMap<String, String>,
}

impl Scrape {
    /// Parses a text exposition; like `expfmt`, a `# TYPE` line after its family's samples
    /// or given twice is an error (the picker's whole scrape fails on it).
    pub fn parse(text: &str) -> Result<Self, String> {
        let samples = parse_exposition(text)?;
        let mut types = BTreeMap::new();
        let mut seen: Vec<&str> = Vec::new();
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut words = rest.split_whitespace();
                let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                    return Err(format!("malformed TYPE line: {line:?}"));
                };
                if seen
                    .iter()
                    .any(|sample| *sample == name || family_of(sample) == name)
                {
                    return Err(format!("TYPE line for {name} after its samples"));
                }
                if types.insert(name.to_string(), kind.to_string()).is_some() {
                    return Err(format!("second TYPE line for {name}"));
                }
            } else if !line.is_empty() && !line.starts_with('#') {
                seen.push(line.split(['{', ' ']).next().unwrap_or(line));
            }
        }
        Ok(Self { samples, types })
    }

    /// The series of family `name` whose labels include every pair of `filter`, in the
    /// order served.
    pub fn series<'a>(&'a self, name: &'a str, filter: &'a [(&str, &str)]) -> Vec<&'a Sample> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                filter
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// What the picker reads: the first matching series' value, when the family is a gauge.
    pub fn picked(&self, name: &str, filter: &[(&str, &str)]) -> Result<f64, String> {
        match self.types.get(name).map(String::as_str) {
            Some("gauge") => {}
            Some(other) => return Err(format!("{name} is a {other}, not a gauge")),
            None => return Err(format!("{name} has no TYPE line (read as untyped)")),
        }
        self.series(name, filter)
            .first()
            .map(|s| s.value)
            .ok_or_else(|| format!("no {name} series with labels {filter:?}"))
    }
}

/// The family a sample name belongs to (histogram and counter suffixes removed), for the
/// TYPE-order check.
fn family_of(sample: &str) -> &str {
    ["_bucket", "_sum", "_count", "_total"]
        .iter()
        .find_map(|suffix| sample.strip_suffix(suffix))
        .unwrap_or(sample)
}

/// What a router would misread in `scrape`; with `model`, the series of that model must be
/// among them. Empty: nothing.
pub fn router_problems(scrape: &Scrape, model: Option<&str>) -> Vec<String> {
    let mut problems = Vec::new();
    let filter: Vec<(&str, &str)> = model.map(|m| vec![("model_name", m)]).unwrap_or_default();
    for name in [WAITING, RUNNING, KV_USAGE] {
        match scrape.picked(name, &filter) {
            Err(why) => problems.push(why),
            Ok(value) if !value.is_finite() || value < 0.0 => {
                problems.push(format!("{name} = {value}, not a count or fraction"));
            }
            Ok(value) if name == KV_USAGE && value > 1.0 => {
                problems.push(format!(
                    "{name} = {value}: a fraction (1 means full) is expected"
                ));
            }
            Ok(value) if name != KV_USAGE && value.fract() != 0.0 => {
                problems.push(format!("{name} = {value}, not a whole number of requests"));
            }
            Ok(_) => {}
        }
        problems.extend(missing_labels(scrape, name, &ENGINE_LABELS));
    }
    problems.extend(cache_config_problems(scrape, &filter));
    if scrape.types.contains_key(LORA_INFO) || !scrape.series(LORA_INFO, &[]).is_empty() {
        if scrape.types.get(LORA_INFO).map(String::as_str) != Some("gauge") {
            problems.push(format!("{LORA_INFO} is not typed gauge"));
        }
        problems.extend(missing_labels(scrape, LORA_INFO, &LORA_LABELS));
    }
    problems
}

/// `vllm:cache_config_info`: a gauge of 1 with a positive `block_size`, a whole
/// `num_gpu_blocks` and vLLM's `engine` label.
fn cache_config_problems(scrape: &Scrape, filter: &[(&str, &str)]) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(why) = scrape.picked(CACHE_CONFIG, filter) {
        return vec![why];
    }
    for series in scrape.series(CACHE_CONFIG, filter) {
        let number = |label: &str| series.labels.get(label).and_then(|v| v.parse::<u64>().ok());
        if series.value != 1.0 {
            problems.push(format!(
                "{CACHE_CONFIG} = {}, an info gauge is 1",
                series.value
            ));
        }
        if number("block_size").is_none_or(|b| b == 0) {
            problems.push(format!(
                "{CACHE_CONFIG}: block_size {:?} is not a positive integer",
                series.labels.get("block_size")
            ));
        }
        if number("num_gpu_blocks").is_none() {
            problems.push(format!(
                "{CACHE_CONFIG}: num_gpu_blocks {:?} is not an integer",
                series.labels.get("num_gpu_blocks")
            ));
        }
    }
    problems.extend(missing_labels(scrape, CACHE_CONFIG, &["engine"]));
    problems
}

/// Series of `name` that lack one of `labels`.
fn missing_labels(scrape: &Scrape, name: &str, labels: &[&str]) -> Vec<String> {
    scrape
        .series(name, &[])
        .iter()
        .flat_map(|series| {
            labels
                .iter()
                .filter(|label| !series.labels.contains_key(**label))
                .map(move |label| format!("{name}{:?} lacks the label {label}", series.labels))
        })
        .collect()
}

/// Scrapes `/metrics` and checks it as a router reads it.
pub async fn check(client: &Client, model: Option<&str>) -> FlowOutcome {
    let fail = |why: String| FlowOutcome {
        got: why.clone(),
        failures: vec![why],
    };
    let reply = match client.send(&RequestSpec::get("/metrics")).await {
        Ok(reply) if reply.status == 200 => reply,
        Ok(reply) => return fail(format!("GET /metrics answered {}", reply.status)),
        Err(err) => return fail(err.to_string()),
    };
    let scrape = match Scrape::parse(&reply.text()) {
        Ok(scrape) => scrape,
        Err(why) => return fail(why),
    };
    let failures = router_problems(&scrape, model);
    let got = match failures.first() {
        None => {
            format!("{WAITING}, {RUNNING}, {KV_USAGE}, {CACHE_CONFIG} typed and labelled as vLLM's")
        }
        Some(first) => first.clone(),
    };
    FlowOutcome { got, failures }
}

pub fn cases(ctx: &Ctx) -> Vec<Case> {
    let model = ctx.chat_model().ok();
    vec![Case::flow(
        "meta /metrics router gauges as the endpoint picker reads them",
        "GET /metrics",
        "vLLM's router gauges, typed gauge, labelled model_name and engine",
        Box::new(move |client| Box::pin(async move { check(&client, model.as_deref()).await })),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m",engine="0"} 0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="4096",model_name="m"} 1
"#;

    fn problems(text: &str) -> Vec<String> {
        match Scrape::parse(text) {
            Ok(scrape) => router_problems(&scrape, Some("m")),
            Err(why) => vec![why],
        }
    }

    #[test]
    fn a_vllm_shaped_scrape_passes_and_the_picker_reads_the_first_series() {
        assert!(problems(GOOD).is_empty(), "{:?}", problems(GOOD));
        let scrape = Scrape::parse(GOOD).unwrap();
        assert_eq!(scrape.picked(RUNNING, &[]).unwrap(), 2.0);
        assert!(scrape.picked(RUNNING, &[("model_name", "other")]).is_err());
    }

    #[test]
    fn each_misreading_is_reported() {
        let untyped = GOOD.replace("# TYPE vllm:num_requests_running gauge\n", "");
        assert!(problems(&untyped)[0].contains("no TYPE line"));
        let counter = GOOD.replace("num_requests_waiting gauge", "num_requests_waiting counter");
        assert!(problems(&counter)[0].contains("not a gauge"));
        let no_engine = GOOD.replace(
            r#"vllm:kv_cache_usage_perc{model_name="m",engine="0"}"#,
            r#"vllm:kv_cache_usage_perc{model_name="m"}"#,
        );
        assert!(problems(&no_engine)
            .iter()
            .any(|p| p.contains("lacks the label engine")));
        let percent = GOOD.replace("} 0.25", "} 25");
        assert!(problems(&percent).iter().any(|p| p.contains("fraction")));
        let no_blocks = GOOD.replace(r#"num_gpu_blocks="4096","#, "");
        assert!(problems(&no_blocks)
            .iter()
            .any(|p| p.contains("num_gpu_blocks")));
        let missing = GOOD.replace("vllm:cache_config_info", "vllm:cache_config");
        assert!(problems(&missing).iter().any(|p| p.contains(CACHE_CONFIG)));
        let late = format!("{GOOD}# TYPE vllm:num_requests_waiting gauge\n");
        assert!(problems(&late)[0].contains("after its samples"));
    }

    #[test]
    fn lora_info_needs_vllm_labels_when_present() {
        let lora = format!(
            "{GOOD}# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{{max_lora=\"1\",running_lora_adapters=\"a\"}} 1.7e9\n"
        );
        let found = problems(&lora);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("waiting_lora_adapters"));
    }
}
