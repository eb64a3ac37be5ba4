//! SentencePiece BPE by scores, as llama.cpp's `llm_tokenizer_spm_session`
//! (`src/llama-vocab.cpp`, after the original llama.cpp tokenizer): start from
//! one symbol per code point, repeatedly merge the adjacent pair whose
//! concatenation is a token with the highest score (ties: leftmost), then emit
//! each symbol's token or, for symbols that are not tokens, its bytes as
//! `<0xNN>` byte-fallback tokens.
//!
//! The caller has already replaced spaces by `▁` and applied the
//! `add_space_prefix` rule.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::GgufTokenizer;

#[derive(Clone, Copy)]
struct Symbol {
    prev: isize,
    next: isize,
    start: usize,
    len: usize,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap pops the greatest: highest score, then leftmost.
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

pub(crate) fn tokenize(vocab: &GgufTokenizer, text: &str, out: &mut Vec<u32>) {
    if text.is_empty() {
        return;
    }
    let n_chars = text.chars().count();
    let mut symbols: Vec<Symbol> = Vec::with_capacity(n_chars);
    for (i, (start, c)) in text.char_indices().enumerate() {
        symbols.push(Symbol {
            prev: i as isize - 1,
            next: if i + 1 == n_chars { -1 } else { i as isize + 1 },
            start,
            len: c.len_utf8(),
        });
    }
    let mut queue = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], l: isize, r: isize| {
        if l < 0 || r < 0 {
            return;
        }
        let (ls, rs) = (&symbols[l as usize], &symbols[r as usize]);
        let joined = &text[ls.start..ls.start + ls.len + rs.len];
        if let Some(&id) = vocab.token_to_id.get(joined) {
            queue.push(Bigram {
                score: vocab.scores[id as usize],
                left: l as usize,
                right: r as usize,
                size: joined.len(),
            });
        }
    };
    for i in 1..symbols.len() {
        push(&mut queue, &symbols, i as isize - 1, i as isize);
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if r.next >= 0 {
            symbols[r.next as usize].prev = b.left as isize;
        }
        let left = symbols[b.left];
        push(&mut queue, &symbols, left.prev, b.left as isize);
        push(&mut queue, &symbols, b.left as isize, left.next);
    }
    let mut i: isize = 0;
    while i >= 0 {
        let s = symbols[i as usize];
        let piece = &text[s.start..s.start + s.len];
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
        i = s.next;
    }
}
