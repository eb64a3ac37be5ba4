//! How faithful [`Numerics::Fast`] is to [`Numerics::Exact`], measured as
//! llama.cpp's own arithmetic is: the mean over positions of
//! `KL(exact ‖ mode)` over the full vocabulary (natural log, f64), from one
//! prefill of the same tokens in each mode.
//!
//! - Real GGUF models (SmolLM2-135M Q4_1, Gemma-3-270M Q4_K_M,
//!   Qwen2.5-Coder-0.5B Q4_K_M; skipped when absent from the cache unless
//!   TURBOSPARK_REQUIRE_MODELS is set) over a 256-token random-word text:
//!   fast's mean KL must be at most [`MAX_MEAN_KL`] and at most
//!   [`MAX_RATIO_TO_LLAMA_CPP`] times that of [`Numerics::LlamaCpp`] (which
//!   reproduces llama.cpp's CPU arithmetic) on the same tokens.
//! - Every tiny HF fixture family: mean KL at most [`MAX_MEAN_KL`] over its
//!   recorded tokens.
//!
//! The reference is the exact mode, which the HF-parity tests hold to HF
//! transformers, and llama.cpp's arithmetic as an independent yardstick.
//! Run in the optimised profile: `cargo test --profile test-opt -p
//! turbospark-cli --test fast_fidelity -- --nocapture`.

mod common;

use common::{cache_dir, convert_to_temp, log_softmax};
use std::path::{Path, PathBuf};
use turbospark_cpu::{CpuDevice, Numerics};
use turbospark_engine::{Model, SessionOptions};
use turbospark_format::install::Install;

const MAX_MEAN_KL: f64 = 5e-3;
const MAX_RATIO_TO_LLAMA_CPP: f64 = 1.25;
const TEXT_TOKENS: usize = 256;

/// `[n, vocab]` logits of one prefill of `tokens` in `numerics`.
fn logits(install: &Install, numerics: Numerics, tokens: &[u32]) -> (usize, Vec<f32>) {
    let backend = CpuDevice::with_available_threads()
        .unwrap()
        .with_numerics(numerics);
    let model = Model::load(install, backend).unwrap();
    let vocab = model.vocab_size();
    let mut session = model.session(SessionOptions::new(tokens.len())).unwrap();
    let mut out = vec![0f32; tokens.len() * vocab];
    session.prefill(tokens, &mut out).unwrap();
    (vocab, out)
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b })
}

/// Mean `KL(p ‖ q)` over rows and the share of rows with the same argmax.
fn mean_kl(vocab: usize, p: &[f32], q: &[f32]) -> (f64, f64) {
    let rows = p.len() / vocab;
    let (mut kl, mut agree) = (0f64, 0usize);
    for r in 0..rows {
        let (pr, qr) = (
            &p[r * vocab..(r + 1) * vocab],
            &q[r * vocab..(r + 1) * vocab],
        );
        let (lp, lq) = (log_softmax(pr), log_softmax(qr));
        kl += lp
            .iter()
            .zip(&lq)
            .map(|(a, b)| a.exp() * (a - b))
            .sum::<f64>();
        agree += usize::from(argmax(pr) == argmax(qr));
    }
    (kl / rows as f64, agree as f64 / rows as f64)
}

