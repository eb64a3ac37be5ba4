//! The scratch activations of a session: every buffer one forward pass
//! writes, `T = max_batch` rows each, sized from the [`ArchSpec`] once when
//! the session is made (the largest layer sets each size), so the decoder
//! ([`crate::decoder`]) never allocates. Each token mixer's own scratch is
//! in its module ([`crate::mixers`]).

use crate::mixers::MixerScratch;
use crate::EngineError;
use turbospark_backend::{DType, Device, MoeScratch};
use turbospark_core::arch::{ArchSpec, FfnKind};

/// Scratch activations of a session, `T = max_batch` rows each.
pub(crate) struct Buffers<D: Device> {
    /// Residual stream `[T, hidden]`.
    pub(crate) h: D::Buf,
    /// Normed block input `[T, hidden]`.
    pub(crate) a: D::Buf,
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
    /// The token mixers' own scratch.
    pub(crate) mixer: MixerScratch<D>,
    /// The shared expert's gate logit `[T]`.
    pub(crate) shared_gate: Option<D::Buf>,
}

impl<D: Device> Buffers<D> {
    pub(crate) fn new(device: &D, spec: &ArchSpec, t: usize) -> Result<Self, EngineError> {
        let alloc = |len| device.alloc(DType::F32, len);
        let h = spec.hidden_size;
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
            mixer: MixerScratch::new(device, spec, t)?,
            shared_gate: spec
                .moe
                .as_ref()
                .filter(|m| m.shared_gate)
                .map(|_| alloc(t))
                .transpose()?,
        })
    }
}
