//! Softmax attention over a KV cache, the token mixer of every layer whose
//! [`Mixer`](turbospark_core::arch::Mixer) is attention (the math is in
//! `turbospark_core::arch`):
//!
//! ```text
//! q, k = a·Wq (+b), a·Wk (+b) ; v = a·Wv (+b), or k itself (value_from_key)
//!   (latent attention, super::latent: q = [q_rope, W_ukᵀ·q_nope], k = v = [k_rope, rms(c)])
//! q, k, v = per-head q/k/v norms ; q, k = rope(q, k)
//! cache k, v ; o = attention(q, cache)          (window, sinks, softcap, GQA)
//! o ⊙= sigmoid(a·Wgate)                          (output gate)
//! out = o·Wo (+b)                                (latent: o_h = W_uv[h]·o_h first)
//! ```
//!
//! The cache of a layer ([`KvRows`]) holds keys and values as
//! `[capacity, n_kv_heads · head_dim]` rows in the device's KV dtype
//! ([`Device::kv_dtype`]), position `p` in row `p % capacity`.
//! Full-attention layers hold the whole context. A sliding layer with
//! window `w` only ever needs the last `w` keys, but a batch of `b` queries
//! written together needs the `w − 1` keys before the batch plus the batch
//! itself, so its ring holds `min(w + b − 1, context)` rows (`b` the
//! session's largest batch). Writing a batch then never overwrites a key a
//! query of this or a later batch still reads. With latent attention a
//! layer caches one row `[rope(k_rope), c]` per position, read as both keys
//! and values: the `v` buffer is empty.

use super::latent::{self, LatentWeights};
use super::{LayerCache, LayerState, MixIo, Parts, Seqs};
use crate::loader::{check_shape, Listed, Loader};
use crate::EngineError;
use turbospark_backend::{
    AttentionParams, AttentionPart, DType, Device, HostTensor, RopeTable, SharedBytes, Stream,
};
use turbospark_core::arch::{ArchSpec, LayerSpec, Mixer};
use turbospark_format::roles::Role;

/// One attention layer's weights.
pub(crate) struct AttentionWeights<D: Device> {
    /// How the layer projects its queries, keys and values.
    pub(crate) qkv: Projection<D>,
    /// `[hidden, n_heads · head_dim]`; with latent attention `[hidden,
    /// n_heads · v]`.
    pub(crate) attn_output: D::Matrix,
    pub(crate) attn_output_bias: Option<D::Vector>,
    /// Output gate `[n_heads · head_dim, hidden]` (Muse Glimmer; Qwen3.5's
    /// rows of `attn_q`, see [`split_q_gate`]).
    pub(crate) attn_gate: Option<D::Matrix>,
    /// One sink logit per query head (gpt-oss).
    pub(crate) attn_sinks: Option<D::Vector>,
}

/// The projections of queries, keys and values.
pub(crate) enum Projection<D: Device> {
    Plain(PlainQkv<D>),
    /// Latent attention (DeepSeek-V3).
    Latent(LatentWeights<D>),
}

/// The q, k, v projections of plain attention, with their biases and
/// per-head norms.
pub(crate) struct PlainQkv<D: Device> {
    /// `[n_heads · head_dim, hidden]`
    pub(crate) attn_q: D::Matrix,
    /// `[n_kv_heads · head_dim, hidden]`
    pub(crate) attn_k: D::Matrix,
    /// `None` on layers whose values are the key projection
    /// ([`LayerSpec::value_from_key`]).
    pub(crate) attn_v: Option<D::Matrix>,
    pub(crate) attn_q_bias: Option<D::Vector>,
    pub(crate) attn_k_bias: Option<D::Vector>,
    pub(crate) attn_v_bias: Option<D::Vector>,
    /// Per-head norms `[head_dim]`.
    pub(crate) attn_q_norm: Option<D::Vector>,
    pub(crate) attn_k_norm: Option<D::Vector>,
    pub(crate) attn_v_norm: Option<D::Vector>,
}

