//! An adapter's factors, read from `adapter_model.safetensors` and fitted to the base: each
//! `...layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight` pair becomes the `A` (`r × in`)
//! and `Bᵀ` (`r × out`, so a row's delta is `r` contiguous axpys) of one projection. Phi-3's
//! fused `qkv_proj` and `gate_up_proj` are split by `B`'s rows into the projections the
//! engine runs, each keeping the shared `A`.

use std::collections::BTreeMap;
use std::path::Path;

use super::config::{module_leaf, AdapterConfig};
use super::{LoraTargets, Proj};

/// The file PEFT saves the factors in.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
pub const CONFIG_FILE: &str = "adapter_config.json";

/// A factor as read: its shape and values.
type Factor = (Vec<usize>, Vec<f32>);

/// One projection's factors.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPair {
    /// `r × in`, row-major.
    pub a: Vec<f32>,
    /// `Bᵀ`: `r × out`, row-major.
    pub bt: Vec<f32>,
}

/// A loaded adapter: its name and path (the prefix-cache key), rank, scale and factors.
#[derive(Debug)]
pub struct LoraAdapter {
    pub name: String,
    pub path: String,
    pub rank: usize,
    pub scale: f32,
    /// Per layer, per [`Proj`], the factors where the adapter targets it.
    layers: Vec<[Option<LoraPair>; 7]>,
}

impl LoraAdapter {
    /// The factors of `proj` in layer `layer`, if the adapter targets it.
    pub fn pair(&self, layer: usize, proj: Proj) -> Option<&LoraPair> {
        self.layers.get(layer)?[proj.index()].as_ref()
    }

    /// How many projections (over all layers) the adapter changes.
    pub fn targeted(&self) -> usize {
        self.layers.iter().flatten().flatten().count()
    }

    /// Bytes of the factors in memory.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .flatten()
            .map(|p| 4 * (p.a.len() + p.bt.len()))
            .sum()
    }

    /// Reads the PEFT folder `path` and fits it to `targets`; the error is the reason (the
    /// caller names the adapter).
    pub fn read(
        name: &str,
        path: &Path,
        targets: &LoraTargets,
        max_rank: usize,
    ) -> Result<Self, String> {
        if !path.is_dir() {
            return Err("no such directory".into());
        }
        let config_path = path.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&config_path)
            .map_err(|e| format!("cannot read {CONFIG_FILE}: {e}"))?;
        let config = AdapterConfig::parse(&text)?;
        if config.r > max_rank {
            return Err(format!(
                "its rank r = {} is over --max-lora-rank {max_rank}",
                config.r
            ));
        }
        let bytes = read_weights(path)?;
        let weights = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| format!("{WEIGHTS_FILE} is not a safetensors file: {e}"))?;
        let mut factors: BTreeMap<(usize, String), [Option<Factor>; 2]> = BTreeMap::new();
        for (tensor, view) in weights.tensors() {
            let tensor = tensor.as_str();
            let (layer, module, which) = parse_name(tensor)?;
            if !config
                .target_modules
                .iter()
                .any(|m| module_leaf(m) == module)
            {
                return Err(format!(
                    "tensor {tensor} targets {module}, which target_modules does not list"
                ));
            }
            let data = to_f32(&view).map_err(|e| format!("tensor {tensor}: {e}"))?;
            factors.entry((layer, module.to_string())).or_default()[which] =
                Some((view.shape().to_vec(), data));
        }
        if factors.is_empty() {
            return Err(format!("{WEIGHTS_FILE} holds no LoRA factors"));
        }
        let mut layers: Vec<[Option<LoraPair>; 7]> =
            (0..targets.n_layers).map(|_| Default::default()).collect();
        for ((layer, module), [a, b]) in factors {
            let what = format!("layer {layer} {module}");
            let (Some((a_shape, a)), Some((b_shape, b))) = (a, b) else {
                return Err(format!("{what} has only one of lora_A and lora_B"));
            };
            let slot = layers
                .get_mut(layer)
                .ok_or_else(|| format!("{what}: the base model has {} layers", targets.n_layers))?;
            let parts = split(&module, targets)?;
            let in_dim = targets.dims(parts[0].0).0;
            let out_total = parts.last().map_or(0, |(_, rows)| rows.end);
            if a_shape != [config.r, in_dim] || b_shape != [out_total, config.r] {
                return Err(format!(
                    "{what}: lora_A is {a_shape:?} and lora_B {b_shape:?}, but rank {r} on this base needs [{r}, {in_dim}] and [{out_total}, {r}]",
                    r = config.r
                ));
            }
            for (proj, rows) in parts {
                let out_dim = targets.dims(proj).1;
                let mut bt = vec![0f32; config.r * out_dim];
                for (o, row) in rows.clone().enumerate() {
                    let dst = permuted_row(proj, o, targets);
                    for k in 0..config.r {
                        bt[k * out_dim + dst] = b[row * config.r + k];
                    }
                }
                slot[proj.index()] = Some(LoraPair { a: a.clone(), bt });
            }
        }
        Ok(LoraAdapter {
            name: name.to_string(),
            path: path.display().to_string(),
            rank: config.r,
            scale: config.scale(),
            layers,
        })
    }
}

/// The adapter's weights file (adapters are small: read whole, not mapped).
fn read_weights(dir: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(dir.join(WEIGHTS_FILE)).map_err(|e| {
        if dir.join("adapter_model.bin").is_file() {
            format!("no {WEIGHTS_FILE} (only adapter_model.bin, a pickle, which is not read)")
        } else {
            format!("cannot read {WEIGHTS_FILE}: {e}")
        }
    })
}

