//! Long-running fuzzer for the GGUF and safetensors header parsers.
//!
//! ```text
//! cargo run --release -p turbospark-format --example fuzz_headers -- --seconds 600
//!     [--seed N] [--out DIR] [--corpus FILE]...
//! ```
//!
//! Each iteration takes a valid seed file (built in, or given with
//! `--corpus`) and applies a few random mutations (bit flips, interesting
//! 32/64-bit values, truncation, insertion, deletion, splicing; for
//! safetensors also edits of the JSON text with the length prefix kept
//! consistent), or generates random bytes, then calls both parsers. A panic,
//! or an accepted header whose tensors point outside the input, is a
//! finding: the input is written to `--out` (default: the system temp dir)
//! and the run exits with status 1 at the end.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use support::{ggml, ty, GgufBuilder, StSpec, TensorSpec, V};
use turbospark_format::{gguf, safetensors};

/// xorshift64* (Vigna 2016): fast, and reproducible from `--seed`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-enough in `0..n` for n > 0.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    fn interesting_u64(&mut self, input_len: usize) -> u64 {
        const FIXED: [u64; 12] = [
            0,
            1,
            2,
            4,
            8,
            32,
            255,
            65535,
            u32::MAX as u64,
            1 << 32,
            1 << 63,
            u64::MAX,
        ];
        match self.below(4) {
            0 => FIXED[self.below(FIXED.len())],
            1 => (input_len as u64)
                .wrapping_add(self.below(33) as u64)
                .wrapping_sub(16),
            2 => self.below(4096) as u64,
            _ => self.next(),
        }
    }
}

struct Args {
    seconds: u64,
    seed: u64,
    out: PathBuf,
    corpus: Vec<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seconds: 60,
        seed: 0x9e37_79b9_7f4a_7c15,
        out: std::env::temp_dir(),
        corpus: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--seconds" => {
                args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?
            }
            "--seed" => args.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--out" => args.out = PathBuf::from(value()?),
            "--corpus" => args.corpus.push(PathBuf::from(value()?)),
            "-h" | "--help" => {
                return Err(
                    "usage: fuzz_headers [--seconds N] [--seed N] [--out DIR] [--corpus FILE]..."
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.seed == 0 {
        return Err("--seed must be non-zero (xorshift state)".into());
    }
    Ok(args)
}

fn gguf_seeds() -> Vec<Vec<u8>> {
    let deep = (0..3).fold(V::Arr(ty::I32, vec![V::I32(1)]), |inner, _| {
        V::Arr(ty::ARRAY, vec![inner.clone(), inner])
    });
    vec![
        support::sample_gguf(),
        GgufBuilder::default()
            .alignment(64)
            .kv("u64", V::U64(7))
            .kv("i16s", V::Arr(ty::I16, vec![V::I16(-1), V::I16(2)]))
            .kv("bools", V::Arr(ty::BOOL, vec![V::Bool(true)]))
            .kv("deep", deep)
            .tensor(TensorSpec::new("k", ggml::Q2_K, &[256, 1], vec![1; 84]))
            .tensor(TensorSpec::new("s", ggml::F32, &[], vec![2; 4]))
            .build(),
        GgufBuilder {
            version: 2,
            ..GgufBuilder::default()
        }
        .kv("general.architecture", V::str("qwen3moe"))
        .tensor(TensorSpec::new("w", ggml::F16, &[2, 2, 2, 2], vec![3; 32]))
        .build(),
        include_bytes!("../tests/data/gguf_writer_tiny.gguf").to_vec(),
    ]
}

fn safetensors_seeds() -> Vec<Vec<u8>> {
    vec![
        support::sample_safetensors(),
        support::safetensors_bytes(
            &[
                StSpec {
                    name: "f4",
                    dtype: "F4",
                    shape: &[2, 4],
                    data: &[1; 4],
                },
                StSpec {
                    name: "scales",
                    dtype: "F8_E8M0",
                    shape: &[2],
                    data: &[2; 2],
                },
                StSpec {
                    name: "empty",
                    dtype: "I64",
                    shape: &[0],
                    data: &[],
                },
            ],
            &[],
        ),
    ]
}

const DTYPE_NAMES: [&str; 8] = ["F4", "F6_E2M3", "BOOL", "BF16", "F32", "C64", "U64", "X"];
const NUMBERS: [&str; 10] = [
    "0",
    "1",
    "-1",
    "7",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "1e30",
    "9223372036854775808",
    "3.5",
];

/// One random byte-level mutation.
fn mutate_bytes(rng: &mut Rng, bytes: &mut Vec<u8>, splice_from: &[u8]) {
    let len = bytes.len();
    match rng.below(9) {
        0 if len > 0 => {
            let i = rng.below(len);
            bytes[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            bytes[i] = [0, 1, 0x7f, 0x80, 0xff, rng.next() as u8][rng.below(6)];
        }
        2 if len >= 4 => {
            let i = rng.below(len - 3);
            let v = rng.interesting_u64(len) as u32;
            bytes[i..i + 4].copy_from_slice(&v.to_le_bytes());
        }
        3 if len >= 8 => {
            let i = rng.below(len - 7);
            let v = rng.interesting_u64(len);
            bytes[i..i + 8].copy_from_slice(&v.to_le_bytes());
        }
        4 => bytes.truncate(rng.below(len + 1)),
        5 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let ins: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            bytes.splice(at..at, ins);
        }
        6 if len > 0 => {
            let at = rng.below(len);
            let end = (at + 1 + rng.below(32)).min(len);
            bytes.drain(at..end);
        }
        7 if len > 0 => {
            // Duplicate a chunk of the input somewhere else.
            let from = rng.below(len);
            let chunk: Vec<u8> = bytes[from..(from + 1 + rng.below(24)).min(len)].to_vec();
            let at = rng.below(len + 1);
            bytes.splice(at..at, chunk);
        }
        8 if !splice_from.is_empty() => {
            // Overwrite with a chunk of another seed.
            let from = rng.below(splice_from.len());
            let chunk = &splice_from[from..(from + 1 + rng.below(24)).min(splice_from.len())];
            let at = rng.below(len + 1);
            let end = (at + chunk.len()).min(len);
            bytes.splice(at..end, chunk.iter().copied());
        }
        _ => {}
    }
}

/// Replaces a number or a dtype name in JSON text.
fn mutate_json(rng: &mut Rng, json: &mut Vec<u8>) {
    let text = String::from_utf8_lossy(json).into_owned();
    let mut spans = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            spans.push((start, i, true));
        } else if bytes[i] == b'"' {
            let start = i + 1;
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += 1;
            }
            spans.push((start, i.min(bytes.len()), false));
            i += 1;
        } else {
            i += 1;
        }
    }
    if spans.is_empty() {
        return;
    }
    let (start, end, is_number) = spans[rng.below(spans.len())];
    let replacement = if is_number {
        NUMBERS[rng.below(NUMBERS.len())].to_string()
    } else {
        match rng.below(3) {
            0 => DTYPE_NAMES[rng.below(DTYPE_NAMES.len())].to_string(),
            1 => "__metadata__".to_string(),
            _ => text[start..end].to_string() + "x",
        }
    };
    let mut out = text[..start].to_string();
    out.push_str(&replacement);
    out.push_str(&text[end..]);
    *json = out.into_bytes();
}

