//! Gated DeltaNet on the CPU: the depthwise causal convolution and the
//! gated delta rule (math and reference in `turbospark_backend::delta_net`;
//! HF `causal_conv1d_fn`, `torch_recurrent_gated_delta_rule` and
//! `torch_chunk_gated_delta_rule` of transformers 5.24.0,
//! `models/qwen3_5_moe/modeling_qwen3_5_moe.py`).
//!
//! # The gated delta rule, token by token and chunk by chunk
//!
//! Per value head, with `q_t` and `k_t` L2-normalised (`q_t` also scaled
//! by `k_head_dim^-½`), `β_t = sigmoid(beta)` and the log-decay `g_t ≤ 0`,
//! the recurrence over the state `S [k_head_dim, v_head_dim]` is
//!
//! ```text
//! u_t = β_t (v_t − e^{g_t} S_{t−1}ᵀ k_t)      (the delta-rule correction)
//! S_t = e^{g_t} S_{t−1} + k_t u_tᵀ ;  o_t = S_tᵀ q_t
//! ```
//!
//! Calls of fewer than [`CHUNKED_MIN_TOKENS`] tokens (decode) run it token
//! by token, in two passes over `S` per token: `w = Sᵀk`, then `S ← e^g S
//! + k uᵀ` with `o = Sᵀq` summed in the same pass.
//!
//! Longer calls (prefill) run the chunked form of HF's
//! `torch_chunk_gated_delta_rule` (Yang, Kautz, Hatamizadeh 2024, "Gated
//! Delta Networks", after the WY/UT form of Yang et al. 2024,
//! "Parallelizing Linear Transformers with the Delta Rule over Sequence
//! Length"): chunks of
//! [`CHUNK`] tokens, one after another. In a chunk of `L` tokens that
//! starts from the state `S`, with the cumulative log-decay `G_i = Σ_{s ≤
//! i} g_s` counted from the chunk's first token, unrolling the recurrence
//! gives the `u_i` as the solution of a unit lower-triangular system and
//! everything else as matrix products:
//!
//! ```text
//! (I + A) U = R,   A_ij = β_i (k_i·k_j) e^{G_i − G_j}  (j < i, else 0)
//!                  R_i  = β_i (v_i − e^{G_i} Sᵀk_i)
//! o_i = e^{G_i} Sᵀq_i + Σ_{j ≤ i} (q_i·k_j) e^{G_i − G_j} u_j
//! S  ← e^{G_{L−1}} S + Σ_j e^{G_{L−1} − G_j} k_j u_jᵀ
//! ```
//!
//! `U` is found by forward substitution (`u_i = r_i − Σ_{j<i} A_ij u_j`),
//! and the `u_i` are the step-wise ones, so outputs and state equal the
//! token-by-token results up to rounding. Two differences from HF's
//! arrangement, neither changing the math: HF solves the system for `βV`
//! and `β e^{G} K` and subtracts `(I + A)⁻¹ β e^{G} K · S` afterwards,
//! where this solves it once for `R` (the same `U` by linearity, one
//! triangular solve fewer); and a partial last chunk is computed at its
//! length, where HF pads it with tokens of `β = 0`, `g = 0` (which change
//! neither the outputs nor the state). Decays are only ever taken as
//! `e^{G_i − G_j}` with `j ≤ i`, at most 1, so no product of decays
//! overflows.
//!
//! Value heads are independent: the op splits them over the pool, and each
//! thread works in its own [`DeltaScratch`]. The products run in a tile of
//! 4 rows by 16 columns, compiled for AVX2 and FMA where the CPU has them
//! (plain multiply-adds, 4 lanes, elsewhere); every state update is f32.

use crate::disjoint::DisjointMut;
use crate::elementwise::sigmoid;
use crate::kernels::Isa;
use turbospark_backend::{ConvParams, DeltaNetParams};

