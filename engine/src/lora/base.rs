//! Which served model an adapter attaches to when its load does not name one (a runtime load,
//! or `--lora-modules` without `base_model_name`). One server serves several models, so the
//! first decoder is not an answer: the adapter's own `base_model_name_or_path` (what PEFT
//! recorded at training) is matched against each model's names and checkpoint, and only a
//! deployment with one decoder that runs adapters may take an adapter that names none of them.

use std::path::Path;

use serde_json::Value;

use super::adapter::CONFIG_FILE;
use super::LoraError;

/// One served model as an adapter's base may name it.
#[derive(Debug, Clone)]
pub struct BaseCandidate {
    /// The name the engine serves it under.
    pub served: String,
    /// Every name that means it: served names, aliases, what it was given as, its checkpoint.
    pub names: Vec<String>,
    /// Whether it runs adapters (a CPU decoder with `--enable-lora`).
    pub runs_adapters: bool,
}

impl BaseCandidate {
    /// Whether `base` names this model: one of its names as written, or the same file or
    /// folder once both are resolved (`./m/` and `m`).
    fn named_by(&self, base: &str) -> bool {
        let base = base.trim_end_matches('/');
        self.names.iter().any(|n| {
            n.trim_end_matches('/') == base
                || matches!(
                    (Path::new(n).canonicalize(), Path::new(base).canonicalize()),
                    (Ok(a), Ok(b)) if a == b
                )
        })
    }
}

/// `base_model_name_or_path` of the adapter folder `dir`, when its config can be read and
/// holds one. An unreadable config is not an error here: the load that follows names it.
pub fn recorded_base(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(CONFIG_FILE)).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v.get("base_model_name_or_path")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// The place in `candidates` of the model adapter `name` (folder `path`, recording `base`)
/// attaches to. Refused: a match that runs no adapters (`Err(Some(i))`, the caller says why),
/// and, with several decoders that run adapters, a base that names none or several of them.
pub fn choose(
    name: &str,
    path: &str,
    base: Option<&str>,
    candidates: &[BaseCandidate],
) -> Result<usize, Choice> {
    let runners: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].runs_adapters)
        .collect();
    let matched: Vec<usize> = base.map_or_else(Vec::new, |b| {
        (0..candidates.len())
            .filter(|&i| candidates[i].named_by(b))
            .collect()
    });
    let listed = |ids: &[usize]| -> Vec<String> {
        ids.iter().map(|&i| candidates[i].served.clone()).collect()
    };
    let refuse = |why: String, ids: &[usize]| {
        Choice::Refused(LoraError::NoBase {
            name: name.to_string(),
            path: path.to_string(),
            why,
            candidates: listed(ids).join(", "),
        })
    };
    match (matched.as_slice(), runners.as_slice()) {
        ([one], _) if candidates[*one].runs_adapters => Ok(*one),
        ([one], _) => Err(Choice::CannotRun(*one)),
        ([], []) => Err(Choice::NoneRun),
        ([], [only]) => Ok(*only),
        ([], several) => Err(refuse(
            match base {
                Some(b) => format!(
                    "its {CONFIG_FILE} records base_model_name_or_path {b:?}, which is none of the served models, and several served decoders run adapters"
                ),
                None => format!(
                    "its {CONFIG_FILE} records no base_model_name_or_path, and several served decoders run adapters"
                ),
            },
            several,
        )),
        (several, _) => Err(refuse(
            format!(
                "its {CONFIG_FILE} records base_model_name_or_path {:?}, which names several served models",
                base.unwrap_or_default()
            ),
            several,
        )),
    }
}

/// Why [`choose`] found no base.
#[derive(Debug, PartialEq, Eq)]
pub enum Choice {
    /// The adapter names the model at this place, which runs no adapters.
    CannotRun(usize),
    /// No served model runs adapters.
    NoneRun,
    /// Ambiguous: the error names the candidates.
    Refused(LoraError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(served: &str, names: &[&str], runs: bool) -> BaseCandidate {
        BaseCandidate {
            served: served.into(),
            names: names.iter().map(|n| n.to_string()).collect(),
            runs_adapters: runs,
        }
    }

    fn two() -> Vec<BaseCandidate> {
        vec![
            model("tiny", &["tiny", "tests/data/tiny-llama"], true),
            model("phi3", &["phi3", "org/phi3", "/cache/phi3"], true),
        ]
    }

    #[test]
    fn the_recorded_base_picks_among_several_decoders() {
        let c = two();
        assert_eq!(choose("a", "/a", Some("tests/data/tiny-llama/"), &c), Ok(0));
        assert_eq!(choose("a", "/a", Some("org/phi3"), &c), Ok(1));
        assert_eq!(choose("a", "/a", Some("phi3"), &c), Ok(1));
    }

    #[test]
    fn one_decoder_takes_what_names_no_model() {
        let c = vec![
            model("tiny", &["tiny"], true),
            model("minilm", &["minilm"], false),
        ];
        assert_eq!(choose("a", "/a", Some("elsewhere"), &c), Ok(0));
        assert_eq!(choose("a", "/a", None, &c), Ok(0));
        assert_eq!(
            choose("a", "/a", Some("minilm"), &c),
            Err(Choice::CannotRun(1))
        );
        assert_eq!(
            choose("a", "/a", None, &c[1..]),
            Err(Choice::NoneRun),
            "no decoder runs adapters"
        );
    }

    #[test]
    fn an_unmatched_base_among_several_decoders_lists_them() {
        let Err(Choice::Refused(e)) = choose("a", "/p/a", Some("elsewhere"), &two()) else {
            panic!("accepted")
        };
        let text = e.to_string();
        assert!(text.contains("\"elsewhere\""), "{text}");
        assert!(text.contains("tiny, phi3"), "{text}");
        assert!(text.contains("'a' at /p/a"), "{text}");
        let Err(Choice::Refused(e)) = choose("a", "/p/a", None, &two()) else {
            panic!("accepted")
        };
        assert!(e.to_string().contains("no base_model_name_or_path"), "{e}");
    }

    #[test]
    fn a_base_that_names_two_models_is_ambiguous() {
        let c = vec![
            model("x", &["x", "m.gguf"], true),
            model("y", &["y", "m.gguf"], true),
        ];
        let Err(Choice::Refused(e)) = choose("a", "/a", Some("m.gguf"), &c) else {
            panic!("accepted")
        };
        assert!(e.to_string().contains("names several"), "{e}");
        assert!(e.to_string().contains("x, y"), "{e}");
    }

    #[test]
    fn the_recorded_base_is_read_from_the_config() {
        let dir = std::env::temp_dir().join(format!("lora-base-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        std::fs::write(
            dir.join(CONFIG_FILE),
            r#"{"base_model_name_or_path": "org/m", "r": 8}"#,
        )
        .unwrap_or_default();
        assert_eq!(recorded_base(&dir).as_deref(), Some("org/m"));
        std::fs::write(dir.join(CONFIG_FILE), r#"{"base_model_name_or_path": ""}"#)
            .unwrap_or_default();
        assert_eq!(recorded_base(&dir), None);
        assert_eq!(recorded_base(&dir.join("absent")), None);
        std::fs::remove_dir_all(&dir).unwrap_or_default();
    }
}
