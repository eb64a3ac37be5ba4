//! Random weights in exactly the layout of an existing install
//! (`turbospark synth --like`), so that a model's shape can be built,
//! benchmarked and run where its weights are not available.
//!
//! An [`InstallLayout`] is everything of an install but the weights: the
//! `ArchSpec`, every resident tensor's name, shape, format and offset, the
//! expert files (layers, experts, parts with their formats, offsets and
//! stride), the tokenizer and chat template files and the generation
//! defaults. It is read from an install ([`InstallLayout::of_install`]) or
//! from a layout file, its JSON form ([`InstallLayout::save`]), a few MiB
//! at most, that carries a model's shape to a machine that does not have
//! the model.
//!
//! [`write_like_install`] writes a random install of that layout through
//! the install writer: resident tensors in the layout's offset order (the
//! writer packs them at 64-byte boundaries, as the layout's offsets are,
//! which [`InstallLayout::validate`] checks), the expert files with the
//! layout's records verbatim, and the side files copied. Values are drawn as
//! [`RandomTensors`] draws them (matrices uniform in `±1/√in`, the
//! embedding in `±1`, norm weights near 1) and encoded in each tensor's own
//! format ([`crate::synthetic_quant`]); each expert draws from its own seed,
//! so the bytes depend on the seed alone, not on the thread count. With a
//! router skew, routers are set as [`crate::synthetic_install`] sets them.

use crate::synthetic::RandomTensors;
use crate::synthetic_install::{
    check_skew, expert_seed, generate_experts_with, skew_router, SynthEvent,
};
use crate::synthetic_quant::encode_rows;
use crate::EngineError;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use turbospark_core::{ArchSpec, QuantFormat};
use turbospark_format::install::writer::hash_file;
use turbospark_format::install::{
    align_up, ExpertLayer, GenerationDefaults, Install, InstallWriter, Manifest, ManifestParts,
    RoleQuant, SkippedSource, SourceInfo, TensorEntry, EXPERTS_DIR, EXPERT_ALIGN, MANIFEST_FILE,
    RESIDENT_ALIGN, RESIDENT_FILE, RESIDENT_INDEX_FILE,
};
use turbospark_format::roles::{expected_expert_parts, expected_resident, role_of};
use turbospark_format::FormatError;

/// Version of the layout file this build writes and reads.
pub const LAYOUT_VERSION: u32 = 1;

/// Values drawn and encoded at a time when writing a resident tensor.
const CHUNK_VALUES: usize = 1 << 22;

/// A small file of the install (tokenizer, chat template), carried as text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideFile {
    /// Its name inside the install.
    pub path: String,
    pub text: String,
}

/// The layout of an install without its weights (module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstallLayout {
    /// [`LAYOUT_VERSION`].
    pub turbospark_layout: u32,
    /// Where the described install came from.
    pub source: SourceInfo,
    pub arch: ArchSpec,
    /// Every resident tensor, in offset order.
    pub resident: Vec<TensorEntry>,
    /// Size of `resident.bin`.
    pub resident_bytes: u64,
    pub experts: Vec<ExpertLayer>,
    /// Which side file is the tokenizer, and which the chat template.
    pub tokenizer: Option<String>,
    pub chat_template: Option<String>,
    pub generation: GenerationDefaults,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedSource>,
    pub side_files: Vec<SideFile>,
}

fn bad(path: &Path, detail: impl Into<String>) -> EngineError {
    EngineError::Format(FormatError::BadInstall {
        path: path.to_path_buf(),
        detail: detail.into(),
    })
}

