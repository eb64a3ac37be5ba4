//! Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5/3.6; HF
//! `Qwen3_5MoeGatedDeltaNet` of transformers 5.24.0), the token mixer of
//! the layers whose [`Mixer`](turbospark_core::arch::Mixer) is DeltaNet.
//! [`DeltaNetSpec`] states the recurrence; per layer:
//!
//! ```text
//! c = conv1d_silu(a·W_qkv) ; o = delta_rule(c, a·W_alpha, a·W_beta)   (state per sequence)
//! out = W_out · (rms(o)·w ⊙ silu(a·W_z))
//! ```
//!
//! The projections are batched over every row of a pass; the convolution
//! and the recurrence (backend ops, `turbospark_backend::delta_net`) run
//! over each sequence's own state.
//!
//! A layer keeps no KV rows: its state ([`RecurrentState`], f32) is the
//! last `kernel − 1` convolution inputs and the recurrent matrix per value
//! head, constant in the sequence length. The state holds exactly the
//! positions before the cache's position: a pass starts there (a sequence
//! cannot rewind), and one at position 0 reads the state as zeros, so a
//! reset sequence never sees a stale state. A pass that fails midway may
//! have moved the state without the position; the session then resets the
//! cache so that it recomputes.

use super::{LayerCache, LayerState, MixIo, Seqs};
use crate::loader::{check_shape, Listed, Loader};
use crate::EngineError;
use turbospark_backend::{
    ConvParams, DType, DeltaNetInput, DeltaNetParams, Device, DeviceBuf, Stream,
};
use turbospark_core::arch::{Activation, ArchSpec, DeltaNetSpec, Mixer, NormSpec};
use turbospark_format::roles::Role;

/// A gated DeltaNet layer's weights.
pub(crate) struct DeltaNetWeights<D: Device> {
    /// `attn_qkv` `[2 · key_dim + value_dim, hidden]`
    qkv: D::Matrix,
    /// `attn_gate` (HF `in_proj_z`) `[value_dim, hidden]`
    z: D::Matrix,
    /// `ssm_beta` `[v_heads, hidden]`
    beta: D::Matrix,
    /// `ssm_alpha` `[v_heads, hidden]`
    alpha: D::Matrix,
    /// `ssm_conv1d` `[conv_dim · kernel]` (channel-major).
    conv: D::Vector,
    /// `ssm_dt.bias` `[v_heads]`
    dt_bias: D::Vector,
    /// `ssm_a_log` `[v_heads]`
    a_log: D::Vector,
    /// `ssm_norm` `[v_head_dim]`, a plain weight.
    norm: D::Vector,
    /// `ssm_out` `[hidden, value_dim]`
    out: D::Matrix,
}

/// A gated DeltaNet layer's weights.
pub(crate) fn load<D: Device>(
    ld: &Loader<'_, D>,
    ts: &Listed,
) -> Result<DeltaNetWeights<D>, EngineError> {
    let required = |role| {
        ld.vector(ts, role)?.ok_or(EngineError::NotImplemented {
            feature: "a DeltaNet layer whose tensor table lacks a vector",
        })
    };
    // The depthwise kernel `[channels, kernel]` as one vector.
    let (name, shape) = ts.required(Role::SsmConv1d)?;
    let mut conv = ld.src.resident(name)?;
    check_shape(&conv, shape)?;
    conv.shape = vec![shape.iter().product()];
    Ok(DeltaNetWeights {
        qkv: ld.matrix(ts, Role::AttnQkv)?,
        z: ld.matrix(ts, Role::AttnGate)?,
        beta: ld.matrix(ts, Role::SsmBeta)?,
        alpha: ld.matrix(ts, Role::SsmAlpha)?,
        conv: ld.be.upload_vector(&conv)?,
        dt_bias: required(Role::SsmDt)?,
        a_log: required(Role::SsmALog)?,
        norm: required(Role::SsmNorm)?,
        out: ld.matrix(ts, Role::SsmOut)?,
    })
}

/// The per-sequence state of a gated DeltaNet layer, f32.
pub(crate) struct RecurrentState<D: Device> {
    /// The last `kernel − 1` inputs of the convolution `[kernel − 1,
    /// conv_dim]`, oldest first.
    conv: D::Buf,
    /// `[v_heads, k_head_dim, v_head_dim]`
    recurrent: D::Buf,
}

