//! Writing an install directory atomically.
//!
//! Everything is written into a hidden sibling directory
//! (`.<name>.partial-<pid>`) that never contains `manifest.json` until the
//! very end; [`InstallWriter::finish`] hashes every file, writes the
//! manifest and renames the directory into place. A failed or dropped writer
//! removes its temporary directory, so no half-written install is left.

use super::manifest::*;
use crate::error::{FormatError, IoContext};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use turbospark_core::QuantFormat;

/// What the caller knows when the data has been written.
pub struct ManifestParts {
    pub arch: turbospark_core::ArchSpec,
    pub source: SourceInfo,
    pub tokenizer: Option<String>,
    pub chat_template: Option<String>,
    pub generation: GenerationDefaults,
    pub skipped: Vec<SkippedSource>,
}

pub struct InstallWriter {
    final_dir: PathBuf,
    tmp_dir: PathBuf,
    force: bool,
    resident: BufWriter<File>,
    resident_pos: u64,
    index: Vec<TensorEntry>,
    experts: BTreeMap<usize, (ExpertLayer, File)>,
    extra_files: Vec<String>,
    finished: bool,
}

fn zeros(w: &mut impl Write, n: u64, path: &Path) -> Result<(), FormatError> {
    const Z: [u8; 4096] = [0; 4096];
    let mut left = n;
    while left > 0 {
        let k = left.min(Z.len() as u64) as usize;
        w.write_all(&Z[..k]).at(path)?;
        left -= k as u64;
    }
    Ok(())
}

