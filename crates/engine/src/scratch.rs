//! The scratch activations of a session: every buffer one forward pass
//! writes, `T = max_batch` rows each, sized from the [`ArchSpec`] once when
//! the session is made (the largest layer sets each size), so the decoder
//! ([`crate::decoder`]) never allocates.

use crate::EngineError;
use turbospark_backend::{DType, Device, MoeScratch};
use turbospark_core::arch::{ArchSpec, FfnKind, LayerSpec};

/// Scratch activations of a session, `T = max_batch` rows each.
pub(crate) struct Buffers<D: Device> {
    /// Residual stream `[T, hidden]`.
    pub(crate) h: D::Buf,
    /// Normed block input `[T, hidden]`.
    pub(crate) a: D::Buf,
    /// `[T, n_heads · head_dim]`
    pub(crate) q: D::Buf,
    /// `[T, n_kv_heads · head_dim]`
    pub(crate) k: D::Buf,
    pub(crate) v: D::Buf,
    /// Attention output `[T, n_heads · head_dim]`.
    pub(crate) att: D::Buf,
    /// Output-gate logits `[T, n_heads · head_dim]`.
    pub(crate) gate: Option<D::Buf>,
    /// Block output before the residual add `[T, hidden]`.
    pub(crate) o: D::Buf,
    /// Dense / shared MLP `[T, intermediate]`.
    pub(crate) mlp_gate: D::Buf,
    pub(crate) mlp_up: D::Buf,
    /// Second FFN branch (shared expert, parallel dense) `[T, hidden]`.
    pub(crate) branch: D::Buf,
    /// Router logits `[T, num_experts]`.
    pub(crate) router: Option<D::Buf>,
    /// Routes `[T, top_k]`, expert ids.
    pub(crate) routes: Option<D::Routes>,
    /// Router or expert input taken from the residual stream under its own
    /// norm (Gemma 4) `[T, hidden]`.
    pub(crate) moe_in: Option<D::Buf>,
    pub(crate) moe: Option<MoeScratch<D::Buf>>,
    /// `[T, vocab]`
    pub(crate) logits: D::Buf,
    /// q, k, v and attention output of one sequence's rows, for a batch
    /// of sequences that attend to caches of their own (`decoder::At::Rows`,
    /// `decoder::At::Chunks`).
    pub(crate) row: RowScratch<D>,
    /// Latent attention's projections.
    pub(crate) mla: Option<MlaScratch<D>>,
    /// Gated DeltaNet's projections and outputs.
    pub(crate) delta: Option<DeltaScratch<D>>,
    /// The shared expert's gate logit `[T]`.
    pub(crate) shared_gate: Option<D::Buf>,
}

/// Gated DeltaNet's intermediate rows: `T` of each for the batch, and `T`
/// more for one sequence's rows of a batch of sequences, each over its own
/// state (`decoder::At::Rows`, `decoder::At::Chunks`).
pub(crate) struct DeltaScratch<D: Device> {
    pub(crate) batch: DeltaRow<D>,
    /// `a · W_z` `[T, value_dim]`, then the gated output.
    pub(crate) z: D::Buf,
    pub(crate) row: DeltaRow<D>,
}

/// DeltaNet rows, `T` of each.
pub(crate) struct DeltaRow<D: Device> {
    /// `a · W_qkv` `[T, conv_dim]`
    pub(crate) mixed: D::Buf,
    /// The convolution's output `[T, conv_dim]`.
    pub(crate) conv: D::Buf,
    /// `a · W_alpha`, `a · W_beta` `[T, v_heads]`
    pub(crate) alpha: D::Buf,
    pub(crate) beta: D::Buf,
    /// The recurrence's output `[T, value_dim]`.
    pub(crate) core: D::Buf,
}

/// Latent attention's intermediate rows, `T` of each.
pub(crate) struct MlaScratch<D: Device> {
    /// `q_a · x` `[T, q_lora]`
    pub(crate) q_a: D::Buf,
    /// The query as the checkpoint projects it `[T, n_heads · (nope +
    /// rope)]`.
    pub(crate) q: D::Buf,
    /// The values `[T, n_heads · v]`.
    pub(crate) v: D::Buf,
    /// The latent `c` `[T, kv_lora]`.
    pub(crate) latent: D::Buf,
    /// The shared rope key `[T, rope]`.
    pub(crate) rope: D::Buf,
}

