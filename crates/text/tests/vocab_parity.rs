//! Tokenizer parity with llama.cpp's tokenizer test vectors: for each
//! `ggml-vocab-*.gguf` in the llama-cpp-python sdist, every text of the
//! `.inp` file must encode to the ids on the matching line of `.out`, and
//! decode back to itself.
//!
//! The files are read as llama.cpp's `tests/test-tokenizer-0.cpp` reads them:
//! texts are separated by `\n__ggml_vocab_test__\n`, each `.out` line holds the
//! space-separated ids, and encoding uses `add_special = false` (no BOS in the
//! expected ids) and `parse_special = false`.

mod common;

use turbospark_text::{EncodeOptions, Tokenizer};

fn read_tests(inp: &str, out: &str) -> Vec<(String, Vec<u32>)> {
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(SEP) {
            Some(rel) => {
                texts.push(inp[pos..pos + rel].to_string());
                pos += rel + SEP.len();
            }
            None => {
                texts.push(inp[pos..].to_string());
                break;
            }
        }
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("numeric id in .out"))
                .collect()
        })
        .collect();
    assert_eq!(texts.len(), ids.len(), ".inp and .out differ in test count");
    texts.into_iter().zip(ids).collect()
}

fn check(name: &str) {
    let Some(dir) = common::llama_cpp_models() else {
        return;
    };
    let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
    let tests = read_tests(&inp, &out);
    let tok = Tokenizer::from_gguf_file(&gguf).unwrap();
    let opts = EncodeOptions {
        add_special: false,
        parse_special: false,
    };
    let mut failures = Vec::new();
    let mut roundtrip_failures = Vec::new();
    for (text, expected) in &tests {
        let got = tok.encode_with(text, opts).unwrap();
        if &got != expected {
            failures.push(format!(
                "{text:?}\n   expected {expected:?}\n   got      {got:?}"
            ));
        }
        let back = tok.decode(&got).unwrap();
        if &back != text {
            roundtrip_failures.push(format!("{text:?} decoded as {back:?}"));
        }
    }
    eprintln!(
        "{name}: {} texts, {} encode mismatches, {} round-trip mismatches",
        tests.len(),
        failures.len(),
        roundtrip_failures.len()
    );
    assert!(
        failures.is_empty(),
        "{name}: {} of {} texts encode differently:\n{}",
        failures.len(),
        tests.len(),
        failures.join("\n")
    );
    assert!(
        roundtrip_failures.is_empty(),
        "{name}: decode(encode(text)) != text for {} texts:\n{}",
        roundtrip_failures.len(),
        roundtrip_failures.join("\n")
    );
}

#[test]
fn llama_spm() {
    check("llama-spm");
}
#[test]
fn phi_3() {
    check("phi-3");
}
#[test]
fn llama_bpe() {
    check("llama-bpe");
}
#[test]
fn gpt_2() {
    check("gpt-2");
}
#[test]
fn qwen2() {
    check("qwen2");
}
#[test]
fn qwen35() {
    check("qwen35");
}
#[test]
fn deepseek_llm() {
    check("deepseek-llm");
}
#[test]
fn deepseek_coder() {
    check("deepseek-coder");
}
#[test]
fn falcon() {
    check("falcon");
}
#[test]
fn mpt() {
    check("mpt");
}
#[test]
fn starcoder() {
    check("starcoder");
}
#[test]
fn refact() {
    check("refact");
}
#[test]
fn command_r() {
    check("command-r");
}
#[test]
fn gemma_4() {
    check("gemma-4");
}