/// `out[t, c] = silu(Σ_j w[c, j] · in[t − (k − 1) + j, c])` over the state
/// (the `k − 1` inputs before `x`, oldest first), which then becomes the
/// last `k − 1` inputs. Lengths are checked by the caller.
pub(crate) fn causal_conv1d_silu(
    x: &[f32],
    state: &mut [f32],
    w: &[f32],
    p: &ConvParams,
    out: &mut [f32],
) {
    let (n, ch, k) = (p.n_tokens, p.channels, p.kernel);
    let past = k - 1;
    let state = &mut state[..past * ch];
    if p.fresh {
        state.fill(0.0);
    }
    for t in 0..n {
        for c in 0..ch {
            let mut s = 0f32;
            for j in 0..k {
                // Input row `t + j − past` of `x`, or of the state before it.
                let v = match (t + j).checked_sub(past) {
                    Some(r) => x[r * ch + c],
                    None => state[(t + j) * ch + c],
                };
                s += w[c * k + j] * v;
            }
            out[t * ch + c] = s * sigmoid(s);
        }
    }
    // The new state: the last `past` rows of [state, x].
    if n >= past {
        state.copy_from_slice(&x[(n - past) * ch..n * ch]);
    } else {
        state.copy_within(n * ch.., 0);
        state[(past - n) * ch..].copy_from_slice(&x[..n * ch]);
    }
}

/// `x / sqrt(Σx² + 1e-6)` in place (HF `l2norm`, FLA's epsilon); the
/// sum runs in 8 lanes.
#[inline(always)]
fn l2norm(x: &mut [f32]) {
    let (lanes, rest) = x.as_chunks::<8>();
    let mut acc = [0f32; 8];
    for l in lanes {
        for (a, &v) in acc.iter_mut().zip(l) {
            *a += v * v;
        }
    }
    let ss = acc.iter().sum::<f32>() + rest.iter().map(|v| v * v).sum::<f32>();
    let r = 1.0 / (ss + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= r);
}

/// `log(1 + e^x)`, linear past 20 as torch's `softplus` (threshold 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Tokens per chunk of the chunked form (HF's `chunk_size`).
pub(crate) const CHUNK: usize = 64;

/// Calls of at least this many tokens run the chunked form: with
/// Qwen3.6-35B-A3B's heads, 2 or 3 tokens at a time ran faster token by
/// token, 4 and more chunked (`examples/delta_rule_speed.rs`).
pub(crate) const CHUNKED_MIN_TOKENS: usize = 4;

/// The per-token inputs of [`gated_delta_rule_head`].
pub(crate) struct Inputs<'a> {
    pub qkv: &'a [f32],
    pub alpha: &'a [f32],
    pub beta: &'a [f32],
    pub a_log: &'a [f32],
    pub dt_bias: &'a [f32],
}

/// What one pool thread computes a head of the gated delta rule in, for
/// key and value heads up to `head_dim` wide.
#[derive(Default)]
pub(crate) struct DeltaScratch {
    head_dim: usize,
    /// The chunk's queries and keys, `[CHUNK, k_head_dim]` (one row each
    /// when token by token).
    q: Vec<f32>,
    k: Vec<f32>,
    /// The chunk's keys transposed, `[k_head_dim, CHUNK]`.
    kt: Vec<f32>,
    /// `R`, then `U`, `[CHUNK, v_head_dim]` (one row of `Sᵀk`, then of
    /// `u`, when token by token).
    u: Vec<f32>,
    /// The chunk's outputs `[CHUNK, v_head_dim]`.
    o: Vec<f32>,
    /// `A` and the decayed `q_i·k_j`, `[CHUNK, CHUNK]`.
    a: Vec<f32>,
    att: Vec<f32>,
    /// `G_i`, and `β_i`, `[CHUNK]`.
    g: Vec<f32>,
    b: Vec<f32>,
    /// [`MR`] rows of a product's left matrix, interleaved.
    pack: Vec<f32>,
}

impl DeltaScratch {
    /// Scratch for heads up to `head_dim` wide (none for 0).
    pub(crate) fn new(head_dim: usize) -> DeltaScratch {
        if head_dim == 0 {
            return DeltaScratch::default();
        }
        let rows = vec![0.0; CHUNK * head_dim];
        let square = vec![0.0; CHUNK * CHUNK];
        DeltaScratch {
            head_dim,
            q: rows.clone(),
            k: rows.clone(),
            kt: rows.clone(),
            u: rows.clone(),
            o: rows,
            a: square.clone(),
            att: square,
            g: vec![0.0; CHUNK],
            b: vec![0.0; CHUNK],
            pack: vec![0.0; MR * head_dim.max(CHUNK)],
        }
    }

