//! Safetensors weights of an HF checkpoint folder: one `model.safetensors`, or shards listed
//! in `model.safetensors.index.json`. Files are memory-mapped (or their bytes come mapped from
//! the weight cache: [`SafetensorsWeights::from_maps`]); a tensor is converted to f32 when it
//! is asked for.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::tensor::{Dtype, TensorInfo};
use safetensors::SafeTensors;
use serde::Deserialize;

use crate::error::{EngineError, Result};

/// A tensor left in its file: which map ([`SafetensorsWeights::maps`]), its stored type and
/// shape, and its bytes' range in the map.
#[derive(Debug, Clone, PartialEq)]
pub struct RawTensor {
    pub file: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub start: usize,
    pub len: usize,
}

/// A tensor converted to f32, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct F32Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

struct WeightFile {
    /// File name relative to the checkpoint folder, for error messages.
    name: String,
    mmap: Arc<Mmap>,
    /// Bytes before the data section (8-byte length plus the JSON header).
    data_start: usize,
}

/// Where a tensor lives: which file and its header entry.
struct Entry {
    file: usize,
    info: TensorInfo,
}

/// All safetensors files of a checkpoint, with their headers parsed and validated.
pub struct SafetensorsWeights {
    files: Vec<WeightFile>,
    tensors: HashMap<String, Entry>,
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

impl std::fmt::Debug for SafetensorsWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsWeights")
            .field(
                "files",
                &self.files.iter().map(|w| &w.name).collect::<Vec<_>>(),
            )
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl SafetensorsWeights {
    /// Opens the weights in `dir`: the files [`SafetensorsWeights::file_names`] lists, each
    /// memory-mapped.
    pub fn open(dir: &Path) -> Result<Self> {
        let mut maps = Vec::new();
        for name in Self::file_names(dir)? {
            let path = dir.join(&name);
            let file =
                File::open(&path).map_err(|e| EngineError::load(display(&path), e.to_string()))?;
            // SAFETY: the map is read-only and private to this process. Like every mmap-based
            // loader we rely on the checkpoint file not being truncated or rewritten while it
            // is served; the header is validated against the mapped length in `from_maps`, so
            // a file that is corrupt from the start is an error rather than an out-of-bounds
            // read.
            let mmap = unsafe { Mmap::map(&file) }
                .map_err(|e| EngineError::load(display(&path), format!("cannot map: {e}")))?;
            maps.push((name, Arc::new(mmap)));
        }
        Self::from_maps(dir, maps)
    }

    /// The weight files of `dir`, relative to it: the shards of
    /// `model.safetensors.index.json` if present (sorted), else `model.safetensors`, else the
    /// only `*.safetensors` file in the folder.
    pub fn file_names(dir: &Path) -> Result<Vec<String>> {
        let index_path = dir.join("model.safetensors.index.json");
        if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|e| EngineError::load(display(&index_path), e.to_string()))?;
            let index: ShardIndex = serde_json::from_str(&text).map_err(|e| {
                EngineError::load(display(&index_path), format!("invalid index: {e}"))
            })?;
            let mut names: Vec<String> = index.weight_map.into_values().collect();
            names.sort();
            names.dedup();
            if names.is_empty() {
                return Err(EngineError::load(
                    display(&index_path),
                    "weight_map is empty",
                ));
            }
            return Ok(names);
        }
        if dir.join("model.safetensors").is_file() {
            return Ok(vec!["model.safetensors".to_string()]);
        }
        let found = list_safetensors(dir)?;
        match found.as_slice() {
            [one] => Ok(vec![one.clone()]),
            [] => Err(EngineError::load(
                display(dir),
                "no model.safetensors, model.safetensors.index.json or *.safetensors file",
            )),
            _ => Err(EngineError::load(
                display(dir),
                format!(
                    "several safetensors files ({}) but no model.safetensors.index.json",
                    found.join(", ")
                ),
            )),
        }
    }

    /// Weights of the folder `dir` from bytes already mapped (its files, or the weight cache's
    /// shared memory): one `(file name, map)` per file, in [`SafetensorsWeights::file_names`]
    /// order. Every header is parsed and checked against its map's length.
    pub fn from_maps(dir: &Path, maps: Vec<(String, Arc<Mmap>)>) -> Result<Self> {
        let mut files: Vec<WeightFile> = Vec::with_capacity(maps.len());
        let mut tensors = HashMap::new();
        for (name, mmap) in maps {
            let (header_len, metadata) = SafeTensors::read_metadata(&mmap[..]).map_err(|e| {
                EngineError::load(
                    display(&dir.join(&name)),
                    format!("corrupt safetensors file: {e}"),
                )
            })?;
            let file_idx = files.len();
            for (tensor, info) in metadata.tensors() {
                if let Some(prev) = tensors.insert(
                    tensor.clone(),
                    Entry {
                        file: file_idx,
                        info: info.clone(),
                    },
                ) {
                    return Err(EngineError::load(
                        display(&dir.join(&name)),
                        format!("tensor `{tensor}` is also in {}", files[prev.file].name),
                    ));
                }
            }
            files.push(WeightFile {
                name,
                mmap,
                data_start: 8 + header_len,
            });
        }
        tracing::debug!(
            files = files.len(),
            tensors = tensors.len(),
            "opened safetensors weights"
        );
        Ok(SafetensorsWeights { files, tensors })
    }

    /// Names of all tensors, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Shape of a tensor, if present.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|e| e.info.shape.as_slice())
    }

    /// The file a tensor is stored in (for error messages), or the first file.
    pub fn file_of(&self, name: &str) -> &str {
        let idx = self.tensors.get(name).map(|e| e.file).unwrap_or(0);
        self.files
            .get(idx)
            .map(|f| f.name.as_str())
            .unwrap_or("model.safetensors")
    }

    /// The memory maps of the weight files, in the order [`RawTensor::file`] counts them.
    pub fn maps(&self) -> Vec<Arc<Mmap>> {
        self.files.iter().map(|f| Arc::clone(&f.mmap)).collect()
    }

    /// Where a tensor's bytes lie, for models that keep weights in the map in their stored
    /// type. The byte range is checked against the file.
    pub fn raw(&self, name: &str) -> Result<RawTensor> {
        let entry = self.tensors.get(name).ok_or_else(|| {
            EngineError::load(self.file_of(name), format!("tensor `{name}` is missing"))
        })?;
        let file = &self.files[entry.file];
        let (start, end) = entry.info.data_offsets;
        let (start, end) = (file.data_start + start, file.data_start + end);
        if end > file.mmap.len() || start > end {
            return Err(EngineError::load(
                &file.name,
                format!("tensor `{name}` lies outside the file"),
            ));
        }
        Ok(RawTensor {
            file: entry.file,
            dtype: entry.info.dtype,
            shape: entry.info.shape.clone(),
            start,
            len: end - start,
        })
    }

    /// Reads a tensor as f32 (F32, F16 and BF16 are accepted).
    pub fn tensor_f32(&self, name: &str) -> Result<F32Tensor> {
        let entry = self.tensors.get(name).ok_or_else(|| {
            EngineError::load(self.file_of(name), format!("tensor `{name}` is missing"))
        })?;
        let file = &self.files[entry.file];
        let (start, end) = entry.info.data_offsets;
        let bytes = file
            .mmap
            .get(file.data_start + start..file.data_start + end)
            .ok_or_else(|| {
                EngineError::load(&file.name, format!("tensor `{name}` lies outside the file"))
            })?;
        let count: usize = entry.info.shape.iter().product();
        let data = convert_to_f32(entry.info.dtype, bytes, count).map_err(|reason| {
            EngineError::load(&file.name, format!("tensor `{name}`: {reason}"))
        })?;
        Ok(F32Tensor {
            shape: entry.info.shape.clone(),
            data,
        })
    }

    /// Reads a tensor as f32 and checks its shape.
    pub fn tensor_f32_shaped(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.tensor_f32(name)?;
        if t.shape != shape {
            return Err(EngineError::load(
                self.file_of(name),
                format!(
                    "tensor `{name}` has shape {:?}, expected {shape:?}",
                    t.shape
                ),
            ));
        }
        Ok(t.data)
    }
}