impl InstallLayout {
    /// The layout of the install at `dir`, opened and validated as for
    /// running it; the side files are read and checked against the
    /// manifest's hashes.
    pub fn of_install(dir: &Path) -> Result<InstallLayout, EngineError> {
        let install = Install::open(dir)?;
        let m = &install.manifest;
        let data: HashSet<&str> = [RESIDENT_FILE, RESIDENT_INDEX_FILE]
            .into_iter()
            .chain(m.experts.iter().map(|l| l.file.as_str()))
            .collect();
        let mut side_files = Vec::new();
        for f in m.files.iter().filter(|f| !data.contains(f.path.as_str())) {
            let path = dir.join(&f.path);
            let (bytes, sha256) = hash_file(&path, &mut |_| {})?;
            if bytes != f.bytes || sha256 != f.sha256 {
                return Err(bad(
                    &path,
                    "does not match the manifest's size and hash (run turbospark verify)",
                ));
            }
            let text = std::fs::read_to_string(&path).map_err(|e| FormatError::Io {
                path: path.clone(),
                source: e,
            })?;
            side_files.push(SideFile {
                path: f.path.clone(),
                text,
            });
        }
        let mut resident = install.index.tensors.clone();
        resident.sort_by_key(|t| t.offset);
        let layout = InstallLayout {
            turbospark_layout: LAYOUT_VERSION,
            source: m.source.clone(),
            arch: m.arch.clone(),
            resident,
            resident_bytes: m.resident_bytes,
            experts: m.experts.clone(),
            tokenizer: m.tokenizer.clone(),
            chat_template: m.chat_template.clone(),
            generation: m.generation.clone(),
            skipped: m.skipped.clone(),
            side_files,
        };
        layout.validate(dir)?;
        Ok(layout)
    }

    /// Reads and validates a layout file.
    pub fn read(path: &Path) -> Result<InstallLayout, EngineError> {
        let bytes = std::fs::read(path).map_err(|e| FormatError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        if bytes.starts_with(b"GGUF") {
            return Err(bad(
                path,
                "a GGUF file, not a layout file: convert it to an install first \
                 (turbospark convert) and pass the install directory",
            ));
        }
        let raw: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| json(path, e))?;
        match raw
            .get("turbospark_layout")
            .and_then(serde_json::Value::as_u64)
        {
            Some(v) if v == u64::from(LAYOUT_VERSION) => {}
            Some(v) => {
                return Err(bad(
                    path,
                    format!("layout file version {v}, this build reads version {LAYOUT_VERSION}"),
                ))
            }
            None => {
                return Err(bad(
                    path,
                    "not a turbospark layout file (no turbospark_layout version)",
                ))
            }
        }
        check_formats(&raw)?;
        let layout: InstallLayout = serde_json::from_value(raw).map_err(|e| json(path, e))?;
        layout.validate(path)?;
        Ok(layout)
    }

    /// The layout of `path`: an install directory or a layout file.
    pub fn load(path: &Path) -> Result<InstallLayout, EngineError> {
        if path.is_dir() {
            InstallLayout::of_install(path)
        } else if path.is_file() {
            InstallLayout::read(path)
        } else {
            Err(bad(path, "no such install directory or layout file"))
        }
    }

    /// Writes the layout file at `path` (through a temporary file, renamed
    /// into place).
    pub fn save(&self, path: &Path) -> Result<(), EngineError> {
        let bytes = serde_json::to_vec(self).map_err(|e| json(path, e))?;
        let name = path
            .file_name()
            .ok_or_else(|| bad(path, "not a file name"))?
            .to_string_lossy();
        let tmp = path.with_file_name(format!(".{name}.partial-{}", std::process::id()));
        let io = |e| {
            EngineError::Format(FormatError::Io {
                path: tmp.clone(),
                source: e,
            })
        };
        let result = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
        Ok(())
    }

