//! The three real GGUF models (fetched by scripts/fetch-models.sh) convert,
//! verify, and `inspect` reports the dimensions llama.cpp prints when it
//! loads them (tests/reference/llamacpp/<model>.print_info.txt, recorded by
//! scripts/llamacpp/make_reference.sh from the vendored llama.cpp).
//! Skips with a message when a model is not in the cache.

mod common;

use common::{cache_dir, convert_to_temp, llamacpp_reference_dir};

use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// `print_info: key = value` lines of a llama.cpp load log.
fn print_info(path: &Path) -> HashMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once("print_info:"))
        .filter_map(|(_, kv)| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn check_model(stem: &str, reference_name: &str) {
    let gguf = cache_dir().join("models").join(format!("{stem}.gguf"));
    if !gguf.is_file() {
        // scripts/test.sh fetches the models first and sets this, so a
        // missing model there is a failure, not a skip.
        assert!(
            std::env::var_os("TURBOSPARK_REQUIRE_MODELS").is_none(),
            "{} is absent although TURBOSPARK_REQUIRE_MODELS is set",
            gguf.display()
        );
        eprintln!(
            "skipped {stem}: {} is absent (run scripts/fetch-models.sh)",
            gguf.display()
        );
        return;
    }
    let reference = llamacpp_reference_dir().join(format!("{reference_name}.print_info.txt"));
    let info = print_info(&reference);
    assert!(
        !info.is_empty(),
        "no llama.cpp reference at {}",
        reference.display()
    );
    let dst = convert_to_temp(&gguf, &format!("real-{stem}"));
    let (code, out, err) = run(&["verify", "-q", dst.to_str().unwrap()]);
    assert_eq!(code, 0, "{stem}: verify failed: {out}{err}");
    let (code, out, err) = run(&["inspect", "--json", dst.to_str().unwrap()]);
    assert_eq!(code, 0, "{stem}: inspect failed: {err}");
    let j: Value = serde_json::from_str(&out).unwrap();
    let arch = &j["arch"];
    let layers = arch["layers"].as_array().unwrap();
    let num = |k: &str| -> f64 {
        info.get(k)
            .unwrap_or_else(|| panic!("{stem}: llama.cpp reference lacks {k}"))
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("{stem}: {k} is not a number"))
    };
    let ours = |v: &Value| v.as_f64().unwrap();
    assert_eq!(ours(&arch["hidden_size"]), num("n_embd"), "{stem} n_embd");
    assert_eq!(layers.len() as f64, num("n_layer"), "{stem} n_layer");
    assert_eq!(ours(&arch["num_heads"]), num("n_head"), "{stem} n_head");
    assert_eq!(
        ours(&arch["num_kv_heads"]),
        num("n_head_kv"),
        "{stem} n_head_kv"
    );
    assert_eq!(
        ours(&arch["head_dim"]),
        num("n_embd_head_k"),
        "{stem} n_embd_head_k"
    );
    assert_eq!(ours(&arch["intermediate_size"]), num("n_ff"), "{stem} n_ff");
    assert_eq!(ours(&arch["vocab_size"]), num("n_vocab"), "{stem} n_vocab");
    let rope = &layers[layers.len() - 1]["rope"];
    assert_eq!(ours(&rope["rotary_dim"]), num("n_rot"), "{stem} n_rot");
    assert_eq!(
        ours(&rope["theta"]),
        num("freq_base_train"),
        "{stem} freq_base_train"
    );
    let swa = num("n_swa");
    let max_window = layers
        .iter()
        .filter_map(|l| l["window"].as_f64())
        .fold(0.0, f64::max);
    assert_eq!(max_window, swa, "{stem} n_swa");
    let _ = std::fs::remove_dir_all(&dst);
}

#[test]
fn smollm2_135m_matches_llama_cpp() {
    check_model("smollm2-135m-instruct-q4_1", "smollm2");
}

#[test]
fn gemma3_270m_matches_llama_cpp() {
    check_model("gemma3-270m-q4_k_m", "gemma3");
}

#[test]
fn qwen25_coder_05b_matches_llama_cpp() {
    check_model("qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen25");
}
