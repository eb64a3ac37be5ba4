//! Pre-tokenizer splits for byte-level BPE vocabularies: the word pieces that
//! BPE merges never cross.
//!
//! Follows llama.cpp's `unicode_regex_split` (`src/unicode.cpp`): the regexes
//! of a pre-tokenizer type are applied in order, each one splitting every piece
//! left by the previous one into matches and the text between them. The GPT-2,
//! Llama 3, Qwen2, Qwen3.5 and newline regexes have hand-written splitters
//! there and here (they encode lookahead rules such as `\s+(?!\S)` directly);
//! any other regex runs through `fancy-regex` on the piece's text, so anchors
//! and lookarounds see the piece boundaries just as `std::regex` does there.

use crate::error::{Result, TextError};
use crate::unicode::Flags;

const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const LLAMA3: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const LLAMA3_ORIG: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const NEWLINES: &str = "[^\\n]+|[\\n]+";

/// How raw text becomes BPE input for one pre-tokenizer type.
#[derive(Debug, Clone)]
pub(crate) struct PreConfig {
    pub regexes: Vec<&'static str>,
    /// Map bytes through GPT-2's byte-to-unicode table before BPE.
    pub byte_encode: bool,
    /// A whole word that is a token is emitted without merging.
    pub ignore_merges: bool,
    /// Spaces become `▁` before BPE (SentencePiece-style BPE).
    pub escape_whitespaces: bool,
    /// The type forces `add_bos` unless the vocabulary says otherwise.
    pub default_add_bos: bool,
}

