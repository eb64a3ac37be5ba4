//! [`Numerics::LlamaCpp`](turbospark_backend::Numerics::LlamaCpp): the CPU
//! arithmetic of ggml (llama.cpp's tensor library) as llama.cpp runs a
//! decoder on x86-64 with its defaults (f16 KV cache, flash attention off),
//! reproduced bit for bit so that our logits, and so our greedy tokens,
//! are llama.cpp's. Normative: llama.cpp's `ggml/src/ggml-quants.c`,
//! `ggml/src/ggml-cpu/{arch/x86/quants.c, arch/x86/repack.cpp, ops.cpp,
//! vec.h, vec.cpp, simd-mappings.h, llamafile/sgemm.cpp}` and
//! `src/llama-graph.cpp` (commit 0c1e570, the one the references in
//! `tests/reference/llamacpp` were recorded with).
//!
//! What changes against [`Numerics::Exact`](turbospark_backend::Numerics::Exact):
//!
//! - matmul: each activation row is first converted to the weight
//!   format's `vec_dot_type` ([`vec_dot_type`]): Q8_0 for Q4_0, Q5_0, Q8_0
//!   and MXFP4 weights, Q8_1 for Q4_1 and Q5_1, Q8_K for the K-quants,
//!   f16 values for f16 weights, bf16 for bf16, unchanged for f32
//!   ([`quantize`]); quantized weights are dotted in integers per block and
//!   the block sums scaled and accumulated lane by lane as ggml's x86
//!   kernels do (`dot.rs`); float weights follow ggml's float dots
//!   (`float_dot.rs`);
//! - KV cache: K and V are rounded to f16 when written;
//! - attention: `q` is rounded to f16 for `q·k`, the softmax uses ggml's
//!   vector exp and summation, and the probabilities are rounded to f16
//!   for `p·V` (`attention.rs`);
//! - RMS norm, SwiGLU, GELU (through ggml's f16 table), soft-cap and rope
//!   follow ggml's formulas and its compiler's fused multiply-adds ([`ops`]).
//!
//! Bit-exactness matters: a last-bit difference can flip a later rounding
//! to 8 bits or to f16, and attention over large scores amplifies such
//! flips into differences of tenths of a nat. Within the scope below the
//! logits equal llama.cpp's bit for bit (the parity test checks three real
//! models over 32 greedy steps).
//!
//! Scope and limits:
//!
//! - The kernels are those of an AVX-512 build (`GGML_NATIVE` on an
//!   AVX-512 machine, as the references were recorded): the 16-lane `exp`
//!   of the softmax and SiLU and the f16 dot lanes differ on an AVX2-only
//!   build of llama.cpp.
//! - llama.cpp picks kernels by batch size (tinyBLAS for batches, `vec_dot`
//!   for one row; the repacked Q4_K gemm for rows in groups of four), and
//!   so does this mode for the rows of each call: a prompt in one batch
//!   followed by one-token decode steps reproduces llama.cpp's run, while
//!   another batching (teacher forcing a whole sequence) computes
//!   something llama.cpp never did, at the same accuracy.
//! - llama.cpp computes the last layer's output rows only; this backend
//!   computes every row, which changes nothing unless that layer has a
//!   repacked Q4_K matrix and the prompt is a multiple of 4 tokens.
//! - Not reproduced: the repacked kernels llama.cpp uses for Q4_0, IQ4_NL
//!   and MXFP4 matrices with a multiple of 8 rows (their `vec_dot` order is
//!   used), rope scalings other than none and linear, and everything
//!   outside the backend (routers, sampling). The KV cells are assumed to
//!   be positions (one sequence that fits its cache).

mod attention;
pub(crate) mod dot;
pub(crate) mod float_dot;
pub mod ops;
pub mod quantize;

use quantize::{BlockQ8, BlockQ8K, QK8, QK_K};
use turbospark_core::QuantFormat;

/// The format ggml converts activations to before dotting them with a
/// weight of a given format (`type_traits_cpu[type].vec_dot_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VecDotType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q8_1,
    Q8K,
}

/// `vec_dot_type` of `fmt`.
pub const fn vec_dot_type(fmt: QuantFormat) -> VecDotType {
    match fmt {
        QuantFormat::F32 => VecDotType::F32,
        QuantFormat::F16 => VecDotType::F16,
        QuantFormat::Bf16 => VecDotType::Bf16,
        QuantFormat::Q8_0 | QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Mxfp4 => {
            VecDotType::Q8_0
        }
        QuantFormat::Q4_1 | QuantFormat::Q5_1 => VecDotType::Q8_1,
        QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => VecDotType::Q8K,
    }
}

/// Activation rows of one matmul call in their `vec_dot_type`, sized once
/// (when a stream is created) for the widest matrix and the largest batch.
#[derive(Default)]
pub(crate) struct ActScratch {
    /// Most rows per call (the session's batch).
    tokens: usize,
    /// Widest input of a matrix needing each kind (Q8_0/Q8_1, Q8_K, f16/bf16).
    cols_q8: usize,
    cols_q8k: usize,
    cols_float: usize,
    pub(crate) q8: Vec<BlockQ8>,
    pub(crate) q8k: Vec<BlockQ8K>,
    /// f16- or bf16-rounded activations, widened.
    pub(crate) float: Vec<f32>,
}

impl ActScratch {
    /// Grows the buffers for matrices of `cols` inputs and `fmt`.
    pub(crate) fn fit_matrix(&mut self, fmt: QuantFormat, cols: usize) {
        match vec_dot_type(fmt) {
            VecDotType::F32 => {}
            VecDotType::F16 | VecDotType::Bf16 => self.cols_float = self.cols_float.max(cols),
            VecDotType::Q8_0 | VecDotType::Q8_1 => self.cols_q8 = self.cols_q8.max(cols),
            VecDotType::Q8K => self.cols_q8k = self.cols_q8k.max(cols),
        }
        self.resize();
    }

    /// Grows the buffers for calls of up to `tokens` rows.
    pub(crate) fn fit_tokens(&mut self, tokens: usize) {
        self.tokens = self.tokens.max(tokens);
        self.resize();
    }

    fn resize(&mut self) {
        let t = self.tokens;
        if self.q8.len() < t * self.cols_q8 / QK8 {
            self.q8.resize(t * self.cols_q8 / QK8, BlockQ8::ZERO);
        }
        if self.q8k.len() < t * self.cols_q8k / QK_K {
            self.q8k.resize(t * self.cols_q8k / QK_K, BlockQ8K::ZERO);
        }
        if self.float.len() < t * self.cols_float {
            self.float.resize(t * self.cols_float, 0.0);
        }
    }
}