/// The weights of attention layer `l`.
pub(crate) fn load<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ArchSpec,
    l: usize,
    ts: &Listed,
) -> Result<AttentionWeights<D>, EngineError> {
    let mut attn_gate = None;
    let qkv = match &spec.mla {
        Some(a) => Projection::Latent(latent::load(ld, a, l, ts)?),
        None => {
            let attn_q = if spec.attention.gate_in_q {
                let (q, gate) = q_and_gate(ld, spec, l, ts)?;
                attn_gate = Some(gate);
                q
            } else {
                ld.matrix(ts, Role::AttnQ)?
            };
            Projection::Plain(PlainQkv {
                attn_q,
                attn_k: ld.matrix(ts, Role::AttnK)?,
                attn_v: ld.opt_matrix(ts, Role::AttnV)?,
                attn_q_bias: ld.vector(ts, Role::AttnQBias)?,
                attn_k_bias: ld.vector(ts, Role::AttnKBias)?,
                attn_v_bias: ld.vector(ts, Role::AttnVBias)?,
                attn_q_norm: ld.vector(ts, Role::AttnQNorm)?,
                attn_k_norm: ld.vector(ts, Role::AttnKNorm)?,
                attn_v_norm: ld.vector(ts, Role::AttnVNorm)?,
            })
        }
    };
    let attn_gate = match attn_gate {
        Some(g) => Some(g),
        None => ld.opt_matrix(ts, Role::AttnGate)?,
    };
    Ok(AttentionWeights {
        qkv,
        attn_output: ld.matrix(ts, Role::AttnOutput)?,
        attn_output_bias: ld.vector(ts, Role::AttnOutputBias)?,
        attn_gate,
        attn_sinks: ld.vector(ts, Role::AttnSinks)?,
    })
}

/// `attn_q` with the output gate's rows inside it, as two matrices.
fn q_and_gate<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ArchSpec,
    l: usize,
    ts: &Listed,
) -> Result<(D::Matrix, D::Matrix), EngineError> {
    let (name, shape) = ts.required(Role::AttnQ)?;
    let t = ld.src.resident(name)?;
    check_shape(&t, shape)?;
    let (q, gate) = split_q_gate(&t, spec.num_heads, spec.layers[l].head_dim)?;
    Ok((ld.be.upload_matrix(&q)?, ld.be.upload_matrix(&gate)?))
}

/// Splits a q projection whose rows hold, per head, `head_dim` query rows
/// then `head_dim` output-gate rows (HF Qwen3.5 `q_proj`, viewed as
/// `[heads, 2 · head_dim]` and chunked in halves) into the query `[heads ·
/// head_dim, in]` and the gate `[heads · head_dim, in]`. Rows are copied
/// as they are, in any format.
fn split_q_gate(
    t: &HostTensor,
    heads: usize,
    head_dim: usize,
) -> Result<(HostTensor, HostTensor), EngineError> {
    let (rows, cols, rb) = t.matrix_layout()?;
    if rows != 2 * heads * head_dim {
        return Err(EngineError::TensorShape {
            name: t.name.clone(),
            expected: vec![2 * heads * head_dim, cols],
            found: t.shape.clone(),
        });
    }
    let bytes = t.bytes.as_slice();
    let half = heads * head_dim * rb;
    let (mut q, mut g) = (Vec::with_capacity(half), Vec::with_capacity(half));
    for h in 0..heads {
        let at = 2 * h * head_dim * rb;
        q.extend_from_slice(&bytes[at..at + head_dim * rb]);
        g.extend_from_slice(&bytes[at + head_dim * rb..at + 2 * head_dim * rb]);
    }
    let part = |suffix: &str, b: Vec<u8>| HostTensor {
        name: format!("{} ({suffix} rows)", t.name),
        format: t.format,
        shape: vec![heads * head_dim, cols],
        bytes: SharedBytes::from_vec(b),
    };
    Ok((part("query", q), part("gate", g)))
}