fn safetensors_json_mutant(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let header_len = seed
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0) as usize;
    let Some(json) = seed.get(8..8 + header_len) else {
        return seed.to_vec();
    };
    let mut json = json.to_vec();
    for _ in 0..1 + rng.below(3) {
        if rng.chance(3) {
            mutate_bytes(rng, &mut json, &[]);
        } else {
            mutate_json(rng, &mut json);
        }
    }
    support::raw_safetensors(&json, &seed[8 + header_len..])
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Target {
    Gguf,
    Safetensors,
}

/// The first word of an error's Debug form: its variant name.
fn variant(debug: String) -> String {
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Parses `input`; `Err` describes a finding.
fn check(target: Target, input: &[u8]) -> Result<String, String> {
    match target {
        Target::Gguf => match gguf::parse_header(input) {
            Err(e) => Ok(variant(format!("{e:?}"))),
            Ok(h) => {
                for t in h.tensors() {
                    let end = h.data_offset() as u128 + t.offset as u128 + t.byte_len as u128;
                    if end > input.len() as u128 || t.offset % h.alignment() != 0 {
                        return Err(format!("accepted tensor {} ending at {end}", t.name));
                    }
                }
                Ok("Ok".to_string())
            }
        },
        Target::Safetensors => match safetensors::parse_header(input) {
            Err(e) => Ok(variant(format!("{e:?}"))),
            Ok(h) => {
                for t in &h.tensors {
                    if t.range.start > t.range.end
                        || t.range.end > input.len() as u64
                        || t.range.start < h.data_offset()
                    {
                        return Err(format!(
                            "accepted tensor {} with range {:?}",
                            t.name, t.range
                        ));
                    }
                }
                Ok("Ok".to_string())
            }
        },
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let mut gguf_corpus = gguf_seeds();
    let mut st_corpus = safetensors_seeds();
    for path in &args.corpus {
        match std::fs::read(path) {
            Ok(bytes) if bytes.starts_with(b"GGUF") => gguf_corpus.push(bytes),
            Ok(bytes) => st_corpus.push(bytes),
            Err(e) => {
                eprintln!("cannot read {}: {e}", path.display());
                return ExitCode::from(2);
            }
        }
    }
    for s in &gguf_corpus {
        if let Err(e) = gguf::parse_header(s) {
            eprintln!("a GGUF seed does not parse: {e}");
            return ExitCode::from(2);
        }
    }
    for s in &st_corpus {
        if let Err(e) = safetensors::parse_header(s) {
            eprintln!("a safetensors seed does not parse: {e}");
            return ExitCode::from(2);
        }
    }

    let mut rng = Rng(args.seed);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(args.seconds);
    let mut next_report = start + Duration::from_secs(30);
    let mut iterations: u64 = 0;
    let mut findings: u64 = 0;
    let mut outcomes: BTreeMap<(Target, String), u64> = BTreeMap::new();
    println!(
        "fuzzing for {}s (seed {}, {} GGUF + {} safetensors seeds)",
        args.seconds,
        args.seed,
        gguf_corpus.len(),
        st_corpus.len()
    );

    loop {
        // Check the clock every 256 iterations: Instant::now is not free.
        if iterations % 256 == 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if now >= next_report {
                let secs = now.duration_since(start).as_secs_f64();
                println!(
                    "{:>6.0}s  {iterations} iterations  {:.0}/s",
                    secs,
                    iterations as f64 / secs
                );
                next_report += Duration::from_secs(30);
            }
        }
        iterations += 1;

        let (target, input) = match rng.below(8) {
            0 => {
                let n = rng.below(600);
                let mut v: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                if rng.chance(2) && v.len() >= 24 {
                    // A plausible preamble so the random part reaches the tables.
                    v[..4].copy_from_slice(b"GGUF");
                    v[4..8].copy_from_slice(&(2 + rng.below(2) as u32).to_le_bytes());
                    v[8..16].copy_from_slice(&(rng.below(4) as u64).to_le_bytes());
                    v[16..24].copy_from_slice(&(rng.below(4) as u64).to_le_bytes());
                }
                (Target::Gguf, v)
            }
            1 => {
                let n = rng.below(600);
                let mut v: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                if v.len() >= 8 {
                    let len = rng.below(v.len()) as u64;
                    v[..8].copy_from_slice(&len.to_le_bytes());
                }
                (Target::Safetensors, v)
            }
            2..=4 => {
                let mut v = gguf_corpus[rng.below(gguf_corpus.len())].clone();
                let other = &gguf_corpus[rng.below(gguf_corpus.len())];
                for _ in 0..1 + rng.below(8) {
                    mutate_bytes(&mut rng, &mut v, other);
                }
                (Target::Gguf, v)
            }
            5 => {
                let mut v = st_corpus[rng.below(st_corpus.len())].clone();
                let other = &st_corpus[rng.below(st_corpus.len())];
                for _ in 0..1 + rng.below(8) {
                    mutate_bytes(&mut rng, &mut v, other);
                }
                (Target::Safetensors, v)
            }
            _ => {
                let seed = &st_corpus[rng.below(st_corpus.len())];
                (Target::Safetensors, safetensors_json_mutant(&mut rng, seed))
            }
        };

        let result = catch_unwind(AssertUnwindSafe(|| check(target, &input)));
        let problem = match result {
            Ok(Ok(outcome)) => {
                *outcomes.entry((target, outcome)).or_default() += 1;
                continue;
            }
            Ok(Err(violation)) => violation,
            Err(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".to_string()),
        };
        findings += 1;
        let path = args
            .out
            .join(format!("fuzz-headers-{target:?}-{}-{iterations}.bin", args.seed).to_lowercase());
        match std::fs::write(&path, &input) {
            Ok(()) => eprintln!(
                "FINDING ({target:?}): {problem}; input saved to {}",
                path.display()
            ),
            Err(e) => eprintln!("FINDING ({target:?}): {problem}; could not save input: {e}"),
        }
    }

    let secs = start.elapsed().as_secs_f64();
    println!("outcomes:");
    for ((target, outcome), n) in &outcomes {
        println!("  {target:?} {outcome}: {n}");
    }
    println!(
        "done: {iterations} iterations in {secs:.1}s ({:.0}/s), {findings} findings",
        iterations as f64 / secs
    );
    if findings == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
