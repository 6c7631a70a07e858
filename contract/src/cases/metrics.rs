//! `/metrics` as dashboards read it (CONTRACT section 8): the latency series are Prometheus
//! histograms with vLLM's bucket boundaries (`_bucket` series, cumulative, `+Inf` equal to
//! `_count`), not summaries, and the preemption counter exists.

use std::collections::BTreeMap;

use super::{Case, Ctx, FlowOutcome};
use crate::expect::summarize;
use crate::http::{Client, RequestSpec};
use crate::routes::Route;

/// vLLM's histograms and their finite bucket boundaries.
const HISTOGRAMS: &[(&str, &[f64])] = &[
    (
        "vllm:time_to_first_token_seconds",
        &[
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
        ],
    ),
    (
        "vllm:inter_token_latency_seconds",
        &[
            0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0,
        ],
    ),
    ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY),
    ("vllm:request_queue_time_seconds", REQUEST_LATENCY),
];

const REQUEST_LATENCY: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// One sample line of the text exposition format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the sample lines of a Prometheus text exposition; `Err` names the first line that
/// is not one.
pub fn parse_exposition(text: &str) -> Result<Vec<Sample>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_sample(line).ok_or_else(|| format!("not a sample line: {line:?}"))?);
    }
    Ok(out)
}

