//! The tensor-core products of fast numerics (`kernels/tcmm.cu`,
//! `kernels/tcmoe.cu`): which weight formats take them, how a few tokens'
//! products are spread over the GPU, the launch shapes the kernels'
//! `#define`s fix, and the kernels of each format.

use super::{kernel, CudaError, Modules};
use cudarc::driver::{sys, CudaFunction};
use turbospark_core::QuantFormat;

/// How a few tokens' tensor-core products are spread over the GPU (the
/// same bits every way; only speed decides).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TcPick {
    /// By the rows ([`TcKernels::way`]).
    BySize,
    /// By the rows, a layer's projections streamed through shared memory
    /// where the format allows (`matmul_tc1s_*`; opt-in until measured).
    Streamed,
    /// A warp a segment, a block a tile (`matmul_tc1_*`) whatever the
    /// rows.
    Segments,
    /// Whole rows a warp (`matmul_tc1r_*`) whatever the rows.
    Rows,
}

/// The weight formats whose products take the tensor cores in fast
/// numerics (`kernels/tcmm.cu`, weights decoded to bf16): all but the two
/// whose products take 8-bit activations (Q8_0 and MXFP4, `q8dot.cu`).
pub(crate) const TC_FORMATS: [QuantFormat; 10] = [
    QuantFormat::F32,
    QuantFormat::F16,
    QuantFormat::Bf16,
    QuantFormat::Q4_0,
    QuantFormat::Q4_1,
    QuantFormat::Q5_0,
    QuantFormat::Q5_1,
    QuantFormat::Q4K,
    QuantFormat::Q5K,
    QuantFormat::Q6K,
];

/// Which products take the tensor cores in fast numerics, and how
/// (`TURBOSPARK_CUDA_BF16`, for A/B measurements: comma-separated words).
/// `generic` keeps matmul.cu's kernel for every format (f32 activations,
/// another sum order: `None`); `bf16` keeps it for all but bf16 weights;
/// `segments` and `rows` force one way of spreading a few tokens'
/// products, which otherwise is picked by size; `stream` streams the
/// smaller ones' bf16 weights through shared memory, and with `route` a
/// token's bf16 router product joins its routing (the third value).
pub(super) fn tc_setting(setting: Option<&str>) -> Option<(TcPick, &'static [QuantFormat], bool)> {
    let words: Vec<&str> = setting
        .unwrap_or_default()
        .split([',', '+'])
        .map(str::trim)
        .collect();
    if words.contains(&"generic") {
        return None;
    }
    let pick = if words.contains(&"segments") {
        TcPick::Segments
    } else if words.contains(&"rows") {
        TcPick::Rows
    } else if words.contains(&"stream") {
        TcPick::Streamed
    } else {
        TcPick::BySize
    };
    let formats: &'static [QuantFormat] = if words.contains(&"bf16") {
        &[QuantFormat::Bf16]
    } else {
        &TC_FORMATS
    };
    Some((
        pick,
        formats,
        pick == TcPick::Streamed && words.contains(&"route"),
    ))
}

/// The tensor-core products of one weight format (`kernels/tcmm.cu`).
pub(crate) struct TcSet {
    /// Up to [`TC_FEW_TOKENS`] tokens: a block per 16 rows, a warp per
    /// segment of the columns (`matmul_tc1_*`).
    pub few: CudaFunction,
    /// The same sums with a warp per 16 whole rows, [`TC_ROW_WARPS`] a
    /// block (`matmul_tc1r_*`).
    pub rows: CudaFunction,
    /// Batches: a block per [`TC_BATCH_ROWS`] rows × [`TC_BATCH_TOKENS`]
    /// tokens (`matmul_tc_*`).
    pub batch: CudaFunction,
    /// bf16 only: `few`'s sums with a block an SM walking the tiles, each
    /// warp's weights streamed through its ring of shared memory
    /// (`matmul_tc1s_bf16`).
    pub streamed: Option<TcStreamed>,
    /// bf16 only: a token's router product streamed so by one block, and
    /// its routing in the same launch (`router_tc1s_bf16`); set up only
    /// when the setting joins them (opt-in until measured).
    pub router_streamed: Option<TcStreamed>,
    /// Routed experts of this format (`kernels/tcmoe.cu`).
    pub experts: TcExperts,
}

/// The routed-expert kernels of one format on the tensor cores
/// (`kernels/tcmoe.cu`): routes one by one (a block per 16 rows of a
/// route, a warp per segment) and grouped by expert (a block per
/// [`TC_BATCH_ROWS`] rows of an expert); the same bits either way.
pub(crate) struct TcExperts {
    pub gate_up_few: CudaFunction,
    pub down_few: CudaFunction,
    pub gate_up_grouped: CudaFunction,
    pub down_grouped: CudaFunction,
}

