//! A GGUF vocabulary (`tokenizer.ggml.*` metadata) and the tokenizer built
//! from it, following llama.cpp's `llama_vocab` (`src/llama-vocab.cpp`):
//! token attributes from `token_type`, the end-of-generation heuristics,
//! special-token partitioning (`tokenizer_st_partition`), the SentencePiece
//! and BPE sessions, and `token_to_piece` for decoding.
//!
//! Input comes either from a GGUF file's metadata or from an install's
//! `vocab.gguf.json` (the same keys with the `tokenizer.ggml.` prefix
//! stripped, as `turbospark convert` writes them).

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;
use turbospark_format::gguf::{GgufArray, GgufValue};

use crate::bpe::BpeModel;
use crate::error::{Result, TextError};
use crate::pretok::{pre_config, Splitter};
use crate::spm;

/// llama.cpp's `llama_token_attr` bits.
pub(crate) mod attr {
    pub const UNDEFINED: u32 = 0;
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// The raw `tokenizer.ggml.*` fields, whichever container they came from.
#[derive(Debug, Default, Clone)]
pub struct GgufVocabFields {
    pub model: String,
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub scores: Option<Vec<f32>>,
    pub token_type: Option<Vec<i32>>,
    pub merges: Option<Vec<String>>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub eot_token_id: Option<u32>,
    pub eom_token_id: Option<u32>,
    pub unknown_token_id: Option<u32>,
    pub padding_token_id: Option<u32>,
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `general.name`: llama.cpp keys a few per-token attributes on it.
    pub model_name: Option<String>,
}

fn vocab_err(field: &str, problem: impl Into<String>) -> TextError {
    TextError::Vocab {
        field: field.to_string(),
        problem: problem.into(),
    }
}

impl GgufVocabFields {
    /// From GGUF metadata (full key names, `tokenizer.ggml.*`).
    pub fn from_gguf_metadata(meta: &BTreeMap<String, GgufValue>) -> Result<Self> {
        let get = |k: &str| meta.get(&format!("tokenizer.ggml.{k}"));
        let string = |k: &str| -> Result<Option<String>> {
            match get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_str()
                    .map(|s| Some(s.to_string()))
                    .ok_or_else(|| vocab_err(k, "is not a string")),
            }
        };
        let id = |k: &str| get(k).and_then(GgufValue::as_u64).map(|v| v as u32);
        let flag = |k: &str| get(k).and_then(GgufValue::as_bool);
        let strings = |k: &str| -> Result<Option<Vec<String>>> {
            match get(k) {
                None => Ok(None),
                Some(GgufValue::Array(GgufArray::String(v))) => Ok(Some(v.clone())),
                Some(_) => Err(vocab_err(k, "is not an array of strings")),
            }
        };
        let model = string("model")?.ok_or_else(|| vocab_err("model", "is missing"))?;
        let tokens = strings("tokens")?.ok_or_else(|| vocab_err("tokens", "is missing"))?;
        let numbers = |k: &str| -> Result<Option<Vec<f64>>> {
            match get(k) {
                None => Ok(None),
                Some(GgufValue::Array(a)) => a
                    .to_f64_vec()
                    .map(Some)
                    .ok_or_else(|| vocab_err(k, "is not numeric")),
                Some(_) => Err(vocab_err(k, "is not an array")),
            }
        };
        let scores = numbers("scores")?.map(|v| v.into_iter().map(|x| x as f32).collect());
        let token_type = numbers("token_type")?.map(|v| v.into_iter().map(|x| x as i32).collect());
        Ok(GgufVocabFields {
            model,
            pre: string("pre")?,
            tokens,
            scores,
            token_type,
            merges: strings("merges")?,
            bos_token_id: id("bos_token_id"),
            eos_token_id: id("eos_token_id"),
            eot_token_id: id("eot_token_id"),
            eom_token_id: id("eom_token_id"),
            unknown_token_id: id("unknown_token_id"),
            padding_token_id: id("padding_token_id"),
            add_bos_token: flag("add_bos_token"),
            add_eos_token: flag("add_eos_token"),
            add_space_prefix: flag("add_space_prefix"),
            model_name: meta
                .get("general.name")
                .and_then(GgufValue::as_str)
                .map(str::to_string),
        })
    }

