//! Tokenizer, chat template and generation defaults of a source.
//!
//! HF: `tokenizer.json` is copied; the template comes from
//! `chat_template.jinja` or `tokenizer_config.json`'s `chat_template`; token
//! ids from `generation_config.json`, then `config.json`. GGUF: every
//! `tokenizer.ggml.*` key is written to `vocab.gguf.json` (the tokenizer is
//! built from it at load time), the template from `tokenizer.chat_template`.

use super::source::Source;
use crate::error::{FormatError, IoContext};
use crate::gguf::{GgufArray, GgufValue};
use crate::install::{
    GenerationDefaults, InstallWriter, CHAT_TEMPLATE_FILE, GGUF_VOCAB_FILE, TOKENIZER_FILE,
};
use serde_json::{json, Map, Value};
use std::path::Path;

pub(crate) struct SideFiles {
    pub tokenizer: Option<String>,
    pub chat_template: Option<String>,
    pub generation: GenerationDefaults,
}

pub(crate) fn write_side_files(
    source: &Source,
    writer: &mut InstallWriter,
) -> Result<SideFiles, FormatError> {
    match source {
        Source::Gguf(g) => {
            let mut vocab = Map::new();
            for (k, v) in g.metadata() {
                if let Some(short) = k.strip_prefix("tokenizer.ggml.") {
                    vocab.insert(short.to_string(), gguf_to_json(v));
                }
            }
            let tokenizer = if vocab.is_empty() {
                None
            } else {
                let bytes =
                    serde_json::to_vec(&Value::Object(vocab)).map_err(|e| FormatError::Json {
                        path: GGUF_VOCAB_FILE.into(),
                        detail: e.to_string(),
                    })?;
                writer.write_file(GGUF_VOCAB_FILE, &bytes)?;
                Some(GGUF_VOCAB_FILE.to_string())
            };
            let chat_template = match g.get("tokenizer.chat_template").and_then(GgufValue::as_str) {
                Some(t) => {
                    writer.write_file(CHAT_TEMPLATE_FILE, t.as_bytes())?;
                    Some(CHAT_TEMPLATE_FILE.to_string())
                }
                None => None,
            };
            let id = |k: &str| g.get(k).and_then(GgufValue::as_u64).map(|v| v as u32);
            let mut eos: Vec<u32> = Vec::new();
            for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
                if let Some(v) = id(k) {
                    if !eos.contains(&v) {
                        eos.push(v);
                    }
                }
            }
            let generation = GenerationDefaults {
                bos_token_id: id("tokenizer.ggml.bos_token_id"),
                eos_token_ids: eos,
                pad_token_id: id("tokenizer.ggml.padding_token_id"),
                add_bos: g
                    .get("tokenizer.ggml.add_bos_token")
                    .and_then(GgufValue::as_bool)
                    .unwrap_or(false),
            };
            Ok(SideFiles {
                tokenizer,
                chat_template,
                generation,
            })
        }
        Source::Hf { dir, config, .. } => hf_side_files(dir, config, writer),
    }
}

fn read_json_opt(path: &Path) -> Result<Option<Value>, FormatError> {
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = std::fs::read(path).at(path)?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| FormatError::Json {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

fn hf_side_files(
    dir: &Path,
    config: &Value,
    writer: &mut InstallWriter,
) -> Result<SideFiles, FormatError> {
    let tok_path = dir.join(TOKENIZER_FILE);
    let tokenizer = if tok_path.is_file() {
        let bytes = std::fs::read(&tok_path).at(&tok_path)?;
        writer.write_file(TOKENIZER_FILE, &bytes)?;
        Some(TOKENIZER_FILE.to_string())
    } else {
        None
    };
    let tok_config = read_json_opt(&dir.join("tokenizer_config.json"))?;
    let template_file = dir.join(CHAT_TEMPLATE_FILE);
    let template: Option<String> = if template_file.is_file() {
        Some(std::fs::read_to_string(&template_file).at(&template_file)?)
    } else {
        match tok_config.as_ref().and_then(|c| c.get("chat_template")) {
            Some(Value::String(s)) => Some(s.clone()),
            // A list of named templates: the one named "default".
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => None,
        }
    };
    let chat_template = match template {
        Some(t) => {
            writer.write_file(CHAT_TEMPLATE_FILE, t.as_bytes())?;
            Some(CHAT_TEMPLATE_FILE.to_string())
        }
        None => None,
    };
    let gen_config = read_json_opt(&dir.join("generation_config.json"))?;
    let text = crate::spec::hf::text_config(config);
    let pick = |k: &str| {
        gen_config
            .as_ref()
            .and_then(|g| g.get(k))
            .filter(|v| !v.is_null())
            .or_else(|| config.get(k).filter(|v| !v.is_null()))
            .or_else(|| text.get(k).filter(|v| !v.is_null()))
    };
    let generation = GenerationDefaults {
        bos_token_id: ids(pick("bos_token_id")).first().copied(),
        eos_token_ids: ids(pick("eos_token_id")),
        pad_token_id: ids(pick("pad_token_id")).first().copied(),
        add_bos: tok_config
            .as_ref()
            .and_then(|c| c.get("add_bos_token"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };
    Ok(SideFiles {
        tokenizer,
        chat_template,
        generation,
    })
}

/// GGUF metadata as JSON (arrays of numbers stay numbers, strings stay strings).
pub(crate) fn gguf_to_json(v: &GgufValue) -> Value {
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
        GgufValue::Array(a) => array_to_json(a),
        GgufValue::U64(x) => json!(x),
        GgufValue::I64(x) => json!(x),
        GgufValue::F64(x) => json!(x),
    }
}

fn array_to_json(a: &GgufArray) -> Value {
    match a {
        GgufArray::U8(v) => json!(v),
        GgufArray::I8(v) => json!(v),
        GgufArray::U16(v) => json!(v),
        GgufArray::I16(v) => json!(v),
        GgufArray::U32(v) => json!(v),
        GgufArray::I32(v) => json!(v),
        GgufArray::F32(v) => json!(v),
        GgufArray::Bool(v) => json!(v),
        GgufArray::String(v) => json!(v),
        GgufArray::Array(v) => Value::Array(v.iter().map(array_to_json).collect()),
        GgufArray::U64(v) => json!(v),
        GgufArray::I64(v) => json!(v),
        GgufArray::F64(v) => json!(v),
    }
}
