//! GGUF reader: a memory-mapped file whose header is fully validated before
//! any tensor byte is handed out.
//!
//! Normative reference: ggml `docs/gguf.md` and `ggml/src/gguf.cpp`
//! (llama.cpp), and the `gguf` Python package (`gguf-py`, 0.19) that writes
//! most files in circulation. Versions 2 and 3 share this layout; everything
//! is little-endian:
//!
//! ```text
//! magic "GGUF" | version: u32 | tensor_count: u64 | kv_count: u64
//! kv_count     x (key: string, value_type: u32, value)
//! tensor_count x (name: string, n_dims: u32, ne: [u64; n_dims], ggml_type: u32, offset: u64)
//! zero padding up to a multiple of `general.alignment` (default 32)
//! data section: tensor i occupies [data_offset + offset_i, + byte_len_i)
//!
//! string = len: u64, then len bytes of UTF-8
//! array  = elem_type: u32, count: u64, then count values of elem_type
//! ```
//!
//! `ne[0]` is the innermost (contiguous) dimension, so the row-major shape is
//! `ne` reversed. A tensor of a block type stores `ne[0] / block_elems` blocks
//! per row of `block_bytes` each; its byte length is therefore
//! `product(ne) / block_elems * block_bytes`, with `ne[0]` a whole number of
//! blocks.
//!
//! [`parse_header`] never panics and never allocates in proportion to a count
//! field alone: every count is checked against the bytes left in the file
//! before anything is reserved, and preallocation is capped.

use memmap2::Mmap;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use turbospark_core::QuantFormat;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Metadata key that overrides the data-section alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions a ggml tensor can have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays deeper than this are rejected: real files nest at most
/// one level, and unbounded recursion on crafted input would exhaust the stack.
pub const MAX_ARRAY_NESTING: usize = 16;
/// Versions this reader understands.
pub const SUPPORTED_VERSIONS: [u32; 2] = [2, 3];

/// Preallocation cap for vectors sized by a count field. Real data beyond it
/// still loads; the vector simply grows as elements are actually parsed.
const PREALLOC_LIMIT: usize = 1 << 16;

/// Smallest encodings, used to bound counts by the bytes that remain.
/// A metadata entry: key length (8) + value type (4) + a one-byte value.
const MIN_KV_BYTES: u64 = 13;
/// A tensor info: name length (8) + n_dims (4) + ggml type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;

/// Everything that can be wrong with a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    #[error("cannot read {}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A format error, with the file it was found in.
    #[error("{}: {error}", path.display())]
    InFile {
        path: PathBuf,
        error: Box<GgufError>,
    },
    #[error("not a GGUF file: starts with \"{}\", expected \"GGUF\"", found.escape_ascii())]
    BadMagic { found: [u8; 4] },
    #[error(
        "GGUF file is big-endian (its version reads {version} when byte-swapped); \
         only little-endian files are supported"
    )]
    BigEndian { version: u32 },
    #[error("GGUF version {0} is not supported (expected 2 or 3)")]
    UnsupportedVersion(u32),
    #[error(
        "file ends inside {what}: {needed} bytes needed at offset {offset}, {available} available"
    )]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },
    #[error("metadata key '{key}' has unknown value type {type_id} (expected 0 to 12)")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata key '{key}' holds boolean byte {byte}, expected 0 or 1")]
    InvalidBool { key: String, byte: u8 },
    #[error("metadata key '{key}' nests arrays deeper than {limit} levels")]
    ArrayTooDeep { key: String, limit: usize },
    #[error("metadata key '{key}' appears more than once")]
    DuplicateKey { key: String },
    #[error("metadata key '{key}' is missing")]
    MissingKey { key: String },
    #[error("metadata key '{key}' holds {found}, expected {expected}")]
    WrongValueType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("general.alignment is {value}, expected a non-zero power of two")]
    BadAlignment { value: u64 },
    #[error("tensor '{name}' has {n_dims} dimensions, at most {max} are allowed")]
    TooManyDims {
        name: String,
        n_dims: u32,
        max: usize,
    },
    #[error("tensor '{name}' appears more than once")]
    DuplicateTensor { name: String },
    #[error(
        "tensor '{name}' has ggml type {ggml_type}{}, whose block layout is unknown",
        known_name_suffix(*ggml_type)
    )]
    UnknownGgmlType { name: String, ggml_type: u32 },
    #[error("tensor '{name}' has dimensions {dims:?} whose byte size overflows 64 bits")]
    SizeOverflow { name: String, dims: Vec<u64> },
    #[error(
        "tensor '{name}' of type {type_name} has rows of {row_len} elements, \
         not a multiple of its block size {block_elems}"
    )]
    PartialBlock {
        name: String,
        type_name: String,
        row_len: u64,
        block_elems: u64,
    },
    #[error("tensor '{name}' has offset {offset}, not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor '{name}' ends at byte {end}, past the end of the file ({file_len} bytes)")]
    TensorOutOfBounds {
        name: String,
        end: u64,
        file_len: u64,
    },
}