    /// The widest key or value head it fits.
    pub(crate) fn head_dim(&self) -> usize {
        self.head_dim
    }
}

/// Multiply-add of one instruction set: `fma(a, b, c) = a · b + c`, fused
/// where the code is compiled for FMA.
trait MulAdd {
    fn fma(a: f32, b: f32, c: f32) -> f32;
}

/// Separate multiply and add (portable; a fused `mul_add` without FMA in
/// hardware would be a libm call).
struct Plain;

impl MulAdd for Plain {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// One rounding (`vfmadd` inside functions compiled for FMA).
#[cfg(target_arch = "x86_64")]
struct Fused;

#[cfg(target_arch = "x86_64")]
impl MulAdd for Fused {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// Runs value head `h` of one gated delta rule call (lengths checked by
/// the caller, `s` fits the heads): its state is `state[h · dk · dv..][..dk
/// · dv]`, its outputs `out[(t · v_heads + h) · dv..][..dv]` for every
/// token `t`.
///
/// # Safety
/// No other live range of `state` or `out` may overlap head `h`'s.
pub(crate) unsafe fn gated_delta_rule_head(
    isa: Isa,
    i: &Inputs<'_>,
    p: &DeltaNetParams,
    h: usize,
    state: &DisjointMut<'_>,
    out: &DisjointMut<'_>,
    s: &mut DeltaScratch,
) {
    let len = p.k_head_dim * p.v_head_dim;
    // SAFETY: head `h`'s own state, which the caller lends to this call.
    let st = unsafe { state.range(h * len, len) };
    let out = HeadOut { out, h, p };
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: these instruction sets only exist on CPUs with AVX2 and
        // FMA (`Isa::detect`); the outputs are head `h`'s (caller's
        // contract).
        Isa::Avx2 | Isa::Avx512Vnni => unsafe { head_avx2(i, p, st, &out, s) },
        // SAFETY: as above, head `h`'s outputs.
        _ => unsafe { head::<Plain>(i, p, st, &out, s) },
    }
}

/// The outputs of one head: row `t` is `out[(t · v_heads + h) · dv..][..dv]`.
struct HeadOut<'a, 'b> {
    out: &'a DisjointMut<'b>,
    h: usize,
    p: &'a DeltaNetParams,
}

impl HeadOut<'_, '_> {
    /// Token `t`'s output row.
    ///
    /// # Safety
    /// The head's outputs are this call's alone, and the row is not
    /// borrowed twice.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    unsafe fn row(&self, t: usize) -> &mut [f32] {
        let dv = self.p.v_head_dim;
        // SAFETY: the caller's contract.
        unsafe { self.out.range((t * self.p.v_heads + self.h) * dv, dv) }
    }
}

/// [`head`] compiled for AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_avx2(
    i: &Inputs<'_>,
    p: &DeltaNetParams,
    st: &mut [f32],
    out: &HeadOut<'_, '_>,
    s: &mut DeltaScratch,
) {
    // SAFETY: forwarded from the caller.
    unsafe { head::<Fused>(i, p, st, out, s) }
}

/// One head's call: token by token or chunked, by its length.
///
/// # Safety
/// As [`HeadOut::row`].
#[inline(always)]
unsafe fn head<F: MulAdd>(
    i: &Inputs<'_>,
    p: &DeltaNetParams,
    st: &mut [f32],
    out: &HeadOut<'_, '_>,
    s: &mut DeltaScratch,
) {
    if p.fresh {
        st.fill(0.0);
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        if p.n_tokens >= CHUNKED_MIN_TOKENS {
            chunked::<F>(i, p, st, out, s);
        } else {
            step::<F>(i, p, st, out, s);
        }
    }
}

