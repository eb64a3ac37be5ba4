//! Hand-written GGUF and safetensors encoders for tests and the header
//! fuzzer. They follow the format descriptions directly and share no code
//! with the readers, so a reader bug is not mirrored here.
//!
//! Several test targets and an example include this module, each using part
//! of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// GGUF metadata value type ids (ggml `gguf_type`).
pub mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// ggml tensor type ids used by the tests.
pub mod ggml {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q8_0: u32 = 8;
    pub const Q2_K: u32 = 10;
}

/// A metadata value to encode.
#[derive(Debug, Clone)]
pub enum V {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Element type id and elements (encoded without their own type tags).
    Arr(u32, Vec<V>),
    U64(u64),
    I64(i64),
    F64(f64),
    /// Any type id followed by raw bytes, for malformed values.
    Raw(u32, Vec<u8>),
}

impl V {
    pub fn str(s: &str) -> V {
        V::Str(s.to_string())
    }

    pub fn type_id(&self) -> u32 {
        match self {
            V::U8(_) => ty::U8,
            V::I8(_) => ty::I8,
            V::U16(_) => ty::U16,
            V::I16(_) => ty::I16,
            V::U32(_) => ty::U32,
            V::I32(_) => ty::I32,
            V::F32(_) => ty::F32,
            V::Bool(_) => ty::BOOL,
            V::Str(_) => ty::STRING,
            V::Arr(..) => ty::ARRAY,
            V::U64(_) => ty::U64,
            V::I64(_) => ty::I64,
            V::F64(_) => ty::F64,
            V::Raw(t, _) => *t,
        }
    }

    fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            V::U8(v) => out.push(*v),
            V::I8(v) => out.extend(v.to_le_bytes()),
            V::U16(v) => out.extend(v.to_le_bytes()),
            V::I16(v) => out.extend(v.to_le_bytes()),
            V::U32(v) => out.extend(v.to_le_bytes()),
            V::I32(v) => out.extend(v.to_le_bytes()),
            V::F32(v) => out.extend(v.to_le_bytes()),
            V::Bool(v) => out.push(u8::from(*v)),
            V::Str(s) => put_str(out, s),
            V::Arr(elem, items) => {
                out.extend(elem.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    item.encode_body(out);
                }
            }
            V::U64(v) => out.extend(v.to_le_bytes()),
            V::I64(v) => out.extend(v.to_le_bytes()),
            V::F64(v) => out.extend(v.to_le_bytes()),
            V::Raw(_, bytes) => out.extend(bytes),
        }
    }
}

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A tensor to place in the data section.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub ggml_type: u32,
    /// As stored: innermost first.
    pub dims: Vec<u64>,
    pub data: Vec<u8>,
    /// Written instead of the computed offset, for malformed files.
    pub offset_override: Option<u64>,
}

impl TensorSpec {
    pub fn new(name: &str, ggml_type: u32, dims: &[u64], data: Vec<u8>) -> Self {
        TensorSpec {
            name: name.to_string(),
            ggml_type,
            dims: dims.to_vec(),
            data,
            offset_override: None,
        }
    }
}

/// Builds a GGUF file: header, padding to `alignment`, then each tensor's
/// data padded to `alignment`; the file ends with the last tensor's bytes.
#[derive(Debug, Clone)]
pub struct GgufBuilder {
    pub version: u32,
    pub alignment: u64,
    pub kvs: Vec<(String, V)>,
    pub tensors: Vec<TensorSpec>,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        GgufBuilder {
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    while out.len() as u64 % alignment != 0 {
        out.push(0);
    }
}

impl GgufBuilder {
    pub fn kv(mut self, key: &str, v: V) -> Self {
        self.kvs.push((key.to_string(), v));
        self
    }

    /// Sets `general.alignment` (u32) and lays the file out with it.
    pub fn alignment(mut self, alignment: u32) -> Self {
        self.alignment = u64::from(alignment);
        self.kv("general.alignment", V::U32(alignment))
    }

    pub fn tensor(mut self, t: TensorSpec) -> Self {
        self.tensors.push(t);
        self
    }