impl InstallWriter {
    /// Starts an install at `dst`. Fails when `dst` exists and `force` is off.
    pub fn create(dst: &Path, force: bool) -> Result<Self, FormatError> {
        if dst.exists() && !force {
            return Err(FormatError::DestinationExists {
                path: dst.to_path_buf(),
            });
        }
        let name = dst
            .file_name()
            .ok_or_else(|| FormatError::BadInstall {
                path: dst.to_path_buf(),
                detail: "destination has no directory name".into(),
            })?
            .to_string_lossy()
            .into_owned();
        let parent = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).at(&parent)?;
        remove_stale_partials(&parent, &name);
        let tmp_dir = parent.join(format!(".{name}.partial-{}", std::process::id()));
        if tmp_dir.exists() {
            fs::remove_dir_all(&tmp_dir).at(&tmp_dir)?;
        }
        fs::create_dir_all(&tmp_dir).at(&tmp_dir)?;
        let rpath = tmp_dir.join(RESIDENT_FILE);
        let resident = BufWriter::with_capacity(1 << 20, File::create(&rpath).at(&rpath)?);
        Ok(InstallWriter {
            final_dir: dst.to_path_buf(),
            tmp_dir,
            force,
            resident,
            resident_pos: 0,
            index: Vec::new(),
            experts: BTreeMap::new(),
            extra_files: Vec::new(),
            finished: false,
        })
    }

    /// Appends a resident tensor whose bytes arrive in pieces from `fill`,
    /// which must write exactly `length` bytes.
    pub fn add_resident_with(
        &mut self,
        name: &str,
        dtype: QuantFormat,
        shape: Vec<u64>,
        length: u64,
        fill: impl FnOnce(&mut dyn Write) -> Result<(), FormatError>,
    ) -> Result<(), FormatError> {
        let path = self.tmp_dir.join(RESIDENT_FILE);
        let aligned = align_up(self.resident_pos, RESIDENT_ALIGN);
        zeros(&mut self.resident, aligned - self.resident_pos, &path)?;
        let mut counter = CountingWriter {
            inner: &mut self.resident,
            written: 0,
        };
        fill(&mut counter)?;
        if counter.written != length {
            return Err(FormatError::BadTensor {
                tensor: name.to_string(),
                detail: format!("wrote {} bytes, expected {length}", counter.written),
            });
        }
        self.index.push(TensorEntry {
            name: name.to_string(),
            dtype,
            shape,
            offset: aligned,
            length,
        });
        self.resident_pos = aligned + length;
        Ok(())
    }

    /// Appends a resident tensor held in memory.
    pub fn add_resident(
        &mut self,
        name: &str,
        dtype: QuantFormat,
        shape: Vec<u64>,
        bytes: &[u8],
    ) -> Result<(), FormatError> {
        let path = self.tmp_dir.join(RESIDENT_FILE);
        self.add_resident_with(name, dtype, shape, bytes.len() as u64, |w| {
            w.write_all(bytes).at(&path)
        })
    }

    /// Creates the expert file of one layer with its final size.
    pub fn add_expert_layer(&mut self, layout: ExpertLayer) -> Result<(), FormatError> {
        let dir = self.tmp_dir.join(EXPERTS_DIR);
        fs::create_dir_all(&dir).at(&dir)?;
        let path = self.tmp_dir.join(&layout.file);
        let f = File::create(&path).at(&path)?;
        f.set_len(layout.file_len()).at(&path)?;
        self.experts.insert(layout.layer, (layout, f));
        Ok(())
    }

    /// Writes one expert's part.
    pub fn write_expert_part(
        &mut self,
        layer: usize,
        expert: usize,
        part: &str,
        bytes: &[u8],
    ) -> Result<(), FormatError> {
        let (layout, file) = self
            .experts
            .get(&layer)
            .ok_or_else(|| FormatError::BadTensor {
                tensor: format!("blk.{layer} experts"),
                detail: "layer has no expert file".into(),
            })?;
        let p = layout.part(part).ok_or_else(|| FormatError::BadTensor {
            tensor: format!("blk.{layer} expert part {part}"),
            detail: "no such part in the layer's layout".into(),
        })?;
        if expert >= layout.num_experts || bytes.len() as u64 != p.length {
            return Err(FormatError::BadTensor {
                tensor: format!("blk.{layer} expert {expert} part {part}"),
                detail: format!(
                    "{} bytes for expert {expert}; expected {} bytes and expert < {}",
                    bytes.len(),
                    p.length,
                    layout.num_experts
                ),
            });
        }
        let at = expert as u64 * layout.stride + p.offset;
        let path = self.tmp_dir.join(&layout.file);
        file.write_all_at(bytes, at).at(&path)
    }

    /// Writes a small side file (tokenizer, template) into the install.
    pub fn write_file(&mut self, name: &str, bytes: &[u8]) -> Result<(), FormatError> {
        let path = self.tmp_dir.join(name);
        fs::write(&path, bytes).at(&path)?;
        self.extra_files.push(name.to_string());
        Ok(())
    }

    /// Paths (relative) of the data files written so far.
    fn data_files(&self) -> Vec<String> {
        let mut v = vec![RESIDENT_FILE.to_string(), RESIDENT_INDEX_FILE.to_string()];
        v.extend(self.experts.values().map(|(l, _)| l.file.clone()));
        v.extend(self.extra_files.iter().cloned());
        v
    }

    /// Hashes every file, writes the manifest and moves the install into
    /// place. `progress` is called with bytes hashed so far.
    pub fn finish(
        mut self,
        parts: ManifestParts,
        quant: RoleQuant,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Manifest, FormatError> {
        let rpath = self.tmp_dir.join(RESIDENT_FILE);
        self.resident.flush().at(&rpath)?;
        self.resident.get_ref().sync_all().at(&rpath)?;
        for (layout, f) in self.experts.values() {
            f.sync_all().at(&self.tmp_dir.join(&layout.file))?;
        }
        let index = ResidentIndex {
            tensors: std::mem::take(&mut self.index),
        };
        let ipath = self.tmp_dir.join(RESIDENT_INDEX_FILE);
        let json = serde_json::to_vec_pretty(&index).map_err(|e| FormatError::Json {
            path: ipath.clone(),
            detail: e.to_string(),
        })?;
        fs::write(&ipath, json).at(&ipath)?;

        let mut files = Vec::new();
        let mut hashed = 0u64;
        for rel in self.data_files() {
            let path = self.tmp_dir.join(&rel);
            let (bytes, sha256) = hash_file(&path, &mut |n| {
                hashed += n;
                progress(hashed)
            })?;
            files.push(FileEntry {
                path: rel,
                bytes,
                sha256,
            });
        }
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            arch: parts.arch,
            source: parts.source,
            quant,
            resident_file: RESIDENT_FILE.into(),
            resident_index: RESIDENT_INDEX_FILE.into(),
            resident_bytes: self.resident_pos,
            experts: self.experts.values().map(|(l, _)| l.clone()).collect(),
            tokenizer: parts.tokenizer,
            chat_template: parts.chat_template,
            generation: parts.generation,
            files,
            skipped: parts.skipped,
        };
        let mpath = self.tmp_dir.join(MANIFEST_FILE);
        let json = serde_json::to_vec_pretty(&manifest).map_err(|e| FormatError::Json {
            path: mpath.clone(),
            detail: e.to_string(),
        })?;
        fs::write(&mpath, json).at(&mpath)?;

        if self.final_dir.exists() {
            if !self.force {
                return Err(FormatError::DestinationExists {
                    path: self.final_dir.clone(),
                });
            }
            // Move the old install aside first so a failure in between
            // never leaves the destination empty-handed.
            let old = self.tmp_dir.with_extension("old");
            if old.exists() {
                remove_path(&old)?;
            }
            fs::rename(&self.final_dir, &old).at(&self.final_dir)?;
            fs::rename(&self.tmp_dir, &self.final_dir).at(&self.final_dir)?;
            remove_path(&old)?;
        } else {
            fs::rename(&self.tmp_dir, &self.final_dir).at(&self.final_dir)?;
        }
        self.finished = true;
        Ok(manifest)
    }
}

/// Removes `.<name>.partial-<pid>` directories left by conversions that were
/// killed (a signal skips `Drop`), when that process no longer runs.
fn remove_stale_partials(parent: &Path, name: &str) {
    let prefix = format!(".{name}.partial-");
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let alive = pid
            .parse::<u32>()
            .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fn remove_path(p: &Path) -> Result<(), FormatError> {
    if p.is_dir() {
        fs::remove_dir_all(p).at(p)
    } else {
        fs::remove_file(p).at(p)
    }
}

impl Drop for InstallWriter {
    fn drop(&mut self) {
        if !self.finished {
            let _ = fs::remove_dir_all(&self.tmp_dir);
        }
    }
}

struct CountingWriter<'a, W: Write> {
    inner: &'a mut W,
    written: u64,
}

impl<W: Write> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Size and lower-case hex SHA-256 of a file; `progress` gets byte counts.
pub fn hash_file(path: &Path, progress: &mut dyn FnMut(u64)) -> Result<(u64, String), FormatError> {
    let mut f = File::open(path).at(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).at(path)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
        progress(n as u64);
    }
    let digest = h.finalize();
    let hex = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok((total, hex))
}
