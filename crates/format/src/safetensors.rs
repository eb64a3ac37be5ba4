//! safetensors reader: single files, sharded checkpoints (an index json with
//! a `weight_map`), and directories of shards, each shard memory-mapped once.
//!
//! Normative reference: the safetensors format as specified by Hugging Face
//! (`safetensors` README and the `safetensors` crate 0.6, `tensor.rs`):
//!
//! ```text
//! N: u64 little-endian | N bytes of UTF-8 JSON | data
//! JSON: { "<name>": { "dtype": "BF16", "shape": [d0, d1, ...],
//!                     "data_offsets": [begin, end] }, ...,
//!         "__metadata__": { "<key>": "<string>", ... } (optional) }
//! ```
//!
//! Offsets are relative to the first byte after the JSON, shapes are
//! row-major (outermost first), and a tensor's `end - begin` must equal
//! `product(shape) * bits(dtype) / 8`. The reference crate also rejects gaps
//! between tensors; this reader does not, since a gap cannot make a read
//! unsound and some writers pad.
//!
//! [`parse_header`] never panics; counts and lengths are only trusted after
//! they are checked against the file length.

use memmap2::Mmap;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use turbospark_core::QuantFormat;

/// File name of a single-file checkpoint.
pub const SINGLE_FILE_NAME: &str = "model.safetensors";
/// File name of a sharded checkpoint's index.
pub const INDEX_FILE_NAME: &str = "model.safetensors.index.json";
/// Header key reserved for string metadata.
pub const METADATA_KEY: &str = "__metadata__";
/// Bytes of the header-length prefix.
const LENGTH_PREFIX_BYTES: u64 = 8;

/// Everything that can be wrong with a safetensors file or checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SafetensorsError {
    #[error("cannot read {}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A format error, with the file it was found in.
    #[error("{}: {error}", path.display())]
    InFile {
        path: PathBuf,
        error: Box<SafetensorsError>,
    },
    #[error("file is {file_len} bytes, too short for the 8-byte header length")]
    TooShort { file_len: u64 },
    #[error("header length {header_len} larger than file ({file_len} bytes)")]
    HeaderTooLarge { header_len: u64, file_len: u64 },
    #[error("header is not valid JSON: {message}")]
    InvalidJson { message: String },
    #[error("header lists '{name}' more than once")]
    DuplicateName { name: String },
    #[error("header {METADATA_KEY} is not an object of strings: {message}")]
    BadMetadata { message: String },
    #[error("header entry of tensor '{name}' is malformed: {message}")]
    BadTensorEntry { name: String, message: String },
    #[error("tensor '{name}' has unknown dtype '{dtype}'")]
    UnknownDtype { name: String, dtype: String },
    #[error("tensor '{name}' has shape {shape:?} whose byte size overflows 64 bits")]
    SizeOverflow { name: String, shape: Vec<u64> },
    #[error(
        "tensor '{name}' of dtype {dtype} has {elements} elements, which do not fill whole bytes"
    )]
    PartialByte {
        name: String,
        dtype: StDtype,
        elements: u64,
    },
    #[error("tensor '{name}' has data_offsets [{begin}, {end}]: the end precedes the begin")]
    OffsetsReversed { name: String, begin: u64, end: u64 },
    #[error(
        "tensor '{name}' ends at data offset {end}, past the end of the data ({data_len} bytes)"
    )]
    TensorOutOfBounds {
        name: String,
        end: u64,
        data_len: u64,
    },
    #[error(
        "tensor '{name}' ({dtype}, shape {shape:?}) needs {expected} bytes \
         but its data_offsets span {actual}"
    )]
    SizeMismatch {
        name: String,
        dtype: StDtype,
        shape: Vec<u64>,
        expected: u64,
        actual: u64,
    },
    #[error("{}: not a valid index (expected {{\"weight_map\": {{name: file}}}}): {message}", path.display())]
    BadIndex { path: PathBuf, message: String },
    #[error("{}: shard '{shard}' must be a relative path inside the checkpoint directory", index.display())]
    BadShardPath { index: PathBuf, shard: String },
    #[error("{}: shard {} does not exist", index.display(), shard.display())]
    MissingShard { index: PathBuf, shard: PathBuf },
    #[error("{}: tensor '{name}' is mapped to this shard, which does not contain it", shard.display())]
    TensorMissingFromShard { name: String, shard: PathBuf },
    #[error("tensor '{name}' appears in both {} and {}", first.display(), second.display())]
    DuplicateAcrossShards {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("{} contains no {SINGLE_FILE_NAME}, {INDEX_FILE_NAME} or other *.safetensors file", dir.display())]
    NoSafetensors { dir: PathBuf },
}