impl GgufError {
    /// The format error itself, without the file it was found in.
    pub fn root(&self) -> &GgufError {
        match self {
            GgufError::InFile { error, .. } => error.root(),
            other => other,
        }
    }
}

/// The type tag of a metadata value (`gguf_type` in ggml).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufValueType {
    pub const ALL: [GgufValueType; 13] = [
        GgufValueType::U8,
        GgufValueType::I8,
        GgufValueType::U16,
        GgufValueType::I16,
        GgufValueType::U32,
        GgufValueType::I32,
        GgufValueType::F32,
        GgufValueType::Bool,
        GgufValueType::String,
        GgufValueType::Array,
        GgufValueType::U64,
        GgufValueType::I64,
        GgufValueType::F64,
    ];

    /// The id written in files.
    pub const fn id(self) -> u32 {
        match self {
            GgufValueType::U8 => 0,
            GgufValueType::I8 => 1,
            GgufValueType::U16 => 2,
            GgufValueType::I16 => 3,
            GgufValueType::U32 => 4,
            GgufValueType::I32 => 5,
            GgufValueType::F32 => 6,
            GgufValueType::Bool => 7,
            GgufValueType::String => 8,
            GgufValueType::Array => 9,
            GgufValueType::U64 => 10,
            GgufValueType::I64 => 11,
            GgufValueType::F64 => 12,
        }
    }

    pub fn from_id(id: u32) -> Option<Self> {
        GgufValueType::ALL.into_iter().find(|t| t.id() == id)
    }

    pub const fn name(self) -> &'static str {
        match self {
            GgufValueType::U8 => "u8",
            GgufValueType::I8 => "i8",
            GgufValueType::U16 => "u16",
            GgufValueType::I16 => "i16",
            GgufValueType::U32 => "u32",
            GgufValueType::I32 => "i32",
            GgufValueType::F32 => "f32",
            GgufValueType::Bool => "bool",
            GgufValueType::String => "string",
            GgufValueType::Array => "array",
            GgufValueType::U64 => "u64",
            GgufValueType::I64 => "i64",
            GgufValueType::F64 => "f64",
        }
    }

    /// Fewest bytes one value of this type occupies in a file.
    const fn min_encoded_bytes(self) -> u64 {
        match self {
            GgufValueType::U8 | GgufValueType::I8 | GgufValueType::Bool => 1,
            GgufValueType::U16 | GgufValueType::I16 => 2,
            GgufValueType::U32 | GgufValueType::I32 | GgufValueType::F32 => 4,
            GgufValueType::U64 | GgufValueType::I64 | GgufValueType::F64 => 8,
            // Length prefix of an empty string.
            GgufValueType::String => 8,
            // Element type and count of an empty array.
            GgufValueType::Array => 12,
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array. GGUF arrays are homogeneous, so each element type gets
/// its own vector: a 150k-entry `tokenizer.ggml.scores` is one `Vec<f32>`.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    /// Arrays of arrays; each inner array carries its own element type.
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl GgufValue {
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// A readable type name, e.g. `u32` or `array of string`.
    pub fn type_description(&self) -> String {
        match self {
            GgufValue::Array(a) => format!("array of {}", a.elem_type()),
            other => other.value_type().name().to_string(),
        }
    }

    /// Any integer that is non-negative, widened to u64.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer that fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer that fits in u32.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_u64().and_then(|v| u32::try_from(v).ok())
    }

    /// Any number (float or integer) as f64. Integers above 2^53 round.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v as f64),
            GgufValue::I64(v) => Some(v as f64),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Long arrays are shown as their first elements and a count.
const DISPLAY_ARRAY_ITEMS: usize = 8;

impl fmt::Display for GgufValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufValue::U8(v) => write!(f, "{v}"),
            GgufValue::I8(v) => write!(f, "{v}"),
            GgufValue::U16(v) => write!(f, "{v}"),
            GgufValue::I16(v) => write!(f, "{v}"),
            GgufValue::U32(v) => write!(f, "{v}"),
            GgufValue::I32(v) => write!(f, "{v}"),
            GgufValue::F32(v) => write!(f, "{v}"),
            GgufValue::Bool(v) => write!(f, "{v}"),
            GgufValue::String(v) => write!(f, "{v:?}"),
            GgufValue::Array(a) => write!(f, "{a}"),
            GgufValue::U64(v) => write!(f, "{v}"),
            GgufValue::I64(v) => write!(f, "{v}"),
            GgufValue::F64(v) => write!(f, "{v}"),
        }
    }
}

