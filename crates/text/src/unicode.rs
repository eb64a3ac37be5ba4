//! Code point classes and the GPT-2 byte-to-unicode map, as llama.cpp's
//! `src/unicode.cpp` defines them.
//!
//! The category table is generated from llama.cpp's `unicode-data.cpp` (see
//! `scripts/text/gen_unicode_flags.py`), so the pre-tokenizer splits see the
//! same letters, numbers and whitespace as llama.cpp does.

use crate::unicode_data::{RANGES_FLAGS, WHITESPACE};

const UNDEFINED: u16 = 0x0001;
const NUMBER: u16 = 0x0002;
const LETTER: u16 = 0x0004;
const ACCENT_MARK: u16 = 0x0010;

/// Category bits of one code point (llama.cpp's `unicode_cpt_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Flags {
    bits: u16,
    whitespace: bool,
}

impl Flags {
    /// Flags of a position outside the text: no category at all.
    pub(crate) const NONE: Flags = Flags {
        bits: 0,
        whitespace: false,
    };

    pub(crate) fn of(cp: u32) -> Flags {
        let idx = RANGES_FLAGS.partition_point(|&(start, _)| start <= cp);
        // The table starts at 0 and ends with an entry at 0x110000.
        let bits = if idx == 0 || idx >= RANGES_FLAGS.len() {
            UNDEFINED
        } else {
            RANGES_FLAGS[idx - 1].1
        };
        Flags {
            bits,
            whitespace: WHITESPACE.binary_search(&cp).is_ok(),
        }
    }

    pub(crate) fn is_letter(self) -> bool {
        self.bits & LETTER != 0
    }
    pub(crate) fn is_number(self) -> bool {
        self.bits & NUMBER != 0
    }
    pub(crate) fn is_accent_mark(self) -> bool {
        self.bits & ACCENT_MARK != 0
    }
    pub(crate) fn is_whitespace(self) -> bool {
        self.whitespace
    }
    /// Whether any flag is set (a code point inside the text always has one).
    pub(crate) fn any(self) -> bool {
        self.bits != 0 || self.whitespace
    }
}

/// GPT-2's reversible byte → code point map: printable Latin-1 bytes map to
/// themselves, the other 68 bytes to U+0100.. in order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let cp = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        table[b as usize] = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    table
}

/// The inverse of [`byte_to_char_table`]: code points U+0000..U+0143 to bytes.
pub(crate) fn char_to_byte_table() -> Vec<Option<u8>> {
    let fwd = byte_to_char_table();
    let mut inv = vec![None; 0x144];
    for (b, c) in fwd.iter().enumerate() {
        inv[*c as usize] = Some(b as u8);
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories() {
        assert!(Flags::of('a' as u32).is_letter());
        assert!(Flags::of('é' as u32).is_letter());
        assert!(Flags::of('7' as u32).is_number());
        assert!(Flags::of(' ' as u32).is_whitespace());
        assert!(Flags::of(0x3000).is_whitespace());
        assert!(!Flags::of('!' as u32).is_letter());
        assert!(Flags::of(0x10FFFF).any());
    }

    #[test]
    fn byte_map_is_gpt2() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        let inv = char_to_byte_table();
        for b in 0..=255u8 {
            assert_eq!(inv[t[b as usize] as usize], Some(b));
        }
    }
}
