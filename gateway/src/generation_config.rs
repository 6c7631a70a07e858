//! `--generation-config auto|vllm|FOLDER` and `--override-generation-config JSON`, as vLLM 0.31
//! reads them: the defaults of a model's requests.
//!
//! * `auto` (the default): the sampling fields of the model's own `generation_config.json`
//!   (for a GGUF file, its `general.sampling.*` metadata) are the defaults a request's fields
//!   override, and its `max_new_tokens` is the `max_tokens` of a request that gives none;
//! * `vllm`: vLLM's own defaults, the file is not read;
//! * a folder: that folder's `generation_config.json`, whose `max_new_tokens` also caps every
//!   request's `max_tokens`;
//! * `--override-generation-config` is merged on top in every mode; under `auto` and `vllm` its
//!   `max_new_tokens` is a cap too.
//!
//! Only the fields vLLM takes are read: `temperature`, `top_p`, `top_k`, `min_p`,
//! `repetition_penalty` and `max_new_tokens`. A value a request could not carry either (a
//! `top_p` of 2) stops the start naming the file and the field.
//!
//! The file's `eos_token_id` (one id or a list) is a stop token of every request that does not
//! set `ignore_eos`, in every mode, `vllm` included, as vLLM adds it to each request's
//! `stop_token_ids` (the override does not change it: vLLM reads it from the file alone).

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// Where the defaults come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Auto,
    Vllm,
    Folder(PathBuf),
}

impl Source {
    /// `--generation-config`'s value.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(Self::Auto),
            "vllm" => Ok(Self::Vllm),
            folder => {
                let path = PathBuf::from(folder);
                if path.join(FILE).is_file() {
                    Ok(Self::Folder(path))
                } else {
                    Err(format!(
                        "--generation-config {folder}: not `auto` or `vllm`, and no folder with a {FILE} there"
                    ))
                }
            }
        }
    }
}

const FILE: &str = "generation_config.json";

/// A GGUF's sampling keys and the `generation_config.json` names they stand for.
const GGUF_KEYS: [(&str, &str); 5] = [
    ("general.sampling.temp", "temperature"),
    ("general.sampling.top_p", "top_p"),
    ("general.sampling.top_k", "top_k"),
    ("general.sampling.min_p", "min_p"),
    ("general.sampling.penalty_repeat", "repetition_penalty"),
];

/// The defaults of one model's generation requests. `None`: vLLM's own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    /// The `max_tokens` of a request that gives none (still fitted to the context).
    pub max_tokens: Option<u64>,
    /// The most `max_tokens` any request gets.
    pub max_tokens_cap: Option<u64>,
    /// The file's `eos_token_id`s: stop tokens unless a request sets `ignore_eos`.
    pub stop_token_ids: Vec<u32>,
}

impl fmt::Display for GenerationDefaults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fields = [
            ("temperature", self.temperature.map(|v| v.to_string())),
            ("top_p", self.top_p.map(|v| v.to_string())),
            ("top_k", self.top_k.map(|v| v.to_string())),
            ("min_p", self.min_p.map(|v| v.to_string())),
            (
                "repetition_penalty",
                self.repetition_penalty.map(|v| v.to_string()),
            ),
            ("max_tokens", self.max_tokens.map(|v| v.to_string())),
            ("max_tokens_cap", self.max_tokens_cap.map(|v| v.to_string())),
        ];
        let set: Vec<String> = fields
            .into_iter()
            .filter_map(|(name, value)| value.map(|v| format!("{name}={v}")))
            .collect();
        if set.is_empty() {
            f.write_str("vLLM's own")
        } else {
            f.write_str(&set.join(" "))
        }
    }
}

