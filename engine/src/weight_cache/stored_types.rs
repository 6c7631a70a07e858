//! The tensor types a checkpoint stores, each with its tensor count and bytes, read from the
//! headers only (a GGUF's tensor table, each safetensors file's JSON header): the cache
//! identity records the counts (its `quantization`), a served model's card the bytes.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::identity::safetensors_header;
use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::hf::SafetensorsWeights;
use crate::weight_summary::WeightSummary;

/// Per stored type (`Q4_1`, `BF16`): how many tensors, and their bytes.
pub(crate) type TypeTally = BTreeMap<String, (usize, u64)>;

fn add(tally: &mut TypeTally, ty: String, bytes: u64) {
    let entry = tally.entry(ty).or_default();
    entry.0 += 1;
    entry.1 += bytes;
}

/// Every tensor of a GGUF file.
pub(crate) fn of_gguf(g: &GgufFile) -> TypeTally {
    let mut tally = TypeTally::new();
    for t in g.tensors() {
        add(&mut tally, t.ggml_type.name(), t.len as u64);
    }
    tally
}

/// Every tensor of one safetensors header (`__metadata__` is not one).
pub(crate) fn add_safetensors_header(tally: &mut TypeTally, table: &BTreeMap<String, Value>) {
    for (tensor, entry) in table {
        if tensor == "__metadata__" {
            continue;
        }
        let ty = entry.get("dtype").and_then(Value::as_str).unwrap_or("?");
        let bytes = entry
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|o| Some(o.get(1)?.as_u64()?.saturating_sub(o.first()?.as_u64()?)))
            .unwrap_or(0);
        add(tally, ty.to_string(), bytes);
    }
}

/// A safetensors header's tensor table.
pub(crate) fn parse_header(path: &Path, header: &[u8]) -> Result<BTreeMap<String, Value>> {
    serde_json::from_slice(header).map_err(|e| {
        EngineError::load(
            path.display().to_string(),
            format!("corrupt safetensors header: {e}"),
        )
    })
}

/// The bytes per stored type of the checkpoint at `path`: a GGUF file (or a folder holding
/// one), or an HF folder's safetensors files.
pub fn of_checkpoint(path: &Path) -> Result<WeightSummary> {
    let tally = if path.is_file() {
        of_gguf(&GgufFile::open(path)?)
    } else if let Ok(names) = SafetensorsWeights::file_names(path) {
        let mut tally = TypeTally::new();
        for name in names {
            let file = path.join(&name);
            let (_, header) = safetensors_header(&file)?;
            add_safetensors_header(&mut tally, &parse_header(&file, &header)?);
        }
        tally
    } else {
        of_gguf(&GgufFile::open(&crate::gguf::single_gguf(path)?)?)
    };
    let mut summary = WeightSummary::default();
    for (ty, (_, bytes)) in tally {
        summary.add(ty, bytes);
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_counts_each_type_and_its_bytes() {
        let table: BTreeMap<String, Value> = serde_json::from_str(
            r#"{"__metadata__": {"format": "pt"},
                "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                "b": {"dtype": "F32", "shape": [3], "data_offsets": [4, 16]},
                "c": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}}"#,
        )
        .unwrap_or_default();
        let mut tally = TypeTally::new();
        add_safetensors_header(&mut tally, &table);
        assert_eq!(tally.get("BF16"), Some(&(2, 12)));
        assert_eq!(tally.get("F32"), Some(&(1, 12)));
        assert_eq!(tally.len(), 2);
    }

    /// An HF folder (an encoder's, say) is summed over all its safetensors files.
    #[test]
    fn a_folder_sums_every_safetensors_file() {
        let dir = std::env::temp_dir().join(format!("stored-types-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, header: &str, data: usize| {
            let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
            bytes.extend_from_slice(header.as_bytes());
            bytes.resize(bytes.len() + data, 0);
            std::fs::write(dir.join(name), bytes).unwrap();
        };
        write(
            "model-00001-of-00002.safetensors",
            r#"{"w": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 32]},
                "b": {"dtype": "F32", "shape": [4], "data_offsets": [32, 48]}}"#,
            48,
        );
        write(
            "model-00002-of-00002.safetensors",
            r#"{"__metadata__": {"format": "pt"},
                "e": {"dtype": "F16", "shape": [8, 4], "data_offsets": [0, 64]}}"#,
            64,
        );
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            r#"{"weight_map": {"w": "model-00001-of-00002.safetensors",
                "b": "model-00001-of-00002.safetensors",
                "e": "model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let summary = of_checkpoint(&dir).unwrap();
        assert_eq!(summary.by_size(), [("F16", 96), ("F32", 16)], "{summary}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