/// One attention layer's cache of a sequence.
pub(crate) struct KvRows<D: Device> {
    /// `[capacity, row]`
    k: D::Buf,
    /// `[capacity, row]`; empty with latent attention, whose values are
    /// the key rows.
    v: D::Buf,
    capacity: usize,
    /// `n_kv_heads · head_dim`
    row: usize,
    /// Values are the key rows (latent attention); `v` is empty.
    values_are_keys: bool,
}

/// Rows a layer with `window` keeps for a session of `context` positions
/// whose batches hold at most `max_batch` tokens.
pub(crate) fn layer_capacity(window: Option<usize>, context: usize, max_batch: usize) -> usize {
    match window {
        Some(w) => (w + max_batch - 1).min(context),
        None => context,
    }
}

impl<D: Device> KvRows<D> {
    pub(crate) fn new(
        device: &D,
        spec: &ArchSpec,
        l: &LayerSpec,
        context: usize,
        max_batch: usize,
    ) -> Result<Self, EngineError> {
        let dtype = device.kv_dtype();
        let latent = spec.mla.is_some();
        let capacity = layer_capacity(l.window, context, max_batch);
        let row = l.num_kv_heads * l.head_dim;
        Ok(KvRows {
            k: device.alloc(dtype, capacity * row)?,
            v: device.alloc(dtype, if latent { 0 } else { capacity * row })?,
            capacity,
            row,
            values_are_keys: latent,
        })
    }

    /// Whether `other` has this cache's shape.
    pub(crate) fn same_shape(&self, other: &Self) -> bool {
        (self.capacity, self.row, self.values_are_keys)
            == (other.capacity, other.row, other.values_are_keys)
    }

    /// Queues the copy of the rows of the first `positions` positions into
    /// `dst` (same shape). A ring that has not wrapped holds position `p`
    /// in row `p`, so they are its first `positions` rows.
    pub(crate) fn copy_prefix(
        &self,
        st: &mut D::Stream,
        dst: &mut Self,
        positions: usize,
    ) -> Result<(), EngineError> {
        let n = positions * self.row;
        if n == 0 {
            return Ok(());
        }
        st.copy(&self.k, 0, &mut dst.k, 0, n)?;
        if !self.values_are_keys {
            st.copy(&self.v, 0, &mut dst.v, 0, n)?;
        }
        Ok(())
    }
}

impl<D: Device> LayerState for KvRows<D> {
    fn elements_per_position(&self, context: usize) -> usize {
        match (self.capacity == context, self.values_are_keys) {
            (false, _) => 0,
            (true, true) => self.row,
            (true, false) => 2 * self.row,
        }
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn lost_positions(&self, position: usize, context: usize) -> bool {
        self.capacity < context && position > self.capacity
    }
}

/// The most keys one attention call of `spec`'s attention layers reads,
/// and their widest head, in a session of `context` positions and batches
/// of at most `max_batch` tokens.
pub(crate) fn stream_needs(
    spec: &ArchSpec,
    context: usize,
    max_batch: usize,
) -> impl Iterator<Item = (usize, usize)> + '_ {
    spec.layers
        .iter()
        .filter(|l| l.mixer == Mixer::Attention)
        .map(move |l| (layer_capacity(l.window, context, max_batch), l.head_dim))
}

/// An attention layer's part of a cache.
fn rows_of<D: Device>(cache: &LayerCache<D>) -> Result<&KvRows<D>, EngineError> {
    match cache {
        LayerCache::Attention(r) => Ok(r),
        _ => Err(no_rows()),
    }
}

fn rows_of_mut<D: Device>(cache: &mut LayerCache<D>) -> Result<&mut KvRows<D>, EngineError> {
    match cache {
        LayerCache::Attention(r) => Ok(r),
        _ => Err(no_rows()),
    }
}

fn no_rows() -> EngineError {
    EngineError::NotImplemented {
        feature: "an attention layer whose cache holds no key rows",
    }
}