impl<D: Device> RecurrentState<D> {
    pub(crate) fn new(device: &D, spec: &ArchSpec) -> Result<Self, EngineError> {
        let d = delta_spec(spec)?;
        Ok(RecurrentState {
            conv: device.alloc(DType::F32, d.conv_state_len())?,
            recurrent: device.alloc(DType::F32, d.recurrent_state_len())?,
        })
    }

    /// Whether `other` has this state's shape.
    pub(crate) fn same_shape(&self, other: &Self) -> bool {
        (self.conv.len(), self.recurrent.len()) == (other.conv.len(), other.recurrent.len())
    }
}

impl<D: Device> LayerState for RecurrentState<D> {
    fn state_elements(&self) -> usize {
        self.conv.len() + self.recurrent.len()
    }

    fn recurrent(&self) -> bool {
        true
    }
}

fn delta_spec(spec: &ArchSpec) -> Result<&DeltaNetSpec, EngineError> {
    spec.delta_net.as_ref().ok_or(EngineError::NotImplemented {
        feature: "a DeltaNet layer without its spec",
    })
}

/// A DeltaNet layer's part of a cache.
fn state_of<D: Device>(cache: &mut LayerCache<D>) -> Result<&mut RecurrentState<D>, EngineError> {
    match cache {
        LayerCache::DeltaNet(s) => Ok(s),
        _ => Err(EngineError::NotImplemented {
            feature: "a DeltaNet layer whose cache holds no recurrent state",
        }),
    }
}

/// The widest head the delta rule works on (one key head at a time), when
/// the spec has DeltaNet layers.
/// The widest key or value head of the gated delta rule (0: none).
pub(crate) fn head_dim(spec: &ArchSpec) -> usize {
    spec.delta_net.map_or(0, |d| d.k_head_dim.max(d.v_head_dim))
}

pub(crate) fn stream_needs(spec: &ArchSpec) -> impl Iterator<Item = (usize, usize)> + '_ {
    let any = spec.layers.iter().any(|l| l.mixer == Mixer::DeltaNet);
    spec.delta_net
        .iter()
        .filter(move |_| any)
        .map(|d| (0, d.k_head_dim))
}

/// Gated DeltaNet's intermediate rows: `T` of each for the batch, and `T`
/// more for one sequence's rows of a batch of sequences, each over its own
/// state ([`Seqs::Parts`]).
pub(crate) struct Scratch<D: Device> {
    batch: DeltaRow<D>,
    /// `a · W_z` `[T, value_dim]`, then the gated output.
    z: D::Buf,
    row: DeltaRow<D>,
}

/// DeltaNet rows, `T` of each.
struct DeltaRow<D: Device> {
    /// `a · W_qkv` `[T, conv_dim]`
    mixed: D::Buf,
    /// The convolution's output `[T, conv_dim]`.
    conv: D::Buf,
    /// `a · W_alpha`, `a · W_beta` `[T, v_heads]`
    alpha: D::Buf,
    beta: D::Buf,
    /// The recurrence's output `[T, value_dim]`.
    core: D::Buf,
}

impl<D: Device> Scratch<D> {
    /// The scratch of `T = t` rows, when the spec has a DeltaNet block.
    pub(crate) fn new(device: &D, spec: &ArchSpec, t: usize) -> Result<Option<Self>, EngineError> {
        let alloc = |len| device.alloc(DType::F32, len);
        spec.delta_net
            .as_ref()
            .map(|d| {
                let rows = |t: usize| {
                    Ok::<_, EngineError>(DeltaRow {
                        mixed: alloc(t * d.conv_dim())?,
                        conv: alloc(t * d.conv_dim())?,
                        alpha: alloc(t * d.v_heads)?,
                        beta: alloc(t * d.v_heads)?,
                        core: alloc(t * d.value_dim())?,
                    })
                };
                Ok(Scratch {
                    batch: rows(t)?,
                    z: alloc(t * d.value_dim())?,
                    row: rows(t)?,
                })
            })
            .transpose()
    }
}