impl SafetensorsError {
    /// The format error itself, without the file it was found in.
    pub fn root(&self) -> &SafetensorsError {
        match self {
            SafetensorsError::InFile { error, .. } => error.root(),
            other => other,
        }
    }

    fn in_file(path: &Path) -> impl FnOnce(SafetensorsError) -> SafetensorsError + '_ {
        move |error| SafetensorsError::InFile {
            path: path.to_path_buf(),
            error: Box::new(error),
        }
    }
}

/// Element types the safetensors format defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StDtype {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    Bf16,
    F32,
    F64,
    /// Complex of two f32.
    C64,
    F8E4M3,
    F8E5M2,
    F8E4M3Fnuz,
    F8E5M2Fnuz,
    /// Exponent-only scale (OCP microscaling).
    F8E8M0,
    /// FP4 e2m1, two per byte.
    F4,
    F6E2M3,
    F6E3M2,
}

impl StDtype {
    pub const ALL: [StDtype; 22] = [
        StDtype::Bool,
        StDtype::U8,
        StDtype::I8,
        StDtype::U16,
        StDtype::I16,
        StDtype::U32,
        StDtype::I32,
        StDtype::U64,
        StDtype::I64,
        StDtype::F16,
        StDtype::Bf16,
        StDtype::F32,
        StDtype::F64,
        StDtype::C64,
        StDtype::F8E4M3,
        StDtype::F8E5M2,
        StDtype::F8E4M3Fnuz,
        StDtype::F8E5M2Fnuz,
        StDtype::F8E8M0,
        StDtype::F4,
        StDtype::F6E2M3,
        StDtype::F6E3M2,
    ];

    /// The name used in headers, e.g. `BF16`.
    pub const fn name(self) -> &'static str {
        match self {
            StDtype::Bool => "BOOL",
            StDtype::U8 => "U8",
            StDtype::I8 => "I8",
            StDtype::U16 => "U16",
            StDtype::I16 => "I16",
            StDtype::U32 => "U32",
            StDtype::I32 => "I32",
            StDtype::U64 => "U64",
            StDtype::I64 => "I64",
            StDtype::F16 => "F16",
            StDtype::Bf16 => "BF16",
            StDtype::F32 => "F32",
            StDtype::F64 => "F64",
            StDtype::C64 => "C64",
            StDtype::F8E4M3 => "F8_E4M3",
            StDtype::F8E5M2 => "F8_E5M2",
            StDtype::F8E4M3Fnuz => "F8_E4M3FNUZ",
            StDtype::F8E5M2Fnuz => "F8_E5M2FNUZ",
            StDtype::F8E8M0 => "F8_E8M0",
            StDtype::F4 => "F4",
            StDtype::F6E2M3 => "F6_E2M3",
            StDtype::F6E3M2 => "F6_E3M2",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        StDtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bits per element.
    pub const fn bits(self) -> u64 {
        match self {
            StDtype::F4 => 4,
            StDtype::F6E2M3 | StDtype::F6E3M2 => 6,
            StDtype::Bool
            | StDtype::U8
            | StDtype::I8
            | StDtype::F8E4M3
            | StDtype::F8E5M2
            | StDtype::F8E4M3Fnuz
            | StDtype::F8E5M2Fnuz
            | StDtype::F8E8M0 => 8,
            StDtype::U16 | StDtype::I16 | StDtype::F16 | StDtype::Bf16 => 16,
            StDtype::U32 | StDtype::I32 | StDtype::F32 => 32,
            StDtype::U64 | StDtype::I64 | StDtype::F64 | StDtype::C64 => 64,
        }
    }

    /// Bytes of `elements` elements, or `None` if they do not fill whole
    /// bytes or the size overflows.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let bits = elements.checked_mul(self.bits())?;
        (bits % 8 == 0).then_some(bits / 8)
    }

