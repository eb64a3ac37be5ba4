//! The fast-numerics kernels of the formats whose products take 8-bit
//! activations (Q8_0 and MXFP4, `kernels/q8dot.cu` and the kernels built
//! on it: `q8one.cu`, `q8cta.cu`, `mmq.cu`, `q8mma.cu`), the settings that
//! pick among them, and their launch shapes.

use super::{kernel, Modules};
use crate::fusion::MatGroup;
use crate::CudaError;
use cudarc::driver::CudaFunction;
use std::sync::Mutex;
use turbospark_core::QuantFormat;

/// The fast-numerics kernels of one split format (`kernels/q8dot.cu`):
/// activations quantized to 8 bits in the order the format's codes decode,
/// and the products that read them.
pub(crate) struct Q8Set {
    pub quantize: CudaFunction,
    pub matmul: CudaFunction,
    /// The per-route kernels (`moe_gate_up_q8x`, `moe_down_q8x`; for
    /// MXFP4 also compiled for [`WIDE_WIDTH`]-wide rows).
    pub route: RouteKernels,
    pub gate_up_grouped: CudaFunction,
    pub down_grouped: CudaFunction,
    /// Tensor-core versions for batches (`kernels/mmq.cu`).
    pub mq_matmul: CudaFunction,
    pub mq_gate_up: CudaFunction,
    pub mq_down: CudaFunction,
    /// One token's products over rows up to [`ONE_MAX_COLS`] wide
    /// (`kernels/q8one.cu` or `q8cta.cu`), where they are used
    /// ([`one_token_kernels`]).
    pub one: Option<OneSet>,
    /// The per-route gate/up and down kernels on the integer tensor cores
    /// for rows up to [`MMA_MAX_COLS`] wide (`kernels/q8mma.cu`; MXFP4
    /// only), where asked for ([`mxfp4_tensor_cores`]).
    pub mma: Option<RouteKernels>,
    /// One token's products on the integer tensor cores for rows up to
    /// [`MMA_Q8_MAX_COLS`] wide (`kernels/q8mma.cu`, `matmul1_mma_q8_0_c1`
    /// .. `_c4`, by chunks a warp; Q8_0 only), where asked for
    /// ([`q8_tensor_cores`]).
    pub mma1: Option<[CudaFunction; MMA_Q8_MAX_CPW]>,
}

/// Warps of a `matmul1_mma_q8_0` block (`MMA_Q8_WARPS`, one 16-row tile),
/// the most chunks of 4 blocks a warp takes (`MMA_Q8_MAX_CPW`), so the
/// widest rows, and the most tiles a product may have to take them (more:
/// an output head, which q8one.cu streams at ~4 TB/s).
pub(crate) const MMA_Q8_WARPS: usize = 8;
pub(crate) const MMA_Q8_MAX_CPW: usize = 4;
pub(crate) const MMA_Q8_MAX_COLS: usize = MMA_Q8_WARPS * MMA_Q8_MAX_CPW * 128;
pub(crate) const MMA_Q8_MAX_TILES: usize = 2048;

impl Q8Set {
    /// The tensor-core product for one token over `group`'s rows, `cols`
    /// wide, where asked for and where it fits.
    pub(crate) fn mma1_for(&self, cols: usize, group: &MatGroup) -> Option<&CudaFunction> {
        let k = self.mma1.as_ref()?;
        let cpw = mma1_chunks_a_warp(cols, group.tiles(16))?;
        Some(&k[cpw - 1])
    }
}

/// Chunks of 4 blocks a `matmul1_mma_q8_0` warp takes over rows `cols`
/// wide (its `CPW`), when the kernel takes them: whole blocks, at most
/// [`MMA_Q8_MAX_COLS`] wide, at most [`MMA_Q8_MAX_TILES`] tiles.
fn mma1_chunks_a_warp(cols: usize, tiles: usize) -> Option<usize> {
    let fits = cols > 0 && cols % 32 == 0 && cols <= MMA_Q8_MAX_COLS && tiles <= MMA_Q8_MAX_TILES;
    fits.then(|| cols.div_ceil(128).div_ceil(MMA_Q8_WARPS))
}