    /// Checks that the layout describes an install this build can open
    /// and that the install writer reproduces exactly: every tensor the
    /// architecture needs with its shape, lengths that match format ×
    /// shape, rows of whole blocks, resident offsets packed at 64-byte
    /// boundaries in order, expert records inside a page-aligned stride,
    /// plain file names. `path` names the source in errors.
    pub fn validate(&self, path: &Path) -> Result<(), EngineError> {
        self.arch
            .validate()
            .map_err(|e| bad(path, format!("architecture: {e}")))?;
        let family = &self.arch.family;
        if turbospark_format::families::get(family).is_none() {
            return Err(bad(
                path,
                format!(
                    "family {:?} is not one this build knows ({})",
                    family.id(),
                    turbospark_format::families::known_ids()
                ),
            ));
        }
        let mut names = HashSet::new();
        let mut end = 0u64;
        for t in &self.resident {
            check_tensor(path, &t.name, t.dtype, &t.shape, t.length)?;
            if !names.insert(t.name.as_str()) {
                return Err(bad(path, format!("tensor {} is listed twice", t.name)));
            }
            if t.offset != align_up(end, RESIDENT_ALIGN) {
                return Err(bad(
                    path,
                    format!(
                        "tensor {} at offset {}: resident tensors are expected back to back at \
                         {RESIDENT_ALIGN}-byte boundaries (next offset {})",
                        t.name,
                        t.offset,
                        align_up(end, RESIDENT_ALIGN)
                    ),
                ));
            }
            end = t.offset + t.length;
        }
        if end != self.resident_bytes {
            return Err(bad(
                path,
                format!(
                    "resident tensors end at {end}, resident.bin is {} bytes",
                    self.resident_bytes
                ),
            ));
        }
        for want in expected_resident(&self.arch) {
            let t = self
                .resident
                .iter()
                .find(|t| t.name == want.name)
                .ok_or_else(|| bad(path, format!("tensor {} is missing", want.name)))?;
            if t.shape != want.shape {
                return Err(bad(
                    path,
                    format!(
                        "tensor {} has shape {:?}, the {} architecture needs {:?}",
                        t.name,
                        t.shape,
                        turbospark_format::families::name(&self.arch.family),
                        want.shape
                    ),
                ));
            }
        }
        let num_experts = self.arch.moe.as_ref().map_or(0, |m| m.num_experts);
        let mut layers = HashSet::new();
        for l in &self.experts {
            let name = format!("blk.{} experts", l.layer);
            if !layers.insert(l.layer) {
                return Err(bad(path, format!("{name} are listed twice")));
            }
            if l.file != format!("{EXPERTS_DIR}/{:03}.bin", l.layer) {
                return Err(bad(
                    path,
                    format!("{name}: file {:?} is not {EXPERTS_DIR}/NNN.bin", l.file),
                ));
            }
            if l.num_experts != num_experts {
                return Err(bad(
                    path,
                    format!(
                        "{name}: {} experts, the architecture has {num_experts}",
                        l.num_experts
                    ),
                ));
            }
            if l.stride % EXPERT_ALIGN != 0 || l.record_len() > l.stride {
                return Err(bad(
                    path,
                    format!(
                        "{name}: stride {} is not a multiple of {EXPERT_ALIGN} holding the \
                         record of {} bytes",
                        l.stride,
                        l.record_len()
                    ),
                ));
            }
            for p in &l.parts {
                check_tensor(
                    path,
                    &format!("blk.{}.experts.{}", l.layer, p.name),
                    p.dtype,
                    &p.shape,
                    p.length,
                )?;
                if p.offset % RESIDENT_ALIGN != 0 {
                    return Err(bad(
                        path,
                        format!(
                            "{name}: part {} at a misaligned offset {}",
                            p.name, p.offset
                        ),
                    ));
                }
            }
        }
        for want in expected_expert_parts(&self.arch) {
            let part = self
                .experts
                .iter()
                .find(|l| l.layer == want.layer)
                .and_then(|l| l.part(want.part))
                .ok_or_else(|| {
                    bad(
                        path,
                        format!("layer {} experts lack part {}", want.layer, want.part),
                    )
                })?;
            if part.shape != want.shape {
                return Err(bad(
                    path,
                    format!(
                        "blk.{}.experts.{} has shape {:?}, the architecture needs {:?}",
                        want.layer, want.part, part.shape, want.shape
                    ),
                ));
            }
        }
        let reserved = [
            MANIFEST_FILE,
            RESIDENT_FILE,
            RESIDENT_INDEX_FILE,
            EXPERTS_DIR,
        ];
        let mut side = HashSet::new();
        for f in &self.side_files {
            let plain = !f.path.is_empty()
                && !f.path.contains(['/', '\\'])
                && !f.path.starts_with('.')
                && !reserved.contains(&f.path.as_str());
            if !plain || !side.insert(f.path.as_str()) {
                return Err(bad(
                    path,
                    format!("side file {:?} is not a plain, unique file name", f.path),
                ));
            }
        }
        for (what, name) in [
            ("tokenizer", &self.tokenizer),
            ("chat template", &self.chat_template),
        ] {
            if let Some(n) = name {
                if !side.contains(n.as_str()) {
                    return Err(bad(path, format!("the {what} file {n} is not included")));
                }
            }
        }
        Ok(())
    }

