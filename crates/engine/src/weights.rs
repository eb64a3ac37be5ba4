//! A model's weights on a backend, one field per checkpoint tensor
//! (canonical install names: `blk.{L}.attn_q.weight` is
//! [`LayerWeights::attn_q`]). Which tensors exist, their names and shapes
//! come from the one tensor table, [`turbospark_format::roles::TENSORS`],
//! that `convert` and the install reader check against; this module only
//! says which field each [`Role`] fills. Shapes are checked here too, so a
//! weight source other than a validated install cannot slip a wrong shape
//! in.

use crate::source::WeightSource;
use crate::EngineError;
use std::collections::HashMap;
use turbospark_backend::{Device, ExpertTensors, ExpertWeights, HostTensor, SharedBytes};
use turbospark_core::arch::{ArchSpec, FfnKind, KvBLayout, Mixer, MlaSpec};
use turbospark_format::roles::{present, Placement, Role};

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

/// Latent attention of one layer ([`MlaSpec`]), beside
/// [`LayerWeights::attn_q`] and [`LayerWeights::attn_output`]. Every
/// matrix keeps the checkpoint's format: nothing is folded into another
/// matrix at load (the absorbed products of DeepSeek-V3 in f32 would be
/// about 150 GB).
pub struct MlaWeights<D: Device> {
    /// `attn_q_a` `[q_lora, hidden]` and `attn_q_a_norm` `[q_lora]`, when
    /// the query is low-rank.
    pub q_a: Option<(D::Matrix, D::Vector)>,
    /// The latent rows of `attn_kv_a_mqa` `[kv_lora, hidden]`.
    pub kv_a_latent: D::Matrix,
    /// The shared rope-key rows of `attn_kv_a_mqa` `[rope, hidden]`.
    pub kv_a_rope: D::Matrix,
    /// `attn_kv_a_norm` `[kv_lora]`.
    pub kv_a_norm: D::Vector,
    /// The key/value up-projection, applied per head
    /// ([`turbospark_backend::Stream::head_matmul`]).
    pub kv_b: KvB<D>,
}

/// Latent attention's key/value up-projection, as the checkpoint stores it
/// (`turbospark_core::arch::KvBLayout`).
pub enum KvB<D: Device> {
    /// `attn_kv_b` `[n_heads · (nope + v), kv_lora]`: per head, `W_uk[h]`
    /// `[nope, kv_lora]` over `W_uv[h]` `[v, kv_lora]`.
    Fused(D::Matrix),
    /// `attn_k_b` `[n_heads · kv_lora, nope]` (each `W_uk[h]ᵀ`) and
    /// `attn_v_b` `[n_heads · v, kv_lora]` (each `W_uv[h]`).
    Split { k_b: D::Matrix, v_b: D::Matrix },
}

/// A gated DeltaNet layer (`turbospark_core::arch::DeltaNetSpec`).
pub struct DeltaNetWeights<D: Device> {
    /// `attn_qkv` `[2 · key_dim + value_dim, hidden]`
    pub qkv: D::Matrix,
    /// `attn_gate` (HF `in_proj_z`) `[value_dim, hidden]`
    pub z: D::Matrix,
    /// `ssm_beta` `[v_heads, hidden]`
    pub beta: D::Matrix,
    /// `ssm_alpha` `[v_heads, hidden]`
    pub alpha: D::Matrix,
    /// `ssm_conv1d` `[conv_dim · kernel]` (channel-major).
    pub conv: D::Vector,
    /// `ssm_dt.bias` `[v_heads]`
    pub dt_bias: D::Vector,
    /// `ssm_a_log` `[v_heads]`
    pub a_log: D::Vector,
    /// `ssm_norm` `[v_head_dim]`, a plain weight.
    pub norm: D::Vector,
    /// `ssm_out` `[hidden, value_dim]`
    pub out: D::Matrix,
}

