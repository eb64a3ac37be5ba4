//! HF `tokenizer.json` through the `tokenizers` crate (its normalizers,
//! pre-tokenizers, models and post-processors are the reference
//! implementation), plus a per-token byte table for streaming decode derived
//! from the file's decoder: byte-level (`ByteLevel`, GPT-2's byte map) or
//! SentencePiece-style (`▁` for space, `<0xNN>` byte fallback).

use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;

use crate::error::{io_err, Result, TextError};
use crate::unicode::char_to_byte_table;
use crate::vocab::byte_token_value;

pub(crate) struct HfTokenizer {
    tok: tokenizers::Tokenizer,
    /// A copy that encodes special-token text as plain text (`parse_special = false`).
    plain: OnceLock<tokenizers::Tokenizer>,
    pub(crate) pieces: Vec<Vec<u8>>,
    pub(crate) special: Vec<bool>,
    pub(crate) strip_leading_space: bool,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
}

fn find_type<'a>(v: &'a Value, ty: &str, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(m) => {
            if m.get("type").and_then(Value::as_str) == Some(ty) {
                out.push(v);
            }
            for x in m.values() {
                find_type(x, ty, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| find_type(x, ty, out)),
        _ => {}
    }
}

/// The id of the special token a `TemplateProcessing` puts first in a
/// single sequence (`<s>` / `<|begin_of_text|>`), if any.
fn template_first_special(t: &Value) -> Option<u32> {
    let first = t.get("single")?.as_array()?.first()?;
    let name = first.get("SpecialToken")?.get("id")?.as_str()?;
    let ids = t.get("special_tokens")?.get(name)?.get("ids")?.as_array()?;
    ids.first()?.as_u64().map(|x| x as u32)
}

impl HfTokenizer {
    pub(crate) fn from_file(path: &Path) -> Result<HfTokenizer> {
        let bytes = std::fs::read(path).map_err(io_err(path))?;
        let err = |detail: String| TextError::HfTokenizer {
            path: path.to_path_buf(),
            detail,
        };
        let json: Value = serde_json::from_slice(&bytes).map_err(|e| TextError::Json {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        let tok = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| err(e.to_string()))?;

        let decoder = json.get("decoder").cloned().unwrap_or(Value::Null);
        let mut found = Vec::new();
        find_type(&decoder, "ByteLevel", &mut found);
        let byte_level = !found.is_empty();
        found.clear();
        find_type(&decoder, "Strip", &mut found);
        let mut strip_leading_space = found.iter().any(|s| {
            s.get("content").and_then(Value::as_str) == Some(" ")
                && s.get("start").and_then(Value::as_u64).unwrap_or(0) >= 1
        });
        found.clear();
        find_type(&decoder, "Metaspace", &mut found);
        strip_leading_space |=
            found
                .iter()
                .any(|m| match m.get("prepend_scheme").and_then(Value::as_str) {
                    Some(s) => s != "never",
                    None => m
                        .get("add_prefix_space")
                        .and_then(Value::as_bool)
                        .unwrap_or(true),
                });

        let n = tok.get_vocab_size(true);
        let added = tok.get_added_tokens_decoder();
        let char_bytes = char_to_byte_table();
        let mut pieces = Vec::with_capacity(n);
        let mut special = Vec::with_capacity(n);
        for id in 0..n as u32 {
            if let Some(a) = added.get(&id) {
                pieces.push(a.content.as_bytes().to_vec());
                special.push(a.special);
                continue;
            }
            let text = tok.id_to_token(id).unwrap_or_default();
            let bytes = if byte_level {
                let mut out = Vec::with_capacity(text.len());
                for c in text.chars() {
                    match char_bytes.get(c as usize).copied().flatten() {
                        Some(b) => out.push(b),
                        None => {
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                        }
                    }
                }
                out
            } else if let Some(b) = byte_token_value(&text) {
                vec![b]
            } else {
                text.replace('\u{2581}', " ").into_bytes()
            };
            pieces.push(bytes);
            special.push(false);
        }

        // BOS from the post-processor's template when there is one; EOS by
        // the usual texts of special added tokens (the lowest id wins).
        let mut bos = None;
        if let Some(pp) = json.get("post_processor") {
            let mut tl = Vec::new();
            find_type(pp, "TemplateProcessing", &mut tl);
            bos = tl.first().and_then(|t| template_first_special(t));
        }
        let eos = added
            .iter()
            .filter(|(_, a)| {
                a.special
                    && ["</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>"]
                        .contains(&a.content.as_str())
            })
            .map(|(id, _)| *id)
            .min();
        Ok(HfTokenizer {
            tok,
            plain: OnceLock::new(),
            pieces,
            special,
            strip_leading_space,
            bos,
            eos,
        })
    }

    pub(crate) fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        let enc_err = |e: tokenizers::Error| TextError::HfEncode {
            detail: e.to_string(),
        };
        let tok = if parse_special {
            &self.tok
        } else {
            self.plain.get_or_init(|| {
                let mut t = self.tok.clone();
                t.set_encode_special_tokens(true);
                t
            })
        };
        let enc = tok.encode(text, add_special).map_err(enc_err)?;
        Ok(enc.get_ids().to_vec())
    }

    pub(crate) fn token_text(&self, id: u32) -> Option<String> {
        self.tok.id_to_token(id)
    }
}
