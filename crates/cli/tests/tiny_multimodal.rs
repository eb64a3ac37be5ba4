//! Conditional-generation checkpoints: a vision tower and projector beside
//! the language model.
//!
//! tests/fixtures/tiny-multimodal/<family>/ are HF transformers 5.24.0
//! `*ForConditionalGeneration` checkpoints (scripts/fixtures/
//! make_tiny_multimodal.py) whose language model holds the weights of the
//! text fixture tests/fixtures/tiny/<family>/; the generator checked that
//! HF's forward of the whole model reproduces the text fixture's logits.
//! Per family, `convert` must say on stderr what it skipped (even with
//! `-q`), record it in the manifest, and the install's logits must be the
//! text fixture install's bit for bit (the same weights in the same order;
//! tiny_logits.rs holds that install to HF's logits).

mod common;

use common::{json_ids, Work};
use std::path::{Path, PathBuf};
use std::process::Command;
use turbospark_cpu::{CpuDevice, Numerics};
use turbospark_engine::{Model, SessionOptions};
use turbospark_format::install::Install;

const FAMILIES: &[&str] = &["gemma3", "gemma4", "muse_glimmer", "qwen3_5_moe"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `convert -q`, returning stderr.
fn convert(src: &Path, dst: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args([
            "convert",
            "-q",
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "convert {}: {stderr}", src.display());
    stderr
}

fn logits(install: &Path, tokens: &[u32]) -> Vec<f32> {
    let install = Install::open(install).unwrap();
    let backend = CpuDevice::with_available_threads()
        .unwrap()
        .with_numerics(Numerics::Exact);
    let model = Model::load(&install, backend).unwrap();
    let mut session = model.session(SessionOptions::new(tokens.len())).unwrap();
    let mut out = vec![0f32; tokens.len() * model.vocab_size()];
    session.prefill(tokens, &mut out).unwrap();
    out
}

#[test]
fn vision_towers_are_skipped_and_the_language_model_matches_the_text_fixture() {
    let work = Work::new("turbospark-tiny-multimodal");
    for &family in FAMILIES {
        let mm = repo().join("tests/fixtures/tiny-multimodal").join(family);
        let text = repo().join("tests/fixtures/tiny").join(family);
        let tokens: serde_json::Value =
            serde_json::from_slice(&std::fs::read(text.join("tokens.json")).unwrap()).unwrap();
        let tokens = json_ids(&tokens["tokens"]);

        let mm_install = work.0.join(format!("{family}.mm"));
        let text_install = work.0.join(format!("{family}.text"));
        let stderr = convert(&mm, &mm_install);
        convert(&text, &text_install);
        // Qwen3.5's patch merger lives inside its vision tower (`visual.merger`).
        let expected: &[&str] = match family {
            "qwen3_5_moe" => &["vision tower"],
            _ => &["vision tower", "multimodal projector"],
        };
        for &part in expected {
            assert!(
                stderr.contains(&format!("skipped the {part} (")),
                "{family}: convert did not report the {part}: {stderr}"
            );
        }
        let manifest = Install::open(&mm_install).unwrap().manifest;
        let parts: Vec<&str> = manifest.skipped.iter().map(|s| s.part.as_str()).collect();
        assert_eq!(parts, expected, "{family}");
        assert!(manifest
            .skipped
            .iter()
            .all(|s| s.tensors > 0 && s.bytes > 0));
        let text_manifest = Install::open(&text_install).unwrap().manifest;
        assert!(text_manifest.skipped.is_empty());
        assert_eq!(manifest.arch, text_manifest.arch, "{family}: spec");

        let a = logits(&mm_install, &tokens);
        let b = logits(&text_install, &tokens);
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{family}: the multimodal checkpoint's logits differ from the text fixture's"
        );
        println!(
            "{family:>13}: skipped {:?}, logits identical",
            manifest.skipped
        );
    }
}