fn write_items<T: fmt::Debug>(f: &mut fmt::Formatter<'_>, items: &[T]) -> fmt::Result {
    f.write_str("[")?;
    for (i, item) in items.iter().take(DISPLAY_ARRAY_ITEMS).enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{item:?}")?;
    }
    if items.len() > DISPLAY_ARRAY_ITEMS {
        write!(f, ", ... ({} total)", items.len())?;
    }
    f.write_str("]")
}

impl fmt::Display for GgufArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufArray::U8(v) => write_items(f, v),
            GgufArray::I8(v) => write_items(f, v),
            GgufArray::U16(v) => write_items(f, v),
            GgufArray::I16(v) => write_items(f, v),
            GgufArray::U32(v) => write_items(f, v),
            GgufArray::I32(v) => write_items(f, v),
            GgufArray::F32(v) => write_items(f, v),
            GgufArray::Bool(v) => write_items(f, v),
            GgufArray::String(v) => write_items(f, v),
            GgufArray::U64(v) => write_items(f, v),
            GgufArray::I64(v) => write_items(f, v),
            GgufArray::F64(v) => write_items(f, v),
            GgufArray::Array(v) => {
                f.write_str("[")?;
                for (i, inner) in v.iter().take(DISPLAY_ARRAY_ITEMS).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{inner}")?;
                }
                if v.len() > DISPLAY_ARRAY_ITEMS {
                    write!(f, ", ... ({} total)", v.len())?;
                }
                f.write_str("]")
            }
        }
    }
}