/// Scratch of the attention layers, `T = max_batch` rows each (the
/// widest layer sets each size).
pub(crate) struct Scratch<D: Device> {
    /// `[T, n_heads · head_dim]`
    q: D::Buf,
    /// `[T, n_kv_heads · head_dim]`
    k: D::Buf,
    v: D::Buf,
    /// Attention output `[T, n_heads · head_dim]`.
    att: D::Buf,
    /// Output-gate logits `[T, n_heads · head_dim]`.
    gate: Option<D::Buf>,
    /// q, k, v and attention output of one sequence's rows, for a batch
    /// of sequences that attend to caches of their own ([`Seqs::Parts`]).
    row: RowScratch<D>,
    /// Latent attention's projections.
    latent: Option<latent::Scratch<D>>,
}

/// One sequence's q `[T, n_heads · head_dim]`, k and v `[T, n_kv_heads ·
/// head_dim]` and attention output `[T, n_heads · head_dim]`, its rows
/// copied out of the batch so that rope, cache write and attention see
/// them from row 0.
struct RowScratch<D: Device> {
    q: D::Buf,
    k: D::Buf,
    v: D::Buf,
    att: D::Buf,
}

impl<D: Device> Scratch<D> {
    /// The scratch of `T = t` rows, when the spec has attention layers.
    pub(crate) fn new(device: &D, spec: &ArchSpec, t: usize) -> Result<Option<Self>, EngineError> {
        let attention = || spec.layers.iter().filter(|l| l.mixer == Mixer::Attention);
        if attention().next().is_none() {
            return Ok(None);
        }
        let alloc = |len| device.alloc(DType::F32, len);
        let max = |f: &dyn Fn(&LayerSpec) -> usize| attention().map(f).max().unwrap_or(0);
        let qd = max(&|l| spec.num_heads * l.head_dim);
        let kvd = max(&|l| l.num_kv_heads * l.head_dim);
        Ok(Some(Scratch {
            q: alloc(t * qd)?,
            k: alloc(t * kvd)?,
            v: alloc(t * kvd)?,
            att: alloc(t * qd)?,
            gate: (spec.attention.output_gate || spec.attention.gate_in_q)
                .then(|| alloc(t * qd))
                .transpose()?,
            row: RowScratch {
                q: alloc(t * qd)?,
                k: alloc(t * kvd)?,
                v: alloc(t * kvd)?,
                att: alloc(t * qd)?,
            },
            latent: latent::Scratch::new(device, spec, t)?,
        }))
    }
}

pub(crate) fn add_bias<D: Device>(
    st: &mut D::Stream,
    x: &mut D::Buf,
    bias: Option<&D::Vector>,
    n: usize,
) -> Result<(), EngineError> {
    if let Some(b) = bias {
        st.add_bias(x, b, n)?;
    }
    Ok(())
}

/// What every per-sequence step of one attention layer reads.
struct Layer<'p, D: Device> {
    spec: &'p ArchSpec,
    l: usize,
    rope: Option<&'p RopeTable>,
    sinks: Option<&'p D::Vector>,
}

