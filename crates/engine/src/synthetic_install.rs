//! A synthetic install on disk: every tensor an [`ArchSpec`] needs, random
//! ([`RandomTensors`]), written through the install writer exactly as
//! `turbospark convert` lays out a real model, so a model of any size (an
//! expert cache larger than memory, say) can be opened, streamed and
//! benchmarked without a checkpoint.
//!
//! Resident matrices are stored as `resident_format`, routed-expert
//! matrices as `expert_format` (f32 where a row is not whole blocks),
//! vectors as f32. Expert parts sit in the order gate, up, down, then the
//! biases, each at a 64-byte aligned offset of the record, and the stride is
//! the record rounded up to a page (`docs/FORMAT.md`). Each expert draws
//! from its own seed, so experts are generated in parallel and the bytes do
//! not depend on the thread count.
//!
//! With a router skew, each MoE layer's router bias and matrix are set so
//! that selections follow a Zipf popularity ([`crate::router_skew`]).

use crate::router_skew::{router_gain, skewed_bias};
use crate::synthetic::{encode_tensor, RandomTensors};
use crate::EngineError;
use std::collections::BTreeMap;
use std::path::Path;
use turbospark_core::{ArchSpec, QuantFormat};
use turbospark_format::install::{
    align_up, ExpertLayer, ExpertPart, GenerationDefaults, InstallWriter, Manifest, ManifestParts,
    RoleQuant, SourceInfo, EXPERTS_DIR, EXPERT_ALIGN, RESIDENT_ALIGN,
};
use turbospark_format::roles::{expected_expert_parts, expected_resident, role_of};

/// How to write a synthetic install.
#[derive(Debug, Clone, Copy)]
pub struct SynthOptions {
    pub seed: u64,
    pub resident_format: QuantFormat,
    pub expert_format: QuantFormat,
    /// Threads generating experts.
    pub threads: usize,
    /// Replace an existing destination.
    pub force: bool,
    /// Zipf exponent of the experts' popularity (`None`: the random
    /// router's nearly uniform routing). Needs a router bias.
    pub router_skew: Option<f64>,
}

/// Progress of [`write_synthetic_install`].
#[derive(Debug, Clone, Copy)]
pub enum SynthEvent {
    /// Resident tensors written so far, of `total`, and their bytes, of
    /// `total_bytes` (both 0 when the writer does not count bytes).
    Resident {
        done: usize,
        total: usize,
        bytes: u64,
        total_bytes: u64,
    },
    /// Expert bytes written so far, of `total`.
    Experts { bytes: u64, total: u64 },
    /// Bytes hashed for the manifest so far, of about `total`.
    Hashing { bytes: u64, total: u64 },
}

/// The seed of one expert's stream.
pub(crate) fn expert_seed(seed: u64, layer: usize, expert: usize) -> u64 {
    seed ^ ((layer as u64 + 1) << 40) ^ ((expert as u64 + 1) << 20) ^ 0x5EED
}

/// The expert file layouts `spec` implies with experts in `expert_format`.
pub(crate) fn layouts(spec: &ArchSpec, expert_format: QuantFormat) -> BTreeMap<usize, ExpertLayer> {
    let num_experts = spec.moe.as_ref().map_or(0, |m| m.num_experts);
    let mut out: BTreeMap<usize, ExpertLayer> = BTreeMap::new();
    for p in expected_expert_parts(spec) {
        let layout = out.entry(p.layer).or_insert_with(|| ExpertLayer {
            layer: p.layer,
            file: format!("{EXPERTS_DIR}/{:03}.bin", p.layer),
            num_experts,
            stride: 0,
            parts: Vec::new(),
        });
        let dtype = match p.shape.as_slice() {
            [_, cols] if cols % expert_format.block_elems() as u64 == 0 => expert_format,
            _ => QuantFormat::F32,
        };
        let elems: u64 = p.shape.iter().product();
        let length = dtype.bytes_for(elems).unwrap_or(elems * 4);
        let offset = align_up(layout.record_len(), RESIDENT_ALIGN);
        layout.parts.push(ExpertPart {
            name: p.part.to_string(),
            dtype,
            shape: p.shape.clone(),
            offset,
            length,
        });
    }
    for l in out.values_mut() {
        l.stride = align_up(l.record_len(), EXPERT_ALIGN);
    }
    out
}