impl GgufArray {
    pub fn elem_type(&self) -> GgufValueType {
        match self {
            GgufArray::U8(_) => GgufValueType::U8,
            GgufArray::I8(_) => GgufValueType::I8,
            GgufArray::U16(_) => GgufValueType::U16,
            GgufArray::I16(_) => GgufValueType::I16,
            GgufArray::U32(_) => GgufValueType::U32,
            GgufArray::I32(_) => GgufValueType::I32,
            GgufArray::F32(_) => GgufValueType::F32,
            GgufArray::Bool(_) => GgufValueType::Bool,
            GgufArray::String(_) => GgufValueType::String,
            GgufArray::Array(_) => GgufValueType::Array,
            GgufArray::U64(_) => GgufValueType::U64,
            GgufArray::I64(_) => GgufValueType::I64,
            GgufArray::F64(_) => GgufValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            GgufArray::String(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f32s(&self) -> Option<&[f32]> {
        match self {
            GgufArray::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_i32s(&self) -> Option<&[i32]> {
        match self {
            GgufArray::I32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_u32s(&self) -> Option<&[u32]> {
        match self {
            GgufArray::U32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_arrays(&self) -> Option<&[GgufArray]> {
        match self {
            GgufArray::Array(v) => Some(v),
            _ => None,
        }
    }

    /// An integer array of any width as u64, or `None` if it holds a negative
    /// value or is not an integer array.
    pub fn to_u64_vec(&self) -> Option<Vec<u64>> {
        fn conv<T: Copy>(v: &[T]) -> Option<Vec<u64>>
        where
            u64: TryFrom<T>,
        {
            v.iter().map(|&x| u64::try_from(x).ok()).collect()
        }
        match self {
            GgufArray::U8(v) => conv(v),
            GgufArray::I8(v) => conv(v),
            GgufArray::U16(v) => conv(v),
            GgufArray::I16(v) => conv(v),
            GgufArray::U32(v) => conv(v),
            GgufArray::I32(v) => conv(v),
            GgufArray::U64(v) => Some(v.clone()),
            GgufArray::I64(v) => conv(v),
            _ => None,
        }
    }

    /// A numeric array of any type as f64 (integers above 2^53 round).
    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        fn conv<T: Copy + Into<f64>>(v: &[T]) -> Option<Vec<f64>> {
            Some(v.iter().map(|&x| x.into()).collect())
        }
        match self {
            GgufArray::U8(v) => conv(v),
            GgufArray::I8(v) => conv(v),
            GgufArray::U16(v) => conv(v),
            GgufArray::I16(v) => conv(v),
            GgufArray::U32(v) => conv(v),
            GgufArray::I32(v) => conv(v),
            GgufArray::F32(v) => conv(v),
            GgufArray::F64(v) => Some(v.clone()),
            GgufArray::U64(v) => Some(v.iter().map(|&x| x as f64).collect()),
            GgufArray::I64(v) => Some(v.iter().map(|&x| x as f64).collect()),
            _ => None,
        }
    }
}

/// How a ggml type packs elements: `block_elems` elements in `block_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlBlockLayout {
    pub ggml_type: u32,
    pub name: &'static str,
    pub block_elems: u64,
    pub block_bytes: u64,
}

const fn layout(
    ggml_type: u32,
    name: &'static str,
    block_elems: u64,
    block_bytes: u64,
) -> GgmlBlockLayout {
    GgmlBlockLayout {
        ggml_type,
        name,
        block_elems,
        block_bytes,
    }
}

/// Block layouts of every ggml type this reader can size, from the block
/// structs of ggml `ggml-common.h` (QK_K = 256) as listed in gguf-py's
/// `GGML_QUANT_SIZES`. Ids 4 and 5 (q4_2, q4_3) were removed from ggml before
/// GGUF existed and have no layout. Ids 31-33 and 36-38 are interleaved
/// repackings of q4_0 / iq4_nl that ggml later dropped; their blocks keep the
/// q4_0 / iq4_nl size, so files holding them can still be sized and listed.
pub const GGML_BLOCK_LAYOUTS: [GgmlBlockLayout; 40] = [
    layout(0, "f32", 1, 4),
    layout(1, "f16", 1, 2),
    layout(2, "q4_0", 32, 18),
    layout(3, "q4_1", 32, 20),
    layout(6, "q5_0", 32, 22),
    layout(7, "q5_1", 32, 24),
    layout(8, "q8_0", 32, 34),
    layout(9, "q8_1", 32, 36),
    layout(10, "q2_k", 256, 84),
    layout(11, "q3_k", 256, 110),
    layout(12, "q4_k", 256, 144),
    layout(13, "q5_k", 256, 176),
    layout(14, "q6_k", 256, 210),
    layout(15, "q8_k", 256, 292),
    layout(16, "iq2_xxs", 256, 66),
    layout(17, "iq2_xs", 256, 74),
    layout(18, "iq3_xxs", 256, 98),
    layout(19, "iq1_s", 256, 50),
    layout(20, "iq4_nl", 32, 18),
    layout(21, "iq3_s", 256, 110),
    layout(22, "iq2_s", 256, 82),
    layout(23, "iq4_xs", 256, 136),
    layout(24, "i8", 1, 1),
    layout(25, "i16", 1, 2),
    layout(26, "i32", 1, 4),
    layout(27, "i64", 1, 8),
    layout(28, "f64", 1, 8),
    layout(29, "iq1_m", 256, 56),
    layout(30, "bf16", 1, 2),
    layout(31, "q4_0_4_4", 32, 18),
    layout(32, "q4_0_4_8", 32, 18),
    layout(33, "q4_0_8_8", 32, 18),
    layout(34, "tq1_0", 256, 54),
    layout(35, "tq2_0", 256, 66),
    layout(36, "iq4_nl_4_4", 32, 18),
    layout(37, "iq4_nl_4_8", 32, 18),
    layout(38, "iq4_nl_8_8", 32, 18),
    layout(39, "mxfp4", 32, 17),
    layout(40, "nvfp4", 64, 36),
    layout(41, "q1_0", 128, 18),
];

/// The block layout of a ggml type id, if known.
pub fn ggml_block_layout(ggml_type: u32) -> Option<GgmlBlockLayout> {
    GGML_BLOCK_LAYOUTS
        .iter()
        .find(|l| l.ggml_type == ggml_type)
        .copied()
}

/// Name of a ggml type id, including ids turbospark cannot compute with.
pub fn ggml_type_name(ggml_type: u32) -> String {
    match ggml_block_layout(ggml_type) {
        Some(l) => l.name.to_string(),
        None => turbospark_core::dtype::ggml_type_name(ggml_type),
    }
}

/// " (name)" for a ggml type id that has a name but no layout here.
fn known_name_suffix(ggml_type: u32) -> String {
    let name = ggml_type_name(ggml_type);
    // The core table calls ids it cannot name "ggml type N".
    if name.starts_with("ggml type") {
        String::new()
    } else {
        format!(" ({name})")
    }
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// ggml type id; see [`GgufTensorInfo::format`] and [`ggml_type_name`].
    pub ggml_type: u32,
    /// Dimensions as stored: `ne[0]` first, the innermost (contiguous) one.
    pub dims: Vec<u64>,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes the tensor occupies, from its type's block layout and its dims.
    pub byte_len: u64,
}

impl GgufTensorInfo {
    /// Row-major shape, outermost dimension first (`dims` reversed).
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// The element format, or `None` for ggml types turbospark does not
    /// compute with (the tensor is still listed and its bytes readable).
    pub fn format(&self) -> Option<QuantFormat> {
        QuantFormat::from_ggml_type(self.ggml_type)
    }

    pub fn type_name(&self) -> String {
        ggml_type_name(self.ggml_type)
    }

    /// Number of elements (saturating; validated headers never saturate).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}

/// A parsed and validated GGUF header.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    by_name: HashMap<String, usize>,
}

impl GgufHeader {
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and of every tensor offset.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata, ordered by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// Tensors in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    fn require(&self, key: &str) -> Result<&GgufValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn wrong_type(key: &str, expected: &'static str, found: &GgufValue) -> GgufError {
        GgufError::WrongValueType {
            key: key.to_string(),
            expected,
            found: found.type_description(),
        }
    }

    /// A string value, or an error naming the key.
    pub fn require_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str()
            .ok_or_else(|| Self::wrong_type(key, "a string", v))
    }

    /// A non-negative integer value of any width, or an error naming the key.
    pub fn require_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| Self::wrong_type(key, "a non-negative integer", v))
    }

    /// A numeric value as f64, or an error naming the key.
    pub fn require_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.require(key)?;
        v.as_f64()
            .ok_or_else(|| Self::wrong_type(key, "a number", v))
    }

    /// An array value, or an error naming the key.
    pub fn require_array(&self, key: &str) -> Result<&GgufArray, GgufError> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| Self::wrong_type(key, "an array", v))
    }
}

