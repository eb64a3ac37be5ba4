//! SentencePiece BPE by scores, as llama.cpp's `llm_tokenizer_spm_session`
//! (`src/llama-vocab.cpp`, after the original llama.cpp tokenizer): start from
//! one symbol per code point, repeatedly merge the adjacent pair whose
//! concatenation is a token with the highest score (ties: leftmost;
//! [`crate::merge`]), then emit
//! each symbol's token or, for symbols that are not tokens, its bytes as
//! `<0xNN>` byte-fallback tokens.
//!
//! The caller has already replaced spaces by `▁` and applied the
//! `add_space_prefix` rule.

use std::cmp::Ordering;

use crate::merge::merge;
use crate::vocab::GgufTokenizer;

/// A token score ordered by `f32::total_cmp`.
struct Score(f32);

impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Score {}

pub(crate) fn tokenize(vocab: &GgufTokenizer, text: &str, out: &mut Vec<u32>) {
    if text.is_empty() {
        return;
    }
    // Highest score first; a pair may merge when the two together are a token.
    let pieces = merge(text, |p| {
        vocab
            .token_to_id
            .get(p.joined)
            .map(|&id| Score(vocab.scores[id as usize]))
    });
    for piece in pieces {
        match vocab.token_to_id.get(piece) {
            Some(&id) => out.push(id),
            None => {
                for b in piece.bytes() {
                    if let Some(id) = vocab.spm_byte_token(b).or(vocab.unk) {
                        out.push(id);
                    }
                }
            }
        }
    }
}