/// One expert's parts, generated.
pub(crate) fn expert_parts(
    layout: &ExpertLayer,
    seed: u64,
    expert: usize,
    expert_format: QuantFormat,
) -> Result<Vec<Vec<u8>>, EngineError> {
    let mut random = RandomTensors::new(expert_seed(seed, layout.layer, expert), expert_format);
    layout
        .parts
        .iter()
        .map(|p| {
            let shape: Vec<usize> = p.shape.iter().map(|&d| d as usize).collect();
            let name = format!("blk.{}.experts.{expert}.{}", layout.layer, p.name);
            random.tensor_as(&name, &shape, p.dtype).map(|(_, b)| b)
        })
        .collect()
}

/// How a router matrix's and a router bias's names end.
const ROUTER_WEIGHT: &str = "ffn_gate_inp.weight";
const ROUTER_BIAS: &str = "ffn_gate_inp.bias";

/// Whether [`skew_router`] rewrites tensor `name`.
fn is_router(name: &str) -> bool {
    name.ends_with(ROUTER_WEIGHT) || name.ends_with(ROUTER_BIAS)
}

/// Rewrites a router tensor's random `values` for Zipf exponent `s`: the
/// matrix scaled to Gumbel-sized noise, the bias the log popularity of a
/// per-layer ranking. Other tensors are left alone.
pub(crate) fn skew_router(name: &str, values: &mut [f32], s: f64, seed: u64) {
    let layer = || -> usize {
        name.split('.')
            .nth(1)
            .and_then(|l| l.parse().ok())
            .unwrap_or(0)
    };
    if name.ends_with(ROUTER_WEIGHT) {
        let gain = router_gain(1.0) as f32;
        values.iter_mut().for_each(|v| *v *= gain);
    } else if name.ends_with(ROUTER_BIAS) {
        let bias = skewed_bias(values.len(), s, seed, layer());
        values.copy_from_slice(&bias);
    }
}

/// Refuses a router skew that is not a Zipf exponent, or that `spec` has no
/// router bias to carry.
pub(crate) fn check_router_skew(spec: &ArchSpec, opts: &SynthOptions) -> Result<(), EngineError> {
    check_skew(spec, opts.router_skew)
}

/// As [`check_router_skew`], for a skew `router_skew`.
pub(crate) fn check_skew(spec: &ArchSpec, router_skew: Option<f64>) -> Result<(), EngineError> {
    let Some(s) = router_skew else {
        return Ok(());
    };
    if !(s.is_finite() && s >= 0.0) {
        return Err(EngineError::BadOptions {
            detail: format!("router skew must be a Zipf exponent ≥ 0, got {s}"),
        });
    }
    if !expected_resident(spec)
        .iter()
        .any(|t| t.name.ends_with(ROUTER_BIAS))
    {
        return Err(EngineError::BadOptions {
            detail: format!(
                "a router skew needs a router bias, which {} has not",
                turbospark_format::families::name(&spec.family)
            ),
        });
    }
    Ok(())
}

/// Generates every expert of `layout`, `threads` at a time, and hands each
/// expert's parts (in the layout's order) to `sink` in expert order.
pub(crate) fn generate_experts(
    layout: &ExpertLayer,
    opts: &SynthOptions,
    sink: &mut dyn FnMut(usize, Vec<Vec<u8>>) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    let generate = |e: usize| expert_parts(layout, opts.seed, e, opts.expert_format);
    generate_experts_with(layout.num_experts, opts.threads, &generate, sink)
}