/// Bounds-checked little-endian reader over the file bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn truncated(&self, what: String, needed: u64) -> GgufError {
        GgufError::Truncated {
            what,
            offset: self.pos as u64,
            needed,
            available: self.remaining(),
        }
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        let slice = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .and_then(|end| self.bytes.get(self.pos..end));
        match slice {
            Some(slice) => {
                self.pos += slice.len();
                Ok(slice)
            }
            None => Err(self.truncated(what(), n)),
        }
    }

    fn fixed<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.fixed(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.fixed(what).map(u64::from_le_bytes)
    }

    /// Checks that `count` items of at least `min_bytes` each can fit in what
    /// remains, so a corrupt count fails here rather than in an allocation.
    fn check_count(
        &self,
        count: u64,
        min_bytes: u64,
        what: impl FnOnce() -> String,
    ) -> Result<usize, GgufError> {
        let fits = count <= self.remaining() / min_bytes;
        match usize::try_from(count) {
            Ok(n) if fits => Ok(n),
            _ => Err(self.truncated(what(), count.saturating_mul(min_bytes))),
        }
    }

    fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(|| format!("length of {}", what()))?;
        let start = self.pos as u64;
        let bytes = self.take(len, &what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: start + e.valid_up_to() as u64,
            }),
        }
    }
}