    /// From `vocab.gguf.json` (keys without the `tokenizer.ggml.` prefix).
    pub fn from_json(v: &Value) -> Result<Self> {
        let obj = v
            .as_object()
            .ok_or_else(|| vocab_err("(root)", "is not a JSON object"))?;
        let string = |k: &str| -> Result<Option<String>> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(vocab_err(k, "is not a string")),
            }
        };
        let id = |k: &str| obj.get(k).and_then(Value::as_u64).map(|v| v as u32);
        let flag = |k: &str| obj.get(k).and_then(Value::as_bool);
        let array = |k: &str| -> Result<Option<&Vec<Value>>> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Array(a)) => Ok(Some(a)),
                Some(_) => Err(vocab_err(k, "is not an array")),
            }
        };
        let strings = |k: &str| -> Result<Option<Vec<String>>> {
            array(k)?
                .map(|a| {
                    a.iter()
                        .map(|x| {
                            x.as_str()
                                .map(str::to_string)
                                .ok_or_else(|| vocab_err(k, "has a non-string element"))
                        })
                        .collect()
                })
                .transpose()
        };
        let numbers = |k: &str| -> Result<Option<Vec<f64>>> {
            array(k)?
                .map(|a| {
                    a.iter()
                        .map(|x| {
                            x.as_f64()
                                .ok_or_else(|| vocab_err(k, "has a non-numeric element"))
                        })
                        .collect()
                })
                .transpose()
        };
        Ok(GgufVocabFields {
            model: string("model")?.ok_or_else(|| vocab_err("model", "is missing"))?,
            pre: string("pre")?,
            tokens: strings("tokens")?.ok_or_else(|| vocab_err("tokens", "is missing"))?,
            scores: numbers("scores")?.map(|v| v.into_iter().map(|x| x as f32).collect()),
            token_type: numbers("token_type")?.map(|v| v.into_iter().map(|x| x as i32).collect()),
            merges: strings("merges")?,
            bos_token_id: id("bos_token_id"),
            eos_token_id: id("eos_token_id"),
            eot_token_id: id("eot_token_id"),
            eom_token_id: id("eom_token_id"),
            unknown_token_id: id("unknown_token_id"),
            padding_token_id: id("padding_token_id"),
            add_bos_token: flag("add_bos_token"),
            add_eos_token: flag("add_eos_token"),
            add_space_prefix: flag("add_space_prefix"),
            model_name: None,
        })
    }
}

/// Which algorithm turns raw text into tokens.
#[derive(Debug)]
pub(crate) enum Algorithm {
    /// SentencePiece BPE by scores (`tokenizer.ggml.model == "llama"`).
    Spm,
    /// Merge-ranked BPE after a pre-tokenizer split (`gpt2`, `gemma4`).
    Bpe {
        model: Box<BpeModel>,
        splitters: Vec<Splitter>,
        byte_encode: bool,
        ignore_merges: bool,
        escape_whitespaces: bool,
        gemma4_newlines: bool,
    },
}

