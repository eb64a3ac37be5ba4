//! Ops held back by one call so that the next can join their launch.
//!
//! Most of a decode step's kernels move a few kilobytes, and each costs
//! its launch (or graph node), its wait for the kernel before it and its
//! own serial latency: 2–9 µs each on an H200, a third of a gpt-oss token
//! (BENCHMARKS.md, ninth session; with programmatic dependent launch the
//! launch itself mostly overlaps, and a fused launch saves only what its
//! parts did not already overlap). The engine's op sequence is
//! backend-neutral, so instead of new ops the CUDA stream keeps the last
//! fusable op *pending* and launches it when the next op arrives —
//! together with that op where the two compose:
//!
//! - a residual add, the copy of its sum and the RMS norm of the copy
//!   (`h += o; a = h; norm(a)`) are one `rms_norm` launch — with the MoE
//!   call's sum of its routes' outputs that wrote `o` (`moe_combine`)
//!   formed there too;
//! - that norm also writes the 8-bit quantization of its output when the
//!   next op is a fast matmul of it (the quantization the matmul would
//!   launch itself); for one token's Q8_0 product also in MXFP4's order,
//!   which the routed experts take when a router product it was (stream/mod.rs
//!   `routed_q8`);
//! - matrix-vector products of one quantized input (q, k, v) are one
//!   `matmul_q8x` launch over a [`MatGroup`], each with the bias add that
//!   follows it;
//! - the rope of q and of k at the same positions and the cache writes
//!   of k (the roped tensor) and v that follow are one `rope_kv` launch
//!   ([`RopeKvLaunch`]); opt-in (`TURBOSPARK_CUDA_QKV_ROPE=1`), one
//!   token's q, k and v products take them into their own launch
//!   ([`Pending::QkvRope`]).
//!
//! Every fused launch computes the same values in the same order as the
//! separate kernels (`kernels/elementwise.cu` `rms_norm_row`, `rope_kv`,
//! `kernels/q8dot.cu` `matmul_q8_impl`), so results are bit-identical; only
//! launches are saved. Any other op first launches what is pending
//! ([`CudaStream`](crate::CudaStream)'s `bind`), so the order of device
//! work is the order of the calls.

use crate::kernels::{self, args, launch, Kernels, QkvRopeParams, RopeKvParams, RopeParams};
use cudarc::driver::{result, CudaStream as RawStream};
use turbospark_backend::BackendError;
use turbospark_core::QuantFormat;

/// Most matrices one grouped matrix-vector launch takes (`MAT_GROUP`).
pub(crate) const MAT_GROUP: usize = 3;

/// Mirror of `MatGroup` in `kernels/q8dot.cu`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct MatGroup {
    pub w: [u64; MAT_GROUP],
    pub out: [u64; MAT_GROUP],
    pub bias: [u64; MAT_GROUP],
    pub row_bytes: [i64; MAT_GROUP],
    pub rows: [i32; MAT_GROUP],
    pub block_start: [i32; MAT_GROUP + 1],
    pub count: i32,
}

/// The sum of a MoE call's routed outputs into `out` (`moe_combine`):
/// `out[t, c] = Σ_r w[t, r] · y[t·k + r, c]` in rank order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct CombineLaunch {
    pub y: u64,
    pub routes: u64,
    pub n: usize,
    pub k: usize,
    pub hidden: usize,
    pub out: u64,
}

impl CombineLaunch {
    /// Whether `vals` f32 values at `p` overlap what the sum reads (the
    /// routes' outputs and the routes): such a buffer cannot be written by
    /// the launch that forms the sum.
    pub(crate) fn reads(&self, p: u64, vals: usize) -> bool {
        let at = (p, vals * 4);
        meet(at, (self.y, self.n * self.k * self.hidden * 4))
            || meet(at, (self.routes, self.n * self.k * 8))
    }
}

/// Mirror of `NormCombine` in `kernels/elementwise.cu`, passed by value
/// (`y` 0: none).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NormCombine {
    y: u64,
    routes: u64,
    k: i32,
}

/// An RMS norm of `rows × dim` values of `h` into `out` (which may be
/// `h`), after `h += add` when `add` is set — where `add` is first formed
/// by `combine` when that is set (the MoE output the residual add reads).
#[derive(Clone, Copy)]
pub(crate) struct NormLaunch {
    pub add: u64,
    pub combine: Option<CombineLaunch>,
    pub h: u64,
    pub out: u64,
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
    pub mode: i32,
    pub w: u64,
}

/// Where a norm also writes its output's quantization: codes, scales and
/// the codes' order (`Q8_ORDER_*`); and, when `mxfp4_codes` is not 0, the
/// same codes again in MXFP4's order with their scales (for the routed
/// experts after a router product in natural order).
#[derive(Clone, Copy)]
pub(crate) struct Q8Out {
    pub codes: u64,
    pub scales: u64,
    pub order: i32,
    pub mxfp4_codes: u64,
    pub mxfp4_scales: u64,
}

/// Fast matrix-vector products of one input: with `q8`, of its
/// quantization (`xq`, `xd`, from the f32 input at `x`: Q8_0, MXFP4, and
/// kq.cu's formats on its kernels); else on the tensor cores (tcmm.cu, any
/// number of tokens) of `x` itself, `xq` and `xd` unused.
#[derive(Clone, Copy)]
pub(crate) struct GroupLaunch {
    pub format: QuantFormat,
    pub group: MatGroup,
    pub x: u64,
    pub cols: usize,
    pub n: usize,
    pub q8: bool,
    pub xq: u64,
    pub xd: u64,
}

