//! GGUF (v2/v3) checkpoints: a bounds-checked reader over a memory map, and nothing more (what
//! the file holds is built by [`crate::load`] through [`crate::families`]).
//!
//! Layout of a GGUF file (all little-endian): magic `GGUF`, version (u32), tensor count (u64),
//! metadata count (u64), the metadata key/value pairs, the tensor infos (name, dims, type,
//! offset), padding to `general.alignment` (default 32), then the tensor data. Every length and
//! offset is checked against the file size: a truncated or corrupt file is an
//! [`EngineError::Load`] naming the file (and the tensor where one is involved), never a panic.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use kernels::DType;
use memmap2::Mmap;

use crate::error::{EngineError, Result};

mod cursor;

use cursor::{Cursor, MIN_ENTRY_BYTES, MIN_TENSOR_INFO_BYTES};

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float (integers convert).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A GGML tensor type id as stored in the file. Only some are computable (see
/// [`GgmlType::dtype`]); the rest are known by name and size so the file can still be
/// bounds-checked and reported clearly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// Name as llama.cpp spells it.
    pub fn name(self) -> String {
        let known = match self.0 {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            _ => return format!("unknown type {}", self.0),
        };
        known.to_string()
    }

    /// (elements per block, bytes per block), if the type is known.
    fn block_layout(self) -> Option<(u64, u64)> {
        Some(match self.0 {
            0 => (1, 4),
            1 => (1, 2),
            2 => (32, 18),
            3 => (32, 20),
            6 => (32, 22),
            7 => (32, 24),
            8 => (32, 34),
            9 => (32, 36),
            10 => (256, 84),
            11 => (256, 110),
            12 => (256, 144),
            13 => (256, 176),
            14 => (256, 210),
            15 => (256, 292),
            16 => (256, 66),
            17 => (256, 74),
            18 => (256, 98),
            19 => (256, 50),
            20 => (32, 18),
            21 => (256, 110),
            22 => (256, 82),
            23 => (256, 136),
            24 => (1, 1),
            25 => (1, 2),
            26 => (1, 4),
            27 => (1, 8),
            28 => (1, 8),
            29 => (256, 56),
            30 => (1, 2),
            34 => (256, 54),
            35 => (256, 66),
            _ => return None,
        })
    }

    /// The compute type, if our kernels handle this type.
    pub fn dtype(self) -> Option<DType> {
        Some(match self.0 {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            8 => DType::Q8_0,
            10 => DType::Q2_K,
            11 => DType::Q3_K,
            12 => DType::Q4_K,
            13 => DType::Q5_K,
            14 => DType::Q6_K,
            20 => DType::IQ4_NL,
            23 => DType::IQ4_XS,
            30 => DType::BF16,
            _ => return None,
        })
    }

    /// Names of the types [`GgmlType::dtype`] maps, for messages.
    pub fn supported_names() -> String {
        let names: Vec<String> = (0..=u8::MAX)
            .map(|id| GgmlType(id.into()))
            .filter(|t| t.dtype().is_some())
            .map(GgmlType::name)
            .collect();
        names.join(", ")
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Where one tensor lives and what it holds.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// GGML order: `dims[0]` is the innermost (contiguous) dimension.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub start: usize,
    /// Byte length of the data.
    pub len: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file backed by a memory map.
pub struct GgufFile {
    path: String,
    mmap: Arc<Mmap>,
    /// `mmap` maps the file itself (not the weight cache's shared memory or a copy).
    file_map: bool,
    pub version: u32,
    pub alignment: u64,
    metadata: HashMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Open and parse a GGUF file. The tensor data stays in the memory map.
    pub fn open(path: &Path) -> Result<Self> {
        let file_name = path.display().to_string();
        let file = std::fs::File::open(path)
            .map_err(|e| EngineError::load(&file_name, format!("cannot open: {e}")))?;
        // SAFETY: the map is read-only; the model files are not modified while served (a
        // concurrent truncation by another process is outside what we can defend against,
        // as for every mmap-based loader).
        let mmap = unsafe { Mmap::map(&file) }
            .map_err(|e| EngineError::load(&file_name, format!("cannot map: {e}")))?;
        Ok(GgufFile {
            file_map: true,
            ..Self::parse(file_name, Arc::new(mmap))?
        })
    }

    /// Parse GGUF bytes already mapped (the weight cache's shared memory); `name` is the
    /// file they came from, for messages.
    pub fn from_map(name: String, mmap: Arc<Mmap>) -> Result<Self> {
        Self::parse(name, mmap)
    }

    /// Parse GGUF bytes held in memory, copied into an anonymous read-only map (tests, and the
    /// fuzz target's entry [`crate::load::gguf_decoder_from_bytes`]); `name` stands for the file in messages.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<Self> {
        let map_err = |e: std::io::Error| EngineError::load(name, format!("cannot map: {e}"));
        let mut map = memmap2::MmapMut::map_anon(bytes.len()).map_err(map_err)?;
        map.copy_from_slice(bytes);
        Self::parse(
            name.to_string(),
            Arc::new(map.make_read_only().map_err(map_err)?),
        )
    }

    fn parse(path: String, mmap: Arc<Mmap>) -> Result<Self> {
        let err = |reason: String| EngineError::load(&path, reason);
        let mut c = Cursor { buf: &mmap, pos: 0 };
        let magic = c.array::<4>("magic").map_err(err)?;
        if &magic != GGUF_MAGIC {
            return Err(err("not a GGUF file (bad magic)".to_string()));
        }
        let version = c.u32("version").map_err(err)?;
        if !(2..=3).contains(&version) {
            return Err(err(format!(
                "unsupported GGUF version {version} (supported: 2, 3)"
            )));
        }
        let n_tensors = c.u64("tensor count").map_err(err)?;
        let n_kv = c.u64("metadata count").map_err(err)?;
        // Counts the remaining bytes cannot hold are corrupt, and must not size allocations.
        let least = n_tensors
            .checked_mul(MIN_TENSOR_INFO_BYTES)
            .zip(n_kv.checked_mul(MIN_ENTRY_BYTES))
            .and_then(|(t, m)| t.checked_add(m));
        if least.is_none_or(|b| b > c.remaining() as u64) {
            return Err(err(format!(
                "file truncated or corrupt: header claims {n_tensors} tensors and {n_kv} metadata entries"
            )));
        }

        let mut metadata = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = c.string(&format!("metadata key #{i}")).map_err(err)?;
            let what = format!("metadata value '{key}'");
            let ty = c.u32(&what).map_err(err)?;
            let value = c.value(ty, &what, 0).map_err(err)?;
            metadata.insert(key, value);
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => v
                .as_u64()
                .filter(|a| *a > 0 && a.is_power_of_two())
                .ok_or_else(|| err(format!("invalid general.alignment {v:?}")))?,
        };

        struct RawInfo {
            name: String,
            dims: Vec<u64>,
            ty: GgmlType,
            offset: u64,
        }
        let mut raw = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = c.string(&format!("tensor #{i} name")).map_err(err)?;
            let what = format!("tensor '{name}' info");
            let n_dims = c.u32(&what).map_err(err)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(err(format!(
                    "tensor '{name}': invalid dimension count {n_dims}"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&what).map_err(err)?);
            }
            let ty = GgmlType(c.u32(&what).map_err(err)?);
            let offset = c.u64(&what).map_err(err)?;
            raw.push(RawInfo {
                name,
                dims,
                ty,
                offset,
            });
        }

        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = mmap.len() as u64;
        let mut tensors = Vec::with_capacity(raw.len());
        let mut by_name = HashMap::with_capacity(raw.len());
        for r in raw {
            let name = &r.name;
            let (block, type_size) = r
                .ty
                .block_layout()
                .ok_or_else(|| err(format!("tensor '{name}' has unknown GGML type {}", r.ty.0)))?;
            let n_el = r
                .dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| err(format!("tensor '{name}': dimensions {:?} overflow", r.dims)))?;
            if !r.dims[0].is_multiple_of(block) {
                return Err(err(format!(
                    "tensor '{name}': row length {} is not a multiple of the {} block size {block}",
                    r.dims[0], r.ty
                )));
            }
            if !r.offset.is_multiple_of(alignment) {
                return Err(err(format!(
                    "tensor '{name}': data offset {} is not aligned to {alignment}",
                    r.offset
                )));
            }
            let len = (n_el / block)
                .checked_mul(type_size)
                .ok_or_else(|| err(format!("tensor '{name}': size overflows")))?;
            let start = data_start
                .checked_add(r.offset)
                .filter(|s| s.checked_add(len).is_some_and(|e| e <= file_len))
                .ok_or_else(|| {
                    err(format!(
                        "file truncated or corrupt: tensor '{name}' ({} bytes at data offset {}) extends past the end of the file ({file_len} bytes)",
                        len, r.offset
                    ))
                })?;
            if by_name.insert(r.name.clone(), tensors.len()).is_some() {
                return Err(err(format!("duplicate tensor '{name}'")));
            }
            tensors.push(TensorInfo {
                name: r.name,
                dims: r.dims,
                ggml_type: r.ty,
                start: start as usize,
                len: len as usize,
            });
        }

        Ok(GgufFile {
            path,
            mmap,
            version,
            alignment,
            metadata,
            tensors,
            by_name,
            file_map: false,
        })
    }

    /// The file name, for error messages.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether the map is the file's own pages (opened by [`GgufFile::open`]).
    pub fn is_file_map(&self) -> bool {
        self.file_map
    }

    /// The whole memory map (tensor data is addressed by [`TensorInfo::start`]).
    pub fn mmap(&self) -> &Arc<Mmap> {
        &self.mmap
    }

    pub fn metadata(&self) -> &HashMap<String, MetaValue> {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor's data.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.mmap[info.start..info.start + info.len]
    }

    /// A load error naming this file.
    pub fn error(&self, reason: impl Into<String>) -> EngineError {
        EngineError::load(&self.path, reason)
    }

    /// A string value; `None` when absent, an error when present with another type.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.error(format!("metadata '{key}' is not a string"))),
        }
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.error(format!("metadata '{key}' is not an unsigned integer"))),
        }
    }

    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.error(format!("metadata '{key}' is not a number"))),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.error(format!("metadata '{key}' is not a bool"))),
        }
    }

    /// A required unsigned integer.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?
            .ok_or_else(|| self.error(format!("missing metadata '{key}'")))
    }

    /// An array value; `None` when absent.
    pub fn get_array(&self, key: &str) -> Result<Option<&[MetaValue]>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| self.error(format!("metadata '{key}' is not an array"))),
        }
    }
}

/// The GGUF file of a folder given as a model (the first `.gguf` in it).
pub(crate) fn single_gguf(dir: &Path) -> Result<std::path::PathBuf> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| EngineError::load(dir.display().to_string(), e.to_string()))?;
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "gguf"))
        .ok_or_else(|| EngineError::load(dir.display().to_string(), "no .gguf file in the folder"))
}

#[cfg(test)]
mod tests;
