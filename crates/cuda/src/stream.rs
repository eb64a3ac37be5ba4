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

use crate::fusion::{
    self, GroupLaunch, MatGroup, NormLaunch, Pending, Q8Out, RopeKvLaunch, TileLaunch,
};
use crate::kernels::{self, args, launch, AttnParams, BankView, Kernels, MoeAct, RopeParams};
use crate::layout;
use crate::memory::{runtime, DevMem, PinnedF32};
use crate::pinned::PinnedRanges;
use crate::staging::{self, Lane};
use crate::types::{CudaBank, CudaBuf, CudaMatrix, CudaRoutes, CudaVector};
use crate::CudaDevice;
use cudarc::driver::{result, sys, CudaContext, CudaStream as RawStream};
use std::sync::Arc;
use turbospark_backend::{
    bias_mismatch, check_len, check_rope, check_tokens, routes_for, AttentionParams, BackendError,
    ConvParams, DType, DeltaNetInput, DeltaNetLens, DeltaNetParams, Device, ExpertTensors,
    HeadMatmul, Limits, MoeInput, MoeScratch, Numerics, Projection, RopeTable, Route, RouterSpec,
    RouterTables, Stream,
};
use turbospark_core::arch::{Activation, NormScale, NormSpec, RopeKind, RouterKind};
use turbospark_core::QuantFormat;

/// Threads of an attention block.
const ATTN_THREADS: u32 = 128;

/// Query heads whose split-attention partials a stream holds: a layer's
/// heads times their width is at most the widest matrix input (its o
/// projection's), or 64 heads of the widest head, and the split kernels'
/// heads are at least 64 wide.
fn decode_heads(widest: usize, max_head_dim: usize) -> usize {
    widest.max(64 * max_head_dim) / 64
}

/// Bytes of [`CudaStream`]'s `decode_split`: the tickets, then
/// `DECODE_MAX_SPLITS` partials (`head_dim + 2` floats) of every head.
fn decode_split_bytes(widest: usize, max_head_dim: usize) -> usize {
    let heads = decode_heads(widest, max_head_dim);
    let width = widest.max(64 * max_head_dim);
    (heads * 4).next_multiple_of(16) + kernels::DECODE_MAX_SPLITS * (width + 2 * heads) * 4
}

/// A quantization of the MoE input made ahead (see
/// `CudaStream::routed_q8`): the f32 input `x` (`values` long) it was made
/// from, and its codes and scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RoutedQ8 {
    x: u64,
    values: usize,
    xq: u64,
    xd: u64,
}

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

/// An instantiated CUDA graph of one decode step.
struct StepGraph(sys::CUgraphExec);

// SAFETY: a graph exec is a handle usable from any thread of its context.
unsafe impl Send for StepGraph {}

impl Drop for StepGraph {
    fn drop(&mut self) {
        // SAFETY: instantiated once by end_step, destroyed once here.
        let _ = unsafe { result::graph::exec_destroy(self.0) };
    }
}