impl GroupLaunch {
    /// Whether a product of `format` weights `cols` wide of the same `n`
    /// tokens at `x` (`q8`: of their quantization) can join this group:
    /// its input, shape, format and kernels, and room for one more matrix.
    pub(crate) fn takes(
        &self,
        format: QuantFormat,
        x: u64,
        n: usize,
        cols: usize,
        q8: bool,
    ) -> bool {
        self.format == format
            && self.x == x
            && self.n == n
            && self.cols == cols
            && self.q8 == q8
            && self.group.count < MAT_GROUP as i32
    }
}

/// A tensor-core product of a batch (`mq_matmul`).
#[derive(Clone, Copy)]
pub(crate) struct TileLaunch {
    pub format: QuantFormat,
    pub w: u64,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    pub n: usize,
    pub xq: u64,
    pub xd: u64,
    pub out: u64,
    pub bias: u64,
}

/// Ropes of up to two tensors at the same positions and up to two cache
/// writes after them (`rope_kv`).
#[derive(Clone, Copy)]
pub(crate) struct RopeKvLaunch {
    pub r: RopeKvParams,
    pub p: RopeParams,
    /// A recorded step's parameters (the position), or 0.
    pub step: u64,
}

impl RopeKvLaunch {
    /// The rope of `x` (`[n_tokens, heads, head_dim]`) alone.
    pub(crate) fn rope(
        x: u64,
        heads: usize,
        n_tokens: usize,
        head_dim: usize,
        first_pos: usize,
        p: RopeParams,
        step: u64,
    ) -> RopeKvLaunch {
        let mut r = RopeKvParams {
            n_x: 1,
            n_tokens: n_tokens as i32,
            head_dim: head_dim as i32,
            first_pos: first_pos as i32,
            ..RopeKvParams::default()
        };
        r.x[0] = x;
        r.heads[0] = heads as i32;
        RopeKvLaunch { r, p, step }
    }

    /// Adds the rope of `x` when it is at this launch's positions with the
    /// same table, and no write has joined yet.
    pub(crate) fn join_rope(&mut self, other: &RopeKvLaunch) -> bool {
        let o = &other.r;
        let fits = self.r.n_x == 1
            && self.r.n_w == 0
            && o.n_x == 1
            && (o.n_tokens, o.head_dim, o.first_pos)
                == (self.r.n_tokens, self.r.head_dim, self.r.first_pos)
            && other.step == self.step
            && other.p == self.p
            && o.x[0] != self.r.x[0]
            // Each element is rotated by one thread: the tensors apart.
            && !meet((o.x[0], other.x_bytes(0)), (self.r.x[0], self.x_bytes(0)));
        if fits {
            self.r.x[1] = o.x[0];
            self.r.heads[1] = o.heads[0];
            self.r.n_x = 2;
        }
        fits
    }

    /// Adds the write of `n_tokens` rows of `row_len` from `src` into
    /// `cache` (rows `(first_pos + t) % capacity`) when it follows these
    /// ropes: the same tokens and positions, and `src` either one of the
    /// roped tensors, whole (written by no other write: the thread that
    /// rotates a pair stores it for one write only), or clear of them.
    /// The threads of one launch run in no order, so the cache must also
    /// be clear of the roped tensors and of the earlier write's cache and
    /// source, and a plain source clear of the earlier write's cache (the
    /// separate kernels ordered those accesses).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn join_write(
        &mut self,
        cache: u64,
        f16: bool,
        src: u64,
        n_tokens: usize,
        row_len: usize,
        first_pos: usize,
        capacity: usize,
        step: u64,
    ) -> bool {
        let r = &self.r;
        let w = r.n_w as usize;
        if w >= kernels::ROPE_KV_MAX
            || (n_tokens as i32, first_pos as i32) != (r.n_tokens, r.first_pos)
            || step != self.step
        {
            return false;
        }
        let roped = (0..r.n_x as usize).find(|&i| r.x[i] == src);
        if let Some(i) = roped {
            if row_len != r.heads[i] as usize * r.head_dim as usize
                || r.roped[..w].contains(&(i as i32))
            {
                return false;
            }
        }
        let xs = (0..r.n_x as usize).map(|i| (r.x[i], self.x_bytes(i)));
        let caches = (0..w).map(|j| (r.cache[j], self.cache_bytes(j)));
        let srcs = (0..w).map(|j| (r.src[j], self.src_bytes(j)));
        let cache_at = (cache, capacity * row_len * if f16 { 2 } else { 4 });
        let src_at = (src, n_tokens * row_len * 4);
        if xs
            .clone()
            .chain(caches.clone())
            .chain(srcs)
            .any(|o| meet(cache_at, o))
            || (roped.is_none() && xs.chain(caches).any(|o| meet(src_at, o)))
        {
            return false;
        }
        let r = &mut self.r;
        r.cache[w] = cache;
        r.src[w] = src;
        r.row_len[w] = row_len as i32;
        r.capacity[w] = capacity as i32;
        r.f16[w] = i32::from(f16);
        r.roped[w] = roped.map_or(-1, |i| i as i32);
        r.n_w += 1;
        true
    }

    /// Bytes of roped tensor `i`.
    fn x_bytes(&self, i: usize) -> usize {
        let r = &self.r;
        r.n_tokens as usize * r.heads[i] as usize * r.head_dim as usize * 4
    }

    /// Bytes of write `w`'s cache.
    fn cache_bytes(&self, w: usize) -> usize {
        let r = &self.r;
        r.capacity[w] as usize * r.row_len[w] as usize * if r.f16[w] != 0 { 2 } else { 4 }
    }

    /// Bytes write `w` reads.
    fn src_bytes(&self, w: usize) -> usize {
        self.r.n_tokens as usize * self.r.row_len[w] as usize * 4
    }

    /// Threads of the launch, in the kernel's order of its parts.
    fn threads(&self) -> usize {
        let r = &self.r;
        let (n, hd, pairs) = (
            r.n_tokens as usize,
            r.head_dim as usize,
            self.p.pairs as usize,
        );
        let ropes: usize = (0..r.n_x as usize)
            .map(|i| n * r.heads[i] as usize * pairs)
            .sum();
        let writes: usize = (0..r.n_w as usize)
            .map(|w| {
                let row = r.row_len[w] as usize;
                if r.roped[w] >= 0 {
                    n * (row / hd) * (hd - 2 * pairs)
                } else {
                    n * row
                }
            })
            .sum();
        ropes + writes
    }
}

