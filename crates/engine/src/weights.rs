//! A model's weights on a backend, one field per checkpoint tensor
//! (canonical install names: `blk.{L}.ffn_norm.weight` is
//! [`LayerWeights::ffn_norm`]); each token mixer's own weights (attention's
//! `attn_q`, DeltaNet's `ssm_out`, ...) are in its module of
//! `crate::mixers`. Which tensors exist, their names and shapes come
//! from the one tensor table, [`turbospark_format::roles::TENSORS`], that
//! `convert` and the install reader check against, through
//! `crate::loader`, which checks the shapes too; this module only says
//! which field each [`Role`] fills.

use crate::loader::{Listed, Loader};
use crate::mixers::MixerWeights;
use crate::source::WeightSource;
use crate::EngineError;
use turbospark_backend::{Device, ExpertTensors, ExpertWeights};
use turbospark_core::arch::{ArchSpec, FfnKind};
use turbospark_format::roles::{Placement, Role};

/// `ffn_gate` / `ffn_up` / `ffn_down` of a dense MLP (or shared expert).
pub struct DenseWeights<D: Device> {
    /// `[intermediate, hidden]`
    pub gate: D::Matrix,
    /// `[intermediate, hidden]`
    pub up: D::Matrix,
    /// `[hidden, intermediate]`
    pub down: D::Matrix,
    pub intermediate: usize,
}

/// A routed MoE block.
pub struct MoeWeights<D: Device> {
    /// `ffn_gate_inp.weight` `[experts, hidden]`
    pub router: D::Matrix,
    /// `ffn_gate_inp.bias` `[experts]` (gpt-oss)
    pub router_bias: Option<D::Vector>,
    /// `ffn_gate_inp.scale` `[hidden]`: weight of the router's input norm
    /// (Gemma 4).
    pub router_scale: Option<D::Vector>,
    /// `exp_probs_b.bias` `[experts]`: selection-only correction bias
    /// (GLM / DeepSeek), read by the routing op.
    pub exp_probs_b: Option<D::Vector>,
    /// `ffn_gate_inp.expert_scale` `[experts]`: multiplier on each chosen
    /// expert's weight (Gemma 4), read by the routing op.
    pub expert_scale: Option<D::Vector>,
    /// Every routed expert as one bank, slot = expert id; `None` when the
    /// experts are streamed into per-session slots instead (see
    /// `crate::experts`).
    pub experts: Option<D::Bank>,
    /// `ffn_{gate,up,down}_shexp`: the always-on shared expert.
    pub shared: Option<DenseWeights<D>>,
    /// `ffn_gate_inp_shexp` `[1, hidden]`: the shared expert's output is
    /// scaled by `sigmoid` of this row times the input (Qwen3.5).
    pub shared_gate: Option<D::Matrix>,
    /// The dense MLP that runs beside the experts (Gemma 4).
    pub parallel_dense: Option<DenseWeights<D>>,
}

pub enum FfnWeights<D: Device> {
    Dense(DenseWeights<D>),
    Moe(MoeWeights<D>),
}

/// One decoder layer.
pub struct LayerWeights<D: Device> {
    pub attn_norm: Option<D::Vector>,
    /// The token mixer: attention, latent attention or a DeltaNet
    /// recurrence, each with its own weights (`crate::mixers`).
    pub(crate) mixer: MixerWeights<D>,
    pub post_attention_norm: Option<D::Vector>,
    pub ffn_norm: Option<D::Vector>,
    pub post_ffw_norm: Option<D::Vector>,
    /// Norms of a parallel dense + MoE block (Gemma 4): on the dense
    /// branch's output, on the experts' input, on the experts' output.
    pub post_ffw_norm_1: Option<D::Vector>,
    pub pre_ffw_norm_2: Option<D::Vector>,
    pub post_ffw_norm_2: Option<D::Vector>,
    /// `layer_output_scale.weight` `[1]`: multiplier on the residual stream
    /// after the layer (Gemma 4).
    pub layer_output_scale: Option<f32>,
    pub ffn: FfnWeights<D>,
}

/// All weights of a model.
pub struct Weights<D: Device> {
    /// `[vocab, hidden]`
    pub token_embd: D::Matrix,
    pub output_norm: Option<D::Vector>,
    /// `[vocab, hidden]`; `None` when the head is tied to `token_embd`.
    pub output: Option<D::Matrix>,
    pub layers: Vec<LayerWeights<D>>,
}

/// A dense MLP (or shared expert) of the three roles, when the table
/// lists it.
fn dense<D: Device>(
    ld: &Loader<'_, D>,
    ts: &Listed,
    [gate, up, down]: [Role; 3],
) -> Result<Option<DenseWeights<D>>, EngineError> {
    let Some((_, gate_shape)) = ts.get(gate) else {
        return Ok(None);
    };
    let intermediate = gate_shape[0];
    Ok(Some(DenseWeights {
        gate: ld.matrix(ts, gate)?,
        up: ld.matrix(ts, up)?,
        down: ld.matrix(ts, down)?,
        intermediate,
    }))
}