/// One decoder layer.
pub struct LayerWeights<D: Device> {
    pub attn_norm: Option<D::Vector>,
    /// `[n_heads · head_dim, hidden]`; with latent attention `attn_q_b` (or
    /// `attn_q`) `[n_heads · (nope + rope), q_lora or hidden]`; `None` on
    /// DeltaNet layers.
    pub attn_q: Option<D::Matrix>,
    /// `[n_kv_heads · head_dim, hidden]`; `None` with latent attention.
    pub attn_k: Option<D::Matrix>,
    /// `None` on layers whose values are the key projection
    /// ([`LayerSpec::value_from_key`]).
    pub attn_v: Option<D::Matrix>,
    /// `[hidden, n_heads · head_dim]`; with latent attention `[hidden,
    /// n_heads · v]`; `None` on DeltaNet layers.
    pub attn_output: Option<D::Matrix>,
    /// Gated DeltaNet, on the layers whose mixer it is.
    pub delta: Option<DeltaNetWeights<D>>,
    /// Latent attention (DeepSeek-V3).
    pub mla: Option<MlaWeights<D>>,
    pub attn_q_bias: Option<D::Vector>,
    pub attn_k_bias: Option<D::Vector>,
    pub attn_v_bias: Option<D::Vector>,
    pub attn_output_bias: Option<D::Vector>,
    /// Per-head norms `[head_dim]`.
    pub attn_q_norm: Option<D::Vector>,
    pub attn_k_norm: Option<D::Vector>,
    pub attn_v_norm: Option<D::Vector>,
    /// Output gate `[n_heads · head_dim, hidden]` (Muse Glimmer; Qwen3.5's
    /// rows of `attn_q`, see [`split_q_gate`]).
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

/// The tensors of one place (the globals, or one layer) that the table
/// lists for the spec: name and shape by role.
struct Listed {
    by_role: HashMap<Role, (String, Vec<usize>)>,
}

impl Listed {
    fn of(spec: &ArchSpec, placement: Placement, layer: usize) -> Self {
        let by_role = present(spec, placement, layer)
            .into_iter()
            .map(|p| {
                let shape = p.shape.iter().map(|&d| d as usize).collect();
                (p.role, (p.name, shape))
            })
            .collect();
        Listed { by_role }
    }

    fn get(&self, role: Role) -> Option<(&str, &[usize])> {
        self.by_role
            .get(&role)
            .map(|(n, s)| (n.as_str(), s.as_slice()))
    }

    /// A role the decoder needs whenever the table lists the place at all.
    fn required(&self, role: Role) -> Result<(&str, &[usize]), EngineError> {
        self.get(role).ok_or(EngineError::NotImplemented {
            feature: "a spec whose tensor table lacks a required tensor",
        })
    }
}

impl<D: Device> Loader<'_, D> {
    fn upload_matrix(&self, name: &str, shape: &[usize]) -> Result<D::Matrix, EngineError> {
        let t = self.src.resident(name)?;
        check_shape(&t, shape)?;
        let m = self.be.upload_matrix(&t)?;
        if self.be.copies_weights() {
            // Keeps loading's peak memory near the copy's size.
            self.src.release_resident(name);
        }
        Ok(m)
    }

    fn upload_vector(&self, name: &str, shape: &[usize]) -> Result<D::Vector, EngineError> {
        let t = self.src.resident(name)?;
        check_shape(&t, shape)?;
        Ok(self.be.upload_vector(&t)?)
    }

    fn matrix(&self, ts: &Listed, role: Role) -> Result<D::Matrix, EngineError> {
        let (name, shape) = ts.required(role)?;
        self.upload_matrix(name, shape)
    }

    fn opt_matrix(&self, ts: &Listed, role: Role) -> Result<Option<D::Matrix>, EngineError> {
        ts.get(role)
            .map(|(name, shape)| self.upload_matrix(name, shape))
            .transpose()
    }