/// Whether two byte ranges `(start, len)` share a byte.
fn meet((a, a_len): (u64, usize), (b, b_len): (u64, usize)) -> bool {
    a_len > 0 && b_len > 0 && a < b + b_len as u64 && b < a + a_len as u64
}

/// The op a stream holds back. Copied in and out of the stream's cell on
/// every op: the rope's table makes it about 1.2 KB, nothing beside a
/// launch.
#[derive(Clone, Copy)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Pending {
    /// `dst[..len] += src[..len]`, after `combine` (which writes `src`)
    /// when set.
    Add {
        dst: u64,
        src: u64,
        len: usize,
        combine: Option<CombineLaunch>,
    },
    /// `dst[..len] = src[..len]` (f32 values).
    Copy {
        src: u64,
        dst: u64,
        len: usize,
    },
    /// `h += add`, then `dst = h` (`len` values each), after `combine`
    /// (which writes `add`) when set.
    AddCopy {
        h: u64,
        add: u64,
        dst: u64,
        len: usize,
        combine: Option<CombineLaunch>,
    },
    Combine(CombineLaunch),
    Norm(NormLaunch),
    Group(GroupLaunch),
    Tile(TileLaunch),
    RopeKv(RopeKvLaunch),
    /// One token's q, k and v products (a group of three) and the ropes
    /// and cache writes that follow them, held together: one launch
    /// (`matmul1_q8x_q8_0_rope`, opt-in: `TURBOSPARK_CUDA_QKV_ROPE=1`)
    /// where [`qkv_rope_params`] takes them, else the group's launch and
    /// then `rope_kv`'s.
    QkvRope(GroupLaunch, RopeKvLaunch),
}

/// Whether the rope `rope` may join the held products `g` (then held as
/// [`Pending::QkvRope`] until its writes join): one token's q, k and v
/// products of Q8_0 weights and 8-bit activations, the first of them
/// roped, where the one-token kernel with ropes is loaded and the group
/// would take q8one.cu's kernel.
pub(crate) fn qkv_rope_starts(k: &Kernels, g: &GroupLaunch, rope: &RopeKvLaunch) -> bool {
    g.q8 && g.n == 1
        && g.format == QuantFormat::Q8_0
        && g.group.count == 3
        && rope.r.n_x == 1
        && rope.r.x[0] == g.group.out[0]
        && qkv_rope_kernel(k, g).is_some()
}

/// The one-token kernel with ropes for the products `g`, when they would
/// otherwise take q8one.cu's (not kq.cu's, nor the tensor cores'): the
/// order in which `launch_pending` picks a group's kernel.
fn qkv_rope_kernel<'a>(k: &'a Kernels, g: &GroupLaunch) -> Option<&'a kernels::OneKernel> {
    if k.kq.as_ref().is_some_and(|kq| kq.get(g.format).is_some()) {
        return None;
    }
    let set = k.q8.get(g.format)?;
    if set.mma1_for(g.cols, &g.group).is_some() {
        return None;
    }
    one_token_matmul(set, g)?;
    set.one.as_ref()?.qkv_rope_for(g.cols)
}

/// q8one.cu's product kernel for the group `g` of `set`'s format, where
/// it takes the group: one token, rows it holds, a kernel for their width.
fn one_token_matmul<'a>(
    set: &'a kernels::Q8Set,
    g: &GroupLaunch,
) -> Option<&'a kernels::OneKernel> {
    set.one
        .as_ref()
        .and_then(|one| one.matmul_for(g.cols))
        .filter(|_| g.n == 1 && g.cols <= kernels::ONE_MAX_COLS)
}

