//! The scalar quant kernels against gguf-py (`gguf.quants` of the `gguf`
//! Python package 0.19.0), an implementation independent of turbospark.
//!
//! Fixtures come from `scripts/fixtures/make_quant_fixtures.py`; their binary
//! layout is documented there. Each holds, per format, an f32 input, its
//! quantized bytes and gguf-py's dequantization of those bytes.

use std::path::PathBuf;

use turbospark_core::quant::{
    dequantize_row, dot_row, quantize_row_mxfp4, quantize_row_q8_0, QuantError,
};
use turbospark_core::QuantFormat;

struct Fixture {
    rows: usize,
    cols: usize,
    row_bytes: usize,
    /// `[rows, cols]`
    input: Vec<f32>,
    /// `[rows, row_bytes]`
    quantized: Vec<u8>,
    /// `[rows, cols]`, gguf-py's dequantization of `quantized`
    dequantized: Vec<f32>,
}

impl Fixture {
    fn load(format: QuantFormat) -> Fixture {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/quant")
            .join(format!("{}.bin", format.name()));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run scripts/fixtures/make_quant_fixtures.py)",
                path.display()
            )
        });
        assert_eq!(&bytes[..4], b"TSQF", "{}: bad magic", path.display());
        let word =
            |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()) as usize;
        assert_eq!(word(1), 1, "{}: layout version", path.display());
        assert_eq!(
            word(2),
            format.ggml_type() as usize,
            "{}: ggml type",
            path.display()
        );
        let (rows, cols, row_bytes) = (word(3), word(4), word(5));
        assert_eq!(
            Some(row_bytes as u64),
            format.bytes_for(cols as u64),
            "{}: row_bytes",
            path.display()
        );

        let floats = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let n = rows * cols * 4;
        let (input, rest) = bytes[24..].split_at(n);
        let (quantized, dequantized) = rest.split_at(rows * row_bytes);
        assert_eq!(dequantized.len(), n, "{}: file length", path.display());
        Fixture {
            rows,
            cols,
            row_bytes,
            input: floats(input),
            quantized: quantized.to_vec(),
            dequantized: floats(dequantized),
        }
    }

    fn input_row(&self, r: usize) -> &[f32] {
        &self.input[r * self.cols..(r + 1) * self.cols]
    }

    fn quantized_row(&self, r: usize) -> &[u8] {
        &self.quantized[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    fn dequantized_row(&self, r: usize) -> &[f32] {
        &self.dequantized[r * self.cols..(r + 1) * self.cols]
    }
}

/// Deterministic values in [-1, 1) (splitmix64), independent of the fixture.
fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn dequantize_row_matches_gguf_bit_for_bit() {
    for format in QuantFormat::ALL {
        let fx = Fixture::load(format);
        let mut out = vec![0.0f32; fx.cols];
        for r in 0..fx.rows {
            dequantize_row(format, fx.quantized_row(r), &mut out).unwrap();
            let expected = fx.dequantized_row(r);
            let mismatches: Vec<usize> = (0..fx.cols)
                .filter(|&i| !same_bits(out[i], expected[i]))
                .collect();
            if let Some(&i) = mismatches.first() {
                panic!(
                    "{format} row {r}: {} of {} elements differ from gguf-py; first at {i}: ours {:e} ({:#010x}), gguf {:e} ({:#010x})",
                    mismatches.len(),
                    fx.cols,
                    out[i],
                    out[i].to_bits(),
                    expected[i],
                    expected[i].to_bits()
                );
            }
        }
    }
}

/// `dot_row` against the f64 dot of gguf-py's dequantized row with the same
/// x. The tolerance is relative to `Σ |w_i · x_i|` (not to the dot itself,
/// which can cancel to near zero): 1e-5 of it covers f32 accumulation inside
/// blocks of at most 32 elements.
#[test]
fn dot_row_matches_f64_dot_of_gguf_values() {
    for format in QuantFormat::ALL {
        let fx = Fixture::load(format);
        for r in 0..fx.rows {
            let x = pseudo_random(fx.cols, 0x5EED + r as u64);
            let w = fx.dequantized_row(r);
            let reference: f64 = w
                .iter()
                .zip(&x)
                .map(|(&w, &x)| f64::from(w) * f64::from(x))
                .sum();
            let magnitude: f64 = w
                .iter()
                .zip(&x)
                .map(|(&w, &x)| (f64::from(w) * f64::from(x)).abs())
                .sum();
            let ours = f64::from(dot_row(format, fx.quantized_row(r), &x).unwrap());
            if !reference.is_finite() {
                // Rows of the float formats that hold inf or NaN.
                assert!(
                    (reference.is_nan() && ours.is_nan()) || reference == ours,
                    "{format} row {r}: ours {ours}, reference {reference}"
                );
                continue;
            }
            assert!(magnitude > 0.0, "{format} row {r}: fixture row is all zero");
            let err = (ours - reference).abs();
            assert!(
                err <= 1e-5 * magnitude,
                "{format} row {r}: ours {ours}, reference {reference}, error {err:e} > 1e-5 · Σ|w·x| = {:e}",
                1e-5 * magnitude
            );
        }
    }
}

fn check_quantizer(format: QuantFormat, quantize: fn(&[f32], &mut [u8]) -> Result<(), QuantError>) {
    let fx = Fixture::load(format);
    let block_bytes = format.block_bytes();
    let mut out = vec![0u8; fx.row_bytes];
    for r in 0..fx.rows {
        quantize(fx.input_row(r), &mut out).unwrap();
        let expected = fx.quantized_row(r);
        if let Some(b) = (0..fx.row_bytes / block_bytes).find(|&b| {
            out[b * block_bytes..(b + 1) * block_bytes]
                != expected[b * block_bytes..(b + 1) * block_bytes]
        }) {
            let range = b * block_bytes..(b + 1) * block_bytes;
            panic!(
                "{format} row {r} block {b} differs from gguf-py\n input {:?}\n ours {:?}\n gguf {:?}",
                &fx.input_row(r)[b * format.block_elems()..(b + 1) * format.block_elems()],
                &out[range.clone()],
                &expected[range]
            );
        }
    }
}

#[test]
fn quantize_row_q8_0_matches_gguf_bytes() {
    check_quantizer(QuantFormat::Q8_0, quantize_row_q8_0);
}

#[test]
fn quantize_row_mxfp4_matches_gguf_bytes() {
    check_quantizer(QuantFormat::Mxfp4, quantize_row_mxfp4);
}

#[test]
fn wrong_lengths_are_errors() {
    for format in QuantFormat::ALL {
        let be = format.block_elems();
        let bb = format.block_bytes();
        let n = 2 * 256;
        let good = vec![0u8; n / be * bb];
        let mut out = vec![0.0f32; n];
        let x = vec![0.0f32; n];

        for bytes in [
            &good[..good.len() - 1],
            &[good.as_slice(), &[0]].concat()[..],
        ] {
            let expected = Err(QuantError::LengthMismatch {
                format,
                elements: n,
                expected_bytes: good.len(),
                got_bytes: bytes.len(),
            });
            assert_eq!(
                dequantize_row(format, bytes, &mut out),
                expected,
                "{format}"
            );
            assert_eq!(dot_row(format, bytes, &x).map(|_| ()), expected, "{format}");
        }

        if be > 1 {
            let partial = n - 1;
            let expected = Err(QuantError::PartialBlock {
                format,
                elements: partial,
                block_elems: be,
            });
            assert_eq!(
                dequantize_row(format, &good, &mut out[..partial]),
                expected,
                "{format}"
            );
            assert_eq!(
                dot_row(format, &good, &x[..partial]).map(|_| ()),
                expected,
                "{format}"
            );
        }
    }

    for (format, quantize) in [
        (
            QuantFormat::Q8_0,
            quantize_row_q8_0 as fn(&[f32], &mut [u8]) -> Result<(), QuantError>,
        ),
        (QuantFormat::Mxfp4, quantize_row_mxfp4),
    ] {
        let x = vec![1.0f32; 64];
        let mut out = vec![0u8; 2 * format.block_bytes() + 1];
        assert_eq!(
            quantize(&x, &mut out),
            Err(QuantError::LengthMismatch {
                format,
                elements: 64,
                expected_bytes: 2 * format.block_bytes(),
                got_bytes: out.len(),
            })
        );
        assert_eq!(
            quantize(&x[..40], &mut out[..2 * format.block_bytes()]),
            Err(QuantError::PartialBlock {
                format,
                elements: 40,
                block_elems: 32,
            })
        );
    }
}

#[test]
fn errors_name_the_format_and_lengths() {
    let mut out = [0.0f32; 32];
    let err = dequantize_row(QuantFormat::Q4K, &[0u8; 10], &mut out).unwrap_err();
    assert_eq!(
        err.to_string(),
        "q4_k: a row of 32 elements is not a whole number of 256-element blocks"
    );
    let err = dequantize_row(QuantFormat::Q4_0, &[0u8; 10], &mut out).unwrap_err();
    assert_eq!(
        err.to_string(),
        "q4_0: 32 elements take 18 bytes, but the buffer has 10"
    );
}