/// Whether a product of `w` (a format with tensor-core kernels) with the
/// input at `x` fits them (`kernels/tcmm.cu`): rows whole chunks of 32
/// columns, the matrix and its row stride aligned as the format's loads
/// need ([`kernels::tc_align`]), the input 16-byte aligned.
fn tc_fits(w: &CudaMatrix, x: u64) -> bool {
    let align = kernels::tc_align(w.format) as u64;
    w.cols % kernels::TC_CHUNK == 0
        && w.row_bytes as u64 % align == 0
        && w.mem.ptr % align == 0
        && x % 16 == 0
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
            decode_split: zeroed(decode_split_bytes(widest, limits.max_head_dim))?,
            decode_heads: match std::env::var("TURBOSPARK_CUDA_SPLIT").as_deref() {
                Ok("0") => 0,
                _ => decode_heads(widest, limits.max_head_dim),
            },
            decode_split_keys: kernels::decode_split_keys(
                std::env::var("TURBOSPARK_CUDA_SPLIT_KEYS").ok().as_deref(),
            ),
            routed_x: zeroed(match dev.numerics() {
                Numerics::Fast => Q8Regions::new(widest, 0).bytes,
                _ => 0,
            })?,
            routed_q8: std::cell::Cell::new(None),
            fuse: Fuse::from_setting(std::env::var("TURBOSPARK_CUDA_FUSE").ok().as_deref()),
            pending: std::cell::Cell::new(None),
            recording: false,
            graph: None,
            replayed: 0,
            fault_step: std::env::var(FAULT_STEP_VAR)
                .ok()
                .and_then(|v| v.parse().ok()),
            ctx,
        })
    }

    /// The copy stream of `fill_slot` (made now if it is the first copy),
    /// or `None` when copies stay on this stream.
    fn copy_lane(&mut self) -> Result<Option<sys::CUstream>, BackendError> {
        if !self.copy_stream {
            return Ok(None);
        }
        let copies = match &self.copies {
            Some(c) => c,
            None => self
                .copies
                .insert(self.ctx.new_stream().map_err(runtime("fill_slot"))?),
        };
        Ok(Some(copies.cu_stream()))
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
            // A held product reads the old scratch.
            self.flush()?;
            self.graph = None;
            self.quantized.set(None);
            self.q8 = DevMem::zeroed(&self.ctx, r.bytes, "stream scratch")?;
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

    /// A fast matmul (8-bit activations) of `n` rows of `x` into `out`,
    /// held back for its bias and the products that share its input (see
    /// [`crate::fusion`]); a pending norm of `x` quantizes it on the way.
    fn matmul_q8(
        &mut self,
        w: &CudaMatrix,
        x: u64,
        n: usize,
        out: u64,
    ) -> Result<(), BackendError> {
        self.bind_holding("matmul")?;
        let r = self.q8_regions("matmul", n * w.cols, 0)?;
        // The kernel order: MXFP4's differs from Q8_0's.
        let order = usize::from(w.format == QuantFormat::Mxfp4);
        let key = (x, n * w.cols, order);
        let gemv = n < kernels::MMQ_MIN_TOKENS;
        match self.pending.get() {
            Some(Pending::Group(g))
                if gemv && g.takes(w.format, x, n, w.cols) && self.quantized.get() == Some(key) =>
            {
                let mut g = g;
                g.group.push(w.mem.ptr, w.rows, w.row_bytes, out);
                self.pending.set(Some(Pending::Group(g)));
                self.forget_quantized_if(out);
                return Ok(());
            }
            Some(Pending::Norm(nl))
                if nl.out == x
                    && nl.dim == w.cols
                    && nl.rows == n
                    && nl.dim % 32 == 0
                    && nl.dim <= fusion::NORM_HELD =>
            {
                self.pending.set(None);
                // One token's Q8_0 product may be a router, whose MXFP4
                // routed experts then read the same codes in their order:
                // the norm writes both (the experts' own quantization
                // launch saved).
                let both = Q8Regions::new(nl.dim, 0);
                let mxfp4 =
                    (n == 1 && w.format == QuantFormat::Q8_0 && both.bytes <= self.routed_x.bytes)
                        .then(|| RoutedQ8 {
                            x,
                            values: nl.dim,
                            xq: self.routed_x.ptr,
                            xd: self.routed_x.ptr + both.xd,
                        });
                let q = Q8Out {
                    codes: r.xq,
                    scales: r.xd,
                    order: order as i32,
                    mxfp4_codes: mxfp4.map_or(0, |m| m.xq),
                    mxfp4_scales: mxfp4.map_or(0, |m| m.xd),
                };
                fusion::launch_pending(&self.k, self.raw(), Pending::Norm(nl), Some(q))?;
                self.routed_q8.set(mxfp4);
                self.quantized.set(Some(key));
            }
            _ => self.flush()?,
        }
        if self.quantized.get() != Some(key) {
            let set = self
                .q8_set(w.format)
                .expect("a fast format (checked by matmul)");
            self.quantize(set, x, n * w.cols, r.xq, r.xd)?;
            self.quantized.set(Some(key));
        }
        // Matrix-vector kernels, tensor-core tiles for batches (the same
        // bits; only speed decides).
        let p = if gemv {
            Pending::Group(GroupLaunch {
                format: w.format,
                group: MatGroup::one(w.mem.ptr, w.rows, w.row_bytes, out),
                x,
                cols: w.cols,
                n,
                xq: r.xq,
                xd: r.xd,
            })
        } else {
            Pending::Tile(TileLaunch {
                format: w.format,
                w: w.mem.ptr,
                rows: w.rows,
                cols: w.cols,
                row_bytes: w.row_bytes,
                n,
                xq: r.xq,
                xd: r.xd,
                out,
                bias: 0,
            })
        };
        self.pending.set(Some(p));
        self.forget_quantized_if(out);
        Ok(())
    }

    /// A fast product on the tensor cores (`kernels/tcmm.cu`: bf16 weights,
    /// or weights decoded to bf16), held back for its bias and the products
    /// of the same input that follow (one launch, as [`Self::matmul_q8`]'s).
    fn matmul_tc(
        &mut self,
        w: &CudaMatrix,
        x: u64,
        n: usize,
        out: u64,
    ) -> Result<(), BackendError> {
        self.bind_holding("matmul")?;
        match self.pending.get() {
            Some(Pending::Group(mut g))
                if g.takes(w.format, x, n, w.cols)
                    && out != x
                    && !g.group.out[..g.group.count as usize].contains(&x) =>
            {
                g.group.push(w.mem.ptr, w.rows, w.row_bytes, out);
                self.pending.set(Some(Pending::Group(g)));
            }
            _ => {
                self.flush()?;
                self.pending.set(Some(Pending::Group(GroupLaunch {
                    format: w.format,
                    group: MatGroup::one(w.mem.ptr, w.rows, w.row_bytes, out),
                    x,
                    cols: w.cols,
                    n,
                    xq: 0,
                    xd: 0,
                })));
            }
        }
        self.forget_quantized_if(out);
        Ok(())
    }

    /// Forgets the quantized input when `out` overwrites it.
    fn forget_quantized_if(&self, out: u64) {
        if self.quantized.get().is_some_and(|(p, ..)| p == out) {
            self.quantized.set(None);
        }
    }

    /// The pending one-token router product that `route` can join: a
    /// Q8_0 product of one matrix alone (with its bias) writing `logits`.
    fn fusable_router(&self, logits: u64, n_tokens: usize, experts: usize) -> Option<GroupLaunch> {
        match self.pending.get() {
            Some(Pending::Group(g))
                if self.fuse.router
                    && n_tokens == 1
                    && g.n == 1
                    && g.group.count == 1
                    && g.group.out[0] == logits
                    && g.group.rows[0] as usize == experts
                    && g.format == QuantFormat::Q8_0
                    && g.cols <= kernels::ONE_MAX_COLS
                    && self.router_kernel().is_some() =>
            {
                Some(g)
            }
            _ => None,
        }
    }

    fn router_kernel(&self) -> Option<&kernels::OneKernel> {
        self.k
            .q8
            .get(QuantFormat::Q8_0)?
            .one
            .as_ref()?
            .router
            .as_ref()
    }

    /// The router product `g` (pending) and the routing of its logits in
    /// one launch (`router1_q8x_q8_0`), which also quantizes the product's
    /// input in MXFP4's order for the MoE call that follows when its width
    /// fits `routed_x` and the norm before the product has not done so.
    fn route_fused(
        &mut self,
        g: GroupLaunch,
        p: kernels::RouterParams,
        correction: u64,
        expert_scale: u64,
        out: u64,
    ) -> Result<(), BackendError> {
        // The norm that wrote the product's input may have quantized it in
        // MXFP4's order already (`matmul_q8`): then the launch need not.
        let made = self
            .routed_q8
            .get()
            .filter(|m| m.x == g.x && m.values == g.cols);
        self.bind_holding("route")?;
        self.pending.set(None);
        self.quantized.set(None);
        let r = Q8Regions::new(g.cols, 0);
        let premade = g.cols % 32 == 0 && r.bytes <= self.routed_x.bytes;
        let (mq, md) = if premade && made.is_none() {
            (self.routed_x.ptr, self.routed_x.ptr + r.xd)
        } else {
            (0, 0)
        };
        let one = self.router_kernel().expect("checked by fusable_router");
        let rows = kernels::OneWork::Rows(&g.group.rows[..1]);
        let l = one.config(QuantFormat::Q8_0, g.cols, rows)?;
        let (cols, ticket) = (g.cols as i32, self.ticket.ptr);
        let args = &mut args![
            g.group,
            cols,
            g.xq,
            g.xd,
            p,
            correction,
            expert_scale,
            out,
            ticket,
            g.x,
            mq,
            md
        ];
        launch("route", &one.f, self.raw(), l.grid, l.threads, l.smem, args)?;
        if made.is_some() {
            self.routed_q8.set(made);
        } else if premade {
            self.routed_q8.set(Some(RoutedQ8 {
                x: g.x,
                values: g.cols,
                xq: mq,
                xd: md,
            }));
        }
        Ok(())
    }

    /// The tensor-core expert kernels (`kernels/tcmoe.cu`) of `bank`'s
    /// gate/up and down formats, when its products take them: fast
    /// numerics, gate and up in one format with such kernels, down in one
    /// too, rows whole chunks of 32 columns both ways, every matrix and
    /// row stride aligned as its format's loads need, the input `x` and
    /// the activations `act` 16-byte aligned.
    fn tc_experts(
        &self,
        bank: &CudaBank,
        x: u64,
        act: u64,
    ) -> Option<(&kernels::TcExperts, &kernels::TcExperts)> {
        if self.numerics != Numerics::Fast || bank.gate.format != bank.up.format {
            return None;
        }
        let tc = self.k.tc.as_ref()?;
        let (gu, down) = (tc.get(bank.gate.format)?, tc.get(bank.down.format)?);
        let aligned = |m: &crate::types::Stacked| {
            let align = kernels::tc_align(m.format) as u64;
            m.mem.ptr % align == 0 && m.row_bytes as u64 % align == 0
        };
        let fits = bank.hidden % kernels::TC_CHUNK == 0
            && bank.inter % kernels::TC_CHUNK == 0
            && [&bank.gate, &bank.up, &bank.down].into_iter().all(aligned)
            && x % 16 == 0
            && act % 16 == 0;
        fits.then_some((&gu.experts, &down.experts))
    }

    fn bank_view(bank: &CudaBank) -> BankView {
        let opt = |m: &Option<DevMem>| m.as_ref().map_or(0, |m| m.ptr);
        BankView {
            gate: bank.gate.mem.ptr,
            up: bank.up.mem.ptr,
            down: bank.down.mem.ptr,
            gate_bias: opt(&bank.gate_bias),
            up_bias: opt(&bank.up_bias),
            down_bias: opt(&bank.down_bias),
            gate_row_bytes: bank.gate.row_bytes as i64,
            up_row_bytes: bank.up.row_bytes as i64,
            down_row_bytes: bank.down.row_bytes as i64,
            hidden: bank.hidden as i32,
            inter: bank.inter as i32,
            slots: bank.slots as i32,
        }
    }
}