impl PreConfig {
    fn new(regexes: &[&'static str]) -> PreConfig {
        PreConfig {
            regexes: regexes.to_vec(),
            byte_encode: true,
            ignore_merges: false,
            escape_whitespaces: false,
            default_add_bos: false,
        }
    }
    fn ignore_merges(mut self) -> Self {
        self.ignore_merges = true;
        self
    }
    fn add_bos(mut self) -> Self {
        self.default_add_bos = true;
        self
    }
    fn spm_style(mut self) -> Self {
        self.byte_encode = false;
        self.escape_whitespaces = true;
        self
    }
}

/// The regexes of llama.cpp's pre-tokenizer type for `tokenizer.ggml.pre`
/// (`llm_tokenizer_bpe` and `llama_vocab::impl::load` in `llama-vocab.cpp`).
pub(crate) fn pre_config(pre: &str) -> Result<PreConfig> {
    const DEFAULT: &[&str] = &[
        "[\\p{P}\\$\\+<=>\\^~\\|]+",
        GPT2,
        "\\p{N}+",
        "[0-9][0-9][0-9]",
    ];
    const DEEPSEEK_LLM: &[&str] = &[
        "[\r\n]",
        "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
        "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
        "\\s+$",
        "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
        "\\p{N}+",
    ];
    const DEEPSEEK3: &[&str] = &[
        "\\p{N}{1,3}",
        "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ];
    const DEEPSEEK_CODER: &[&str] = &[
        "[\r\n]",
        "\\s?\\p{L}+",
        "\\s?\\p{P}+",
        "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
        "\\p{N}",
    ];
    const FALCON: &[&str] = &["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"];
    const STARCODER: &[&str] = &["\\p{N}", GPT2];
    const GPT4O: &[&str] = &[
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ];
    const TEKKEN: &[&str] = &[
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ];
    const PORO: &[&str] =
        &[" ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+"];
    const SEED_CODER: &[&str] = &[
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ];

    let cfg = match pre {
        "default" => PreConfig::new(DEFAULT),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreConfig::new(&[LLAMA3]).ignore_merges().add_bos(),
        "dbrx" | "smaug-bpe" => PreConfig::new(&[LLAMA3]),
        "chatglm-bpe" => PreConfig::new(&[LLAMA3]),
        "glm4" | "glm5" => PreConfig::new(&[LLAMA3]).ignore_merges(),
        "deepseek-llm" => PreConfig::new(DEEPSEEK_LLM),
        "deepseek-coder" => PreConfig::new(DEEPSEEK_CODER),
        "deepseek-v3" => PreConfig::new(DEEPSEEK3),
        "falcon" => PreConfig::new(FALCON),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => PreConfig::new(STARCODER),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe"
        | "exaone4" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => {
            PreConfig::new(&[GPT2])
        }
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan"
        | "solar-open" | "grok-2" => PreConfig::new(&[QWEN2]),
        "qwen35" => PreConfig::new(&[QWEN35]),
        "poro-chat" | "bloom" | "gpt3-finnish" => PreConfig::new(PORO),
        "viking" => PreConfig::new(&[PORO[0], "\\p{N}"]),
        "tekken" => PreConfig::new(TEKKEN).ignore_merges().add_bos(),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => PreConfig::new(GPT4O),
        "seed-coder" => PreConfig::new(SEED_CODER),
        "gemma4" | "granite-embed-multi-311m" | "sarvam-moe" => {
            PreConfig::new(&[NEWLINES]).spm_style()
        }
        other => {
            return Err(TextError::UnsupportedPreTokenizer {
                pre: other.to_string(),
            })
        }
    };
    Ok(cfg)
}

/// One compiled split step.
#[derive(Debug)]
pub(crate) enum Splitter {
    Gpt2,
    Llama3,
    Qwen2,
    Qwen35,
    Newlines,
    Regex(Box<fancy_regex::Regex>),
}

impl Splitter {
    pub(crate) fn compile(pattern: &str) -> Result<Splitter> {
        Ok(match pattern {
            GPT2 => Splitter::Gpt2,
            LLAMA3 | LLAMA3_ORIG => Splitter::Llama3,
            QWEN2 => Splitter::Qwen2,
            QWEN35 => Splitter::Qwen35,
            NEWLINES => Splitter::Newlines,
            _ => Splitter::Regex(Box::new(fancy_regex::Regex::new(pattern).map_err(|e| {
                TextError::Regex {
                    pattern: pattern.to_string(),
                    detail: e.to_string(),
                }
            })?)),
        })
    }
}

/// The text as code points with their byte offsets (`offsets[i]` is where
/// code point `i` starts; one extra entry holds the text length).
struct Cpts {
    cps: Vec<u32>,
    offsets: Vec<usize>,
}

impl Cpts {
    fn new(text: &str) -> Cpts {
        let mut cps = Vec::with_capacity(text.len());
        let mut offsets = Vec::with_capacity(text.len() + 1);
        for (i, c) in text.char_indices() {
            cps.push(c as u32);
            offsets.push(i);
        }
        offsets.push(text.len());
        Cpts { cps, offsets }
    }
}

/// Splits `text` into pieces (byte ranges) with the given splitters.
pub(crate) fn split(text: &str, splitters: &[Splitter]) -> Result<Vec<std::ops::Range<usize>>> {
    let cp = Cpts::new(text);
    // Piece lengths in code points, as llama.cpp keeps them.
    let mut pieces = vec![cp.cps.len()];
    for s in splitters {
        pieces = match s {
            Splitter::Gpt2 => split_custom(&cp.cps, &pieces, gpt2_piece),
            Splitter::Llama3 => split_custom(&cp.cps, &pieces, |c, a, b, out| {
                llama3_piece(c, a, b, out, Digits::UpTo3, false)
            }),
            Splitter::Qwen2 => split_custom(&cp.cps, &pieces, |c, a, b, out| {
                llama3_piece(c, a, b, out, Digits::One, false)
            }),
            Splitter::Qwen35 => split_custom(&cp.cps, &pieces, |c, a, b, out| {
                llama3_piece(c, a, b, out, Digits::One, true)
            }),
            Splitter::Newlines => split_custom(&cp.cps, &pieces, newline_piece),
            Splitter::Regex(re) => split_regex(text, &cp, &pieces, re)?,
        };
    }
    let mut out = Vec::with_capacity(pieces.len());
    let mut start = 0;
    for len in pieces {
        out.push(cp.offsets[start]..cp.offsets[start + len]);
        start += len;
    }
    Ok(out)
}

fn split_custom(
    cps: &[u32],
    pieces: &[usize],
    f: impl Fn(&[u32], usize, usize, &mut Vec<usize>),
) -> Vec<usize> {
    let mut out = Vec::with_capacity(pieces.len());
    let mut start = 0;
    for &len in pieces {
        f(cps, start, start + len, &mut out);
        start += len;
    }
    out
}

fn split_regex(
    text: &str,
    cp: &Cpts,
    pieces: &[usize],
    re: &fancy_regex::Regex,
) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(pieces.len());
    let mut start = 0;
    for &len in pieces {
        let (b0, b1) = (cp.offsets[start], cp.offsets[start + len]);
        let piece = &text[b0..b1];
        // Code point index of a byte offset inside this piece.
        let cp_at =
            |byte: usize| cp.offsets[start..=start + len].partition_point(|&o| o < b0 + byte);
        let mut prev = 0usize;
        for m in re.find_iter(piece) {
            let m = m.map_err(|e| TextError::Regex {
                pattern: re.as_str().to_string(),
                detail: e.to_string(),
            })?;
            let (ms, me) = (cp_at(m.start()), cp_at(m.end()));
            if ms > prev {
                out.push(ms - prev);
            }
            if me > ms {
                out.push(me - ms);
            }
            prev = me;
        }
        if prev < len {
            out.push(len - prev);
        }
        start += len;
    }
    Ok(out)
}

/// Reads code points and flags of one piece `[ini, end)`; positions outside it
/// read as "no code point".
struct Piece<'a> {
    cps: &'a [u32],
    ini: usize,
    end: usize,
}

