//! Specs of every family, from the tiny fixtures' config.json (so they are
//! the real ArchSpec rows the converter builds), optionally resized.

#![allow(dead_code)]

use serde_json::Value;
use std::path::Path;
use turbospark_core::ArchSpec;
use turbospark_cpu::CpuDevice;
use turbospark_engine::synthetic::SyntheticSource;
use turbospark_engine::Model;

pub const FAMILIES: &[&str] = &[
    "llama",
    "qwen2",
    "gemma3",
    "muse_glimmer",
    "mixtral",
    "qwen3moe",
    "gpt_oss",
    "glm4_moe",
    "gemma4",
    "deepseek_v3",
    "qwen3_5_moe",
];

/// The fixture's config.json with `overrides` applied at the top level.
pub fn config(family: &str, overrides: &[(&str, Value)]) -> Option<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(family)
        .join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    for (k, v) in overrides {
        cfg[*k] = v.clone();
    }
    Some(cfg)
}

pub fn spec(family: &str, overrides: &[(&str, Value)]) -> Option<ArchSpec> {
    let cfg = config(family, overrides)?;
    Some(turbospark_format::spec::hf::spec_from_hf_config(&cfg).unwrap())
}

/// A model of random weights for `spec` on a CPU backend of `threads`.
pub fn model(spec: &ArchSpec, threads: usize) -> Model<CpuDevice> {
    model_as(
        spec,
        threads,
        turbospark_core::QuantFormat::F32,
        turbospark_cpu::Numerics::Exact,
    )
}

/// As [`model`], matrices stored as `format`, computed in `numerics`.
#[allow(dead_code)]
pub fn model_as(
    spec: &ArchSpec,
    threads: usize,
    format: turbospark_core::QuantFormat,
    numerics: turbospark_cpu::Numerics,
) -> Model<CpuDevice> {
    let src = SyntheticSource::new(spec, 0xC0FFEE, format).unwrap();
    let device = CpuDevice::new(threads).unwrap().with_numerics(numerics);
    Model::from_source(spec.clone(), &src, device).unwrap()
}

/// `max|got − want| / max|want|`: how far two logits arrays are apart,
/// relative to their scale.
pub fn max_rel_diff(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "logits lengths");
    let scale = want.iter().fold(0f64, |m, &w| m.max(f64::from(w).abs()));
    let diff = got.iter().zip(want).fold(0f64, |m, (&g, &w)| {
        let d = (f64::from(g) - f64::from(w)).abs();
        // A NaN is as far as can be.
        if d.is_nan() {
            f64::INFINITY
        } else {
            m.max(d)
        }
    });
    diff / scale
}

/// How far apart ([`max_rel_diff`]) the logits of one token sequence may
/// be when a family's gated DeltaNet layers see it cut into other passes:
/// a pass of several tokens runs the recurrence in chunks (HF's prefill
/// form), one token steps it (HF's decode form), the same function summed
/// in another order. The bound the HF fixtures hold logits to
/// (`crates/cli/tests/tiny_logits.rs`). Every other layer computes a row
/// the same way whatever the pass, so other families match exactly.
pub const RECURRENT_PASS_TOLERANCE: f64 = 1e-4;

/// Deterministic token ids below `vocab`.
pub fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect()
}

/// The MoE families with tiny fixtures.
pub const MOE_FAMILIES: &[&str] = &[
    "mixtral",
    "qwen3moe",
    "gpt_oss",
    "gemma4",
    "glm4_moe",
    "deepseek_v3",
    "qwen3_5_moe",
];

/// A fresh install of the `family` fixture, converted into a temporary
/// directory named after `tag` (removed when the value drops); `None` when
/// the fixture is absent.
pub struct TempInstall {
    pub dir: std::path::PathBuf,
}

impl TempInstall {
    pub fn convert(family: &str, tag: &str) -> Option<TempInstall> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tiny")
            .join(family);
        if !src.join("model.safetensors").is_file() {
            return None;
        }
        let dir = std::env::temp_dir().join(format!(
            "turbospark-engine-{tag}-{family}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        turbospark_format::convert::convert(
            &src,
            &dir,
            turbospark_format::convert::ConvertOptions { force: true },
            &mut |_| {},
        )
        .unwrap();
        Some(TempInstall { dir })
    }

    pub fn open(&self) -> turbospark_format::install::Install {
        turbospark_format::install::Install::open(&self.dir).unwrap()
    }
}

impl Drop for TempInstall {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
