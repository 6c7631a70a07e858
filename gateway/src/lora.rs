//! The LoRA flags (`--enable-lora`, `--lora-modules`, `--max-loras`, `--max-lora-rank`,
//! `--max-cpu-loras`) checked into the engine's [`LoraConfig`], as vLLM reads them, and the
//! switch of the runtime adapter routes (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`).

use engine::lora::{LoraConfig, LoraModule, LoraSettings};
use serde::Deserialize;

use crate::cli::ServeArgs;

/// The ranks vLLM's `--max-lora-rank` accepts.
const RANKS: &[usize] = &[1, 8, 16, 32, 64, 128, 256, 320, 512];

/// The environment variable that serves `/v1/load_lora_adapter` and
/// `/v1/unload_lora_adapter`.
pub const RUNTIME_UPDATING: &str = "VLLM_ALLOW_RUNTIME_LORA_UPDATING";

/// Whether the runtime adapter routes are served: the variable is `1` or `true` (any case,
/// surrounding spaces ignored), as vLLM parses it.
pub fn runtime_updating(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"))
}

/// The JSON form of a `--lora-modules` value.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModuleJson {
    name: String,
    path: String,
    #[serde(default)]
    base_model_name: Option<String>,
    /// vLLM's flag for MoE adapters with fused 3-D expert tensors: no model here has experts.
    #[serde(default)]
    is_3d_lora_weight: bool,
}

/// One `--lora-modules` value: `name=path`, or the JSON object (vLLM's `LoRAParserAction`:
/// a value with `=` and no `,` is the short form).
fn module(value: &str) -> Result<LoraModule, String> {
    if let (Some((name, path)), false) = (value.split_once('='), value.contains(',')) {
        if name.is_empty() || path.is_empty() || path.contains('=') {
            return Err(format!(
                "--lora-modules {value}: expected name=path or a JSON object"
            ));
        }
        return Ok(LoraModule {
            name: name.to_string(),
            path: path.to_string(),
            base_model_name: None,
        });
    }
    let m: ModuleJson = serde_json::from_str(value).map_err(|e| {
        format!("--lora-modules {value}: not name=path, nor a JSON object with name, path and base_model_name ({e})")
    })?;
    if m.is_3d_lora_weight {
        return Err(format!(
            "--lora-modules {value}: is_3d_lora_weight: no served model has MoE experts, so no adapter here has fused 3-D expert weights"
        ));
    }
    Ok(LoraModule {
        name: m.name,
        path: m.path,
        base_model_name: m.base_model_name,
    })
}

/// The LoRA settings of `args`: `None` without `--enable-lora`.
pub fn config(args: &ServeArgs) -> Result<Option<LoraConfig>, String> {
    let modules: Vec<&String> = args.lora_modules.iter().filter(|v| !v.is_empty()).collect();
    if !args.enable_lora {
        if !modules.is_empty() {
            return Err("--lora-modules needs --enable-lora".into());
        }
        return Ok(None);
    }
    if args.max_loras == 0 {
        return Err("--max-loras must be at least 1".into());
    }
    if !RANKS.contains(&args.max_lora_rank) {
        return Err(format!(
            "--max-lora-rank {} is not one of {}",
            args.max_lora_rank,
            RANKS
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let max_cpu_loras = args.max_cpu_loras.unwrap_or(args.max_loras);
    if max_cpu_loras < args.max_loras {
        return Err(format!(
            "--max-cpu-loras ({max_cpu_loras}) must be >= --max-loras ({})",
            args.max_loras
        ));
    }
    let modules = modules
        .into_iter()
        .map(|v| module(v))
        .collect::<Result<Vec<_>, _>>()?;
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = modules.iter().find(|m| !seen.insert(&m.name)) {
        return Err(format!(
            "--lora-modules names the adapter {} twice",
            dup.name
        ));
    }
    Ok(Some(LoraConfig {
        settings: LoraSettings {
            max_loras: args.max_loras,
            max_lora_rank: args.max_lora_rank,
            max_cpu_loras,
        },
        modules,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_json_forms() {
        let m = module("sql=/adapters/sql").expect("short");
        assert_eq!((m.name.as_str(), m.path.as_str()), ("sql", "/adapters/sql"));
        let m = module(r#"{"name": "a", "path": "/p", "base_model_name": "base"}"#).expect("json");
        assert_eq!(m.base_model_name.as_deref(), Some("base"));
        assert!(module("nothing").is_err());
        assert!(module("=x").is_err());
        assert!(module(r#"{"name": "a"}"#).is_err());
        assert!(module(r#"{"name": "a", "path": "p", "rank": 3}"#).is_err());
        assert!(module(r#"{"name": "a", "path": "p", "is_3d_lora_weight": false}"#).is_ok());
        let e = module(r#"{"name": "a", "path": "p", "is_3d_lora_weight": true}"#).err();
        assert!(e.unwrap_or_default().contains("is_3d_lora_weight"));
    }

    #[test]
    fn the_variable_is_read_as_vllm_reads_it() {
        for on in ["1", "true", "TRUE", " True "] {
            assert!(runtime_updating(Some(on)), "{on}");
        }
        for off in ["0", "false", "yes", ""] {
            assert!(!runtime_updating(Some(off)), "{off}");
        }
        assert!(!runtime_updating(None));
    }
}
