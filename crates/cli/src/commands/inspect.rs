//! `turbospark inspect PATH`: an install, a GGUF file or an HF directory.

use crate::progress::human_bytes;
use anyhow::Result;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use turbospark_core::arch::{ArchSpec, RouterKind};
use turbospark_format::convert::inspect_source;
use turbospark_format::install::{reader::read_manifest, Install, MANIFEST_FILE};

#[derive(clap::Args)]
pub struct Args {
    /// An install directory, a `.gguf` file or an HF checkpoint directory.
    pub path: PathBuf,
    /// List every tensor (name, type, shape, bytes, placement).
    #[arg(long)]
    pub tensors: bool,
    /// Show the memory needed with this many expert cache slots per MoE
    /// layer (default: top_k, 2×top_k and all experts).
    #[arg(long)]
    pub slots: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

struct Row {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    bytes: u64,
    placement: String,
}

struct Summary {
    kind: String,
    spec: ArchSpec,
    resident_bytes: u64,
    /// (layer, stride, experts) per MoE layer; stride is 0 for sources.
    experts: Vec<(usize, u64, usize)>,
    expert_bytes: u64,
    rows: Vec<Row>,
}

fn summarize(path: &Path) -> Result<Summary> {
    if path.is_dir() && path.join(MANIFEST_FILE).is_file() {
        // Validate the install fully when it can be opened; fall back to the
        // manifest alone so a damaged install can still be described.
        let manifest = match Install::open(path) {
            Ok(i) => i.manifest,
            Err(e) => {
                eprintln!("warning: install does not open cleanly: {e}");
                read_manifest(path)?
            }
        };
        let index: turbospark_format::install::ResidentIndex = serde_json::from_slice(
            &std::fs::read(path.join(&manifest.resident_index)).unwrap_or_default(),
        )
        .unwrap_or(turbospark_format::install::ResidentIndex { tensors: vec![] });
        let mut rows: Vec<Row> = index
            .tensors
            .iter()
            .map(|t| Row {
                name: t.name.clone(),
                dtype: t.dtype.to_string(),
                shape: t.shape.clone(),
                bytes: t.length,
                placement: "resident".into(),
            })
            .collect();
        for l in &manifest.experts {
            for p in &l.parts {
                let mut shape = vec![l.num_experts as u64];
                shape.extend(&p.shape);
                rows.push(Row {
                    name: format!("blk.{}.experts.{}", l.layer, p.name),
                    dtype: p.dtype.to_string(),
                    shape,
                    bytes: p.length * l.num_experts as u64,
                    placement: format!("{} @+{}", l.file, p.offset),
                });
            }
        }
        return Ok(Summary {
            kind: format!(
                "install (from {} {})",
                manifest.source.kind, manifest.source.name
            ),
            experts: manifest
                .experts
                .iter()
                .map(|l| (l.layer, l.stride, l.num_experts))
                .collect(),
            expert_bytes: manifest.expert_bytes(),
            resident_bytes: manifest.resident_bytes,
            spec: manifest.arch,
            rows,
        });
    }
    let s = inspect_source(path)?;
    let resident_bytes = s
        .tensors
        .iter()
        .filter(|t| t.placement == "resident")
        .map(|t| t.bytes)
        .sum();
    let expert_bytes = s
        .tensors
        .iter()
        .filter(|t| t.placement == "expert")
        .map(|t| t.bytes)
        .sum();
    let experts = s
        .spec
        .moe
        .map(|m| s.spec.moe_layers().map(|l| (l, 0, m.num_experts)).collect())
        .unwrap_or_default();
    Ok(Summary {
        kind: s.kind.to_string(),
        rows: s
            .tensors
            .into_iter()
            .map(|t| Row {
                name: t.name,
                dtype: t.dtype,
                shape: t.shape,
                bytes: t.bytes,
                placement: t.placement.to_string(),
            })
            .collect(),
        spec: s.spec,
        resident_bytes,
        experts,
        expert_bytes,
    })
}

fn router_name(r: &RouterKind) -> String {
    match r {
        RouterKind::SoftmaxTopK { renormalize } => {
            format!(
                "softmax → top-k{}",
                if *renormalize { " → renormalise" } else { "" }
            )
        }
        RouterKind::TopKSoftmax => "top-k on logits → softmax".into(),
        RouterKind::SigmoidGrouped {
            n_group,
            topk_group,
            renormalize,
            scaling,
        } => format!(
            "sigmoid + bias, {topk_group} of {n_group} groups{}, × {scaling}",
            if *renormalize { ", renormalised" } else { "" }
        ),
        RouterKind::Gemma4 => "gemma4 (scaled RMS input, per-expert scale)".into(),
    }
}

/// Memory for `slots` expert slots per layer on top of the resident bytes
/// (installs only: sources have no stride yet).
fn slot_memory(s: &Summary, slots: usize) -> u64 {
    s.resident_bytes
        + s.experts
            .iter()
            .map(|(_, stride, n)| stride * slots.min(*n) as u64)
            .sum::<u64>()
}

pub fn run(a: Args) -> Result<ExitCode> {
    let s = summarize(&a.path)?;
    let spec = &s.spec;
    let slot_counts: Vec<usize> = match (a.slots, &spec.moe) {
        (Some(n), _) => vec![n],
        (None, Some(m)) => {
            let mut v = vec![m.top_k, 2 * m.top_k, m.num_experts];
            v.dedup();
            v.retain(|&n| n <= m.num_experts);
            v
        }
        (None, None) => vec![],
    };
    let is_install = s.experts.iter().any(|e| e.1 > 0) || spec.moe.is_none();
    if a.json {
        let out = json!({
            "kind": s.kind,
            "arch": spec,
            "layer_pattern": spec.layer_pattern(),
            "resident_bytes": s.resident_bytes,
            "expert_bytes": s.expert_bytes,
            "expert_layers": s.experts.iter().map(|(l, stride, n)| json!({"layer": l, "stride": stride, "experts": n})).collect::<Vec<_>>(),
            "memory_for_slots": slot_counts.iter().filter(|_| is_install).map(|&n| json!({"slots": n, "bytes": slot_memory(&s, n)})).collect::<Vec<_>>(),
            "tensors": if a.tensors { s.rows.iter().map(|r| json!({"name": r.name, "dtype": r.dtype, "shape": r.shape, "bytes": r.bytes, "placement": r.placement})).collect::<Vec<_>>() } else { vec![] },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("source:        {}", s.kind);
    println!(
        "family:        {}",
        turbospark_format::families::name(&spec.family)
    );
    println!("vocab:         {}", spec.vocab_size);
    println!("hidden:        {}", spec.hidden_size);
    println!("layers:        {}", spec.num_layers());
    println!(
        "heads:         {} q / {} kv, head_dim {}",
        spec.num_heads, spec.num_kv_heads, spec.head_dim
    );
    println!(
        "ffn:           {} ({:?})",
        spec.intermediate_size, spec.activation
    );
    println!("max position:  {}", spec.max_position);
    if let Some(r) = spec.layers.iter().find_map(|l| l.rope) {
        println!(
            "rope:          {:?} theta {} rotary_dim {} {:?}",
            r.kind, r.theta, r.rotary_dim, r.scaling
        );
    }
    println!("layer pattern: {}", spec.layer_pattern());
    println!(
        "head:          {}{}{}",
        if spec.head.tied { "tied" } else { "untied" },
        if spec.head.multiplier != 1.0 {
            format!(", × {}", spec.head.multiplier)
        } else {
            String::new()
        },
        spec.head
            .softcap
            .map(|c| format!(", softcap {c}"))
            .unwrap_or_default()
    );
    if let Some(m) = &spec.moe {
        println!(
            "moe:           {} experts, top {}, expert ffn {}, router: {}{}",
            m.num_experts,
            m.top_k,
            m.expert_intermediate,
            router_name(&m.router),
            m.shared_intermediate
                .map(|s| format!(", shared expert {s}"))
                .unwrap_or_default()
        );
    }
    println!(
        "resident:      {} ({} bytes)",
        human_bytes(s.resident_bytes),
        s.resident_bytes
    );
    if !s.experts.is_empty() {
        let (_, stride, n) = s.experts[0];
        let stride_text = if stride > 0 {
            format!("stride {} ({stride} bytes), ", human_bytes(stride))
        } else {
            String::new()
        };
        println!(
            "experts:       {} layers × {n} experts, {stride_text}{} in all",
            s.experts.len(),
            human_bytes(s.expert_bytes)
        );
        if is_install {
            for n in &slot_counts {
                println!(
                    "memory:        {n} slots/layer → {} (resident + slots × stride × layers)",
                    human_bytes(slot_memory(&s, *n))
                );
            }
        }
    }
    if a.tensors {
        println!();
        println!(
            "{:<44} {:>6} {:>22} {:>12}  placement",
            "tensor", "type", "shape", "bytes"
        );
        for r in &s.rows {
            println!(
                "{:<44} {:>6} {:>22} {:>12}  {}",
                r.name,
                r.dtype,
                format!("{:?}", r.shape),
                r.bytes,
                r.placement
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