/// The defaults of the model at `model_path` (an HF folder or a GGUF file, as resolved).
pub fn defaults_for(
    source: &Source,
    overrides: &Map<String, Value>,
    model_path: &Path,
) -> Result<GenerationDefaults, String> {
    // The file vLLM reads under every mode: the folder's, else the model's own.
    let file = match source {
        Source::Folder(dir) => Some(dir.join(FILE)),
        Source::Auto | Source::Vllm => Some(model_path.join(FILE)).filter(|f| f.is_file()),
    };
    let file_config = file
        .as_deref()
        .map(read_file)
        .transpose()?
        .unwrap_or_default();
    let file_origin = file.map(|f| f.display().to_string()).unwrap_or_default();
    let stop_token_ids = eos_token_ids(&file_config, &file_origin)?;
    let (mut config, origin) = match source {
        Source::Vllm => (Map::new(), String::from("--generation-config vllm")),
        Source::Auto if !model_path.is_dir() => {
            (gguf_sampling(model_path)?, model_path.display().to_string())
        }
        Source::Folder(_) | Source::Auto => (file_config, file_origin),
    };
    config.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
    let field = |name: &str| -> Option<(&Value, String)> {
        let value = config.get(name).filter(|v| !v.is_null())?;
        let whence = if overrides.contains_key(name) {
            String::from("--override-generation-config")
        } else {
            origin.clone()
        };
        Some((value, whence))
    };
    let float = |name: &str, ok: fn(f64) -> bool, range: &str| -> Result<Option<f64>, String> {
        let Some((value, whence)) = field(name) else {
            return Ok(None);
        };
        match value.as_f64() {
            Some(v) if ok(v) => Ok(Some(v)),
            _ => Err(format!(
                "{whence}: {name} must be a number in {range}, got {value}"
            )),
        }
    };
    let int = |name: &str, ok: fn(i64) -> bool, range: &str| -> Result<Option<i64>, String> {
        let Some((value, whence)) = field(name) else {
            return Ok(None);
        };
        match value.as_i64() {
            Some(v) if ok(v) => Ok(Some(v)),
            _ => Err(format!("{whence}: {name} must be {range}, got {value}")),
        }
    };
    let max_new_tokens =
        int("max_new_tokens", |v| v >= 1, "a whole number of at least 1")?.map(|v| v as u64);
    let override_cap = overrides
        .get("max_new_tokens")
        .filter(|v| !v.is_null())
        .and(max_new_tokens);
    Ok(GenerationDefaults {
        temperature: float("temperature", |v| (0.0..=2.0).contains(&v), "[0, 2]")?,
        top_p: float("top_p", |v| v > 0.0 && v <= 1.0, "(0, 1]")?,
        top_k: int("top_k", |v| v >= -1, "-1 (off), 0 (off) or a count")?,
        min_p: float("min_p", |v| (0.0..=1.0).contains(&v), "[0, 1]")?,
        repetition_penalty: float("repetition_penalty", |v| v > 0.0, "(0, inf)")?,
        max_tokens: max_new_tokens,
        max_tokens_cap: match source {
            Source::Folder(_) => max_new_tokens,
            Source::Auto | Source::Vllm => override_cap,
        },
        stop_token_ids,
    })
}

/// `eos_token_id` of a generation config: absent, null, one id or a list of ids.
fn eos_token_ids(config: &Map<String, Value>, origin: &str) -> Result<Vec<u32>, String> {
    let id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    let bad =
        |v: &Value| format!("{origin}: eos_token_id must be a token id or a list of them, got {v}");
    match config.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list.iter().map(|v| id(v).ok_or_else(|| bad(v))).collect(),
        Some(v) => id(v).map(|i| vec![i]).ok_or_else(|| bad(v)),
    }
}

fn read_file(path: &Path) -> Result<Map<String, Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(format!("{}: not a JSON object", path.display())),
        Err(e) => Err(format!("{}: not valid JSON: {e}", path.display())),
    }
}

/// A GGUF file's `general.sampling.*` metadata under `generation_config.json`'s names.
fn gguf_sampling(path: &Path) -> Result<Map<String, Value>, String> {
    if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
        return Ok(Map::new());
    }
    let gguf = engine::gguf::GgufFile::open(path).map_err(|e| e.to_string())?;
    let mut config = Map::new();
    for (key, name) in GGUF_KEYS {
        let Some(value) = gguf.get(key) else { continue };
        let json = match value.as_i64() {
            Some(i) => Value::from(i),
            None => value
                .as_f64()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .ok_or_else(|| format!("{}: {key} is not a number", path.display()))?,
        };
        config.insert(name.to_string(), json);
    }
    Ok(config)
}

