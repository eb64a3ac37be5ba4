//! [`CudaStream`]: one session's queue of kernels on a CUDA stream.
//!
//! Every op checks its buffers on the host, then launches its kernel(s)
//! and returns: device work completes in order, after the call.
//! Host data an op needs (tokens, the rotary table, a slot mask) travels
//! by value in the kernel's parameters, so nothing on the host must
//! outlive the call. Host↔device copies of pageable memory are staged by
//! the driver before the call returns. [`Stream::read`],
//! [`Stream::read_routes`] and [`Stream::synchronize`] wait for the queue;
//! a fault inside a kernel surfaces there as [`BackendError::Runtime`].
//!
//! The [`Stream`] impl here holds the small ops and the recorded decode
//! steps; the larger op families live beside it, as `enqueue_*` methods
//! the impl calls: `products` (matrix products and their bias adds),
//! `attention` (rope, KV-cache writes, attention), `moe` (routing and the
//! routed experts) and `slots` (filling a streamed layer's expert slots);
//! `keepalive` holds the memory of the buffers an op was given until the
//! work that may touch it is done, so that a caller may drop a buffer as
//! soon as the call returns.

mod attention;
mod keepalive;
mod moe;
mod products;
mod slots;

use attention::{decode_heads, decode_split_bytes};
use keepalive::KeepAlive;
use moe::{activation, RoutedQ8};

use crate::fusion::{self, NormLaunch, Pending};
use crate::kernels::{self, args, launch, Kernels};
use crate::memory::{runtime, DevMem, PinnedF32};
use crate::pinned::PinnedRanges;
use crate::staging;
use crate::types::{CudaBank, CudaBuf, CudaMatrix, CudaRoutes, CudaVector};
use crate::CudaDevice;
use cudarc::driver::{result, sys, CudaContext, CudaStream as RawStream};
use std::sync::Arc;
use turbospark_backend::{
    check_len, check_tokens, AttentionParams, BackendError, ConvParams, DType, DeltaNetInput,
    DeltaNetLens, DeltaNetParams, Device, ExpertTensors, HeadMatmul, Limits, MoeInput, MoeScratch,
    Numerics, Projection, RopeTable, Route, RouterSpec, RouterTables, Stream,
};
use turbospark_core::arch::{Activation, NormScale, NormSpec};

/// A CUDA stream with the scratch of one session (see the module docs).
pub struct CudaStream {
    ctx: Arc<CudaContext>,
    stream: Arc<RawStream>,
    k: Arc<Kernels>,
    numerics: Numerics,
    /// Expert activations of one MoE call: `[max_routes, intermediate]` f32.
    act: DevMem,
    act_len: usize,
    /// Routes grouped by slot (`[max_routes]` u32) and each slot's start
    /// in that list (`[MAX_MASK_SLOTS + 1]` u32), for batched MoE calls.
    order: DevMem,
    offsets: DevMem,
    /// A recorded decode step's `{token, position}` (two i32), which the
    /// position-dependent kernels read while a step is recorded.
    step: DevMem,
    /// Quantized activations of the fast kernels (`kernels/q8dot.cu`):
    /// a matmul's or MoE call's input, then the MoE activations.
    q8: DevMem,
    /// Pinned staging of `fill_slot` (see [`crate::staging`]).
    ring: staging::Ring,
    /// The stream `fill_slot` copies into the ring's device buffers on,
    /// beside this one (made at the first such copy; `None` and unused with
    /// `TURBOSPARK_CUDA_COPY_STREAM=0`, for A/B measurements): the copies
    /// then overlap the layout kernels and the experts that hit. On an H200
    /// (gpt-oss-20b shapes, 8 of 32 experts in VRAM, misses read from the
    /// page cache) 43.9 / 44.0 tok/s on this stream, 46.9 / 45.5 beside it
    /// (BENCHMARKS.md, twenty-second session).
    copies: Option<Arc<RawStream>>,
    copy_stream: bool,
    /// Host memory the device registered, which `fill_slot` copies from in
    /// place (see [`crate::pinned`]).
    pinned: Arc<PinnedRanges>,
    /// Recorded after the last `fill_slot` that copied from registered
    /// memory, until [`Stream::wait_slot_fills`] has waited for it (made
    /// at the first such fill).
    fills: Option<staging::Fence>,
    /// The input whose 8-bit quantization the scratch holds — `(address,
    /// values, kernel order)` — while only matmuls have run since: q, k
    /// and v projections of one input quantize it once.
    quantized: std::cell::Cell<Option<(u64, usize, usize)>>,
    /// The ticket of the fused router launch (`router1_q8x_q8_0`: its last
    /// block routes; one u32, 0 between launches).
    ticket: DevMem,
    /// One token's split attention (`attention_decode_*`): a ticket per KV
    /// head (u32, 0 between launches; `decode_heads` of them, then padding
    /// to 16 bytes), then every split's partial sums (f32).
    decode_split: DevMem,
    /// Most query heads (and so KV heads) `decode_split` holds partials of;
    /// 0 with `TURBOSPARK_CUDA_SPLIT=0` (one token's attention then takes
    /// the block-per-head kernel, for A/B measurements).
    decode_heads: usize,
    /// Keys a split of one token's attention is sized for
    /// ([`kernels::decode_split_keys`]).
    decode_split_keys: usize,
    /// Which kernel takes one token's attention over which caches
    /// ([`kernels::DecodeAttention`]).
    decode_attention: kernels::DecodeAttention,
    /// Whether a batch's attention takes the tensor cores where it fits
    /// ([`kernels::prefill_attention_tc`]).
    prefill_attention_tc: bool,
    /// Whether the scalar attention takes its long form at every length
    /// (`TURBOSPARK_CUDA_ATTN_LONG=1`, for checking that it gives the
    /// one-pass kernels' bits), not only past their shared memory.
    attention_long_always: bool,
    /// One token's MoE input quantized in MXFP4's order ahead of the MoE
    /// call — by the norm that also quantizes a Q8_0 router product's
    /// input (`matmul_q8`), or by the fused router launch — (codes, then
    /// scales at [`Q8Regions`]' offset), and where it is, until the next
    /// op but the router's bias, its routing and the MoE call that reads it
    /// (cleared by `bind_holding`).
    routed_x: DevMem,
    routed_q8: std::cell::Cell<Option<RoutedQ8>>,
    /// Whether `route` joins the router product's launch, and whether the
    /// decode attention quantizes its output for the product after it
    /// (`TURBOSPARK_CUDA_FUSE`, see [`Fuse::from_setting`]).
    fuse: Fuse,
    /// The op held back for the next to join (see [`crate::fusion`]).
    pending: std::cell::Cell<Option<Pending>>,
    /// The memory of every buffer and route buffer an op was given since
    /// the last [`Stream::synchronize`], kept alive until then (see
    /// [`keepalive`]): a dropped buffer's memory returns to the device at
    /// the stream's next synchronize (or drop), not at once.
    retained: KeepAlive,
    /// Whether ops are being recorded into a step.
    recording: bool,
    graph: Option<StepGraph>,
    /// Decode steps replayed so far, and the one that faults (see
    /// [`FAULT_STEP_VAR`]).
    replayed: u64,
    fault_step: Option<u64>,
}

