//! Random weights for any [`ArchSpec`]: every tensor
//! `turbospark_format::roles` lists for the spec, seeded and reproducible.
//! Lets tests and benchmarks build a model of any family and size without
//! files. Matrices are uniform in `±1/√in` (the embedding in `±1`), norm
//! weights and scales (router, per-expert, per-layer output) near 1, biases
//! small.

use crate::source::WeightSource;
use crate::EngineError;
use std::collections::HashMap;
use turbospark_backend::{HostTensor, SharedBytes};
use turbospark_core::quant::{quantize_row_mxfp4, quantize_row_q8_0};
use turbospark_core::{ArchSpec, QuantFormat};
use turbospark_format::roles::{expected_expert_parts, expected_resident};

/// SplitMix64 from the given state.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), from the top 24 bits.
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Encodes `values` as rows of `cols` in `format` (f32 when the format
/// cannot hold that row length).
fn encode(
    values: &[f32],
    cols: usize,
    format: QuantFormat,
) -> Result<(QuantFormat, Vec<u8>), EngineError> {
    let f32_bytes = || values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let fits = cols % format.block_elems() == 0;
    match format {
        _ if !fits => Ok((QuantFormat::F32, f32_bytes())),
        QuantFormat::F32 => Ok((format, f32_bytes())),
        QuantFormat::Bf16 => Ok((
            format,
            values
                .iter()
                .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                .collect(),
        )),
        QuantFormat::Q8_0 | QuantFormat::Mxfp4 => {
            let rb = turbospark_core::quant::row_bytes(format, cols).map_err(quant)?;
            let mut out = vec![0u8; values.len() / cols * rb];
            quantize_rows(values, cols, format, rb, &mut out)?;
            Ok((format, out))
        }
        other => Err(EngineError::BadOptions {
            detail: format!("synthetic weights cannot be written as {other}"),
        }),
    }
}

/// A quantization error of the synthetic weights.
fn quant(source: turbospark_core::quant::QuantError) -> EngineError {
    EngineError::Backend(turbospark_backend::BackendError::Quant {
        name: "synthetic".into(),
        source,
    })
}

/// Quantizes `values`, rows of `cols`, into `dst`, rows of `rb` bytes of
/// `format` (Q8_0 or MXFP4, whose blocks the rows fill whole).
fn quantize_rows(
    values: &[f32],
    cols: usize,
    format: QuantFormat,
    rb: usize,
    dst: &mut [u8],
) -> Result<(), EngineError> {
    for (row, dst) in values.chunks_exact(cols).zip(dst.chunks_exact_mut(rb)) {
        if format == QuantFormat::Q8_0 {
            quantize_row_q8_0(row, dst).map_err(quant)?;
        } else {
            quantize_row_mxfp4(row, dst).map_err(quant)?;
        }
    }
    Ok(())
}

/// Values a piece of a quantized matrix holds while it is drawn and
/// encoded ([`RandomTensors::tensor_as`]): 256 KiB of f32.
const PIECE_VALUES: usize = 1 << 16;

/// A seeded stream of random tensors, drawn as the module docs describe
/// (the values [`SyntheticSource`] uses).
pub struct RandomTensors {
    rng: Rng,
    matrix_format: QuantFormat,
}

impl RandomTensors {
    /// Matrices stored as `matrix_format` (f32, bf16, q8_0 or mxfp4).
    pub fn new(seed: u64, matrix_format: QuantFormat) -> Self {
        RandomTensors {
            rng: Rng(seed),
            matrix_format,
        }
    }

    /// The next tensor `name` of `shape`: a matrix in the stream's format
    /// (f32 when a row is not whole blocks of it), anything else f32.
    pub fn tensor(
        &mut self,
        name: &str,
        shape: &[usize],
    ) -> Result<(QuantFormat, Vec<u8>), EngineError> {
        self.tensor_as(name, shape, self.matrix_format)
    }

    /// As [`RandomTensors::tensor`], a matrix stored as `matrix_format`.
    pub fn tensor_as(
        &mut self,
        name: &str,
        shape: &[usize],
        matrix_format: QuantFormat,
    ) -> Result<(QuantFormat, Vec<u8>), EngineError> {
        // A Q8_0 or MXFP4 matrix is drawn and encoded a piece of rows at a
        // time (the same values in the same order, as `fill` promises), so
        // its f32 values never exist whole: a gpt-oss output head's would
        // be 2.3 GB of fresh pages, and an expert's 33 MB per part.
        if let ([rows, cols], QuantFormat::Q8_0 | QuantFormat::Mxfp4) = (shape, matrix_format) {
            if *rows > 0 && *cols > 0 && cols % matrix_format.block_elems() == 0 {
                let rb = turbospark_core::quant::row_bytes(matrix_format, *cols).map_err(quant)?;
                let piece = (PIECE_VALUES / cols).clamp(1, *rows);
                let mut values = vec![0.0f32; piece * cols];
                let mut out = vec![0u8; rows * rb];
                for (first, dst) in (0..*rows).step_by(piece).zip(out.chunks_mut(piece * rb)) {
                    let values = &mut values[..piece.min(rows - first) * cols];
                    self.fill(name, shape, values);
                    quantize_rows(values, *cols, matrix_format, rb, dst)?;
                }
                return Ok((matrix_format, out));
            }
        }
        let values = self.values(name, shape);
        encode_tensor(&values, shape, matrix_format)
    }

    /// The next tensor `name` of `shape` as f32 values, before encoding
    /// (the draw [`RandomTensors::tensor`] makes).
    pub fn values(&mut self, name: &str, shape: &[usize]) -> Vec<f32> {
        let mut out = vec![0.0; shape.iter().product()];
        self.fill(name, shape, &mut out);
        out
    }

    /// Draws the next `out.len()` values of tensor `name` of `shape`. A
    /// tensor drawn in consecutive pieces gets the values
    /// [`RandomTensors::values`] returns, in order.
    pub fn fill(&mut self, name: &str, shape: &[usize], out: &mut [f32]) {
        let (scale, offset) = match shape {
            [_, _] if name == "token_embd.weight" => (1.0, 0.0),
            [_, cols] => (1.0 / (*cols as f32).sqrt(), 0.0),
            _ if name.contains("norm") || name.contains("scale") => (0.2, 1.0),
            _ if name.contains("sinks") => (1.0, 0.0),
            _ => (0.2, 0.0),
        };
        for v in out {
            *v = self.rng.uniform() * scale + offset;
        }
    }
}

/// `values` of `shape` encoded as [`RandomTensors::tensor_as`] stores
/// them: a matrix as `matrix_format` (f32 when a row is not whole blocks),
/// anything else f32.
pub fn encode_tensor(
    values: &[f32],
    shape: &[usize],
    matrix_format: QuantFormat,
) -> Result<(QuantFormat, Vec<u8>), EngineError> {
    match shape {
        [_, cols] => encode(values, *cols, matrix_format),
        _ => encode(values, 1, QuantFormat::F32),
    }
}

/// A [`WeightSource`] of random tensors.
pub struct SyntheticSource {
    resident: HashMap<String, HostTensor>,
    /// `(layer, part)` → one tensor per expert.
    experts: HashMap<(usize, &'static str), Vec<HostTensor>>,
}

impl SyntheticSource {
    /// Random weights for `spec`; matrices stored as `matrix_format` (f32,
    /// bf16, q8_0 or mxfp4), vectors as f32.
    pub fn new(
        spec: &ArchSpec,
        seed: u64,
        matrix_format: QuantFormat,
    ) -> Result<Self, EngineError> {
        let mut random = RandomTensors::new(seed, matrix_format);
        let mut tensor = |name: String, shape: Vec<usize>| -> Result<HostTensor, EngineError> {
            let (format, bytes) = random.tensor(&name, &shape)?;
            Ok(HostTensor {
                name,
                format,
                shape,
                bytes: SharedBytes::from_vec(bytes),
            })
        };
        let mut resident = HashMap::new();
        for t in expected_resident(spec) {
            let shape = t.shape.iter().map(|&d| d as usize).collect();
            resident.insert(t.name.clone(), tensor(t.name, shape)?);
        }
        let mut experts = HashMap::new();
        let n_experts = spec.moe.as_ref().map_or(0, |m| m.num_experts);
        for p in expected_expert_parts(spec) {
            let shape: Vec<usize> = p.shape.iter().map(|&d| d as usize).collect();
            let per_expert = (0..n_experts)
                .map(|e| {
                    tensor(
                        format!("blk.{}.experts.{e}.{}", p.layer, p.part),
                        shape.clone(),
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            experts.insert((p.layer, p.part), per_expert);
        }
        Ok(SyntheticSource { resident, experts })
    }
}

impl WeightSource for SyntheticSource {
    fn resident(&self, name: &str) -> Result<HostTensor, EngineError> {
        self.resident
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::MissingTensor { name: name.into() })
    }

    fn expert_part(
        &self,
        layer: usize,
        expert: usize,
        part: &str,
    ) -> Result<HostTensor, EngineError> {
        self.experts
            .iter()
            .find(|((l, p), _)| *l == layer && *p == part)
            .and_then(|(_, v)| v.get(expert))
            .cloned()
            .ok_or_else(|| EngineError::MissingTensor {
                name: format!("blk.{layer}.experts.{expert}.{part}"),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::{encode_tensor, RandomTensors, PIECE_VALUES};
    use turbospark_core::QuantFormat;

    /// A matrix drawn and encoded in pieces has the bytes of the whole
    /// draw encoded at once: rows that are not a whole number of pieces,
    /// one piece, and rows wider than a piece; then the stream goes on
    /// with the same values.
    #[test]
    fn a_matrix_in_pieces_is_the_whole_draw_encoded() {
        let piece_rows = |cols: usize| PIECE_VALUES / cols;
        for format in [QuantFormat::Q8_0, QuantFormat::Mxfp4] {
            for shape in [
                [2 * piece_rows(4096) + 5, 4096],
                [3, 64],
                [2, 2 * PIECE_VALUES],
            ] {
                let (mut pieces, mut whole) = (
                    RandomTensors::new(7, QuantFormat::F32),
                    RandomTensors::new(7, QuantFormat::F32),
                );
                let name = "blk.0.attn_q.weight";
                let got = pieces.tensor_as(name, &shape, format).unwrap();
                let values = whole.values(name, &shape);
                assert_eq!(
                    got,
                    encode_tensor(&values, &shape, format).unwrap(),
                    "{format:?} {shape:?}"
                );
                assert_eq!(pieces.values("next", &[5]), whole.values("next", &[5]));
            }
        }
    }
}