fn value_type(id: u32, key: &str) -> Result<GgufValueType, GgufError> {
    GgufValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_string(),
        type_id: id,
    })
}

fn read_value(r: &mut Reader<'_>, ty: GgufValueType, key: &str) -> Result<GgufValue, GgufError> {
    let what = || format!("value of metadata key '{key}'");
    Ok(match ty {
        GgufValueType::U8 => GgufValue::U8(u8::from_le_bytes(r.fixed(what)?)),
        GgufValueType::I8 => GgufValue::I8(i8::from_le_bytes(r.fixed(what)?)),
        GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(r.fixed(what)?)),
        GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(r.fixed(what)?)),
        GgufValueType::U32 => GgufValue::U32(u32::from_le_bytes(r.fixed(what)?)),
        GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(r.fixed(what)?)),
        GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(r.fixed(what)?)),
        GgufValueType::U64 => GgufValue::U64(u64::from_le_bytes(r.fixed(what)?)),
        GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(r.fixed(what)?)),
        GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(r.fixed(what)?)),
        GgufValueType::Bool => {
            let [byte] = r.fixed(what)?;
            GgufValue::Bool(decode_bool(byte, key)?)
        }
        GgufValueType::String => GgufValue::String(r.string(what)?),
        GgufValueType::Array => GgufValue::Array(read_array(r, key, 1)?),
    })
}

fn decode_bool(byte: u8, key: &str) -> Result<bool, GgufError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(GgufError::InvalidBool {
            key: key.to_string(),
            byte,
        }),
    }
}

/// Decodes `N`-byte little-endian elements; `bytes.len()` is a multiple of N.
fn decode_le<T, const N: usize>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            from(a)
        })
        .collect()
}

fn read_array(r: &mut Reader<'_>, key: &str, depth: usize) -> Result<GgufArray, GgufError> {
    if depth > MAX_ARRAY_NESTING {
        return Err(GgufError::ArrayTooDeep {
            key: key.to_string(),
            limit: MAX_ARRAY_NESTING,
        });
    }
    let elem_id = r.u32(|| format!("array element type of metadata key '{key}'"))?;
    let elem = value_type(elem_id, key)?;
    let count = r.u64(|| format!("array length of metadata key '{key}'"))?;
    let what = || {
        let min = elem.min_encoded_bytes();
        format!(
            "array of {count} {elem} values (at least {min} bytes each) of metadata key '{key}'"
        )
    };
    let n = r.check_count(count, elem.min_encoded_bytes(), what)?;

    // Fixed-size elements: one bounds check, then decode the whole run.
    let mut fixed = |size: u64| r.take(count * size, what);
    Ok(match elem {
        GgufValueType::U8 => GgufArray::U8(fixed(1)?.to_vec()),
        GgufValueType::I8 => GgufArray::I8(decode_le(fixed(1)?, i8::from_le_bytes)),
        GgufValueType::U16 => GgufArray::U16(decode_le(fixed(2)?, u16::from_le_bytes)),
        GgufValueType::I16 => GgufArray::I16(decode_le(fixed(2)?, i16::from_le_bytes)),
        GgufValueType::U32 => GgufArray::U32(decode_le(fixed(4)?, u32::from_le_bytes)),
        GgufValueType::I32 => GgufArray::I32(decode_le(fixed(4)?, i32::from_le_bytes)),
        GgufValueType::F32 => GgufArray::F32(decode_le(fixed(4)?, f32::from_le_bytes)),
        GgufValueType::U64 => GgufArray::U64(decode_le(fixed(8)?, u64::from_le_bytes)),
        GgufValueType::I64 => GgufArray::I64(decode_le(fixed(8)?, i64::from_le_bytes)),
        GgufValueType::F64 => GgufArray::F64(decode_le(fixed(8)?, f64::from_le_bytes)),
        GgufValueType::Bool => GgufArray::Bool(
            fixed(1)?
                .iter()
                .map(|&b| decode_bool(b, key))
                .collect::<Result<_, _>>()?,
        ),
        GgufValueType::String => {
            let mut v = Vec::with_capacity(n.min(PREALLOC_LIMIT));
            for i in 0..n {
                v.push(r.string(|| format!("element {i} of metadata key '{key}'"))?);
            }
            GgufArray::String(v)
        }
        GgufValueType::Array => {
            let mut v = Vec::with_capacity(n.min(PREALLOC_LIMIT));
            for _ in 0..n {
                v.push(read_array(r, key, depth + 1)?);
            }
            GgufArray::Array(v)
        }
    })
}

