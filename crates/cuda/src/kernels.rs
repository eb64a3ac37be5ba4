//! The compiled kernels of one device, looked up once by name, and the
//! parameter structs passed to them by value (each mirrors a struct of
//! the CUDA source, field for field).

mod tc;

use tc::tc_setting;
pub(crate) use tc::{
    tc_align, tc_segments, FewWay, TcExperts, TcKernels, TC_BATCH_ROWS, TC_BATCH_THREADS,
    TC_BATCH_TOKENS, TC_CHUNK, TC_FEW_TOKENS, TC_ROW_WARPS,
};

use crate::fusion::MatGroup;
use crate::CudaError;
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use turbospark_backend::BackendError;
use turbospark_core::QuantFormat;

/// Kernel `name` of module `m`.
fn kernel(m: &Arc<CudaModule>, name: &str) -> Result<CudaFunction, CudaError> {
    m.load_function(name)
        .map_err(CudaError::driver("loading a kernel"))
}

/// One kernel per weight format, indexed by `QuantFormat::ALL` order
/// (the `F_*` ids of common.cuh).
pub(crate) struct PerFormat([CudaFunction; 12]);

impl PerFormat {
    fn load(m: &Arc<CudaModule>, prefix: &str) -> Result<PerFormat, CudaError> {
        let f = |fmt: QuantFormat| kernel(m, &format!("{prefix}_{}", fmt.name()));
        let all = QuantFormat::ALL;
        Ok(PerFormat([
            f(all[0])?,
            f(all[1])?,
            f(all[2])?,
            f(all[3])?,
            f(all[4])?,
            f(all[5])?,
            f(all[6])?,
            f(all[7])?,
            f(all[8])?,
            f(all[9])?,
            f(all[10])?,
            f(all[11])?,
        ]))
    }

    pub(crate) fn get(&self, fmt: QuantFormat) -> &CudaFunction {
        let i = QuantFormat::ALL
            .iter()
            .position(|&f| f == fmt)
            .unwrap_or_default();
        &self.0[i]
    }
}

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
/// is issued before the wait for the kernel before. Opt-in until measured
/// on a GPU.
fn q8_tensor_cores(setting: Option<&str>) -> bool {
    setting.map(str::trim) == Some("mma")
}

/// A pair of per-route gate/up and down kernels for rows of any width and,
/// where compiled, for rows [`WIDE_WIDTH`] wide (the width a compile-time
/// constant, `_w2880`: none with `TURBOSPARK_CUDA_WIDE=0`, see
/// [`wide_kernels`]).
pub(crate) struct RouteKernels {
    gate_up: CudaFunction,
    down: CudaFunction,
    wide: Option<(CudaFunction, CudaFunction)>,
}