/// Attention layer `l` for the `n` rows of `io.a`, into `io.o`: the
/// projections, the output gate and the output projection are batched;
/// rope, cache write and attention run over the session's own cache
/// ([`Seqs::Own`]) or each sequence's ([`Seqs::Parts`]).
pub(crate) fn forward<D: Device>(
    w: &AttentionWeights<D>,
    io: MixIo<'_, D>,
    s: Option<&mut Scratch<D>>,
    seqs: Seqs<'_, D>,
) -> Result<(), EngineError> {
    let MixIo {
        st,
        spec,
        l,
        rope,
        a,
        o,
        n,
    } = io;
    let mismatch = EngineError::NotImplemented {
        feature: "attention weights that do not match the spec",
    };
    let Some(s) = s else {
        return Err(EngineError::NotImplemented {
            feature: "an attention layer without its scratch",
        });
    };
    let ls = &spec.layers[l];
    let (nh, hd) = (spec.num_heads, ls.head_dim);
    match (&spec.mla, &w.qkv) {
        (Some(m), Projection::Latent(lw)) => {
            latent::project_qk(st, a, &mut s.q, &mut s.k, s.latent.as_mut(), m, nh, lw, n)?
        }
        (None, Projection::Plain(pw)) => project_qkv(st, a, pw, spec, ls, s, n)?,
        _ => return Err(mismatch),
    }
    let cx = Layer {
        spec,
        l,
        rope,
        sinks: w.attn_sinks.as_ref(),
    };
    match seqs {
        Seqs::Own { cache, pos } => {
            let rows = Rows {
                q: &mut s.q,
                k: &mut s.k,
                v: &s.v,
                out: &mut s.att,
                n,
                pos,
            };
            attend(st, &cx, rows_of_mut(cache)?, rows)?;
        }
        // One attention call over every sequence's rows, when the backend
        // has it (the work splits between threads at once).
        Seqs::Parts(parts) if st.attends_parts() => {
            let mut first = 0;
            for i in 0..parts.count() {
                let (rows, pos, cache) = parts.part(i, l);
                write_part(st, &cx, s, rows_of_mut(cache)?, pos, first, rows)?;
                first += rows;
            }
            attend_parts(st, &cx, s, &*parts)?;
        }
        Seqs::Parts(parts) => {
            let mut first = 0;
            for i in 0..parts.count() {
                let (rows, pos, cache) = parts.part(i, l);
                attend_part(st, &cx, s, rows_of_mut(cache)?, pos, first, rows)?;
                first += rows;
            }
        }
    }
    if let (Some(wg), Some(g)) = (&w.attn_gate, s.gate.as_mut()) {
        st.matmul(wg, a, n, g)?;
        st.mul_sigmoid(&mut s.att, g, n * nh * hd)?;
    }
    match (&spec.mla, &w.qkv, s.latent.as_mut()) {
        (Some(m), Projection::Latent(lw), Some(ls)) => {
            latent::values::<D>(st, m, nh, &lw.kv_b, &s.att, n, &mut ls.v)?;
            st.matmul(&w.attn_output, &ls.v, n, o)?;
        }
        _ => st.matmul(&w.attn_output, &s.att, n, o)?,
    }
    add_bias::<D>(st, o, w.attn_output_bias.as_ref(), n)?;
    Ok(())
}

/// q, k, v of plain attention for `n` tokens of `x`, with their biases
/// and per-head norms.
fn project_qkv<D: Device>(
    st: &mut D::Stream,
    x: &D::Buf,
    w: &PlainQkv<D>,
    spec: &ArchSpec,
    ls: &LayerSpec,
    s: &mut Scratch<D>,
    n: usize,
) -> Result<(), EngineError> {
    let (nh, nkv, hd) = (spec.num_heads, ls.num_kv_heads, ls.head_dim);
    let norms = &spec.norms;
    st.matmul(&w.attn_q, x, n, &mut s.q)?;
    add_bias::<D>(st, &mut s.q, w.attn_q_bias.as_ref(), n)?;
    st.matmul(&w.attn_k, x, n, &mut s.k)?;
    add_bias::<D>(st, &mut s.k, w.attn_k_bias.as_ref(), n)?;
    match &w.attn_v {
        Some(wv) => {
            st.matmul(wv, x, n, &mut s.v)?;
            add_bias::<D>(st, &mut s.v, w.attn_v_bias.as_ref(), n)?;
        }
        // Values are the key projection as it is before the k norm and rope.
        None => st.copy(&s.k, 0, &mut s.v, 0, n * nkv * hd)?,
    }
    if let Some(ns) = norms.q {
        st.rms_norm(&mut s.q, n * nh, hd, ns, w.attn_q_norm.as_ref())?;
    }
    if let Some(ns) = norms.k {
        st.rms_norm(&mut s.k, n * nkv, hd, ns, w.attn_k_norm.as_ref())?;
    }
    if let Some(ns) = norms.v {
        st.rms_norm(&mut s.v, n * nkv, hd, ns, w.attn_v_norm.as_ref())?;
    }
    Ok(())
}