/// A kernel streaming its weights through shared memory (tcmm.cu
/// `matmul_tc1s_impl`), and the dynamic shared memory a block of it may
/// take on this GPU (the opt-in amount less its static arrays).
pub(crate) struct TcStreamed {
    pub f: CudaFunction,
    max_dynamic: usize,
}

impl TcStreamed {
    /// Raises `f`'s dynamic shared memory to what the GPU allows it; `None`
    /// where that is too little for any ring.
    fn new(f: CudaFunction, smem_optin: usize) -> Result<Option<TcStreamed>, CudaError> {
        let fixed = f
            .shared_size_bytes()
            .map_err(CudaError::driver("reading a kernel's shared memory"))?;
        let max_dynamic = smem_optin.saturating_sub(fixed.max(0) as usize);
        if max_dynamic < TC_RING * TC_RING_SLOT {
            return Ok(None);
        }
        f.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            max_dynamic as i32,
        )
        .map_err(CudaError::driver("raising a kernel's shared memory"))?;
        Ok(Some(TcStreamed { f, max_dynamic }))
    }

    /// Whether rows `cols` wide fit its segments and, on this GPU, its
    /// rings ([`tc_stream_smem`]).
    pub(crate) fn fits(&self, cols: usize) -> bool {
        tc_streams(cols) && tc_stream_smem(cols) <= self.max_dynamic
    }

    /// A block of its launch over rows `cols` wide: its threads (a warp a
    /// segment) and its dynamic shared memory (their rings).
    pub(crate) fn block(cols: usize) -> (u32, u32) {
        ((tc_segments(cols) * 32) as u32, tc_stream_smem(cols) as u32)
    }
}

/// The tensor-core products of the formats that take them.
pub(crate) struct TcKernels {
    sets: Vec<(QuantFormat, TcSet)>,
    pub pick: TcPick,
    /// The GPU's multiprocessors (a streamed launch's blocks, at most).
    pub sms: u32,
}

impl TcKernels {
    pub(super) fn load(
        m: &Modules,
        pick: TcPick,
        formats: &[QuantFormat],
        route_join: bool,
        sms: u32,
        smem_optin: usize,
    ) -> Result<TcKernels, CudaError> {
        let sets = formats
            .iter()
            .map(|&fmt| {
                let f = |kind: &str| kernel(m, &format!("{kind}_{}", fmt.name()));
                Ok((
                    fmt,
                    TcSet {
                        few: f("matmul_tc1")?,
                        rows: f("matmul_tc1r")?,
                        batch: f("matmul_tc")?,
                        // (Set up only when asked for: opt-in kernels.)
                        streamed: match fmt {
                            QuantFormat::Bf16 if pick == TcPick::Streamed => {
                                TcStreamed::new(f("matmul_tc1s")?, smem_optin)?
                            }
                            _ => None,
                        },
                        router_streamed: match fmt {
                            QuantFormat::Bf16 if route_join => {
                                TcStreamed::new(f("router_tc1s")?, smem_optin)?
                            }
                            _ => None,
                        },
                        experts: TcExperts {
                            gate_up_few: f("moe_gate_up_tc1")?,
                            down_few: f("moe_down_tc1")?,
                            gate_up_grouped: f("moe_gate_up_tc")?,
                            down_grouped: f("moe_down_tc")?,
                        },
                    },
                ))
            })
            .collect::<Result<_, CudaError>>()?;
        Ok(TcKernels { sets, pick, sms })
    }

    /// The kernels of `fmt`'s products, if they take the tensor cores.
    pub(crate) fn get(&self, fmt: QuantFormat) -> Option<&TcSet> {
        self.sets
            .iter()
            .find(|(f, _)| *f == fmt)
            .map(|(_, set)| set)
    }

    /// How `tiles` 16-row tiles (a group's, all together) of rows `cols`
    /// wide in `set`'s format are spread ([`few_way`]; streamed only where
    /// the format has that kernel and its rings fit the shared memory).
    pub(crate) fn way(&self, set: &TcSet, tiles: usize, cols: usize) -> FewWay {
        match few_way(self.pick, tiles) {
            FewWay::Streamed if !set.streamed.as_ref().is_some_and(|s| s.fits(cols)) => {
                FewWay::Segments
            }
            way => way,
        }
    }
}

/// Row bytes a matrix of `fmt` must start at a multiple of (and its row
/// stride be) for the tensor-core products' loads (tcmm.cu `tc_decode8`):
/// 16-byte loads of plain floats, a block's widest aligned words else.
const fn tc_align(fmt: QuantFormat) -> usize {
    match fmt {
        QuantFormat::F32 | QuantFormat::F16 | QuantFormat::Bf16 => 16,
        QuantFormat::Q5_1 | QuantFormat::Q4K | QuantFormat::Q5K => 8,
        QuantFormat::Q4_1 => 4,
        _ => 2,
    }
}