/// Whether one token's Q8_0 products (not an output head) take q8mma.cu's
/// tensor-core kernel (`TURBOSPARK_CUDA_Q8`): only with `mma`. The bits of
/// q8one.cu's (the host emulation test checks both against a scalar
/// reference of the sum order); every weight load of a block's 16-row tile
/// is issued before the wait for the kernel before. Opt-in: on an H200 it
/// decoded the gpt-oss-shaped model at the same speed as q8one.cu's kernel
/// (tg128 729.65 / 729.62 against 729.06 / 735.46, alternated;
/// BENCHMARKS.md, twenty-seventh session).
fn q8_tensor_cores(setting: Option<&str>) -> bool {
    setting.map(str::trim) == Some("mma")
}

/// A pair of per-route gate/up and down kernels for rows of any width and,
/// where compiled, for rows [`WIDE_WIDTH`] wide (the width a compile-time
/// constant, `_w2880`: none with `TURBOSPARK_CUDA_WIDE=0`, see
/// [`wide_kernels`]); where asked for, the gate/up kernels' early form
/// (see [`early_gate_up`]).
pub(crate) struct RouteKernels {
    gate_up: CudaFunction,
    down: CudaFunction,
    wide: Option<(CudaFunction, CudaFunction)>,
    /// The early gate/up kernels: any width, and [`WIDE_WIDTH`] where
    /// `wide` is compiled.
    early: Option<(CudaFunction, Option<CudaFunction>)>,
}

impl RouteKernels {
    /// `{gate_up}` and `{down}`, and with `wide` also `{gate_up}_w2880`
    /// and `{down}_w2880`; with `early`, the gate/up kernels named
    /// `{early}` (and `{early}_w2880`).
    fn load(
        m: &Modules,
        gate_up: &str,
        down: &str,
        wide: bool,
        early: Option<&str>,
    ) -> Result<RouteKernels, CudaError> {
        let f = |name: String| kernel(m, &name);
        let at_width = |name: &str| f(format!("{name}_w{WIDE_WIDTH}"));
        Ok(RouteKernels {
            gate_up: f(gate_up.to_string())?,
            down: f(down.to_string())?,
            wide: match wide {
                true => Some((at_width(gate_up)?, at_width(down)?)),
                false => None,
            },
            early: match early {
                Some(e) => Some((f(e.to_string())?, wide.then(|| at_width(e)).transpose()?)),
                None => None,
            },
        })
    }

    /// The gate/up kernel for rows `hidden` wide.
    pub(crate) fn gate_up_for(&self, hidden: usize) -> &CudaFunction {
        match &self.wide {
            Some((g, _)) if hidden == WIDE_WIDTH => g,
            _ => &self.gate_up,
        }
    }

    /// Whether the early gate/up kernels were loaded (see [`early_gate_up`]).
    pub(crate) fn has_early(&self) -> bool {
        self.early.is_some()
    }

    /// The early gate/up kernel for rows `hidden` wide, where loaded: it
    /// reads its route and issues its first weight loads before it waits
    /// for the launch before it, so the caller must launch it only after a
    /// launch that follows the routing (q8dot.cu `moe_gate_up_q8_impl`).
    pub(crate) fn gate_up_early_for(&self, hidden: usize) -> Option<&CudaFunction> {
        let (any, wide) = self.early.as_ref()?;
        Some(match wide {
            Some(w) if hidden == WIDE_WIDTH => w,
            _ => any,
        })
    }

    /// The down kernel for rows `inter` wide.
    pub(crate) fn down_for(&self, inter: usize) -> &CudaFunction {
        match &self.wide {
            Some((_, d)) if inter == WIDE_WIDTH => d,
            _ => &self.down,
        }
    }
}

/// Rows and threads of q8mma.cu's down blocks (`MMA_ROWS`, `MMA_WARPS`
/// warps) and gate/up blocks (`MMA_GU_ROWS`, `MMA_GU_WARPS` warps), and
/// the widest rows they take (`MMA_MAX_COLS`).
pub(crate) const MMA_ROWS: usize = 16;
pub(crate) const MMA_THREADS: u32 = 128;
pub(crate) const MMA_GU_ROWS: usize = 32;
pub(crate) const MMA_GU_THREADS: u32 = 256;
pub(crate) const MMA_MAX_COLS: usize = 8192;