    /// A 1-D tensor (bias, norm weight, scale), when the table lists it.
    fn vector(&self, ts: &Listed, role: Role) -> Result<Option<D::Vector>, EngineError> {
        ts.get(role)
            .map(|(name, shape)| self.upload_vector(name, shape))
            .transpose()
    }

    /// A 1-D tensor read to the host as f32 (values the host-side code,
    /// not the backend, uses), when the table lists it.
    fn host_vector(&self, ts: &Listed, role: Role) -> Result<Option<Vec<f32>>, EngineError> {
        let Some((name, shape)) = ts.get(role) else {
            return Ok(None);
        };
        let t = self.src.resident(name)?;
        check_shape(&t, shape)?;
        let mut v = vec![0f32; shape.iter().product()];
        turbospark_core::quant::dequantize_row(t.format, t.bytes.as_slice(), &mut v).map_err(
            |source| turbospark_backend::BackendError::Quant {
                name: t.name.clone(),
                source,
            },
        )?;
        Ok(Some(v))
    }

    /// Rows `rows` of the matrix `role`, in its own format, as a matrix
    /// named `name` (the bytes are shared, not copied).
    fn row_block(
        &self,
        ts: &Listed,
        role: Role,
        name: String,
        rows: std::ops::Range<usize>,
    ) -> Result<D::Matrix, EngineError> {
        let (src_name, shape) = ts.required(role)?;
        let t = self.src.resident(src_name)?;
        check_shape(&t, shape)?;
        Ok(self.be.upload_matrix(&t.row_block(name, rows)?)?)
    }

    /// Latent attention of layer `l` ([`MlaWeights`]), and its query and
    /// output matrices.
    #[allow(clippy::type_complexity)]
    fn mla(
        &self,
        a: &MlaSpec,
        l: usize,
        ts: &Listed,
    ) -> Result<(D::Matrix, D::Matrix, MlaWeights<D>), EngineError> {
        let (r, dr) = (a.kv_lora_rank, a.qk_rope_head_dim);
        let (q, q_a) = match a.q_lora_rank {
            Some(_) => {
                let q_a = self.matrix(ts, Role::AttnQA)?;
                let norm =
                    self.vector(ts, Role::AttnQANorm)?
                        .ok_or(EngineError::NotImplemented {
                            feature: "a low-rank query without its norm",
                        })?;
                (self.matrix(ts, Role::AttnQB)?, Some((q_a, norm)))
            }
            None => (self.matrix(ts, Role::AttnQ)?, None),
        };
        let weights = MlaWeights {
            q_a,
            kv_a_latent: self.row_block(
                ts,
                Role::AttnKvAMqa,
                format!("blk.{l}.attn_kv_a_mqa.weight (latent rows)"),
                0..r,
            )?,
            kv_a_rope: self.row_block(
                ts,
                Role::AttnKvAMqa,
                format!("blk.{l}.attn_kv_a_mqa.weight (rope rows)"),
                r..r + dr,
            )?,
            kv_a_norm: self
                .vector(ts, Role::AttnKvANorm)?
                .ok_or(EngineError::NotImplemented {
                    feature: "latent attention without its kv_a norm",
                })?,
            kv_b: match a.kv_b {
                KvBLayout::Fused => KvB::Fused(self.matrix(ts, Role::AttnKvB)?),
                KvBLayout::Split => KvB::Split {
                    k_b: self.matrix(ts, Role::AttnKB)?,
                    v_b: self.matrix(ts, Role::AttnVB)?,
                },
            },
        };
        if self.be.copies_weights() {
            if let Ok((name, _)) = ts.required(Role::AttnKvAMqa) {
                self.src.release_resident(name);
            }
        }
        Ok((q, self.matrix(ts, Role::AttnOutput)?, weights))
    }