    /// The turbospark element format of a float dtype.
    pub fn quant_format(self) -> Option<QuantFormat> {
        match self {
            StDtype::F32 => Some(QuantFormat::F32),
            StDtype::F16 => Some(QuantFormat::F16),
            StDtype::Bf16 => Some(QuantFormat::Bf16),
            _ => None,
        }
    }

    /// Whether turbospark can consume tensors of this dtype: the float
    /// formats it computes with, and U8, which checkpoints use for packed
    /// block data (gpt-oss stores MXFP4 blocks and their E8M0 scales as U8).
    pub fn is_supported(self) -> bool {
        self.quant_format().is_some() || self == StDtype::U8
    }
}

impl fmt::Display for StDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StTensorInfo {
    pub name: String,
    pub dtype: StDtype,
    /// Row-major shape, outermost first.
    pub shape: Vec<u64>,
    /// Index of the shard file holding the tensor.
    pub shard: usize,
    /// Absolute byte range in the shard file.
    pub range: Range<u64>,
}

impl StTensorInfo {
    /// Number of elements (saturating; validated headers never saturate).
    pub fn n_elements(&self) -> u64 {
        self.shape
            .iter()
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    pub fn byte_len(&self) -> u64 {
        self.range.end - self.range.start
    }
}

/// A parsed and validated safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StHeader {
    /// The JSON length N; the data section starts at byte `8 + N`.
    pub header_len: u64,
    /// `__metadata__`, empty when absent.
    pub metadata: BTreeMap<String, String>,
    /// Tensors sorted by name, with `shard` 0 and absolute ranges.
    pub tensors: Vec<StTensorInfo>,
}

impl StHeader {
    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        LENGTH_PREFIX_BYTES + self.header_len
    }
}

