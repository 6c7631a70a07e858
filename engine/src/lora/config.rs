//! `adapter_config.json` as PEFT writes it, read into what this engine runs: the rank, the
//! scale and the modules targeted. Everything that would change the numbers in a way not built
//! here (DoRA, another PEFT type, per-module ranks, trained biases, extra saved modules) is
//! refused, naming the field.

use serde_json::Value;

/// The modules an adapter may target: the Llama-shaped projections, and Phi-3's fused ones.
pub const SUPPORTED_MODULES: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "qkv_proj",
    "gate_up_proj",
];

/// The fields of `adapter_config.json` this engine acts on, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterConfig {
    pub r: usize,
    pub lora_alpha: f64,
    pub use_rslora: bool,
    /// The modules named (PEFT's `all-linear` becomes every supported module).
    pub target_modules: Vec<String>,
}

impl AdapterConfig {
    /// Parses and checks the file's text; the error is the reason, naming the field.
    pub fn parse(text: &str) -> Result<Self, String> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| format!("adapter_config.json is not valid JSON: {e}"))?;
        let obj = v
            .as_object()
            .ok_or("adapter_config.json is not a JSON object")?;
        match obj.get("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            Some(other) => {
                return Err(format!(
                    "peft_type {other} is not supported (only LORA adapters are served)"
                ))
            }
            None => return Err("adapter_config.json has no peft_type (LORA expected)".into()),
        }
        if obj.get("use_dora").and_then(Value::as_bool) == Some(true) {
            return Err("use_dora: DoRA adapters are not supported".into());
        }
        let r = obj
            .get("r")
            .and_then(Value::as_u64)
            .filter(|&r| r > 0)
            .ok_or("r must be a positive integer")? as usize;
        let lora_alpha = obj
            .get("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or("lora_alpha must be a number")?;
        let use_rslora = obj
            .get("use_rslora")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        for field in ["rank_pattern", "alpha_pattern"] {
            if obj
                .get(field)
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty())
            {
                return Err(format!(
                    "{field}: per-module ranks and alphas are not supported"
                ));
            }
        }
        if let Some(bias) = obj.get("bias").and_then(Value::as_str) {
            if bias != "none" {
                return Err(format!("bias {bias}: trained biases are not supported"));
            }
        }
        if obj.get("lora_bias").and_then(Value::as_bool) == Some(true) {
            return Err("lora_bias: trained biases are not supported".into());
        }
        if obj
            .get("modules_to_save")
            .and_then(Value::as_array)
            .is_some_and(|m| !m.is_empty())
        {
            return Err(
                "modules_to_save: adapters that replace whole modules are not supported".into(),
            );
        }
        let target_modules = match obj.get("target_modules") {
            Some(Value::String(s)) if s == "all-linear" => {
                SUPPORTED_MODULES.iter().map(|m| m.to_string()).collect()
            }
            Some(Value::String(s)) => {
                return Err(format!(
                    "target_modules {s:?}: a pattern is not supported; list the modules"
                ))
            }
            Some(Value::Array(items)) => items
                .iter()
                .map(|m| {
                    m.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| "target_modules must be a list of names".to_string())
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err("target_modules must be a list of module names".into()),
        };
        if target_modules.is_empty() {
            return Err("target_modules is empty".into());
        }
        if let Some(bad) = target_modules
            .iter()
            .find(|m| !SUPPORTED_MODULES.contains(&module_leaf(m)))
        {
            return Err(format!(
                "target module {bad} is not supported (supported: {})",
                SUPPORTED_MODULES.join(", ")
            ));
        }
        Ok(AdapterConfig {
            r,
            lora_alpha,
            use_rslora,
            target_modules,
        })
    }

    /// The factor the delta `B·A·x` is multiplied by: `alpha / r`, or `alpha / √r` with
    /// rsLoRA.
    pub fn scale(&self) -> f32 {
        let r = self.r as f64;
        let denom = if self.use_rslora { r.sqrt() } else { r };
        (self.lora_alpha / denom) as f32
    }
}

/// The last dotted part of a module name (`model.layers.0.self_attn.q_proj` -> `q_proj`).
pub fn module_leaf(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(extra: Value) -> String {
        let mut v = json!({
            "peft_type": "LORA",
            "r": 8,
            "lora_alpha": 16,
            "target_modules": ["q_proj", "v_proj"],
            "use_dora": false,
            "use_rslora": false,
            "bias": "none",
            "modules_to_save": null,
            "rank_pattern": {},
            "alpha_pattern": {},
        });
        if let (Some(base), Value::Object(more)) = (v.as_object_mut(), extra) {
            base.extend(more);
        }
        v.to_string()
    }

    fn refusal(extra: Value) -> String {
        match AdapterConfig::parse(&config(extra)) {
            Err(why) => why,
            Ok(c) => panic!("accepted: {c:?}"),
        }
    }

    #[test]
    fn reads_rank_alpha_and_modules() {
        let c = AdapterConfig::parse(&config(json!({}))).expect("valid");
        assert_eq!(c.r, 8);
        assert_eq!(c.target_modules, ["q_proj", "v_proj"]);
        assert_eq!(c.scale(), 2.0);
    }

    #[test]
    fn rslora_scales_by_the_square_root_of_the_rank() {
        let c = AdapterConfig::parse(&config(
            json!({"r": 16, "lora_alpha": 32, "use_rslora": true}),
        ))
        .expect("valid");
        assert_eq!(c.scale(), 8.0);
    }

    #[test]
    fn all_linear_targets_every_supported_module() {
        let c =
            AdapterConfig::parse(&config(json!({"target_modules": "all-linear"}))).expect("valid");
        assert_eq!(c.target_modules.len(), SUPPORTED_MODULES.len());
    }

    #[test]
    fn dora_and_other_peft_types_are_refused_by_name() {
        assert!(refusal(json!({"use_dora": true})).contains("DoRA"));
        let why = refusal(json!({"peft_type": "IA3"}));
        assert!(why.contains("peft_type IA3"), "{why}");
        assert!(refusal(json!({"peft_type": null})).contains("no peft_type"));
    }

    #[test]
    fn fields_that_change_the_numbers_unseen_are_refused() {
        assert!(refusal(json!({"r": 0})).contains("r must be"));
        assert!(refusal(json!({"lora_alpha": "x"})).contains("lora_alpha"));
        assert!(refusal(json!({"rank_pattern": {"q_proj": 4}})).contains("rank_pattern"));
        assert!(refusal(json!({"alpha_pattern": {"q_proj": 4}})).contains("alpha_pattern"));
        assert!(refusal(json!({"bias": "all"})).contains("bias all"));
        assert!(refusal(json!({"modules_to_save": ["lm_head"]})).contains("modules_to_save"));
        let why = refusal(json!({"target_modules": ["q_proj", "c_attn"]}));
        assert!(why.contains("target module c_attn"), "{why}");
        assert!(refusal(json!({"target_modules": ".*proj"})).contains("pattern"));
        assert!(refusal(json!({"target_modules": []})).contains("empty"));
        assert!(AdapterConfig::parse("[1]").is_err());
        assert!(AdapterConfig::parse("{").is_err());
    }

    #[test]
    fn dotted_module_names_are_judged_by_their_leaf() {
        let c = AdapterConfig::parse(&config(
            json!({"target_modules": ["model.layers.0.self_attn.q_proj"]}),
        ))
        .expect("valid");
        assert_eq!(module_leaf(&c.target_modules[0]), "q_proj");
    }
}