const OUT_OF_RANGE: u32 = u32::MAX;

impl Piece<'_> {
    fn cpt(&self, pos: usize) -> u32 {
        if pos >= self.ini && pos < self.end {
            self.cps[pos]
        } else {
            OUT_OF_RANGE
        }
    }
    fn flags(&self, pos: usize) -> Flags {
        if pos >= self.ini && pos < self.end {
            Flags::of(self.cps[pos])
        } else {
            Flags::NONE
        }
    }
}

/// Emits pieces as cut points; `add(end)` closes the piece that ends at `end`.
struct Cutter<'a> {
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl Cutter<'_> {
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

fn to_lower(cp: u32) -> u32 {
    match char::from_u32(cp) {
        Some(c) => {
            let mut l = c.to_lowercase();
            match (l.next(), l.next()) {
                (Some(x), None) => x as u32,
                _ => cp,
            }
        }
        None => cp,
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d` (case-insensitive when `fold`): the length of the
/// contraction at `pos`, if any.
fn contraction(p: &Piece, pos: usize, fold: bool) -> Option<usize> {
    if p.cpt(pos) != '\'' as u32 || pos + 1 >= p.end {
        return None;
    }
    let f = |c: u32| if fold { to_lower(c) } else { c };
    let n1 = f(p.cpt(pos + 1));
    if [b's', b't', b'm', b'd'].iter().any(|&c| n1 == c as u32) {
        return Some(2);
    }
    if pos + 2 < p.end {
        let n2 = f(p.cpt(pos + 2));
        let pair = |a: u8, b: u8| n1 == a as u32 && n2 == b as u32;
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return Some(3);
        }
    }
    None
}

/// The end of the piece at `pos` once the other alternatives failed:
/// `\s+(?!\S)|\s+` over the `n_ws` white-space code points starting there
/// (all but the last when a non-space follows), else one code point.
fn whitespace_end(p: &Piece, pos: usize, n_ws: usize) -> usize {
    if n_ws > 1 && p.cpt(pos + n_ws) != OUT_OF_RANGE {
        pos + n_ws - 1
    } else if n_ws > 0 {
        pos + n_ws
    } else {
        pos + 1
    }
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn gpt2_piece(cps: &[u32], ini: usize, end: usize, out: &mut Vec<usize>) {
    let p = Piece { cps, ini, end };
    let mut cut = Cutter { prev_end: ini, out };
    let mut pos = ini;
    while pos < end {
        let cpt = p.cpt(pos);
        let flags = p.flags(pos);
        if let Some(n) = contraction(&p, pos, false) {
            pos += cut.add(pos + n);
            continue;
        }
        let space = cpt == ' ' as u32;
        let mut flags2 = if space { p.flags(pos + 1) } else { flags };
        if flags2.is_letter() {
            pos += space as usize;
            while flags2.is_letter() {
                pos += 1;
                flags2 = p.flags(pos);
            }
            cut.add(pos);
            continue;
        }
        if flags2.is_number() {
            pos += space as usize;
            while flags2.is_number() {
                pos += 1;
                flags2 = p.flags(pos);
            }
            cut.add(pos);
            continue;
        }
        let other = |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
        if other(flags2) {
            pos += space as usize;
            while other(flags2) {
                pos += 1;
                flags2 = p.flags(pos);
            }
            cut.add(pos);
            continue;
        }
        let mut n_ws = 0;
        while p.flags(pos + n_ws).is_whitespace() {
            n_ws += 1;
        }
        pos = whitespace_end(&p, pos, n_ws);
        cut.add(pos);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Digits {
    UpTo3,
    One,
}

/// Llama 3 (`\p{N}{1,3}`), Qwen2 (`\p{N}`) and Qwen3.5 (letters take marks):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
fn llama3_piece(
    cps: &[u32],
    ini: usize,
    end: usize,
    out: &mut Vec<usize>,
    digits: Digits,
    marks: bool,
) {
    let p = Piece { cps, ini, end };
    let mut cut = Cutter { prev_end: ini, out };
    let is_word = |f: Flags| f.is_letter() || (marks && f.is_accent_mark());
    let is_cr_lf = |c: u32| c == '\r' as u32 || c == '\n' as u32;
    let mut pos = ini;
    while pos < end {
        let cpt = p.cpt(pos);
        let flags = p.flags(pos);
        if let Some(n) = contraction(&p, pos, true) {
            pos += cut.add(pos + n);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(is_cr_lf(cpt) || flags.is_number()) && (is_word(flags) || is_word(p.flags(pos + 1))) {
            pos += 1;
            while is_word(p.flags(pos)) {
                pos += 1;
            }
            cut.add(pos);
            continue;
        }
        if flags.is_number() {
            match digits {
                Digits::One => {
                    pos += 1;
                    cut.add(pos);
                }
                Digits::UpTo3 => {
                    let mut first = pos;
                    while p.flags(pos).is_number() {
                        pos += 1;
                        if pos - first >= 3 {
                            cut.add(pos);
                            first = pos;
                        }
                    }
                    cut.add(pos);
                }
            }
            continue;
        }
        // <space>?[^\s\p{L}\p{N}]+[\r\n]*
        let space = cpt == ' ' as u32;
        let mut flags2 = if space { p.flags(pos + 1) } else { flags };
        let other = |f: Flags| {
            !(f.is_whitespace() || f.is_letter() || f.is_number() || (marks && f.is_accent_mark()))
        };
        if other(flags2) && flags.any() {
            pos += space as usize;
            while other(flags2) && flags2.any() {
                pos += 1;
                flags2 = p.flags(pos);
            }
            while is_cr_lf(p.cpt(pos)) {
                pos += 1;
            }
            cut.add(pos);
            continue;
        }
        let mut n_ws = 0;
        let mut last_cr_lf_end = 0;
        while p.flags(pos + n_ws).is_whitespace() {
            if is_cr_lf(p.cpt(pos + n_ws)) {
                last_cr_lf_end = pos + n_ws + 1;
            }
            n_ws += 1;
        }
        if last_cr_lf_end > 0 {
            pos = last_cr_lf_end;
            cut.add(pos);
            continue;
        }
        pos = whitespace_end(&p, pos, n_ws);
        cut.add(pos);
    }
}

/// `[^\n]+|[\n]+`
fn newline_piece(cps: &[u32], ini: usize, end: usize, out: &mut Vec<usize>) {
    let mut pos = ini;
    while pos < end {
        let nl = cps[pos] == '\n' as u32;
        let start = pos;
        while pos < end && (cps[pos] == '\n' as u32) == nl {
            pos += 1;
        }
        out.push(pos - start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces<'a>(text: &'a str, pre: &str) -> Vec<&'a str> {
        let cfg = pre_config(pre).unwrap();
        let s: Vec<Splitter> = cfg
            .regexes
            .iter()
            .map(|r| Splitter::compile(r).unwrap())
            .collect();
        split(text, &s)
            .unwrap()
            .into_iter()
            .map(|r| &text[r])
            .collect()
    }

    #[test]
    fn gpt2_splits() {
        assert_eq!(
            pieces("Hello world's  123 !!", "gpt-2"),
            ["Hello", " world", "'s", " ", " 123", " !!"]
        );
    }

    #[test]
    fn llama3_splits_digits_in_threes() {
        assert_eq!(
            pieces("12345 ab\n\n", "llama-bpe"),
            ["123", "45", " ab", "\n\n"]
        );
    }

    #[test]
    fn regex_fallback_splits_pieces() {
        assert_eq!(pieces("a1b22", "starcoder"), ["a", "1", "b", "2", "2"]);
    }
}