/// The parameters of `matmul1_q8x_q8_0_rope` for the products `g` and the
/// ropes and writes `rk` held after them, when it computes what they do:
/// one token; q (`g`'s first output) and k (its second) roped over whole
/// heads of `rk`'s head size; k's roped values written to one cache and
/// v's (the third output) to another, each a row of the output's width;
/// v an even number of rows (a unit takes two); the caches clear of the
/// outputs and of each other.
pub(crate) fn qkv_rope_params(g: &GroupLaunch, rk: &RopeKvLaunch) -> Option<QkvRopeParams> {
    let (m, r, p) = (&g.group, &rk.r, &rk.p);
    let hd = r.head_dim;
    let shape = g.n == 1
        && m.count == 3
        && r.n_tokens == 1
        && (r.n_x, r.n_w) == (2, 2)
        && p.pairs > 0
        && 2 * p.pairs == hd
        && (r.x[0], r.x[1]) == (m.out[0], m.out[1])
        && (m.rows[0], m.rows[1]) == (r.heads[0] * hd, r.heads[1] * hd)
        && m.rows[2] % 2 == 0;
    if !shape {
        return None;
    }
    let wk = (0..2).find(|&w| r.roped[w] == 1)?;
    let wv = 1 - wk;
    if r.roped[wv] != -1
        || r.src[wv] != m.out[2]
        || (r.row_len[wk], r.row_len[wv]) != (m.rows[1], m.rows[2])
    {
        return None;
    }
    let bytes = |w: usize| {
        r.capacity[w] as usize * r.row_len[w] as usize * if r.f16[w] != 0 { 2 } else { 4 }
    };
    let caches = [(r.cache[wk], bytes(wk)), (r.cache[wv], bytes(wv))];
    let outs = (0..3).map(|i| (m.out[i], m.rows[i] as usize * 4));
    if meet(caches[0], caches[1]) || outs.clone().any(|o| caches.iter().any(|&c| meet(c, o))) {
        return None;
    }
    Some(QkvRopeParams {
        cache: [r.cache[wk], r.cache[wv]],
        f16: [r.f16[wk], r.f16[wv]],
        capacity: [r.capacity[wk], r.capacity[wv]],
        first_pos: r.first_pos,
        heads: r.heads,
        head_dim: hd,
    })
}

/// Rows an RMS norm holds in registers (`NORM_THREADS · NORM_PER`): only
/// such rows can be quantized by the norm.
pub(crate) const NORM_HELD: usize = 1024 * 4;

/// Threads of a norm block for rows of `dim`.
pub(crate) fn norm_threads(dim: usize) -> u32 {
    (dim.div_ceil(32 * 4) * 32).clamp(32, 1024) as u32
}

/// Columns a thread of `rms_norm_vec` holds (`NORM_VEC`).
const NORM_VEC: usize = 8;

/// Whether a norm takes `rms_norm_vec` (elementwise.cu): rows a multiple
/// of 32 wide, held in registers (at most NORM_HELD), every buffer it
/// touches 16-byte aligned and the scales 4 (each buffer is its own
/// allocation, so this holds in practice; a view at another offset takes
/// `rms_norm`, whose sum of squares is added in another order). The choice
/// depends on nothing else, so a row's bits do not depend on what else is
/// in the batch.
pub(crate) fn norm_vec_fits(n: &NormLaunch, q: Option<Q8Out>) -> bool {
    let buffers = [n.add, n.h, n.out, n.w, n.combine.map_or(0, |c| c.y)];
    let codes = q.map_or([0; 2], |q| [q.codes, q.mxfp4_codes]);
    let scales = q.map_or([0; 2], |q| [q.scales, q.mxfp4_scales]);
    n.dim % 32 == 0
        && n.dim <= NORM_HELD
        && buffers.iter().chain(&codes).all(|p| p % 16 == 0)
        && scales.iter().all(|p| p % 4 == 0)
}

/// Threads of an `rms_norm_vec` block for rows of `dim`: a thread per
/// NORM_VEC columns, in whole warps.
pub(crate) fn norm_vec_threads(dim: usize) -> u32 {
    (dim.div_ceil(NORM_VEC * 32) * 32).max(32) as u32
}

impl Pending {
    /// Whether the norm `n` (fresh, in place on `x`) joins this pending op:
    /// the norm of a copy (after an add) reads the copy's source.
    pub(crate) fn absorb_norm(self, n: NormLaunch) -> Option<NormLaunch> {
        let len = n.rows * n.dim;
        match self {
            Pending::Copy { src, dst, len: l } if dst == n.out && l == len => {
                Some(NormLaunch { h: src, ..n })
            }
            Pending::AddCopy {
                h,
                add,
                dst,
                len: l,
                combine,
            } if dst == n.out
                && l == len
                && combine.is_none_or(|c| {
                    c.n == n.rows && c.hidden == n.dim && n.dim <= NORM_HELD && !c.reads(dst, len)
                }) =>
            {
                Some(NormLaunch {
                    add,
                    h,
                    combine,
                    ..n
                })
            }
            _ => None,
        }
    }
}

