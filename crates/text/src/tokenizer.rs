//! The [`Tokenizer`]: text ↔ token ids for an installed model.
//!
//! Two backends: a vocabulary from GGUF metadata (SentencePiece or BPE,
//! llama.cpp's algorithms, see [`crate::vocab`]) or an HF `tokenizer.json`
//! run by the `tokenizers` crate (feature `hf-tokenizers`). Both expose every
//! token's decoded bytes ([`Tokenizer::token_bytes`]), which is all that
//! decoding and the streaming detokenizer need.

use std::path::Path;

use serde::Deserialize;
use turbospark_format::gguf::GgufFile;
use turbospark_format::install::{GGUF_VOCAB_FILE, MANIFEST_FILE, TOKENIZER_FILE};

use crate::error::{io_err, Result, TextError};
use crate::vocab::{GgufTokenizer, GgufVocabFields};

/// How [`Tokenizer::encode_with`] treats its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add the model's BOS (and EOS, where the vocabulary asks for it).
    pub add_special: bool,
    /// Match control tokens (`<|im_start|>`, `<s>`, ...) written in the text as
    /// whole tokens. When false they are tokenized as plain text; user-defined
    /// tokens are matched either way (as llama.cpp and HF tokenizers do).
    pub parse_special: bool,
}

/// How [`Tokenizer::decode_with`] renders tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Leave out control tokens (BOS, EOS, `<|im_end|>`, ...).
    pub skip_special: bool,
    /// Drop one leading space of the first rendered piece (SentencePiece's
    /// inverse of `add_space_prefix`); `None` takes the tokenizer's rule.
    pub strip_leading_space: Option<bool>,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            skip_special: true,
            strip_leading_space: None,
        }
    }
}

enum Backend {
    Gguf(Box<GgufTokenizer>),
    #[cfg(feature = "hf-tokenizers")]
    Hf(Box<crate::hf::HfTokenizer>),
}

/// A tokenizer with its special ids and the decoded bytes of every token.
pub struct Tokenizer {
    backend: Backend,
    /// Decoded bytes of each token, control tokens as their text.
    pieces: Vec<Vec<u8>>,
    /// Whether each token is a control token (left out of decoded text by default).
    special: Vec<bool>,
    strip_leading_space: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.backend {
            Backend::Gguf(_) => "gguf",
            #[cfg(feature = "hf-tokenizers")]
            Backend::Hf(_) => "hf",
        };
        f.debug_struct("Tokenizer")
            .field("backend", &kind)
            .field("vocab_size", &self.pieces.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .finish()
    }
}

/// The parts of `manifest.json` the tokenizer reads.
#[derive(Debug, Default, Deserialize)]
struct ManifestView {
    #[serde(default)]
    tokenizer: Option<String>,
    #[serde(default)]
    generation: Option<GenerationView>,
}