/// Every routed expert of layer `l` as one bank.
fn bank<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ArchSpec,
    l: usize,
    ne: usize,
) -> Result<D::Bank, EngineError> {
    let parts = Listed::of(spec, Placement::RoutedExpert, l);
    let tensors = (0..ne)
        .map(|e| {
            let part = |role| {
                parts
                    .get(role)
                    .map(|(name, shape)| ld.expert_part(l, e, name, shape))
                    .transpose()
            };
            let required = |role| {
                let (name, shape) = parts.required(role)?;
                ld.expert_part(l, e, name, shape)
            };
            Ok(ExpertWeights {
                gate: required(Role::ExpertGate)?,
                up: required(Role::ExpertUp)?,
                down: required(Role::ExpertDown)?,
                gate_bias: part(Role::ExpertGateBias)?,
                up_bias: part(Role::ExpertUpBias)?,
                down_bias: part(Role::ExpertDownBias)?,
            })
        })
        .collect::<Result<Vec<ExpertTensors>, EngineError>>()?;
    Ok(ld.be.upload_bank(&tensors)?)
}

fn moe<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ArchSpec,
    l: usize,
    ts: &Listed,
) -> Result<MoeWeights<D>, EngineError> {
    let Some(m) = &spec.moe else {
        return Err(EngineError::NotImplemented {
            feature: "a MoE layer without a MoE spec",
        });
    };
    let experts = if ld.experts {
        Some(bank(ld, spec, l, m.num_experts)?)
    } else {
        None
    };
    Ok(MoeWeights {
        router: ld.matrix(ts, Role::FfnGateInp)?,
        router_bias: ld.vector(ts, Role::FfnGateInpBias)?,
        router_scale: ld.vector(ts, Role::FfnGateInpScale)?,
        exp_probs_b: ld.vector(ts, Role::ExpProbsB)?,
        expert_scale: ld.vector(ts, Role::FfnGateInpExpertScale)?,
        experts,
        shared: dense(
            ld,
            ts,
            [Role::FfnGateShexp, Role::FfnUpShexp, Role::FfnDownShexp],
        )?,
        shared_gate: ld.opt_matrix(ts, Role::FfnGateInpShexp)?,
        parallel_dense: dense(ld, ts, DENSE)?,
    })
}

fn layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ArchSpec,
    l: usize,
) -> Result<LayerWeights<D>, EngineError> {
    let ts = Listed::of(spec, Placement::Layer, l);
    Ok(LayerWeights {
        attn_norm: ld.vector(&ts, Role::AttnNorm)?,
        mixer: MixerWeights::load(ld, spec, l, &ts)?,
        post_attention_norm: ld.vector(&ts, Role::PostAttentionNorm)?,
        ffn_norm: ld.vector(&ts, Role::FfnNorm)?,
        post_ffw_norm: ld.vector(&ts, Role::PostFfwNorm)?,
        post_ffw_norm_1: ld.vector(&ts, Role::PostFfwNorm1)?,
        pre_ffw_norm_2: ld.vector(&ts, Role::PreFfwNorm2)?,
        post_ffw_norm_2: ld.vector(&ts, Role::PostFfwNorm2)?,
        layer_output_scale: ld.host_vector(&ts, Role::LayerOutputScale)?.map(|v| v[0]),
        ffn: match spec.layers[l].ffn {
            FfnKind::Dense => {
                FfnWeights::Dense(dense(ld, &ts, DENSE)?.ok_or(EngineError::NotImplemented {
                    feature: "a dense layer whose tensor table lacks the MLP",
                })?)
            }
            FfnKind::Moe => FfnWeights::Moe(moe(ld, spec, l, &ts)?),
        },
    })
}

/// The roles of the dense MLP.
const DENSE: [Role; 3] = [Role::FfnGate, Role::FfnUp, Role::FfnDown];

impl<D: Device> Weights<D> {
    /// Uploads every weight `spec` needs from `src`.
    pub fn load(spec: &ArchSpec, src: &dyn WeightSource, be: &D) -> Result<Self, EngineError> {
        Self::load_with(spec, src, be, true)
    }

    /// Uploads every weight `spec` needs from `src`, the routed experts only
    /// when `experts` is set.
    pub fn load_with(
        spec: &ArchSpec,
        src: &dyn WeightSource,
        be: &D,
        experts: bool,
    ) -> Result<Self, EngineError> {
        let ld = Loader { src, be, experts };
        let layers = (0..spec.layers.len())
            .map(|l| layer(&ld, spec, l))
            .collect::<Result<Vec<_>, _>>()?;
        let globals = Listed::of(spec, Placement::Global, 0);
        Ok(Weights {
            token_embd: ld.matrix(&globals, Role::TokenEmbd)?,
            output_norm: ld.vector(&globals, Role::OutputNorm)?,
            output: ld.opt_matrix(&globals, Role::Output)?,
            layers,
        })
    }
}
