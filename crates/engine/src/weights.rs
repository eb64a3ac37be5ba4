//! A model's weights on a backend, one field per checkpoint tensor
//! (canonical install names: `blk.{L}.attn_q.weight` is
//! [`LayerWeights::attn_q`]). Which optional tensors exist follows the
//! [`ArchSpec`], exactly as `turbospark_format::roles::expected_resident`
//! lists them; shapes are checked against the spec here too, so a weight
//! source other than a validated install cannot slip a wrong shape in.

use crate::source::WeightSource;
use crate::EngineError;
use turbospark_backend::{Device, ExpertTensors, ExpertWeights, HostTensor};
use turbospark_core::arch::{ArchSpec, FfnKind, LayerSpec, NormSpec, RouterKind};

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
    /// `[n_heads · head_dim, hidden]`
    pub attn_q: D::Matrix,
    /// `[n_kv_heads · head_dim, hidden]`
    pub attn_k: D::Matrix,
    /// `None` on layers whose values are the key projection
    /// ([`LayerSpec::value_from_key`]).
    pub attn_v: Option<D::Matrix>,
    /// `[hidden, n_heads · head_dim]`
    pub attn_output: D::Matrix,
    pub attn_q_bias: Option<D::Vector>,
    pub attn_k_bias: Option<D::Vector>,
    pub attn_v_bias: Option<D::Vector>,
    pub attn_output_bias: Option<D::Vector>,
    /// Per-head norms `[head_dim]`.
    pub attn_q_norm: Option<D::Vector>,
    pub attn_k_norm: Option<D::Vector>,
    pub attn_v_norm: Option<D::Vector>,
    /// Output gate `[n_heads · head_dim, hidden]` (Muse Glimmer).
    pub attn_gate: Option<D::Matrix>,
    /// One sink logit per query head (gpt-oss).
    pub attn_sinks: Option<D::Vector>,
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

struct Loader<'a, D: Device> {
    src: &'a dyn WeightSource,
    be: &'a D,
    /// Load routed experts (not when they are streamed).
    experts: bool,
}

fn check_shape(t: &HostTensor, expected: &[usize]) -> Result<(), EngineError> {
    if t.shape != expected {
        return Err(EngineError::TensorShape {
            name: t.name.clone(),
            expected: expected.to_vec(),
            found: t.shape.clone(),
        });
    }
    Ok(())
}