    /// Offsets, relative to the data section, the builder assigns.
    pub fn offsets(&self) -> Vec<u64> {
        let mut offsets = Vec::new();
        let mut at = 0u64;
        for t in &self.tensors {
            offsets.push(at);
            at += t.data.len() as u64;
            at = at.div_ceil(self.alignment) * self.alignment;
        }
        offsets
    }

    pub fn build(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (key, v) in &self.kvs {
            put_str(&mut out, key);
            out.extend(v.type_id().to_le_bytes());
            v.encode_body(&mut out);
        }
        let offsets = self.offsets();
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ggml_type.to_le_bytes());
            out.extend(t.offset_override.unwrap_or(offset).to_le_bytes());
        }
        if !self.tensors.is_empty() {
            pad_to(&mut out, self.alignment);
        }
        let data_start = out.len();
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            out.resize(data_start + offset as usize, 0);
            out.extend(&t.data);
        }
        out
    }
}

/// A small valid GGUF using several value types and tensor types.
pub fn sample_gguf() -> Vec<u8> {
    GgufBuilder::default()
        .kv("general.architecture", V::str("llama"))
        .kv("llama.block_count", V::U32(2))
        .kv("llama.rope.freq_base", V::F32(10000.0))
        .kv("flag", V::Bool(true))
        .kv(
            "tokenizer.ggml.tokens",
            V::Arr(ty::STRING, vec![V::str("<s>"), V::str("a"), V::str("b")]),
        )
        .kv(
            "nested",
            V::Arr(
                ty::ARRAY,
                vec![
                    V::Arr(ty::I32, vec![V::I32(1), V::I32(-2)]),
                    V::Arr(ty::U8, vec![]),
                ],
            ),
        )
        .tensor(TensorSpec::new(
            "token_embd.weight",
            ggml::F32,
            &[4, 3],
            vec![1; 48],
        ))
        .tensor(TensorSpec::new(
            "blk.0.ffn_down.weight",
            ggml::Q8_0,
            &[32, 2],
            vec![2; 68],
        ))
        .tensor(TensorSpec::new(
            "output_norm.weight",
            ggml::F16,
            &[4],
            vec![3; 8],
        ))
        .build()
}

/// One tensor for [`safetensors_bytes`]: name, dtype name, shape, data.
pub struct StSpec<'a> {
    pub name: &'a str,
    pub dtype: &'a str,
    pub shape: &'a [u64],
    pub data: &'a [u8],
}

/// Encodes a safetensors file: tensors laid out back to back in the given
/// order, header padded with spaces to a multiple of 8 as the reference
/// writer does.
pub fn safetensors_bytes(tensors: &[StSpec<'_>], metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let meta: serde_json::Map<String, serde_json::Value> = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        header.insert("__metadata__".to_string(), meta.into());
    }
    let mut at = 0u64;
    for t in tensors {
        let end = at + t.data.len() as u64;
        header.insert(
            t.name.to_string(),
            serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [at, end]}),
        );
        at = end;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap_or_default();
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    raw_safetensors(
        &json,
        &tensors
            .iter()
            .flat_map(|t| t.data.iter().copied())
            .collect::<Vec<_>>(),
    )
}

/// A safetensors file from a literal JSON header and data.
pub fn raw_safetensors(json: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend((json.len() as u64).to_le_bytes());
    out.extend(json);
    out.extend(data);
    out
}

/// A small valid safetensors file with a metadata block.
pub fn sample_safetensors() -> Vec<u8> {
    safetensors_bytes(
        &[
            StSpec {
                name: "model.embed_tokens.weight",
                dtype: "BF16",
                shape: &[3, 2],
                data: &[7; 12],
            },
            StSpec {
                name: "model.norm.weight",
                dtype: "F32",
                shape: &[2],
                data: &[8; 8],
            },
            StSpec {
                name: "blocks",
                dtype: "U8",
                shape: &[2, 3],
                data: &[9; 6],
            },
        ],
        &[("format", "pt")],
    )
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "turbospark-format-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `bytes` to `name` inside the directory and returns its path.
    pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
