//! Multi-head latent attention (DeepSeek-V2/V3; [`MlaSpec`], whose doc
//! states the math): how a layer of the [`super::attention`] mixer projects
//! its queries, keys and values when the spec has latent attention, and
//! how it turns each head's attention output into values. Everything else
//! (rope, the cache, the attention op, the output projection) is
//! attention's.
//!
//! The decoder runs the absorbed form: head `h`'s query in latent space is
//! `[rope(q_rope), W_uk[h]ᵀ·q_nope]`, the cache holds one row
//! `[rope(k_rope), rms(c)]` per position (one KV head of `rope + kv_lora`,
//! keys and values alike), and `o_h = W_uv[h]·(Σ p·c)`.

use crate::loader::{Listed, Loader};
use crate::EngineError;
use turbospark_backend::{DType, Device, HeadMatmul, Stream};
use turbospark_core::arch::{ArchSpec, KvBLayout, MlaSpec, NormSpec};
use turbospark_format::roles::Role;

/// Latent attention of one layer. Every matrix keeps the checkpoint's
/// format: nothing is folded into another matrix at load (the absorbed
/// products of DeepSeek-V3 in f32 would be about 150 GB).
pub(crate) struct LatentWeights<D: Device> {
    /// `attn_q_b` `[n_heads · (nope + rope), q_lora]`, or `attn_q`
    /// `[n_heads · (nope + rope), hidden]` without a low-rank query.
    pub(crate) attn_q: D::Matrix,
    /// `attn_q_a` `[q_lora, hidden]` and `attn_q_a_norm` `[q_lora]`, when
    /// the query is low-rank.
    pub(crate) q_a: Option<(D::Matrix, D::Vector)>,
    /// The latent rows of `attn_kv_a_mqa` `[kv_lora, hidden]`.
    pub(crate) kv_a_latent: D::Matrix,
    /// The shared rope-key rows of `attn_kv_a_mqa` `[rope, hidden]`.
    pub(crate) kv_a_rope: D::Matrix,
    /// `attn_kv_a_norm` `[kv_lora]`.
    pub(crate) kv_a_norm: D::Vector,
    /// The key/value up-projection, applied per head
    /// ([`turbospark_backend::Stream::head_matmul`]).
    pub(crate) kv_b: KvB<D>,
}

/// Latent attention's key/value up-projection, as the checkpoint stores it
/// ([`KvBLayout`]).
pub(crate) enum KvB<D: Device> {
    /// `attn_kv_b` `[n_heads · (nope + v), kv_lora]`: per head, `W_uk[h]`
    /// `[nope, kv_lora]` over `W_uv[h]` `[v, kv_lora]`.
    Fused(D::Matrix),
    /// `attn_k_b` `[n_heads · kv_lora, nope]` (each `W_uk[h]ᵀ`) and
    /// `attn_v_b` `[n_heads · v, kv_lora]` (each `W_uv[h]`).
    Split { k_b: D::Matrix, v_b: D::Matrix },
}

/// Latent attention's intermediate rows, `T` of each.
pub(crate) struct Scratch<D: Device> {
    /// `q_a · x` `[T, q_lora]`
    q_a: D::Buf,
    /// The query as the checkpoint projects it `[T, n_heads · (nope +
    /// rope)]`.
    q: D::Buf,
    /// The values `[T, n_heads · v]`.
    pub(crate) v: D::Buf,
    /// The latent `c` `[T, kv_lora]`.
    latent: D::Buf,
    /// The shared rope key `[T, rope]`.
    rope: D::Buf,
}

impl<D: Device> Scratch<D> {
    /// The scratch of `T = t` rows, when the spec has latent attention.
    pub(crate) fn new(device: &D, spec: &ArchSpec, t: usize) -> Result<Option<Self>, EngineError> {
        let alloc = |len| device.alloc(DType::F32, len);
        spec.mla
            .as_ref()
            .map(|a| {
                Ok(Scratch {
                    q_a: alloc(t * a.q_lora_rank.unwrap_or(0))?,
                    q: alloc(t * spec.num_heads * a.qk_head_dim())?,
                    v: alloc(t * spec.num_heads * a.v_head_dim)?,
                    latent: alloc(t * a.kv_lora_rank)?,
                    rope: alloc(t * a.qk_rope_head_dim)?,
                })
            })
            .transpose()
    }
}

/// Latent attention of layer `l`.
pub(crate) fn load<D: Device>(
    ld: &Loader<'_, D>,
    a: &MlaSpec,
    l: usize,
    ts: &Listed,
) -> Result<LatentWeights<D>, EngineError> {
    let (r, dr) = (a.kv_lora_rank, a.qk_rope_head_dim);
    let (attn_q, q_a) = match a.q_lora_rank {
        Some(_) => {
            let q_a = ld.matrix(ts, Role::AttnQA)?;
            let norm = ld
                .vector(ts, Role::AttnQANorm)?
                .ok_or(EngineError::NotImplemented {
                    feature: "a low-rank query without its norm",
                })?;
            (ld.matrix(ts, Role::AttnQB)?, Some((q_a, norm)))
        }
        None => (ld.matrix(ts, Role::AttnQ)?, None),
    };
    let weights = LatentWeights {
        attn_q,
        q_a,
        kv_a_latent: ld.row_block(
            ts,
            Role::AttnKvAMqa,
            format!("blk.{l}.attn_kv_a_mqa.weight (latent rows)"),
            0..r,
        )?,
        kv_a_rope: ld.row_block(
            ts,
            Role::AttnKvAMqa,
            format!("blk.{l}.attn_kv_a_mqa.weight (rope rows)"),
            r..r + dr,
        )?,
        kv_a_norm: ld
            .vector(ts, Role::AttnKvANorm)?
            .ok_or(EngineError::NotImplemented {
                feature: "latent attention without its kv_a norm",
            })?,
        kv_b: match a.kv_b {
            KvBLayout::Fused => KvB::Fused(ld.matrix(ts, Role::AttnKvB)?),
            KvBLayout::Split => KvB::Split {
                k_b: ld.matrix(ts, Role::AttnKB)?,
                v_b: ld.matrix(ts, Role::AttnVB)?,
            },
        },
    };
    if ld.be.copies_weights() {
        if let Ok((name, _)) = ts.required(Role::AttnKvAMqa) {
            ld.src.release_resident(name);
        }
    }
    Ok(weights)
}

