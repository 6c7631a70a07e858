//! Which files of a hub repository to download: what the loaders read, nothing else (no
//! `.bin`, ONNX or `consolidated.safetensors` copies of the same weights).

use std::path::{Path, PathBuf};

/// Configs, tokenizers and templates the loaders read, fetched before the weights (the
/// safetensors index among them says which weight files to fetch).
const SMALL: [&str; 14] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    INDEX,
];

const INDEX: &str = "model.safetensors.index.json";

/// Whether `s` reads as the `QUANT` of `org/name:QUANT` (`Q4_K_M`, `IQ4_XS`, `UD-Q4_K_XL`).
pub fn is_quant(s: &str) -> bool {
    (1..=32).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// What to fetch first from a repository listing `siblings`: the small files, or for
/// `org/name:QUANT` the one GGUF file of that quantisation.
pub fn first(siblings: &[String], id: &str, quant: Option<&str>) -> Result<Vec<String>, String> {
    if let Some(quant) = quant {
        return gguf_of(siblings.iter().map(String::as_str), quant).map(|f| vec![f.to_string()]);
    }
    if !siblings.iter().any(|s| s == "config.json") {
        let ggufs: Vec<&str> = siblings
            .iter()
            .map(String::as_str)
            .filter(|s| is_gguf(s))
            .collect();
        return Err(if ggufs.is_empty() {
            String::from("the repository has no config.json: not a checkpoint this server loads")
        } else {
            format!(
                "a GGUF repository: name one file's quantisation, as `{id}:Q4_K_M` (files: {})",
                shorten(&ggufs)
            )
        });
    }
    Ok(siblings
        .iter()
        .filter(|s| SMALL.contains(&s.as_str()) || is_module_config(s))
        .cloned()
        .collect())
}

/// The weight files to fetch once the small files are in `snapshot`, as the safetensors
/// loader picks them: the index's shards, else `model.safetensors`, else the only one.
pub fn weights(snapshot: &Path, siblings: &[String]) -> Result<Vec<String>, String> {
    let index = snapshot.join(INDEX);
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| format!("{INDEX}: {e}"))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{INDEX}: {e}"))?;
        let mut names: Vec<String> = json["weight_map"]
            .as_object()
            .map(|m| {
                m.values()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Err(format!("{INDEX} names no weight files"));
        }
        if let Some(odd) = names.iter().find(|n| !is_plain_relative(n)) {
            return Err(format!(
                "{INDEX} names {odd:?}, not a file in the repository"
            ));
        }
        return Ok(names);
    }
    if siblings.iter().any(|s| s == "model.safetensors") {
        return Ok(vec!["model.safetensors".into()]);
    }
    let found: Vec<&str> = siblings
        .iter()
        .map(String::as_str)
        .filter(|s| !s.contains('/') && s.ends_with(".safetensors"))
        .collect();
    match found.as_slice() {
        [one] => Ok(vec![one.to_string()]),
        [] => Err(String::from(
            "the repository has no safetensors weights (this server loads safetensors and GGUF)",
        )),
        _ => Err(format!(
            "several safetensors files ({}) and no {INDEX}",
            shorten(&found)
        )),
    }
}

