//! A conversion source: one GGUF file, or an HF directory of safetensors
//! shards with its `config.json`, behind one tensor-listing interface.

use super::hf_names::{map_hf_name, SkippedPart, Target};
use crate::error::{FormatError, IoContext};
use crate::families;
use crate::gguf::{GgufFile, GgufValue};
use crate::identity::canonical_from_gguf;
use crate::install::SourceInfo;
use crate::roles::GGUF_EXPERT_STACKS;
use crate::safetensors::{SafetensorsCheckpoint, StDtype};
use crate::spec::gguf::{spec_from_gguf, GgufMeta};
use crate::spec::hf::spec_from_hf_config;
use std::path::{Path, PathBuf};
use turbospark_core::{ArchSpec, QuantFormat};

/// What kind of source a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Gguf,
    HfDir,
}

/// Detects a GGUF file (by magic) or an HF directory (by `config.json`).
pub fn detect_source_kind(path: &Path) -> Result<SourceKind, FormatError> {
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return Ok(SourceKind::HfDir);
        }
        return Err(FormatError::UnknownSource {
            path: path.to_path_buf(),
        });
    }
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(path).at(path)?;
    use std::io::Read;
    if f.read(&mut magic).at(path)? == 4 && &magic == b"GGUF" {
        return Ok(SourceKind::Gguf);
    }
    Err(FormatError::UnknownSource {
        path: path.to_path_buf(),
    })
}

pub(crate) enum Source {
    Gguf(GgufFile),
    Hf {
        dir: PathBuf,
        config: serde_json::Value,
        ckpt: SafetensorsCheckpoint,
    },
}

/// Element type of a source tensor.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SrcKind {
    Ggml(u32),
    St(StDtype),
}

pub(crate) struct SrcTensor<'a> {
    pub name: &'a str,
    pub shape: Vec<u64>,
    pub bytes: &'a [u8],
    pub kind: SrcKind,
}

impl SrcTensor<'_> {
    /// The tensor's format, or an error naming its unsupported type.
    pub fn format(&self) -> Result<QuantFormat, FormatError> {
        let unsupported = |dtype: String| FormatError::UnsupportedDtype {
            tensor: self.name.to_string(),
            dtype,
        };
        match self.kind {
            SrcKind::Ggml(id) => QuantFormat::from_ggml_type(id)
                .ok_or_else(|| unsupported(turbospark_core::dtype::ggml_type_name(id))),
            SrcKind::St(StDtype::F32) => Ok(QuantFormat::F32),
            SrcKind::St(StDtype::F16) => Ok(QuantFormat::F16),
            SrcKind::St(StDtype::Bf16) => Ok(QuantFormat::Bf16),
            SrcKind::St(other) => Err(unsupported(format!("{other:?}"))),
        }
    }
}

impl GgufMeta for GgufFile {
    fn meta_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(GgufValue::as_u64)
    }
    fn meta_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(GgufValue::as_f64)
    }
    fn meta_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(GgufValue::as_str)
    }
    fn meta_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(GgufValue::as_bool)
    }
    fn meta_array_len(&self, key: &str) -> Option<usize> {
        self.get(key).and_then(GgufValue::as_array).map(|a| a.len())
    }
    fn meta_u64s(&self, key: &str) -> Option<Vec<u64>> {
        self.get(key)
            .and_then(GgufValue::as_array)
            .and_then(|a| a.to_u64_vec())
    }
    fn meta_bools(&self, key: &str) -> Option<Vec<bool>> {
        match self.get(key).and_then(GgufValue::as_array)? {
            crate::gguf::GgufArray::Bool(v) => Some(v.clone()),
            _ => None,
        }
    }
    fn has_tensor(&self, name: &str) -> bool {
        self.tensor(name).is_some()
    }
    fn tensor_f32s(&self, name: &str) -> Option<Vec<f32>> {
        let t = self.tensor(name)?;
        if t.format() != Some(QuantFormat::F32) {
            return None;
        }
        Some(
            self.tensor_bytes(t)
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }
}

/// GGUF tensor names are canonical (but for the family's renames in the
/// identity table); routed experts are the `ffn_{gate,up,down}_exps`
/// tensors stacked over experts, or `ffn_gate_up_exps` with gate and up
/// fused (gate rows first, as llama.cpp's `build_moe_ffn` splits it).
/// `rope_freqs.weight` is part of the spec when the spec consumed it
/// (Gemma 4's proportional rope); layers past the decoder stack are
/// multi-token-prediction layers (llama.cpp's `nextn_predict_layers`).
fn map_gguf_name(spec: &ArchSpec, name: &str) -> Option<Target> {
    /// llama.cpp's 3-D per-head matrices `[heads, rows, cols]` (the split
    /// `kv_b` of DeepSeek's latent attention), stored as `[heads · rows,
    /// cols]`.
    const GGUF_PER_HEAD_STACKS: &[&str] = &["attn_k_b.weight", "attn_v_b.weight"];
    if name == "rope_freqs.weight" {
        let consumed = spec.layers.iter().any(|l| {
            matches!(
                l.rope.map(|r| r.scaling),
                Some(turbospark_core::arch::RopeScaling::Proportional { .. })
            )
        });
        return consumed.then_some(Target::Ignored);
    }
    let name = canonical_from_gguf(&spec.family, name);
    let Some(rest) = name.strip_prefix("blk.") else {
        return Some(Target::Resident(name));
    };
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if layer >= spec.num_layers() {
        return families::get(&spec.family)
            .is_some_and(|d| d.extra_layers_are_mtp)
            .then_some(Target::Skipped(SkippedPart::MultiTokenPrediction));
    }
    if tail == "ffn_gate_up_exps.weight" {
        return Some(Target::ExpertGateUpHalves { layer });
    }
    if GGUF_PER_HEAD_STACKS.contains(&tail) {
        return Some(Target::ResidentRowsStacked(name.clone()));
    }
    match GGUF_EXPERT_STACKS.iter().find(|(_, stack)| *stack == tail) {
        Some(&(part, _)) => Some(Target::ExpertStack { layer, part }),
        None => Some(Target::Resident(name.clone())),
    }
}