/// One sequence's q `[T, n_heads · head_dim]`, k and v `[T, n_kv_heads ·
/// head_dim]` and attention output `[T, n_heads · head_dim]`, its rows
/// copied out of the batch so that rope, cache write and attention see
/// them from row 0.
pub(crate) struct RowScratch<D: Device> {
    pub(crate) q: D::Buf,
    pub(crate) k: D::Buf,
    pub(crate) v: D::Buf,
    pub(crate) att: D::Buf,
}

fn max_over<'a>(layers: &'a [LayerSpec], f: impl Fn(&'a LayerSpec) -> usize) -> usize {
    layers.iter().map(f).max().unwrap_or(0)
}

impl<D: Device> Buffers<D> {
    pub(crate) fn new(device: &D, spec: &ArchSpec, t: usize) -> Result<Self, EngineError> {
        let alloc = |len| device.alloc(DType::F32, len);
        let h = spec.hidden_size;
        let qd = max_over(&spec.layers, |l| spec.num_heads * l.head_dim);
        let kvd = max_over(&spec.layers, |l| l.num_kv_heads * l.head_dim);
        let any_dense = spec.layers.iter().any(|l| l.ffn == FfnKind::Dense)
            || spec.moe.as_ref().is_some_and(|m| m.parallel_dense);
        let inter = [
            if any_dense { spec.intermediate_size } else { 0 },
            spec.moe
                .as_ref()
                .and_then(|m| m.shared_intermediate)
                .unwrap_or(0),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let moe = spec
            .moe
            .as_ref()
            .map(|m| {
                Ok::<_, EngineError>(MoeScratch {
                    x: alloc(t * h)?,
                    gate: alloc(t * m.expert_intermediate)?,
                    up: alloc(t * m.expert_intermediate)?,
                    y: alloc(t * m.top_k * h)?,
                })
            })
            .transpose()?;
        Ok(Buffers {
            h: alloc(t * h)?,
            a: alloc(t * h)?,
            q: alloc(t * qd)?,
            k: alloc(t * kvd)?,
            v: alloc(t * kvd)?,
            att: alloc(t * qd)?,
            gate: (spec.attention.output_gate || spec.attention.gate_in_q)
                .then(|| alloc(t * qd))
                .transpose()?,
            o: alloc(t * h)?,
            mlp_gate: alloc(t * inter)?,
            mlp_up: alloc(t * inter)?,
            branch: alloc(t * h)?,
            router: spec
                .moe
                .as_ref()
                .map(|m| alloc(t * m.num_experts))
                .transpose()?,
            routes: spec
                .moe
                .as_ref()
                .map(|m| device.alloc_routes(t, m.top_k))
                .transpose()?,
            moe_in: spec.moe.as_ref().map(|_| alloc(t * h)).transpose()?,
            moe,
            logits: alloc(t * spec.vocab_size)?,
            row: RowScratch {
                q: alloc(t * qd)?,
                k: alloc(t * kvd)?,
                v: alloc(t * kvd)?,
                att: alloc(t * qd)?,
            },
            mla: spec
                .mla
                .as_ref()
                .map(|a| {
                    Ok::<_, EngineError>(MlaScratch {
                        q_a: alloc(t * a.q_lora_rank.unwrap_or(0))?,
                        q: alloc(t * spec.num_heads * a.qk_head_dim())?,
                        v: alloc(t * spec.num_heads * a.v_head_dim)?,
                        latent: alloc(t * a.kv_lora_rank)?,
                        rope: alloc(t * a.qk_rope_head_dim)?,
                    })
                })
                .transpose()?,
            delta: spec
                .delta_net
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
                    Ok::<_, EngineError>(DeltaScratch {
                        batch: rows(t)?,
                        z: alloc(t * d.value_dim())?,
                        row: rows(t)?,
                    })
                })
                .transpose()?,
            shared_gate: spec
                .moe
                .as_ref()
                .filter(|m| m.shared_gate)
                .map(|_| alloc(t))
                .transpose()?,
        })
    }
}