/// Latent attention's query and cache rows for `n` tokens of `x` (the
/// normed input): `q` `[n, n_heads, rope + kv_lora]` is the absorbed
/// query `[q_rope, W_uk[h]ᵀ·q_nope]` of each head, `W_uk[h]` the first
/// `nope` rows of head `h`'s block in `attn_kv_b` (multiplied transposed),
/// or head `h`'s block of `attn_k_b`, which holds `W_uk[h]ᵀ` (multiplied
/// as it is), in its own format ([`Stream::head_matmul`]); `k`
/// `[n, rope + kv_lora]` the row `[k_rope, rms(c)]` the cache keeps (rope
/// is applied later, to the first `rope` dims of both).
#[allow(clippy::too_many_arguments)]
pub(crate) fn project_qk<D: Device>(
    st: &mut D::Stream,
    x: &D::Buf,
    q: &mut D::Buf,
    k: &mut D::Buf,
    s: Option<&mut Scratch<D>>,
    a: &MlaSpec,
    n_heads: usize,
    w: &LatentWeights<D>,
    n: usize,
) -> Result<(), EngineError> {
    let Some(s) = s else {
        return Err(EngineError::NotImplemented {
            feature: "latent attention without its scratch",
        });
    };
    let norm = NormSpec::plain(a.norm_eps);
    match (&w.q_a, a.q_lora_rank) {
        (Some((q_a, q_a_norm)), Some(rank)) => {
            st.matmul(q_a, x, n, &mut s.q_a)?;
            st.rms_norm(&mut s.q_a, n, rank, norm, Some(q_a_norm))?;
            st.matmul(&w.attn_q, &s.q_a, n, &mut s.q)?;
        }
        _ => st.matmul(&w.attn_q, x, n, &mut s.q)?,
    }
    let (r, dn, dr, dv) = (
        a.kv_lora_rank,
        a.qk_nope_head_dim,
        a.qk_rope_head_dim,
        a.v_head_dim,
    );
    let (qk, row) = (a.qk_head_dim(), a.latent_head_dim());
    // Each head's query is `[q_nope, q_rope]`: the rope part goes to the
    // front of its absorbed row as it is, the rest is `W_uk[h]ᵀ·q_nope`.
    for th in 0..n * n_heads {
        st.copy(&s.q, th * qk + dn, q, th * row, dr)?;
    }
    let (w_uk, head_stride, rows, transpose) = match &w.kv_b {
        KvB::Fused(kv_b) => (kv_b, dn + dv, dn, true),
        KvB::Split { k_b, .. } => (k_b, r, r, false),
    };
    let absorb = HeadMatmul {
        n_tokens: n,
        n_heads,
        head_stride,
        first_row: 0,
        rows,
        transpose,
        x_stride: qk,
        x_at: 0,
        out_stride: row,
        out_at: dr,
    };
    st.head_matmul(w_uk, &s.q, &absorb, q)?;
    st.matmul(&w.kv_a_latent, x, n, &mut s.latent)?;
    st.rms_norm(&mut s.latent, n, r, norm, Some(&w.kv_a_norm))?;
    st.matmul(&w.kv_a_rope, x, n, &mut s.rope)?;
    for t in 0..n {
        st.copy(&s.rope, t * dr, k, t * row, dr)?;
        st.copy(&s.latent, t * r, k, t * row + dr, r)?;
    }
    Ok(())
}

/// Latent attention's values for `n` tokens: head `h`'s attention output
/// `att` `[n, n_heads, rope + kv_lora]` is a weighted sum of cached
/// `[k_rope, c]` rows; its value is `W_uv[h]·(Σ p·c)` (`W_uv[h]` the last
/// `v` rows of head `h`'s block in `attn_kv_b`, or head `h`'s block of
/// `attn_v_b`), written to `out` `[n, n_heads · v]`, the input of
/// `attn_output`.
pub(crate) fn values<D: Device>(
    st: &mut D::Stream,
    a: &MlaSpec,
    n_heads: usize,
    kv_b: &KvB<D>,
    att: &D::Buf,
    n: usize,
    out: &mut D::Buf,
) -> Result<(), EngineError> {
    let (dn, dr, dv) = (a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim);
    let (w_uv, head_stride, first_row) = match kv_b {
        KvB::Fused(kv_b) => (kv_b, dn + dv, dn),
        KvB::Split { v_b, .. } => (v_b, dv, 0),
    };
    let values = HeadMatmul {
        n_tokens: n,
        n_heads,
        head_stride,
        first_row,
        rows: dv,
        transpose: false,
        x_stride: a.latent_head_dim(),
        x_at: dr,
        out_stride: dv,
        out_at: 0,
    };
    st.head_matmul(w_uv, att, &values, out)?;
    Ok(())
}
