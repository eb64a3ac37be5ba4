//! `manifest.json` and the resident index: the typed description of an
//! install directory (see `docs/FORMAT.md`).

use serde::{Deserialize, Serialize};
use turbospark_core::{ArchSpec, QuantFormat};

/// Version of the install layout this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Alignment of every tensor inside `resident.bin`.
pub const RESIDENT_ALIGN: u64 = 64;
/// Alignment of the per-expert stride in `experts/NNN.bin` (one page, so a
/// `pread` of one expert can use O_DIRECT).
pub const EXPERT_ALIGN: u64 = 4096;

pub const MANIFEST_FILE: &str = "manifest.json";
pub const RESIDENT_FILE: &str = "resident.bin";
pub const RESIDENT_INDEX_FILE: &str = "resident.index.json";
pub const EXPERTS_DIR: &str = "experts";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const GGUF_VOCAB_FILE: &str = "vocab.gguf.json";
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// One tensor in `resident.bin`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: QuantFormat,
    /// Row-major shape, outermost first (`[out, in]` for a projection).
    pub shape: Vec<u64>,
    /// Byte offset in the file (a multiple of [`RESIDENT_ALIGN`]).
    pub offset: u64,
    pub length: u64,
}

/// One part (gate, up, down weights or their biases) of every expert of a layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertPart {
    /// `gate`, `up`, `down`, `gate.bias`, `up.bias` or `down.bias`.
    pub name: String,
    pub dtype: QuantFormat,
    /// Shape of one expert's part (`[intermediate, hidden]` for gate).
    pub shape: Vec<u64>,
    /// Offset inside one expert's record.
    pub offset: u64,
    pub length: u64,
}

/// The routed experts of one MoE layer: expert `e` occupies bytes
/// `[e * stride, e * stride + record_len)` of `file`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertLayer {
    pub layer: usize,
    pub file: String,
    pub num_experts: usize,
    /// Bytes between consecutive experts (a multiple of [`EXPERT_ALIGN`]).
    pub stride: u64,
    pub parts: Vec<ExpertPart>,
}

impl ExpertLayer {
    pub fn part(&self, name: &str) -> Option<&ExpertPart> {
        self.parts.iter().find(|p| p.name == name)
    }
    /// Bytes of one expert's record that hold data (≤ stride).
    pub fn record_len(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| p.offset + p.length)
            .max()
            .unwrap_or(0)
    }
    pub fn file_len(&self) -> u64 {
        self.stride * self.num_experts as u64
    }
}

/// A file of the install with its size and SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// Token ids generation needs, from the source checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationDefaults {
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    /// Whether a BOS token is prepended to a prompt.
    pub add_bos: bool,
}

/// Where the install came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// `gguf` or `hf`.
    pub kind: String,
    /// File or directory name (not the full path).
    pub name: String,
}

/// Formats used by each tensor role (e.g. `attn_q` → `[q4_k, q6_k]`).
pub type RoleQuant = std::collections::BTreeMap<String, Vec<QuantFormat>>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub arch: ArchSpec,
    pub source: SourceInfo,
    pub quant: RoleQuant,
    pub resident_file: String,
    pub resident_index: String,
    pub resident_bytes: u64,
    pub experts: Vec<ExpertLayer>,
    /// `tokenizer.json` (HF) or `vocab.gguf.json` (GGUF vocabulary), if any.
    pub tokenizer: Option<String>,
    pub chat_template: Option<String>,
    pub generation: GenerationDefaults,
    /// Every other file of the install with its size and hash.
    pub files: Vec<FileEntry>,
    /// Parts of the source that are not the language model (vision or
    /// audio towers, projectors, multi-token-prediction layers) and were
    /// left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedSource>,
}

/// A part of the source checkpoint that convert left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedSource {
    /// `vision tower`, `audio tower`, `multimodal projector` or
    /// `multi-token prediction layers`.
    pub part: String,
    pub tensors: usize,
    pub bytes: u64,
}

impl Manifest {
    pub fn expert_layer(&self, layer: usize) -> Option<&ExpertLayer> {
        self.experts.iter().find(|e| e.layer == layer)
    }
    /// Total bytes of all expert files.
    pub fn expert_bytes(&self) -> u64 {
        self.experts.iter().map(ExpertLayer::file_len).sum()
    }
    /// Memory for `slots` expert slots in every MoE layer, plus the resident
    /// weights: what the streamed mode needs for weights.
    pub fn memory_for_slots(&self, slots: usize) -> u64 {
        self.resident_bytes
            + self
                .experts
                .iter()
                .map(|e| e.stride * slots.min(e.num_experts) as u64)
                .sum::<u64>()
    }
}

/// `resident.index.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResidentIndex {
    pub tensors: Vec<TensorEntry>,
}

/// Rounds `n` up to a multiple of `align` (a power of two).
pub const fn align_up(n: u64, align: u64) -> u64 {
    (n + align - 1) & !(align - 1)
}