fn parse_sample(line: &str) -> Option<Sample> {
    let (name_and_labels, value) = line.rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let (name, labels) = match name_and_labels.split_once('{') {
        None => (name_and_labels.to_string(), BTreeMap::new()),
        Some((name, rest)) => (name.to_string(), parse_labels(rest.strip_suffix('}')?)?),
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

fn parse_labels(mut rest: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => value.push(match chars.next()?.1 {
                    'n' => '\n',
                    other => other,
                }),
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim_start_matches(',').to_string(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

/// What is wrong with histogram `name` of `model` in `samples` (empty: nothing).
pub fn histogram_problems(
    samples: &[Sample],
    name: &str,
    model: &str,
    bounds: &[f64],
) -> Vec<String> {
    let of_model = |s: &&Sample| s.labels.get("model_name").map(String::as_str) == Some(model);
    let buckets: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == format!("{name}_bucket"))
        .filter(of_model)
        .collect();
    let single = |suffix: &str| {
        samples
            .iter()
            .filter(of_model)
            .find(|s| s.name == format!("{name}{suffix}"))
            .map(|s| s.value)
    };
    let mut problems = Vec::new();
    if samples
        .iter()
        .any(|s| s.name == name && s.labels.contains_key("quantile"))
    {
        problems.push(format!("{name} is exported as a summary (quantile series)"));
    }
    let mut les: Vec<(f64, f64)> = buckets
        .iter()
        .filter_map(|s| {
            let le = s.labels.get("le")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, s.value))
        })
        .collect();
    les.sort_by(|a, b| a.0.total_cmp(&b.0));
    let finite: Vec<f64> = les
        .iter()
        .map(|(le, _)| *le)
        .filter(|le| le.is_finite())
        .collect();
    let same = finite.len() == bounds.len()
        && finite
            .iter()
            .zip(bounds)
            .all(|(a, b)| (a - b).abs() <= 1e-9 * b.abs().max(1.0));
    if !same {
        problems.push(format!(
            "{name}{{model_name=\"{model}\"}}: bucket bounds {finite:?}, expected vLLM's {bounds:?}"
        ));
    }
    if les.windows(2).any(|w| w[1].1 < w[0].1) {
        problems.push(format!("{name}: bucket counts are not cumulative"));
    }
    let inf = les
        .last()
        .filter(|(le, _)| le.is_infinite())
        .map(|(_, v)| *v);
    match (inf, single("_count"), single("_sum")) {
        (Some(inf), Some(count), Some(_)) if inf == count => {}
        (inf, count, sum) => problems.push(format!(
            "{name}: +Inf bucket {inf:?}, _count {count:?}, _sum {sum:?} (need all three, +Inf = count)"
        )),
    }
    problems
}

async fn histograms(client: Client, model: String) -> FlowOutcome {
    let fail = |why: String| FlowOutcome {
        got: why.clone(),
        failures: vec![why],
    };
    // One finished request so that every series has observations.
    let chat = RequestSpec::post_json(Route::Chat.path(), Route::Chat.body(&model));
    match client.send(&chat).await {
        Ok(reply) if reply.status == 200 => {}
        Ok(reply) => return fail(format!("the chat request answered {}", summarize(&reply))),
        Err(err) => return fail(err.to_string()),
    }
    let reply = match client.send(&RequestSpec::get("/metrics")).await {
        Ok(reply) => reply,
        Err(err) => return fail(err.to_string()),
    };
    let samples = match parse_exposition(&reply.text()) {
        Ok(samples) => samples,
        Err(why) => return fail(why),
    };
    let mut failures: Vec<String> = HISTOGRAMS
        .iter()
        .flat_map(|(name, bounds)| histogram_problems(&samples, name, &model, bounds))
        .collect();
    if !samples
        .iter()
        .any(|s| s.name == "vllm:num_preemptions_total")
    {
        failures.push("no vllm:num_preemptions_total series".into());
    }
    FlowOutcome {
        got: format!("{} samples, {} problems", samples.len(), failures.len()),
        failures,
    }
}

pub fn cases(ctx: &Ctx) -> Vec<Case> {
    match ctx.chat_model() {
        Ok(model) => vec![Case::flow(
            "meta /metrics latency histograms with vLLM's buckets, and preemptions",
            "GET /metrics",
            "_bucket/_sum/_count series with vLLM's bounds for TTFT, ITL, e2e and queue time",
            Box::new(move |client| Box::pin(histograms(client, model))),
        )],
        Err(why) => vec![Case::decided(
            "meta /metrics histograms",
            "GET /metrics",
            "a generation model",
            Err(why),
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# TYPE h histogram
h_bucket{model_name="m",le="0.5"} 1
h_bucket{model_name="m",le="1"} 3
h_bucket{model_name="m",le="+Inf"} 4
h_sum{model_name="m"} 2.5
h_count{model_name="m"} 4
other{a="x\"y"} 7
"#;

    #[test]
    fn parses_samples_and_checks_a_histogram() {
        let samples = parse_exposition(TEXT).unwrap();
        assert_eq!(samples.len(), 6);
        assert_eq!(samples[5].labels["a"], "x\"y");
        assert!(histogram_problems(&samples, "h", "m", &[0.5, 1.0]).is_empty());
        let wrong = histogram_problems(&samples, "h", "m", &[0.5, 2.0]);
        assert_eq!(wrong.len(), 1, "{wrong:?}");
        assert!(!histogram_problems(&samples, "h", "other-model", &[0.5, 1.0]).is_empty());
    }

    #[test]
    fn a_summary_or_a_broken_histogram_is_reported() {
        let text = "s{model_name=\"m\",quantile=\"0.5\"} 1\ns_sum{model_name=\"m\"} 1\ns_count{model_name=\"m\"} 1\n";
        let problems = histogram_problems(&parse_exposition(text).unwrap(), "s", "m", &[1.0]);
        assert!(
            problems.iter().any(|p| p.contains("summary")),
            "{problems:?}"
        );
        assert!(parse_exposition("not a metric line").is_err());
        let shrinking = "h_bucket{model_name=\"m\",le=\"1\"} 3\nh_bucket{model_name=\"m\",le=\"+Inf\"} 2\nh_sum{model_name=\"m\"} 1\nh_count{model_name=\"m\"} 2\n";
        let problems = histogram_problems(&parse_exposition(shrinking).unwrap(), "h", "m", &[1.0]);
        assert!(
            problems.iter().any(|p| p.contains("cumulative")),
            "{problems:?}"
        );
    }
}
