//! Property tests: the header parsers never panic, on random bytes and on
//! mutated valid files, and whatever they accept only points inside the
//! bytes they were given. `examples/fuzz_headers.rs` runs the same idea for
//! as long as asked.

mod support;

use proptest::collection::vec;
use proptest::prelude::*;
use turbospark_format::{gguf, safetensors};

#[derive(Debug, Clone)]
enum Mutation {
    FlipBit { at: usize, bit: u8 },
    SetByte { at: usize, byte: u8 },
    SetU64 { at: usize, value: u64 },
    Truncate { at: usize },
    Insert { at: usize, bytes: Vec<u8> },
    Delete { at: usize, len: usize },
}

fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(1 << 63),
        Just(1 << 32),
        Just(u64::from(u32::MAX)),
        0..1024u64,
        any::<u64>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        (at, 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        (at, any::<u8>()).prop_map(|(at, byte)| Mutation::SetByte { at, byte }),
        (at, interesting_u64()).prop_map(|(at, value)| Mutation::SetU64 { at, value }),
        at.prop_map(|at| Mutation::Truncate { at }),
        (at, vec(any::<u8>(), 1..16)).prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (at, 1usize..16).prop_map(|(at, len)| Mutation::Delete { at, len }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let len = bytes.len();
    let pos = |at: usize| if len == 0 { 0 } else { at % len };
    match m {
        Mutation::FlipBit { at, bit } if len > 0 => bytes[pos(*at)] ^= 1 << bit,
        Mutation::SetByte { at, byte } if len > 0 => bytes[pos(*at)] = *byte,
        Mutation::SetU64 { at, value } if len >= 8 => {
            let p = at % (len - 7);
            bytes[p..p + 8].copy_from_slice(&value.to_le_bytes());
        }
        Mutation::Truncate { at } => bytes.truncate(at % (len + 1)),
        Mutation::Insert { at, bytes: ins } => {
            let p = at % (len + 1);
            bytes.splice(p..p, ins.iter().copied());
        }
        Mutation::Delete { at, len: n } if len > 0 => {
            let p = pos(*at);
            bytes.drain(p..(p + n).min(len));
        }
        _ => {}
    }
}

fn check_gguf(bytes: &[u8]) {
    if let Ok(h) = gguf::parse_header(bytes) {
        for t in h.tensors() {
            let end = h.data_offset() + t.offset + t.byte_len;
            assert!(end <= bytes.len() as u64, "tensor {} ends at {end}", t.name);
            assert_eq!(t.offset % h.alignment(), 0);
        }
    }
}

fn check_safetensors(bytes: &[u8]) {
    if let Ok(h) = safetensors::parse_header(bytes) {
        for t in &h.tensors {
            assert!(t.range.start <= t.range.end && t.range.end <= bytes.len() as u64);
            assert!(t.range.start >= h.data_offset());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn gguf_random_bytes(bytes in vec(any::<u8>(), 0..512)) {
        check_gguf(&bytes);
    }

    #[test]
    fn gguf_random_bytes_after_a_valid_preamble(
        version in 1u32..4,
        counts in (0u64..4, 0u64..4),
        tail in vec(any::<u8>(), 0..512),
    ) {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(version.to_le_bytes());
        bytes.extend(counts.0.to_le_bytes());
        bytes.extend(counts.1.to_le_bytes());
        bytes.extend(tail);
        check_gguf(&bytes);
    }

    #[test]
    fn gguf_mutated_valid_file(mutations in vec(mutation(), 1..8)) {
        let mut bytes = support::sample_gguf();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        check_gguf(&bytes);
    }

    #[test]
    fn safetensors_random_bytes(bytes in vec(any::<u8>(), 0..512)) {
        check_safetensors(&bytes);
    }

    #[test]
    fn safetensors_random_json_length(len in 0u64..600, tail in vec(any::<u8>(), 0..512)) {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend(tail);
        check_safetensors(&bytes);
    }

    #[test]
    fn safetensors_mutated_valid_file(mutations in vec(mutation(), 1..8)) {
        let mut bytes = support::sample_safetensors();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        check_safetensors(&bytes);
    }

    /// Mutations of the JSON alone, with the length prefix kept consistent,
    /// so they reach the entry validation rather than the length check.
    #[test]
    fn safetensors_mutated_header_json(mutations in vec(mutation(), 1..4)) {
        let valid = support::sample_safetensors();
        let header_len = u64::from_le_bytes(valid[..8].try_into().unwrap_or_default()) as usize;
        let mut json = valid[8..8 + header_len].to_vec();
        for m in &mutations {
            apply(&mut json, m);
        }
        check_safetensors(&support::raw_safetensors(&json, &valid[8 + header_len..]));
    }
}

#[test]
fn seeds_are_valid() {
    assert!(gguf::parse_header(&support::sample_gguf()).is_ok());
    assert!(safetensors::parse_header(&support::sample_safetensors()).is_ok());
}