/// Whether a matrix of `fmt` at `ptr`, its rows `row_bytes` apart, is
/// aligned as the tensor-core products' loads need ([`tc_align`]).
pub(crate) fn tc_aligned(fmt: QuantFormat, ptr: u64, row_bytes: usize) -> bool {
    let align = tc_align(fmt) as u64;
    ptr % align == 0 && row_bytes as u64 % align == 0
}

/// The kernel a few tokens' tensor-core products take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FewWay {
    /// `matmul_tc1_*`: a warp a segment.
    Segments,
    /// `matmul_tc1s_*`: a warp a segment, a block an SM over the tiles,
    /// the weights streamed through shared memory.
    Streamed,
    /// `matmul_tc1r_*`: a warp 16 whole rows.
    Rows,
}

/// How `tiles` 16-row tiles are spread under `pick`:
/// by size, whole rows a warp where the tiles are [`TC_ROWS_MIN_TILES`]
/// or more (an output head), else a warp a segment (under
/// [`TcPick::Streamed`] streamed through shared memory where the format
/// allows: [`TcKernels::way`]). (Warps streaming a few consecutive
/// segments each through registers, tried for a layer's projections, were
/// slower: BENCHMARKS.md, twenty-fourth session.)
fn few_way(pick: TcPick, tiles: usize) -> FewWay {
    match pick {
        TcPick::Segments => FewWay::Segments,
        TcPick::Rows => FewWay::Rows,
        TcPick::BySize | TcPick::Streamed if tiles >= TC_ROWS_MIN_TILES => FewWay::Rows,
        TcPick::BySize => FewWay::Segments,
        TcPick::Streamed => FewWay::Streamed,
    }
}

/// Chunks a warp of `matmul_tc1s_*` keeps in flight (`TC_RING`), and the
/// most chunks a segment it takes (`TC_STREAM_PMAX`).
pub(crate) const TC_RING: usize = 8;
pub(crate) const TC_STREAM_MAX_PER: usize = 8;
/// Bytes of a chunk's weights for a warp (16 bytes of two rows a lane).
const TC_RING_SLOT: usize = 1024;

/// Whether rows `cols` wide have segments short enough for
/// `matmul_tc1s_*` (its token values are held a chunk a register set).
pub(crate) fn tc_streams(cols: usize) -> bool {
    let chunks = cols / TC_CHUNK;
    TC_SEG.max(chunks.div_ceil(TC_MAX_SEGS)) <= TC_STREAM_MAX_PER
}

/// Dynamic shared memory of a `matmul_tc1s_*` launch over rows `cols`
/// wide: each warp's (segment's) ring.
pub(crate) fn tc_stream_smem(cols: usize) -> usize {
    tc_segments(cols) * TC_RING * TC_RING_SLOT
}

/// Tiles of 16 rows from which a few tokens' tensor-core products take whole
/// rows a warp: 16 warps an SM of a 132-SM H200, each streaming its rows
/// (an output head); fewer rows split the columns over the warps instead.
pub(crate) const TC_ROWS_MIN_TILES: usize = 2112;
/// Warps of a `matmul_tc1r_*` block (`TC_ROW_WARPS`).
pub(crate) const TC_ROW_WARPS: usize = 4;
/// Tokens `matmul_tc1_*` takes at most (one 8-token MMA tile).
pub(crate) const TC_FEW_TOKENS: usize = 8;
/// Rows and tokens of a `matmul_tc_*` block, and its threads
/// (`TC_BATCH_ROWS`, `TC_BATCH_TOKENS`, `TC_BATCH_WARPS` in tcmm.cu).
pub(crate) const TC_BATCH_ROWS: usize = 128;
pub(crate) const TC_BATCH_TOKENS: usize = 64;
pub(crate) const TC_BATCH_THREADS: u32 = 256;
/// Columns a chunk, fewest chunks a segment and most segments a row
/// (`TC_CHUNK`, `TC_SEG`, `TC_MAX_SEGS`).
pub(crate) const TC_CHUNK: usize = 32;
pub(crate) const TC_SEG: usize = 4;
pub(crate) const TC_MAX_SEGS: usize = 24;

