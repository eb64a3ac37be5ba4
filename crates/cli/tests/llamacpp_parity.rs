//! Real GGUF models against llama.cpp: the greedy references in
//! tests/reference/llamacpp/<name>.greedy.json (recorded by
//! scripts/llamacpp/make_reference.sh: the prompt ids, 32 greedy tokens and
//! the top-64 log-probabilities of every generated position).
//!
//! Per model (skipped when its GGUF is not in the cache, unless
//! TURBOSPARK_REQUIRE_MODELS is set), in both numerics of the CPU backend:
//!
//! - teacher forcing: one prefill of the prompt plus llama.cpp's greedy
//!   tokens gives our distribution at each generated position; the mean
//!   KL(llama.cpp ‖ ours) over positions, computed on the recorded top 64
//!   plus the remaining mass as one bucket, must stay below
//!   [`MAX_MEAN_KL`], and wherever our argmax differs from llama.cpp's
//!   token, llama.cpp's own log-probabilities must show a near tie (gap
//!   below [`NEAR_TIE`]);
//! - free-running greedy decode (the prompt in one prefill, then our own
//!   argmax fed back one token at a time):
//!   - with [`Numerics::LlamaCpp`], which reproduces ggml's arithmetic
//!     (quantized activations, integer block dots, f16 KV cache and
//!     attention operands), all 32 tokens must equal llama.cpp's;
//!   - with [`Numerics::Exact`] (dequantized weights, f32), small
//!     differences from llama.cpp's 8-bit activations are expected, so the
//!     tokens must agree up to the first position where the two pick
//!     different tokens, which must be such a near tie too.
//!
//! At a divergence the test prints the top-2 gap of both engines there. A
//! wrong rope layout, norm or head shows up as a KL orders of magnitude
//! larger. Run in the optimised profile: `cargo test --profile test-opt -p
//! turbospark-cli --test llamacpp_parity -- --nocapture`.

mod common;

use common::{
    cache_dir, convert_to_temp, json_ids, llamacpp_reference_dir, log_softmax, ref_gap, NEAR_TIE,
};

use serde_json::Value;
use std::path::{Path, PathBuf};
use turbospark_cpu::{CpuDevice, Numerics};
use turbospark_engine::{Logits, Model, SessionOptions};
use turbospark_format::install::Install;

const MAX_MEAN_KL: f64 = 1e-2;

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Mean KL and greedy agreement of one model in one numerics mode.
struct Outcome {
    /// Teacher-forced (one prefill of the prompt and llama.cpp's tokens).
    mean_kl: f64,
    /// Along our free-running decode, over the positions whose prefix is
    /// llama.cpp's (all of them when the greedy tokens agree).
    decode_kl: f64,
    /// Teacher-forced positions where our argmax is llama.cpp's token.
    forced_agree: usize,
    /// Teacher-forced positions where it is not: (step, our token,
    /// llama.cpp's log-probability gap from its token to ours).
    forced_misses: Vec<(usize, u32, f64)>,
    /// Leading free-running tokens equal to llama.cpp's.
    greedy_common: usize,
    /// Our free-running tokens.
    greedy: Vec<u32>,
}

/// KL(llama.cpp ‖ ours) at one recorded step: over llama.cpp's top 64, plus
/// the remaining mass of both distributions as one bucket.
fn kl(step: &Value, row: &[f32]) -> f64 {
    let ours = log_softmax(row);
    let mut kl = 0f64;
    let (mut p_top, mut q_top) = (0f64, 0f64);
    for t in step["top"].as_array().unwrap() {
        let (id, lp) = (t[0].as_u64().unwrap() as usize, t[1].as_f64().unwrap());
        kl += lp.exp() * (lp - ours[id]);
        p_top += lp.exp();
        q_top += ours[id].exp();
    }
    let (p_rest, q_rest) = ((1.0 - p_top).max(0.0), (1.0 - q_top).max(1e-300));
    if p_rest > 0.0 {
        kl += p_rest * (p_rest / q_rest).ln();
    }
    kl
}

/// Our top-2 log-probability gap (nats) in `row`.
fn our_gap(row: &[f32]) -> f64 {
    let lp = log_softmax(row);
    let best = argmax(row) as usize;
    let second = lp
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .fold(f64::NEG_INFINITY, |m, (_, &v)| m.max(v));
    lp[best] - second
}