/// The query, key and value rows of `n` tokens at consecutive positions
/// from `pos`, and where their attention output goes.
struct Rows<'a, B> {
    q: &'a mut B,
    k: &'a mut B,
    v: &'a B,
    out: &'a mut B,
    n: usize,
    pos: usize,
}

/// Rope and cache write of the layer for the rows `r` (their queries
/// roped in place; `r.out` untouched), into the layer cache `kv`.
fn rope_and_write<D: Device>(
    st: &mut D::Stream,
    cx: &Layer<'_, D>,
    kv: &mut KvRows<D>,
    r: &mut Rows<'_, D::Buf>,
) -> Result<(), EngineError> {
    let (n, pos) = (r.n, r.pos);
    let spec = cx.spec;
    let ls = &spec.layers[cx.l];
    let (nh, nkv, hd) = (spec.num_heads, ls.num_kv_heads, ls.head_dim);
    if let Some(rope) = cx.rope {
        st.rope(r.q, n, nh, hd, pos, rope)?;
        st.rope(r.k, n, nkv, hd, pos, rope)?;
    }
    // Latent attention reads its one cached row as keys and values.
    st.kv_write(&mut kv.k, r.k, n, kv.row, pos, kv.capacity)?;
    if !kv.values_are_keys {
        st.kv_write(&mut kv.v, r.v, n, kv.row, pos, kv.capacity)?;
    }
    Ok(())
}

/// The attention parameters of `n` queries of the layer at consecutive
/// positions from `pos`, over the layer cache `kv`.
fn attention_params<D: Device>(
    cx: &Layer<'_, D>,
    kv: &KvRows<D>,
    n: usize,
    pos: usize,
) -> AttentionParams {
    let spec = cx.spec;
    let ls = &spec.layers[cx.l];
    AttentionParams {
        n_tokens: n,
        first_pos: pos,
        n_heads: spec.num_heads,
        n_kv_heads: ls.num_kv_heads,
        head_dim: ls.head_dim,
        capacity: kv.capacity,
        window: ls.window,
        scale: spec.attention.scale,
        softcap: spec.attention.softcap,
    }
}

/// The values a layer cache is read as: its key rows with latent
/// attention.
fn values_of<D: Device>(kv: &KvRows<D>) -> &D::Buf {
    if kv.values_are_keys {
        &kv.k
    } else {
        &kv.v
    }
}

/// Rope, cache write and attention of the layer for the rows `r`, into
/// the layer cache `kv`: the one block both the session's own tokens and
/// each sequence of a batch of sequences run (when the backend has no
/// [`Stream::attention_parts`]).
fn attend<D: Device>(
    st: &mut D::Stream,
    cx: &Layer<'_, D>,
    kv: &mut KvRows<D>,
    mut r: Rows<'_, D::Buf>,
) -> Result<(), EngineError> {
    rope_and_write(st, cx, kv, &mut r)?;
    let params = attention_params(cx, kv, r.n, r.pos);
    st.attention(r.q, &kv.k, values_of(kv), &params, cx.sinks, r.out)?;
    Ok(())
}

/// Rope and cache write of the layer for batch rows `first .. first + n`,
/// a sequence of their own at positions `pos ..` of its layer cache
/// `cache`: the roped queries go back to their rows of `s.q` for
/// [`attend_parts`].
#[allow(clippy::too_many_arguments)]
fn write_part<D: Device>(
    st: &mut D::Stream,
    cx: &Layer<'_, D>,
    s: &mut Scratch<D>,
    cache: &mut KvRows<D>,
    pos: usize,
    first: usize,
    n: usize,
) -> Result<(), EngineError> {
    let spec = cx.spec;
    let ls = &spec.layers[cx.l];
    let qd = spec.num_heads * ls.head_dim;
    let roped = cx.rope.is_some();
    let mut rows = part_rows(st, cx, s, cache, pos, first, n, roped)?;
    rope_and_write(st, cx, cache, &mut rows)?;
    if roped {
        st.copy(&s.row.q, 0, &mut s.q, first * qd, n * qd)?;
    }
    Ok(())
}

