//! The compiled kernels of one device, looked up once by name, and the
//! parameter structs passed to them by value (each mirrors a struct of
//! the CUDA source, field for field). The kernel families with settings
//! and launch shapes of their own live beside it: `q8` (the 8-bit
//! activation products of Q8_0 and MXFP4), `tc` (the tensor-core
//! products of every other format) and `kq` (the opt-in 8-bit activation
//! products of the K-quants and legacy 4- and 5-bit formats).

pub(crate) mod kq;
pub(crate) mod q8;
pub(crate) mod tc;

use kq::kq_setting;
pub(crate) use kq::{kq_fits, KqKernels, KqSet};

pub(crate) use q8::{
    OneKernel, OneWork, Q8Kernels, Q8Set, MMA_GU_ROWS, MMA_GU_THREADS, MMA_MAX_COLS, MMA_Q8_WARPS,
    MMA_ROWS, MMA_THREADS, ONE_MAX_COLS,
};
use tc::tc_setting;
pub(crate) use tc::{
    tc_aligned, tc_segments, FewWay, TcExperts, TcKernels, TcStreamed, TC_BATCH_ROWS,
    TC_BATCH_THREADS, TC_BATCH_TOKENS, TC_CHUNK, TC_FEW_TOKENS, TC_ROW_WARPS,
};

use crate::CudaError;
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use turbospark_backend::BackendError;
use turbospark_core::QuantFormat;

/// The loaded modules of the kernel programs (nvrtc.rs `PROGRAMS`), each
/// holding the kernels of some source files.
pub(crate) struct Modules(Vec<Arc<CudaModule>>);

impl Modules {
    /// Every program's CUBIN loaded into `ctx`.
    pub(crate) fn load(ctx: &Arc<CudaContext>, cubins: Vec<Vec<u8>>) -> Result<Modules, CudaError> {
        cubins
            .into_iter()
            .map(|cubin| {
                ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
                    .map_err(CudaError::driver("loading a kernel module"))
            })
            .collect::<Result<_, _>>()
            .map(Modules)
    }
}

/// The kernel `name`, from whichever module holds it (exactly one does).
fn kernel(m: &Modules, name: &str) -> Result<CudaFunction, CudaError> {
    for module in &m.0 {
        match module.load_function(name) {
            Ok(f) => return Ok(f),
            // Not in this module: in another.
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_FOUND => {}
            Err(e) => return Err(CudaError::driver("loading a kernel")(e)),
        }
    }
    Err(CudaError::MissingKernel {
        name: name.to_string(),
        modules: m.0.len(),
    })
}

/// One kernel per weight format, indexed by `QuantFormat::ALL` order
/// (the `F_*` ids of common.cuh).
pub(crate) struct PerFormat([CudaFunction; 12]);