/// Token `t`'s normalised and scaled query and normalised key of value
/// head `h` into `q`, `k`; returns `(β, g)`.
#[inline(always)]
fn token(
    i: &Inputs<'_>,
    p: &DeltaNetParams,
    t: usize,
    h: usize,
    q: &mut [f32],
    k: &mut [f32],
) -> (f32, f32) {
    let (hk, hv, dk) = (p.k_heads, p.v_heads, p.k_head_dim);
    let kh = h / (hv / hk);
    let r = &i.qkv[t * p.row()..(t + 1) * p.row()];
    q.copy_from_slice(&r[kh * dk..(kh + 1) * dk]);
    l2norm(q);
    let q_scale = (dk as f32).powf(-0.5);
    q.iter_mut().for_each(|v| *v *= q_scale);
    k.copy_from_slice(&r[(hk + kh) * dk..(hk + kh + 1) * dk]);
    l2norm(k);
    let beta = sigmoid(i.beta[t * hv + h]);
    let g = -i.a_log[h].exp() * softplus(i.alpha[t * hv + h] + i.dt_bias[h]);
    (beta, g)
}

/// Token `t`'s value row of head `h`.
#[inline(always)]
fn value<'a>(i: &Inputs<'a>, p: &DeltaNetParams, t: usize, h: usize) -> &'a [f32] {
    let (dk, dv) = (p.k_head_dim, p.v_head_dim);
    &i.qkv[t * p.row() + 2 * p.k_heads * dk + h * dv..][..dv]
}

/// `y += a · x`.
#[inline(always)]
fn axpy<F: MulAdd>(a: f32, x: &[f32], y: &mut [f32]) {
    for (yv, xv) in y.iter_mut().zip(x) {
        *yv = F::fma(a, *xv, *yv);
    }
}

/// The recurrence token by token (see the module docs).
///
/// # Safety
/// As [`HeadOut::row`].
#[inline(always)]
unsafe fn step<F: MulAdd>(
    i: &Inputs<'_>,
    p: &DeltaNetParams,
    st: &mut [f32],
    out: &HeadOut<'_, '_>,
    s: &mut DeltaScratch,
) {
    let (dk, dv, h) = (p.k_head_dim, p.v_head_dim, out.h);
    let (q, k, w) = (&mut s.q[..dk], &mut s.k[..dk], &mut s.u[..dv]);
    for t in 0..p.n_tokens {
        let (beta, g) = token(i, p, t, h, q, k);
        let decay = g.exp();
        // w = S_{t−1}ᵀ k, then u = β (v − e^g w).
        w.fill(0.0);
        for (&ki, srow) in k.iter().zip(st.chunks_exact(dv)) {
            axpy::<F>(ki, srow, w);
        }
        for (wj, &vj) in w.iter_mut().zip(value(i, p, t, h)) {
            *wj = beta * (vj - decay * *wj);
        }
        // SAFETY: token `t`'s row of this head, borrowed once.
        let o = unsafe { out.row(t) };
        o.fill(0.0);
        for ((&ki, &qi), srow) in k.iter().zip(q.iter()).zip(st.chunks_exact_mut(dv)) {
            for ((sv, &uj), oj) in srow.iter_mut().zip(w.iter()).zip(o.iter_mut()) {
                let x = F::fma(ki, uj, decay * *sv);
                *sv = x;
                *oj = F::fma(qi, x, *oj);
            }
        }
    }
}

