//! The HF `tokenizer.json` backend, checked against llama.cpp.
//!
//! No HF checkpoint is cached, so the test writes a `tokenizer.json` the way
//! the original SmolLM2 and Qwen2.5 repositories define theirs (BPE model,
//! their pre-tokenizers: digits split + byte-level for SmolLM2, the Qwen2
//! split regex + byte-level for Qwen2.5; normalizers left out), with the
//! vocabulary and merges taken from the cached GGUFs, then compares the ids
//! with the `llama-tokenize` fixtures of those GGUFs (cases without BOS,
//! which an HF tokenizer.json does not add for these models).

#![cfg(feature = "hf-tokenizers")]

mod common;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use turbospark_format::gguf::{GgufArray, GgufFile, GgufValue};
use turbospark_text::{EncodeOptions, StreamDecoder, Tokenizer};

#[derive(Deserialize)]
struct Fixture {
    model: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    add_special: bool,
    parse_special: bool,
    ids: Vec<u32>,
}

fn strings<'a>(g: &'a GgufFile, key: &str) -> &'a [String] {
    match g.get(key) {
        Some(GgufValue::Array(GgufArray::String(v))) => v,
        _ => panic!("{key} missing"),
    }
}

fn tokenizer_json(g: &GgufFile, pre_tokenizer: Value) -> Value {
    let tokens = strings(g, "tokenizer.ggml.tokens");
    let merges = strings(g, "tokenizer.ggml.merges");
    let types = g
        .get("tokenizer.ggml.token_type")
        .and_then(GgufValue::as_array)
        .and_then(|a| a.to_f64_vec())
        .unwrap();
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.clone(), json!(i));
        // GGUF token types: 3 control, 4 user-defined.
        if types[i] == 3.0 || types[i] == 4.0 {
            added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": types[i] == 3.0
            }));
        }
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges
        }
    })
}

fn check(fixture: &str, pre_tokenizer: Value, skip: &[&str]) {
    let path = common::fixtures().join("tokenize").join(fixture);
    let fx: Fixture = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let Some(model) = common::real_model(&fx.model) else {
        return;
    };
    let g = GgufFile::open(&model).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "turbospark-text-hf-{}-{}",
        fixture.trim_end_matches(".json"),
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tokenizer.json");
    std::fs::write(
        &file,
        serde_json::to_vec(&tokenizer_json(&g, pre_tokenizer)).unwrap(),
    )
    .unwrap();
    let tok = Tokenizer::from_install_dir(&dir);
    std::fs::remove_dir_all(&dir).ok();
    let tok = tok.unwrap();
    let mut checked = 0;
    for c in fx
        .cases
        .iter()
        .filter(|c| !c.add_special)
        .filter(|c| !(c.parse_special && skip.contains(&c.text.as_str())))
    {
        let opts = EncodeOptions {
            add_special: false,
            parse_special: c.parse_special,
        };
        let got = tok.encode_with(&c.text, opts).unwrap();
        assert_eq!(
            got, c.ids,
            "{:?} (parse_special {})",
            c.text, c.parse_special
        );
        if !c.parse_special {
            assert_eq!(tok.decode(&got).unwrap(), c.text);
            let mut dec = StreamDecoder::new(&tok);
            let mut s = String::new();
            for &id in &got {
                s.push_str(&dec.push(id).unwrap());
            }
            s.push_str(&dec.finish());
            assert_eq!(s, c.text);
        }
        checked += 1;
    }
    eprintln!("{}: {checked} cases match llama.cpp", fx.model);
}

#[test]
fn smollm2_tokenizer_json() {
    check(
        "smollm2-135m-instruct-q4_1.json",
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]}),
        &[],
    );
}

#[test]
fn qwen25_tokenizer_json() {
    check(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.json",
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
        ]}),
        // Qwen's vocabulary has a normal token "</s>"; llama.cpp makes every
        // "</s>" an end-of-generation control token, HF does not.
        &["<s> </s> <unk> look like special tokens"],
    );
}
