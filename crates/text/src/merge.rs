//! The symbol merging shared by llama.cpp's two BPE tokenizers
//! (`llm_tokenizer_bpe_session` and `llm_tokenizer_spm_session` in
//! `src/llama-vocab.cpp`): the text starts as one symbol per code point in a
//! linked list; every adjacent pair that may merge goes into a priority
//! queue; the best pair (ties: the leftmost) is merged, its neighbours'
//! pairs are queued, and pairs made stale by an earlier merge are skipped,
//! until the queue is empty. The callers differ only in which pairs may
//! merge and in what order: merge rank for BPE, token score for
//! SentencePiece.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy)]
struct Symbol {
    prev: isize,
    next: isize,
    start: usize,
    len: usize,
}

struct Bigram<K> {
    /// Greater merges first.
    key: K,
    left: usize,
    right: usize,
    /// Bytes of the pair when queued; a merge since changes it.
    size: usize,
}

impl<K: Ord> Ord for Bigram<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap pops the greatest: the greatest key, then the leftmost.
        self.key
            .cmp(&other.key)
            .then_with(|| other.left.cmp(&self.left))
    }
}
impl<K: Ord> PartialOrd for Bigram<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K: Ord> PartialEq for Bigram<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<K: Ord> Eq for Bigram<K> {}

/// Two adjacent pieces of the text, and the two together.
pub(crate) struct Pair<'t> {
    pub left: &'t str,
    pub right: &'t str,
    pub joined: &'t str,
}

/// Merges the code points of `text` as the module docs say; `key(pair)` is
/// the priority of merging two adjacent pieces (`None`: they may not
/// merge). Returns the final pieces, in order.
pub(crate) fn merge<'t, K: Ord>(
    text: &'t str,
    key: impl Fn(&Pair<'t>) -> Option<K>,
) -> Vec<&'t str> {
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
    let piece = |s: &Symbol| &text[s.start..s.start + s.len];
    let mut queue = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<Bigram<K>>, symbols: &[Symbol], l: isize, r: isize| {
        if l < 0 || r < 0 {
            return;
        }
        let (ls, rs) = (&symbols[l as usize], &symbols[r as usize]);
        let pair = Pair {
            left: piece(ls),
            right: piece(rs),
            joined: &text[ls.start..ls.start + ls.len + rs.len],
        };
        if let Some(key) = key(&pair) {
            queue.push(Bigram {
                key,
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
    // Merged-away symbols are empty; the rest are in text order.
    symbols.iter().filter(|s| s.len > 0).map(piece).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;

    #[test]
    fn merges_best_pairs_first_and_ties_leftmost() {
        // Ranks: "ab" 0, "bc" 1, "abc" 2 — "ab" wins over "bc", then "ab"+"c".
        let rank = |p: &Pair| match (p.left, p.right) {
            ("a", "b") => Some(Reverse(0)),
            ("b", "c") => Some(Reverse(1)),
            ("ab", "c") => Some(Reverse(2)),
            _ => None,
        };
        assert_eq!(merge("abcx", rank), ["abc", "x"]);
        // Equal keys: the leftmost pair merges first ("aa" then "a").
        assert_eq!(
            merge("aaa", |p| (p.joined == "aa").then_some(0)),
            ["aa", "a"]
        );
        assert_eq!(merge("é€", |_| None::<u8>), ["é", "€"]);
        assert!(merge("", |_| Some(0)).is_empty());
    }
}