impl RouteKernels {
    /// `{gate_up}` and `{down}`, and with `wide` also `{gate_up}_w2880`
    /// and `{down}_w2880`.
    fn load(
        m: &Arc<CudaModule>,
        gate_up: &str,
        down: &str,
        wide: bool,
    ) -> Result<RouteKernels, CudaError> {
        let f = |name: String| kernel(m, &name);
        Ok(RouteKernels {
            gate_up: f(gate_up.to_string())?,
            down: f(down.to_string())?,
            wide: match wide {
                true => Some((
                    f(format!("{gate_up}_w{WIDE_WIDTH}"))?,
                    f(format!("{down}_w{WIDE_WIDTH}"))?,
                )),
                false => None,
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
/// nibbles lane by lane. Opt-in until measured on a GPU.
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

impl OneSet {
    /// The one-token product kernel for rows `cols` wide, if any.
    pub(crate) fn matmul_for(&self, cols: usize) -> Option<&OneKernel> {
        self.matmul_wide
            .iter()
            .find(|(w, _)| *w == cols)
            .map(|(_, k)| k)
            .or(self.matmul.as_ref())
    }
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

/// Whether norms take the vector layout where it fits
/// (`TURBOSPARK_CUDA_NORM`, for A/B measurements): unless `strided`.
/// The two add a row's sum of squares (in f64) in different orders, so
/// their bits may differ in the last place of the scale, rarely.
fn vector_norm(setting: Option<&str>) -> bool {
    setting.map(str::trim) != Some("strided")
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
    fn load(
        m: &Arc<CudaModule>,
        fmt: QuantFormat,
        order: &str,
        sms: u32,
    ) -> Result<Q8Set, CudaError> {
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
    pub(crate) fn get(&self, fmt: QuantFormat) -> Option<&Q8Set> {
        match fmt {
            QuantFormat::Q8_0 => Some(&self.q8_0),
            QuantFormat::Mxfp4 => Some(&self.mxfp4),
            _ => None,
        }
    }
}

/// Every kernel of the module.
pub(crate) struct Kernels {
    pub matmul: PerFormat,
    pub embed: PerFormat,
    pub moe_gate_up: PerFormat,
    pub moe_down: PerFormat,
    pub moe_gate_up_grouped: PerFormat,
    pub moe_down_grouped: PerFormat,
    pub moe_group: CudaFunction,
    pub causal_conv1d_silu: CudaFunction,
    pub gated_delta_rule: CudaFunction,
    pub gated_delta_rule_chunked: CudaFunction,
    pub mul_sigmoid_rows: CudaFunction,
    pub head_plain: PerFormat,
    pub head_t: PerFormat,
    pub q8: Q8Kernels,
    pub split_rows: CudaFunction,
    pub add_bias: CudaFunction,
    pub add: CudaFunction,
    pub scale: CudaFunction,
    pub mul_sigmoid: CudaFunction,
    pub softcap: CudaFunction,
    pub glu: CudaFunction,
    pub rms_norm: CudaFunction,
    /// rms_norm for rows held 8 consecutive columns a thread (fusion.rs
    /// `norm_vec_fits`); none with `TURBOSPARK_CUDA_NORM=strided`
    /// ([`vector_norm`]).
    pub rms_norm_vec: Option<CudaFunction>,
    /// Tensor-core products in fast numerics (`kernels/tcmm.cu`); none
    /// with `TURBOSPARK_CUDA_BF16=generic` ([`tc_setting`]).
    pub tc: Option<TcKernels>,
    pub adjust_projection: CudaFunction,
    pub rope_kv: CudaFunction,
    pub kv_write_f32: CudaFunction,
    pub kv_write_f16: CudaFunction,
    pub widen_f16: CudaFunction,
    pub attention_f32: CudaFunction,
    pub attention_f16: CudaFunction,
    /// Prefill attention a block per (KV head, token) (`attention.cu`).
    pub attention_group_f32: CudaFunction,
    pub attention_group_f16: CudaFunction,
    /// One token's attention split over the keys, f16 cache, head width
    /// 64 and 128 (`attention.cu`, flash-decoding).
    pub attention_decode_f16_64: CudaFunction,
    pub attention_decode_f16_128: CudaFunction,
    pub route: CudaFunction,
    pub moe_combine: CudaFunction,
    /// Dynamic shared memory a block of the kernels that ask for more
    /// than the default 48 KiB (attention, the chunked delta rule) may use
    /// (bytes).
    pub dynamic_smem: usize,
}

impl Kernels {
    /// The kernels of a module's CUBIN (`nvrtc::compile`).
    pub(crate) fn load(ctx: &Arc<CudaContext>, cubin: Vec<u8>) -> Result<Kernels, CudaError> {
        let m = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(CudaError::driver("loading the kernel module"))?;
        let f = |name: &str| kernel(&m, name);
        let attention_f32 = f("attention_f32")?;
        let attention_f16 = f("attention_f16")?;
        let attention_group_f32 = f("attention_group_f32")?;
        let attention_group_f16 = f("attention_group_f16")?;
        let gated_delta_rule_chunked = f("gated_delta_rule_chunked")?;
        // Attention keeps a query's scores in shared memory, the chunked
        // delta rule a chunk's keys, queries and products: allow the
        // device's whole opt-in amount.
        let optin = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(CudaError::driver("reading the shared-memory limit"))?;
        let dynamic_smem = (optin.max(48 * 1024) - 1024) as usize;
        let sms =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(CudaError::driver("reading the multiprocessor count"))? as u32;
        for k in [
            &attention_f32,
            &attention_f16,
            &attention_group_f32,
            &attention_group_f16,
            &gated_delta_rule_chunked,
        ] {
            k.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dynamic_smem as i32,
            )
            .map_err(CudaError::driver("raising a kernel's shared memory"))?;
        }
        Ok(Kernels {
            matmul: PerFormat::load(&m, "matmul")?,
            embed: PerFormat::load(&m, "embed")?,
            moe_gate_up: PerFormat::load(&m, "moe_gate_up")?,
            moe_down: PerFormat::load(&m, "moe_down")?,
            moe_gate_up_grouped: PerFormat::load(&m, "moe_gate_up_grouped")?,
            moe_down_grouped: PerFormat::load(&m, "moe_down_grouped")?,
            moe_group: f("moe_group")?,
            causal_conv1d_silu: f("causal_conv1d_silu")?,
            gated_delta_rule: f("gated_delta_rule")?,
            gated_delta_rule_chunked,
            mul_sigmoid_rows: f("mul_sigmoid_rows")?,
            head_plain: PerFormat::load(&m, "head_plain")?,
            head_t: PerFormat::load(&m, "head_t")?,
            q8: Q8Kernels {
                q8_0: Q8Set::load(&m, QuantFormat::Q8_0, "natural", sms)?,
                mxfp4: Q8Set::load(&m, QuantFormat::Mxfp4, "mxfp4", sms)?,
            },
            split_rows: f("split_rows")?,
            add_bias: f("add_bias")?,
            add: f("add")?,
            scale: f("scale")?,
            mul_sigmoid: f("mul_sigmoid")?,
            softcap: f("softcap")?,
            glu: f("glu")?,
            rms_norm: f("rms_norm")?,
            rms_norm_vec: match vector_norm(std::env::var("TURBOSPARK_CUDA_NORM").ok().as_deref()) {
                true => Some(f("rms_norm_vec")?),
                false => None,
            },
            tc: match tc_setting(std::env::var("TURBOSPARK_CUDA_BF16").ok().as_deref()) {
                Some((pick, formats)) => Some(TcKernels::load(&m, pick, formats)?),
                None => None,
            },
            adjust_projection: f("adjust_projection")?,
            rope_kv: f("rope_kv")?,
            kv_write_f32: f("kv_write_f32")?,
            kv_write_f16: f("kv_write_f16")?,
            widen_f16: f("widen_f16")?,
            attention_f32,
            attention_f16,
            attention_group_f32,
            attention_group_f16,
            attention_decode_f16_64: f("attention_decode_f16_64")?,
            attention_decode_f16_128: f("attention_decode_f16_128")?,
            route: f("route")?,
            moe_combine: f("moe_combine")?,
            dynamic_smem,
        })
    }
}

/// Pointers to a launch's arguments, in the kernel's parameter order.
/// Each argument must be a place (a local or a field: `addr_of!` refuses
/// a temporary at compile time) that outlives the launch call — the
/// compiler does not check that for raw pointers: an array built in a
/// `match` arm from that arm's bindings and launched after it points at
/// dead values (a kernel then reads garbage: seen as an illegal address).
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        [$(std::ptr::addr_of!($a) as *mut std::ffi::c_void),*]
    };
}
pub(crate) use args;

/// Launches `f` on `stream` with a 1-D block of `block` threads.
pub(crate) fn launch(
    op: &'static str,
    f: &CudaFunction,
    stream: &CudaStream,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    args: &mut [*mut c_void],
) -> Result<(), BackendError> {
    if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
        return Ok(());
    }
    if dependent_launch() {
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue { pad: [0; 64] },
        };
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: as below; `config` and the attribute it points at live
        // until the call returns.
        return unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(crate::memory::runtime(op));
    }
    // SAFETY: `args` point at values of the kernel's parameter types (each
    // call site passes them in the order of the kernel's signature, with
    // the `#[repr(C)]` mirrors below for structs), alive until the launch
    // has copied them; every device pointer among them was checked by the
    // op to cover what the kernel reads and writes.
    unsafe {
        result::launch_kernel(
            f.cu_function(),
            grid,
            (block, 1, 1),
            smem,
            stream.cu_stream(),
            args,
        )
    }
    .map_err(crate::memory::runtime(op))
}

/// Whether kernels are launched as programmatic dependents of the kernel
/// before them (common.cuh `KERNEL_ENTRY`): on when every GPU this process
/// opened is sm_90 or later (the kernels then hold `griddepcontrol`), unless
/// `TURBOSPARK_CUDA_PDL=0`. Per process, as the kernel cache is.
static DEPENDENT_LAUNCH: AtomicU8 = AtomicU8::new(PDL_UNSET);
const PDL_UNSET: u8 = 0;
const PDL_ON: u8 = 1;
const PDL_OFF: u8 = 2;

fn dependent_launch() -> bool {
    DEPENDENT_LAUNCH.load(Ordering::Relaxed) == PDL_ON
}

/// Records a GPU of compute capability `major` opened by this process.
pub(crate) fn note_device(major: i32) {
    let off = major < 9 || std::env::var("TURBOSPARK_CUDA_PDL").is_ok_and(|v| v == "0");
    if off {
        DEPENDENT_LAUNCH.store(PDL_OFF, Ordering::Relaxed);
    } else {
        let _ = DEPENDENT_LAUNCH.compare_exchange(
            PDL_UNSET,
            PDL_ON,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
}

/// Threads of an element-wise (grid-stride) kernel's block.
pub(crate) const ELEMENTWISE_THREADS: u32 = 256;

/// Launches the grid-stride kernel `f` over `n` elements, in blocks of
/// [`ELEMENTWISE_THREADS`].
pub(crate) fn launch_elementwise(
    op: &'static str,
    f: &CudaFunction,
    stream: &CudaStream,
    n: usize,
    args: &mut [*mut c_void],
) -> Result<(), BackendError> {
    let threads = ELEMENTWISE_THREADS;
    launch(op, f, stream, blocks_for(n, threads), threads, 0, args)
}

/// Blocks of `threads` for a grid-stride loop over `n` elements.
pub(crate) fn blocks_for(n: usize, threads: u32) -> (u32, u32, u32) {
    let b = n.div_ceil(threads as usize).clamp(1, 65535 * 8) as u32;
    (if n == 0 { 0 } else { b }, 1, 1)
}

/// Tokens per chunk, state columns per block and threads per block of
/// `gated_delta_rule_chunked` (`DN_CHUNK`, `DN_BV`, `DN_THREADS` in
/// `kernels/deltanet.cu`).
pub(crate) const DN_CHUNK: usize = 64;
pub(crate) const DN_BV: usize = 32;
pub(crate) const DN_THREADS: u32 = 256;
/// Calls of at least this many tokens run the chunked delta rule: the
/// CPU backend's threshold (measured there, not yet on a GPU).
pub(crate) const DELTA_CHUNKED_MIN_TOKENS: usize = 4;

/// Dynamic shared memory (bytes) of a `gated_delta_rule_chunked` block for
/// key heads of `dk`: the layout the kernel's comment lists.
pub(crate) const fn gated_delta_rule_chunked_smem(dk: usize) -> usize {
    let floats = 2 * DN_CHUNK * (dk + 1)
        + dk * DN_BV
        + 2 * DN_CHUNK * DN_BV
        + 2 * DN_CHUNK * (DN_CHUNK + 1)
        + 5 * DN_CHUNK;
    floats * 4
}

pub(crate) const MAX_ROPE_PAIRS: usize = 256;
/// Most query heads a KV head serves in `attention_group_*` and
/// `attention_decode_*`.
pub(crate) const ATTN_MAX_GROUP: usize = 8;
/// Keys a split of `attention_decode_*` is sized for by default (a KV
/// head's splits: the cache's keys over this, at most
/// [`DECODE_MAX_SPLITS`]; `TURBOSPARK_CUDA_SPLIT_KEYS`, see
/// [`decode_split_keys`]): one tile. 128 until 2026-12-04; with 32, tg128
/// after a 512-token prompt went 595–600 → 622–624 tok/s on an H200, the
/// gpt-oss-20b shape (a 640-row cache: the 128-key sliding windows in 4
/// splits instead of 1, the full layers in 16 instead of 5; BENCHMARKS.md,
/// eighteenth session).
pub(crate) const DECODE_KEYS_A_BLOCK: usize = 32;
/// Threads of an `attention_decode_*` block (`DEC_WARPS` warps: a warp a
/// query head of the group and key group, two or more key groups).
pub(crate) const DECODE_THREADS: u32 = 512;
/// (`DEC_MAX_SPLITS` in `kernels/attention.cu`: the finishing block loads
/// that many splits' partials at once.)
pub(crate) const DECODE_MAX_SPLITS: usize = 16;

/// Splits of one token's attention over a cache of `capacity` rows
/// (`window`: a sliding layer's), from the cache alone so that a
/// position's bits do not depend on whether the step is recorded: enough
/// blocks that each takes `keys_a_split` keys, at most
/// [`DECODE_MAX_SPLITS`].
pub(crate) fn decode_splits(capacity: usize, window: Option<usize>, keys_a_split: usize) -> usize {
    let keys = window.map_or(capacity, |w| w.min(capacity));
    keys.div_ceil(keys_a_split.max(1))
        .clamp(1, DECODE_MAX_SPLITS)
}

/// Keys a decode attention split is sized for: `TURBOSPARK_CUDA_SPLIT_KEYS`
/// when it is a positive multiple of 32 (the kernel's tile), else
/// [`DECODE_KEYS_A_BLOCK`]. Fewer keys a split give more blocks a KV head
/// and fewer tiles each warp walks in turn; the split changes the sums'
/// order, so a setting's bits are its own (for A/B measurements: on an
/// H200 with 128 keys a split, a 128-key sliding window was one split, 16
/// warps walking two tiles each, 12.9 µs at depth against 5.3 µs for a few
/// keys — BENCHMARKS.md, seventeenth session).
pub(crate) fn decode_split_keys(setting: Option<&str>) -> usize {
    setting
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&k| k > 0 && k % 32 == 0)
        .unwrap_or(DECODE_KEYS_A_BLOCK)
}
/// Most past inputs a convolution state holds (`CONV_MAX_PAST`).
pub(crate) const CONV_MAX_PAST: usize = 16;
pub(crate) const MAX_EMBED_TOKENS: usize = 256;
pub(crate) const MAX_ROUTE_EXPERTS: usize = 512;
pub(crate) const MAX_TOP_K: usize = 32;
pub(crate) const MAX_GROUPS: usize = 64;
/// Rows per block of the matmul and MoE kernels (`MM_WARPS`).
pub(crate) const MM_WARPS: usize = 8;
/// Tokens per block of the matmul kernel (`MM_TOKENS`).
pub(crate) const MM_TOKENS: usize = 4;
/// Rows and threads per block of the fast matrix-vector kernels
/// (`Q8_BLOCK_ROWS`, `Q8_WARPS` in `kernels/q8dot.cu`).
pub(crate) const Q8_BLOCK_ROWS: usize = 4;
pub(crate) const Q8_THREADS: u32 = 128;
/// Threads, rows and tokens of a tensor-core tile (`kernels/mmq.cu`;
/// gate/up tiles hold MQ_BM / 2 rows of each).
pub(crate) const MQ_THREADS: u32 = 256;
pub(crate) const MQ_BM: usize = 64;
pub(crate) const MQ_BN: usize = 64;
/// Batches from which the tensor-core kernels take over (the same bits
/// either way; only speed decides).
pub(crate) const MMQ_MIN_TOKENS: usize = 16;

/// Most tensors (and cache writes) one `rope_kv` launch takes
/// (`ROPE_KV_MAX`).
pub(crate) const ROPE_KV_MAX: usize = 2;

/// Mirror of `RopeKvParams` in `kernels/elementwise.cu`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq)]
pub(crate) struct RopeKvParams {
    pub x: [u64; ROPE_KV_MAX],
    pub cache: [u64; ROPE_KV_MAX],
    pub src: [u64; ROPE_KV_MAX],
    pub heads: [i32; ROPE_KV_MAX],
    pub row_len: [i32; ROPE_KV_MAX],
    pub capacity: [i32; ROPE_KV_MAX],
    pub f16: [i32; ROPE_KV_MAX],
    pub roped: [i32; ROPE_KV_MAX],
    pub n_x: i32,
    pub n_w: i32,
    pub n_tokens: i32,
    pub head_dim: i32,
    pub first_pos: i32,
}

#[repr(C)]
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct RopeParams {
    pub inv_freq: [f32; MAX_ROPE_PAIRS],
    pub attention_factor: f32,
    pub pairs: i32,
    pub kind: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct HeadParams {
    pub n_tokens: i32,
    pub n_heads: i32,
    pub head_stride: i32,
    pub first_row: i32,
    pub rows: i32,
    pub x_stride: i32,
    pub x_at: i32,
    pub out_stride: i32,
    pub out_at: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct EmbedTokens {
    pub ids: [u32; MAX_EMBED_TOKENS],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct AttnParams {
    pub first_pos: i32,
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    pub capacity: i32,
    pub window: i32,
    pub scale: f32,
    pub softcap: f32,
    pub has_sinks: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RouterParams {
    pub kind: i32,
    pub num_experts: i32,
    pub top_k: i32,
    pub renormalize: i32,
    pub n_group: i32,
    pub topk_group: i32,
    pub scaling: f32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct BankView {
    pub gate: u64,
    pub up: u64,
    pub down: u64,
    pub gate_bias: u64,
    pub up_bias: u64,
    pub down_bias: u64,
    pub gate_row_bytes: i64,
    pub up_row_bytes: i64,
    pub down_row_bytes: i64,
    pub hidden: i32,
    pub inter: i32,
    pub slots: i32,
}

pub(crate) const MAX_MASK_SLOTS: usize = 512;

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct SlotMask {
    pub bits: [u32; MAX_MASK_SLOTS / 32],
    pub on: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MoeAct {
    pub act: i32,
    pub alpha: f32,
    pub limit: f32,
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

    /// `TURBOSPARK_CUDA_WIDE`: both unless `0` (none) or `experts`.
    #[test]
    fn wide_kernels_follow_the_setting() {
        assert_eq!(wide_kernels(None), (true, true));
        assert_eq!(wide_kernels(Some("1")), (true, true));
        assert_eq!(wide_kernels(Some(" 0")), (false, false));
        assert_eq!(wide_kernels(Some("experts")), (true, false));
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

    /// `TURBOSPARK_CUDA_NORM`: the vector layout unless `strided`.
    #[test]
    fn norm_layout_follows_the_setting() {
        assert!(vector_norm(None));
        assert!(vector_norm(Some("vec")));
        assert!(!vector_norm(Some(" strided")));
    }

    /// `TURBOSPARK_CUDA_SPLIT_KEYS`: a positive multiple of 32, else the
    /// default; splits are the keys over it, at least 1 and at most
    /// `DECODE_MAX_SPLITS`, a window bounding the keys.
    #[test]
    fn decode_splits_follow_the_keys_a_split() {
        for (setting, keys) in [
            (None, DECODE_KEYS_A_BLOCK),
            (Some("64"), 64),
            (Some(" 32 "), 32),
            (Some("0"), DECODE_KEYS_A_BLOCK),
            (Some("48"), DECODE_KEYS_A_BLOCK),
            (Some("many"), DECODE_KEYS_A_BLOCK),
        ] {
            assert_eq!(decode_split_keys(setting), keys, "{setting:?}");
        }
        // A 128-key sliding window in a 640-row cache; the whole cache.
        assert_eq!(decode_splits(640, Some(128), 128), 1);
        assert_eq!(decode_splits(640, Some(128), 64), 2);
        assert_eq!(decode_splits(640, None, 128), 5);
        assert_eq!(decode_splits(640, None, 64), 10);
        assert_eq!(decode_splits(640, None, 32), DECODE_MAX_SPLITS);
        assert_eq!(decode_splits(10, None, 64), 1);
        assert_eq!(decode_splits(100, Some(4096), 64), 2);
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
