//! Opening an install: the manifest and index are parsed and checked against
//! each other, the architecture and the files on disk before any weight is
//! used, and `resident.bin` is memory-mapped.

use super::manifest::*;
use crate::error::{FormatError, IoContext};
use crate::families;
use crate::roles::{expected_expert_parts, expected_resident};
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An opened, validated install.
pub struct Install {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub index: ResidentIndex,
    by_name: HashMap<String, usize>,
    /// `resident.bin`, mapped once and shared with whoever runs the model.
    resident: Option<Arc<Mmap>>,
}

fn bad(path: &Path, detail: impl Into<String>) -> FormatError {
    FormatError::BadInstall {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, FormatError> {
    let bytes = std::fs::read(path).at(path)?;
    serde_json::from_slice(&bytes).map_err(|e| FormatError::Json {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

/// Reads only `manifest.json` (for `inspect` and `verify`).
pub fn read_manifest(dir: &Path) -> Result<Manifest, FormatError> {
    let mpath = dir.join(MANIFEST_FILE);
    if !mpath.is_file() {
        return Err(bad(dir, "not an install: manifest.json is missing"));
    }
    let raw: serde_json::Value = read_json(&mpath)?;
    let version = raw
        .get("format_version")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| bad(&mpath, "format_version is missing"))?;
    if version != FORMAT_VERSION as u64 {
        return Err(FormatError::VersionMismatch {
            path: mpath,
            found: version as u32,
            expected: FORMAT_VERSION,
        });
    }
    let manifest: Manifest = serde_json::from_value(raw).map_err(|e| FormatError::Json {
        path: mpath.clone(),
        detail: e.to_string(),
    })?;
    let family = &manifest.arch.family;
    if families::get(family).is_none() {
        return Err(bad(
            &mpath,
            format!(
                "family {:?} is not one this build knows ({})",
                family.id(),
                families::known_ids()
            ),
        ));
    }
    Ok(manifest)
}

impl Install {
    /// Opens and validates the install at `dir`.
    pub fn open(dir: &Path) -> Result<Install, FormatError> {
        let manifest = read_manifest(dir)?;
        let mpath = dir.join(MANIFEST_FILE);
        manifest
            .arch
            .validate()
            .map_err(|e| bad(&mpath, format!("architecture: {e}")))?;
        let ipath = dir.join(&manifest.resident_index);
        let index: ResidentIndex = read_json(&ipath)?;
        let rpath = dir.join(&manifest.resident_file);
        let file = File::open(&rpath).at(&rpath)?;
        let file_len = file.metadata().at(&rpath)?.len();
        if file_len != manifest.resident_bytes {
            return Err(bad(
                &rpath,
                format!(
                    "{file_len} bytes on disk, the manifest says {}",
                    manifest.resident_bytes
                ),
            ));
        }
        let mut by_name = HashMap::new();
        for (i, t) in index.tensors.iter().enumerate() {
            let elems = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let want = elems.and_then(|n| t.dtype.bytes_for(n));
            if want != Some(t.length) {
                return Err(bad(
                    &ipath,
                    format!(
                        "tensor {}: {} bytes recorded for {:?} {}",
                        t.name, t.length, t.shape, t.dtype
                    ),
                ));
            }
            let end = t.offset.checked_add(t.length);
            if t.offset % RESIDENT_ALIGN != 0 || end.is_none_or(|e| e > file_len) {
                return Err(bad(
                    &ipath,
                    format!(
                        "tensor {} at [{}, +{}) lies outside resident.bin ({file_len} bytes) or is misaligned",
                        t.name, t.offset, t.length
                    ),
                ));
            }
            if by_name.insert(t.name.clone(), i).is_some() {
                return Err(bad(&ipath, format!("tensor {} listed twice", t.name)));
            }
        }
        for want in expected_resident(&manifest.arch) {
            let t = by_name
                .get(&want.name)
                .map(|&i| &index.tensors[i])
                .ok_or_else(|| bad(&ipath, format!("tensor {} is missing", want.name)))?;
            if t.shape != want.shape {
                return Err(FormatError::ShapeMismatch {
                    tensor: want.name,
                    expected: want.shape,
                    found: t.shape.clone(),
                    family: families::name(&manifest.arch.family).to_string(),
                });
            }
        }
        for want in expected_expert_parts(&manifest.arch) {
            let layer = manifest
                .expert_layer(want.layer)
                .ok_or_else(|| bad(&mpath, format!("layer {} has no expert file", want.layer)))?;
            let part = layer.part(want.part).ok_or_else(|| {
                bad(
                    &mpath,
                    format!("layer {} experts lack part {}", want.layer, want.part),
                )
            })?;
            if part.shape != want.shape {
                return Err(FormatError::ShapeMismatch {
                    tensor: format!("blk.{}.experts.{}", want.layer, want.part),
                    expected: want.shape,
                    found: part.shape.clone(),
                    family: families::name(&manifest.arch.family).to_string(),
                });
            }
        }
        for layer in &manifest.experts {
            let epath = dir.join(&layer.file);
            let len = std::fs::metadata(&epath).at(&epath)?.len();
            if len != layer.file_len() || layer.record_len() > layer.stride {
                return Err(bad(
                    &epath,
                    format!(
                        "{len} bytes on disk, expected {} ({} experts × stride {})",
                        layer.file_len(),
                        layer.num_experts,
                        layer.stride
                    ),
                ));
            }
        }
        // SAFETY: the file is opened read-only; the install is treated as
        // immutable while open (verify re-hashes it; convert never writes in
        // place), so the mapping is not changed underneath us.
        let resident = if file_len == 0 {
            None
        } else {
            Some(Arc::new(unsafe { Mmap::map(&file) }.at(&rpath)?))
        };
        Ok(Install {
            dir: dir.to_path_buf(),
            manifest,
            index,
            by_name,
            resident,
        })
    }

    /// A resident tensor's entry and bytes.
    pub fn tensor(&self, name: &str) -> Option<(&TensorEntry, &[u8])> {
        let t = &self.index.tensors[*self.by_name.get(name)?];
        let data: &[u8] = self.resident.as_ref().map_or(&[], |m| &m[..]);
        Some((t, &data[t.offset as usize..(t.offset + t.length) as usize]))
    }

    /// The memory map of `resident.bin` (`None` for an empty file), shared:
    /// tensors borrowed from it stay valid while any clone lives.
    pub fn resident_map(&self) -> Option<Arc<Mmap>> {
        self.resident.clone()
    }

    /// Drops the pages of `resident.bin`'s memory map from this process's
    /// resident set (they stay in the page cache, and a later read maps
    /// them again). For callers that copied the weights they need, so that
    /// the mapping no longer counts twice in the memory a process holds.
    pub fn release_resident_pages(&self) -> std::io::Result<()> {
        match &self.resident {
            // SAFETY: the map is a read-only private file mapping, so
            // dropping its pages loses nothing: any later access reads the
            // same bytes from the file again. No reference into the map is
            // invalidated (the addresses stay mapped).
            Some(map) => unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) },
            None => Ok(()),
        }
    }

    /// As [`Install::release_resident_pages`], for the whole pages inside
    /// bytes `offset .. offset + len` of `resident.bin` only (pages shared
    /// with neighbouring tensors stay).
    pub fn release_resident_range(&self, offset: usize, len: usize) -> std::io::Result<()> {
        let Some(map) = &self.resident else {
            return Ok(());
        };
        const PAGE: usize = 4096;
        let end = offset.saturating_add(len).min(map.len()) / PAGE * PAGE;
        let start = offset.next_multiple_of(PAGE);
        if start >= end {
            return Ok(());
        }
        // SAFETY: as in `release_resident_pages`; the range lies inside the
        // map (clamped above).
        unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        }
    }

    /// Path of a layer's expert file.
    pub fn expert_path(&self, layer: &ExpertLayer) -> PathBuf {
        self.dir.join(&layer.file)
    }
}