fn convert_to_f32(
    dtype: Dtype,
    bytes: &[u8],
    count: usize,
) -> std::result::Result<Vec<f32>, String> {
    let width = match dtype {
        Dtype::F32 => 4,
        Dtype::F16 | Dtype::BF16 => 2,
        other => {
            return Err(format!(
                "unsupported dtype {other:?} (need F32, F16 or BF16)"
            ))
        }
    };
    if bytes.len() != count * width {
        return Err(format!(
            "{} bytes of data for {count} {dtype:?} values",
            bytes.len()
        ));
    }
    let data = match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
    };
    Ok(data)
}

fn list_safetensors(dir: &Path) -> Result<Vec<String>> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| EngineError::load(display(dir), e.to_string()))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| EngineError::load(display(dir), e.to_string()))?;
        let path: PathBuf = entry.path();
        if path.extension().is_some_and(|e| e == "safetensors") && path.is_file() {
            if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                names.push(name.to_string());
            }
        }
    }
    names.sort();
    Ok(names)
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    fn write(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("engine-hf-weights-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn converts_f32_f16_bf16() {
        let dir = tmpdir("dtypes");
        let f32b: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let f16b: Vec<u8> = [0.25f32, 3.0]
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let bf16b: Vec<u8> = [-0.5f32, 8.0]
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        write(
            &dir.join("model.safetensors"),
            &[
                ("a", Dtype::F32, vec![2], f32b),
                ("b", Dtype::F16, vec![1, 2], f16b),
                ("c", Dtype::BF16, vec![2, 1], bf16b),
                ("d", Dtype::I64, vec![1], 7i64.to_le_bytes().to_vec()),
            ],
        );
        let w = SafetensorsWeights::open(&dir).unwrap();
        assert_eq!(w.names(), vec!["a", "b", "c", "d"]);
        assert_eq!(w.tensor_f32("a").unwrap().data, vec![1.5, -2.0]);
        assert_eq!(w.tensor_f32("b").unwrap().data, vec![0.25, 3.0]);
        assert_eq!(w.tensor_f32("c").unwrap().shape, vec![2, 1]);
        assert_eq!(w.tensor_f32("c").unwrap().data, vec![-0.5, 8.0]);
        let err = w.tensor_f32("d").unwrap_err().to_string();
        assert!(err.contains("`d`") && err.contains("I64"), "{err}");
        let err = w.tensor_f32_shaped("a", &[3]).unwrap_err().to_string();
        assert!(err.contains("`a`") && err.contains("[3]"), "{err}");
        let err = w.tensor_f32("nope").unwrap_err().to_string();
        assert!(err.contains("`nope`") && err.contains("missing"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_sharded_checkpoints() {
        let dir = tmpdir("shards");
        let one: Vec<u8> = 1.0f32.to_le_bytes().to_vec();
        let two: Vec<u8> = 2.0f32.to_le_bytes().to_vec();
        write(
            &dir.join("model-00001-of-00002.safetensors"),
            &[("x", Dtype::F32, vec![1], one)],
        );
        write(
            &dir.join("model-00002-of-00002.safetensors"),
            &[("y", Dtype::F32, vec![1], two)],
        );
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            r#"{"metadata": {}, "weight_map": {"x": "model-00001-of-00002.safetensors",
                "y": "model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let w = SafetensorsWeights::open(&dir).unwrap();
        assert_eq!(w.tensor_f32("x").unwrap().data, vec![1.0]);
        assert_eq!(w.tensor_f32("y").unwrap().data, vec![2.0]);
        assert_eq!(w.file_of("y"), "model-00002-of-00002.safetensors");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn corrupt_and_missing_files_are_load_errors() {
        let dir = tmpdir("corrupt");
        let err = SafetensorsWeights::open(&dir).unwrap_err();
        assert!(matches!(err, EngineError::Load { .. }), "{err}");
        std::fs::write(
            dir.join("model.safetensors"),
            b"\x10\0\0\0\0\0\0\0{\"a\": garbage",
        )
        .unwrap();
        let err = SafetensorsWeights::open(&dir).unwrap_err();
        match err {
            EngineError::Load { file, reason } => {
                assert!(file.ends_with("model.safetensors"), "{file}");
                assert!(reason.contains("corrupt"), "{reason}");
            }
            other => panic!("unexpected {other}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
