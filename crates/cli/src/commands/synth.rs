//! `turbospark synth DST`: a random gpt-oss-shaped install (MXFP4 routed
//! experts, Q8_0 resident matrices), for benchmarking the expert store on a
//! model whose experts exceed memory. The defaults are gpt-oss-20b's
//! dimensions (24 layers of 32 experts, top-4, hidden 2880: about 9.5 GiB
//! of experts) with a smaller vocabulary.
//!
//! With `--like SRC` the install has exactly the layout of another: SRC is
//! an install or a layout file that `--save-layout FILE.json` wrote from
//! one (`turbospark_engine::synthetic_like`), so a model's shape can be
//! built where its weights are not available.
//!
//! With `--gguf FILE` the weights are first written as a GGUF file that
//! llama.cpp loads (`turbospark_engine::synthetic_gguf`), and the install
//! is made from that file by `turbospark convert`'s converter, so llama.cpp
//! and turbospark read the same bytes; the tensors are the ones synth
//! writes without `--gguf` for the same options.

use crate::progress::{human_bytes, Progress};
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use turbospark_core::QuantFormat;
use turbospark_engine::synthetic_gguf::write_synthetic_gguf;
use turbospark_engine::synthetic_install::{write_synthetic_install, SynthEvent, SynthOptions};
use turbospark_engine::synthetic_like::{write_like_install, InstallLayout, LikeOptions};
use turbospark_format::convert::{convert, ConvertEvent, ConvertOptions};
use turbospark_format::install::Manifest;

/// The gpt-oss dimension and format options, which `--like` replaces.
const DIMENSIONS: [&str; 10] = [
    "layers",
    "experts",
    "top_k",
    "hidden",
    "expert_intermediate",
    "heads",
    "kv_heads",
    "head_dim",
    "vocab",
    "resident_format",
];