/// Header entries in file order, keeping duplicates so they can be reported.
struct RawEntries(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for RawEntries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = RawEntries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEntries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, serde_json::Value>()? {
                    entries.push(entry);
                }
                Ok(RawEntries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
}

#[derive(Deserialize)]
struct RawTensor {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Parses and validates a safetensors header. `bytes` is the whole file:
/// tensor ranges are checked against its length.
///
/// Never panics; errors name what was wrong and what was expected.
pub fn parse_header(bytes: &[u8]) -> Result<StHeader, SafetensorsError> {
    let file_len = bytes.len() as u64;
    let Some((prefix, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(SafetensorsError::TooShort { file_len });
    };
    let header_len = u64::from_le_bytes(*prefix);
    let json = usize::try_from(header_len)
        .ok()
        .and_then(|n| rest.get(..n))
        .ok_or(SafetensorsError::HeaderTooLarge {
            header_len,
            file_len,
        })?;
    let data_start = LENGTH_PREFIX_BYTES + header_len;
    let data_len = file_len - data_start;

    let RawEntries(entries) =
        serde_json::from_slice(json).map_err(|e| SafetensorsError::InvalidJson {
            message: e.to_string(),
        })?;

    let mut seen = BTreeSet::new();
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if !seen.insert(name.clone()) {
            return Err(SafetensorsError::DuplicateName { name });
        }
        if name == METADATA_KEY {
            metadata =
                serde_json::from_value(value).map_err(|e| SafetensorsError::BadMetadata {
                    message: e.to_string(),
                })?;
            continue;
        }
        let raw: RawTensor = match serde_json::from_value(value) {
            Ok(raw) => raw,
            Err(e) => {
                return Err(SafetensorsError::BadTensorEntry {
                    name,
                    message: e.to_string(),
                })
            }
        };
        let info = validate_tensor(name, raw, data_start, data_len)?;
        tensors.push(info);
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(StHeader {
        header_len,
        metadata,
        tensors,
    })
}

fn validate_tensor(
    name: String,
    raw: RawTensor,
    data_start: u64,
    data_len: u64,
) -> Result<StTensorInfo, SafetensorsError> {
    let Some(dtype) = StDtype::from_name(&raw.dtype) else {
        return Err(SafetensorsError::UnknownDtype {
            name,
            dtype: raw.dtype,
        });
    };
    let Some(elements) = raw
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    else {
        return Err(SafetensorsError::SizeOverflow {
            name,
            shape: raw.shape,
        });
    };
    let Some(bits) = elements.checked_mul(dtype.bits()) else {
        return Err(SafetensorsError::SizeOverflow {
            name,
            shape: raw.shape,
        });
    };
    if bits % 8 != 0 {
        return Err(SafetensorsError::PartialByte {
            name,
            dtype,
            elements,
        });
    }
    let expected = bits / 8;
    let [begin, end] = raw.data_offsets;
    if end < begin {
        return Err(SafetensorsError::OffsetsReversed { name, begin, end });
    }
    if end > data_len {
        return Err(SafetensorsError::TensorOutOfBounds {
            name,
            end,
            data_len,
        });
    }
    if end - begin != expected {
        return Err(SafetensorsError::SizeMismatch {
            name,
            dtype,
            shape: raw.shape,
            expected,
            actual: end - begin,
        });
    }
    Ok(StTensorInfo {
        name,
        dtype,
        shape: raw.shape,
        shard: 0,
        range: data_start + begin..data_start + end,
    })
}

/// One mapped shard file.
struct Shard {
    path: PathBuf,
    metadata: BTreeMap<String, String>,
    mmap: Mmap,
}

/// Maps a file and parses its header; the tensors come back with `shard`
/// set to `index`.
fn open_shard(path: &Path, index: usize) -> Result<(Shard, Vec<StTensorInfo>), SafetensorsError> {
    let io_err = |error| SafetensorsError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = File::open(path).map_err(io_err)?;
    // SAFETY: the mapping is read-only. Its contents are only sound to read
    // while no other process truncates or rewrites the file; checkpoints are
    // treated as immutable while open, the standard contract of every
    // mmap-based model loader.
    let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
    let header = parse_header(&mmap).map_err(SafetensorsError::in_file(path))?;
    let tensors = header
        .tensors
        .into_iter()
        .map(|t| StTensorInfo { shard: index, ..t })
        .collect();
    let shard = Shard {
        path: path.to_path_buf(),
        metadata: header.metadata,
        mmap,
    };
    Ok((shard, tensors))
}

#[derive(Deserialize)]
struct IndexFile {
    weight_map: BTreeMap<String, String>,
}

/// A checkpoint of one or more safetensors shards, each memory-mapped once.
pub struct SafetensorsCheckpoint {
    shards: Vec<Shard>,
    tensors: BTreeMap<String, StTensorInfo>,
}

impl fmt::Debug for SafetensorsCheckpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SafetensorsCheckpoint")
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl SafetensorsCheckpoint {
    /// Opens the checkpoint in `dir`: `model.safetensors.index.json` if
    /// present, else `model.safetensors`, else every `*.safetensors` file in
    /// name order (a tensor present in two of them is an error).
    pub fn open_dir(dir: &Path) -> Result<Self, SafetensorsError> {
        let index = dir.join(INDEX_FILE_NAME);
        if index.is_file() {
            return Self::open_index(&index);
        }
        let single = dir.join(SINGLE_FILE_NAME);
        if single.is_file() {
            return Self::open_file(&single);
        }
        let entries = std::fs::read_dir(dir).map_err(|error| SafetensorsError::Io {
            path: dir.to_path_buf(),
            error,
        })?;
        let mut files = Vec::new();
        for entry in entries {
            let path = entry
                .map_err(|error| SafetensorsError::Io {
                    path: dir.to_path_buf(),
                    error,
                })?
                .path();
            if path.extension().is_some_and(|e| e == "safetensors") && path.is_file() {
                files.push(path);
            }
        }
        if files.is_empty() {
            return Err(SafetensorsError::NoSafetensors {
                dir: dir.to_path_buf(),
            });
        }
        files.sort();
        Self::open_files(&files)
    }

    /// Opens a single `.safetensors` file.
    pub fn open_file(path: &Path) -> Result<Self, SafetensorsError> {
        Self::open_files(&[path.to_path_buf()])
    }

    /// Opens shards that together hold the checkpoint; every tensor must be
    /// in exactly one of them.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self, SafetensorsError> {
        let mut shards: Vec<Shard> = Vec::with_capacity(paths.len());
        let mut tensors: BTreeMap<String, StTensorInfo> = BTreeMap::new();
        for path in paths {
            let (shard, infos) = open_shard(path, shards.len())?;
            for t in infos {
                if let Some(first) = tensors.get(&t.name) {
                    return Err(SafetensorsError::DuplicateAcrossShards {
                        // Earlier shards only: a shard's own names are unique.
                        first: shards[first.shard].path.clone(),
                        second: shard.path.clone(),
                        name: t.name,
                    });
                }
                tensors.insert(t.name.clone(), t);
            }
            shards.push(shard);
        }
        Ok(SafetensorsCheckpoint { shards, tensors })
    }

    /// Opens a sharded checkpoint through its index json; shard paths are
    /// relative to the index's directory. Tensors a shard holds but the
    /// index does not name are left out, as in `transformers`.
    pub fn open_index(index: &Path) -> Result<Self, SafetensorsError> {
        let text = std::fs::read(index).map_err(|error| SafetensorsError::Io {
            path: index.to_path_buf(),
            error,
        })?;
        let parsed: IndexFile =
            serde_json::from_slice(&text).map_err(|e| SafetensorsError::BadIndex {
                path: index.to_path_buf(),
                message: e.to_string(),
            })?;
        let dir = index.parent().unwrap_or(Path::new("."));

        let shard_names: BTreeSet<&str> = parsed.weight_map.values().map(String::as_str).collect();
        let mut shards = Vec::with_capacity(shard_names.len());
        let mut shard_tensors = Vec::with_capacity(shard_names.len());
        let mut shard_of_name = HashMap::with_capacity(shard_names.len());
        for name in shard_names {
            let relative = Path::new(name);
            let plain = relative
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            if !plain || name.is_empty() {
                return Err(SafetensorsError::BadShardPath {
                    index: index.to_path_buf(),
                    shard: name.to_string(),
                });
            }
            let path = dir.join(relative);
            if !path.is_file() {
                return Err(SafetensorsError::MissingShard {
                    index: index.to_path_buf(),
                    shard: path,
                });
            }
            let (shard, infos) = open_shard(&path, shards.len())?;
            shard_of_name.insert(name, shards.len());
            shards.push(shard);
            shard_tensors.push(
                infos
                    .into_iter()
                    .map(|t| (t.name.clone(), t))
                    .collect::<HashMap<_, _>>(),
            );
        }

        let mut tensors = BTreeMap::new();
        for (name, shard_name) in &parsed.weight_map {
            // Every shard name of the weight map was opened above.
            let shard = shard_of_name[shard_name.as_str()];
            let Some(info) = shard_tensors[shard].remove(name) else {
                return Err(SafetensorsError::TensorMissingFromShard {
                    name: name.clone(),
                    shard: shards[shard].path.clone(),
                });
            };
            tensors.insert(name.clone(), info);
        }
        Ok(SafetensorsCheckpoint { shards, tensors })
    }

    /// Tensors sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = &StTensorInfo> {
        self.tensors.values()
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn tensor(&self, name: &str) -> Option<&StTensorInfo> {
        self.tensors.get(name)
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    pub fn shard_path(&self, shard: usize) -> Option<&Path> {
        self.shards.get(shard).map(|s| s.path.as_path())
    }

    /// The `__metadata__` of one shard.
    pub fn shard_metadata(&self, shard: usize) -> Option<&BTreeMap<String, String>> {
        self.shards.get(shard).map(|s| &s.metadata)
    }

    /// The bytes of a tensor of this checkpoint.
    ///
    /// # Panics
    /// If `t` names a shard or range outside this checkpoint, which cannot
    /// happen for an info obtained from it (ranges were validated on open).
    pub fn tensor_bytes(&self, t: &StTensorInfo) -> &[u8] {
        &self.shards[t.shard].mmap[t.range.start as usize..t.range.end as usize]
    }
}