/// Whether one token's MXFP4 routed experts take q8mma.cu's tensor-core
/// kernels (`TURBOSPARK_CUDA_MXFP4`): only with `mma`. They give the bits
/// of q8dot.cu's per-route kernels (the host emulation test checks both
/// against a scalar reference of the sum order), with an MMA forming the
/// integer sums of 16 rows × 4 blocks where those decode and dot a row's
/// nibbles lane by lane. Opt-in: on an H200 the gpt-oss-shaped model
/// decoded slower with them (tg128 578.36 / 570.80 against 729.06 /
/// 735.46, alternated; BENCHMARKS.md, twenty-seventh session).
fn mxfp4_tensor_cores(setting: Option<&str>) -> bool {
    setting.map(str::trim) == Some("mma")
}

/// The width of the per-route kernels compiled for one width
/// (`Q8_WIDE_KERNELS` in `kernels/q8dot.cu`): gpt-oss's experts.
pub(crate) const WIDE_WIDTH: usize = 2880;

/// Widths of the one-token Q8_0 products compiled for one width
/// (`Q8_ONE_WIDE_MATMUL` in `kernels/q8one.cu`): gpt-oss's hidden size
/// and its attention output (64 heads of 64).
pub(crate) const ONE_WIDE_WIDTHS: [usize; 2] = [2880, 4096];

/// The width of the one-token q/k/v kernel with ropes compiled for one
/// width (`Q8_ONE_QKV_ROPE` in `kernels/q8one.cu`): gpt-oss's hidden size.
pub(crate) const QKV_ROPE_WIDTH: usize = 2880;

/// Whether one token's q, k and v products take their ropes and cache
/// writes into their launch (`TURBOSPARK_CUDA_QKV_ROPE`): only with `1`.
/// The same bits either way (the conformance suite's
/// `check_projections_then_rope` compares them). Opt-in: on an H200
/// (gpt-oss-20b shape, Q8_0 layout) the joined launch decoded at the
/// speed of the separate ones — tg128 @ d512 735.98 against 735.94 tok/s,
/// the mean of four alternated rounds, three of them 0.3–1.1 % faster
/// joined and the first 2.1 % slower (BENCHMARKS.md, thirty-ninth
/// session): the dependent launch already hides most of `rope_kv`, and a
/// unit of two rows leaves fewer warps streaming the weights.
fn qkv_rope(setting: Option<&str>) -> bool {
    setting.map(str::trim) == Some("1")
}

impl OneSet {
    /// The one-token q/k/v kernel with ropes and cache writes for rows
    /// `cols` wide, if any: the one compiled for that width, else the
    /// one of any width.
    pub(crate) fn qkv_rope_for(&self, cols: usize) -> Option<&OneKernel> {
        let at = |w: usize| self.qkv_rope.iter().find(|(x, _)| *x == w).map(|(_, k)| k);
        at(cols).or_else(|| at(0))
    }

    /// The one-token product kernel for rows `cols` wide, if any.
    pub(crate) fn matmul_for(&self, cols: usize) -> Option<&OneKernel> {
        self.matmul_wide
            .iter()
            .find(|(w, _)| *w == cols)
            .map(|(_, k)| k)
            .or(self.matmul.as_ref())
    }
}

/// Whether the per-route gate/up products of one token read their route
/// and issue their first weight loads before waiting for the launch
/// before them, where a launch stands between the routing and them
/// (`TURBOSPARK_CUDA_GATE_UP`): yes unless `wait`. The down products have
/// done so since the sixteenth session (BENCHMARKS.md); the same bits
/// either way. The launch between is the experts' input quantization, so
/// the ffn norm no longer writes it beside the router's input
/// (stream/products.rs). On an H100 (gpt-oss-20b shape) decode went from
/// 656.9 / 654.5 to 660.8 / 660.1 tok/s on the Q8_0 layout and from
/// 466.1 / 467.7 to 473.0 / 472.4 on the bf16 layout, alternated
/// (BENCHMARKS.md, twenty-ninth session).
fn early_gate_up(setting: Option<&str>) -> bool {
    setting.map(str::trim) != Some("wait")
}

/// Which kernels compiled for one width are used where they fit
/// (`TURBOSPARK_CUDA_WIDE`, for A/B measurements; the same bits either
/// way): `(routed experts, one-token products)`, both unless `0` (none)
/// or `experts` (the routed experts' only).
fn wide_kernels(setting: Option<&str>) -> (bool, bool) {
    match setting.map(str::trim) {
        Some("0") => (false, false),
        Some("experts") => (true, false),
        _ => (true, true),
    }
}