/// The chunked form (see the module docs).
///
/// # Safety
/// As [`HeadOut::row`].
#[inline(always)]
unsafe fn chunked<F: MulAdd>(
    i: &Inputs<'_>,
    p: &DeltaNetParams,
    st: &mut [f32],
    out: &HeadOut<'_, '_>,
    s: &mut DeltaScratch,
) {
    let (n, dk, dv, h) = (p.n_tokens, p.k_head_dim, p.v_head_dim, out.h);
    let DeltaScratch {
        q,
        k,
        kt,
        u,
        o,
        a,
        att,
        g,
        b,
        pack,
        ..
    } = s;
    for c0 in (0..n).step_by(CHUNK) {
        let l = CHUNK.min(n - c0);
        // The chunk's q, k, β and cumulative log-decay.
        let mut cum = 0.0;
        for t in 0..l {
            let (beta, gt) = token(
                i,
                p,
                c0 + t,
                h,
                &mut q[t * dk..(t + 1) * dk],
                &mut k[t * dk..(t + 1) * dk],
            );
            cum += gt;
            g[t] = cum;
            b[t] = beta;
        }
        for (t, kr) in k[..l * dk].chunks_exact(dk).enumerate() {
            for (d, &kv) in kr.iter().enumerate() {
                kt[d * CHUNK + t] = kv;
            }
        }
        // k_i·k_j and q_i·k_j for j ≤ i (and whatever else whole tiles
        // cover: columns up to a multiple of 16, which may read stale keys
        // past the chunk's), then A and the decayed scores, zero above the
        // diagonal.
        let (cols, tri) = (l.next_multiple_of(NR).min(CHUNK), Shape::LowerOut);
        gemm::<F>(
            l,
            cols,
            dk,
            (k, dk),
            (kt, CHUNK),
            (a, CHUNK),
            Init::Zero,
            tri,
            pack,
        );
        gemm::<F>(
            l,
            cols,
            dk,
            (q, dk),
            (kt, CHUNK),
            (att, CHUNK),
            Init::Zero,
            tri,
            pack,
        );
        for r in 0..l {
            let (ar, sr) = (&mut a[r * CHUNK..][..l], &mut att[r * CHUNK..][..l]);
            for c in 0..l {
                if c <= r {
                    let e = (g[r] - g[c]).exp();
                    sr[c] *= e;
                    ar[c] = if c < r { b[r] * ar[c] * e } else { 0.0 };
                } else {
                    sr[c] = 0.0;
                    ar[c] = 0.0;
                }
            }
        }
        // The reads of the state before the chunk: o_i = e^{G_i} Sᵀq_i and
        // r_i = β_i (v_i − e^{G_i} Sᵀk_i).
        gemm::<F>(
            l,
            dv,
            dk,
            (q, dk),
            (st, dv),
            (o, dv),
            Init::Zero,
            Shape::Full,
            pack,
        );
        gemm::<F>(
            l,
            dv,
            dk,
            (k, dk),
            (st, dv),
            (u, dv),
            Init::Zero,
            Shape::Full,
            pack,
        );
        for t in 0..l {
            let e = g[t].exp();
            o[t * dv..(t + 1) * dv].iter_mut().for_each(|x| *x *= e);
            let v = value(i, p, c0 + t, h);
            for (x, &vj) in u[t * dv..(t + 1) * dv].iter_mut().zip(v) {
                *x = b[t] * (vj - e * *x);
            }
        }
        // (I + A) U = R by forward substitution.
        for r in 1..l {
            let (done, rest) = u.split_at_mut(r * dv);
            let ur = &mut rest[..dv];
            for (c, uc) in done.chunks_exact(dv).enumerate() {
                axpy::<F>(-a[r * CHUNK + c], uc, ur);
            }
        }
        // o_i += Σ_{j ≤ i} (q_i·k_j) e^{G_i − G_j} u_j.
        gemm::<F>(
            l,
            dv,
            l,
            (att, CHUNK),
            (u, dv),
            (o, dv),
            Init::Keep,
            Shape::LowerDepth,
            pack,
        );
        for t in 0..l {
            // SAFETY: token `c0 + t`'s row of this head, borrowed once.
            unsafe { out.row(c0 + t) }.copy_from_slice(&o[t * dv..(t + 1) * dv]);
        }
        // S ← e^{G_{L−1}} S + Σ_j e^{G_{L−1} − G_j} k_j u_jᵀ.
        let last = g[l - 1];
        for gt in g[..l].iter_mut() {
            *gt = (last - *gt).exp();
        }
        for row in kt[..dk * CHUNK].chunks_exact_mut(CHUNK) {
            for (x, e) in row[..l].iter_mut().zip(&g[..l]) {
                *x *= e;
            }
        }
        let init = Init::Scale(last.exp());
        gemm::<F>(
            dk,
            dv,
            l,
            (kt, CHUNK),
            (u, dv),
            (st, dv),
            init,
            Shape::Full,
            pack,
        );
    }
}

/// Columns of a product tile.
const NR: usize = 16;
/// Rows of a product tile.
const MR: usize = 4;