/// Experts `0..num_experts` made by `generate`, `threads` at a time, handed
/// to `sink` in expert order.
pub(crate) fn generate_experts_with(
    num_experts: usize,
    threads: usize,
    generate: &(dyn Fn(usize) -> Result<Vec<Vec<u8>>, EngineError> + Sync),
    sink: &mut dyn FnMut(usize, Vec<Vec<u8>>) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    let threads = threads.max(1);
    let mut first = 0;
    while first < num_experts {
        let batch: Vec<usize> = (first..num_experts.min(first + threads)).collect();
        let generated: Vec<Result<Vec<Vec<u8>>, EngineError>> = std::thread::scope(|s| {
            let handles: Vec<_> = batch
                .iter()
                .map(|&e| s.spawn(move || generate(e)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(EngineError::BadOptions {
                            detail: "an expert generator thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        for (&e, parts) in batch.iter().zip(generated) {
            sink(e, parts?)?;
        }
        first += batch.len();
    }
    Ok(())
}

/// Receives a drawn resident tensor: name, shape, format, encoded bytes.
pub(crate) type ResidentSink<'a> =
    dyn FnMut(&str, &[u64], QuantFormat, Vec<u8>) -> Result<(), EngineError> + 'a;

/// Every resident tensor of `spec` in [`expected_resident`]'s order, drawn
/// and encoded: `(name, shape, format, bytes)` to `sink`.
pub(crate) fn generate_resident(
    spec: &ArchSpec,
    opts: &SynthOptions,
    sink: &mut ResidentSink<'_>,
) -> Result<(), EngineError> {
    let mut random = RandomTensors::new(opts.seed, opts.resident_format);
    for t in expected_resident(spec) {
        let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
        let (format, bytes) = match opts.router_skew {
            Some(s) if is_router(&t.name) => {
                let mut values = random.values(&t.name, &shape);
                skew_router(&t.name, &mut values, s, opts.seed);
                encode_tensor(&values, &shape, opts.resident_format)?
            }
            _ => random.tensor_as(&t.name, &shape, opts.resident_format)?,
        };
        sink(&t.name, &t.shape, format, bytes)?;
    }
    Ok(())
}

/// Writes a random install of `spec` at `dst`.
pub fn write_synthetic_install(
    spec: &ArchSpec,
    dst: &Path,
    opts: &SynthOptions,
    progress: &mut dyn FnMut(SynthEvent),
) -> Result<Manifest, EngineError> {
    let mut quant = RoleQuant::new();
    let mut note = |role: String, f: QuantFormat| {
        let formats: &mut Vec<QuantFormat> = quant.entry(role).or_default();
        if !formats.contains(&f) {
            formats.push(f);
        }
    };

    let resident = expected_resident(spec);
    check_router_skew(spec, opts)?;
    let mut writer = InstallWriter::create(dst, opts.force)?;
    let mut resident_bytes = 0u64;
    let mut done = 0;
    generate_resident(spec, opts, &mut |name, shape, format, bytes| {
        resident_bytes += bytes.len() as u64;
        writer.add_resident(name, format, shape.to_vec(), &bytes)?;
        note(role_of(name), format);
        done += 1;
        progress(SynthEvent::Resident {
            done,
            total: resident.len(),
            bytes: 0,
            total_bytes: 0,
        });
        Ok(())
    })?;

    let layouts = layouts(spec, opts.expert_format);
    let total: u64 = layouts.values().map(|l| l.file_len()).sum();
    let mut written = 0u64;
    for layout in layouts.values() {
        for p in &layout.parts {
            note(format!("experts.{}", p.name), p.dtype);
        }
        writer.add_expert_layer(layout.clone())?;
        generate_experts(layout, opts, &mut |e, parts| {
            for (p, bytes) in layout.parts.iter().zip(parts) {
                writer.write_expert_part(layout.layer, e, &p.name, &bytes)?;
            }
            written += layout.stride;
            progress(SynthEvent::Experts {
                bytes: written,
                total,
            });
            Ok(())
        })?;
    }

    let parts = ManifestParts {
        arch: spec.clone(),
        source: SourceInfo {
            kind: "synthetic".into(),
            name: format!("seed {}", opts.seed),
        },
        tokenizer: None,
        chat_template: None,
        generation: GenerationDefaults::default(),
        skipped: Vec::new(),
    };
    let hash_total = resident_bytes + total;
    Ok(writer.finish(parts, quant, &mut |bytes| {
        progress(SynthEvent::Hashing {
            bytes,
            total: hash_total,
        })
    })?)
}