/// The one-token kernels of a format.
pub(crate) struct OneSet {
    /// None: dense products of the format stay on the per-row kernels.
    pub matmul: Option<OneKernel>,
    /// The same for rows of one width known when compiled (q8one.cu
    /// `Q8_ONE_WIDE_MATMUL`: Q8_0 at [`ONE_WIDE_WIDTHS`]), by width.
    pub matmul_wide: Vec<(usize, OneKernel)>,
    /// One token's router product with its routing (Q8_0 only:
    /// `router1_q8x_q8_0`, `router1c_q8x_q8_0`).
    pub router: Option<OneKernel>,
    /// One token's q, k and v products with their ropes and cache writes
    /// (q8one.cu `matmul1_q8x_q8_0_rope`; Q8_0 on q8one.cu's kernels only,
    /// opt-in, see [`qkv_rope`]), by width: 0 for any, else the width
    /// compiled. Empty: the products and `rope_kv` launched apart.
    pub qkv_rope: Vec<(usize, OneKernel)>,
    pub gate_up: OneKernel,
    pub down: OneKernel,
}

/// What a one-token launch computes, for its grid: the rows of up to
/// three matrices, or the gate/up or down rows of `routes` routes.
#[derive(Clone, Copy)]
pub(crate) enum OneWork<'a> {
    Rows(&'a [i32]),
    GateUp { routes: usize, inter: usize },
    Down { routes: usize, hidden: usize },
}

/// A one-token kernel and what sizes its grid: a launch has no more blocks
/// than the GPU holds at once, and gives each the same work within one
/// unit (q8one.cu: a warp takes rows one after another; q8cta.cu: a block
/// takes groups of [`CTA_GROUP`] rows one after another).
pub(crate) struct OneKernel {
    pub f: CudaFunction,
    kind: OneKind,
    sms: u32,
    /// Blocks an SM holds, by (threads, dynamic shared bytes), as the
    /// driver reported them.
    per_sm: Mutex<Vec<(u32, u32, u32)>>,
}

impl OneKernel {
    fn new(f: CudaFunction, kind: OneKind, sms: u32) -> OneKernel {
        OneKernel {
            f,
            kind,
            sms: sms.max(1),
            per_sm: Mutex::new(Vec::new()),
        }
    }

    /// The launch of `work` over rows `cols` wide in `fmt`.
    pub(crate) fn config(
        &self,
        fmt: QuantFormat,
        cols: usize,
        work: OneWork<'_>,
    ) -> Result<OneLaunch, CudaError> {
        let (threads, smem) = match self.kind {
            OneKind::Cta => cta_block_shape(fmt, cols),
            _ => (ONE_THREADS, 0),
        };
        let mut known = self.per_sm.lock().unwrap_or_else(|e| e.into_inner());
        let per_sm = match known.iter().find(|&&(t, m, _)| (t, m) == (threads, smem)) {
            Some(&(_, _, n)) => n,
            None => {
                let n = self
                    .f
                    .occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)
                    .map_err(CudaError::driver("reading a kernel's occupancy"))?
                    .max(1);
                known.push((threads, smem, n));
                n
            }
        };
        let cap = per_sm * self.sms;
        let grid = match self.kind {
            OneKind::Cta => {
                let groups = match work {
                    OneWork::Rows(rows) => {
                        rows.iter().map(|&r| (r as usize).div_ceil(CTA_GROUP)).sum()
                    }
                    OneWork::GateUp { routes, inter } => routes * inter.div_ceil(CTA_GROUP / 2),
                    OneWork::Down { routes, hidden } => routes * hidden.div_ceil(CTA_GROUP),
                };
                cta_grid(groups, cap)
            }
            _ => {
                let units = match work {
                    OneWork::Rows(rows) => rows.iter().map(|&r| r as usize).sum(),
                    OneWork::GateUp { routes, inter } => routes * inter,
                    OneWork::Down { routes, hidden } => routes * hidden,
                };
                one_grid(units, cap)
            }
        };
        Ok(OneLaunch {
            grid,
            threads,
            smem,
        })
    }
}

