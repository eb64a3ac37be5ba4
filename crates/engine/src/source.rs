//! Where a model's weights come from: an install directory (memory-mapped,
//! no copy) or any other [`WeightSource`] (tests build random ones).

use crate::EngineError;
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use turbospark_backend::host::ByteOwner;
use turbospark_backend::{HostTensor, SharedBytes};
use turbospark_format::install::{ExpertLayer, Install};

/// Named tensors by their canonical install names.
pub trait WeightSource {
    /// A resident tensor (`blk.3.attn_q.weight`).
    fn resident(&self, name: &str) -> Result<HostTensor, EngineError>;
    /// Part `part` (`gate`, `up`, `down`, `gate.bias`, …) of routed expert
    /// `expert` of MoE layer `layer`.
    fn expert_part(
        &self,
        layer: usize,
        expert: usize,
        part: &str,
    ) -> Result<HostTensor, EngineError>;
    /// Tells the source that the device keeps its own copy of resident
    /// tensor `name`: a source that maps its file may drop the tensor's
    /// pages from memory (a later read maps them again). Advice only.
    fn release_resident(&self, _name: &str) {}
}

fn map_file(path: &Path) -> Result<ByteOwner, EngineError> {
    let io = |source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() == 0 {
        return Ok(Arc::new(Vec::<u8>::new()));
    }
    // SAFETY: the file is opened read-only and an install is immutable while
    // open (convert writes a new directory and renames it into place; verify
    // only reads), so the mapping does not change underneath us.
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    Ok(Arc::new(map))
}

/// How an [`InstallSource`] holds the expert files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertBacking {
    /// Memory-mapped.
    Mapped,
    /// Read into memory.
    Read,
    /// Not opened (the experts are streamed by the session).
    Absent,
}

/// The weights of an opened [`Install`], read from a memory map of
/// `resident.bin` and from the `experts/NNN.bin` files as
/// [`ExpertBacking`] says.
pub struct InstallSource<'a> {
    install: &'a Install,
    resident: ByteOwner,
    experts: HashMap<usize, (&'a ExpertLayer, ByteOwner)>,
}

impl<'a> InstallSource<'a> {
    /// Every file memory-mapped.
    pub fn new(install: &'a Install) -> Result<Self, EngineError> {
        Self::with_experts(install, ExpertBacking::Mapped)
    }

    /// `resident.bin` as the install maps it, the expert files held as `backing`
    /// says. A file shorter than its manifest entry is an error.
    pub fn with_experts(install: &'a Install, backing: ExpertBacking) -> Result<Self, EngineError> {
        // The install's own map of resident.bin, not a second one.
        let resident: ByteOwner = match install.resident_map() {
            Some(map) => map,
            None => Arc::new(Vec::<u8>::new()),
        };
        let mut experts = HashMap::new();
        for layer in &install.manifest.experts {
            let path = install.expert_path(layer);
            let bytes: ByteOwner = match backing {
                ExpertBacking::Mapped => map_file(&path)?,
                ExpertBacking::Read => {
                    Arc::new(std::fs::read(&path).map_err(|source| EngineError::Io {
                        path: path.clone(),
                        source,
                    })?)
                }
                ExpertBacking::Absent => continue,
            };
            crate::experts::check_length(&path, (*bytes).as_ref().len() as u64, layer)?;
            experts.insert(layer.layer, (layer, bytes));
        }
        Ok(InstallSource {
            install,
            resident,
            experts,
        })
    }
}

fn range(offset: u64, length: u64) -> std::ops::Range<usize> {
    offset as usize..(offset + length) as usize
}

impl WeightSource for InstallSource<'_> {
    fn release_resident(&self, name: &str) {
        if let Some((entry, _)) = self.install.tensor(name) {
            // Advice only: failing to give it costs memory, not correctness.
            let _ = self
                .install
                .release_resident_range(entry.offset as usize, entry.length as usize);
        }
    }

    fn resident(&self, name: &str) -> Result<HostTensor, EngineError> {
        let (entry, _) = self
            .install
            .tensor(name)
            .ok_or_else(|| EngineError::MissingTensor { name: name.into() })?;
        Ok(HostTensor {
            name: name.to_string(),
            format: entry.dtype,
            shape: entry.shape.iter().map(|&d| d as usize).collect(),
            bytes: SharedBytes::new(
                Arc::clone(&self.resident),
                range(entry.offset, entry.length),
            )?,
        })
    }

    fn expert_part(
        &self,
        layer: usize,
        expert: usize,
        part: &str,
    ) -> Result<HostTensor, EngineError> {
        let name = || format!("blk.{layer}.experts.{expert}.{part}");
        let (el, bytes) = self
            .experts
            .get(&layer)
            .ok_or_else(|| EngineError::MissingTensor { name: name() })?;
        let p = el
            .part(part)
            .filter(|_| expert < el.num_experts)
            .ok_or_else(|| EngineError::MissingTensor { name: name() })?;
        let start = expert as u64 * el.stride + p.offset;
        Ok(HostTensor {
            name: name(),
            format: p.dtype,
            shape: p.shape.iter().map(|&d| d as usize).collect(),
            bytes: SharedBytes::new(Arc::clone(bytes), range(start, p.length))?,
        })
    }
}
