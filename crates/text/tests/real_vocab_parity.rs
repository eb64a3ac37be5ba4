//! Tokenizer parity with llama.cpp on the vocabularies of the cached real
//! models (SmolLM2: byte-level BPE `smollm`; Qwen2.5-Coder: BPE `qwen2`;
//! Gemma 3: SentencePiece with 262k tokens). Expected ids were recorded with
//! `llama-tokenize` by `scripts/text/record_tokenizer_fixtures.py`, with and
//! without BOS and special-token parsing.

mod common;

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use turbospark_format::gguf::{GgufArray, GgufFile, GgufValue};
use turbospark_text::{EncodeOptions, TextError, Tokenizer};

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

fn check(tok: &Tokenizer, fx: &Fixture) {
    let mut failures = Vec::new();
    for c in &fx.cases {
        let opts = EncodeOptions {
            add_special: c.add_special,
            parse_special: c.parse_special,
        };
        let got = tok.encode_with(&c.text, opts).unwrap();
        if got != c.ids {
            failures.push(format!(
                "{:?} (add_special {}, parse_special {})\n   expected {:?}\n   got      {:?}",
                c.text, c.add_special, c.parse_special, c.ids, got
            ));
        }
        if !c.add_special && !c.parse_special {
            assert_eq!(
                tok.decode(&got).unwrap(),
                c.text,
                "{}: round trip",
                fx.model
            );
        }
    }
    eprintln!(
        "{}: {} cases, {} mismatches",
        fx.model,
        fx.cases.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{}:\n{}",
        fx.model,
        failures.join("\n")
    );
}

fn load_fixture(name: &str) -> Fixture {
    let path = common::fixtures().join("tokenize").join(name);
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

fn gguf_case(fixture: &str) {
    let fx = load_fixture(fixture);
    let Some(model) = common::real_model(&fx.model) else {
        return;
    };
    let tok = Tokenizer::from_gguf_file(&model).unwrap();
    check(&tok, &fx);
}

#[test]
fn smollm2_gguf() {
    gguf_case("smollm2-135m-instruct-q4_1.json");
}

#[test]
fn qwen25_coder_gguf() {
    gguf_case("qwen2.5-coder-0.5b-instruct-q4_k_m.json");
}

#[test]
fn gemma3_gguf() {
    gguf_case("gemma3-270m-q4_k_m.json");
}

fn to_json(v: &GgufValue) -> Value {
    match v {
        GgufValue::U8(x) => json!(x),
        GgufValue::I8(x) => json!(x),
        GgufValue::U16(x) => json!(x),
        GgufValue::I16(x) => json!(x),
        GgufValue::U32(x) => json!(x),
        GgufValue::I32(x) => json!(x),
        GgufValue::F32(x) => json!(x),
        GgufValue::Bool(x) => json!(x),
        GgufValue::String(x) => json!(x),
        GgufValue::U64(x) => json!(x),
        GgufValue::I64(x) => json!(x),
        GgufValue::F64(x) => json!(x),
        GgufValue::Array(a) => match a {
            GgufArray::String(v) => json!(v),
            GgufArray::F32(v) => json!(v),
            GgufArray::I32(v) => json!(v),
            GgufArray::U32(v) => json!(v),
            other => json!(other.to_f64_vec()),
        },
    }
}

/// An install directory the way `turbospark convert` lays out a GGUF source:
/// `vocab.gguf.json` holds the `tokenizer.ggml.*` keys without the prefix.
#[test]
fn install_dir_with_gguf_vocab() {
    let fx = load_fixture("smollm2-135m-instruct-q4_1.json");
    let Some(model) = common::real_model(&fx.model) else {
        return;
    };
    let g = GgufFile::open(&model).unwrap();
    let meta: &BTreeMap<String, GgufValue> = g.metadata();
    let mut vocab = Map::new();
    for (k, v) in meta {
        if let Some(short) = k.strip_prefix("tokenizer.ggml.") {
            vocab.insert(short.to_string(), to_json(v));
        }
    }
    let dir = std::env::temp_dir().join(format!("turbospark-text-install-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("vocab.gguf.json"),
        serde_json::to_vec(&vocab).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec(&json!({
            "tokenizer": "vocab.gguf.json",
            "generation": {"bos_token_id": 1, "eos_token_ids": [2], "pad_token_id": 2, "add_bos": false}
        }))
        .unwrap(),
    )
    .unwrap();
    let tok = Tokenizer::from_install_dir(&dir).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    check(&tok, &fx);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert!(tok.is_eog(2));
}

#[test]
fn install_without_tokenizer_is_a_typed_error() {
    let dir = std::env::temp_dir().join(format!("turbospark-text-notok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("manifest.json"),
        br#"{"tokenizer": null, "chat_template": null}"#,
    )
    .unwrap();
    let err = Tokenizer::from_install_dir(&dir).unwrap_err();
    let empty = std::env::temp_dir().join(format!("turbospark-text-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let err2 = Tokenizer::from_install_dir(&empty).unwrap_err();
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&empty).ok();
    assert!(matches!(err, TextError::NoTokenizer { .. }), "{err}");
    assert!(matches!(err2, TextError::NoTokenizer { .. }), "{err2}");
    assert!(err.to_string().contains("has no tokenizer"));
}