fn activation(act: Activation) -> MoeAct {
    match act {
        Activation::Swiglu => MoeAct {
            act: 0,
            alpha: 0.0,
            limit: 0.0,
        },
        Activation::GeluTanh => MoeAct {
            act: 1,
            alpha: 0.0,
            limit: 0.0,
        },
        Activation::ClampedSwiglu { alpha, limit } => MoeAct {
            act: 2,
            alpha,
            limit,
        },
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
        self.graph = None;
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
        // SAFETY: `graph` is the valid graph just captured.
        let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
        // SAFETY: destroyed once; the instantiated exec does not need it.
        let _ = unsafe { result::graph::destroy(graph) };
        let exec = StepGraph(exec.map_err(runtime("end_step"))?);
        // SAFETY: a valid exec and stream.
        unsafe { result::graph::launch(exec.0, self.raw().cu_stream()) }
            .map_err(runtime("end_step"))?;
        self.graph = Some(exec);
        Ok(())
    }

    fn replay_step(&mut self, token: u32, position: usize) -> Result<bool, BackendError> {
        let Some(exec) = self.graph.as_ref().map(|g| g.0) else {
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
        self.graph = None;
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        self.bind("synchronize")?;
        self.stream.synchronize().map_err(runtime("synchronize"))
    }

    fn write(&mut self, dst: &mut CudaBuf, src: &[f32]) -> Result<(), BackendError> {
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
        for part in Projection::ALL {
            let rows = bank.projection(part).rows;
            self.fill_slot_rows(bank, slot, expert, part, 0..rows)?;
        }
        self.fill_slot_biases(bank, slot, expert)
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
        if slot >= bank.slots {
            return Err(BackendError::BadRoute {
                slot,
                available: bank.slots,
            });
        }
        let (stacked, t) = (bank.projection(part), expert.projection(part));
        if t.format != stacked.format || t.bytes.len() != stacked.host_slot_bytes() {
            return Err(shape(
                "fill_slot",
                format!(
                    "{} ({}, {} bytes) does not fit a slot of {} bytes of {}",
                    t.name,
                    t.format,
                    t.bytes.len(),
                    stacked.host_slot_bytes(),
                    stacked.format
                ),
            ));
        }
        if rows.start > rows.end || rows.end > stacked.rows {
            return Err(shape(
                "fill_slot_rows",
                format!(
                    "rows {}..{} of {} past its {} rows",
                    rows.start, rows.end, t.name, stacked.rows
                ),
            ));
        }
        if rows.is_empty() {
            return Ok(());
        }
        self.bind("fill_slot")?;
        let cu = self.raw().cu_stream();
        let hrb = stacked.host_row_bytes;
        // The rows' byte range lies inside the stacked projection's slot
        // (slot < slots, rows within the slot's, both checked).
        let at =
            stacked.mem.ptr + (slot * stacked.slot_bytes() + rows.start * stacked.row_bytes) as u64;
        let host = &t.bytes.as_slice()[rows.start * hrb..rows.end * hrb];
        let pinned = self.pinned.contains(host);
        if layout::split_parts(stacked.format).is_none() {
            let staged = self
                .ring
                .stage(&self.ctx, Lane::Same(cu), host, pinned, Some(at))?;
            self.ring.release(staged, cu)?;
        } else {
            // Into a staging buffer, then the layout kernel into the slot:
            // the copy may run beside the stream.
            let lane = match self.copy_lane()? {
                Some(copies) => Lane::Beside {
                    copies,
                    compute: cu,
                },
                None => Lane::Same(cu),
            };
            let staged = self.ring.stage(&self.ctx, lane, host, pinned, None)?;
            let queued = layout::queue_split(
                &self.k,
                &self.stream,
                stacked.format,
                staged.device,
                at,
                rows.len(),
                hrb,
            );
            self.ring.release(staged, cu)?;
            queued?;
        }
        if pinned {
            let fence = match &mut self.fills {
                Some(f) => f,
                None => self.fills.insert(staging::Fence::new("fill_slot")?),
            };
            fence.record(cu, "fill_slot")?;
        }
        Ok(())
    }

    fn fill_slot_biases(
        &mut self,
        bank: &mut CudaBank,
        slot: usize,
        expert: &ExpertTensors,
    ) -> Result<(), BackendError> {
        if slot >= bank.slots {
            return Err(BackendError::BadRoute {
                slot,
                available: bank.slots,
            });
        }
        self.bind("fill_slot")?;
        let cu = self.raw().cu_stream();
        for (mem, t, len) in [
            (&bank.gate_bias, &expert.gate_bias, bank.inter),
            (&bank.up_bias, &expert.up_bias, bank.inter),
            (&bank.down_bias, &expert.down_bias, bank.hidden),
        ] {
            match (mem, t) {
                (Some(mem), Some(t)) => {
                    let mut v = vec![0f32; len];
                    turbospark_core::quant::dequantize_row(t.format, t.bytes.as_slice(), &mut v)
                        .map_err(|source| BackendError::Quant {
                            name: t.name.clone(),
                            source,
                        })?;
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    // slot < slots and each slot holds `len` floats.
                    let at = mem.ptr + (slot * len * 4) as u64;
                    let staged =
                        self.ring
                            .stage(&self.ctx, Lane::Same(cu), &bytes, false, Some(at))?;
                    self.ring.release(staged, cu)?;
                }
                (None, None) => {}
                _ => return Err(bias_mismatch(expert)),
            }
        }
        Ok(())
    }

    fn wait_slot_fills(&mut self) -> Result<(), BackendError> {
        self.bind_holding("wait_slot_fills")?;
        match &mut self.fills {
            Some(f) => f.wait("wait_slot_fills"),
            None => Ok(()),
        }
    }

    fn embed(
        &mut self,
        table: &CudaMatrix,
        tokens: &[u32],
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
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
        let xp = x.f32_ptr("matmul", "x", n * w.cols)?;
        let op = out.f32_ptr("matmul", "out", n * w.rows)?;
        if n == 0 || w.rows == 0 {
            return Ok(());
        }
        if self.q8_set(w.format).is_some() {
            return self.matmul_q8(w, xp, n, op);
        }
        if self.numerics == Numerics::Fast
            && self
                .k
                .tc
                .as_ref()
                .is_some_and(|tc| tc.get(w.format).is_some())
            && tc_fits(w, xp)
        {
            return self.matmul_tc(w, xp, n, op);
        }
        self.bind("matmul")?;
        let grid = (
            w.rows.div_ceil(kernels::MM_WARPS) as u32,
            n.div_ceil(kernels::MM_TOKENS) as u32,
            1,
        );
        let (rows, cols, rb, nn) = (w.rows as i32, w.cols as i32, w.row_bytes as i64, n as i32);
        launch(
            "matmul",
            self.k.matmul.get(w.format),
            self.raw(),
            grid,
            (kernels::MM_WARPS * 32) as u32,
            0,
            &mut args![w.mem.ptr, rows, cols, rb, xp, nn, op],
        )
    }

    fn mul_sigmoid_rows(
        &mut self,
        x: &mut CudaBuf,
        gate: &CudaBuf,
        rows: usize,
        dim: usize,
    ) -> Result<(), BackendError> {
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
        let d = bias.len;
        let xp = x.f32_ptr("add_bias", "x", n * d)?;
        // Joins the held product that wrote x.
        match self.pending.get() {
            Some(Pending::Group(mut g)) if g.n == n => {
                if let Some((out, rows, b)) = g.group.last() {
                    if out == xp && rows == d && *b == 0 {
                        *b = bias.mem.ptr;
                        self.pending.set(Some(Pending::Group(g)));
                        return Ok(());
                    }
                }
            }
            Some(Pending::Tile(mut t)) if t.out == xp && t.n == n && t.rows == d && t.bias == 0 => {
                t.bias = bias.mem.ptr;
                self.pending.set(Some(Pending::Tile(t)));
                return Ok(());
            }
            _ => {}
        }
        let (nn, dd) = (n as i32, d as i32);
        self.elementwise(
            "add_bias",
            &self.k.add_bias,
            n * d,
            &mut args![xp, bias.mem.ptr, nn, dd],
        )
    }

    fn rms_norm(
        &mut self,
        x: &mut CudaBuf,
        rows: usize,
        dim: usize,
        spec: NormSpec,
        weight: Option<&CudaVector>,
    ) -> Result<(), BackendError> {
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
        check_rope(table, head_dim)?;
        let pairs = table.pairs();
        if pairs > kernels::MAX_ROPE_PAIRS {
            return Err(BackendError::ScratchTooSmall {
                op: "rope",
                need: pairs,
                have: kernels::MAX_ROPE_PAIRS,
            });
        }
        let xp = x.f32_ptr("rope", "x", n_tokens * n_heads * head_dim)?;
        let mut p = RopeParams {
            inv_freq: [0.0; kernels::MAX_ROPE_PAIRS],
            attention_factor: table.attention_factor,
            pairs: pairs as i32,
            kind: match table.kind {
                RopeKind::Neox => 0,
                RopeKind::Interleaved => 1,
            },
        };
        p.inv_freq[..pairs].copy_from_slice(&table.inv_freq);
        // Held back: the rope of k joins q's, and the cache writes that
        // follow join both (crate::fusion).
        let l = RopeKvLaunch::rope(
            xp,
            n_heads,
            n_tokens,
            head_dim,
            first_pos,
            p,
            self.step_ptr(),
        );
        self.quantized.set(None);
        self.bind_holding("rope")?;
        if let Some(Pending::RopeKv(mut held)) = self.pending.get() {
            if held.join_rope(&l) {
                self.pending.set(Some(Pending::RopeKv(held)));
                return Ok(());
            }
        }
        self.hold(Pending::RopeKv(l))
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
        if n_tokens > capacity {
            return Err(shape(
                "kv_write",
                format!("{n_tokens} rows into a {capacity}-row cache"),
            ));
        }
        let sp = src.f32_ptr("kv_write", "src", n_tokens * row_len)?;
        check_len("kv_write", "cache", cache.len, capacity * row_len)?;
        let f = match cache.dtype {
            DType::F32 => &self.k.kv_write_f32,
            DType::F16 => &self.k.kv_write_f16,
            other => return Err(dtype_err("kv_write", "cache", DType::F16, other)),
        };
        if let Some(Pending::RopeKv(mut held)) = self.pending.get() {
            let f16 = cache.dtype == DType::F16;
            let step = self.step_ptr();
            if held.join_write(
                cache.mem.ptr,
                f16,
                sp,
                n_tokens,
                row_len,
                first_pos,
                capacity,
                step,
            ) {
                self.quantized.set(None);
                self.bind_holding("kv_write")?;
                self.pending.set(Some(Pending::RopeKv(held)));
                return Ok(());
            }
        }
        let (n, r, fp, cap) = (
            n_tokens as i32,
            row_len as i32,
            first_pos as i32,
            capacity as i32,
        );
        let step = self.step_ptr();
        self.elementwise(
            "kv_write",
            f,
            n_tokens * row_len,
            &mut args![cache.mem.ptr, sp, n, r, fp, cap, step],
        )
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
        if p.n_tokens == 0 {
            return Ok(());
        }
        let keys_seen = p.check()?;
        let q_len = p.n_tokens * p.n_heads * p.head_dim;
        let cache_len = p.capacity * p.n_kv_heads * p.head_dim;
        let qp = q.f32_ptr("attention", "q", q_len)?;
        let op = out.f32_ptr("attention", "out", q_len)?;
        if k_cache.dtype != v_cache.dtype {
            return Err(dtype_err(
                "attention",
                "v_cache",
                k_cache.dtype,
                v_cache.dtype,
            ));
        }
        check_len("attention", "k_cache", k_cache.len, cache_len)?;
        check_len("attention", "v_cache", v_cache.len, cache_len)?;
        if let Some(s) = sinks {
            check_len("attention", "sinks", s.len, p.n_heads)?;
        }
        // A recorded step is replayed at later positions: room for every
        // key the cache can hold.
        let max_keys = if self.recording {
            p.capacity
        } else {
            keys_seen
        };
        let group = p.n_heads / p.n_kv_heads.max(1);
        // One token over an f16 cache: split over the keys (no shared
        // memory per key), a block per KV head and split serving the
        // group's query heads.
        let splits = kernels::decode_splits(p.capacity, p.window, self.decode_split_keys);
        let tickets = (self.decode_heads * 4).next_multiple_of(16);
        let split_kernel = match p.head_dim {
            64 => Some(&self.k.attention_decode_f16_64),
            128 => Some(&self.k.attention_decode_f16_128),
            _ => None,
        }
        .filter(|_| {
            p.n_tokens == 1
                && k_cache.dtype == DType::F16
                && (1..=kernels::ATTN_MAX_GROUP).contains(&group)
                && p.n_kv_heads <= self.decode_heads
                && tickets + splits * p.n_heads * (p.head_dim + 2) * 4 <= self.decode_split.bytes
        });
        let smem = (p.head_dim + max_keys) * 4;
        if split_kernel.is_none() && smem > self.k.dynamic_smem {
            return Err(BackendError::ScratchTooSmall {
                op: "attention",
                need: max_keys,
                have: self.k.dynamic_smem / 4 - p.head_dim,
            });
        }
        let f = match k_cache.dtype {
            DType::F32 => &self.k.attention_f32,
            DType::F16 => &self.k.attention_f16,
            other => return Err(dtype_err("attention", "k_cache", DType::F16, other)),
        };
        let params = AttnParams {
            first_pos: p.first_pos as i32,
            n_heads: p.n_heads as i32,
            n_kv_heads: p.n_kv_heads as i32,
            head_dim: p.head_dim as i32,
            capacity: p.capacity as i32,
            window: p.window.map_or(0, |w| w as i32),
            scale: p.scale,
            softcap: p.softcap.unwrap_or(0.0),
            has_sinks: sinks.is_some() as i32,
        };
        let sp = sinks.map_or(0, |s| s.mem.ptr);
        let step = self.step_ptr();
        self.bind("attention")?;
        // Prefill of grouped-query attention: a block per KV head and
        // token serves the group's query heads (each key read once).
        let sets = ((ATTN_THREADS as usize) / p.head_dim.max(1)).clamp(1, group.max(1));
        let group_smem = (group * p.head_dim + group * keys_seen) * 4;
        if !self.recording
            && p.n_tokens > 1
            && (2..=kernels::ATTN_MAX_GROUP).contains(&group)
            && p.head_dim % 4 == 0
            && (ATTN_THREADS as usize) % p.head_dim == 0
            && group % sets == 0
            && group_smem <= self.k.dynamic_smem
        {
            let f = match k_cache.dtype {
                DType::F32 => &self.k.attention_group_f32,
                _ => &self.k.attention_group_f16,
            };
            return launch(
                "attention",
                f,
                self.raw(),
                (p.n_kv_heads as u32, p.n_tokens as u32, 1),
                ATTN_THREADS,
                group_smem as u32,
                &mut args![qp, k_cache.mem.ptr, v_cache.mem.ptr, params, sp, op],
            );
        }
        // In fast numerics the output is also quantized for the product
        // that reads it next (the o projection: Q8_0's order), into the
        // scratch where that product's `matmul_q8` looks for it.
        // (Only into the scratch as it is: a larger one is made by the
        // product, which then quantizes for itself.)
        let (mut oq, mut oqd) = (0u64, 0u64);
        let mut r = Q8Regions::new(q_len, 0);
        if self.fuse.attention
            && self.numerics == Numerics::Fast
            && p.head_dim % 32 == 0
            && r.bytes <= self.q8.bytes
        {
            r.rebase(self.q8.ptr);
            (oq, oqd) = (r.xq, r.xd);
        }
        match split_kernel {
            Some(f) => {
                let (tp, pp) = (
                    self.decode_split.ptr,
                    self.decode_split.ptr + tickets as u64,
                );
                launch(
                    "attention",
                    f,
                    self.raw(),
                    (p.n_kv_heads as u32, splits as u32, 1),
                    kernels::DECODE_THREADS,
                    0,
                    &mut args![
                        qp,
                        k_cache.mem.ptr,
                        v_cache.mem.ptr,
                        params,
                        sp,
                        op,
                        step,
                        oq,
                        oqd,
                        pp,
                        tp
                    ],
                )?
            }
            _ => launch(
                "attention",
                f,
                self.raw(),
                (p.n_heads as u32, p.n_tokens as u32, 1),
                ATTN_THREADS,
                smem as u32,
                &mut args![
                    qp,
                    k_cache.mem.ptr,
                    v_cache.mem.ptr,
                    params,
                    sp,
                    op,
                    step,
                    oq,
                    oqd
                ],
            )?,
        }
        if oq != 0 {
            self.quantized.set(Some((op, q_len, 0)));
        }
        Ok(())
    }

    fn glu(
        &mut self,
        gate: &mut CudaBuf,
        up: &CudaBuf,
        len: usize,
        act: Activation,
    ) -> Result<(), BackendError> {
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
        let (e, k) = (router.num_experts(), router.top_k());
        let lp = logits.f32_ptr("route", "logits", n_tokens * e)?;
        if routes_for("route", out, n_tokens)? != k {
            return Err(shape(
                "route",
                format!("routes of {} per token for a top-{k} router", out.top_k),
            ));
        }
        for (what, t) in [
            ("correction", tables.correction),
            ("expert_scale", tables.expert_scale),
        ] {
            if let Some(t) = t {
                check_len("route", what, t.len, e)?;
            }
        }
        if e > kernels::MAX_ROUTE_EXPERTS
            || k > kernels::MAX_TOP_K
            || router.groups() > kernels::MAX_GROUPS
        {
            return Err(BackendError::Router {
                num_experts: e,
                top_k: k,
                problem: "more experts, ranks or groups than the CUDA router handles (512, 32, 64)",
            });
        }
        let mut p = kernels::RouterParams {
            kind: 0,
            num_experts: e as i32,
            top_k: k as i32,
            renormalize: 0,
            n_group: 0,
            topk_group: 0,
            scaling: 1.0,
        };
        match router.kind() {
            RouterKind::SoftmaxTopK { renormalize } => p.renormalize = renormalize as i32,
            RouterKind::TopKSoftmax => p.kind = 1,
            RouterKind::SigmoidGrouped {
                n_group,
                topk_group,
                renormalize,
                scaling,
            } => {
                p.kind = 2;
                p.n_group = n_group as i32;
                p.topk_group = topk_group as i32;
                p.renormalize = renormalize as i32;
                p.scaling = scaling;
            }
            RouterKind::Gemma4 => p.kind = 3,
        }
        let cp = tables.correction.map_or(0, |v| v.mem.ptr);
        let sp = tables.expert_scale.map_or(0, |v| v.mem.ptr);
        let n = n_tokens as i32;
        out.max_slot = (e - 1) as u32;
        if let Some(g) = self.fusable_router(lp, n_tokens, e) {
            return self.route_fused(g, p, cp, sp, out.mem.ptr);
        }
        // The routing writes only the routes: a quantization of the MoE
        // input made before it stays valid.
        let routed = self.routed_q8.get();
        self.bind("route")?;
        self.routed_q8.set(routed);
        launch(
            "route",
            &self.k.route,
            self.raw(),
            (n_tokens as u32, 1, 1),
            32,
            0,
            &mut args![lp, n, p, cp, sp, out.mem.ptr],
        )
    }

    fn moe_experts(
        &mut self,
        input: MoeInput<'_, CudaDevice>,
        scratch: &mut MoeScratch<CudaBuf>,
        only: Option<&[bool]>,
    ) -> Result<(), BackendError> {
        let MoeInput {
            x,
            n_tokens: n,
            routes,
            bank,
            activation: act,
        } = input;
        if n == 0 {
            return Ok(());
        }
        let k = routes_for("moe", routes, n)?;
        let (hidden, inter) = (bank.hidden, bank.inter);
        let xp = x.f32_ptr("moe", "x", n * hidden)?;
        let yp = scratch.y.f32_ptr("moe", "scratch.y", n * k * hidden)?;
        if self.act_len < n * k * inter {
            return Err(BackendError::ScratchTooSmall {
                op: "moe",
                need: n * k * inter,
                have: self.act_len,
            });
        }
        let mut mask = kernels::SlotMask {
            bits: [0; kernels::MAX_MASK_SLOTS / 32],
            on: 0,
        };
        if let Some(only) = only {
            check_len("moe", "only", only.len(), bank.slots)?;
            if bank.slots > kernels::MAX_MASK_SLOTS {
                return Err(shape(
                    "moe",
                    format!(
                        "a slot mask over {} slots (at most {})",
                        bank.slots,
                        kernels::MAX_MASK_SLOTS
                    ),
                ));
            }
            mask.on = 1;
            for (s, _) in only[..bank.slots].iter().enumerate().filter(|(_, &o)| o) {
                mask.bits[s / 32] |= 1 << (s % 32);
            }
        }
        if routes.max_slot as usize >= bank.slots {
            return Err(BackendError::BadRoute {
                slot: routes.max_slot as usize,
                available: bank.slots,
            });
        }
        let view = Self::bank_view(bank);
        let a = activation(act);
        let kk = k as i32;
        // The fused router launch's quantization of this very input (read
        // before `bind`, which forgets it).
        let premade = self.routed_q8.get().filter(|r| {
            r.x == xp && r.values == n * hidden && bank.gate.format == QuantFormat::Mxfp4
        });
        self.bind("moe")?;
        let threads = (kernels::MM_WARPS * 32) as u32;
        let passes: &[(turbospark_core::QuantFormat, i32)] = if bank.gate.format == bank.up.format {
            &[(bank.gate.format, 0)]
        } else {
            &[(bank.gate.format, 1), (bank.up.format, 2)]
        };
        let grouped =
            n > 1 && bank.slots <= kernels::MAX_MASK_SLOTS && self.order.bytes >= n * k * 4;
        let fast = bank.gate.format == bank.up.format
            && self.q8_set(bank.gate.format).is_some()
            && self.q8_set(bank.down.format).is_some();
        let (order, offsets) = (self.order.ptr, self.offsets.ptr);
        if grouped {
            let (nr, slots) = ((n * k) as i32, bank.slots as i32);
            launch(
                "moe",
                &self.k.moe_group,
                self.raw(),
                (1, 1, 1),
                1024,
                ((bank.slots + 1) * 4) as u32,
                &mut args![routes.mem.ptr, nr, slots, mask, order, offsets],
            )?;
        }
        let rows_grid = |rows: usize| {
            let y = if grouped { bank.slots } else { n * k };
            (rows.div_ceil(kernels::MM_WARPS) as u32, y as u32, 1)
        };
        let act_ptr = self.act.ptr;
        if fast {
            let r = self.q8_regions("moe", n * hidden, n * k * inter)?;
            let gate = self.q8_set(bank.gate.format).expect("checked above");
            let down = self.q8_set(bank.down.format).expect("checked above");
            let q8_grid = |rows: usize, per: usize| {
                let y = if grouped { bank.slots } else { n * k };
                (rows.div_ceil(per) as u32, y as u32, 1)
            };
            let rp = routes.mem.ptr;
            let mmq = grouped && n >= kernels::MMQ_MIN_TOKENS;
            // Per stage: tensor-core tiles for batches, grouped or
            // per-route matrix-vector kernels otherwise (the same bits).
            let pick = |tiles, grouped_f, per_route, tile_rows| {
                if mmq {
                    (tiles, tile_rows, kernels::MQ_THREADS)
                } else if grouped {
                    (grouped_f, kernels::Q8_BLOCK_ROWS, kernels::Q8_THREADS)
                } else {
                    (per_route, kernels::Q8_BLOCK_ROWS, kernels::Q8_THREADS)
                }
            };
            let (xq, xd) = if let Some(q) = premade {
                (q.xq, q.xd)
            } else {
                self.quantize(gate, xp, n * hidden, r.xq, r.xd)?;
                (r.xq, r.xd)
            };
            // Routes one by one over rows that fit the one-token kernels:
            // those (the same bits, see kernels/q8one.cu).
            let fits =
                !grouped && hidden <= kernels::ONE_MAX_COLS && inter <= kernels::ONE_MAX_COLS;
            if let (true, Some(g1), Some(d1)) = (fits, gate.one.as_ref(), down.one.as_ref()) {
                let nr = (n * k) as i32;
                let work = kernels::OneWork::GateUp {
                    routes: n * k,
                    inter,
                };
                let l = g1.gate_up.config(bank.gate.format, hidden, work)?;
                let args = &mut args![xq, xd, rp, kk, nr, mask, view, a, act_ptr];
                launch(
                    "moe",
                    &g1.gate_up.f,
                    self.raw(),
                    l.grid,
                    l.threads,
                    l.smem,
                    args,
                )?;
                self.quantize(down, act_ptr, n * k * inter, r.aq, r.ad)?;
                let work = kernels::OneWork::Down {
                    routes: n * k,
                    hidden,
                };
                let l = d1.down.config(bank.down.format, inter, work)?;
                let args = &mut args![r.aq, r.ad, rp, nr, mask, view, yp];
                return launch(
                    "moe",
                    &d1.down.f,
                    self.raw(),
                    l.grid,
                    l.threads,
                    l.smem,
                    args,
                );
            }
            // Routes one by one on the integer tensor cores where asked
            // for (MXFP4; the same bits, see kernels/q8mma.cu). The gate/up
            // launch also quantizes the down products' input.
            let mma_fits = !grouped
                && hidden <= kernels::MMA_MAX_COLS
                && inter <= kernels::MMA_MAX_COLS
                && inter % kernels::MMA_GU_ROWS == 0;
            if let (true, Some(g_mma), Some(d_mma)) =
                (mma_fits, gate.mma.as_ref(), down.mma.as_ref())
            {
                let (g_mma, d_mma) = (g_mma.gate_up_for(hidden), d_mma.down_for(inter));
                let routes_y = (n * k) as u32;
                let (aq, ad) = (r.aq, r.ad);
                let args = &mut args![xq, xd, rp, kk, mask, view, a, act_ptr, aq, ad];
                let grid = ((inter / kernels::MMA_GU_ROWS) as u32, routes_y, 1);
                let threads = kernels::MMA_GU_THREADS;
                launch("moe", g_mma, self.raw(), grid, threads, 0, args)?;
                let args = &mut args![aq, ad, rp, mask, view, yp];
                let grid = (hidden.div_ceil(kernels::MMA_ROWS) as u32, routes_y, 1);
                return launch(
                    "moe",
                    d_mma,
                    self.raw(),
                    grid,
                    kernels::MMA_THREADS,
                    0,
                    args,
                );
            }
            let (f, per, threads) = pick(
                &gate.mq_gate_up,
                &gate.gate_up_grouped,
                gate.route.gate_up_for(hidden),
                kernels::MQ_BM / 2,
            );
            let grouped_args = &mut args![xq, xd, order, offsets, kk, view, a, act_ptr];
            let route_args = &mut args![xq, xd, rp, kk, mask, view, a, act_ptr];
            let args = if grouped { grouped_args } else { route_args };
            launch("moe", f, self.raw(), q8_grid(inter, per), threads, 0, args)?;
            self.quantize(down, act_ptr, n * k * inter, r.aq, r.ad)?;
            let (f, per, threads) = pick(
                &down.mq_down,
                &down.down_grouped,
                down.route.down_for(inter),
                kernels::MQ_BM,
            );
            let grouped_args = &mut args![r.aq, r.ad, order, offsets, view, yp];
            let route_args = &mut args![r.aq, r.ad, rp, mask, view, yp];
            let args = if grouped { grouped_args } else { route_args };
            return launch("moe", f, self.raw(), q8_grid(hidden, per), threads, 0, args);
        }
        if let Some((gu, down)) = self.tc_experts(bank, xp, act_ptr) {
            // Fast numerics on the tensor cores (kernels/tcmoe.cu): routes
            // one by one, or grouped by expert; the same bits either way.
            let rp = routes.mem.ptr;
            if grouped {
                let slots = bank.slots as u32;
                let rows = |r: usize| (r.div_ceil(kernels::TC_BATCH_ROWS) as u32, slots, 1);
                let threads = kernels::TC_BATCH_THREADS;
                let args = &mut args![xp, order, offsets, kk, view, a, act_ptr];
                launch(
                    "moe",
                    &gu.gate_up_grouped,
                    self.raw(),
                    rows(inter),
                    threads,
                    0,
                    args,
                )?;
                let args = &mut args![act_ptr, order, offsets, view, yp];
                return launch(
                    "moe",
                    &down.down_grouped,
                    self.raw(),
                    rows(hidden),
                    threads,
                    0,
                    args,
                );
            }
            let routes_y = (n * k) as u32;
            let tiles = |r: usize| (r.div_ceil(16) as u32, routes_y, 1);
            let threads = |cols: usize| (kernels::tc_segments(cols) * 32) as u32;
            let args = &mut args![xp, rp, kk, mask, view, a, act_ptr];
            launch(
                "moe",
                &gu.gate_up_few,
                self.raw(),
                tiles(inter),
                threads(hidden),
                0,
                args,
            )?;
            let args = &mut args![act_ptr, rp, mask, view, yp];
            return launch(
                "moe",
                &down.down_few,
                self.raw(),
                tiles(hidden),
                threads(inter),
                0,
                args,
            );
        }
        if !grouped {
            for &(fmt, mode) in passes {
                launch(
                    "moe",
                    self.k.moe_gate_up.get(fmt),
                    self.raw(),
                    rows_grid(inter),
                    threads,
                    0,
                    &mut args![xp, routes.mem.ptr, kk, mask, view, a, act_ptr, mode],
                )?;
            }
            return launch(
                "moe",
                self.k.moe_down.get(bank.down.format),
                self.raw(),
                rows_grid(hidden),
                threads,
                0,
                &mut args![act_ptr, routes.mem.ptr, mask, view, yp],
            );
        }
        for &(fmt, mode) in passes {
            launch(
                "moe",
                self.k.moe_gate_up_grouped.get(fmt),
                self.raw(),
                rows_grid(inter),
                threads,
                0,
                &mut args![xp, order, offsets, kk, view, a, act_ptr, mode],
            )?;
        }
        launch(
            "moe",
            self.k.moe_down_grouped.get(bank.down.format),
            self.raw(),
            rows_grid(hidden),
            threads,
            0,
            &mut args![act_ptr, order, offsets, view, yp],
        )
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
        const OP: &str = "moe_intermediate";
        let MoeInput {
            x,
            n_tokens: n,
            routes,
            bank,
            activation: act,
        } = input;
        if n == 0 {
            return Ok(());
        }
        let k = routes_for(OP, routes, n)?;
        let (hidden, inter) = (bank.hidden, bank.inter);
        let xp = x.f32_ptr(OP, "x", n * hidden)?;
        let op = out.f32_ptr(OP, "out", n * k * inter)?;
        if routes.max_slot as usize >= bank.slots {
            return Err(BackendError::BadRoute {
                slot: routes.max_slot as usize,
                available: bank.slots,
            });
        }
        let all = kernels::SlotMask {
            bits: [0; kernels::MAX_MASK_SLOTS / 32],
            on: 0,
        };
        let view = Self::bank_view(bank);
        let a = activation(act);
        let kk = k as i32;
        let passes: &[(turbospark_core::QuantFormat, i32)] = if bank.gate.format == bank.up.format {
            &[(bank.gate.format, 0)]
        } else {
            &[(bank.gate.format, 1), (bank.up.format, 2)]
        };
        self.bind(OP)?;
        let grid = (inter.div_ceil(kernels::MM_WARPS) as u32, (n * k) as u32, 1);
        for &(fmt, mode) in passes {
            launch(
                OP,
                self.k.moe_gate_up.get(fmt),
                self.raw(),
                grid,
                (kernels::MM_WARPS * 32) as u32,
                0,
                &mut args![xp, routes.mem.ptr, kk, all, view, a, op, mode],
            )?;
        }
        Ok(())
    }

    fn moe_combine(
        &mut self,
        n_tokens: usize,
        hidden: usize,
        routes: &CudaRoutes,
        scratch: &MoeScratch<CudaBuf>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if n_tokens == 0 || hidden == 0 {
            return Ok(());
        }
        let k = routes_for("moe", routes, n_tokens)?;
        if k == 0 {
            return Err(shape("moe", format!("no routes for {n_tokens} tokens")));
        }
        let yp = scratch
            .y
            .f32_ptr("moe", "scratch.y", n_tokens * k * hidden)?;
        let op = out.f32_ptr("moe", "out", n_tokens * hidden)?;
        // Held for the residual add that reads `out`, whose norm may form
        // the sum itself (see crate::fusion).
        self.quantized.set(None);
        self.bind_holding("moe")?;
        self.hold(Pending::Combine(fusion::CombineLaunch {
            y: yp,
            routes: routes.mem.ptr,
            n: n_tokens,
            k,
            hidden,
            out: op,
        }))
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