/// A deterministic text of common words in random order.
fn random_words() -> String {
    const WORDS: &[&str] = &[
        "the",
        "river",
        "quietly",
        "number",
        "of",
        "green",
        "machines",
        "walked",
        "under",
        "a",
        "bright",
        "window",
        "because",
        "seven",
        "old",
        "friends",
        "remember",
        "music",
        "and",
        "paper",
        "houses",
        "near",
        "cold",
        "mountains",
        "while",
        "children",
        "sing",
        "about",
        "strange",
        "animals",
        "in",
        "summer",
        "gardens",
        "when",
        "light",
        "falls",
        "across",
        "empty",
        "streets",
        "before",
        "dinner",
        "with",
        "their",
        "tired",
        "dogs",
    ];
    let mut s = 0x2545_f491_4f6c_dd1du64;
    (0..400)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            WORDS[(s % WORDS.len() as u64) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn check_real_model(file: &str, tag: &str) -> Option<String> {
    let gguf = cache_dir().join("models").join(file);
    if !gguf.exists() {
        assert!(
            std::env::var_os("TURBOSPARK_REQUIRE_MODELS").is_none(),
            "{} is absent although TURBOSPARK_REQUIRE_MODELS is set",
            gguf.display()
        );
        eprintln!(
            "skipped {tag}: {} not in the cache (scripts/fetch-models.sh)",
            gguf.display()
        );
        return None;
    }
    let dir = convert_to_temp(&gguf, tag);
    let tokenizer = turbospark_text::Tokenizer::from_install_dir(&dir).unwrap();
    let mut tokens = tokenizer.encode(&random_words(), true).unwrap();
    assert!(
        tokens.len() >= TEXT_TOKENS,
        "{tag}: text gave {} tokens",
        tokens.len()
    );
    tokens.truncate(TEXT_TOKENS);
    let install = Install::open(&dir).unwrap();
    let (vocab, exact) = logits(&install, Numerics::Exact, &tokens);
    let (_, llama) = logits(&install, Numerics::LlamaCpp, &tokens);
    let (_, fast) = logits(&install, Numerics::Fast, &tokens);
    let _ = std::fs::remove_dir_all(&dir);
    let (kl_llama, top1_llama) = mean_kl(vocab, &exact, &llama);
    let (kl_fast, top1_fast) = mean_kl(vocab, &exact, &fast);
    eprintln!(
        "{tag}: vs exact over {} tokens: llama-cpp mean KL {kl_llama:.5} (top-1 {:.1}%), fast mean KL {kl_fast:.5} (top-1 {:.1}%), ratio {:.2}",
        tokens.len(),
        100.0 * top1_llama,
        100.0 * top1_fast,
        kl_fast / kl_llama
    );
    if kl_fast > MAX_MEAN_KL || kl_fast > MAX_RATIO_TO_LLAMA_CPP * kl_llama {
        return Some(format!(
            "{tag}: fast mean KL {kl_fast:.5} (limit {MAX_MEAN_KL}, llama-cpp {kl_llama:.5} × {MAX_RATIO_TO_LLAMA_CPP})"
        ));
    }
    None
}

#[test]
fn fast_is_as_faithful_as_llama_cpp_on_real_models() {
    let failures: Vec<String> = [
        ("smollm2-135m-instruct-q4_1.gguf", "fast-smollm2"),
        ("gemma3-270m-q4_k_m.gguf", "fast-gemma3"),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "fast-qwen25"),
    ]
    .into_iter()
    .filter_map(|(file, tag)| check_real_model(file, tag))
    .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny")
}

#[test]
fn fast_is_faithful_on_every_fixture_family() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let dir = entry.unwrap().path();
        let tokens_file = dir.join("tokens.json");
        if !tokens_file.exists() {
            continue;
        }
        let family = dir.file_name().unwrap().to_string_lossy().into_owned();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&tokens_file).unwrap()).unwrap();
        let tokens: Vec<u32> = v
            .as_array()
            .or_else(|| v["tokens"].as_array())
            .unwrap_or_else(|| panic!("{family}: tokens.json is not a list of ids"))
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let install_dir = convert_to_temp(&dir, &format!("fast-fixture-{family}"));
        let install = Install::open(&install_dir).unwrap();
        let (vocab, exact) = logits(&install, Numerics::Exact, &tokens);
        let (_, fast) = logits(&install, Numerics::Fast, &tokens);
        let _ = std::fs::remove_dir_all(&install_dir);
        let (kl, top1) = mean_kl(vocab, &exact, &fast);
        eprintln!(
            "{family}: fast vs exact mean KL {kl:.2e}, top-1 {:.1}%",
            100.0 * top1
        );
        if kl > MAX_MEAN_KL {
            failures.push(format!("{family}: mean KL {kl:.5} > {MAX_MEAN_KL}"));
        }
        checked += 1;
    }
    assert!(checked >= 9, "only {checked} fixture families found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