impl PerFormat {
    fn load(m: &Modules, prefix: &str) -> Result<PerFormat, CudaError> {
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

/// Whether norms take the vector layout where it fits
/// (`TURBOSPARK_CUDA_NORM`, for A/B measurements): unless `strided`.
/// The two add a row's sum of squares (in f64) in different orders, so
/// their bits may differ in the last place of the scale, rarely.
fn vector_norm(setting: Option<&str>) -> bool {
    setting.map(str::trim) != Some("strided")
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
    /// Q4_K, Q6_K, Q4_0, Q4_1, Q5_0 and Q5_1 products against 8-bit
    /// activations (`kernels/kq.cu`); none with `TURBOSPARK_CUDA_KQ=tc`
    /// ([`kq_setting`]).
    pub kq: Option<KqKernels>,
    pub adjust_projection: CudaFunction,
    pub rope_kv: CudaFunction,
    pub kv_write_f32: CudaFunction,
    pub kv_write_f16: CudaFunction,
    pub widen_f16: CudaFunction,
    pub attention_f32: CudaFunction,
    pub attention_f16: CudaFunction,
    /// The same past the shared memory of their scores, the keys taken
    /// [`ATTN_LONG_CHUNK`] at a time to the same bits (`attention.cu`).
    pub attention_long_f32: CudaFunction,
    pub attention_long_f16: CudaFunction,
    /// Prefill attention a block per (KV head, token) (`attention.cu`).
    pub attention_group_f32: CudaFunction,
    pub attention_group_f16: CudaFunction,
    /// One token's attention split over the keys, f16 cache, head width
    /// 64 and 128 (`attention.cu`, flash-decoding).
    pub attention_decode_f16_64: CudaFunction,
    pub attention_decode_f16_128: CudaFunction,
    /// The same with each warp's key rows staged in shared memory, loaded
    /// coalesced (the same bits; taken where
    /// [`DecodeAttention::split_form_for`] says, with
    /// [`DECODE_STAGE_BYTES`] of dynamic shared memory).
    pub attention_decode_staged_f16_64: CudaFunction,
    pub attention_decode_staged_f16_128: CudaFunction,
    /// A batch's attention on the tensor cores, f16 cache, heads 64 and
    /// 128 wide (`attention_tc.cu`; taken under [`prefill_attention_tc`]).
    pub attention_prefill_tc_f16_64: CudaFunction,
    pub attention_prefill_tc_f16_128: CudaFunction,
    /// One token's attention on the tensor cores over long caches, f16,
    /// heads 64 and 128 wide (`attention_dec.cu`; taken under
    /// [`DecodeAttention`]).
    pub attention_decode_tc_f16_64: CudaFunction,
    pub attention_decode_tc_f16_128: CudaFunction,
    /// The GPU's multiprocessors.
    pub sms: usize,
    pub route: CudaFunction,
    pub moe_combine: CudaFunction,
    /// Dynamic shared memory a block of the kernels that ask for more
    /// than the default 48 KiB (attention, the chunked delta rule) may use
    /// (bytes).
    pub dynamic_smem: usize,
}

impl Kernels {
    /// The kernels of the programs' CUBINs (`nvrtc::compile`), in `ctx`.
    pub(crate) fn load(ctx: &Arc<CudaContext>, cubins: Vec<Vec<u8>>) -> Result<Kernels, CudaError> {
        let m = Modules::load(ctx, cubins)?;
        let f = |name: &str| kernel(&m, name);
        let optin = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(CudaError::driver("reading the shared-memory limit"))?
            .max(0) as usize;
        let dynamic_smem = whole_optin_dynamic_smem(optin);
        let sms =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(CudaError::driver("reading the multiprocessor count"))? as u32;
        let allow_dynamic_smem = |k: &CudaFunction, bytes: usize| {
            k.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(CudaError::driver("raising a kernel's shared memory"))
        };
        for (name, bytes) in dynamic_shared_requests(optin) {
            allow_dynamic_smem(&f(name)?, bytes)?;
        }
        // The knockout switch's stand-in for the launches it hollows, which
        // takes any of their dynamic shared memory (only when asked for).
        if crate::knockout::hollows() {
            let hollow = f("hollow_step")?;
            allow_dynamic_smem(&hollow, dynamic_smem)?;
            crate::knockout::register_hollow(ctx, hollow);
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
            gated_delta_rule_chunked: f("gated_delta_rule_chunked")?,
            mul_sigmoid_rows: f("mul_sigmoid_rows")?,
            head_plain: PerFormat::load(&m, "head_plain")?,
            head_t: PerFormat::load(&m, "head_t")?,
            q8: Q8Kernels::load(&m, sms)?,
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
                Some((pick, formats, route_join)) => {
                    Some(TcKernels::load(&m, pick, formats, route_join, sms, optin)?)
                }
                None => None,
            },
            kq: match kq_setting(std::env::var("TURBOSPARK_CUDA_KQ").ok().as_deref()) {
                true => Some(KqKernels::load(&m)?),
                false => None,
            },
            adjust_projection: f("adjust_projection")?,
            rope_kv: f("rope_kv")?,
            kv_write_f32: f("kv_write_f32")?,
            kv_write_f16: f("kv_write_f16")?,
            widen_f16: f("widen_f16")?,
            attention_f32: f("attention_f32")?,
            attention_f16: f("attention_f16")?,
            attention_long_f32: f("attention_long_f32")?,
            attention_long_f16: f("attention_long_f16")?,
            attention_group_f32: f("attention_group_f32")?,
            attention_group_f16: f("attention_group_f16")?,
            attention_decode_f16_64: f("attention_decode_f16_64")?,
            attention_decode_f16_128: f("attention_decode_f16_128")?,
            attention_decode_staged_f16_64: f("attention_decode_staged_f16_64")?,
            attention_decode_staged_f16_128: f("attention_decode_staged_f16_128")?,
            attention_prefill_tc_f16_64: f("attention_prefill_tc_f16_64")?,
            attention_prefill_tc_f16_128: f("attention_prefill_tc_f16_128")?,
            attention_decode_tc_f16_64: f("attention_decode_tc_f16_64")?,
            attention_decode_tc_f16_128: f("attention_decode_tc_f16_128")?,
            sms: sms as usize,
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
    // (The knockout switch, a measurement: a launch left out, or a hollow
    // step launched in its place with no arguments.)
    let hollow;
    let mut no_args: [*mut c_void; 0] = [];
    let (f, args) = match crate::knockout::knock(f, stream) {
        crate::knockout::Knock::Run => (f, args),
        crate::knockout::Knock::Skip => return Ok(()),
        crate::knockout::Knock::Hollow(h) => {
            hollow = h;
            (&hollow, &mut no_args[..])
        }
    };
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
    // the `#[repr(C)]` mirrors below for structs; a hollow step takes
    // none and is given none), alive until the launch
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

/// Keys a chunk of the long attention kernels (`attention_long_*`) takes:
/// with the query, 32 KiB and up of shared memory (under the 48 KiB every
/// kernel may use), a multiple of their 128 threads.
pub(crate) const ATTN_LONG_CHUNK: usize = 8192;
/// Widest heads the long attention kernels take (`ATTN_LONG_MAX_DIM`).
pub(crate) const ATTN_LONG_MAX_DIM: usize = 512;
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
/// Dynamic shared memory of an `attention_decode_staged_*` block
/// (`DEC_STAGE_BYTES`: a warp's 32 key rows of 64 dimensions, each row
/// 16 bytes longer).
pub(crate) const DECODE_STAGE_BYTES: u32 = 16 * 32 * 9 * 16;

/// The dynamic shared memory (bytes) allowed the kernels whose blocks may
/// take all a block can opt in to (`optin`, the device's
/// `MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`, at least the default 48 KiB): all
/// of it but 1 KiB, their static shared memory's room.
pub fn whole_optin_dynamic_smem(optin: usize) -> usize {
    optin.max(48 * 1024) - 1024
}

/// The kernels `Kernels::load` allows more dynamic shared memory than the
/// default 48 KiB, with the bytes each, on a device whose blocks opt in
/// to `optin`: attention keeps a query's scores there and the chunked
/// delta rule a chunk's keys, queries and products (the whole amount,
/// `whole_optin_dynamic_smem`), and the staged decode attention a
/// warp's key rows (`DECODE_STAGE_BYTES`). The driver refuses a request
/// that, with the kernel's static shared memory, passes `optin`; the
/// `kernels_compile` test checks each against its CUBIN's static shared
/// memory for sm_80 and sm_90, no GPU needed.
pub fn dynamic_shared_requests(optin: usize) -> [(&'static str, usize); 7] {
    let whole = whole_optin_dynamic_smem(optin);
    [
        ("attention_f32", whole),
        ("attention_f16", whole),
        ("attention_group_f32", whole),
        ("attention_group_f16", whole),
        ("gated_delta_rule_chunked", whole),
        (
            "attention_decode_staged_f16_64",
            DECODE_STAGE_BYTES as usize,
        ),
        (
            "attention_decode_staged_f16_128",
            DECODE_STAGE_BYTES as usize,
        ),
    ]
}
/// (`DEC_MAX_SPLITS` in `kernels/attention.cu`: the finishing block loads
/// that many splits' partials at once.)
pub(crate) const DECODE_MAX_SPLITS: usize = 16;

/// Most splits of `attention_decode_tc_*` (its finishing block adds
/// them [`DECODE_MAX_SPLITS`] at a time).
pub(crate) const DECODE_TC_MAX_SPLITS: usize = 64;
/// Threads of an `attention_decode_tc_*` block (`DT_WARPS` warps).
pub(crate) const DECODE_TC_THREADS: u32 = 256;

/// Which kernel takes one token's attention over an f16 cache (fast
/// numerics): `attention_decode_*` (attention.cu: a warp a query head,
/// tuned for short caches) or `attention_decode_tc_*` (attention_dec.cu:
/// each key read once for the group's heads, on the tensor cores), and how
/// its splits are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DecodeAttention {
    /// Layers whose keys (the cache's rows, or the window) number at least
    /// this take the tensor cores (`usize::MAX`: never, 0: always).
    pub tc_from_keys: usize,
    /// Keys a tensor-core split takes at least.
    pub tc_keys_a_split: usize,
    /// Blocks a tensor-core launch is sized for at most (its KV heads ×
    /// splits): enough to fill the GPU, while each split more is a partial
    /// more for the finishing block to add.
    pub tc_blocks: usize,
    /// The split kernel's form where the tensor cores do not take the
    /// layer (every form gives the same bits), when a setting picks one;
    /// else by the heads' width ([`Self::split_form_for`]).
    pub split_form: Option<SplitForm>,
}

/// How the split decode attention (`attention.cu` `attention_decode_impl`)
/// gets its key and value rows; every form computes the same sums in the
/// same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SplitForm {
    /// Each lane loads its key's row, after the kernel waits for the one
    /// before (the older rows fetched into the L2 before it waits).
    Plain,
    /// Each warp copies its tile's key rows coalesced into shared memory
    /// first (`attention_decode_staged_*`, [`DECODE_STAGE_BYTES`]).
    Staged,
}

impl DecodeAttention {
    /// Caches of at least this many keys take the tensor cores by default.
    /// Below it the split kernel stays: at 640 keys (tg128 @ d512, H100)
    /// the tensor cores were 0.9 % faster at 128 keys a split and 0.5 %
    /// slower at 256, not worth other bits at short caches (BENCHMARKS.md,
    /// forty-fourth session).
    pub const TC_FROM_KEYS: usize = 4096;
    /// Keys a tensor-core split takes at least by default: 2 tiles a warp,
    /// the blocks' cap deciding past ~4k keys (8 KV heads). On an H100
    /// (gpt-oss-20b shape) tg32 @ d4096 was 614.7 tok/s with 256 against
    /// 584.7 with 2048 keys a split, @ d16384 567.8 against 557.7, and @
    /// d60000 481.6 against 483.4 (BENCHMARKS.md, forty-third session).
    pub const TC_KEYS_A_SPLIT: usize = 256;
    /// Blocks by default, a multiple of the multiprocessors: 2 (what an SM
    /// holds of the 64-wide kernel).
    pub const TC_BLOCKS_AN_SM: usize = 2;

    /// From `TURBOSPARK_CUDA_DECODE_ATTN` (`scalar`, `tc`, or `staged` /
    /// `unstaged`: the default's choice with the split kernel in that form
    /// at every head width, or the default by the cache's keys),
    /// `TURBOSPARK_CUDA_TC_SPLIT_KEYS` (a positive multiple of 16) and
    /// `TURBOSPARK_CUDA_TC_BLOCKS` (positive), on a GPU of `sms`
    /// multiprocessors.
    pub fn from_settings(
        kernel: Option<&str>,
        split_keys: Option<&str>,
        blocks: Option<&str>,
        sms: usize,
    ) -> Self {
        DecodeAttention {
            tc_from_keys: match kernel.map(str::trim) {
                Some("scalar") => usize::MAX,
                Some("tc") => 0,
                _ => Self::TC_FROM_KEYS,
            },
            tc_keys_a_split: split_keys
                .and_then(|s| s.trim().parse::<usize>().ok())
                .filter(|&k| k > 0 && k % 16 == 0)
                .unwrap_or(Self::TC_KEYS_A_SPLIT),
            tc_blocks: blocks
                .and_then(|s| s.trim().parse::<usize>().ok())
                .filter(|&b| b > 0)
                .unwrap_or(Self::TC_BLOCKS_AN_SM * sms.max(1)),
            split_form: match kernel.map(str::trim) {
                Some("staged") => Some(SplitForm::Staged),
                Some("unstaged") => Some(SplitForm::Plain),
                _ => None,
            },
        }
    }

    /// The split kernel's form for heads `head_dim` wide: the setting's,
    /// else staged for heads 64 wide and plain for others. Heads 64 wide
    /// (gpt-oss-20b shape, tg128 @ d512 on an H100) decoded 0.7 % faster
    /// staged, 4 of 4 alternated rounds over two sessions; 128 wide is not
    /// yet measured (BENCHMARKS.md, fifty-fifth and fifty-sixth sessions).
    pub fn split_form_for(&self, head_dim: usize) -> SplitForm {
        self.split_form.unwrap_or(match head_dim {
            64 => SplitForm::Staged,
            _ => SplitForm::Plain,
        })
    }

    /// Whether a layer of `capacity` rows (`window`: a sliding layer's)
    /// and `kv_heads` KV heads takes the tensor cores, and then with how
    /// many splits: from the cache alone, as [`decode_splits`] — the keys
    /// over `tc_keys_a_split`, at most `tc_blocks` blocks (and
    /// [`DECODE_TC_MAX_SPLITS`]).
    pub fn tc_splits(
        &self,
        capacity: usize,
        window: Option<usize>,
        kv_heads: usize,
    ) -> Option<usize> {
        let keys = window.map_or(capacity, |w| w.min(capacity));
        (keys >= self.tc_from_keys).then(|| {
            keys.div_ceil(self.tc_keys_a_split)
                .min(self.tc_blocks / kv_heads.max(1))
                .clamp(1, DECODE_TC_MAX_SPLITS)
        })
    }
}

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
/// Whether a batch's attention over an f16 cache takes the tensor cores
/// where it fits (`kernels/attention_tc.cu`: fast numerics, heads 64 or
/// 128 wide, at most [`PREFILL_TC_MAX_GROUP`] query heads a KV head):
/// by default; `TURBOSPARK_CUDA_PREFILL_ATTN=scalar` keeps the scalar
/// kernels (attention.cu). On an H100 (gpt-oss-20b shape) pp512 went from
/// 12027 / 11994 to 13326 / 13418 tok/s and pp512 @ d512 from 9920 / 9927
/// to 13127 / 13127 (BENCHMARKS.md, forty-first session). Its bits are not
/// the scalar kernel's (f16 queries and weights in the MMAs); its logits
/// lie as far from exact numerics' as the scalar kernel's do.
pub(crate) fn prefill_attention_tc(setting: Option<&str>) -> bool {
    setting.map(str::trim) != Some("scalar")
}
/// Query heads a KV head it serves, at most (`PA_MAX_GROUP`, a warp each).
pub(crate) const PREFILL_TC_MAX_GROUP: usize = 8;
/// Tokens a block of it (`PA_TOKENS`).
pub(crate) const PREFILL_TC_TOKENS: usize = 16;
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

/// Mirror of `QkvRope` in `kernels/q8one.cu`, passed by value: the
/// cache writes and ropes that one token's q, k and v products take in
/// `matmul1_q8x_q8_0_rope` (fusion.rs `Pending::QkvRope`).
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Debug)]
pub(crate) struct QkvRopeParams {
    /// k's cache, then v's.
    pub cache: [u64; 2],
    pub f16: [i32; 2],
    pub capacity: [i32; 2],
    pub first_pos: i32,
    /// q's heads, then k's.
    pub heads: [i32; 2],
    pub head_dim: i32,
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

/// Mirror of `AttnParams` in `kernels/common.cuh`, passed by value (the
/// attention kernels of attention.cu and attention_tc.cu).
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

