//! Merge-ranked BPE over one pre-tokenized word, as llama.cpp's
//! `llm_tokenizer_bpe_session` does it (`src/llama-vocab.cpp`): start from
//! one symbol per code point, repeatedly merge the adjacent pair with the
//! lowest merge rank (ties: leftmost; [`crate::merge`]), then map each final
//! symbol to its token, falling back to one token per byte for symbols that
//! are not tokens.

use std::cmp::Reverse;
use std::collections::HashMap;

use crate::merge::merge;
use crate::unicode::{byte_to_char_table, char_to_byte_table};
use crate::vocab::GgufTokenizer;

#[derive(Debug)]
pub(crate) struct BpeModel {
    /// Interned merge operands.
    parts: HashMap<String, u32>,
    /// `(left, right)` operand ids → merge rank (first occurrence wins).
    ranks: HashMap<(u32, u32), u32>,
    byte_chars: [char; 256],
    char_bytes: Vec<Option<u8>>,
}

impl BpeModel {
    pub(crate) fn new(merges: &[String]) -> BpeModel {
        let mut parts: HashMap<String, u32> = HashMap::new();
        let mut ranks = HashMap::with_capacity(merges.len());
        let intern = |s: &str, parts: &mut HashMap<String, u32>| -> u32 {
            if let Some(&id) = parts.get(s) {
                return id;
            }
            let id = parts.len() as u32;
            parts.insert(s.to_string(), id);
            id
        };
        for (rank, m) in merges.iter().enumerate() {
            // The separator is the first space after the first byte.
            let Some(pos) = m.as_bytes().iter().skip(1).position(|&b| b == b' ') else {
                continue;
            };
            let pos = pos + 1;
            let (l, r) = (&m[..pos], &m[pos + 1..]);
            let (l, r) = (intern(l, &mut parts), intern(r, &mut parts));
            ranks.entry((l, r)).or_insert(rank as u32);
        }
        BpeModel {
            parts,
            ranks,
            byte_chars: byte_to_char_table(),
            char_bytes: char_to_byte_table(),
        }
    }

    fn rank(&self, left: &str, right: &str) -> Option<u32> {
        let l = *self.parts.get(left)?;
        let r = *self.parts.get(right)?;
        self.ranks.get(&(l, r)).copied()
    }

    /// GPT-2 byte-level encoding of a word.
    pub(crate) fn byte_encode(&self, word: &str) -> String {
        word.bytes().map(|b| self.byte_chars[b as usize]).collect()
    }

    /// Inverse of [`Self::byte_encode`] for a token's text; characters outside
    /// the byte map pass through as their UTF-8 bytes.
    pub(crate) fn decode_byte_level(&self, text: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match self.char_bytes.get(c as usize).copied().flatten() {
                Some(b) => out.push(b),
                None => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        out
    }

    pub(crate) fn tokenize_word(
        &self,
        vocab: &GgufTokenizer,
        word: &str,
        ignore_merges: bool,
        gemma4_newlines: bool,
        byte_encode: bool,
        out: &mut Vec<u32>,
    ) {
        if word.is_empty() {
            return;
        }
        let whole = vocab.token_to_id.get(word).copied();
        if let Some(id) = whole {
            if ignore_merges || (gemma4_newlines && word.bytes().all(|b| b == b'\n')) {
                out.push(id);
                return;
            }
        }
        // Lowest merge rank first.
        let pieces = merge(word, |p| self.rank(p.left, p.right).map(Reverse));
        for piece in pieces {
            if let Some(&id) = vocab.token_to_id.get(piece) {
                out.push(id);
                continue;
            }
            for b in piece.bytes() {
                let id = if byte_encode {
                    let mut buf = [0u8; 4];
                    vocab
                        .token_to_id
                        .get(&*char::encode_utf8(self.byte_chars[b as usize], &mut buf))
                        .copied()
                } else {
                    vocab.token_to_id.get(&format!("<0x{b:02X}>")).copied()
                };
                if let Some(id) = id {
                    out.push(id);
                }
            }
        }
    }
}
