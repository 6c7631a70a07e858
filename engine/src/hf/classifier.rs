//! A sequence-classification checkpoint's labels and activations, from its `config.json`:
//! `id2label` (else `num_labels`, else transformers' default of two), `problem_type` for the
//! classify task, and sentence-transformers' recorded activation for the score task, read as
//! vLLM reads them.

use super::HfConfig;
use crate::error::{EngineError, Result};
use crate::model::{ClassActivation, ClassifierInfo};

/// transformers' `num_labels` when a config names none.
const DEFAULT_LABELS: usize = 2;

/// The classifier described by `cfg`. A label map with gaps, an unknown `problem_type` or an
/// activation we do not have is a `Load` error naming the field.
pub fn classifier_info(cfg: &HfConfig) -> Result<ClassifierInfo> {
    let labels = labels(cfg)?;
    let by_count = ClassActivation::by_label_count(labels.len());
    let classify = match cfg.problem_type.as_deref() {
        None | Some("single_label_classification") => by_count,
        Some("multi_label_classification") => ClassActivation::Sigmoid,
        Some("regression") => ClassActivation::Identity,
        Some(other) => {
            return Err(bad(format!(
                "unsupported problem_type `{other}` (supported: single_label_classification, multi_label_classification, regression)"
            )))
        }
    };
    let recorded = cfg
        .sentence_transformers
        .as_ref()
        .and_then(|st| st.get("activation_fn"))
        .and_then(|f| f.as_str())
        .map(|f| (f, "sentence_transformers.activation_fn"))
        .or_else(|| {
            cfg.sbert_ce_default_activation_function
                .as_deref()
                .map(|f| (f, "sbert_ce_default_activation_function"))
        });
    let score = match recorded {
        None => by_count,
        Some((name, field)) => score_activation(name, by_count)
            .ok_or_else(|| bad(format!("unsupported {field} `{name}` (supported: torch.nn.modules Identity, Sigmoid, Softmax)")))?,
    };
    Ok(ClassifierInfo {
        labels,
        classify,
        score,
    })
}

/// A torch module name as sentence-transformers records it. Sigmoid and Softmax both mean
/// "the classifier's own": sigmoid for one label, softmax over several (vLLM's reading).
fn score_activation(name: &str, by_count: ClassActivation) -> Option<ClassActivation> {
    let class = name.strip_prefix("torch.nn.modules.")?.rsplit('.').next()?;
    match class {
        "Identity" => Some(ClassActivation::Identity),
        "Sigmoid" | "Softmax" => Some(by_count),
        _ => None,
    }
}

fn labels(cfg: &HfConfig) -> Result<Vec<String>> {
    let Some(map) = &cfg.id2label else {
        let n = cfg.num_labels.unwrap_or(DEFAULT_LABELS);
        if n == 0 {
            return Err(bad("num_labels is 0".to_string()));
        }
        return Ok((0..n).map(|i| format!("LABEL_{i}")).collect());
    };
    let mut labels = vec![None; map.len()];
    for (key, name) in map {
        let slot = key
            .parse::<usize>()
            .ok()
            .and_then(|i| labels.get_mut(i))
            .ok_or_else(|| {
                bad(format!(
                    "id2label key `{key}` is not a label id in 0..{}",
                    map.len()
                ))
            })?;
        *slot = Some(name.clone());
    }
    let labels: Vec<String> = labels.into_iter().flatten().collect();
    if labels.is_empty() {
        return Err(bad("id2label is empty".to_string()));
    }
    if let Some(n) = cfg.num_labels.filter(|&n| n != labels.len()) {
        return Err(bad(format!(
            "num_labels {n} disagrees with id2label's {} labels",
            labels.len()
        )));
    }
    Ok(labels)
}

fn bad(reason: String) -> EngineError {
    EngineError::load("config.json", reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(json: &str) -> Result<ClassifierInfo> {
        classifier_info(&HfConfig::from_json(json).unwrap())
    }

    #[test]
    fn labels_and_default_activations() {
        let c = info(r#"{"id2label": {"1": "b", "0": "a", "2": "c"}}"#).unwrap();
        assert_eq!(c.labels, ["a", "b", "c"]);
        assert_eq!(c.classify, ClassActivation::Softmax);
        assert_eq!(c.score, ClassActivation::Softmax);
        let one = info(r#"{"id2label": {"0": "LABEL_0"}}"#).unwrap();
        assert_eq!(
            (one.classify, one.score),
            (ClassActivation::Sigmoid, ClassActivation::Sigmoid)
        );
        // transformers' default: two labels.
        assert_eq!(info("{}").unwrap().labels, ["LABEL_0", "LABEL_1"]);
    }

    #[test]
    fn problem_type_picks_the_classify_activation() {
        let multi = info(
            r#"{"id2label": {"0": "a", "1": "b"}, "problem_type": "multi_label_classification"}"#,
        )
        .unwrap();
        assert_eq!(multi.classify, ClassActivation::Sigmoid);
        let reg = info(r#"{"num_labels": 1, "problem_type": "regression"}"#).unwrap();
        assert_eq!(reg.classify, ClassActivation::Identity);
        let err = info(r#"{"problem_type": "ranking"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("problem_type `ranking`"), "{err}");
    }

    #[test]
    fn sentence_transformers_activation_picks_the_score_activation() {
        let ident = info(
            r#"{"id2label": {"0": "LABEL_0"}, "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}"#,
        )
        .unwrap();
        assert_eq!(ident.score, ClassActivation::Identity);
        assert_eq!(ident.classify, ClassActivation::Sigmoid);
        let sig = info(
            r#"{"id2label": {"0": "LABEL_0"}, "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}}"#,
        )
        .unwrap();
        assert_eq!(sig.score, ClassActivation::Sigmoid);
        let err = info(r#"{"sentence_transformers": {"activation_fn": "os.system"}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sentence_transformers.activation_fn"), "{err}");
    }

    #[test]
    fn malformed_label_maps_are_refused() {
        for json in [
            r#"{"id2label": {"0": "a", "2": "c"}}"#,
            r#"{"id2label": {"x": "a"}}"#,
            r#"{"id2label": {"0": "a"}, "num_labels": 2}"#,
            r#"{"num_labels": 0}"#,
        ] {
            assert!(info(json).is_err(), "{json}");
        }
    }
}