impl<D: Device> Loader<'_, D> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<D::Matrix, EngineError> {
        let t = self.src.resident(name)?;
        check_shape(&t, &[rows, cols])?;
        let m = self.be.upload_matrix(&t)?;
        if self.be.copies_weights() {
            // Keeps loading's peak memory near the copy's size.
            self.src.release_resident(name);
        }
        Ok(m)
    }

    fn vector(&self, name: &str, len: usize) -> Result<D::Vector, EngineError> {
        let t = self.src.resident(name)?;
        check_shape(&t, &[len])?;
        Ok(self.be.upload_vector(&t)?)
    }

    /// A 1-D tensor read to the host as f32 (values the host-side code,
    /// not the backend, uses).
    fn host_vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        let t = self.src.resident(name)?;
        check_shape(&t, &[len])?;
        let mut v = vec![0f32; len];
        turbospark_core::quant::dequantize_row(t.format, t.bytes.as_slice(), &mut v).map_err(
            |source| turbospark_backend::BackendError::Quant {
                name: t.name.clone(),
                source,
            },
        )?;
        Ok(v)
    }

    fn opt_vector(
        &self,
        present: bool,
        name: &str,
        len: usize,
    ) -> Result<Option<D::Vector>, EngineError> {
        present.then(|| self.vector(name, len)).transpose()
    }

    /// The weight of a norm, if the norm exists and has one.
    fn norm(
        &self,
        norm: Option<NormSpec>,
        name: &str,
        len: usize,
    ) -> Result<Option<D::Vector>, EngineError> {
        self.opt_vector(norm.is_some_and(|n| n.has_weight()), name, len)
    }

    fn dense(
        &self,
        l: usize,
        suffix: &str,
        hidden: usize,
        inter: usize,
    ) -> Result<DenseWeights<D>, EngineError> {
        Ok(DenseWeights {
            gate: self.matrix(&format!("blk.{l}.ffn_gate{suffix}.weight"), inter, hidden)?,
            up: self.matrix(&format!("blk.{l}.ffn_up{suffix}.weight"), inter, hidden)?,
            down: self.matrix(&format!("blk.{l}.ffn_down{suffix}.weight"), hidden, inter)?,
            intermediate: inter,
        })
    }

    fn expert_part(
        &self,
        l: usize,
        e: usize,
        part: &str,
        shape: &[usize],
    ) -> Result<HostTensor, EngineError> {
        let t = self.src.expert_part(l, e, part)?;
        check_shape(&t, shape)?;
        Ok(t)
    }

    fn expert_bias(
        &self,
        present: bool,
        l: usize,
        e: usize,
        part: &str,
        len: usize,
    ) -> Result<Option<HostTensor>, EngineError> {
        present
            .then(|| self.expert_part(l, e, part, &[len]))
            .transpose()
    }

    fn moe(&self, spec: &ArchSpec, l: usize) -> Result<MoeWeights<D>, EngineError> {
        let h = spec.hidden_size;
        let Some(m) = &spec.moe else {
            return Err(EngineError::NotImplemented {
                feature: "a MoE layer without a MoE spec",
            });
        };
        let (ne, inter) = (m.num_experts, m.expert_intermediate);
        let b = |s: &str| format!("blk.{l}.{s}");
        let grouped = matches!(m.router, RouterKind::SigmoidGrouped { .. });
        let gemma4 = m.router == RouterKind::Gemma4;
        let experts = if self.experts {
            let tensors = (0..ne)
                .map(|e| {
                    Ok(ExpertWeights {
                        gate: self.expert_part(l, e, "gate", &[inter, h])?,
                        up: self.expert_part(l, e, "up", &[inter, h])?,
                        down: self.expert_part(l, e, "down", &[h, inter])?,
                        gate_bias: self.expert_bias(m.expert_biases, l, e, "gate.bias", inter)?,
                        up_bias: self.expert_bias(m.expert_biases, l, e, "up.bias", inter)?,
                        down_bias: self.expert_bias(m.expert_biases, l, e, "down.bias", h)?,
                    })
                })
                .collect::<Result<Vec<ExpertTensors>, EngineError>>()?;
            Some(self.be.upload_bank(&tensors)?)
        } else {
            None
        };
        Ok(MoeWeights {
            router: self.matrix(&b("ffn_gate_inp.weight"), ne, h)?,
            router_bias: self.opt_vector(m.router_bias, &b("ffn_gate_inp.bias"), ne)?,
            router_scale: self.opt_vector(gemma4, &b("ffn_gate_inp.scale"), h)?,
            exp_probs_b: self.opt_vector(grouped, &b("exp_probs_b.bias"), ne)?,
            expert_scale: self.opt_vector(gemma4, &b("ffn_gate_inp.expert_scale"), ne)?,
            experts,
            shared: m
                .shared_intermediate
                .map(|si| self.dense(l, "_shexp", h, si))
                .transpose()?,
            parallel_dense: m
                .parallel_dense
                .then(|| self.dense(l, "", h, spec.intermediate_size))
                .transpose()?,
        })
    }

    fn layer(
        &self,
        spec: &ArchSpec,
        l: usize,
        ls: &LayerSpec,
    ) -> Result<LayerWeights<D>, EngineError> {
        let h = spec.hidden_size;
        let (hd, q, kv) = (
            ls.head_dim,
            spec.num_heads * ls.head_dim,
            ls.num_kv_heads * ls.head_dim,
        );
        let a = &spec.attention;
        let n = &spec.norms;
        let b = |s: &str| format!("blk.{l}.{s}");
        Ok(LayerWeights {
            attn_norm: self.norm(Some(n.attn_input), &b("attn_norm.weight"), h)?,
            attn_q: self.matrix(&b("attn_q.weight"), q, h)?,
            attn_k: self.matrix(&b("attn_k.weight"), kv, h)?,
            attn_v: (!ls.value_from_key)
                .then(|| self.matrix(&b("attn_v.weight"), kv, h))
                .transpose()?,
            attn_output: self.matrix(&b("attn_output.weight"), h, q)?,
            attn_q_bias: self.opt_vector(a.q_bias, &b("attn_q.bias"), q)?,
            attn_k_bias: self.opt_vector(a.k_bias, &b("attn_k.bias"), kv)?,
            attn_v_bias: self.opt_vector(a.v_bias && !ls.value_from_key, &b("attn_v.bias"), kv)?,
            attn_output_bias: self.opt_vector(a.o_bias, &b("attn_output.bias"), h)?,
            attn_q_norm: self.norm(n.q, &b("attn_q_norm.weight"), hd)?,
            attn_k_norm: self.norm(n.k, &b("attn_k_norm.weight"), hd)?,
            attn_v_norm: self.norm(n.v, &b("attn_v_norm.weight"), hd)?,
            attn_gate: a
                .output_gate
                .then(|| self.matrix(&b("attn_gate.weight"), q, h))
                .transpose()?,
            attn_sinks: self.opt_vector(a.sinks, &b("attn_sinks.weight"), spec.num_heads)?,
            post_attention_norm: self.norm(n.attn_post, &b("post_attention_norm.weight"), h)?,
            ffn_norm: self.norm(Some(n.ffn_input), &b("ffn_norm.weight"), h)?,
            post_ffw_norm: self.norm(n.ffn_post, &b("post_ffw_norm.weight"), h)?,
            post_ffw_norm_1: self.norm(n.dense_branch_post, &b("post_ffw_norm_1.weight"), h)?,
            pre_ffw_norm_2: self.norm(n.moe_input, &b("pre_ffw_norm_2.weight"), h)?,
            post_ffw_norm_2: self.norm(n.moe_post, &b("post_ffw_norm_2.weight"), h)?,
            layer_output_scale: spec
                .layer_scalar
                .then(|| self.host_vector(&b("layer_output_scale.weight"), 1))
                .transpose()?
                .map(|v| v[0]),
            ffn: match ls.ffn {
                FfnKind::Dense => {
                    FfnWeights::Dense(self.dense(l, "", h, spec.intermediate_size)?)
                }
                FfnKind::Moe => FfnWeights::Moe(self.moe(spec, l)?),
            },
        })
    }
}

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
        let (v, h) = (spec.vocab_size, spec.hidden_size);
        let layers = spec
            .layers
            .iter()
            .enumerate()
            .map(|(l, ls)| ld.layer(spec, l, ls))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Weights {
            token_embd: ld.matrix("token_embd.weight", v, h)?,
            output_norm: ld.norm(Some(spec.norms.output), "output_norm.weight", h)?,
            output: (!spec.head.tied)
                .then(|| ld.matrix("output.weight", v, h))
                .transpose()?,
            layers,
        })
    }
}