impl Source {
    pub fn open(path: &Path) -> Result<Source, FormatError> {
        match detect_source_kind(path)? {
            SourceKind::Gguf => Ok(Source::Gguf(GgufFile::open(path)?)),
            SourceKind::HfDir => {
                let cpath = path.join("config.json");
                let text = std::fs::read(&cpath).at(&cpath)?;
                let config = serde_json::from_slice(&text).map_err(|e| FormatError::Json {
                    path: cpath,
                    detail: e.to_string(),
                })?;
                Ok(Source::Hf {
                    dir: path.to_path_buf(),
                    config,
                    ckpt: SafetensorsCheckpoint::open_dir(path)?,
                })
            }
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Source::Gguf(g) => g.path(),
            Source::Hf { dir, .. } => dir,
        }
    }

    pub fn spec(&self) -> Result<ArchSpec, FormatError> {
        let r = match self {
            Source::Gguf(g) => spec_from_gguf(g),
            Source::Hf { config, .. } => spec_from_hf_config(config),
        };
        r.map_err(|source| FormatError::Spec {
            path: self.path().to_path_buf(),
            source,
        })
    }

    pub fn info(&self) -> SourceInfo {
        let name = self
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let kind = match self {
            Source::Gguf(_) => "gguf",
            Source::Hf { .. } => "hf",
        };
        SourceInfo {
            kind: kind.into(),
            name,
        }
    }

    /// Every tensor name, in a stable order.
    pub fn tensor_names(&self) -> Vec<String> {
        match self {
            Source::Gguf(g) => g.tensors().iter().map(|t| t.name.clone()).collect(),
            Source::Hf { ckpt, .. } => ckpt.tensors().map(|t| t.name.clone()).collect(),
        }
    }

    /// Where the tensor `name` goes in an install of `spec`, this source's
    /// spec (`None`: nowhere the family knows).
    pub fn map_name(&self, spec: &ArchSpec, name: &str) -> Option<Target> {
        match self {
            Source::Gguf(_) => map_gguf_name(spec, name),
            Source::Hf { .. } => map_hf_name(families::get(&spec.family)?, name, spec.num_layers()),
        }
    }

    pub fn tensor(&self, name: &str) -> Result<SrcTensor<'_>, FormatError> {
        let missing = || FormatError::MissingTensor {
            tensor: name.to_string(),
            family: "source".into(),
        };
        match self {
            Source::Gguf(g) => {
                let t = g.tensor(name).ok_or_else(missing)?;
                Ok(SrcTensor {
                    name: &t.name,
                    shape: t.shape(),
                    bytes: g.tensor_bytes(t),
                    kind: SrcKind::Ggml(t.ggml_type),
                })
            }
            Source::Hf { ckpt, .. } => {
                let t = ckpt.tensor(name).ok_or_else(missing)?;
                Ok(SrcTensor {
                    name: &t.name,
                    shape: t.shape.clone(),
                    bytes: ckpt.tensor_bytes(t),
                    kind: SrcKind::St(t.dtype),
                })
            }
        }
    }

    /// Drops the pages of a tensor already written, so a conversion's
    /// resident memory stays near one tensor rather than the whole model.
    pub fn release(&self, name: &str) {
        if let Ok(t) = self.tensor(name) {
            release_pages(t.bytes);
        }
    }
}

/// Advises the kernel that the whole pages inside `bytes` (part of a
/// read-only file mapping) are no longer needed.
pub(crate) fn release_pages(bytes: &[u8]) {
    const PAGE: usize = 4096;
    let start = bytes.as_ptr() as usize;
    let first = start.div_ceil(PAGE) * PAGE;
    let end = (start + bytes.len()) / PAGE * PAGE;
    if end > first {
        // SAFETY: [first, end) lies inside `bytes`, which belongs to a
        // read-only, file-backed mapping owned by this source. MADV_DONTNEED
        // on such a mapping only drops cached pages; a later read faults the
        // same file contents back in, so no reference observes a change.
        unsafe {
            libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_DONTNEED);
        }
    }
}