    /// `TURBOSPARK_CUDA_NORM`: the vector layout unless `strided`.
    #[test]
    fn norm_layout_follows_the_setting() {
        assert!(vector_norm(None));
        assert!(vector_norm(Some("vec")));
        assert!(!vector_norm(Some(" strided")));
    }

    /// `TURBOSPARK_CUDA_PREFILL_ATTN`: the tensor cores unless `scalar`.
    #[test]
    fn prefill_attention_follows_the_setting() {
        assert!(prefill_attention_tc(None));
        assert!(prefill_attention_tc(Some("tc")));
        assert!(!prefill_attention_tc(Some(" scalar")));
        assert!(prefill_attention_tc(Some("")));
    }

    /// `TURBOSPARK_CUDA_DECODE_ATTN`, `TURBOSPARK_CUDA_TC_SPLIT_KEYS` and
    /// `TURBOSPARK_CUDA_TC_BLOCKS`: the tensor cores from `TC_FROM_KEYS`
    /// keys (a window bounding them), always or never; splits of at least
    /// `TC_KEYS_A_SPLIT` keys (or the setting's, a positive multiple of
    /// 16), at most 2 blocks an SM (or the setting's) over the KV heads,
    /// 1 to `DECODE_TC_MAX_SPLITS` of them.
    #[test]
    fn decode_attention_follows_the_settings() {
        let d = DecodeAttention::from_settings(None, None, None, 132);
        assert_eq!(d.tc_blocks, 264);
        assert_eq!(d.tc_splits(640, None, 8), None);
        assert_eq!(
            d.tc_splits(DecodeAttention::TC_FROM_KEYS - 1, None, 8),
            None
        );
        assert_eq!(
            d.tc_splits(DecodeAttention::TC_FROM_KEYS, None, 8),
            Some(16)
        );
        assert_eq!(d.tc_splits(16_416, None, 8), Some(33));
        assert_eq!(d.tc_splits(60_500, None, 8), Some(33));
        assert_eq!(d.tc_splits(1 << 20, None, 1), Some(DECODE_TC_MAX_SPLITS));
        assert_eq!(d.tc_splits(1 << 20, None, 512), Some(1));
        assert_eq!(d.tc_splits(60_500, Some(128), 8), None);
        let tc = DecodeAttention::from_settings(Some(" tc"), Some("1024"), Some("100"), 132);
        assert_eq!(tc.tc_splits(60_500, Some(128), 8), Some(1));
        assert_eq!(tc.tc_splits(60_500, None, 8), Some(12));
        assert_eq!(tc.tc_splits(5000, None, 8), Some(5));
        assert_eq!(tc.tc_splits(1, None, 8), Some(1));
        let odd = DecodeAttention::from_settings(Some("tc"), Some("1000"), Some("0"), 132);
        assert_eq!(odd.tc_keys_a_split, DecodeAttention::TC_KEYS_A_SPLIT);
        assert_eq!(odd.tc_blocks, 264);
        let scalar = DecodeAttention::from_settings(Some("scalar"), None, None, 132);
        assert_eq!(scalar.tc_splits(1 << 20, None, 8), None);
        for by_width in [scalar, d, tc] {
            assert_eq!(by_width.split_form_for(64), SplitForm::Staged);
            assert_eq!(by_width.split_form_for(128), SplitForm::Plain);
        }
        for (setting, form) in [
            ("staged ", SplitForm::Staged),
            ("unstaged", SplitForm::Plain),
        ] {
            let f = DecodeAttention::from_settings(Some(setting), None, None, 132);
            assert_eq!(f.split_form_for(64), form);
            assert_eq!(f.split_form_for(128), form);
            assert_eq!(f.tc_splits(640, None, 8), None);
            assert_eq!(
                f.tc_splits(DecodeAttention::TC_FROM_KEYS, None, 8),
                Some(16)
            );
        }
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
}