    /// A dense MLP (or shared expert) of the three roles, when the table
    /// lists it.
    fn dense(
        &self,
        ts: &Listed,
        [gate, up, down]: [Role; 3],
    ) -> Result<Option<DenseWeights<D>>, EngineError> {
        let Some((_, gate_shape)) = ts.get(gate) else {
            return Ok(None);
        };
        let intermediate = gate_shape[0];
        Ok(Some(DenseWeights {
            gate: self.matrix(ts, gate)?,
            up: self.matrix(ts, up)?,
            down: self.matrix(ts, down)?,
            intermediate,
        }))
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

    /// Every routed expert of layer `l` as one bank.
    fn bank(&self, spec: &ArchSpec, l: usize, ne: usize) -> Result<D::Bank, EngineError> {
        let parts = Listed::of(spec, Placement::RoutedExpert, l);
        let tensors = (0..ne)
            .map(|e| {
                let part = |role| {
                    parts
                        .get(role)
                        .map(|(name, shape)| self.expert_part(l, e, name, shape))
                        .transpose()
                };
                let required = |role| {
                    let (name, shape) = parts.required(role)?;
                    self.expert_part(l, e, name, shape)
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
        Ok(self.be.upload_bank(&tensors)?)
    }

    fn moe(&self, spec: &ArchSpec, l: usize, ts: &Listed) -> Result<MoeWeights<D>, EngineError> {
        let Some(m) = &spec.moe else {
            return Err(EngineError::NotImplemented {
                feature: "a MoE layer without a MoE spec",
            });
        };
        let experts = if self.experts {
            Some(self.bank(spec, l, m.num_experts)?)
        } else {
            None
        };
        Ok(MoeWeights {
            router: self.matrix(ts, Role::FfnGateInp)?,
            router_bias: self.vector(ts, Role::FfnGateInpBias)?,
            router_scale: self.vector(ts, Role::FfnGateInpScale)?,
            exp_probs_b: self.vector(ts, Role::ExpProbsB)?,
            expert_scale: self.vector(ts, Role::FfnGateInpExpertScale)?,
            experts,
            shared: self.dense(
                ts,
                [Role::FfnGateShexp, Role::FfnUpShexp, Role::FfnDownShexp],
            )?,
            shared_gate: self.opt_matrix(ts, Role::FfnGateInpShexp)?,
            parallel_dense: self.dense(ts, DENSE)?,
        })
    }

    /// A gated DeltaNet layer's weights.
    fn delta_net(&self, ts: &Listed) -> Result<DeltaNetWeights<D>, EngineError> {
        let required = |role| {
            self.vector(ts, role)?.ok_or(EngineError::NotImplemented {
                feature: "a DeltaNet layer whose tensor table lacks a vector",
            })
        };
        // The depthwise kernel `[channels, kernel]` as one vector.
        let (name, shape) = ts.required(Role::SsmConv1d)?;
        let mut conv = self.src.resident(name)?;
        check_shape(&conv, shape)?;
        conv.shape = vec![shape.iter().product()];
        Ok(DeltaNetWeights {
            qkv: self.matrix(ts, Role::AttnQkv)?,
            z: self.matrix(ts, Role::AttnGate)?,
            beta: self.matrix(ts, Role::SsmBeta)?,
            alpha: self.matrix(ts, Role::SsmAlpha)?,
            conv: self.be.upload_vector(&conv)?,
            dt_bias: required(Role::SsmDt)?,
            a_log: required(Role::SsmALog)?,
            norm: required(Role::SsmNorm)?,
            out: self.matrix(ts, Role::SsmOut)?,
        })
    }

    /// `attn_q` with the output gate's rows inside it, as two matrices.
    fn q_and_gate(
        &self,
        spec: &ArchSpec,
        l: usize,
        ts: &Listed,
    ) -> Result<(D::Matrix, D::Matrix), EngineError> {
        let (name, shape) = ts.required(Role::AttnQ)?;
        let t = self.src.resident(name)?;
        check_shape(&t, shape)?;
        let (q, gate) = split_q_gate(&t, spec.num_heads, spec.layers[l].head_dim)?;
        Ok((self.be.upload_matrix(&q)?, self.be.upload_matrix(&gate)?))
    }

    fn layer(&self, spec: &ArchSpec, l: usize) -> Result<LayerWeights<D>, EngineError> {
        let ts = Listed::of(spec, Placement::Layer, l);
        let delta_layer = spec.layers[l].mixer == Mixer::DeltaNet;
        let mut attn_gate = None;
        let (attn_q, attn_output, mla) = match &spec.mla {
            _ if delta_layer => (None, None, None),
            Some(a) => {
                let (q, o, w) = self.mla(a, l, &ts)?;
                (Some(q), Some(o), Some(w))
            }
            None if spec.attention.gate_in_q => {
                let (q, gate) = self.q_and_gate(spec, l, &ts)?;
                attn_gate = Some(gate);
                (Some(q), Some(self.matrix(&ts, Role::AttnOutput)?), None)
            }
            None => (
                Some(self.matrix(&ts, Role::AttnQ)?),
                Some(self.matrix(&ts, Role::AttnOutput)?),
                None,
            ),
        };
        let (delta, attn_gate) = if delta_layer {
            (Some(self.delta_net(&ts)?), None)
        } else {
            match attn_gate {
                Some(g) => (None, Some(g)),
                None => (None, self.opt_matrix(&ts, Role::AttnGate)?),
            }
        };
        Ok(LayerWeights {
            attn_norm: self.vector(&ts, Role::AttnNorm)?,
            attn_q,
            attn_k: self.opt_matrix(&ts, Role::AttnK)?,
            attn_v: self.opt_matrix(&ts, Role::AttnV)?,
            attn_output,
            delta,
            mla,
            attn_q_bias: self.vector(&ts, Role::AttnQBias)?,
            attn_k_bias: self.vector(&ts, Role::AttnKBias)?,
            attn_v_bias: self.vector(&ts, Role::AttnVBias)?,
            attn_output_bias: self.vector(&ts, Role::AttnOutputBias)?,
            attn_q_norm: self.vector(&ts, Role::AttnQNorm)?,
            attn_k_norm: self.vector(&ts, Role::AttnKNorm)?,
            attn_v_norm: self.vector(&ts, Role::AttnVNorm)?,
            attn_gate,
            attn_sinks: self.vector(&ts, Role::AttnSinks)?,
            post_attention_norm: self.vector(&ts, Role::PostAttentionNorm)?,
            ffn_norm: self.vector(&ts, Role::FfnNorm)?,
            post_ffw_norm: self.vector(&ts, Role::PostFfwNorm)?,
            post_ffw_norm_1: self.vector(&ts, Role::PostFfwNorm1)?,
            pre_ffw_norm_2: self.vector(&ts, Role::PreFfwNorm2)?,
            post_ffw_norm_2: self.vector(&ts, Role::PostFfwNorm2)?,
            layer_output_scale: self.host_vector(&ts, Role::LayerOutputScale)?.map(|v| v[0]),
            ffn: match spec.layers[l].ffn {
                FfnKind::Dense => FfnWeights::Dense(self.dense(&ts, DENSE)?.ok_or(
                    EngineError::NotImplemented {
                        feature: "a dense layer whose tensor table lacks the MLP",
                    },
                )?),
                FfnKind::Moe => FfnWeights::Moe(self.moe(spec, l, &ts)?),
            },
        })
    }
}

/// Splits a q projection whose rows hold, per head, `head_dim` query rows
/// then `head_dim` output-gate rows (HF Qwen3.5 `q_proj`, viewed as
/// `[heads, 2 · head_dim]` and chunked in halves) into the query `[heads ·
/// head_dim, in]` and the gate `[heads · head_dim, in]`. Rows are copied
/// as they are, in any format.
pub fn split_q_gate(
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
            .map(|l| ld.layer(spec, l))
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
