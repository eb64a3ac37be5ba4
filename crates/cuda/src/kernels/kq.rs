//! Products of Q4_K, Q6_K and the legacy 4- and 5-bit formats (Q4_0,
//! Q4_1, Q5_0, Q5_1) against 8-bit activations in fast numerics
//! (`kernels/kq.cu`): the setting that turns them on, which products fit
//! them, and their kernels.
//!
//! The default decodes these weights to bf16 for the tensor cores
//! (`kernels/tcmm.cu`): a decode step's products then spend ~0.4
//! instructions a weight and a warp on the decoding and on MMAs whose 8
//! token columns hold one token (an 8B model's Q4_K rows streamed at ~530
//! GB/s, its Q6_K rows at ~830, a Q4_0 square at ~500, on an H200;
//! BENCHMARKS.md, twenty-seventh session). kq.cu dots the codes with the
//! token's 8-bit codes in integers (dp4a) and applies a block's scales
//! once per 16 or 32 weights, as llama.cpp's matrix-vector kernels do; a
//! batch takes the same integer sums on the integer tensor cores in the
//! same f32 order, so a token's bits are the same alone or in a batch.
//! The default since the twenty-ninth session measured it
//! (`TURBOSPARK_CUDA_KQ=tc` keeps the tensor cores).

use super::{kernel, Modules};
use crate::CudaError;
use cudarc::driver::CudaFunction;
use turbospark_core::QuantFormat;

/// The formats with kernels in kq.cu.
const KQ_FORMATS: [QuantFormat; 6] = [
    QuantFormat::Q4_0,
    QuantFormat::Q4_1,
    QuantFormat::Q5_0,
    QuantFormat::Q5_1,
    QuantFormat::Q4K,
    QuantFormat::Q6K,
];

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
    /// Routed experts of this format: route by route (`kq_gate_up1_*`,
    /// `kq_down1_*`: a warp a row, [`super::Q8_BLOCK_ROWS`] rows a block,
    /// grid.y the routes) and grouped by expert on the tensor cores
    /// (`kq_gate_up_tile_*`: `MQ_BM / 2` rows of gate and of up a block;
    /// `kq_down_tile_*`: [`super::MQ_BM`] rows; grid.y the slots).
    pub gate_up1: CudaFunction,
    pub down1: CudaFunction,
    pub gate_up_tile: CudaFunction,
    pub down_tile: CudaFunction,
}

/// The formats with integer kernels, and theirs.
pub(crate) struct KqKernels {
    sets: Vec<(QuantFormat, KqSet)>,
}

impl KqKernels {
    pub(super) fn load(m: &Modules) -> Result<KqKernels, CudaError> {
        let f = |kind: &str, fmt: QuantFormat| kernel(m, &format!("kq_{kind}_{}", fmt.name()));
        let sets = KQ_FORMATS
            .iter()
            .map(|&fmt| {
                Ok((
                    fmt,
                    KqSet {
                        matmul: f("matmul", fmt)?,
                        matmul1: f("matmul1", fmt)?,
                        tile: f("tile", fmt)?,
                        gate_up1: f("gate_up1", fmt)?,
                        down1: f("down1", fmt)?,
                        gate_up_tile: f("gate_up_tile", fmt)?,
                        down_tile: f("down_tile", fmt)?,
                    },
                ))
            })
            .collect::<Result<_, CudaError>>()?;
        Ok(KqKernels { sets })
    }

    /// The kernels of `fmt`, if it has them.
    pub(crate) fn get(&self, fmt: QuantFormat) -> Option<&KqSet> {
        self.sets.iter().find(|(f, _)| *f == fmt).map(|(_, s)| s)
    }
}

/// Whether the products of kq.cu's formats take its kernels
/// (`TURBOSPARK_CUDA_KQ`): yes unless `tc` (their weights then decoded to
/// bf16 for the tensor cores, as before the twenty-ninth session). On an
/// H100 the integer kernels decoded an 8B Q4_K_M layout 2.95× as fast
/// (tg128 129.1 → 380.5 tok/s), a Qwen3-30B-A3B one 1.49×, the real
/// models' layouts 1.35–1.65×; prefill 0.89–1.45× (BENCHMARKS.md,
/// twenty-ninth session).
pub(super) fn kq_setting(setting: Option<&str>) -> bool {
    setting.map(str::trim) != Some("tc")
}