/// What a product starts from.
#[derive(Clone, Copy)]
enum Init {
    /// `c = a·b`
    Zero,
    /// `c += a·b`
    Keep,
    /// `c = s · c + a·b`
    Scale(f32),
}

/// Which part of a product is needed, by tiles of [`MR`] rows `i0..i1`.
#[derive(Clone, Copy)]
enum Shape {
    Full,
    /// Columns `j < i1` only (the lower triangle and the tile's diagonal
    /// block).
    LowerOut,
    /// Depth `p < i1` only: `a` is zero past the diagonal.
    LowerDepth,
}

/// `c[i, j] = init(c[i, j]) + Σ_p a[i, p] · b[p, j]` for `i < m`, `j < n`,
/// `p < depth` (matrices row-major, given with their row strides), limited
/// by `shape`; in tiles of [`MR`] × [`NR`], each element summed over `p`
/// in order whatever its tile. `pack` holds a tile's rows of `a`
/// interleaved (`MR · depth`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gemm<F: MulAdd>(
    m: usize,
    n: usize,
    depth: usize,
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    init: Init,
    shape: Shape,
    pack: &mut [f32],
) {
    let mut i0 = 0;
    while i0 < m {
        let rows = MR.min(m - i0);
        let i1 = i0 + rows;
        let (n_end, d_end) = match shape {
            Shape::Full => (n, depth),
            Shape::LowerOut => (n.min(i1.next_multiple_of(NR)), depth),
            Shape::LowerDepth => (n, depth.min(i1)),
        };
        let (a, c) = (&a[i0 * lda..], &mut c[i0 * ldc..]);
        let tiles = n_end / NR * NR;
        if rows == MR {
            let (packed, _) = pack[..MR * d_end].as_chunks_mut::<MR>();
            for (p, col) in packed.iter_mut().enumerate() {
                for (r, x) in col.iter_mut().enumerate() {
                    *x = a[r * lda + p];
                }
            }
            for j0 in (0..tiles).step_by(NR) {
                tile::<F, MR>(packed, b, ldb, c, ldc, j0, init);
            }
        } else {
            for r in 0..rows {
                let (row, _) = a[r * lda..r * lda + d_end].as_chunks::<1>();
                for j0 in (0..tiles).step_by(NR) {
                    tile::<F, 1>(row, b, ldb, &mut c[r * ldc..], ldc, j0, init);
                }
            }
        }
        for r in 0..rows {
            for j in tiles..n_end {
                let mut acc = match init {
                    Init::Zero => 0.0,
                    Init::Keep => c[r * ldc + j],
                    Init::Scale(sc) => sc * c[r * ldc + j],
                };
                for p in 0..d_end {
                    acc = F::fma(a[r * lda + p], b[p * ldb + j], acc);
                }
                c[r * ldc + j] = acc;
            }
        }
        i0 = i1;
    }
}

/// One tile of [`gemm`]: rows `0..R` of `c` and columns `j0..j0 + NR`,
/// from `a` packed (`a[p][r]`, the depth its length).
#[inline(always)]
fn tile<F: MulAdd, const R: usize>(
    a: &[[f32; R]],
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    j0: usize,
    init: Init,
) {
    let mut acc = [[0f32; NR]; R];
    let scale = match init {
        Init::Zero => None,
        Init::Keep => Some(1.0),
        Init::Scale(sc) => Some(sc),
    };
    if let Some(sc) = scale {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let cr = &c[r * ldc + j0..r * ldc + j0 + NR];
            for (x, &cv) in acc_r.iter_mut().zip(cr) {
                *x = sc * cv;
            }
        }
    }
    for (ap, brow) in a.iter().zip(b[j0..].chunks(ldb)) {
        let Some(bp) = brow.first_chunk::<NR>() else {
            break;
        };
        for (acc_r, &av) in acc.iter_mut().zip(ap) {
            for (x, &bv) in acc_r.iter_mut().zip(bp) {
                *x = F::fma(av, bv, *x);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (cv, &x) in c[r * ldc + j0..r * ldc + j0 + NR].iter_mut().zip(acc_r) {
            *cv = x;
        }
    }
}