/// Which of a decode step's launches join their neighbours (`TURBOSPARK_CUDA_FUSE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fuse {
    /// `route` in the router product's launch.
    router: bool,
    /// The decode attention's output quantized in its own launch.
    attention: bool,
}

impl Fuse {
    /// The joins a setting names: `1` both, `router` or `attention` that one
    /// alone, `0` neither; unset (or anything else) the attention's alone.
    /// The same bits either way. On an H200 (gpt-oss-20b shapes, tg128,
    /// BENCHMARKS.md, sixteenth session) the attention's join took a decode
    /// token from 605.6 / 609.3 to 626.6 / 629.2 tok/s (the o projection's
    /// first weight loads then overlap the whole attention, not only a
    /// quantization launch); the router's gave nothing (613.7 / 609.5),
    /// and in the twelfth session it was 2–3 % slower.
    fn from_setting(setting: Option<&str>) -> Fuse {
        let (router, attention) = match setting {
            Some("1") => (true, true),
            Some("router") => (true, false),
            Some("0") => (false, false),
            _ => (false, true),
        };
        Fuse { router, attention }
    }
}

/// A test hook: with `TURBOSPARK_CUDA_FAULT_STEP=N`, the N-th replayed decode
/// step of a stream (from 1) is preceded by a kernel that writes outside any
/// allocation — a real GPU memory fault, which leaves the context unusable —
/// so that how a fault in the middle of a generation surfaces (a typed
/// error at the next synchronisation, a clean exit, no output file) can be
/// checked on a GPU (`scripts/gpu/run.sh faults`).
pub const FAULT_STEP_VAR: &str = "TURBOSPARK_CUDA_FAULT_STEP";

/// An address no allocation of a 64-bit process holds (above the 47-bit
/// user address space).
const FAULT_ADDRESS: u64 = 1 << 56;

/// An instantiated CUDA graph of one decode step, and the buffers its
/// ops were given (the stream's `retained` when the recording ended),
/// kept for as long as it can be replayed, then until the stream next
/// synchronizes ([`CudaStream`]'s `drop_graph`).
struct StepGraph {
    exec: sys::CUgraphExec,
    buffers: KeepAlive,
}

// SAFETY: a graph exec is a handle usable from any thread of its context.
unsafe impl Send for StepGraph {}

impl Drop for StepGraph {
    fn drop(&mut self) {
        // SAFETY: instantiated once by end_step, destroyed once here.
        let _ = unsafe { result::graph::exec_destroy(self.exec) };
    }
}

impl Drop for CudaStream {
    /// Waits for the stream's work before its buffers (and those it
    /// retained) are freed; a failure (a device already lost) leaves
    /// nothing to wait for.
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            let _ = self.flush();
            let _ = self.stream.synchronize();
        }
    }
}