/// Whether a product of a matrix of `format` (`cols` wide, at device
/// address `w`, rows `row_bytes` apart) with the input at `x` fits kq.cu's
/// kernels: a format they have, whole blocks in rows of ggml's layout,
/// 16-byte aligned activations, and the alignment the format's loads
/// need — Q4_K's 16-byte pieces the matrix and its rows 16-byte aligned;
/// the others' aligned words the matrix 4-byte aligned (a Q6_K, Q4_0 or
/// Q5_0 block may then start 2 bytes past a word: the kernels read the
/// words around it, which lie in the matrix).
pub(crate) fn kq_fits(format: QuantFormat, cols: usize, w: u64, row_bytes: usize, x: u64) -> bool {
    let elems = format.block_elems();
    let whole = KQ_FORMATS.contains(&format)
        && cols > 0
        && cols % elems == 0
        && row_bytes == cols / elems * format.block_bytes()
        && x % 16 == 0;
    whole
        && match format {
            QuantFormat::Q4K => w % 16 == 0 && row_bytes % 16 == 0,
            _ => w % 4 == 0,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tc_turns_the_kernels_off() {
        assert!(kq_setting(Some("int8")));
        assert!(kq_setting(Some(" int8 ")));
        assert!(kq_setting(None));
        assert!(kq_setting(Some("")));
        assert!(!kq_setting(Some("tc")));
        assert!(!kq_setting(Some(" tc")));
    }

    #[test]
    fn legacy_rows_fit_on_a_word_boundary() {
        // SmolLM2's 576-wide Q4_1 rows (18 blocks of 20 bytes), Qwen2.5's
        // 896-wide Q5_0 rows (28 blocks of 22 bytes: every other block 2
        // bytes past a word, which the kernels read around).
        assert!(kq_fits(QuantFormat::Q4_1, 576, 0x1000, 360, 0x2000));
        assert!(kq_fits(QuantFormat::Q5_0, 896, 0x1004, 616, 0x2000));
        assert!(kq_fits(QuantFormat::Q4_0, 160, 0x1000, 90, 0x2000));
        assert!(!kq_fits(QuantFormat::Q4_0, 160, 0x1002, 90, 0x2000));
        assert!(!kq_fits(QuantFormat::Q5_1, 100, 0x1000, 75, 0x2000));
        assert!(!kq_fits(QuantFormat::Q4_1, 576, 0x1000, 360, 0x2008));
    }

    #[test]
    fn only_aligned_whole_k_quant_super_blocks_fit() {
        // An 8B model's ffn rows: 4096 columns, 16 super-blocks of 144
        // (Q4_K) or 210 (Q6_K) bytes.
        assert!(kq_fits(QuantFormat::Q4K, 4096, 0x1000, 2304, 0x2000));
        assert!(kq_fits(QuantFormat::Q6K, 4096, 0x1000, 3360, 0x2000));
        // Q6_K rows of 11 super-blocks: every other row starts 2 bytes
        // past a word, which the kernels read around.
        assert!(kq_fits(QuantFormat::Q6K, 2816, 0x1004, 2310, 0x2000));
        assert!(!kq_fits(QuantFormat::Q6K, 2816, 0x1002, 2310, 0x2000));
        assert!(!kq_fits(QuantFormat::Q5K, 4096, 0x1000, 2816, 0x2000));
        assert!(!kq_fits(QuantFormat::Q8_0, 4096, 0x1000, 4352, 0x2000));
        assert!(!kq_fits(QuantFormat::Q4K, 4096, 0x1008, 2304, 0x2000));
        assert!(!kq_fits(QuantFormat::Q4K, 4096, 0x1000, 2304, 0x2004));
        assert!(!kq_fits(QuantFormat::Q4K, 4096, 0x1000, 2320, 0x2000));
        assert!(!kq_fits(QuantFormat::Q4K, 0, 0x1000, 0, 0x2000));
        // 144 · 1 is a multiple of 16, so every row of one super-block is.
        assert!(kq_fits(QuantFormat::Q4K, 256, 0x1000, 144, 0x2000));
    }
}