/// Grid, threads a block and dynamic shared bytes of a one-token launch.
pub(crate) struct OneLaunch {
    pub grid: (u32, u32, u32),
    pub threads: u32,
    pub smem: u32,
}

/// Which one-token kernels a format's products take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OneKind {
    /// The per-row kernels of `q8dot.cu`.
    None,
    /// `q8one.cu`: a warp streams rows one after another.
    Rows,
    /// `q8cta.cu`: a block of a thread a 16-byte piece takes groups of
    /// rows, their totals walked from a shared stash. Opt-in: the same
    /// bits on an H200, 37–50 % fewer instructions for the MXFP4 experts,
    /// but at 10–16 % occupancy (128–155 registers) no faster there, and
    /// a decode token 5 % slower (BENCHMARKS.md, eleventh session).
    Cta,
}

/// Whether one token's products of `fmt` take the one-token kernels:
/// Q8_0's do (measured on an H200, gpt-oss-20b shapes: q/k/v 1575 → 2110
/// GB/s, the output head 2518 → 4131 GB/s), MXFP4's do not (an expert's
/// rows 1447 → 1222 GB/s: their nibble decoding, not the loads, bounds
/// them; so were three kernels giving a lane a 4-block chunk of a row, up
/// to 10 % slower a decode token: BENCHMARKS.md, ninth session; and so
/// with the row totals formed from a shared stash instead of shuffles,
/// eleventh session). `TURBOSPARK_CUDA_ONE=0` turns them off, `=all` on
/// for both, `=cta` takes q8cta.cu's kernels for both.
fn one_token_kernels(fmt: QuantFormat) -> OneKind {
    one_kind(std::env::var("TURBOSPARK_CUDA_ONE").ok().as_deref(), fmt)
}

fn one_kind(setting: Option<&str>, fmt: QuantFormat) -> OneKind {
    match (setting, fmt) {
        (Some("0"), _) => OneKind::None,
        (Some("cta"), _) => OneKind::Cta,
        (Some("all"), _) | (_, QuantFormat::Q8_0) => OneKind::Rows,
        _ => OneKind::None,
    }
}

/// Widest rows the one-token kernels take (`ONE_MAX_COLS`, `CTA_MAX_COLS`).
pub(crate) const ONE_MAX_COLS: usize = 4096;
/// Warps of a q8one.cu block (`ONE_WARPS`) and its threads.
pub(crate) const ONE_WARPS: usize = 4;
pub(crate) const ONE_THREADS: u32 = 128;

/// Grid of a q8one.cu launch over `units` (rows, or route rows): no more
/// blocks than `cap` (what the GPU holds at once), and every warp given the
/// same number of units within one.
pub(crate) fn one_grid(units: usize, cap: u32) -> (u32, u32, u32) {
    let warps_cap = (cap as usize * ONE_WARPS).max(1);
    let per_warp = units.div_ceil(warps_cap).max(1);
    let warps = units.div_ceil(per_warp);
    (warps.div_ceil(ONE_WARPS) as u32, 1, 1)
}

/// Rows a q8cta.cu block forms at once (`CTA_GROUP`).
pub(crate) const CTA_GROUP: usize = 16;

/// Threads (one a 16-byte piece of a row's codes, in whole warps) and
/// dynamic shared memory (the stash: two buffers of [`CTA_GROUP`] rows of
/// a float pair a block, rows an odd number of pairs apart) of a q8cta.cu
/// block over rows `cols` wide in `fmt` (`cta_stride` in the kernels).
pub(crate) fn cta_block_shape(fmt: QuantFormat, cols: usize) -> (u32, u32) {
    let blocks = cols / 32;
    let pieces = blocks * if fmt == QuantFormat::Q8_0 { 2 } else { 1 };
    let threads = pieces.div_ceil(32).max(1) * 32;
    let stride = if blocks % 2 == 1 { blocks } else { blocks + 1 };
    (threads as u32, (2 * CTA_GROUP * stride * 8) as u32)
}

/// Grid of a q8cta.cu launch over `groups` row groups: no more blocks than
/// `cap`, and every block given the same number of groups within one.
pub(crate) fn cta_grid(groups: usize, cap: u32) -> (u32, u32, u32) {
    let per_block = groups.div_ceil((cap as usize).max(1)).max(1);
    (groups.div_ceil(per_block) as u32, 1, 1)
}