fn run_mode(name: &str, install: &Install, numerics: Numerics, j: &Value) -> Outcome {
    let backend = CpuDevice::with_available_threads()
        .unwrap()
        .with_numerics(numerics);
    let model = Model::load(install, backend).unwrap();
    let vocab = model.vocab_size();
    let prompt = json_ids(&j["prompt_ids"]);
    let reference = json_ids(&j["greedy_ids"]);
    let steps = j["steps"].as_array().unwrap();
    assert_eq!(steps.len(), reference.len());

    // Teacher forcing: our distribution after llama.cpp's own tokens.
    let forced: Vec<u32> = prompt
        .iter()
        .chain(&reference[..reference.len() - 1])
        .copied()
        .collect();
    let mut session = model
        .session(SessionOptions::new(prompt.len() + reference.len()))
        .unwrap();
    let mut logits = vec![0f32; forced.len() * vocab];
    session.prefill(&forced, &mut logits).unwrap();
    let mut kl_sum = 0f64;
    let mut forced_agree = 0;
    let mut forced_misses = Vec::new();
    for (s, step) in steps.iter().enumerate() {
        let row = &logits[(prompt.len() - 1 + s) * vocab..(prompt.len() + s) * vocab];
        kl_sum += kl(step, row);
        let mine = argmax(row);
        if mine == reference[s] {
            forced_agree += 1;
        } else {
            forced_misses.push((s, mine, ref_gap(step, mine)));
        }
    }
    let mean_kl = kl_sum / steps.len() as f64;

    // Free-running greedy decode: our own argmax fed back.
    let mut session = model
        .session(SessionOptions::new(prompt.len() + reference.len()))
        .unwrap();
    let mut last = vec![0f32; vocab];
    session
        .forward(0, &prompt, Logits::Last(&mut last))
        .unwrap();
    let mut greedy = Vec::new();
    let mut divergence = None;
    // KL along our own decode, at the positions whose prefix is llama.cpp's.
    let (mut decode_kl_sum, mut decode_kl_n) = (0f64, 0usize);
    for s in 0..reference.len() {
        let next = argmax(&last);
        if divergence.is_none() {
            decode_kl_sum += kl(&steps[s], &last);
            decode_kl_n += 1;
        }
        if next != reference[s] && divergence.is_none() {
            divergence = Some((s, our_gap(&last), ref_gap(&steps[s], next)));
        }
        greedy.push(next);
        if s + 1 < reference.len() {
            last.copy_from_slice(session.decode(next, prompt.len() + s).unwrap());
        }
    }
    let greedy_common = greedy
        .iter()
        .zip(&reference)
        .take_while(|(a, b)| a == b)
        .count();
    if let Some((s, ours, theirs)) = divergence {
        println!(
            "  {name} [{numerics}] first divergence at step {s}: ours {} (our top-2 gap {ours:.4} nats), \
             llama.cpp {} (its gap to our token {theirs:.4} nats, its top-2 gap {:.4})",
            greedy[s],
            reference[s],
            ref_gap(&steps[s], ref_second(&steps[s])),
        );
    }
    let decode_kl = decode_kl_sum / decode_kl_n as f64;
    println!(
        "{name} [{numerics}]: mean KL(llama.cpp ‖ ours) {mean_kl:.2e} teacher-forced over {} \
         positions ({decode_kl:.2e} along our decode, {decode_kl_n} positions); teacher-forced argmax \
         {forced_agree}/{}; greedy tokens identical for {greedy_common}/{}",
        steps.len(),
        steps.len(),
        reference.len()
    );
    Outcome {
        mean_kl,
        decode_kl,
        forced_agree,
        forced_misses,
        greedy_common,
        greedy,
    }
}

/// llama.cpp's second-best token at `step`.
fn ref_second(step: &Value) -> u32 {
    step["top"][1][0].as_u64().unwrap() as u32
}

/// Checks one model; returns what failed.
fn check(reference: &Path) -> Vec<String> {
    let j: Value = serde_json::from_slice(&std::fs::read(reference).unwrap()).unwrap();
    let name = j["name"].as_str().unwrap().to_string();
    let gguf = cache_dir()
        .join("models")
        .join(j["model_file"].as_str().unwrap());
    if !gguf.is_file() {
        assert!(
            std::env::var_os("TURBOSPARK_REQUIRE_MODELS").is_none(),
            "{} is absent although TURBOSPARK_REQUIRE_MODELS is set",
            gguf.display()
        );
        println!("skipped {name}: {} is absent", gguf.display());
        return Vec::new();
    }
    let dst = convert_to_temp(&gguf, &format!("parity-{name}"));
    let install = Install::open(&dst).unwrap();
    let reference_ids = json_ids(&j["greedy_ids"]);
    let steps = j["steps"].as_array().unwrap();

    let exact = run_mode(&name, &install, Numerics::Exact, &j);
    let llama = run_mode(&name, &install, Numerics::LlamaCpp, &j);
    drop(install);
    let _ = std::fs::remove_dir_all(&dst);

    let mut failures = Vec::new();
    for (mode, o) in [(Numerics::Exact, &exact), (Numerics::LlamaCpp, &llama)] {
        for (what, kl) in [("teacher-forced", o.mean_kl), ("decode", o.decode_kl)] {
            if kl >= MAX_MEAN_KL {
                failures.push(format!(
                    "{name} [{mode}]: {what} mean KL {kl:.3e} ≥ {MAX_MEAN_KL:e}"
                ));
            }
        }
        for &(s, mine, gap) in &o.forced_misses {
            if gap >= NEAR_TIE {
                failures.push(format!(
                    "{name} [{mode}] step {s}: teacher-forced we pick {mine}, llama.cpp {} by {gap:.3} nats",
                    reference_ids[s]
                ));
            }
        }
    }
    if llama.greedy != reference_ids {
        failures.push(format!(
            "{name} [llama-cpp]: greedy tokens identical for only {}/{} (teacher-forced argmax {}/{})",
            llama.greedy_common,
            reference_ids.len(),
            llama.forced_agree,
            steps.len()
        ));
    }
    let common = exact.greedy_common;
    if common < reference_ids.len() {
        let gap = ref_gap(&steps[common], exact.greedy[common]);
        if gap >= NEAR_TIE {
            failures.push(format!(
                "{name} [exact]: greedy decode leaves llama.cpp's at step {common} ({} vs {}) by {gap:.3} nats",
                exact.greedy[common],
                reference_ids[common]
            ));
        }
    }
    failures
}

#[test]
fn greedy_and_logprobs_match_llama_cpp() {
    let Ok(entries) = std::fs::read_dir(llamacpp_reference_dir()) else {
        println!("skipped: no tests/reference/llamacpp directory");
        return;
    };
    let mut refs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".greedy.json"))
        .collect();
    refs.sort();
    let failures: Vec<String> = refs.iter().flat_map(|r| check(r)).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