/// A tensor info as read, before its type and bounds are checked.
struct RawTensorInfo {
    name: String,
    ggml_type: u32,
    dims: Vec<u64>,
    offset: u64,
}

/// Parses and validates a GGUF header. `bytes` is the whole file: tensor
/// ranges are checked against its length.
///
/// Never panics; errors name what was wrong and what was expected.
pub fn parse_header(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
    let mut r = Reader { bytes, pos: 0 };

    let magic: [u8; 4] = r.fixed(|| "magic".to_string())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = r.u32(|| "version".to_string())?;
    if !SUPPORTED_VERSIONS.contains(&version) {
        // gguf-py writes the magic as little-endian bytes in every file and
        // the fields after it in the file's byte order, so a big-endian v2/v3
        // file shows a byte-swapped version.
        let swapped = version.swap_bytes();
        if version > 0xffff && SUPPORTED_VERSIONS.contains(&swapped) {
            return Err(GgufError::BigEndian { version: swapped });
        }
        return Err(GgufError::UnsupportedVersion(version));
    }
    let tensor_count = r.u64(|| "tensor count".to_string())?;
    let kv_count = r.u64(|| "metadata entry count".to_string())?;

    let n_kv = r.check_count(kv_count, MIN_KV_BYTES, || {
        format!("{kv_count} metadata entries (at least {MIN_KV_BYTES} bytes each)")
    })?;
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = r.string(|| format!("key of metadata entry {i}"))?;
        let type_id = r.u32(|| format!("value type of metadata key '{key}'"))?;
        let ty = value_type(type_id, &key)?;
        let value = read_value(&mut r, ty, &key)?;
        if metadata.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key });
        }
        metadata.insert(key, value);
    }

    let n_tensors = r.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, || {
        format!("{tensor_count} tensor infos (at least {MIN_TENSOR_INFO_BYTES} bytes each)")
    })?;
    let mut raw = Vec::with_capacity(n_tensors.min(PREALLOC_LIMIT));
    for i in 0..n_tensors {
        let name = r.string(|| format!("name of tensor {i}"))?;
        let n_dims = r.u32(|| format!("dimension count of tensor '{name}'"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                name,
                n_dims,
                max: MAX_DIMS,
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(r.u64(|| format!("dimension {d} of tensor '{name}'"))?);
        }
        let ggml_type = r.u32(|| format!("type of tensor '{name}'"))?;
        let offset = r.u64(|| format!("offset of tensor '{name}'"))?;
        raw.push(RawTensorInfo {
            name,
            ggml_type,
            dims,
            offset,
        });
    }
    let header_end = r.pos as u64;

    let alignment = match metadata.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let value = v.as_u64().ok_or_else(|| GgufError::WrongValueType {
                key: ALIGNMENT_KEY.to_string(),
                expected: "an unsigned integer (u32)",
                found: v.type_description(),
            })?;
            if !value.is_power_of_two() {
                return Err(GgufError::BadAlignment { value });
            }
            value
        }
    };
    let file_len = bytes.len() as u64;
    // A power of two no larger than u64::MAX divides 2^64, so rounding up
    // only overflows for headers ending within `alignment` of 2^64, which no
    // in-memory slice can reach; saturate to keep the function total anyway.
    let data_offset = header_end
        .checked_next_multiple_of(alignment)
        .unwrap_or(u64::MAX);

    let mut tensors = Vec::with_capacity(raw.len());
    let mut by_name = HashMap::with_capacity(raw.len());
    for t in raw {
        let info = validate_tensor(t, alignment, data_offset, file_len)?;
        if by_name.contains_key(&info.name) {
            return Err(GgufError::DuplicateTensor { name: info.name });
        }
        by_name.insert(info.name.clone(), tensors.len());
        tensors.push(info);
    }

    Ok(GgufHeader {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
        by_name,
    })
}