fn shape(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

fn dtype_err(op: &'static str, what: &'static str, expected: DType, found: DType) -> BackendError {
    BackendError::DType {
        op,
        what,
        expected,
        found,
    }
}

impl CudaStream {
    /// A new stream on `dev` with scratch for `limits`.
    pub(crate) fn new(dev: &CudaDevice, limits: &Limits) -> Result<CudaStream, BackendError> {
        let ctx = dev.ctx.clone();
        let stream = ctx.new_stream().map_err(runtime("stream"))?;
        let act_len = limits.max_routes * limits.max_expert_intermediate;
        let zeroed = |bytes| DevMem::zeroed(&ctx, bytes, "stream scratch");
        let widest = dev.widest.load(std::sync::atomic::Ordering::Relaxed);
        let q8_bytes = match dev.numerics() {
            Numerics::Fast => Q8Regions::new(limits.max_tokens * widest, act_len).bytes,
            _ => 0,
        };
        Ok(CudaStream {
            stream,
            k: dev.kernels.clone(),
            numerics: dev.numerics(),
            act: zeroed(act_len * 4)?,
            act_len,
            order: zeroed(limits.max_routes * 4)?,
            offsets: zeroed((kernels::MAX_MASK_SLOTS + 1) * 4)?,
            step: zeroed(8)?,
            q8: zeroed(q8_bytes)?,
            ring: staging::Ring::default(),
            copies: None,
            copy_stream: std::env::var("TURBOSPARK_CUDA_COPY_STREAM").as_deref() != Ok("0"),
            pinned: dev.pinned.clone(),
            fills: None,
            quantized: std::cell::Cell::new(None),
            ticket: zeroed(16)?,
            decode_split: zeroed(decode_split_bytes(
                widest,
                limits.max_head_dim,
                dev.numerics(),
            ))?,
            decode_heads: match std::env::var("TURBOSPARK_CUDA_SPLIT").as_deref() {
                Ok("0") => 0,
                _ => decode_heads(widest, limits.max_head_dim),
            },
            decode_split_keys: kernels::decode_split_keys(
                std::env::var("TURBOSPARK_CUDA_SPLIT_KEYS").ok().as_deref(),
            ),
            decode_attention: kernels::DecodeAttention::from_settings(
                std::env::var("TURBOSPARK_CUDA_DECODE_ATTN").ok().as_deref(),
                std::env::var("TURBOSPARK_CUDA_TC_SPLIT_KEYS")
                    .ok()
                    .as_deref(),
                std::env::var("TURBOSPARK_CUDA_TC_BLOCKS").ok().as_deref(),
                dev.kernels.sms,
            ),
            attention_long_always: std::env::var("TURBOSPARK_CUDA_ATTN_LONG").as_deref() == Ok("1"),
            prefill_attention_tc: kernels::prefill_attention_tc(
                std::env::var("TURBOSPARK_CUDA_PREFILL_ATTN")
                    .ok()
                    .as_deref(),
            ),
            routed_x: zeroed(match dev.numerics() {
                Numerics::Fast => Q8Regions::new(widest, 0).bytes,
                _ => 0,
            })?,
            routed_q8: std::cell::Cell::new(None),
            fuse: Fuse::from_setting(std::env::var("TURBOSPARK_CUDA_FUSE").ok().as_deref()),
            pending: std::cell::Cell::new(None),
            retained: KeepAlive::default(),
            recording: false,
            graph: None,
            replayed: 0,
            fault_step: std::env::var(FAULT_STEP_VAR)
                .ok()
                .and_then(|v| v.parse().ok()),
            ctx,
        })
    }

    /// The step parameters' address while recording, else null.
    fn step_ptr(&self) -> u64 {
        if self.recording {
            self.step.ptr
        } else {
            0
        }
    }

    /// Queues writing `{token, position}` into the step parameters.
    fn set_step(&self, token: u32, position: usize) -> Result<(), BackendError> {
        let pos = i32::try_from(position)
            .map_err(|_| shape("decode step", format!("position {position} beyond i32")))?;
        for (at, v) in [(0u64, token), (4, pos as u32)] {
            // SAFETY: `step` holds two 4-byte words; the value travels by value.
            unsafe { sys::cuMemsetD32Async(self.step.ptr + at, v, 1, self.raw().cu_stream()) }
                .result()
                .map_err(runtime("decode step"))?;
        }
        Ok(())
    }

    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    /// Binds the context for `op` and launches the pending op. Every op
    /// but the fusable ones starts here, which is also where the reuse of
    /// quantized activations ends (see `quantized`): any op but a matmul
    /// may write the buffer they came from.
    fn bind(&self, op: &'static str) -> Result<(), BackendError> {
        self.quantized.set(None);
        self.bind_holding(op)?;
        self.flush()
    }

    /// Binds the context for `op`, keeping the pending op.
    fn bind_holding(&self, op: &'static str) -> Result<(), BackendError> {
        self.routed_q8.set(None);
        self.ctx.bind_to_thread().map_err(runtime(op))
    }

    /// Forgets the recorded step. Its buffers stay until the stream next
    /// synchronizes, as a replay of it may still be queued (a graph exec
    /// destroyed in flight is freed once it completes).
    fn drop_graph(&mut self) {
        if let Some(mut g) = self.graph.take() {
            self.retained.absorb(&mut g.buffers);
        }
    }

    /// Launches the pending op, if any.
    fn flush(&self) -> Result<(), BackendError> {
        match self.pending.take() {
            Some(p) => fusion::launch_pending(&self.k, self.raw(), p, None),
            None => Ok(()),
        }
    }

    /// Launches the pending op and holds `p` back instead.
    fn hold(&self, p: Pending) -> Result<(), BackendError> {
        self.flush()?;
        self.pending.set(Some(p));
        Ok(())
    }

    fn raw(&self) -> &RawStream {
        &self.stream
    }

    /// The quantized-activation scratch for `x_vals` input values and
    /// `act_vals` MoE activations, grown when too small. Growing drops a
    /// recorded step (it refers to the old buffer) and is refused while
    /// recording.
    fn q8_regions(
        &mut self,
        op: &'static str,
        x_vals: usize,
        act_vals: usize,
    ) -> Result<Q8Regions, BackendError> {
        let mut r = Q8Regions::new(x_vals, act_vals);
        if r.bytes > self.q8.bytes {
            if self.recording {
                return Err(BackendError::ScratchTooSmall {
                    op,
                    need: r.bytes,
                    have: self.q8.bytes,
                });
            }
            // A held product reads the old scratch: launched, and the old
            // scratch kept until the stream next synchronizes.
            self.flush()?;
            self.drop_graph();
            self.quantized.set(None);
            let old = std::mem::replace(
                &mut self.q8,
                DevMem::zeroed(&self.ctx, r.bytes, "stream scratch")?,
            );
            self.retained.hold_owned(old);
        }
        r.rebase(self.q8.ptr);
        Ok(r)
    }

    /// Queues quantizing `x` (`n · cols` values, cols a multiple of 32) to
    /// 8 bits per block in the order `fmt`'s fast kernels read.
    fn quantize(
        &self,
        set: &kernels::Q8Set,
        x: u64,
        vals: usize,
        codes: u64,
        scales: u64,
    ) -> Result<(), BackendError> {
        let blocks = (vals / 32) as i64;
        launch(
            "quantize",
            &set.quantize,
            self.raw(),
            ((vals / 32).div_ceil(8) as u32, 1, 1),
            256,
            0,
            &mut args![x, blocks, codes, scales],
        )
    }

    /// The fast kernels of `fmt` when this stream computes in
    /// [`Numerics::Fast`] and the format has them.
    fn q8_set(&self, fmt: turbospark_core::QuantFormat) -> Option<&kernels::Q8Set> {
        match self.numerics {
            Numerics::Fast => self.k.q8.get(fmt),
            _ => None,
        }
    }

    /// Launches a grid-stride element-wise kernel over `n` elements.
    fn elementwise(
        &self,
        op: &'static str,
        f: &cudarc::driver::CudaFunction,
        n: usize,
        args: &mut [*mut std::ffi::c_void],
    ) -> Result<(), BackendError> {
        self.bind(op)?;
        kernels::launch_elementwise(op, f, self.raw(), n, args)
    }
}

impl Stream<CudaDevice> for CudaStream {
    fn records_steps(&self) -> bool {
        true
    }

    fn begin_step(&mut self, token: u32, position: usize) -> Result<(), BackendError> {
        if self.recording {
            return Err(shape(
                "begin_step",
                "a step is already being recorded".into(),
            ));
        }
        self.bind("begin_step")?;
        self.drop_graph();
        self.set_step(token, position)?;
        // SAFETY: a valid stream of the bound context; capture ends in end_step.
        unsafe {
            result::stream::begin_capture(
                self.raw().cu_stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(runtime("begin_step"))?;
        self.recording = true;
        Ok(())
    }

    fn end_step(&mut self) -> Result<(), BackendError> {
        if !self.recording {
            return Err(shape("end_step", "no step is being recorded".into()));
        }
        self.recording = false;
        self.bind("end_step")?;
        // SAFETY: the stream is capturing (begin_step); ending it hands
        // over the graph, destroyed below once instantiated.
        let graph = unsafe { result::stream::end_capture(self.raw().cu_stream()) }
            .map_err(runtime("end_step"))?;
        crate::knockout::step_recorded();
        // SAFETY: `graph` is the valid graph just captured.
        let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
        // SAFETY: destroyed once; the instantiated exec does not need it.
        let _ = unsafe { result::graph::destroy(graph) };
        let exec = StepGraph {
            exec: exec.map_err(runtime("end_step"))?,
            buffers: std::mem::take(&mut self.retained),
        };
        // SAFETY: a valid exec and stream.
        unsafe { result::graph::launch(exec.exec, self.raw().cu_stream()) }
            .map_err(runtime("end_step"))?;
        self.graph = Some(exec);
        Ok(())
    }

    fn replay_step(&mut self, token: u32, position: usize) -> Result<bool, BackendError> {
        let Some(exec) = self.graph.as_ref().map(|g| g.exec) else {
            return Ok(false);
        };
        self.bind("replay_step")?;
        self.replayed += 1;
        if self.fault_step == Some(self.replayed) {
            let (bad, n, s) = (FAULT_ADDRESS, 1024i64, 0.0f32);
            self.elementwise("replay_step", &self.k.scale, 1024, &mut args![bad, n, s])?;
        }
        self.set_step(token, position)?;
        // SAFETY: a valid exec (owned by self.graph) and stream.
        unsafe { result::graph::launch(exec, self.raw().cu_stream()) }
            .map_err(runtime("replay_step"))?;
        Ok(true)
    }

    fn forget_step(&mut self) {
        self.drop_graph();
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        self.bind("synchronize")?;
        self.stream.synchronize().map_err(runtime("synchronize"))?;
        // Every op given so far is done: the buffers may go.
        self.retained.release();
        Ok(())
    }

    fn write(&mut self, dst: &mut CudaBuf, src: &[f32]) -> Result<(), BackendError> {
        self.retained.hold(&[&dst.mem]);
        let ptr = dst.f32_ptr("write", "dst", src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind("write")?;
        // SAFETY: `dst` holds at least `src.len()` floats (checked); the
        // driver stages pageable host memory before returning.
        unsafe { result::memcpy_htod_async(ptr, src, self.raw().cu_stream()) }
            .map_err(runtime("write"))
    }

    fn read_async(
        &mut self,
        src: &CudaBuf,
        len: usize,
        dst: &mut PinnedF32,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&src.mem]);
        let ptr = src.f32_ptr("read_async", "src", len)?;
        check_len("read_async", "dst", dst.len(), len)?;
        if len == 0 {
            return Ok(());
        }
        self.bind("read_async")?;
        // SAFETY: `dst` is pinned memory of at least `len` floats, owned
        // by the caller until the synchronize that makes it valid.
        let host = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr(), len) };
        // SAFETY: `src` holds at least `len` floats (checked).
        unsafe { result::memcpy_dtoh_async(host, ptr, self.raw().cu_stream()) }
            .map_err(runtime("read_async"))
    }

    fn read(&mut self, src: &CudaBuf, dst: &mut [f32]) -> Result<(), BackendError> {
        self.retained.hold(&[&src.mem]);
        check_len("read", "src", src.len, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.bind("read")?;
        let from = match src.dtype {
            DType::F32 => None,
            DType::F16 => {
                // A rare path (tests read the KV cache): widen into a
                // temporary buffer.
                let tmp = DevMem::zeroed(&self.ctx, dst.len() * 4, "read")?;
                let n = dst.len() as i64;
                self.elementwise(
                    "read",
                    &self.k.widen_f16,
                    dst.len(),
                    &mut args![src.mem.ptr, tmp.ptr, n],
                )?;
                Some(tmp)
            }
            other => return Err(dtype_err("read", "src", DType::F32, other)),
        };
        let ptr = from.as_ref().map_or(src.mem.ptr, |m| m.ptr);
        // SAFETY: `ptr` holds at least `dst.len()` floats (checked).
        unsafe { result::memcpy_dtoh_async(dst, ptr, self.raw().cu_stream()) }
            .map_err(runtime("read"))?;
        self.synchronize()
    }

    fn copy(
        &mut self,
        src: &CudaBuf,
        src_at: usize,
        dst: &mut CudaBuf,
        dst_at: usize,
        len: usize,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&src.mem, &dst.mem]);
        if src.dtype != dst.dtype {
            return Err(dtype_err("copy", "dst", src.dtype, dst.dtype));
        }
        check_len("copy", "src", src.len, src_at.saturating_add(len))?;
        check_len("copy", "dst", dst.len, dst_at.saturating_add(len))?;
        let bytes = |n: usize| {
            src.dtype.bytes_for(n).ok_or(shape(
                "copy",
                format!("{n} elements of {} are not whole blocks", src.dtype),
            ))
        };
        let (from, to, n) = (bytes(src_at)?, bytes(dst_at)?, bytes(len)?);
        if n == 0 {
            return Ok(());
        }
        if src.dtype == DType::F32 {
            // Held for a norm of the copy; joins a held add of its source.
            let (sp, dp) = (src.mem.ptr + from as u64, dst.mem.ptr + to as u64);
            self.quantized.set(None);
            self.bind_holding("copy")?;
            if let Some(Pending::Add {
                dst: h,
                src: add,
                len: l,
                combine,
            }) = self.pending.get()
            {
                if h == sp && l == len {
                    self.pending.set(Some(Pending::AddCopy {
                        h,
                        add,
                        dst: dp,
                        len,
                        combine,
                    }));
                    return Ok(());
                }
            }
            return self.hold(Pending::Copy {
                src: sp,
                dst: dp,
                len,
            });
        }
        self.bind("copy")?;
        // SAFETY: both ranges lie inside their buffers (checked above).
        unsafe {
            result::memcpy_dtod_async(
                dst.mem.ptr + to as u64,
                src.mem.ptr + from as u64,
                n,
                self.raw().cu_stream(),
            )
        }
        .map_err(runtime("copy"))
    }

    fn write_routes(&mut self, dst: &mut CudaRoutes, src: &[Route]) -> Result<(), BackendError> {
        self.retained.hold(&[&dst.mem]);
        check_len("write_routes", "dst", dst.max_tokens * dst.top_k, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        dst.max_slot = src.iter().map(|r| r.slot).max().unwrap_or(0);
        self.bind("write_routes")?;
        // SAFETY: Route is #[repr(C)] (u32, f32), the kernels' RouteOut;
        // `dst` holds at least `src.len()` of them (checked).
        unsafe { result::memcpy_htod_async(dst.mem.ptr, src, self.raw().cu_stream()) }
            .map_err(runtime("write_routes"))
    }

    fn read_routes(&mut self, src: &CudaRoutes, dst: &mut [Route]) -> Result<(), BackendError> {
        self.retained.hold(&[&src.mem]);
        check_len("read_routes", "src", src.max_tokens * src.top_k, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.bind("read_routes")?;
        // SAFETY: as in write_routes.
        unsafe { result::memcpy_dtoh_async(dst, src.mem.ptr, self.raw().cu_stream()) }
            .map_err(runtime("read_routes"))?;
        self.synchronize()
    }

    fn fill_slot(
        &mut self,
        bank: &mut CudaBank,
        slot: usize,
        expert: &ExpertTensors,
    ) -> Result<(), BackendError> {
        self.enqueue_fill_slot(bank, slot, expert)
    }

    fn fills_slot_rows(&self) -> bool {
        true
    }

    fn fill_slot_rows(
        &mut self,
        bank: &mut CudaBank,
        slot: usize,
        expert: &ExpertTensors,
        part: Projection,
        rows: std::ops::Range<usize>,
    ) -> Result<(), BackendError> {
        self.enqueue_fill_slot_rows(bank, slot, expert, part, rows)
    }

    fn fill_slot_biases(
        &mut self,
        bank: &mut CudaBank,
        slot: usize,
        expert: &ExpertTensors,
    ) -> Result<(), BackendError> {
        self.enqueue_fill_slot_biases(bank, slot, expert)
    }

    fn wait_slot_fills(&mut self) -> Result<(), BackendError> {
        self.enqueue_wait_slot_fills()
    }

    fn embed(
        &mut self,
        table: &CudaMatrix,
        tokens: &[u32],
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&out.mem]);
        let d = table.cols;
        let out_ptr = out.f32_ptr("embed", "out", tokens.len() * d)?;
        check_tokens(tokens, table.rows)?;
        self.bind("embed")?;
        let f = self.k.embed.get(table.format);
        let step = self.step_ptr();
        for (c, chunk) in tokens.chunks(kernels::MAX_EMBED_TOKENS).enumerate() {
            let mut ids = kernels::EmbedTokens {
                ids: [0; kernels::MAX_EMBED_TOKENS],
            };
            ids.ids[..chunk.len()].copy_from_slice(chunk);
            let at = out_ptr + (c * kernels::MAX_EMBED_TOKENS * d * 4) as u64;
            let (cols, rb, n) = (d as i32, table.row_bytes as i64, chunk.len() as i32);
            launch(
                "embed",
                f,
                self.raw(),
                (chunk.len() as u32, 1, 1),
                64,
                0,
                &mut args![table.mem.ptr, cols, rb, ids, n, at, step],
            )?;
        }
        Ok(())
    }

    fn matmul(
        &mut self,
        w: &CudaMatrix,
        x: &CudaBuf,
        n: usize,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&x.mem, &out.mem]);
        self.enqueue_matmul(w, x, n, out)
    }

    fn mul_sigmoid_rows(
        &mut self,
        x: &mut CudaBuf,
        gate: &CudaBuf,
        rows: usize,
        dim: usize,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&x.mem, &gate.mem]);
        const OP: &str = "mul_sigmoid_rows";
        let xp = x.f32_ptr(OP, "x", rows * dim)?;
        let gp = gate.f32_ptr(OP, "gate", rows)?;
        if dim == 0 {
            return Ok(());
        }
        let (r, d) = (rows as i64, dim as i32);
        self.elementwise(
            OP,
            &self.k.mul_sigmoid_rows,
            rows * dim,
            &mut args![xp, gp, r, d],
        )
    }

    fn causal_conv1d_silu(
        &mut self,
        x: &CudaBuf,
        state: &mut CudaBuf,
        weight: &CudaVector,
        params: &ConvParams,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&x.mem, &state.mem, &out.mem]);
        const OP: &str = "causal_conv1d_silu";
        params.check(x.len, state.len, weight.len, out.len)?;
        if params.kernel - 1 > kernels::CONV_MAX_PAST {
            return Err(shape(
                OP,
                format!(
                    "a kernel of {} taps (at most {})",
                    params.kernel,
                    kernels::CONV_MAX_PAST + 1
                ),
            ));
        }
        let xp = x.f32_ptr(OP, "x", 0)?;
        let sp = state.f32_ptr(OP, "state", 0)?;
        let op = out.f32_ptr(OP, "out", 0)?;
        let (n, ch, k) = (
            params.n_tokens as i32,
            params.channels as i32,
            params.kernel as i32,
        );
        let fresh = params.fresh as i32;
        self.bind(OP)?;
        launch(
            OP,
            &self.k.causal_conv1d_silu,
            self.raw(),
            (params.channels.div_ceil(128) as u32, 1, 1),
            128,
            0,
            &mut args![xp, sp, weight.mem.ptr, n, ch, k, fresh, op],
        )
    }

    fn gated_delta_rule(
        &mut self,
        input: DeltaNetInput<'_, CudaDevice>,
        params: &DeltaNetParams,
        state: &mut CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.retained
            .hold(&[&input.qkv.mem, &input.alpha.mem, &input.beta.mem]);
        self.retained.hold(&[&state.mem, &out.mem]);
        const OP: &str = "gated_delta_rule";
        params.check(&DeltaNetLens {
            qkv: input.qkv.len,
            alpha: input.alpha.len,
            beta: input.beta.len,
            a_log: input.a_log.len,
            dt_bias: input.dt_bias.len,
            state: state.len,
            out: out.len,
        })?;
        let qp = input.qkv.f32_ptr(OP, "qkv", 0)?;
        let ap = input.alpha.f32_ptr(OP, "alpha", 0)?;
        let bp = input.beta.f32_ptr(OP, "beta", 0)?;
        let sp = state.f32_ptr(OP, "state", 0)?;
        let op = out.f32_ptr(OP, "out", 0)?;
        let p = params;
        let (n, hk, hv, dk, dv) = (
            p.n_tokens as i32,
            p.k_heads as i32,
            p.v_heads as i32,
            p.k_head_dim as i32,
            p.v_head_dim as i32,
        );
        let fresh = p.fresh as i32;
        // Long calls chunked, one block per value head and DN_BV state
        // columns; short ones (and key heads too wide for a chunk in shared
        // memory) token by token, one block per value head.
        let smem = kernels::gated_delta_rule_chunked_smem(p.k_head_dim);
        let (f, grid, threads, smem) =
            if p.n_tokens >= kernels::DELTA_CHUNKED_MIN_TOKENS && smem <= self.k.dynamic_smem {
                (
                    &self.k.gated_delta_rule_chunked,
                    (
                        p.v_heads as u32,
                        p.v_head_dim.div_ceil(kernels::DN_BV) as u32,
                        1,
                    ),
                    kernels::DN_THREADS,
                    smem,
                )
            } else {
                (
                    &self.k.gated_delta_rule,
                    (p.v_heads as u32, 1, 1),
                    (p.v_head_dim.max(p.k_head_dim).div_ceil(32) * 32).clamp(32, 1024) as u32,
                    2 * p.k_head_dim * 4,
                )
            };
        self.bind(OP)?;
        launch(
            OP,
            f,
            self.raw(),
            grid,
            threads,
            smem as u32,
            &mut args![
                qp,
                ap,
                bp,
                input.a_log.mem.ptr,
                input.dt_bias.mem.ptr,
                n,
                hk,
                hv,
                dk,
                dv,
                fresh,
                sp,
                op
            ],
        )
    }

    fn head_matmul(
        &mut self,
        w: &CudaMatrix,
        x: &CudaBuf,
        p: &HeadMatmul,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&x.mem, &out.mem]);
        let xp = x.f32_ptr("head_matmul", "x", 0)?;
        let op = out.f32_ptr("head_matmul", "out", 0)?;
        p.check(w.rows, w.cols, x.len, out.len)?;
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| shape("head_matmul", format!("{v} beyond i32")))
        };
        let hp = kernels::HeadParams {
            n_tokens: int(p.n_tokens)?,
            n_heads: int(p.n_heads)?,
            head_stride: int(p.head_stride)?,
            first_row: int(p.first_row)?,
            rows: int(p.rows)?,
            x_stride: int(p.x_stride)?,
            x_at: int(p.x_at)?,
            out_stride: int(p.out_stride)?,
            out_at: int(p.out_at)?,
        };
        self.bind("head_matmul")?;
        let (f, per) = if p.transpose {
            (self.k.head_t.get(w.format), w.cols.div_ceil(32))
        } else {
            (self.k.head_plain.get(w.format), p.rows)
        };
        let (rb, cols) = (w.row_bytes as i64, w.cols as i32);
        self.elementwise(
            "head_matmul",
            f,
            p.n_tokens * p.n_heads * per,
            &mut args![w.mem.ptr, rb, cols, hp, xp, op],
        )
    }

    fn add_bias(
        &mut self,
        x: &mut CudaBuf,
        bias: &CudaVector,
        n: usize,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&x.mem]);
        self.enqueue_add_bias(x, bias, n)
    }

    fn rms_norm(
        &mut self,
        x: &mut CudaBuf,
        rows: usize,
        dim: usize,
        spec: NormSpec,
        weight: Option<&CudaVector>,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&x.mem]);
        let xp = x.f32_ptr("rms_norm", "x", rows * dim)?;
        let w = match (spec.has_weight(), weight) {
            (true, Some(w)) if w.len == dim => w.mem.ptr,
            (false, None) => 0,
            (true, w) => {
                return Err(shape(
                    "rms_norm",
                    format!(
                        "a {:?} norm of width {dim} needs a {dim}-element weight, got {:?}",
                        spec.scale,
                        w.map(|w| w.len)
                    ),
                ))
            }
            (false, Some(_)) => {
                return Err(shape("rms_norm", "a no-scale norm takes no weight".into()))
            }
        };
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        let mode: i32 = match (spec.scale, w) {
            (_, 0) => 2,
            (NormScale::Centered, _) => 1,
            _ => 0,
        };
        // Held for the matmul that may quantize its output; joins a held
        // copy (and add) of its input.
        self.quantized.set(None);
        self.bind_holding("rms_norm")?;
        let norm = NormLaunch {
            add: 0,
            combine: None,
            h: xp,
            out: xp,
            rows,
            dim,
            eps: spec.eps,
            mode,
            w,
        };
        match self.pending.get().and_then(|p| p.absorb_norm(norm)) {
            Some(fused) => {
                self.pending.set(Some(Pending::Norm(fused)));
                Ok(())
            }
            None => self.hold(Pending::Norm(norm)),
        }
    }

    fn rope(
        &mut self,
        x: &mut CudaBuf,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        first_pos: usize,
        table: &RopeTable,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&x.mem]);
        self.enqueue_rope(x, n_tokens, n_heads, head_dim, first_pos, table)
    }

    fn kv_write(
        &mut self,
        cache: &mut CudaBuf,
        src: &CudaBuf,
        n_tokens: usize,
        row_len: usize,
        first_pos: usize,
        capacity: usize,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&cache.mem, &src.mem]);
        self.enqueue_kv_write(cache, src, n_tokens, row_len, first_pos, capacity)
    }

    fn attention(
        &mut self,
        q: &CudaBuf,
        k_cache: &CudaBuf,
        v_cache: &CudaBuf,
        p: &AttentionParams,
        sinks: Option<&CudaVector>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.retained
            .hold(&[&q.mem, &k_cache.mem, &v_cache.mem, &out.mem]);
        self.enqueue_attention(q, k_cache, v_cache, p, sinks, out)
    }

    fn glu(
        &mut self,
        gate: &mut CudaBuf,
        up: &CudaBuf,
        len: usize,
        act: Activation,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&gate.mem, &up.mem]);
        let gp = gate.f32_ptr("glu", "gate", len)?;
        let upp = up.f32_ptr("glu", "up", len)?;
        let a = activation(act);
        let n = len as i64;
        self.elementwise(
            "glu",
            &self.k.glu,
            len,
            &mut args![gp, upp, n, a.act, a.alpha, a.limit],
        )
    }

    fn add(&mut self, dst: &mut CudaBuf, src: &CudaBuf, len: usize) -> Result<(), BackendError> {
        self.retained.hold(&[&dst.mem, &src.mem]);
        let dp = dst.f32_ptr("add", "dst", len)?;
        let sp = src.f32_ptr("add", "src", len)?;
        if len == 0 {
            return Ok(());
        }
        // Held for a copy and norm of the sum; joins the held sum of a MoE
        // call's routes that wrote `src`.
        self.quantized.set(None);
        self.bind_holding("add")?;
        if let Some(Pending::Combine(c)) = self.pending.get() {
            if c.out == sp && c.n * c.hidden == len && !c.reads(dp, len) && !c.reads(sp, len) {
                self.pending.set(Some(Pending::Add {
                    dst: dp,
                    src: sp,
                    len,
                    combine: Some(c),
                }));
                return Ok(());
            }
        }
        self.hold(Pending::Add {
            dst: dp,
            src: sp,
            len,
            combine: None,
        })
    }

    fn adjust_projection(
        &mut self,
        x: &mut CudaBuf,
        n: usize,
        u: &CudaVector,
        alpha: f32,
        beta: f32,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&x.mem]);
        let d = u.len;
        let xp = x.f32_ptr("adjust_projection", "x", n * d)?;
        if n == 0 || d == 0 {
            return Ok(());
        }
        self.bind("adjust_projection")?;
        let dd = d as i32;
        launch(
            "adjust_projection",
            &self.k.adjust_projection,
            self.raw(),
            (n as u32, 1, 1),
            256,
            0,
            &mut args![xp, u.mem.ptr, dd, alpha, beta],
        )
    }

    fn scale(&mut self, x: &mut CudaBuf, len: usize, s: f32) -> Result<(), BackendError> {
        self.retained.hold(&[&x.mem]);
        let xp = x.f32_ptr("scale", "x", len)?;
        let n = len as i64;
        self.elementwise("scale", &self.k.scale, len, &mut args![xp, n, s])
    }

    fn mul_sigmoid(
        &mut self,
        x: &mut CudaBuf,
        gate: &CudaBuf,
        len: usize,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&x.mem, &gate.mem]);
        let xp = x.f32_ptr("mul_sigmoid", "x", len)?;
        let gp = gate.f32_ptr("mul_sigmoid", "gate", len)?;
        let n = len as i64;
        self.elementwise(
            "mul_sigmoid",
            &self.k.mul_sigmoid,
            len,
            &mut args![xp, gp, n],
        )
    }

    fn softcap(&mut self, x: &mut CudaBuf, len: usize, cap: f32) -> Result<(), BackendError> {
        self.retained.hold(&[&x.mem]);
        let xp = x.f32_ptr("softcap", "x", len)?;
        let n = len as i64;
        self.elementwise("softcap", &self.k.softcap, len, &mut args![xp, n, cap])
    }

    fn route(
        &mut self,
        logits: &CudaBuf,
        n_tokens: usize,
        router: &RouterSpec,
        tables: RouterTables<'_, CudaVector>,
        out: &mut CudaRoutes,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&logits.mem, &out.mem]);
        self.enqueue_route(logits, n_tokens, router, tables, out)
    }

    fn moe_experts(
        &mut self,
        input: MoeInput<'_, CudaDevice>,
        scratch: &mut MoeScratch<CudaBuf>,
        only: Option<&[bool]>,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&input.x.mem, &input.routes.mem]);
        self.retained.hold(&[
            &scratch.x.mem,
            &scratch.gate.mem,
            &scratch.up.mem,
            &scratch.y.mem,
        ]);
        self.enqueue_moe_experts(input, scratch, only)
    }

    /// The gate/up stage of [`Stream::moe_experts`] (the per-route
    /// `moe_gate_up` kernels of moe.cu) writing its `[n · k, inter]`
    /// activations into `out` instead of the stream's own buffer.
    fn moe_intermediate(
        &mut self,
        input: MoeInput<'_, CudaDevice>,
        _scratch: &mut MoeScratch<CudaBuf>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.retained
            .hold(&[&input.x.mem, &input.routes.mem, &out.mem]);
        self.enqueue_moe_intermediate(input, _scratch, out)
    }

    fn moe_combine(
        &mut self,
        n_tokens: usize,
        hidden: usize,
        routes: &CudaRoutes,
        scratch: &MoeScratch<CudaBuf>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.retained.hold(&[&routes.mem, &scratch.y.mem, &out.mem]);
        self.enqueue_moe_combine(n_tokens, hidden, routes, scratch, out)
    }
}

