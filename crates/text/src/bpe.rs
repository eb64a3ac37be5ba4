//! Merge-ranked BPE over one pre-tokenized word, as llama.cpp's
//! `llm_tokenizer_bpe_session` does it (`src/llama-vocab.cpp`): start from
//! one symbol per code point, repeatedly merge the adjacent pair with the
//! lowest merge rank (ties: leftmost), then map each final symbol to its
//! token, falling back to one token per byte for symbols that are not tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

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

#[derive(Clone, Copy)]
struct Symbol {
    prev: isize,
    next: isize,
    start: usize,
    len: usize,
}

#[derive(PartialEq, Eq)]
struct Bigram {
    rank: u32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap pops the greatest: lowest rank, then leftmost.
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
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
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        let n_chars = word.chars().count();
        for (i, (start, c)) in word.char_indices().enumerate() {
            symbols.push(Symbol {
                prev: i as isize - 1,
                next: if i + 1 == n_chars { -1 } else { i as isize + 1 },
                start,
                len: c.len_utf8(),
            });
        }
        let text = |s: &Symbol| &word[s.start..s.start + s.len];
        let mut queue = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], l: isize, r: isize| {
            if l < 0 || r < 0 {
                return;
            }
            let (ls, rs) = (&symbols[l as usize], &symbols[r as usize]);
            if let Some(rank) = self.rank(text(ls), text(rs)) {
                queue.push(Bigram {
                    rank,
                    left: l as usize,
                    right: r as usize,
                    size: ls.len + rs.len,
                });
            }
        };
        for i in 1..symbols.len() {
            push(&mut queue, &symbols, i as isize - 1, i as isize);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // Stale: one side already merged elsewhere.
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
        for s in symbols.iter().filter(|s| s.len > 0) {
            let piece = text(s);
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