    /// Bytes of resident tensors and expert files together.
    pub fn weight_bytes(&self) -> u64 {
        self.resident_bytes + self.experts.iter().map(ExpertLayer::file_len).sum::<u64>()
    }
}

/// Names the tensor whose element format this build does not know, before
/// the whole layout is parsed (whose error would not say which).
fn check_formats(raw: &serde_json::Value) -> Result<(), EngineError> {
    let resident = raw["resident"].as_array().into_iter().flatten().map(|t| {
        let name = t["name"].as_str().unwrap_or("?").to_string();
        (name, &t["dtype"])
    });
    let parts = raw["experts"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| {
            l["parts"].as_array().into_iter().flatten().map(move |p| {
                let name = format!(
                    "blk.{}.experts.{}",
                    l["layer"],
                    p["name"].as_str().unwrap_or("?")
                );
                (name, &p["dtype"])
            })
        });
    for (tensor, dtype) in resident.chain(parts) {
        if serde_json::from_value::<QuantFormat>(dtype.clone()).is_err() {
            return Err(EngineError::Format(FormatError::UnsupportedDtype {
                tensor,
                dtype: dtype.to_string(),
            }));
        }
    }
    Ok(())
}

fn json(path: &Path, e: serde_json::Error) -> EngineError {
    EngineError::Format(FormatError::Json {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

/// A tensor's length must be its format × shape, its rows whole blocks.
fn check_tensor(
    path: &Path,
    name: &str,
    dtype: QuantFormat,
    shape: &[u64],
    length: u64,
) -> Result<(), EngineError> {
    let row = shape.last().copied().unwrap_or(1);
    let elems = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    if row % dtype.block_elems() as u64 != 0 {
        return Err(bad(
            path,
            format!(
                "tensor {name}: rows of {row} are not whole {}-element blocks of {dtype}",
                dtype.block_elems()
            ),
        ));
    }
    if elems.and_then(|n| dtype.bytes_for(n)) != Some(length) {
        return Err(bad(
            path,
            format!("tensor {name}: {length} bytes recorded for {shape:?} {dtype}"),
        ));
    }
    Ok(())
}

/// How to write an install like another.
#[derive(Debug, Clone, Copy)]
pub struct LikeOptions {
    pub seed: u64,
    /// Threads generating experts.
    pub threads: usize,
    /// Replace an existing destination.
    pub force: bool,
    /// Zipf exponent of the experts' popularity (`None`: the random
    /// router's nearly uniform routing). Needs a router bias.
    pub router_skew: Option<f64>,
}

/// `(rows, row length)` of a shape (a vector is one row).
fn rows_of(shape: &[usize]) -> (usize, usize) {
    match shape.split_last() {
        Some((&row, outer)) => (outer.iter().product(), row),
        None => (1, 1),
    }
}

/// Writes a random install with `layout` at `dst`; nothing is left at
/// `dst` when it fails.
pub fn write_like_install(
    layout: &InstallLayout,
    dst: &Path,
    opts: &LikeOptions,
    progress: &mut dyn FnMut(SynthEvent),
) -> Result<Manifest, EngineError> {
    check_skew(&layout.arch, opts.router_skew)?;
    let mut quant = RoleQuant::new();
    let mut note = |role: String, f: QuantFormat| {
        let formats: &mut Vec<QuantFormat> = quant.entry(role).or_default();
        if !formats.contains(&f) {
            formats.push(f);
        }
    };
    let mut writer = InstallWriter::create(dst, opts.force)?;
    let resident_path = PathBuf::from(RESIDENT_FILE);

    let mut random = RandomTensors::new(opts.seed, QuantFormat::F32);
    let tensors = layout.resident.len();
    let mut resident_progress = |done: usize, bytes: u64| {
        progress(SynthEvent::Resident {
            done,
            total: tensors,
            bytes,
            total_bytes: layout.resident_bytes,
        })
    };
    for (done, t) in layout.resident.iter().enumerate() {
        let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
        let (rows, row_len) = rows_of(&shape);
        let rows_per_chunk = (CHUNK_VALUES / row_len.max(1)).max(1);
        // Errors inside the writer's fill callback are carried out here, so
        // that an encoding error keeps its own message.
        let mut failure: Option<EngineError> = None;
        writer
            .add_resident_with(&t.name, t.dtype, t.shape.clone(), t.length, |w| {
                let mut values = vec![0.0f32; rows_per_chunk.min(rows) * row_len];
                let mut row = 0;
                while row < rows {
                    let n = rows_per_chunk.min(rows - row) * row_len;
                    let chunk = &mut values[..n];
                    random.fill(&t.name, &shape, chunk);
                    if let Some(s) = opts.router_skew {
                        skew_router(&t.name, chunk, s, opts.seed);
                    }
                    let bytes = match encode_rows(&t.name, chunk, row_len, t.dtype) {
                        Ok(b) => b,
                        Err(e) => {
                            failure = Some(e);
                            return Err(FormatError::BadTensor {
                                tensor: t.name.clone(),
                                detail: "could not be encoded".into(),
                            });
                        }
                    };
                    w.write_all(&bytes)
                        .map_err(|e| FormatError::io(&resident_path, e))?;
                    row += n / row_len;
                    resident_progress(done, t.offset + (t.length / rows as u64) * row as u64);
                }
                Ok(())
            })
            .map_err(|e| failure.take().unwrap_or(EngineError::Format(e)))?;
        note(role_of(&t.name), t.dtype);
        resident_progress(done + 1, t.offset + t.length);
    }

    let total: u64 = layout.experts.iter().map(ExpertLayer::file_len).sum();
    let mut written = 0u64;
    for l in &layout.experts {
        for p in &l.parts {
            note(format!("experts.{}", p.name), p.dtype);
        }
        writer.add_expert_layer(l.clone())?;
        let generate = |e: usize| -> Result<Vec<Vec<u8>>, EngineError> {
            let mut random =
                RandomTensors::new(expert_seed(opts.seed, l.layer, e), QuantFormat::F32);
            l.parts
                .iter()
                .map(|p| {
                    let name = format!("blk.{}.experts.{e}.{}", l.layer, p.name);
                    let shape: Vec<usize> = p.shape.iter().map(|&d| d as usize).collect();
                    let values = random.values(&name, &shape);
                    encode_rows(&name, &values, rows_of(&shape).1, p.dtype)
                })
                .collect()
        };
        generate_experts_with(l.num_experts, opts.threads, &generate, &mut |e, parts| {
            for (p, bytes) in l.parts.iter().zip(parts) {
                writer.write_expert_part(l.layer, e, &p.name, &bytes)?;
            }
            written += l.stride;
            progress(SynthEvent::Experts {
                bytes: written,
                total,
            });
            Ok(())
        })?;
    }

    for f in &layout.side_files {
        writer.write_file(&f.path, f.text.as_bytes())?;
    }
    let parts = ManifestParts {
        arch: layout.arch.clone(),
        source: SourceInfo {
            kind: "synthetic".into(),
            name: format!("seed {}, like {}", opts.seed, layout.source.name),
        },
        tokenizer: layout.tokenizer.clone(),
        chat_template: layout.chat_template.clone(),
        generation: layout.generation.clone(),
        skipped: layout.skipped.clone(),
    };
    let hash_total = layout.weight_bytes()
        + layout
            .side_files
            .iter()
            .map(|f| f.text.len() as u64)
            .sum::<u64>();
    Ok(writer.finish(parts, quant, &mut |bytes| {
        progress(SynthEvent::Hashing {
            bytes,
            total: hash_total,
        })
    })?)
}