/// A tokenizer built from a GGUF vocabulary.
#[derive(Debug)]
pub struct GgufTokenizer {
    pub(crate) texts: Vec<String>,
    pub(crate) scores: Vec<f32>,
    pub(crate) attrs: Vec<u32>,
    pub(crate) token_to_id: HashMap<String, u32>,
    pub(crate) algorithm: Algorithm,
    /// Tokens matched as a whole before the text is tokenized, longest first.
    special_cache: Vec<u32>,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) unk: Option<u32>,
    pub(crate) eog: Vec<u32>,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    pub(crate) add_space_prefix: bool,
    /// Decoded bytes of every token (control tokens included).
    pub(crate) pieces: Vec<Vec<u8>>,
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_TEXTS: &[&[&str]] = &[
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
];
const FIM_EOG_TEXTS: &[&[&str]] = &[
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl GgufTokenizer {
    pub fn new(f: GgufVocabFields) -> Result<GgufTokenizer> {
        let n = f.tokens.len();
        if n == 0 {
            return Err(vocab_err("tokens", "is empty"));
        }
        let check_len = |field: &str, len: usize| {
            if len < n {
                Err(vocab_err(
                    field,
                    format!("has {len} entries for {n} tokens"),
                ))
            } else {
                Ok(())
            }
        };
        if let Some(s) = &f.scores {
            check_len("scores", s.len())?;
        }
        if let Some(t) = &f.token_type {
            check_len("token_type", t.len())?;
        }
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);

        // Defaults per model type, then metadata (llama_vocab::impl::load).
        let (mut bos, mut eos, mut unk) = (None, None, None);
        let mut add_bos = false;
        let mut add_space_prefix = false;
        let model = f.model.as_str();
        let mut pre = f.pre.clone().unwrap_or_default();
        let is_spm = match model {
            "llama" => {
                (bos, eos, unk) = (Some(1), Some(2), Some(0));
                add_bos = true;
                add_space_prefix = true;
                true
            }
            "gpt2" => {
                (bos, eos) = (Some(11), Some(11));
                false
            }
            "gemma4" => {
                pre = "gemma4".to_string();
                false
            }
            other => {
                return Err(TextError::UnsupportedModel {
                    model: other.to_string(),
                })
            }
        };
        let pre_cfg = if is_spm {
            None
        } else {
            let pre_name = if pre.is_empty() {
                "default"
            } else {
                pre.as_str()
            };
            let cfg = pre_config(pre_name)?;
            add_bos = cfg.default_add_bos;
            Some(cfg)
        };
        add_space_prefix = f.add_space_prefix.unwrap_or(add_space_prefix);
        bos = in_range(bos);
        eos = in_range(eos);
        unk = in_range(unk);
        if let Some(b) = in_range(f.bos_token_id) {
            bos = Some(b);
        }
        if let Some(e) = in_range(f.eos_token_id) {
            eos = Some(e);
        }
        if let Some(u) = in_range(f.unknown_token_id) {
            unk = Some(u);
        }
        let mut add_eos = false;
        if let Some(b) = f.add_bos_token {
            add_bos = b;
        }
        if let Some(e) = f.add_eos_token {
            add_eos = e;
        }
        if pre == "gemma4" {
            add_bos = true;
        }

        let mut texts = f.tokens;
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in texts.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
            token_to_id.insert(t.clone(), i as u32);
        }
        let scores = f.scores.unwrap_or_else(|| vec![0.0; n]);
        let mut attrs: Vec<u32> = match &f.token_type {
            Some(tt) => tt[..n]
                .iter()
                .map(|&t| match t {
                    0 => attr::UNDEFINED,
                    1 => attr::NORMAL,
                    2 => attr::UNKNOWN,
                    3 => attr::CONTROL,
                    4 => attr::USER_DEFINED,
                    5 => attr::UNUSED,
                    6 => attr::BYTE,
                    _ => attr::UNDEFINED,
                })
                .collect(),
            None => vec![attr::NORMAL; n],
        };

        // Special-token heuristics keyed on token text. Where llama.cpp picks
        // the first match of a hash map, the lowest id is taken here.
        let find = |list: &[&str]| -> Vec<u32> {
            let mut ids: Vec<u32> = list
                .iter()
                .filter_map(|t| token_to_id.get(*t).copied())
                .collect();
            ids.sort_unstable();
            ids
        };
        let force_control = |attrs: &mut Vec<u32>, id: u32| attrs[id as usize] |= attr::CONTROL;
        let eot = in_range(f.eot_token_id).or_else(|| find(EOT_TEXTS).first().copied());
        if f.eot_token_id.is_none() {
            if let Some(id) = eot {
                force_control(&mut attrs, id);
            }
        }
        let eom = in_range(f.eom_token_id).or_else(|| find(EOM_TEXTS).first().copied());
        if f.eom_token_id.is_none() {
            if let Some(id) = eom {
                force_control(&mut attrs, id);
            }
        }
        for list in FIM_TEXTS {
            if let Some(&id) = find(list).first() {
                force_control(&mut attrs, id);
            }
        }
        let mut eog: Vec<u32> = Vec::new();
        for list in FIM_EOG_TEXTS {
            if let Some(&id) = find(list).first() {
                force_control(&mut attrs, id);
                eog.push(id);
            }
        }
        // Control tokens whose text says "unused" are unused.
        for (t, a) in texts.iter().zip(attrs.iter_mut()) {
            if *a & attr::CONTROL != 0 && t.contains("unused") {
                *a |= attr::UNUSED;
            }
        }
        for id in find(EOG_TEXTS) {
            eog.push(id);
            force_control(&mut attrs, id);
        }
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = token_to_id.get(t) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        for id in [eos, eot, eom].into_iter().flatten() {
            eog.push(id);
        }
        eog.sort_unstable();
        eog.dedup();
        let text_of = |id: u32| texts[id as usize].as_str();
        let has = |eog: &[u32], t: &str| eog.iter().any(|&id| text_of(id) == t);
        let has_call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
        let has_end = has(&eog, "<|end|>");
        if has_end && has_call && (has(&eog, "<|return|>") || has(&eog, "<|flush|>")) {
            if let Some(pos) = eog.iter().position(|&id| text_of(id) == "<|end|>") {
                let id = eog.remove(pos);
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        if has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>") {
            if let Some(pos) = eog.iter().position(|&id| text_of(id) == "</s>") {
                let id = eog.remove(pos);
                attrs[id as usize] = attr::NORMAL;
            }
        }

        let mut special_cache: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special_cache.sort_by(|&a, &b| {
            texts[b as usize]
                .len()
                .cmp(&texts[a as usize].len())
                .then(a.cmp(&b))
        });

        // Per-token strip attributes keyed on the model name.
        let name = f.model_name.as_deref().unwrap_or("").to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &special_cache {
                attrs[id as usize] |= attr::RSTRIP;
            }
            if let Some(&id) = token_to_id.get("</s>") {
                attrs[id as usize] |= attr::RSTRIP;
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(&id) = token_to_id.get(t) {
                    attrs[id as usize] &= !attr::RSTRIP;
                }
            }
        }

        let algorithm = match pre_cfg {
            None => Algorithm::Spm,
            Some(cfg) => {
                let merges = f.merges.ok_or_else(|| {
                    vocab_err("merges", "is missing (needed by a BPE vocabulary)")
                })?;
                let splitters = cfg
                    .regexes
                    .iter()
                    .map(|r| Splitter::compile(r))
                    .collect::<Result<Vec<_>>>()?;
                Algorithm::Bpe {
                    model: Box::new(BpeModel::new(&merges)),
                    splitters,
                    byte_encode: cfg.byte_encode,
                    ignore_merges: cfg.ignore_merges,
                    escape_whitespaces: cfg.escape_whitespaces,
                    gemma4_newlines: pre == "gemma4",
                }
            }
        };

        let mut tok = GgufTokenizer {
            texts,
            scores,
            attrs,
            token_to_id,
            algorithm,
            special_cache,
            bos,
            eos,
            unk,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            pieces: Vec::new(),
        };
        tok.pieces = (0..n as u32).map(|id| tok.piece_for_cache(id)).collect();
        Ok(tok)
    }

    pub(crate) fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & (attr::CONTROL | attr::UNKNOWN) != 0)
    }

    /// llama.cpp's `token_to_piece(special = true)` without space stripping.
    fn piece_for_cache(&self, id: u32) -> Vec<u8> {
        let a = self.attrs[id as usize];
        let text = &self.texts[id as usize];
        let special = attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED;
        if a & special != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match &self.algorithm {
                Algorithm::Spm
                | Algorithm::Bpe {
                    escape_whitespaces: true,
                    ..
                } => text.replace('\u{2581}', " ").into_bytes(),
                Algorithm::Bpe { model, .. } => model.decode_byte_level(text),
            };
        }
        if a & attr::BYTE != 0 {
            return byte_token_value(text).map(|b| vec![b]).unwrap_or_default();
        }
        Vec::new()
    }

    /// The token for one raw byte: `<0xNN>` (or the byte itself) for
    /// SentencePiece vocabularies.
    pub(crate) fn spm_byte_token(&self, b: u8) -> Option<u32> {
        let hex = format!("<0x{b:02X}>");
        self.token_to_id.get(hex.as_str()).copied().or_else(|| {
            std::str::from_utf8(&[b])
                .ok()
                .and_then(|s| self.token_to_id.get(s).copied())
        })
    }

    /// Tokenizes `text` (llama.cpp's `llama_vocab::impl::tokenize`).
    pub(crate) fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::new();
        match &self.algorithm {
            Algorithm::Spm => {
                let mut prev_special = true;
                if add_special && self.add_bos {
                    if let Some(b) = self.bos {
                        out.push(b);
                    }
                }
                let mut buf = String::new();
                for frag in fragments {
                    match frag {
                        Fragment::Text(r) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(&text[r]);
                            let escaped = buf.replace(' ', "\u{2581}");
                            spm::tokenize(self, &escaped, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
                if add_special && self.add_eos {
                    if let Some(e) = self.eos {
                        out.push(e);
                    }
                }
            }
            Algorithm::Bpe {
                model,
                splitters,
                byte_encode,
                ignore_merges,
                escape_whitespaces,
                gemma4_newlines,
            } => {
                if add_special && self.add_bos {
                    if let Some(b) = self.bos {
                        out.push(b);
                    }
                }
                for frag in fragments {
                    match frag {
                        Fragment::Text(r) => {
                            let raw = &text[r];
                            let owned;
                            let t = if *escape_whitespaces {
                                owned = raw.replace(' ', "\u{2581}");
                                owned.as_str()
                            } else {
                                raw
                            };
                            let words = crate::pretok::split(t, splitters)?;
                            for w in words {
                                let word = &t[w];
                                let encoded;
                                let word = if *byte_encode {
                                    encoded = model.byte_encode(word);
                                    encoded.as_str()
                                } else {
                                    word
                                };
                                model.tokenize_word(
                                    self,
                                    word,
                                    *ignore_merges,
                                    *gemma4_newlines,
                                    *byte_encode,
                                    &mut out,
                                );
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
                if add_special && self.add_eos {
                    if let Some(e) = self.eos {
                        out.push(e);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Splits `text` on special tokens, longest first (`tokenizer_st_partition`).
    /// Control and unknown tokens are only matched when `parse_special`;
    /// user-defined tokens always are.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0..text.len()));
        let bytes = text.as_bytes();
        let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r');
        // Which bytes and byte pairs occur: a cheap filter that skips most of
        // the thousands of special tokens some vocabularies have (`<unused12>`).
        let mut singles = [false; 256];
        let mut pairs = vec![0u64; 1024];
        for &b in bytes {
            singles[b as usize] = true;
        }
        let pair_key = |a: u8, b: u8| ((a as usize) << 8) | b as usize;
        for w in bytes.windows(2) {
            let k = pair_key(w[0], w[1]);
            pairs[k >> 6] |= 1 << (k & 63);
        }
        let may_occur = |n: &[u8]| match n {
            [] => false,
            [b] => singles[*b as usize],
            [a, b, ..] => {
                let k = pair_key(*a, *b);
                let (y, z) = (n[n.len() - 2], n[n.len() - 1]);
                let k2 = pair_key(y, z);
                pairs[k >> 6] & (1 << (k & 63)) != 0 && pairs[k2 >> 6] & (1 << (k2 & 63)) != 0
            }
        };
        for &id in &self.special_cache {
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = self.texts[id as usize].as_str();
            if needle.len() > text.len() || !may_occur(needle.as_bytes()) {
                continue;
            }
            if !frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(r) if text[r.clone()].contains(needle)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(r) = f else {
                    next.push(f);
                    continue;
                };
                let (mut start, end) = (r.start, r.end);
                loop {
                    let Some(rel) = text[start..end].find(needle) else {
                        if start < end {
                            next.push(Fragment::Text(start..end));
                        }
                        break;
                    };
                    let m = start + rel;
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > start && is_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start..left_end));
                    }
                    next.push(Fragment::Token(id));
                    start = m + needle.len();
                    if a & attr::RSTRIP != 0 {
                        while start < end && is_space(bytes[start]) {
                            start += 1;
                        }
                    }
                    if start >= end {
                        break;
                    }
                }
            }
            frags = next;
        }
        frags
    }
}

#[derive(Debug, Clone)]
enum Fragment {
    Text(std::ops::Range<usize>),
    Token(u32),
}

/// The byte of a `<0xNN>` token.
pub(crate) fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}