/// Where the quantized activations of one fast call lie in the stream's
/// scratch: input codes `xq` and block scales `xd`, MoE activation codes
/// `aq` and scales `ad` (each region 16-byte aligned).
struct Q8Regions {
    xq: u64,
    xd: u64,
    aq: u64,
    ad: u64,
    bytes: usize,
}

impl Q8Regions {
    /// Offsets (from 0) for `x_vals` input and `act_vals` activation values.
    fn new(x_vals: usize, act_vals: usize) -> Q8Regions {
        let up = |b: usize| b.div_ceil(16) * 16;
        let xd = up(x_vals);
        let aq = xd + up(x_vals / 32 * 4);
        let ad = aq + up(act_vals);
        let bytes = ad + up(act_vals / 32 * 4);
        Q8Regions {
            xq: 0,
            xd: xd as u64,
            aq: aq as u64,
            ad: ad as u64,
            bytes,
        }
    }

    fn rebase(&mut self, base: u64) {
        self.xq += base;
        self.xd += base;
        self.aq += base;
        self.ad += base;
    }
}

#[cfg(test)]
mod tests {
    use super::Fuse;

    /// `TURBOSPARK_CUDA_FUSE`: `1` both joins, `router` or `attention` one,
    /// `0` neither; unset or anything else (a typo) the attention's alone.
    #[test]
    fn fuse_setting_names_the_joins() {
        let f = |s| Fuse::from_setting(s);
        let fuse = |router, attention| Fuse { router, attention };
        assert_eq!(f(Some("1")), fuse(true, true));
        assert_eq!(f(Some("router")), fuse(true, false));
        assert_eq!(f(Some("0")), fuse(false, false));
        for default in [None, Some("attention"), Some("routr"), Some("")] {
            assert_eq!(f(default), fuse(false, true), "{default:?}");
        }
    }
}
