//! Q4_K products against 8-bit activations in fast numerics
//! (`kernels/kq.cu`): the setting that turns them on, which products fit
//! them, and their kernels.
//!
//! The default decodes Q4_K weights to bf16 for the tensor cores
//! (`kernels/tcmm.cu`): a decode step's products then spend ~0.4
//! instructions a weight and a warp on the decoding and on MMAs whose 8
//! token columns hold one token (an 8B model's Q4_K rows streamed at ~530
//! GB/s on an H200; BENCHMARKS.md, twenty-seventh session). kq.cu dots the
//! 4-bit codes with the token's 8-bit codes in integers (dp4a) and applies
//! a sub-block's scale and min once per 32 weights, as llama.cpp's
//! matrix-vector kernels do; a batch takes the same integer sums on the
//! integer tensor cores in the same f32 order, so a token's bits are the
//! same alone or in a batch. Opt-in until measured on a GPU:
//! `TURBOSPARK_CUDA_KQ=int8`.

use super::kernel;
use crate::CudaError;
use cudarc::driver::{CudaFunction, CudaModule};
use std::sync::Arc;
use turbospark_core::QuantFormat;

/// Columns of a Q4_K super-block and its bytes.
const SUPER_BLOCK: usize = 256;
const SUPER_BLOCK_BYTES: usize = 144;

/// The kernels of one format.
pub(crate) struct KqSet {
    /// A few tokens (fewer than [`super::MMQ_MIN_TOKENS`]): q8dot.cu's
    /// matrix-vector shape (`kq_matmul_*`, a warp a row, up to
    /// [`super::MM_TOKENS`] tokens a block, grid.y the token groups).
    pub matmul: CudaFunction,
    /// The same for one token (`kq_matmul1_*`, a block a token: a decode
    /// step's products, in fewer registers).
    pub matmul1: CudaFunction,
    /// Batches: mmq.cu's tiles (`kq_tile_*`, [`super::MQ_BM`] rows ×
    /// [`super::MQ_BN`] tokens a block).
    pub tile: CudaFunction,
}

/// The formats with integer kernels, and theirs.
pub(crate) struct KqKernels {
    sets: Vec<(QuantFormat, KqSet)>,
}

impl KqKernels {
    pub(super) fn load(m: &Arc<CudaModule>) -> Result<KqKernels, CudaError> {
        let f = |kind: &str, fmt: QuantFormat| kernel(m, &format!("kq_{kind}_{}", fmt.name()));
        let q4k = QuantFormat::Q4K;
        Ok(KqKernels {
            sets: vec![(
                q4k,
                KqSet {
                    matmul: f("matmul", q4k)?,
                    matmul1: f("matmul1", q4k)?,
                    tile: f("tile", q4k)?,
                },
            )],
        })
    }

    /// The kernels of `fmt`, if it has them.
    pub(crate) fn get(&self, fmt: QuantFormat) -> Option<&KqSet> {
        self.sets.iter().find(|(f, _)| *f == fmt).map(|(_, s)| s)
    }
}

/// Whether Q4_K products take kq.cu's kernels (`TURBOSPARK_CUDA_KQ`): only
/// with `int8`.
pub(super) fn kq_setting(setting: Option<&str>) -> bool {
    setting.map(str::trim) == Some("int8")
}

/// Whether a product of a matrix of `format` (`cols` wide, at device
/// address `w`, rows `row_bytes` apart) with the input at `x` fits kq.cu's
/// kernels: whole super-blocks, whose 16-byte loads need the matrix and its
/// rows 16-byte aligned, and 16-byte aligned activations.
pub(crate) fn kq_fits(format: QuantFormat, cols: usize, w: u64, row_bytes: usize, x: u64) -> bool {
    format == QuantFormat::Q4K
        && cols > 0
        && cols % SUPER_BLOCK == 0
        && row_bytes == cols / SUPER_BLOCK * SUPER_BLOCK_BYTES
        && w % 16 == 0
        && row_bytes % 16 == 0
        && x % 16 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_int8_turns_the_kernels_on() {
        assert!(kq_setting(Some("int8")));
        assert!(kq_setting(Some(" int8 ")));
        assert!(!kq_setting(None));
        assert!(!kq_setting(Some("")));
        assert!(!kq_setting(Some("bf16")));
    }

    #[test]
    fn only_aligned_whole_q4_k_super_blocks_fit() {
        // An 8B model's ffn rows: 4096 columns, 16 super-blocks of 144 bytes.
        assert!(kq_fits(QuantFormat::Q4K, 4096, 0x1000, 2304, 0x2000));
        assert!(!kq_fits(QuantFormat::Q6K, 4096, 0x1000, 3360, 0x2000));
        assert!(!kq_fits(QuantFormat::Q4K, 4096, 0x1008, 2304, 0x2000));
        assert!(!kq_fits(QuantFormat::Q4K, 4096, 0x1000, 2304, 0x2004));
        assert!(!kq_fits(QuantFormat::Q4K, 4096, 0x1000, 2320, 0x2000));
        assert!(!kq_fits(QuantFormat::Q4K, 0, 0x1000, 0, 0x2000));
        // 144 · 1 is a multiple of 16, so every row of one super-block is.
        assert!(kq_fits(QuantFormat::Q4K, 256, 0x1000, 144, 0x2000));
    }
}