/// Launches `p` (and the quantization `q` of a norm's output).
pub(crate) fn launch_pending(
    k: &Kernels,
    stream: &RawStream,
    p: Pending,
    q: Option<Q8Out>,
) -> Result<(), BackendError> {
    match p {
        Pending::Combine(c) => {
            let (n, kk, h) = (c.n as i32, c.k as i32, c.hidden as i32);
            let args = &mut args![c.y, c.routes, n, kk, h, c.out];
            kernels::launch_elementwise("moe", &k.moe_combine, stream, c.n * c.hidden, args)
        }
        Pending::Add {
            dst,
            src,
            len,
            combine,
        } => {
            if let Some(c) = combine {
                launch_pending(k, stream, Pending::Combine(c), None)?;
            }
            let l = len as i64;
            kernels::launch_elementwise("add", &k.add, stream, len, &mut args![dst, src, l])
        }
        Pending::Copy { src, dst, len } => copy_f32(stream, src, dst, len),
        Pending::AddCopy {
            h,
            add,
            dst,
            len,
            combine,
        } => {
            launch_pending(
                k,
                stream,
                Pending::Add {
                    dst: h,
                    src: add,
                    len,
                    combine,
                },
                None,
            )?;
            copy_f32(stream, h, dst, len)
        }
        Pending::Norm(n) => {
            let (codes, scales, order) = q.map_or((0, 0, 0), |q| (q.codes, q.scales, q.order));
            let (codes2, scales2) = q.map_or((0, 0), |q| (q.mxfp4_codes, q.mxfp4_scales));
            let cy = n.combine.map_or(NormCombine::default(), |c| NormCombine {
                y: c.y,
                routes: c.routes,
                k: c.k as i32,
            });
            let (d, eps, mode, w) = (n.dim as i32, n.eps, n.mode, n.w);
            let (f, threads) = match &k.rms_norm_vec {
                Some(vec) if norm_vec_fits(&n, q) => (vec, norm_vec_threads(n.dim)),
                _ => (&k.rms_norm, norm_threads(n.dim)),
            };
            launch(
                "rms_norm",
                f,
                stream,
                (n.rows as u32, 1, 1),
                threads,
                0,
                &mut args![
                    n.add, n.h, n.out, d, eps, mode, w, codes, scales, order, codes2, scales2, cy
                ],
            )
        }
        Pending::Group(g) if !g.q8 => launch_tc(k, stream, &g),
        Pending::Group(g) if k.kq.as_ref().is_some_and(|kq| kq.get(g.format).is_some()) => {
            launch_kq_matmul(k, stream, &g)
        }
        Pending::Group(g) => {
            let set = k.q8.get(g.format).ok_or(BackendError::Unsupported {
                op: "matmul (8-bit activations of this format)",
            })?;
            let (cols, nn) = (g.cols as i32, g.n as i32);
            if let Some(f) = set.mma1_for(g.cols, &g.group).filter(|_| g.n == 1) {
                let group = g.group.in_blocks_of(16);
                let tiles = group.block_start[group.count as usize] as u32;
                let threads = (kernels::MMA_Q8_WARPS * 32) as u32;
                let args = &mut args![group, cols, g.xq, g.xd];
                return launch("matmul", f, stream, (tiles, 1, 1), threads, 0, args);
            }
            if let Some(one) = one_token_matmul(set, &g) {
                let rows = kernels::OneWork::Rows(&g.group.rows[..g.group.count as usize]);
                let l = one.config(g.format, g.cols, rows)?;
                let args = &mut args![g.group, cols, g.xq, g.xd];
                return launch("matmul", &one.f, stream, l.grid, l.threads, l.smem, args);
            }
            let blocks = g.group.block_start[g.group.count as usize] as u32;
            let grid = (blocks, g.n.div_ceil(kernels::MM_TOKENS) as u32, 1);
            let args = &mut args![g.group, cols, g.xq, g.xd, nn];
            launch(
                "matmul",
                &set.matmul,
                stream,
                grid,
                kernels::Q8_THREADS,
                0,
                args,
            )
        }
        Pending::RopeKv(l) => {
            let args = &mut args![l.r, l.p, l.step];
            kernels::launch_elementwise("rope", &k.rope_kv, stream, l.threads(), args)
        }
        Pending::QkvRope(g, rk) => {
            let fused = qkv_rope_params(&g, &rk).zip(qkv_rope_kernel(k, &g));
            let Some((q, one)) = fused else {
                launch_pending(k, stream, Pending::Group(g), None)?;
                return launch_pending(k, stream, Pending::RopeKv(rk), None);
            };
            let units = (g.group.rows[0] + g.group.rows[1] + g.group.rows[2]) / 2;
            let l = one.config(g.format, g.cols, kernels::OneWork::Rows(&[units]))?;
            let cols = g.cols as i32;
            let args = &mut args![g.group, cols, g.xq, g.xd, q, rk.p, rk.step];
            launch("matmul", &one.f, stream, l.grid, l.threads, l.smem, args)
        }
        Pending::Tile(t) => {
            let kq = k.kq.as_ref().and_then(|kq| kq.get(t.format));
            let set = k.q8.get(t.format);
            let f = match (kq, set) {
                (Some(kq), _) => &kq.tile,
                (None, Some(set)) => &set.mq_matmul,
                (None, None) => {
                    return Err(BackendError::Unsupported {
                        op: "matmul (8-bit activations of this format)",
                    })
                }
            };
            let grid = (
                t.rows.div_ceil(kernels::MQ_BM) as u32,
                t.n.div_ceil(kernels::MQ_BN) as u32,
                1,
            );
            let (rows, cols, rb, nn) =
                (t.rows as i32, t.cols as i32, t.row_bytes as i64, t.n as i32);
            let args = &mut args![t.w, rows, cols, rb, t.xq, t.xd, nn, t.out, t.bias];
            launch("matmul", f, stream, grid, kernels::MQ_THREADS, 0, args)
        }
    }
}