fn validate_tensor(
    t: RawTensorInfo,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<GgufTensorInfo, GgufError> {
    let Some(layout) = ggml_block_layout(t.ggml_type) else {
        return Err(GgufError::UnknownGgmlType {
            name: t.name,
            ggml_type: t.ggml_type,
        });
    };
    let Some(n_elements) = t.dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)) else {
        return Err(GgufError::SizeOverflow {
            name: t.name,
            dims: t.dims,
        });
    };
    let row_len = t.dims.first().copied().unwrap_or(1);
    if row_len % layout.block_elems != 0 {
        return Err(GgufError::PartialBlock {
            name: t.name,
            type_name: layout.name.to_string(),
            row_len,
            block_elems: layout.block_elems,
        });
    }
    let Some(byte_len) = (n_elements / layout.block_elems).checked_mul(layout.block_bytes) else {
        return Err(GgufError::SizeOverflow {
            name: t.name,
            dims: t.dims,
        });
    };
    if t.offset % alignment != 0 {
        return Err(GgufError::MisalignedTensor {
            name: t.name,
            offset: t.offset,
            alignment,
        });
    }
    let end = data_offset
        .checked_add(t.offset)
        .and_then(|start| start.checked_add(byte_len));
    match end {
        Some(end) if end <= file_len => Ok(GgufTensorInfo {
            name: t.name,
            ggml_type: t.ggml_type,
            dims: t.dims,
            offset: t.offset,
            byte_len,
        }),
        _ => Err(GgufError::TensorOutOfBounds {
            name: t.name,
            end: end.unwrap_or(u64::MAX),
            file_len,
        }),
    }
}

/// A GGUF file, memory-mapped, with its validated header.
pub struct GgufFile {
    path: PathBuf,
    header: GgufHeader,
    mmap: Mmap,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("file_len", &self.mmap.len())
            .field("version", &self.header.version)
            .field("tensors", &self.header.tensors.len())
            .finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Maps `path` and validates its header and every tensor's byte range.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io_err = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the mapping is read-only. Its contents are only sound to
        // read while no other process truncates or rewrites the file; model
        // files are treated as immutable while open, which is the standard
        // contract of every mmap-based model loader.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        let header = parse_header(&mmap).map_err(|error| GgufError::InFile {
            path: path.to_path_buf(),
            error: Box::new(error),
        })?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            header,
            mmap,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_len(&self) -> u64 {
        self.mmap.len() as u64
    }

    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    pub fn version(&self) -> u32 {
        self.header.version
    }

    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// All metadata, ordered by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.header.metadata
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.header.get(key)
    }

    /// Tensors in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.header.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.header.tensor(name)
    }

    /// The bytes of a tensor of this file.
    ///
    /// # Panics
    /// If `t` describes a range outside this file, which cannot happen for an
    /// info obtained from this file (its range was validated when opening).
    pub fn tensor_bytes(&self, t: &GgufTensorInfo) -> &[u8] {
        let start = self.header.data_offset + t.offset;
        &self.mmap[start as usize..(start + t.byte_len) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_layouts_agree_with_core_formats_and_names() {
        for f in QuantFormat::ALL {
            let l = ggml_block_layout(f.ggml_type()).expect("every supported format has a layout");
            assert_eq!(l.block_elems, f.block_elems() as u64, "{f}");
            assert_eq!(l.block_bytes, f.block_bytes() as u64, "{f}");
        }
        for l in GGML_BLOCK_LAYOUTS {
            if l.ggml_type < 40 {
                assert_eq!(l.name, turbospark_core::dtype::ggml_type_name(l.ggml_type));
            }
        }
    }

    #[test]
    fn value_type_ids_round_trip() {
        for t in GgufValueType::ALL {
            assert_eq!(GgufValueType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgufValueType::from_id(13), None);
    }
}