/// DeltaNet layer `l`'s token mixing for the `n` rows of `io.a` into
/// `io.o`: the projections are batched; the convolution and the
/// recurrence run over the session's own state ([`Seqs::Own`]) or each
/// sequence's ([`Seqs::Parts`]).
pub(crate) fn forward<D: Device>(
    w: &DeltaNetWeights<D>,
    io: MixIo<'_, D>,
    s: Option<&mut Scratch<D>>,
    seqs: Seqs<'_, D>,
) -> Result<(), EngineError> {
    let MixIo {
        st,
        spec,
        l,
        a,
        o,
        n,
        ..
    } = io;
    let (Some(d), Some(s)) = (&spec.delta_net, s) else {
        return Err(EngineError::NotImplemented {
            feature: "a DeltaNet layer without its spec or scratch",
        });
    };
    st.matmul(&w.qkv, a, n, &mut s.batch.mixed)?;
    st.matmul(&w.alpha, a, n, &mut s.batch.alpha)?;
    st.matmul(&w.beta, a, n, &mut s.batch.beta)?;
    st.matmul(&w.z, a, n, &mut s.z)?;
    match seqs {
        Seqs::Own { cache, pos } => {
            recurrence(st, d, w, &mut s.batch, state_of(cache)?, n, pos == 0)?;
        }
        Seqs::Parts(parts) => {
            let mut first = 0;
            for i in 0..parts.count() {
                let (rows, pos, cache) = parts.part(i, l);
                part(st, d, w, s, state_of(cache)?, pos == 0, first, rows)?;
                first += rows;
            }
        }
    }
    // Gated RMSNorm per value head (plain weight, the model's eps), then
    // `z ← silu(z) · norm(o)`, then the output projection.
    let eps = spec.norms.attn_input.eps;
    st.rms_norm(
        &mut s.batch.core,
        n * d.v_heads,
        d.v_head_dim,
        NormSpec::plain(eps),
        Some(&w.norm),
    )?;
    st.glu(
        &mut s.z,
        &s.batch.core,
        n * d.value_dim(),
        Activation::Swiglu,
    )?;
    st.matmul(&w.out, &s.z, n, o)?;
    Ok(())
}

/// The convolution and the recurrence of one DeltaNet layer for `n` rows
/// of one sequence, from `r.mixed`, `r.alpha`, `r.beta` into `r.core`;
/// `fresh` when the sequence starts.
fn recurrence<D: Device>(
    st: &mut D::Stream,
    d: &DeltaNetSpec,
    w: &DeltaNetWeights<D>,
    r: &mut DeltaRow<D>,
    state: &mut RecurrentState<D>,
    n: usize,
    fresh: bool,
) -> Result<(), EngineError> {
    let conv = ConvParams {
        n_tokens: n,
        channels: d.conv_dim(),
        kernel: d.conv_kernel,
        fresh,
    };
    st.causal_conv1d_silu(&r.mixed, &mut state.conv, &w.conv, &conv, &mut r.conv)?;
    let params = DeltaNetParams {
        n_tokens: n,
        k_heads: d.k_heads,
        v_heads: d.v_heads,
        k_head_dim: d.k_head_dim,
        v_head_dim: d.v_head_dim,
        fresh,
    };
    let input = DeltaNetInput {
        qkv: &r.conv,
        alpha: &r.alpha,
        beta: &r.beta,
        a_log: &w.a_log,
        dt_bias: &w.dt_bias,
    };
    st.gated_delta_rule(input, &params, &mut state.recurrent, &mut r.core)?;
    Ok(())
}

/// The convolution and the recurrence of one DeltaNet layer for batch
/// rows `first .. first + n`, a sequence of their own whose layer state is
/// `state` (`fresh` when the sequence starts), over that state: the rows
/// are copied to `s.row` and their output back to `s.batch.core`.
#[allow(clippy::too_many_arguments)]
fn part<D: Device>(
    st: &mut D::Stream,
    d: &DeltaNetSpec,
    w: &DeltaNetWeights<D>,
    s: &mut Scratch<D>,
    state: &mut RecurrentState<D>,
    fresh: bool,
    first: usize,
    n: usize,
) -> Result<(), EngineError> {
    let (c, hv, vd) = (d.conv_dim(), d.v_heads, d.value_dim());
    let r = &mut s.row;
    st.copy(&s.batch.mixed, first * c, &mut r.mixed, 0, n * c)?;
    st.copy(&s.batch.alpha, first * hv, &mut r.alpha, 0, n * hv)?;
    st.copy(&s.batch.beta, first * hv, &mut r.beta, 0, n * hv)?;
    recurrence(st, d, w, r, state, n, fresh)?;
    st.copy(&r.core, 0, &mut s.batch.core, first * vd, n * vd)?;
    Ok(())
}