/// Copies batch rows `first .. first + n` of the layer's k, v (unless the
/// cache keeps its values as keys) and, with `with_q`, q into the row
/// scratch, and gives them as the rows of a sequence at positions `pos ..`.
#[allow(clippy::too_many_arguments)]
fn part_rows<'s, D: Device>(
    st: &mut D::Stream,
    cx: &Layer<'_, D>,
    s: &'s mut Scratch<D>,
    cache: &KvRows<D>,
    pos: usize,
    first: usize,
    n: usize,
    with_q: bool,
) -> Result<Rows<'s, D::Buf>, EngineError> {
    let ls = &cx.spec.layers[cx.l];
    let (qd, kvd) = (
        cx.spec.num_heads * ls.head_dim,
        ls.num_kv_heads * ls.head_dim,
    );
    let r = &mut s.row;
    if with_q {
        st.copy(&s.q, first * qd, &mut r.q, 0, n * qd)?;
    }
    st.copy(&s.k, first * kvd, &mut r.k, 0, n * kvd)?;
    if !cache.values_are_keys {
        st.copy(&s.v, first * kvd, &mut r.v, 0, n * kvd)?;
    }
    Ok(Rows {
        q: &mut r.q,
        k: &mut r.k,
        v: &r.v,
        out: &mut r.att,
        n,
        pos,
    })
}

/// Attention of the layer for the sequences of `parts`, each with its
/// rows after the previous sequences', whose keys and values
/// [`write_part`] has just written, at its cache's next positions. One
/// backend call for all ([`Stream::attention_parts`]); every row is
/// computed as a pass of its sequence alone would compute it.
fn attend_parts<D: Device>(
    st: &mut D::Stream,
    cx: &Layer<'_, D>,
    s: &mut Scratch<D>,
    parts: &dyn Parts<D>,
) -> Result<(), EngineError> {
    // A few dozen bytes per sequence and layer; the per-sequence caches
    // it borrows change every layer.
    let parts: Vec<AttentionPart<'_, D::Buf>> = (0..parts.count())
        .map(|i| {
            let (n, pos, cache) = parts.part_ref(i, cx.l);
            let kl = rows_of(cache)?;
            Ok(AttentionPart {
                k_cache: &kl.k,
                v_cache: values_of(kl),
                params: attention_params(cx, kl, n, pos),
            })
        })
        .collect::<Result<_, EngineError>>()?;
    st.attention_parts(&s.q, &parts, cx.sinks, &mut s.att)?;
    Ok(())
}

/// Rope, cache write and attention of the layer for batch rows `first ..
/// first + n`, a sequence of their own at positions `pos ..` of its layer
/// cache `cache`, which they alone attend to. The rows are computed
/// exactly as a pass of the sequence alone over those tokens would
/// compute them.
#[allow(clippy::too_many_arguments)]
fn attend_part<D: Device>(
    st: &mut D::Stream,
    cx: &Layer<'_, D>,
    s: &mut Scratch<D>,
    cache: &mut KvRows<D>,
    pos: usize,
    first: usize,
    n: usize,
) -> Result<(), EngineError> {
    let qd = cx.spec.num_heads * cx.spec.layers[cx.l].head_dim;
    let rows = part_rows(st, cx, s, cache, pos, first, n, true)?;
    attend(st, cx, cache, rows)?;
    st.copy(&s.row.att, 0, &mut s.att, first * qd, n * qd)?;
    Ok(())
}
