//! `convert`: a GGUF file or an HF checkpoint directory → an install.
//!
//! The conversion is planned completely before a byte is written: every
//! source tensor is mapped to a target (resident tensor or routed-expert
//! part), every target's shape is checked against the [`ArchSpec`]'s
//! expectations, and missing or unexpected tensors are reported. Then the
//! tensors are streamed one at a time into an [`InstallWriter`], whose
//! temporary directory is renamed into place only at the end. Quantized
//! bytes are copied verbatim; the only rewrites are lossless re-layouts
//! (splitting fused gate/up experts, repacking MXFP4 nibbles).
//!
//! [`ArchSpec`]: turbospark_core::ArchSpec

pub mod hf_names;
pub mod mxfp4;
mod side_files;
mod source;

use crate::error::FormatError;
use crate::install::*;
use crate::roles::{expected_expert_parts, expected_resident, role_of};
use hf_names::{SkippedPart, Target};
use source::{Source, SrcTensor};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use turbospark_core::QuantFormat;

pub use source::detect_source_kind;

/// Progress of a conversion, for a progress bar.
#[derive(Debug, Clone, Copy)]
pub enum ConvertEvent {
    /// Planning finished: this many tensors and bytes will be written.
    Planned { tensors: usize, bytes: u64 },
    /// One more source tensor written.
    Tensor { done: usize, bytes_done: u64 },
    /// Hashing the written files.
    Hashing { bytes_done: u64, total: u64 },
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ConvertOptions {
    /// Replace an existing destination.
    pub force: bool,
}

/// Bytes copied between page releases when streaming a resident tensor.
const COPY_CHUNK: usize = 8 << 20;

/// One planned unit of work: a source tensor and where it goes.
struct Step {
    src: String,
    /// The MXFP4 `scales` partner of a `blocks` source.
    scales: Option<String>,
    target: Target,
}

/// Converts `src` into an install at `dst`.
pub fn convert(
    src: &Path,
    dst: &Path,
    opts: ConvertOptions,
    progress: &mut dyn FnMut(ConvertEvent),
) -> Result<Manifest, FormatError> {
    if dst.exists() && !opts.force {
        return Err(FormatError::DestinationExists {
            path: dst.to_path_buf(),
        });
    }
    let source = Source::open(src)?;
    let spec = source.spec()?;
    let family = crate::families::name(&spec.family).to_string();

    // Plan: map every source tensor.
    let mut steps = Vec::new();
    let mut skipped: BTreeMap<SkippedPart, (usize, u64)> = BTreeMap::new();
    let names = source.tensor_names();
    let name_set: HashSet<&str> = names.iter().map(String::as_str).collect();
    for name in &names {
        let target = source
            .map_name(&spec, name)
            .ok_or_else(|| FormatError::UnexpectedTensor {
                tensor: name.clone(),
                family: family.clone(),
            })?;
        match target {
            Target::Skipped(part) => {
                let e = skipped.entry(part).or_default();
                e.0 += 1;
                e.1 += source.tensor(name)?.bytes.len() as u64;
            }
            Target::Ignored | Target::Mxfp4Scales => continue,
            Target::Resident(ref t) if t == "output.weight" && spec.head.tied => continue,
            Target::Mxfp4GateUp { .. } | Target::Mxfp4Down { .. } => {
                let scales = name.replace("_blocks", "_scales");
                if !name_set.contains(scales.as_str()) {
                    return Err(FormatError::MissingTensor {
                        tensor: scales,
                        family: family.clone(),
                    });
                }
                steps.push(Step {
                    src: name.clone(),
                    scales: Some(scales),
                    target,
                });
            }
            _ => steps.push(Step {
                src: name.clone(),
                scales: None,
                target,
            }),
        }
    }

    // Resident targets: each expected tensor exactly once, with its shape.
    let expected: HashMap<String, Vec<u64>> = expected_resident(&spec)
        .into_iter()
        .map(|t| (t.name, t.shape))
        .collect();
    let mut resident_steps: BTreeMap<String, &Step> = BTreeMap::new();
    for step in &steps {
        if let Target::Resident(name)
        | Target::ResidentSqueezed(name)
        | Target::ResidentRowsStacked(name) = &step.target
        {
            let t = source.tensor(&step.src)?;
            let want = expected
                .get(name)
                .ok_or_else(|| FormatError::UnexpectedTensor {
                    tensor: step.src.clone(),
                    family: family.clone(),
                })?;
            let found = match step.target {
                // Only size-1 dimensions go: the bytes are the same.
                Target::ResidentSqueezed(_) => {
                    t.shape.iter().copied().filter(|&d| d != 1).collect()
                }
                // Whole rows stay whole: the bytes are the same.
                Target::ResidentRowsStacked(_) => match t.shape.split_last() {
                    Some((&cols, lead)) if !lead.is_empty() => {
                        vec![lead.iter().product(), cols]
                    }
                    _ => t.shape.clone(),
                },
                _ => t.shape.clone(),
            };
            check_shape(name, want, &found, &family)?;
            t.format()?;
            if resident_steps.insert(name.clone(), step).is_some() {
                return Err(FormatError::BadTensor {
                    tensor: name.clone(),
                    detail: "produced by two source tensors".into(),
                });
            }
        }
    }
    let expected_order = expected_resident(&spec);
    for want in &expected_order {
        if !resident_steps.contains_key(&want.name) {
            return Err(FormatError::MissingTensor {
                tensor: want.name.clone(),
                family: family.clone(),
            });
        }
    }

    // Expert layouts.
    let layouts = plan_expert_layouts(&spec, &steps, &source, &family)?;

    let total_bytes: u64 = steps
        .iter()
        .map(|s| {
            source
                .tensor(&s.src)
                .map(|t| t.bytes.len() as u64)
                .unwrap_or(0)
        })
        .sum();
    progress(ConvertEvent::Planned {
        tensors: steps.len(),
        bytes: total_bytes,
    });

    // Execute.
    let mut writer = InstallWriter::create(dst, opts.force)?;
    let mut quant: RoleQuant = BTreeMap::new();
    let mut note_quant = |role: String, f: QuantFormat| {
        let v = quant.entry(role).or_default();
        if !v.contains(&f) {
            v.push(f);
        }
    };
    let (mut done, mut bytes_done, mut resident_bytes) = (0usize, 0u64, 0u64);
    for want in &expected_order {
        let step = resident_steps[&want.name];
        let t = source.tensor(&step.src)?;
        let fmt = t.format()?;
        // Copied in chunks whose source pages are dropped once written, so
        // even a vocabulary-sized embedding never sits in memory whole.
        let path = dst.to_path_buf();
        writer.add_resident_with(
            &want.name,
            fmt,
            want.shape.clone(),
            t.bytes.len() as u64,
            |w| {
                for chunk in t.bytes.chunks(COPY_CHUNK) {
                    w.write_all(chunk).map_err(|e| FormatError::io(&path, e))?;
                    source::release_pages(chunk);
                }
                Ok(())
            },
        )?;
        note_quant(role_of(&want.name), fmt);
        done += 1;
        bytes_done += t.bytes.len() as u64;
        resident_bytes += t.bytes.len() as u64;
        progress(ConvertEvent::Tensor { done, bytes_done });
    }
    for layout in layouts.values() {
        writer.add_expert_layer(layout.clone())?;
        for p in &layout.parts {
            note_quant(format!("experts.{}", p.name), p.dtype);
        }
    }
    let mut written: HashSet<(usize, usize, &'static str)> = HashSet::new();
    for step in steps.iter().filter(|s| {
        !matches!(
            s.target,
            Target::Resident(_) | Target::ResidentSqueezed(_) | Target::ResidentRowsStacked(_)
        )
    }) {
        let n = write_expert_step(&mut writer, &source, step, &layouts, &mut written)?;
        source.release(&step.src);
        if let Some(s) = &step.scales {
            source.release(s);
        }
        done += 1;
        bytes_done += n;
        progress(ConvertEvent::Tensor { done, bytes_done });
    }
    for want in expected_expert_parts(&spec) {
        let e_count = layouts[&want.layer].num_experts;
        for e in 0..e_count {
            if !written.contains(&(want.layer, e, want.part)) {
                return Err(FormatError::MissingTensor {
                    tensor: format!("blk.{}.experts.{e}.{}", want.layer, want.part),
                    family,
                });
            }
        }
    }

    let side = side_files::write_side_files(&source, &mut writer)?;
    let expert_file_bytes: u64 = layouts.values().map(ExpertLayer::file_len).sum();
    let hash_total = resident_bytes + expert_file_bytes;
    let manifest = writer.finish(
        ManifestParts {
            arch: spec,
            source: source.info(),
            tokenizer: side.tokenizer,
            chat_template: side.chat_template,
            generation: side.generation,
            skipped: skipped
                .into_iter()
                .map(|(part, (tensors, bytes))| SkippedSource {
                    part: part.name().to_string(),
                    tensors,
                    bytes,
                })
                .collect(),
        },
        quant,
        &mut |b| {
            progress(ConvertEvent::Hashing {
                bytes_done: b,
                total: hash_total,
            })
        },
    )?;
    Ok(manifest)
}

fn check_shape(name: &str, want: &[u64], found: &[u64], family: &str) -> Result<(), FormatError> {
    if want != found {
        return Err(FormatError::ShapeMismatch {
            tensor: name.to_string(),
            expected: want.to_vec(),
            found: found.to_vec(),
            family: family.to_string(),
        });
    }
    Ok(())
}

/// One expert part produced by a step: name, format, per-expert shape.
type PartSpec = (&'static str, QuantFormat, Vec<u64>);

/// The expert parts one step produces.
fn parts_of_step(
    step: &Step,
    t: &SrcTensor,
    num_experts: usize,
) -> Result<Vec<PartSpec>, FormatError> {
    let bad = |detail: String| FormatError::BadTensor {
        tensor: step.src.clone(),
        detail,
    };
    let s = &t.shape;
    let stacked = |rank: usize| -> Result<(), FormatError> {
        if s.len() != rank || s[0] != num_experts as u64 {
            return Err(bad(format!(
                "shape {s:?}: expected {rank} dimensions with {num_experts} experts first"
            )));
        }
        Ok(())
    };
    Ok(match &step.target {
        Target::ExpertOne { part, .. } => vec![(*part, t.format()?, s.clone())],
        Target::ExpertStack { part, .. } => {
            stacked(s.len().max(2))?;
            vec![(*part, t.format()?, s[1..].to_vec())]
        }
        Target::ExpertGateUpHalves { .. } => {
            stacked(3)?;
            if s[1] % 2 != 0 {
                return Err(bad(format!("fused gate/up has an odd row count {}", s[1])));
            }
            let half = vec![s[1] / 2, s[2]];
            let f = t.format()?;
            vec![("gate", f, half.clone()), ("up", f, half)]
        }
        Target::Mxfp4GateUp { .. } | Target::Mxfp4Down { .. } => {
            stacked(4)?;
            if s[3] != 16 {
                return Err(bad(format!(
                    "MXFP4 blocks {s:?}: last dimension must be 16"
                )));
            }
            let cols = s[2] * 32;
            if matches!(step.target, Target::Mxfp4Down { .. }) {
                vec![("down", QuantFormat::Mxfp4, vec![s[1], cols])]
            } else {
                if s[1] % 2 != 0 {
                    return Err(bad(format!("fused gate/up has an odd row count {}", s[1])));
                }
                let half = vec![s[1] / 2, cols];
                vec![
                    ("gate", QuantFormat::Mxfp4, half.clone()),
                    ("up", QuantFormat::Mxfp4, half),
                ]
            }
        }
        Target::GateUpBiasInterleaved { .. } => {
            stacked(2)?;
            let f = t.format()?;
            vec![
                ("gate.bias", f, vec![s[1] / 2]),
                ("up.bias", f, vec![s[1] / 2]),
            ]
        }
        Target::DownBiasStack { .. } => {
            stacked(2)?;
            vec![("down.bias", t.format()?, vec![s[1]])]
        }
        Target::Resident(_)
        | Target::ResidentSqueezed(_)
        | Target::ResidentRowsStacked(_)
        | Target::Ignored
        | Target::Skipped(_)
        | Target::Mxfp4Scales => {
            vec![]
        }
    })
}

fn step_layer(t: &Target) -> Option<usize> {
    match *t {
        Target::ExpertOne { layer, .. }
        | Target::ExpertStack { layer, .. }
        | Target::ExpertGateUpHalves { layer }
        | Target::Mxfp4GateUp { layer }
        | Target::Mxfp4Down { layer }
        | Target::GateUpBiasInterleaved { layer }
        | Target::DownBiasStack { layer } => Some(layer),
        Target::Resident(_)
        | Target::ResidentSqueezed(_)
        | Target::ResidentRowsStacked(_)
        | Target::Ignored
        | Target::Skipped(_)
        | Target::Mxfp4Scales => None,
    }
}

/// Computes each MoE layer's expert record layout from the planned steps and
/// checks it against the spec.
fn plan_expert_layouts(
    spec: &turbospark_core::ArchSpec,
    steps: &[Step],
    source: &Source,
    family: &str,
) -> Result<BTreeMap<usize, ExpertLayer>, FormatError> {
    let num_experts = spec.moe.map(|m| m.num_experts).unwrap_or(0);
    let mut found: BTreeMap<usize, BTreeMap<&'static str, (QuantFormat, Vec<u64>)>> =
        BTreeMap::new();
    for step in steps {
        let Some(layer) = step_layer(&step.target) else {
            continue;
        };
        let t = source.tensor(&step.src)?;
        for (part, f, shape) in parts_of_step(step, &t, num_experts)? {
            let entry = found.entry(layer).or_default();
            if let Some((f0, s0)) = entry.get(part) {
                if *f0 != f || *s0 != shape {
                    return Err(FormatError::BadTensor {
                        tensor: step.src.clone(),
                        detail: format!(
                            "expert part {part} of layer {layer} is {f} {shape:?} here but {f0} {s0:?} for another expert"
                        ),
                    });
                }
            } else {
                entry.insert(part, (f, shape));
            }
        }
    }
    let mut layouts = BTreeMap::new();
    let expected = expected_expert_parts(spec);
    for want in &expected {
        let (f, shape) = found
            .get(&want.layer)
            .and_then(|m| m.get(want.part))
            .ok_or_else(|| FormatError::MissingTensor {
                tensor: format!("blk.{}.experts.{}", want.layer, want.part),
                family: family.to_string(),
            })?;
        check_shape(
            &format!("blk.{}.experts.{}", want.layer, want.part),
            &want.shape,
            shape,
            family,
        )?;
        let elems: u64 = shape.iter().product();
        let length = f.bytes_for(elems).ok_or_else(|| FormatError::BadTensor {
            tensor: format!("blk.{}.experts.{}", want.layer, want.part),
            detail: format!("{elems} elements are not whole {f} blocks"),
        })?;
        let layout = layouts.entry(want.layer).or_insert_with(|| ExpertLayer {
            layer: want.layer,
            file: format!("{EXPERTS_DIR}/{:03}.bin", want.layer),
            num_experts,
            stride: 0,
            parts: Vec::new(),
        });
        let offset = align_up(layout.record_len(), RESIDENT_ALIGN);
        layout.parts.push(ExpertPart {
            name: want.part.to_string(),
            dtype: *f,
            shape: shape.clone(),
            offset,
            length,
        });
    }
    for (layer, parts) in &found {
        let known: HashSet<&str> = expected
            .iter()
            .filter(|w| w.layer == *layer)
            .map(|w| w.part)
            .collect();
        if let Some(extra) = parts.keys().find(|p| !known.contains(*p)) {
            return Err(FormatError::UnexpectedTensor {
                tensor: format!("blk.{layer}.experts.{extra}"),
                family: family.to_string(),
            });
        }
    }
    for layout in layouts.values_mut() {
        layout.stride = align_up(layout.record_len(), EXPERT_ALIGN);
    }
    Ok(layouts)
}

/// Writes one expert step; returns the source bytes consumed.
fn write_expert_step(
    writer: &mut InstallWriter,
    source: &Source,
    step: &Step,
    layouts: &BTreeMap<usize, ExpertLayer>,
    written: &mut HashSet<(usize, usize, &'static str)>,
) -> Result<u64, FormatError> {
    let t = source.tensor(&step.src)?;
    let layer = step_layer(&step.target).expect("expert steps have a layer");
    let layout = &layouts[&layer];
    let e_count = layout.num_experts;
    let mut put = |e: usize, part: &'static str, bytes: &[u8]| -> Result<(), FormatError> {
        writer.write_expert_part(layer, e, part, bytes)?;
        written.insert((layer, e, part));
        Ok(())
    };
    let per_expert = |i: usize| {
        let n = t.bytes.len() / e_count;
        &t.bytes[i * n..(i + 1) * n]
    };
    match &step.target {
        Target::ExpertOne { expert, part, .. } => {
            if *expert >= e_count {
                return Err(FormatError::BadTensor {
                    tensor: step.src.clone(),
                    detail: format!("expert index {expert} ≥ {e_count} experts"),
                });
            }
            put(*expert, part, t.bytes)?;
        }
        Target::ExpertStack { part, .. } => {
            for e in 0..e_count {
                put(e, part, per_expert(e))?;
            }
        }
        Target::DownBiasStack { .. } => {
            for e in 0..e_count {
                put(e, "down.bias", per_expert(e))?;
            }
        }
        Target::ExpertGateUpHalves { .. } => {
            for e in 0..e_count {
                let b = per_expert(e);
                let (g, u) = b.split_at(b.len() / 2);
                put(e, "gate", g)?;
                put(e, "up", u)?;
            }
        }
        Target::GateUpBiasInterleaved { .. } => {
            let esize = t.format()?.block_bytes();
            for e in 0..e_count {
                let b = per_expert(e);
                let (mut g, mut u) = (Vec::new(), Vec::new());
                for (i, v) in b.chunks_exact(esize).enumerate() {
                    if i % 2 == 0 { &mut g } else { &mut u }.extend_from_slice(v);
                }
                put(e, "gate.bias", &g)?;
                put(e, "up.bias", &u)?;
            }
        }
        Target::Mxfp4GateUp { .. } | Target::Mxfp4Down { .. } => {
            let scales_name = step.scales.as_ref().expect("MXFP4 steps carry scales");
            let sc = source.tensor(scales_name)?;
            let (rows, groups) = (t.shape[1] as usize, t.shape[2] as usize);
            if sc.shape != [e_count as u64, rows as u64, groups as u64] {
                return Err(FormatError::ShapeMismatch {
                    tensor: scales_name.clone(),
                    expected: vec![e_count as u64, rows as u64, groups as u64],
                    found: sc.shape.clone(),
                    family: "gpt-oss".into(),
                });
            }
            let row_out = groups * 17;
            let interleaved = matches!(step.target, Target::Mxfp4GateUp { .. });
            let mut out_a = vec![0u8; row_out * if interleaved { rows / 2 } else { rows }];
            let mut out_b = vec![0u8; if interleaved { row_out * rows / 2 } else { 0 }];
            for e in 0..e_count {
                for r in 0..rows {
                    let base = (e * rows + r) * groups;
                    let blocks = &t.bytes[base * 16..(base + groups) * 16];
                    let scales = &sc.bytes[base..base + groups];
                    let (dst, rr) = if interleaved {
                        (if r % 2 == 0 { &mut out_a } else { &mut out_b }, r / 2)
                    } else {
                        (&mut out_a, r)
                    };
                    mxfp4::repack_row(blocks, scales, &mut dst[rr * row_out..(rr + 1) * row_out]);
                }
                if interleaved {
                    put(e, "gate", &out_a)?;
                    put(e, "up", &out_b)?;
                } else {
                    put(e, "down", &out_a)?;
                }
            }
        }
        Target::Resident(_)
        | Target::ResidentSqueezed(_)
        | Target::ResidentRowsStacked(_)
        | Target::Ignored
        | Target::Skipped(_)
        | Target::Mxfp4Scales => {}
    }
    Ok(t.bytes.len() as u64)
}

/// A source tensor as `inspect` lists it.
#[derive(Debug, Clone)]
pub struct SourceTensorRow {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub bytes: u64,
    /// `resident`, `expert` or `ignored` (or `unmapped` when the family
    /// has no role for it).
    pub placement: &'static str,
}

/// What `inspect` shows for a GGUF file or HF directory.
pub struct SourceSummary {
    pub spec: turbospark_core::ArchSpec,
    pub kind: &'static str,
    pub tensors: Vec<SourceTensorRow>,
}

/// Reads a source's spec and tensor table without converting it.
pub fn inspect_source(path: &Path) -> Result<SourceSummary, FormatError> {
    let source = Source::open(path)?;
    let spec = source.spec()?;
    let mut tensors = Vec::new();
    for name in source.tensor_names() {
        let t = source.tensor(&name)?;
        let dtype = match t.format() {
            Ok(f) => f.name().to_string(),
            Err(_) => match t.kind {
                source::SrcKind::Ggml(id) => turbospark_core::dtype::ggml_type_name(id),
                source::SrcKind::St(d) => format!("{d:?}").to_lowercase(),
            },
        };
        let placement = match source.map_name(&spec, &name) {
            None => "unmapped",
            Some(Target::Ignored) => "ignored",
            Some(Target::Skipped(_)) => "skipped",
            Some(
                Target::Resident(_) | Target::ResidentSqueezed(_) | Target::ResidentRowsStacked(_),
            ) => "resident",
            Some(_) => "expert",
        };
        tensors.push(SourceTensorRow {
            name: name.clone(),
            dtype,
            shape: t.shape.clone(),
            bytes: t.bytes.len() as u64,
            placement,
        });
    }
    let kind = match source {
        Source::Gguf(_) => "gguf",
        Source::Hf { .. } => "hf",
    };
    Ok(SourceSummary {
        spec,
        kind,
        tensors,
    })
}