/// A group of products of one f32 input (`g.x`) on the tensor cores
/// (`kernels/tcmm.cu`, weights of one format): up to
/// [`kernels::TC_FEW_TOKENS`] tokens a warp per 16 whole rows where the
/// rows are many (an output head), else a block per 16 rows with a warp
/// per segment of the columns ([`kernels::TcKernels::way`]); more tokens a
/// block per [`kernels::TC_BATCH_ROWS`] rows × [`kernels::TC_BATCH_TOKENS`]
/// tokens. The same sums in the same order every way.
fn launch_tc(k: &Kernels, stream: &RawStream, g: &GroupLaunch) -> Result<(), BackendError> {
    let unsupported = BackendError::Unsupported {
        op: "matmul (this format on the tensor cores)",
    };
    let tc = k.tc.as_ref().ok_or(unsupported.clone())?;
    let set = tc.get(g.format).ok_or(unsupported)?;
    let few = g.n <= kernels::TC_FEW_TOKENS;
    let tiles = g.group.tiles(16);
    let (cols, nn) = (g.cols as i32, g.n as i32);
    let way = tc.way(set, tiles, g.cols);
    if few && way == kernels::FewWay::Streamed {
        // A block an SM (its rings take most of the shared memory), each
        // walking the group's tiles `tiles` apart from its own.
        let group = g.group.in_blocks_of(16);
        let streamed = &set
            .streamed
            .as_ref()
            .ok_or(BackendError::Unsupported {
                op: "matmul (streamed tensor-core products of this format)",
            })?
            .f;
        let grid = (tiles as u32).min(tc.sms);
        let tiles = tiles as i32;
        let args = &mut args![group, cols, g.x, nn, tiles];
        let (threads, smem) = kernels::TcStreamed::block(g.cols);
        return launch(
            "matmul",
            streamed,
            stream,
            (grid, 1, 1),
            threads,
            smem,
            args,
        );
    }
    if few && way == kernels::FewWay::Rows {
        let group = g.group.in_blocks_of(16 * kernels::TC_ROW_WARPS);
        let blocks = group.block_start[group.count as usize] as u32;
        let args = &mut args![group, cols, g.x, nn];
        let threads = (kernels::TC_ROW_WARPS * 32) as u32;
        return launch(
            "matmul",
            &set.rows,
            stream,
            (blocks, 1, 1),
            threads,
            0,
            args,
        );
    }
    let group = g
        .group
        .in_blocks_of(if few { 16 } else { kernels::TC_BATCH_ROWS });
    let blocks = group.block_start[group.count as usize] as u32;
    let args = &mut args![group, cols, g.x, nn];
    if few {
        let threads = (kernels::tc_segments(g.cols) * 32) as u32;
        launch("matmul", &set.few, stream, (blocks, 1, 1), threads, 0, args)
    } else {
        let grid = (blocks, g.n.div_ceil(kernels::TC_BATCH_TOKENS) as u32, 1);
        launch(
            "matmul",
            &set.batch,
            stream,
            grid,
            kernels::TC_BATCH_THREADS,
            0,
            args,
        )
    }
}

/// A group of products of one quantized input in a kq.cu format
/// (`kernels/kq.cu` `kq_matmul_*`): q8dot.cu's matrix-vector grid, a warp a row (the
/// group's `block_start` counted in its blocks), up to
/// [`kernels::MM_TOKENS`] tokens a block (one token: `kq_matmul1_*`).
fn launch_kq_matmul(k: &Kernels, stream: &RawStream, g: &GroupLaunch) -> Result<(), BackendError> {
    let set =
        k.kq.as_ref()
            .and_then(|kq| kq.get(g.format))
            .ok_or(BackendError::Unsupported {
                op: "matmul (8-bit activations of this format)",
            })?;
    let blocks = g.group.block_start[g.group.count as usize] as u32;
    let (f, tokens) = match g.n {
        1 => (&set.matmul1, 1),
        _ => (&set.matmul, kernels::MM_TOKENS),
    };
    let grid = (blocks, g.n.div_ceil(tokens) as u32, 1);
    let (cols, nn) = (g.cols as i32, g.n as i32);
    let args = &mut args![g.group, cols, g.xq, g.xd, nn];
    launch("matmul", f, stream, grid, kernels::Q8_THREADS, 0, args)
}

fn copy_f32(stream: &RawStream, src: u64, dst: u64, len: usize) -> Result<(), BackendError> {
    // SAFETY: both ranges were checked to lie in their buffers when the
    // copy was requested; the buffers outlive the stream's queue (a
    // session owns both).
    unsafe { result::memcpy_dtod_async(dst, src, len * 4, stream.cu_stream()) }
        .map_err(crate::memory::runtime("copy"))
}

impl MatGroup {
    /// A group of one matrix.
    pub(crate) fn one(w: u64, rows: usize, row_bytes: usize, out: u64) -> MatGroup {
        let mut g = MatGroup::default();
        g.push(w, rows, row_bytes, out);
        g
    }

    /// Adds a matrix to a group of fewer than [`MAT_GROUP`].
    pub(crate) fn push(&mut self, w: u64, rows: usize, row_bytes: usize, out: u64) {
        let m = self.count as usize;
        assert!(m < MAT_GROUP, "a full matrix group");
        self.w[m] = w;
        self.out[m] = out;
        self.bias[m] = 0;
        self.row_bytes[m] = row_bytes as i64;
        self.rows[m] = rows as i32;
        self.block_start[m + 1] =
            self.block_start[m] + rows.div_ceil(kernels::Q8_BLOCK_ROWS) as i32;
        self.count += 1;
    }

    /// Tiles of `rows_a_tile` rows its members take, each member's last
    /// one maybe partial.
    pub(crate) fn tiles(&self, rows_a_tile: usize) -> usize {
        self.rows[..self.count as usize]
            .iter()
            .map(|&r| (r as usize).div_ceil(rows_a_tile))
            .sum()
    }

    /// The same group with `block_start` counted in blocks of
    /// `rows_a_block` rows (the bf16 tensor-core kernels' blocks).
    pub(crate) fn in_blocks_of(&self, rows_a_block: usize) -> MatGroup {
        let mut g = *self;
        for m in 0..g.count as usize {
            g.block_start[m + 1] =
                g.block_start[m] + (g.rows[m] as usize).div_ceil(rows_a_block) as i32;
        }
        g
    }