#[derive(Debug, Default, Deserialize)]
struct GenerationView {
    #[serde(default)]
    bos_token_id: Option<u32>,
    #[serde(default)]
    eos_token_ids: Vec<u32>,
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    serde_json::from_slice(&bytes).map_err(|e| TextError::Json {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

impl Tokenizer {
    /// Loads the tokenizer of an install directory (`docs/FORMAT.md`): the file
    /// `manifest.json` names (`tokenizer.json` or `vocab.gguf.json`), with the
    /// manifest's generation defaults (BOS, EOS ids, `add_bos`) applied.
    pub fn from_install_dir(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        let dir = dir.as_ref();
        let manifest_path = dir.join(MANIFEST_FILE);
        let manifest: ManifestView = if manifest_path.is_file() {
            serde_json::from_value(read_json(&manifest_path)?).map_err(|e| TextError::Json {
                path: manifest_path.clone(),
                detail: e.to_string(),
            })?
        } else {
            ManifestView::default()
        };
        let file = match &manifest.tokenizer {
            Some(name) => Some(dir.join(name)),
            None if manifest_path.is_file() => None,
            None => [TOKENIZER_FILE, GGUF_VOCAB_FILE]
                .iter()
                .map(|n| dir.join(n))
                .find(|p| p.is_file()),
        };
        let Some(file) = file.filter(|p| p.is_file()) else {
            return Err(TextError::NoTokenizer {
                dir: dir.to_path_buf(),
            });
        };
        let mut tok = if file.file_name().and_then(|n| n.to_str()) == Some(GGUF_VOCAB_FILE) {
            Self::from_gguf_vocab_json(&file)?
        } else {
            Self::from_hf_file(&file)?
        };
        // The manifest's ids come from the same source; they fill in what the
        // vocabulary leaves out. Whether BOS is added stays the vocabulary's
        // rule (llama.cpp's defaults per model type), or for an HF file its
        // post-processor's.
        if let Some(g) = manifest.generation {
            if tok.bos.is_none() {
                tok.bos = g.bos_token_id.filter(|&b| (b as usize) < tok.pieces.len());
            }
            if let Some(&e) = g.eos_token_ids.first() {
                if (e as usize) < tok.pieces.len() {
                    tok.eos = Some(e);
                }
            }
            tok.eog.extend(
                g.eos_token_ids
                    .into_iter()
                    .filter(|&id| (id as usize) < tok.pieces.len()),
            );
            tok.eog.sort_unstable();
            tok.eog.dedup();
        }
        Ok(tok)
    }

    /// Builds the tokenizer from an install's `vocab.gguf.json`.
    pub fn from_gguf_vocab_json(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let v = read_json(path.as_ref())?;
        Self::from_gguf_fields(GgufVocabFields::from_json(&v)?)
    }

    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let g = GgufFile::open(path).map_err(|e| TextError::Gguf {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        Self::from_gguf_fields(GgufVocabFields::from_gguf_metadata(g.metadata())?)
    }

    pub fn from_gguf_fields(fields: GgufVocabFields) -> Result<Tokenizer> {
        let mut g = GgufTokenizer::new(fields)?;
        let pieces = std::mem::take(&mut g.pieces);
        let special = (0..pieces.len() as u32)
            .map(|id| g.is_control(id))
            .collect();
        Ok(Tokenizer {
            pieces,
            special,
            strip_leading_space: g.add_space_prefix,
            bos: g.bos,
            eos: g.eos,
            eog: g.eog.clone(),
            add_bos: g.add_bos,
            backend: Backend::Gguf(Box::new(g)),
        })
    }

    /// Loads an HF `tokenizer.json`.
    #[cfg(feature = "hf-tokenizers")]
    pub fn from_hf_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let hf = crate::hf::HfTokenizer::from_file(path.as_ref())?;
        Ok(Tokenizer {
            pieces: hf.pieces.clone(),
            special: hf.special.clone(),
            strip_leading_space: hf.strip_leading_space,
            bos: hf.bos,
            eos: hf.eos,
            eog: hf.eos.into_iter().collect(),
            add_bos: hf.bos.is_some(),
            backend: Backend::Hf(Box::new(hf)),
        })
    }

    #[cfg(not(feature = "hf-tokenizers"))]
    pub fn from_hf_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        Err(TextError::HfTokenizer {
            path: path.as_ref().to_path_buf(),
            detail: "built without the `hf-tokenizers` feature".into(),
        })
    }

    /// Tokenizes `text`, matching control tokens written in it; `add_special`
    /// adds the model's BOS/EOS as the vocabulary asks.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        self.encode_with(
            text,
            EncodeOptions {
                add_special,
                parse_special: true,
            },
        )
    }

    pub fn encode_with(&self, text: &str, opts: EncodeOptions) -> Result<Vec<u32>> {
        match &self.backend {
            Backend::Gguf(g) => g.encode(text, opts.add_special, opts.parse_special),
            #[cfg(feature = "hf-tokenizers")]
            Backend::Hf(h) => h.encode(text, opts.add_special, opts.parse_special),
        }
    }

    /// Decodes ids to text, leaving out control tokens; invalid UTF-8 (a
    /// character cut by the end of `ids`) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decode_with(ids, DecodeOptions::default())
    }

    pub fn decode_with(&self, ids: &[u32], opts: DecodeOptions) -> Result<String> {
        let mut bytes = Vec::new();
        let mut strip = opts.strip_leading_space.unwrap_or(self.strip_leading_space);
        for &id in ids {
            let piece = self.piece(id)?;
            if opts.skip_special && self.special[id as usize] {
                continue;
            }
            // The rule applies to the first piece that has any bytes.
            let piece = match (strip, piece.first()) {
                (true, Some(b' ')) => &piece[1..],
                _ => piece,
            };
            if strip && !self.pieces[id as usize].is_empty() {
                strip = false;
            }
            bytes.extend_from_slice(piece);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn piece(&self, id: u32) -> Result<&[u8]> {
        self.pieces
            .get(id as usize)
            .map(Vec::as_slice)
            .ok_or(TextError::TokenOutOfRange {
                id,
                vocab_size: self.pieces.len(),
            })
    }

    /// The bytes token `id` stands for (control tokens: their text); `None`
    /// outside the vocabulary. A byte-fallback or byte-level token may hold part
    /// of a UTF-8 character.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(Vec::as_slice)
    }

    /// Whether `id` is a control token (BOS, EOS, chat markup).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Whether decoding drops the leading space that encoding added
    /// (SentencePiece `add_space_prefix`).
    pub fn strips_leading_space(&self) -> bool {
        self.strip_leading_space
    }

    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Tokens that end generation (EOS, end-of-turn and similar).
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Whether `encode(_, true)` adds BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Text of a token as stored in the vocabulary, e.g. `<|im_end|>` or `Ġthe`.
    pub fn token_text(&self, id: u32) -> Option<String> {
        match &self.backend {
            Backend::Gguf(g) => g.texts.get(id as usize).cloned(),
            #[cfg(feature = "hf-tokenizers")]
            Backend::Hf(h) => h.token_text(id),
        }
    }
}