#[derive(clap::Args)]
pub struct Args {
    /// The install directory to create.
    #[arg(required_unless_present = "save_layout")]
    pub dst: Option<PathBuf>,
    /// Copy the layout of SRC, an install or a layout file: its family and
    /// architecture, every tensor's name, shape and format, its expert
    /// files, tokenizer, chat template and generation defaults; only the
    /// weights are random.
    #[arg(long, value_name = "SRC", conflicts_with_all = DIMENSIONS, conflicts_with = "gguf")]
    pub like: Option<PathBuf>,
    /// Write the layout of `--like`'s install to FILE.json (a few MiB: no
    /// weights), from which `--like FILE.json` builds the same layout on
    /// another machine.
    #[arg(long, value_name = "FILE.json", requires = "like")]
    pub save_layout: Option<PathBuf>,
    #[arg(long, default_value_t = 24)]
    pub layers: usize,
    /// Routed experts per layer.
    #[arg(long, default_value_t = 32)]
    pub experts: usize,
    #[arg(long, default_value_t = 4)]
    pub top_k: usize,
    #[arg(long, default_value_t = 2880)]
    pub hidden: usize,
    /// Intermediate size of one expert.
    #[arg(long, default_value_t = 2880)]
    pub expert_intermediate: usize,
    #[arg(long, default_value_t = 64)]
    pub heads: usize,
    #[arg(long, default_value_t = 8)]
    pub kv_heads: usize,
    #[arg(long, default_value_t = 64)]
    pub head_dim: usize,
    #[arg(long, default_value_t = 32000)]
    pub vocab: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Zipf exponent of the experts' popularity: each layer's router is
    /// biased so selections follow p(rank r) ∝ (r+1)^-S over a random
    /// ranking of its experts (0 or absent: random routing, nearly
    /// uniform).
    #[arg(long, value_name = "S")]
    pub router_skew: Option<f64>,
    /// Format of the resident matrices (attention, router, embedding and
    /// output head): `q8_0`, or `bf16` as gpt-oss's own checkpoint and
    /// ggml-org's GGUF keep them. Routed experts are MXFP4 either way.
    #[arg(long, value_enum, default_value_t = ResidentFormat::Q8_0)]
    pub resident_format: ResidentFormat,
    /// Also write the weights as a GGUF file for llama.cpp (gpt-oss
    /// architecture, MXFP4 experts, a minimal byte-level vocabulary), and
    /// make the install by converting that file.
    #[arg(long, value_name = "FILE.gguf")]
    pub gguf: Option<PathBuf>,
    /// Generator threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Replace DST if it exists.
    #[arg(long)]
    pub force: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Formats `--resident-format` offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ResidentFormat {
    #[value(name = "q8_0")]
    Q8_0,
    Bf16,
}

impl ResidentFormat {
    fn quant_format(self) -> QuantFormat {
        match self {
            ResidentFormat::Q8_0 => QuantFormat::Q8_0,
            ResidentFormat::Bf16 => QuantFormat::Bf16,
        }
    }
}

/// The HF `config.json` of a gpt-oss model of these dimensions.
fn config(a: &Args) -> serde_json::Value {
    let layer_types: Vec<&str> = (0..a.layers)
        .map(|l| {
            if l % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    json!({
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "attention_bias": true,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "intermediate_size": a.expert_intermediate,
        "layer_types": layer_types,
        "max_position_embeddings": 131072,
        "num_attention_heads": a.heads,
        "num_experts_per_tok": a.top_k,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv_heads,
        "num_local_experts": a.experts,
        "quantization_config": {"quant_method": "mxfp4"},
        "rms_norm_eps": 1e-5,
        "rope_parameters": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_theta": 150000.0,
            "rope_type": "yarn",
            "truncate": false
        },
        "sliding_window": 128,
        "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": false,
        "vocab_size": a.vocab
    })
}

/// Runs a synthetic writer with progress bars for its phases.
fn write_with_progress<T>(
    a: &Args,
    write: impl FnOnce(&mut dyn FnMut(SynthEvent)) -> Result<T>,
) -> Result<T> {
    let mut resident_bar: Option<Progress> = None;
    let mut expert_bar: Option<Progress> = None;
    let mut hash_bar: Option<Progress> = None;
    let out = write(&mut |ev| match ev {
        SynthEvent::Resident {
            done,
            total,
            bytes,
            total_bytes,
        } => resident_bar
            .get_or_insert_with(|| Progress::new("resident", total, total_bytes, a.quiet))
            .update(done, bytes),
        SynthEvent::Experts { bytes, total } => expert_bar
            .get_or_insert_with(|| Progress::new("experts ", 0, total, a.quiet))
            .update(0, bytes),
        SynthEvent::Hashing { bytes, total } => hash_bar
            .get_or_insert_with(|| Progress::new("sha256  ", 0, total, a.quiet))
            .update(0, bytes),
    })?;
    for bar in [&mut resident_bar, &mut expert_bar, &mut hash_bar]
        .into_iter()
        .flatten()
    {
        bar.finish();
    }
    Ok(out)
}

/// `--like SRC`: saves the layout and writes the install, as asked.
fn run_like(a: &Args, src: &Path) -> Result<ExitCode> {
    let layout = InstallLayout::load(src)
        .with_context(|| format!("reading the layout of {}", src.display()))?;
    if let Some(file) = &a.save_layout {
        if file.exists() && !a.force {
            bail!(
                "{} already exists (use --force to replace it)",
                file.display()
            );
        }
        layout
            .save(file)
            .with_context(|| format!("writing {}", file.display()))?;
        if !a.quiet {
            eprintln!(
                "wrote {} (the layout of {}: {} {}, {} resident tensors, {} expert files, {} of weights)",
                file.display(),
                src.display(),
                turbospark_format::families::name(&layout.arch.family),
                layout.source.name,
                layout.resident.len(),
                layout.experts.len(),
                human_bytes(layout.weight_bytes())
            );
        }
    }
    let Some(dst) = &a.dst else {
        return Ok(ExitCode::SUCCESS);
    };
    if let (Ok(d), Ok(s)) = (dst.canonicalize(), src.canonicalize()) {
        if d == s {
            bail!(
                "{} is the source of the layout; choose another destination",
                dst.display()
            );
        }
    }
    let opts = LikeOptions {
        seed: a.seed,
        threads: threads(a),
        force: a.force,
        router_skew: a.router_skew.filter(|&s| s != 0.0),
    };
    let start = Instant::now();
    let manifest = write_with_progress(a, |sink| {
        write_like_install(&layout, dst, &opts, sink)
            .with_context(|| format!("writing {}", dst.display()))
    })?;
    if !a.quiet {
        eprintln!(
            "wrote {} (synthetic {} like {}: {} resident, {} in {} expert files) in {:.1}s",
            dst.display(),
            turbospark_format::families::name(&manifest.arch.family),
            layout.source.name,
            human_bytes(manifest.resident_bytes),
            human_bytes(manifest.expert_bytes()),
            manifest.experts.len(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn threads(a: &Args) -> usize {
    a.threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Converts the synthetic GGUF into the install, with a progress bar.
fn convert_with_progress(gguf: &Path, dst: &Path, a: &Args) -> Result<Manifest> {
    let mut bar: Option<Progress> = None;
    let manifest = convert(
        gguf,
        dst,
        ConvertOptions { force: a.force },
        &mut |ev| match ev {
            ConvertEvent::Planned { tensors, bytes } => {
                bar = Some(Progress::new("convert ", tensors, bytes, a.quiet));
            }
            ConvertEvent::Tensor { done, bytes_done } => {
                if let Some(b) = bar.as_mut() {
                    b.update(done, bytes_done);
                }
            }
            ConvertEvent::Hashing { .. } => {}
        },
    )
    .with_context(|| format!("converting {} into {}", gguf.display(), dst.display()))?;
    if let Some(b) = bar.as_mut() {
        b.finish();
    }
    Ok(manifest)
}

pub fn run(a: Args) -> Result<ExitCode> {
    if let Some(src) = &a.like {
        return run_like(&a, src);
    }
    let Some(dst) = &a.dst else {
        bail!("synth needs a destination directory");
    };
    let spec = turbospark_format::spec::hf::spec_from_hf_config(&config(&a))
        .context("the requested dimensions do not make a valid gpt-oss model")?;
    let opts = SynthOptions {
        seed: a.seed,
        resident_format: a.resident_format.quant_format(),
        expert_format: QuantFormat::Mxfp4,
        threads: threads(&a),
        force: a.force,
        router_skew: a.router_skew.filter(|&s| s != 0.0),
    };
    let start = Instant::now();
    let manifest = match &a.gguf {
        None => write_with_progress(&a, |sink| {
            write_synthetic_install(&spec, dst, &opts, sink)
                .with_context(|| format!("writing {}", dst.display()))
        })?,
        Some(gguf) => {
            for path in [gguf, dst] {
                if path.exists() && !a.force {
                    bail!(
                        "{} already exists (use --force to replace it)",
                        path.display()
                    );
                }
            }
            write_with_progress(&a, |sink| {
                write_synthetic_gguf(&spec, gguf, &opts, sink)
                    .with_context(|| format!("writing {}", gguf.display()))
            })?;
            if !a.quiet {
                eprintln!(
                    "wrote {}; converting it into {}",
                    gguf.display(),
                    dst.display()
                );
            }
            convert_with_progress(gguf, dst, &a)?
        }
    };
    if !a.quiet {
        eprintln!(
            "wrote {} (synthetic gpt_oss: {} resident, {} in {} expert files, stride {}) in {:.1}s",
            dst.display(),
            human_bytes(manifest.resident_bytes),
            human_bytes(manifest.expert_bytes()),
            manifest.experts.len(),
            human_bytes(manifest.experts.first().map_or(0, |e| e.stride)),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(ExitCode::SUCCESS)
}