/// Segments of a row `cols` wide (tcmm.cu `tc_seg_chunks`): the warps of
/// a `matmul_tc1_*` block.
pub(crate) fn tc_segments(cols: usize) -> usize {
    let chunks = cols / TC_CHUNK;
    let per = TC_SEG.max(chunks.div_ceil(TC_MAX_SEGS));
    chunks.div_ceil(per)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row of whole 32-column chunks (whole blocks for the
    /// K-quants) keeps the alignment its format's loads need, so `tc_fits`
    /// turns a product away only for a misaligned matrix, never for its
    /// row stride: the bytes of a chunk, or of a 256-element block, are a
    /// multiple of it.
    #[test]
    fn rows_of_whole_chunks_keep_their_format_alignment() {
        for fmt in TC_FORMATS {
            let unit_bytes = match fmt.block_elems() {
                256 => fmt.block_bytes(),
                elems => TC_CHUNK / elems * fmt.block_bytes(),
            };
            assert_eq!(unit_bytes % tc_align(fmt), 0, "{fmt}: {unit_bytes} bytes");
        }
    }

    /// `TURBOSPARK_CUDA_BF16`: tensor cores unless `generic`, for every
    /// format but Q8_0 and MXFP4 unless `bf16`, picked by size unless
    /// `segments` or `rows`.
    #[test]
    fn tensor_core_products_follow_the_setting() {
        let all: &[QuantFormat] = &TC_FORMATS;
        let bf16: &[QuantFormat] = &[QuantFormat::Bf16];
        assert_eq!(tc_setting(None), Some((TcPick::BySize, all, false)));
        for (setting, expected) in [
            ("tc", Some((TcPick::BySize, all, false))),
            (" rows", Some((TcPick::Rows, all, false))),
            ("segments", Some((TcPick::Segments, all, false))),
            ("stream", Some((TcPick::Streamed, all, false))),
            ("stream+route", Some((TcPick::Streamed, all, true))),
            ("rows,route", Some((TcPick::Rows, all, false))),
            ("bf16, rows", Some((TcPick::Rows, bf16, false))),
            ("generic ", None),
            ("bf16,generic", None),
        ] {
            assert_eq!(tc_setting(Some(setting)), expected, "{setting:?}");
        }
        assert!(!TC_FORMATS.contains(&QuantFormat::Q8_0));
        assert!(!TC_FORMATS.contains(&QuantFormat::Mxfp4));
        assert_eq!(TC_FORMATS.len() + 2, QuantFormat::ALL.len());
    }

    /// Segments of a row: at least 4 chunks each, at most 24 of them, the
    /// last one holding the rest.
    #[test]
    fn tc_segments_cover_the_row() {
        for (cols, segs) in [
            (32, 1),
            (128, 1),
            (160, 2),
            (2880, 23),
            (4096, 22),
            (4160, 22),
        ] {
            assert_eq!(tc_segments(cols), segs, "{cols} columns");
        }
    }

    /// By size: an output head whole rows, gpt-oss's projections and
    /// router a segment a warp (streamed under `stream`); a forced way
    /// whatever the size.
    #[test]
    fn few_token_tensor_core_products_are_spread_by_size() {
        use FewWay::*;
        for (pick, small) in [(TcPick::BySize, Segments), (TcPick::Streamed, Streamed)] {
            let by_size = |tiles| few_way(pick, tiles);
            assert_eq!(by_size(201088 / 16), Rows);
            assert_eq!(by_size(TC_ROWS_MIN_TILES), Rows);
            assert_eq!(by_size(TC_ROWS_MIN_TILES - 1), small);
            assert_eq!(by_size(320), small);
            assert_eq!(by_size(2), small);
        }
        assert_eq!(few_way(TcPick::Segments, 20000), Segments);
        assert_eq!(few_way(TcPick::Rows, 1), Rows);
    }

    /// The streamed kernel's rings: gpt-oss's 2880- and 4096-wide rows
    /// fit an H100's or H200's 227 KB a block (23 and 22 warps of 8 KB,
    /// with the 12 KB of segment sums, `parts[TC_MAX_SEGS][16][8]` f32);
    /// rows whose segments pass TC_STREAM_MAX_PER chunks keep the
    /// block-a-tile kernel.
    #[test]
    fn streamed_rings_fit_the_shared_memory() {
        const TC_STREAM_STATIC_SMEM: usize = TC_MAX_SEGS * 16 * 8 * 4;
        let optin = 227 * 1024;
        assert_eq!(tc_stream_smem(2880), 23 * 8 * 1024);
        assert_eq!(tc_stream_smem(4096), 22 * 8 * 1024);
        for cols in [2880, 4096, 4160, 6144] {
            assert!(tc_streams(cols), "{cols} columns");
            assert!(
                tc_stream_smem(cols) + TC_STREAM_STATIC_SMEM <= optin,
                "{cols} columns"
            );
        }
        assert!(!tc_streams(6176));
        assert!(!tc_streams(14336));
    }
}