/// A float tensor's values as f32.
fn to_f32(view: &safetensors::tensor::TensorView<'_>) -> Result<Vec<f32>, String> {
    use safetensors::Dtype;
    let data = view.data();
    let values = match view.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(format!(
                "type {other:?} is not a float type (F32, F16, BF16)"
            ))
        }
    };
    Ok(values)
}

/// `(layer, module, 0 for A / 1 for B)` of a PEFT tensor name such as
/// `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`.
fn parse_name(name: &str) -> Result<(usize, &str, usize), String> {
    let unsupported = || {
        format!("tensor {name} is not a LoRA factor of a q/k/v/o or gate/up/down projection of a decoder layer")
    };
    let stem = name.strip_suffix(".weight").ok_or_else(unsupported)?;
    let (module_path, which) = if let Some(m) = stem.strip_suffix(".lora_A") {
        (m, 0)
    } else if let Some(m) = stem.strip_suffix(".lora_B") {
        (m, 1)
    } else {
        return Err(unsupported());
    };
    let parts: Vec<&str> = module_path.split('.').collect();
    let at = parts
        .windows(2)
        .rposition(|w| w[0] == "layers" && w[1].parse::<usize>().is_ok())
        .ok_or_else(unsupported)?;
    let layer = parts[at + 1].parse::<usize>().map_err(|_| unsupported())?;
    let rest = &parts[at + 2..];
    let module = match rest {
        ["self_attn", m] | ["mlp", m] => *m,
        _ => return Err(unsupported()),
    };
    if parts[..at]
        .iter()
        .any(|p| p.contains("vision") || p.contains("visual") || p.contains("audio"))
    {
        return Err(format!(
            "tensor {name} targets a media encoder; only the language model's layers take adapters"
        ));
    }
    Ok((layer, module, which))
}

/// The projections a module's `B` rows feed, with the rows of `B` each takes.
fn split(module: &str, t: &LoraTargets) -> Result<Vec<(Proj, std::ops::Range<usize>)>, String> {
    let (q, kv, ffn) = (t.n_heads * t.head_dim, t.n_kv_heads * t.head_dim, t.ffn);
    let one = |p: Proj| {
        let out = t.dims(p).1;
        vec![(p, 0..out)]
    };
    Ok(match module {
        "q_proj" => one(Proj::Q),
        "k_proj" => one(Proj::K),
        "v_proj" => one(Proj::V),
        "o_proj" => one(Proj::O),
        "gate_proj" => one(Proj::Gate),
        "up_proj" => one(Proj::Up),
        "down_proj" => one(Proj::Down),
        "qkv_proj" => vec![
            (Proj::Q, 0..q),
            (Proj::K, q..q + kv),
            (Proj::V, q + kv..q + 2 * kv),
        ],
        "gate_up_proj" => vec![(Proj::Gate, 0..ffn), (Proj::Up, ffn..2 * ffn)],
        other => {
            return Err(format!(
                "module {other} is not a projection this engine runs"
            ))
        }
    })
}

/// Where output row `o` of `proj` lives in the base's stored weights: llama.cpp's converter
/// permutes each Llama Q/K head's rows from halves `[x0..x(d/2), y0..]` to adjacent pairs
/// `[x0, y0, x1, y1, ...]`.
fn permuted_row(proj: Proj, o: usize, t: &LoraTargets) -> usize {
    if !t.qk_permuted || !matches!(proj, Proj::Q | Proj::K) {
        return o;
    }
    let d = t.head_dim;
    let (head, within) = (o / d, o % d);
    let half = d / 2;
    let (j, i) = (within / half, within % half);
    head * d + 2 * i + j
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> LoraTargets {
        crate::lora::tests::tiny_llama_targets()
    }

    #[test]
    fn peft_names_give_layer_module_and_factor() {
        assert_eq!(
            parse_name("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"),
            Ok((3, "q_proj", 0))
        );
        assert_eq!(
            parse_name("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"),
            Ok((0, "down_proj", 1))
        );
        assert!(parse_name("base_model.model.lm_head.lora_A.weight").is_err());
        assert!(parse_name("base_model.model.model.embed_tokens.lora_embedding_A").is_err());
        assert!(parse_name(
            "base_model.model.model.visual.blocks.layers.0.mlp.up_proj.lora_A.weight"
        )
        .is_err_and(|e| e.contains("media encoder")));
    }

    #[test]
    fn fused_modules_split_by_rows() {
        let t = targets();
        let qkv = split("qkv_proj", &t).expect("known");
        assert_eq!(
            qkv,
            vec![(Proj::Q, 0..64), (Proj::K, 64..96), (Proj::V, 96..128)]
        );
        let gu = split("gate_up_proj", &t).expect("known");
        assert_eq!(gu, vec![(Proj::Gate, 0..160), (Proj::Up, 160..320)]);
        assert!(split("c_attn", &t).is_err());
    }

    #[test]
    fn gguf_llama_rows_are_permuted_as_the_converter_does() {
        let mut t = targets();
        t.qk_permuted = true;
        // Head 1, first half row 3 -> pair 3, first slot; second half row 3 -> second slot.
        assert_eq!(permuted_row(Proj::Q, 16 + 3, &t), 16 + 6);
        assert_eq!(permuted_row(Proj::K, 16 + 8 + 3, &t), 16 + 7);
        assert_eq!(permuted_row(Proj::V, 19, &t), 19);
        let mut seen: Vec<usize> = (0..64).map(|o| permuted_row(Proj::Q, o, &t)).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..64).collect::<Vec<_>>(), "a permutation");
    }
}
