//! Streaming detokenizer: token ids go in one at a time, text comes out only
//! once it is complete.
//!
//! - Bytes of a UTF-8 character split across tokens (byte-fallback `<0xNN>`
//!   tokens, byte-level BPE pieces) are held until the character is complete;
//!   an invalid sequence becomes U+FFFD.
//! - The SentencePiece leading-space rule: when the tokenizer adds a space
//!   prefix on encode, the first piece's leading space is dropped (once).
//! - Stop strings may span tokens: text that could be the start of a stop
//!   string is held back; when a stop string completes, the text before it is
//!   emitted and the stream ends. A stop string is never emitted, not even in
//!   part.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Incremental decoder over one generation.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    /// Bytes of an incomplete UTF-8 character.
    pending: Vec<u8>,
    /// Complete text not yet emitted because it may begin a stop string.
    held: String,
    strip_leading_space: bool,
    skip_special: bool,
    stops: Vec<String>,
    stopped: Option<usize>,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder that leaves out control tokens and applies the tokenizer's
    /// leading-space rule.
    pub fn new(tok: &'t Tokenizer) -> Self {
        StreamDecoder {
            tok,
            pending: Vec::new(),
            held: String::new(),
            strip_leading_space: tok.strips_leading_space(),
            skip_special: true,
            stops: Vec::new(),
            stopped: None,
        }
    }

    /// Stop strings; empty strings are ignored.
    pub fn with_stop_strings<S: Into<String>>(
        mut self,
        stops: impl IntoIterator<Item = S>,
    ) -> Self {
        self.stops = stops
            .into_iter()
            .map(Into::into)
            .filter(|s: &String| !s.is_empty())
            .collect();
        self
    }

    /// Overrides the leading-space rule (e.g. false when continuing a prompt
    /// whose text already ends mid-sentence).
    pub fn with_strip_leading_space(mut self, strip: bool) -> Self {
        self.strip_leading_space = strip;
        self
    }

    /// Whether control tokens are rendered as their text.
    pub fn with_special_tokens(mut self, render: bool) -> Self {
        self.skip_special = !render;
        self
    }

    /// Whether a stop string has been seen.
    pub fn is_stopped(&self) -> bool {
        self.stopped.is_some()
    }

    /// The stop string that ended the stream.
    pub fn stop_string(&self) -> Option<&str> {
        self.stopped.map(|i| self.stops[i].as_str())
    }

    /// Feeds one token and returns the text that became final (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        let mut out = String::new();
        self.push_to(id, &mut out)?;
        Ok(out)
    }

    /// Like [`Self::push`], appending to `out` (no allocation once the
    /// internal buffers have grown).
    pub fn push_to(&mut self, id: u32, out: &mut String) -> Result<()> {
        if self.stopped.is_some() {
            return Ok(());
        }
        let piece = self
            .tok
            .token_bytes(id)
            .ok_or(crate::TextError::TokenOutOfRange {
                id,
                vocab_size: self.tok.vocab_size(),
            })?;
        if self.skip_special && self.tok.is_special(id) {
            return Ok(());
        }
        let mut piece = piece;
        if self.strip_leading_space && !piece.is_empty() {
            if piece[0] == b' ' {
                piece = &piece[1..];
            }
            self.strip_leading_space = false;
        }
        self.pending.extend_from_slice(piece);
        self.drain_utf8();
        self.release(out);
        Ok(())
    }

    /// Ends the stream: returns what was held back (an incomplete character
    /// becomes U+FFFD). Nothing after a stop string is returned.
    pub fn finish(&mut self) -> String {
        if self.stopped.is_some() {
            return String::new();
        }
        if !self.pending.is_empty() {
            self.held.push_str(&String::from_utf8_lossy(&self.pending));
            self.pending.clear();
        }
        let mut out = String::new();
        if !self.check_stop(&mut out) {
            out = std::mem::take(&mut self.held);
        }
        out
    }

    /// Moves the complete UTF-8 prefix of `pending` into `held`.
    fn drain_utf8(&mut self) {
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    self.held.push_str(s);
                    self.pending.clear();
                    return;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    self.held.push_str(
                        std::str::from_utf8(&self.pending[start..valid]).unwrap_or_default(),
                    );
                    match e.error_len() {
                        Some(bad) => {
                            self.held.push('\u{FFFD}');
                            start = valid + bad;
                        }
                        None => {
                            // An incomplete character at the end: keep it.
                            self.pending.drain(..valid);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// If a stop string occurs in `held`, ends the stream and appends the text
    /// before the earliest one to `out`.
    fn check_stop(&mut self, out: &mut String) -> bool {
        let mut best: Option<(usize, usize)> = None;
        for (i, s) in self.stops.iter().enumerate() {
            if let Some(pos) = self.held.find(s.as_str()) {
                if best.is_none_or(|(p, _)| pos < p) {
                    best = Some((pos, i));
                }
            }
        }
        let Some((pos, i)) = best else {
            return false;
        };
        self.stopped = Some(i);
        out.push_str(&self.held[..pos]);
        self.held.clear();
        self.pending.clear();
        true
    }

    /// Appends `held` to `out` except a suffix that is a proper prefix of a
    /// stop string.
    fn release(&mut self, out: &mut String) {
        if self.check_stop(out) {
            return;
        }
        let mut keep = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(self.held.len());
            for n in (keep + 1..=max).rev() {
                let at = self.held.len() - n;
                if self.held.is_char_boundary(at)
                    && s.as_bytes().starts_with(&self.held.as_bytes()[at..])
                {
                    keep = n;
                    break;
                }
            }
        }
        let at = self.held.len() - keep;
        out.push_str(&self.held[..at]);
        self.held.replace_range(..at, "");
    }
}