impl Q8Set {
    fn load(m: &Modules, fmt: QuantFormat, order: &str, sms: u32) -> Result<Q8Set, CudaError> {
        let f = |name: String| kernel(m, &name);
        let n = fmt.name();
        let kind = one_token_kernels(fmt);
        let wide = wide_kernels(std::env::var("TURBOSPARK_CUDA_WIDE").ok().as_deref());
        let with_cap = |name: String| -> Result<OneKernel, CudaError> {
            Ok(OneKernel::new(f(name)?, kind, sms))
        };
        // q8one.cu's names, or q8cta.cu's (a `c` after the `1`).
        let c = if kind == OneKind::Cta { "c" } else { "" };
        let one = match kind {
            OneKind::None => None,
            OneKind::Rows | OneKind::Cta => Some(OneSet {
                matmul: Some(with_cap(format!("matmul1{c}_q8x_{n}"))?),
                matmul_wide: match (kind, fmt) {
                    (OneKind::Rows, QuantFormat::Q8_0) if wide.1 => ONE_WIDE_WIDTHS
                        .iter()
                        .map(|&w| Ok((w, with_cap(format!("matmul1_q8x_{n}_w{w}"))?)))
                        .collect::<Result<_, CudaError>>()?,
                    _ => Vec::new(),
                },
                router: match fmt {
                    QuantFormat::Q8_0 => Some(with_cap(format!("router1{c}_q8x_{n}"))?),
                    _ => None,
                },
                qkv_rope: match (kind, fmt) {
                    (OneKind::Rows, QuantFormat::Q8_0)
                        if qkv_rope(std::env::var("TURBOSPARK_CUDA_QKV_ROPE").ok().as_deref()) =>
                    {
                        let mut ks = vec![(0, with_cap("matmul1_q8x_q8_0_rope".into())?)];
                        if wide.1 {
                            let name = format!("matmul1_q8x_q8_0_rope_w{QKV_ROPE_WIDTH}");
                            ks.push((QKV_ROPE_WIDTH, with_cap(name)?));
                        }
                        ks
                    }
                    _ => Vec::new(),
                },
                gate_up: with_cap(format!("moe_gate_up1{c}_q8x_{n}"))?,
                down: with_cap(format!("moe_down1{c}_q8x_{n}"))?,
            }),
        };
        Ok(Q8Set {
            quantize: f(format!("quantize_q8_{order}"))?,
            matmul: f(format!("matmul_q8x_{n}"))?,
            route: RouteKernels::load(
                m,
                &format!("moe_gate_up_q8x_{n}"),
                &format!("moe_down_q8x_{n}"),
                fmt == QuantFormat::Mxfp4 && wide.0,
                early_gate_up(std::env::var("TURBOSPARK_CUDA_GATE_UP").ok().as_deref())
                    .then(|| format!("moe_gate_up_early_q8x_{n}"))
                    .as_deref(),
            )?,
            gate_up_grouped: f(format!("moe_gate_up_grouped_q8x_{n}"))?,
            down_grouped: f(format!("moe_down_grouped_q8x_{n}"))?,
            mq_matmul: f(format!("mq_matmul_{n}"))?,
            mq_gate_up: f(format!("mq_gate_up_{n}"))?,
            mq_down: f(format!("mq_down_{n}"))?,
            one,
            mma: match fmt {
                QuantFormat::Mxfp4
                    if mxfp4_tensor_cores(
                        std::env::var("TURBOSPARK_CUDA_MXFP4").ok().as_deref(),
                    ) =>
                {
                    Some(RouteKernels::load(
                        m,
                        &format!("moe_gate_up_mma_{n}"),
                        &format!("moe_down_mma_{n}"),
                        wide.0,
                        None,
                    )?)
                }
                _ => None,
            },
            mma1: match fmt {
                QuantFormat::Q8_0
                    if q8_tensor_cores(std::env::var("TURBOSPARK_CUDA_Q8").ok().as_deref()) =>
                {
                    let k = |c: usize| f(format!("matmul1_mma_{n}_c{c}"));
                    Some([k(1)?, k(2)?, k(3)?, k(4)?])
                }
                _ => None,
            },
        })
    }
}

