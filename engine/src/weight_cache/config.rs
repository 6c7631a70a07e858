//! `--load-format` and `--model-loader-extra-config`: how a served model gets its weights.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;

/// `--load-format`: where the weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadFormat {
    /// Whatever the checkpoint is (GGUF file, or an HF folder's safetensors).
    #[default]
    Auto,
    Safetensors,
    Gguf,
    /// From a `gateway preload` daemon on this machine (see [`super`]).
    IpcCache,
}

impl FromStr for LoadFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(LoadFormat::Auto),
            "safetensors" => Ok(LoadFormat::Safetensors),
            "gguf" => Ok(LoadFormat::Gguf),
            "ipc_cache" => Ok(LoadFormat::IpcCache),
            _ => Err(format!(
                "unknown load format '{s}' (expected auto, safetensors, gguf or ipc_cache)"
            )),
        }
    }
}

impl fmt::Display for LoadFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LoadFormat::Auto => "auto",
            LoadFormat::Safetensors => "safetensors",
            LoadFormat::Gguf => "gguf",
            LoadFormat::IpcCache => "ipc_cache",
        })
    }
}

/// How an engine uses the daemon's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// Map the daemon's memory in place; the daemon must outlive the engine.
    #[default]
    ZeroCopy,
    /// Copy into the engine's own memory, then detach so the daemon may release.
    Copy,
}

impl CacheMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheMode::ZeroCopy => "zero_copy",
            CacheMode::Copy => "copy",
        }
    }
}

/// `--model-loader-extra-config` for `--load-format ipc_cache`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoaderConfig {
    pub mode: CacheMode,
    /// Load from disk (with one log line saying why) when the cache cannot serve.
    pub fallback: bool,
    /// The daemon's socket folder (default: [`super::protocol::default_socket_dir`]).
    pub socket_dir: Option<PathBuf>,
    /// How long one connection attempt may wait for the daemon's answer.
    pub connect_timeout: Duration,
    /// With `fallback: false`, how long to wait for an absent or still-loading daemon.
    pub state_timeout: Duration,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            mode: CacheMode::ZeroCopy,
            fallback: true,
            socket_dir: None,
            connect_timeout: Duration::from_secs(5),
            state_timeout: Duration::from_secs(300),
        }
    }
}

const KEYS: &str = "mode, fallback, socket_dir, connect_timeout_s, state_timeout_s";

impl LoaderConfig {
    /// Parses the flag's JSON object. Unknown keys and wrong types are errors naming the key,
    /// so a typo (`"fallbak": false`) cannot silently keep the default.
    pub fn parse(text: &str) -> Result<Self, String> {
        let flag = "--model-loader-extra-config";
        let obj = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(format!("{flag} must be a JSON object, got: {text}")),
            Err(e) => return Err(format!("{flag} is not valid JSON ({e}): {text}")),
        };
        let mut cfg = LoaderConfig::default();
        for (key, value) in &obj {
            let wrong =
                |expected: &str| format!("{flag}: key '{key}' must be {expected}, got {value}");
            match key.as_str() {
                "mode" => {
                    cfg.mode = match value.as_str() {
                        Some("zero_copy") => CacheMode::ZeroCopy,
                        Some("copy") => CacheMode::Copy,
                        _ => return Err(wrong("\"zero_copy\" or \"copy\"")),
                    }
                }
                "fallback" => cfg.fallback = value.as_bool().ok_or_else(|| wrong("a boolean"))?,
                "socket_dir" => {
                    cfg.socket_dir = Some(PathBuf::from(
                        value.as_str().ok_or_else(|| wrong("a string (a folder)"))?,
                    ))
                }
                "connect_timeout_s" | "state_timeout_s" => {
                    let secs = value
                        .as_f64()
                        .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 1e7)
                        .ok_or_else(|| wrong("a number of seconds (0 or more)"))?;
                    let d = Duration::from_secs_f64(secs);
                    if key == "connect_timeout_s" {
                        cfg.connect_timeout = d;
                    } else {
                        cfg.state_timeout = d;
                    }
                }
                other => {
                    return Err(format!(
                        "{flag}: unknown key '{other}' (known keys: {KEYS})"
                    ))
                }
            }
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key_and_keeps_defaults() {
        let c = LoaderConfig::parse(
            r#"{"mode":"copy","fallback":false,"socket_dir":"/s","connect_timeout_s":1.5,"state_timeout_s":2}"#,
        )
        .unwrap();
        assert_eq!(c.mode, CacheMode::Copy);
        assert!(!c.fallback);
        assert_eq!(c.socket_dir, Some(PathBuf::from("/s")));
        assert_eq!(c.connect_timeout, Duration::from_millis(1500));
        assert_eq!(c.state_timeout, Duration::from_secs(2));
        assert_eq!(LoaderConfig::parse("{}").unwrap(), LoaderConfig::default());
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_the_key() {
        let e = LoaderConfig::parse(r#"{"fallbak":false}"#).unwrap_err();
        assert!(e.contains("unknown key 'fallbak'"), "{e}");
        let e = LoaderConfig::parse(r#"{"fallback":"no"}"#).unwrap_err();
        assert!(e.contains("key 'fallback' must be a boolean"), "{e}");
        let e = LoaderConfig::parse(r#"{"state_timeout_s":-1}"#).unwrap_err();
        assert!(e.contains("'state_timeout_s'"), "{e}");
        let e = LoaderConfig::parse(r#"{"mode":"mmap"}"#).unwrap_err();
        assert!(e.contains("'mode'"), "{e}");
        assert!(LoaderConfig::parse("[1]")
            .unwrap_err()
            .contains("JSON object"));
    }

    #[test]
    fn load_formats_parse() {
        assert_eq!("ipc_cache".parse(), Ok(LoadFormat::IpcCache));
        assert_eq!("GGUF".parse(), Ok(LoadFormat::Gguf));
        assert!("pt".parse::<LoadFormat>().is_err());
    }
}