/// The GGUF file of `quant` in a snapshot already in the cache.
pub fn cached_gguf(snapshot: &Path, quant: &str) -> Result<PathBuf, String> {
    let names: Vec<String> = std::fs::read_dir(snapshot)
        .map_err(|e| format!("{}: {e}", snapshot.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    gguf_of(names.iter().map(String::as_str), quant).map(|f| snapshot.join(f))
}

/// The one GGUF file whose name ends in `quant` (`Qwen3-0.6B-Q4_K_M.gguf` for `Q4_K_M`).
fn gguf_of<'a>(names: impl Iterator<Item = &'a str>, quant: &str) -> Result<&'a str, String> {
    let quant = quant.to_ascii_lowercase();
    let all: Vec<&str> = names
        .filter(|n| is_gguf(n) && is_plain_relative(n))
        .collect();
    let matching: Vec<&str> = all
        .iter()
        .copied()
        .filter(|name| {
            let stem = name[..name.len() - ".gguf".len()].to_ascii_lowercase();
            let base = stem.rsplit('/').next().unwrap_or(&stem);
            base == quant
                || base
                    .strip_suffix(&quant)
                    .is_some_and(|head| head.ends_with(['-', '.', '_']))
        })
        .collect();
    match matching.as_slice() {
        [one] => Ok(one),
        [] if all.is_empty() => Err(format!("no GGUF file of quantisation {quant}")),
        [] => Err(format!(
            "no GGUF file of quantisation {quant} (there are: {})",
            shorten(&all)
        )),
        several => Err(format!(
            "several GGUF files of quantisation {quant} ({}): a single-file GGUF is needed",
            shorten(several)
        )),
    }
}

fn is_gguf(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with(".gguf")
}

/// A sentence-transformers module's config (`1_Pooling/config.json`).
fn is_module_config(name: &str) -> bool {
    name.split_once('/').is_some_and(|(dir, file)| {
        file == "config.json"
            && dir
                .split_once('_')
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// A path inside the repository: no `..`, not absolute.
fn is_plain_relative(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && name.split('/').all(|part| !part.is_empty() && part != "..")
}

/// The first few names, then how many more.
fn shorten(names: &[&str]) -> String {
    const SHOWN: usize = 6;
    let mut text = names
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_what_the_loaders_read_is_fetched() {
        let siblings = list(&[
            ".gitattributes",
            "README.md",
            "config.json",
            "tokenizer.json",
            "pytorch_model.bin",
            "onnx/model.onnx",
            "1_Pooling/config.json",
            "2_Dense/config.json",
            "docs/config.json",
            "model.safetensors",
            "consolidated.safetensors",
        ]);
        let first = first(&siblings, "org/m", None).unwrap_or_default();
        assert_eq!(
            first,
            [
                "config.json",
                "tokenizer.json",
                "1_Pooling/config.json",
                "2_Dense/config.json"
            ]
        );
        let dir = std::env::temp_dir();
        assert_eq!(
            weights(&dir.join("no-such-snapshot"), &siblings).unwrap_or_default(),
            ["model.safetensors"]
        );
        let two = list(&["config.json", "a.safetensors", "b.safetensors"]);
        assert!(weights(&dir.join("no-such-snapshot"), &two)
            .is_err_and(|e| e.contains("several safetensors")));
    }

    #[test]
    fn a_gguf_repository_needs_a_quantisation_that_names_one_file() {
        let siblings = list(&[
            "README.md",
            "Qwen3-0.6B-Q4_K_M.gguf",
            "Qwen3-0.6B-Q4_K_S.gguf",
            "Qwen3-0.6B-UD-Q4_K_XL.gguf",
            "Qwen3-0.6B-BF16.gguf",
        ]);
        let err = first(&siblings, "unsloth/Qwen3-0.6B-GGUF", None).unwrap_err();
        assert!(err.contains("`unsloth/Qwen3-0.6B-GGUF:Q4_K_M`"), "{err}");
        assert_eq!(
            first(&siblings, "x/y", Some("q4_k_m")).unwrap_or_default(),
            ["Qwen3-0.6B-Q4_K_M.gguf"]
        );
        assert_eq!(
            first(&siblings, "x/y", Some("UD-Q4_K_XL")).unwrap_or_default(),
            ["Qwen3-0.6B-UD-Q4_K_XL.gguf"]
        );
        assert!(first(&siblings, "x/y", Some("Q8_0")).is_err_and(|e| e.contains("there are")));
        // A name that would leave the snapshot is never a candidate.
        let odd = list(&["../../x-Q8_0.gguf"]);
        assert!(first(&odd, "x/y", Some("Q8_0")).is_err());
        assert!(is_quant("Q4_K_M") && !is_quant("") && !is_quant("../x"));
    }
}