    /// The last matrix's output, rows and bias.
    pub(crate) fn last(&mut self) -> Option<(u64, usize, &mut u64)> {
        let m = (self.count as usize).checked_sub(1)?;
        Some((self.out[m], self.rows[m] as usize, &mut self.bias[m]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(pairs: usize) -> RopeParams {
        let mut p = RopeParams {
            inv_freq: [0.0; kernels::MAX_ROPE_PAIRS],
            attention_factor: 1.0,
            pairs: pairs as i32,
            kind: 0,
        };
        for (i, f) in p.inv_freq[..pairs].iter_mut().enumerate() {
            *f = 1.0 / (i + 1) as f32;
        }
        p
    }

    // Tensors and caches 16 MB apart.
    const Q: u64 = 0x100_0000;
    const K: u64 = 0x200_0000;
    const V: u64 = 0x300_0000;
    const CA: u64 = 0xa00_0000;
    const CB: u64 = 0xb00_0000;
    const CC: u64 = 0xc00_0000;

    /// q (8 heads) and k (2 heads) of 3 tokens, heads of 64 with 16
    /// rotated pairs, at position 5.
    fn q_and_k() -> RopeKvLaunch {
        let mut l = RopeKvLaunch::rope(Q, 8, 3, 64, 5, table(16), 0);
        assert!(l.join_rope(&RopeKvLaunch::rope(K, 2, 3, 64, 5, table(16), 0)));
        l
    }

    /// A group's blocks counted again for another block height: each
    /// matrix starts where the one before ends, whole blocks each.
    #[test]
    fn a_group_is_counted_in_blocks_of_any_height() {
        let mut g = MatGroup::one(1, 37, 64, 10);
        g.push(2, 8, 64, 20);
        g.push(3, 13, 64, 30);
        assert_eq!(g.block_start, [0, 10, 12, 16]); // Q8_BLOCK_ROWS = 4
        assert_eq!(g.in_blocks_of(16).block_start, [0, 3, 4, 5]);
        assert_eq!(g.tiles(16), 5);
        assert_eq!(g.tiles(4), 16);
        assert_eq!(g.in_blocks_of(128).block_start, [0, 1, 2, 3]);
        let h = g.in_blocks_of(16);
        assert_eq!((h.w, h.out, h.rows, h.count), (g.w, g.out, g.rows, g.count));
    }

    /// Products of one input join a group only on the same kernels: a
    /// matrix kq.cu cannot take (its alignment) must not join a group of
    /// products that read the input's quantization, nor the other way
    /// round; and a group holds MAT_GROUP matrices at most.
    #[test]
    fn a_group_takes_products_of_its_input_shape_and_kernels_only() {
        let group = |q8: bool| GroupLaunch {
            format: QuantFormat::Q4K,
            group: MatGroup::one(1, 64, 2304, 10),
            x: 0x1000,
            cols: 4096,
            n: 1,
            q8,
            xq: if q8 { 0x2000 } else { 0 },
            xd: if q8 { 0x3000 } else { 0 },
        };
        let (int8, bf16) = (group(true), group(false));
        assert!(int8.takes(QuantFormat::Q4K, 0x1000, 1, 4096, true));
        assert!(!int8.takes(QuantFormat::Q4K, 0x1000, 1, 4096, false));
        assert!(bf16.takes(QuantFormat::Q4K, 0x1000, 1, 4096, false));
        assert!(!bf16.takes(QuantFormat::Q4K, 0x1000, 1, 4096, true));
        assert!(!int8.takes(QuantFormat::Q6K, 0x1000, 1, 4096, true));
        assert!(!int8.takes(QuantFormat::Q4K, 0x1004, 1, 4096, true));
        assert!(!int8.takes(QuantFormat::Q4K, 0x1000, 2, 4096, true));
        assert!(!int8.takes(QuantFormat::Q4K, 0x1000, 1, 2048, true));
        let mut full = int8;
        full.group.push(2, 64, 2304, 20);
        full.group.push(3, 64, 2304, 30);
        assert!(!full.takes(QuantFormat::Q4K, 0x1000, 1, 4096, true));
    }

    #[test]
    fn a_layers_ropes_and_cache_writes_join_one_launch() {
        let mut l = q_and_k();
        assert!(l.join_write(CA, true, K, 3, 2 * 64, 5, 100, 0));
        assert!(l.join_write(CB, true, V, 3, 2 * 64, 5, 100, 0));
        assert_eq!((l.r.n_x, l.r.n_w), (2, 2));
        assert_eq!(l.r.roped, [1, -1]);
        // Pairs of q and k, k's unrotated 32 dims, v's elements.
        assert_eq!(
            l.threads(),
            3 * 8 * 16 + 3 * 2 * 16 + 3 * 2 * 32 + 3 * 2 * 64
        );
        // A third write does not fit.
        assert!(!l.join_write(CC, true, V, 3, 2 * 64, 5, 100, 0));
    }

    #[test]
    fn ropes_join_only_at_the_same_tokens_positions_and_table() {
        let q = RopeKvLaunch::rope(Q, 8, 3, 64, 5, table(16), 0);
        for other in [
            RopeKvLaunch::rope(K, 2, 3, 64, 6, table(16), 0),
            RopeKvLaunch::rope(K, 2, 4, 64, 5, table(16), 0),
            RopeKvLaunch::rope(K, 2, 3, 64, 5, table(8), 0),
            RopeKvLaunch::rope(K, 2, 3, 64, 5, table(16), 0x77),
            RopeKvLaunch::rope(Q, 8, 3, 64, 5, table(16), 0),
        ] {
            let mut l = q;
            assert!(!l.join_rope(&other));
            assert_eq!(l.r.n_x, 1);
        }
        // Nor after a write has joined.
        let mut l = q;
        assert!(l.join_write(CA, false, V, 3, 128, 5, 100, 0));
        assert!(!l.join_rope(&RopeKvLaunch::rope(K, 2, 3, 64, 5, table(16), 0)));
    }

    #[test]
    fn writes_join_only_whole_roped_tensors_or_others_at_the_same_positions() {
        // A roped tensor written with another row width (a latent cache
        // row) is left to kv_write.
        assert!(!q_and_k().join_write(CA, true, K, 3, 100, 5, 100, 0));
        assert!(!q_and_k().join_write(CA, true, V, 3, 128, 6, 100, 0));
        assert!(!q_and_k().join_write(CA, true, V, 2, 128, 5, 100, 0));
        assert!(!q_and_k().join_write(CA, true, V, 3, 128, 5, 100, 0x77));
        let mut l = q_and_k();
        assert!(l.join_write(CA, false, Q, 3, 8 * 64, 5, 100, 0));
        assert_eq!(l.r.roped[0], 0);
        assert_eq!(l.r.f16[0], 0);
    }

    #[test]
    fn writes_join_only_when_no_two_threads_touch_one_address() {
        // One roped tensor into two caches: the rotating thread stores
        // its pair for one write only.
        let mut l = q_and_k();
        assert!(l.join_write(CA, true, K, 3, 2 * 64, 5, 100, 0));
        assert!(!l.join_write(CB, true, K, 3, 2 * 64, 5, 100, 0));
        // Two writes into one cache (the separate kernels' second wins).
        let mut l = q_and_k();
        assert!(l.join_write(CA, true, K, 3, 2 * 64, 5, 100, 0));
        assert!(!l.join_write(CA, true, V, 3, 2 * 64, 5, 100, 0));
        assert!(!l.join_write(CA + 64, true, V, 3, 2 * 64, 5, 100, 0));
        // A plain write of part of a roped tensor (it would read pairs
        // mid-rotation), or from the cache the first write fills.
        assert!(!q_and_k().join_write(CA, true, K + 256, 3, 64, 5, 100, 0));
        assert!(!q_and_k().join_write(CA, true, Q + 4, 3, 2 * 64, 5, 100, 0));
        let mut l = q_and_k();
        assert!(l.join_write(CA, true, K, 3, 2 * 64, 5, 100, 0));
        assert!(!l.join_write(CB, true, CA, 3, 2 * 64, 5, 100, 0));
        // A cache over a roped tensor or over the first write's source.
        assert!(!q_and_k().join_write(Q + 64, true, V, 3, 2 * 64, 5, 100, 0));
        let mut l = q_and_k();
        assert!(l.join_write(CA, true, V, 3, 2 * 64, 5, 100, 0));
        assert!(!l.join_write(V, true, K, 3, 2 * 64, 5, 100, 0));
        // Overlapping ropes.
        let mut l = RopeKvLaunch::rope(Q, 8, 3, 64, 5, table(16), 0);
        assert!(!l.join_rope(&RopeKvLaunch::rope(Q + 256, 2, 3, 64, 5, table(16), 0)));
        // Apart, they join.
        let mut l = q_and_k();
        assert!(l.join_write(CA, true, K, 3, 2 * 64, 5, 100, 0));
        assert!(l.join_write(CB, true, V, 3, 2 * 64, 5, 100, 0));
    }

    fn norm(dim: usize, h: u64) -> NormLaunch {
        NormLaunch {
            add: 0,
            combine: None,
            h,
            out: h,
            rows: 1,
            dim,
            eps: 1e-5,
            mode: 0,
            w: 0x1000,
        }
    }

    /// The vector layout's blocks: 8 columns a thread in whole warps (2880
    /// columns: 360 threads, 12 warps), never past the kernel's launch
    /// bound of 512 threads (`NORM_VEC_THREADS`) for any row it takes.
    #[test]
    fn vector_norm_blocks_cover_the_row_within_the_bound() {
        assert_eq!(norm_vec_threads(2880), 384);
        assert_eq!(norm_vec_threads(96), 32);
        assert_eq!(norm_vec_threads(4096), 512);
        for dim in (32..=NORM_HELD).step_by(32) {
            let t = norm_vec_threads(dim) as usize;
            assert!(t * NORM_VEC >= dim && t % 32 == 0 && t <= 512, "{dim}: {t}");
        }
    }

    /// Only rows a multiple of 32 wide, held, with 16-byte aligned buffers
    /// (4-byte aligned scales) take the vector layout.
    #[test]
    fn vector_norm_needs_whole_blocks_and_aligned_buffers() {
        assert!(norm_vec_fits(&norm(2880, 0x2000), None));
        assert!(!norm_vec_fits(&norm(2880 + 16, 0x2000), None));
        assert!(!norm_vec_fits(&norm(NORM_HELD + 32, 0x2000), None));
        assert!(!norm_vec_fits(&norm(2880, 0x2008), None));
        let q = |codes, scales| Q8Out {
            codes,
            scales,
            order: 0,
            mxfp4_codes: 0,
            mxfp4_scales: 0,
        };
        assert!(norm_vec_fits(&norm(2880, 0x2000), Some(q(0x4000, 0x5004))));
        assert!(!norm_vec_fits(&norm(2880, 0x2000), Some(q(0x4008, 0x5000))));
        assert!(!norm_vec_fits(&norm(2880, 0x2000), Some(q(0x4000, 0x5002))));
    }
}