/// `--override-generation-config`'s JSON object (empty without it).
pub fn overrides(text: Option<&str>) -> Result<Map<String, Value>, String> {
    let Some(text) = text else {
        return Ok(Map::new());
    };
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(format!(
            "--override-generation-config must be a JSON object, got: {text}"
        )),
        Err(e) => Err(format!(
            "--override-generation-config is not valid JSON ({e}): {text}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn folder(config: Value) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().to_path_buf();
        std::fs::write(path.join(FILE), config.to_string()).unwrap_or_else(|e| panic!("{e}"));
        (dir, path)
    }

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn auto_reads_the_models_file_and_the_override_merges_on_top() {
        let (_dir, model) = folder(json!({"temperature": 0.6, "top_p": 0.9, "top_k": 20,
            "max_new_tokens": 64, "do_sample": true, "eos_token_id": 2}));
        let d = defaults_for(&Source::Auto, &Map::new(), &model).unwrap_or_default();
        assert_eq!(d.temperature, Some(0.6));
        assert_eq!(d.top_k, Some(20));
        assert_eq!(d.max_tokens, Some(64));
        assert_eq!(d.max_tokens_cap, None);
        let over = map(json!({"temperature": 0, "max_new_tokens": 8}));
        let d = defaults_for(&Source::Auto, &over, &model).unwrap_or_default();
        assert_eq!((d.temperature, d.top_p), (Some(0.0), Some(0.9)));
        assert_eq!((d.max_tokens, d.max_tokens_cap), (Some(8), Some(8)));
        let d = defaults_for(&Source::Vllm, &Map::new(), &model).unwrap_or_default();
        assert_eq!(
            d,
            GenerationDefaults {
                stop_token_ids: vec![2],
                ..GenerationDefaults::default()
            }
        );
        assert_eq!(d.to_string(), "vLLM's own");
    }

    #[test]
    fn the_files_eos_token_ids_are_stop_tokens_in_every_mode() {
        let (_dir, model) = folder(json!({"eos_token_id": [7, 9], "temperature": 0.5}));
        for source in [Source::Auto, Source::Vllm] {
            let d = defaults_for(&source, &Map::new(), &model).unwrap_or_default();
            assert_eq!(d.stop_token_ids, [7, 9], "{source:?}");
        }
        let (_other, other) = folder(json!({"eos_token_id": 4}));
        let d = defaults_for(&Source::Folder(other), &Map::new(), &model).unwrap_or_default();
        assert_eq!(d.stop_token_ids, [4], "a folder's file, not the model's");
        let over = map(json!({"eos_token_id": 5}));
        let d = defaults_for(&Source::Auto, &over, &model).unwrap_or_default();
        assert_eq!(
            d.stop_token_ids,
            [7, 9],
            "the override does not change them"
        );
        let (_bad, bad) = folder(json!({"eos_token_id": "x"}));
        let err = defaults_for(&Source::Vllm, &Map::new(), &bad).err();
        assert!(err.is_some_and(|e| e.contains("eos_token_id")));
    }

    #[test]
    fn a_folder_caps_max_tokens_and_bad_values_are_named() {
        let (_dir, dir) = folder(json!({"max_new_tokens": 4}));
        let source = Source::parse(&dir.display().to_string()).unwrap_or(Source::Vllm);
        let d = defaults_for(&source, &Map::new(), Path::new("unused")).unwrap_or_default();
        assert_eq!((d.max_tokens, d.max_tokens_cap), (Some(4), Some(4)));
        assert!(Source::parse("/nonexistent").is_err());
        let (_bad, model) = folder(json!({"top_p": 1.5}));
        let err = defaults_for(&Source::Auto, &Map::new(), &model).err();
        assert!(err.is_some_and(|e| e.contains("top_p") && e.contains(FILE)));
        let over = map(json!({"temperature": "hot"}));
        let err = defaults_for(&Source::Vllm, &over, &model).err();
        assert!(err.is_some_and(|e| e.starts_with("--override-generation-config: temperature")));
    }
}