/// [`Q8Set`]s of the formats that have them.
pub(crate) struct Q8Kernels {
    q8_0: Q8Set,
    mxfp4: Q8Set,
}

impl Q8Kernels {
    /// Both formats' kernels of module `m`, for a device of `sms`
    /// multiprocessors.
    pub(super) fn load(m: &Modules, sms: u32) -> Result<Q8Kernels, CudaError> {
        Ok(Q8Kernels {
            q8_0: Q8Set::load(m, QuantFormat::Q8_0, "natural", sms)?,
            mxfp4: Q8Set::load(m, QuantFormat::Mxfp4, "mxfp4", sms)?,
        })
    }

    pub(crate) fn get(&self, fmt: QuantFormat) -> Option<&Q8Set> {
        match fmt {
            QuantFormat::Q8_0 => Some(&self.q8_0),
            QuantFormat::Mxfp4 => Some(&self.mxfp4),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `TURBOSPARK_CUDA_ONE`: Q8_0 on the row kernels unless `0`, MXFP4
    /// only when asked (`all`); `cta` both on q8cta.cu's.
    #[test]
    fn one_token_kernel_choice_follows_the_setting() {
        use QuantFormat::{Mxfp4, Q8_0};
        let cases = [
            (None, OneKind::Rows, OneKind::None),
            (Some("0"), OneKind::None, OneKind::None),
            (Some("all"), OneKind::Rows, OneKind::Rows),
            (Some("cta"), OneKind::Cta, OneKind::Cta),
            (Some("something else"), OneKind::Rows, OneKind::None),
        ];
        for (setting, q8, mx) in cases {
            assert_eq!(one_kind(setting, Q8_0), q8, "{setting:?}, Q8_0");
            assert_eq!(one_kind(setting, Mxfp4), mx, "{setting:?}, MXFP4");
        }
    }

    /// `TURBOSPARK_CUDA_GATE_UP`: the early gate/up kernels unless `wait`.
    #[test]
    fn early_gate_up_follows_the_setting() {
        assert!(early_gate_up(Some("early")));
        assert!(early_gate_up(None));
        assert!(!early_gate_up(Some("wait")));
        assert!(!early_gate_up(Some(" wait ")));
    }

    /// `TURBOSPARK_CUDA_WIDE`: both unless `0` (none) or `experts`.
    #[test]
    fn wide_kernels_follow_the_setting() {
        assert_eq!(wide_kernels(None), (true, true));
        assert_eq!(wide_kernels(Some("1")), (true, true));
        assert_eq!(wide_kernels(Some(" 0")), (false, false));
        assert_eq!(wide_kernels(Some("experts")), (true, false));
    }

    /// `TURBOSPARK_CUDA_QKV_ROPE`: the joined q/k/v and rope launch only
    /// with `1`.
    #[test]
    fn qkv_rope_follows_the_setting() {
        assert!(!qkv_rope(None));
        assert!(qkv_rope(Some("1")));
        assert!(qkv_rope(Some(" 1 ")));
        assert!(!qkv_rope(Some("0")));
    }

    /// `TURBOSPARK_CUDA_MXFP4`: the tensor-core experts only with `mma`.
    #[test]
    fn mxfp4_tensor_cores_follow_the_setting() {
        assert!(!mxfp4_tensor_cores(None));
        assert!(mxfp4_tensor_cores(Some("mma")));
        assert!(mxfp4_tensor_cores(Some(" mma ")));
        assert!(!mxfp4_tensor_cores(Some("dp4a")));
    }

    /// A warp's chunks cover the row's (the last one maybe partial) with
    /// 8 warps; too wide rows, too many tiles, partial blocks: none.
    #[test]
    fn tensor_core_q8_products_take_their_chunks_by_width() {
        assert_eq!(mma1_chunks_a_warp(96, 1), Some(1)); // 1 chunk
        assert_eq!(mma1_chunks_a_warp(1024, 2), Some(1)); // 8 chunks
        assert_eq!(mma1_chunks_a_warp(1536, 4), Some(2)); // 12
        assert_eq!(mma1_chunks_a_warp(2880, 320), Some(3)); // 23
        assert_eq!(mma1_chunks_a_warp(4096, 180), Some(4)); // 32
        assert_eq!(mma1_chunks_a_warp(4128, 1), None);
        assert_eq!(mma1_chunks_a_warp(2880, 201_088 / 16), None);
        assert_eq!(mma1_chunks_a_warp(100, 1), None);
        assert_eq!(mma1_chunks_a_warp(0, 1), None);
    }

    /// `TURBOSPARK_CUDA_Q8`: one token's Q8_0 products on the tensor cores
    /// only with `mma`.
    #[test]
    fn q8_tensor_cores_follow_the_setting() {
        assert!(!q8_tensor_cores(None));
        assert!(q8_tensor_cores(Some(" mma")));
        assert!(!q8_tensor_cores(Some("rows")));
    }

    /// A q8one.cu grid covers every unit (warp w takes w, w + stride, …),
    /// stays within what the GPU holds at once, and gives every warp the
    /// same number of units within one.
    #[test]
    fn one_token_grids_cover_every_unit_within_the_cap() {
        for units in [1usize, 7, 37, 2880, 5120, 11520, 201_088] {
            for cap in [1u32, 132, 528, 660] {
                let (blocks, y, z) = one_grid(units, cap);
                assert_eq!((y, z), (1, 1));
                assert!(
                    blocks >= 1 && blocks <= cap.max(1),
                    "{units} units, cap {cap}: {blocks}"
                );
                let stride = blocks as usize * ONE_WARPS;
                let per_warp: Vec<usize> = (0..stride)
                    .map(|w| (w..units).step_by(stride).count())
                    .collect();
                assert_eq!(per_warp.iter().sum::<usize>(), units);
                // Warps past the last unit take none; the others differ by at most one.
                let busy = per_warp.iter().filter(|&&c| c > 0);
                let (lo, hi) = (busy.clone().min().unwrap(), busy.max().unwrap());
                assert!(hi - lo <= 1, "{units} units, cap {cap}");
            }
        }
    }

    /// A q8cta.cu grid covers every group (block b takes b, b + grid, …),
    /// stays within what the GPU holds at once, and gives every block the
    /// same number of groups within one.
    #[test]
    fn cta_grids_cover_every_group_within_the_cap() {
        for groups in [1usize, 7, 37, 180, 320, 1440, 12_568] {
            for cap in [1u32, 132, 528, 660] {
                let (blocks, y, z) = cta_grid(groups, cap);
                assert_eq!((y, z), (1, 1));
                assert!(
                    blocks >= 1 && blocks <= cap.max(1),
                    "{groups} groups, cap {cap}: {blocks}"
                );
                let per_block: Vec<usize> = (0..blocks as usize)
                    .map(|b| (b..groups).step_by(blocks as usize).count())
                    .collect();
                assert_eq!(per_block.iter().sum::<usize>(), groups);
                let (lo, hi) = (
                    per_block.iter().min().unwrap(),
                    per_block.iter().max().unwrap(),
                );
                assert!(*lo >= 1 && hi - lo <= 1, "{groups} groups, cap {cap}");
            }
        }
    }

    /// A thread a 16-byte piece of a row (Q8_0 blocks are two, MXFP4 one),
    /// whole warps; the stash two buffers of 16 rows of 8 bytes a block,
    /// rows an odd number of blocks apart (gpt-oss-20b's widths by hand).
    #[test]
    fn cta_blocks_have_a_thread_a_piece() {
        use QuantFormat::{Mxfp4, Q8_0};
        assert_eq!(cta_block_shape(Mxfp4, 2880), (96, 2 * 16 * 91 * 8));
        assert_eq!(cta_block_shape(Q8_0, 2880), (192, 2 * 16 * 91 * 8));
        assert_eq!(cta_block_shape(Q8_0, 4096), (256, 2 * 16 * 129 * 8));
        assert_eq!(cta_block_shape(Mxfp4, 4096), (128, 2 * 16 * 129 * 8));
        assert_eq!(cta_block_shape(Q8_0, 32), (32, 2 * 16 * 8));
        // The widest rows fit the block size the kernels are built for and
        // the 48 KiB of shared memory a launch gets without asking.
        for fmt in [Mxfp4, Q8_0] {
            let (threads, smem) = cta_block_shape(fmt, ONE_MAX_COLS);
            assert!(threads <= 256 && smem <= 48 << 10, "{fmt:?}");
        }
    }
}
