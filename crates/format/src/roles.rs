//! Tensor roles: the one table of every tensor an install holds — its
//! canonical name, its expected shape (derived from the [`ArchSpec`]) and
//! its placement (resident, or a part of every routed expert of a layer).
//!
//! [`TENSORS`] is read by `convert`'s shape check, the install reader, the
//! synthetic model builders and the engine's weight loader
//! (`turbospark_engine::weights`), so a tensor is listed once.
//!
//! Canonical names follow llama.cpp's GGUF naming (`blk.{L}.attn_q.weight`),
//! so GGUF sources map onto them unchanged (but for a family's renames,
//! [`crate::families`]); HF names are mapped in [`crate::convert::hf_names`].
//! Routed experts are not resident tensors: they are the parts `gate`, `up`,
//! `down` (+ `.bias`) of a layer's expert file, each with a per-expert shape.

use turbospark_core::arch::{
    ArchSpec, DeltaNetSpec, FfnKind, KvBLayout, LayerSpec, Mixer, MlaSpec, MoeSpec, NormSpec,
    RouterKind,
};

/// A resident tensor the install must contain.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedTensor {
    pub name: String,
    /// Row-major shape, outermost first.
    pub shape: Vec<u64>,
}

/// A part of every routed expert of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedPart {
    pub layer: usize,
    pub part: &'static str,
    /// Shape of one expert's part.
    pub shape: Vec<u64>,
}

/// Role name of a canonical tensor name (`blk.3.attn_q.weight` → `attn_q`,
/// `blk.3.attn_q.bias` → `attn_q.bias`), used to group quant formats.
pub fn role_of(name: &str) -> String {
    let rest = match name.strip_prefix("blk.") {
        Some(r) => r.split_once('.').map(|(_, r)| r).unwrap_or(r),
        None => name,
    };
    rest.strip_suffix(".weight").unwrap_or(rest).to_string()
}

/// What a tensor does; the engine's loader fills each weight field from
/// the tensor of its role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    TokenEmbd,
    OutputNorm,
    Output,
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    AttnQBias,
    AttnKBias,
    AttnVBias,
    AttnOutputBias,
    AttnQNorm,
    AttnKNorm,
    AttnVNorm,
    /// The attention output gate `[n_heads · head_dim, hidden]` (Muse
    /// Glimmer); on gated DeltaNet layers the output gate `z` `[value_dim,
    /// hidden]` (llama.cpp files both as `attn_gate`).
    AttnGate,
    AttnSinks,
    /// Gated DeltaNet (Qwen3.5): the mixed `[q, k, v]` projection
    /// `[conv_dim, hidden]`, its depthwise convolution `[conv_dim, kernel]`,
    /// `dt_bias` and `A_log` `[v_heads]` (llama.cpp's `ssm_a` holds
    /// `−exp(A_log)` instead), the β and decay-rate projections `[v_heads,
    /// hidden]`, the output norm `[v_head_dim]` and the output projection
    /// `[hidden, value_dim]`.
    AttnQkv,
    SsmConv1d,
    SsmDt,
    SsmALog,
    SsmBeta,
    SsmAlpha,
    SsmNorm,
    SsmOut,
    /// Latent attention (DeepSeek-V3): low-rank query `[q_lora, hidden]`,
    /// its norm, and its up-projection `[heads · (nope + rope), q_lora]`.
    AttnQA,
    AttnQANorm,
    AttnQB,
    /// Latent attention: `[kv_lora + rope, hidden]` (latent, then the shared
    /// rope key), the latent's norm, and the per-head key/value
    /// up-projection `[heads · (nope + v), kv_lora]` (HF's layout,
    /// [`KvBLayout::Fused`]), or llama.cpp's split of it
    /// ([`KvBLayout::Split`]): `attn_k_b` `[heads · kv_lora, nope]` (each
    /// head's key block transposed) and `attn_v_b` `[heads · v, kv_lora]`.
    AttnKvAMqa,
    AttnKvANorm,
    AttnKvB,
    AttnKB,
    AttnVB,
    PostAttentionNorm,
    FfnNorm,
    PostFfwNorm,
    /// Router `[experts, hidden]`.
    FfnGateInp,
    FfnGateInpBias,
    /// Selection-only correction bias (sigmoid-grouped routers).
    ExpProbsB,
    /// Weight of the router's input norm (Gemma 4).
    FfnGateInpScale,
    /// Multiplier on each chosen expert's weight (Gemma 4).
    FfnGateInpExpertScale,
    /// The shared expert's gate row `[1, hidden]`.
    FfnGateInpShexp,
    FfnGateShexp,
    FfnUpShexp,
    FfnDownShexp,
    /// The dense MLP (also the one beside the experts, Gemma 4).
    FfnGate,
    FfnUp,
    FfnDown,
    PostFfwNorm1,
    PreFfwNorm2,
    PostFfwNorm2,
    LayerOutputScale,
    ExpertGate,
    ExpertUp,
    ExpertDown,
    ExpertGateBias,
    ExpertUpBias,
    ExpertDownBias,
}

/// Where a tensor lives and how its name is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// A resident tensor outside the layers, named as is.
    Global,
    /// A resident tensor of each layer, named `blk.{L}.` + name.
    Layer,
    /// A part of every routed expert of a MoE layer, named by the part.
    RoutedExpert,
}

/// Where a row of [`TENSORS`] is evaluated: the spec, and the layer for
/// layer and expert rows.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    pub spec: &'a ArchSpec,
    pub layer: Option<&'a LayerSpec>,
}

impl At<'_> {
    fn h(&self) -> u64 {
        self.spec.hidden_size as u64
    }
    fn ls(&self) -> &LayerSpec {
        self.layer.expect("layer rows are evaluated with a layer")
    }
    /// `n_heads · head_dim` of the layer.
    fn q(&self) -> u64 {
        (self.spec.num_heads * self.ls().head_dim) as u64
    }
    /// `n_kv_heads · head_dim` of the layer.
    fn kv(&self) -> u64 {
        let l = self.ls();
        (l.num_kv_heads * l.head_dim) as u64
    }
    fn head_dim(&self) -> u64 {
        self.ls().head_dim as u64
    }
    /// The MoE spec, on MoE layers only.
    fn moe(&self) -> Option<&MoeSpec> {
        match self.ls().ffn {
            FfnKind::Moe => self.spec.moe.as_ref(),
            FfnKind::Dense => None,
        }
    }
    fn has_v(&self) -> bool {
        !self.ls().value_from_key
    }
    /// The latent-attention spec, when the model uses it.
    fn mla(&self) -> Option<&MlaSpec> {
        self.spec.mla.as_ref()
    }
    /// Plain (not latent) attention: the q/k/v projections exist.
    fn qkv(&self) -> bool {
        self.spec.mla.is_none() && self.attention()
    }
    /// The layer mixes tokens by attention (not a DeltaNet recurrence).
    fn attention(&self) -> bool {
        self.ls().mixer == Mixer::Attention
    }
    /// The DeltaNet spec, on DeltaNet layers only.
    fn delta(&self) -> Option<&DeltaNetSpec> {
        match self.ls().mixer {
            Mixer::DeltaNet => self.spec.delta_net.as_ref(),
            Mixer::Attention => None,
        }
    }
    fn nh(&self) -> u64 {
        self.spec.num_heads as u64
    }
    /// `[len]` when the norm exists and carries a weight.
    fn norm(&self, norm: Option<NormSpec>, len: u64) -> Option<Vec<u64>> {
        norm.is_some_and(|n| n.has_weight()).then(|| vec![len])
    }
    fn when(&self, on: bool, shape: Vec<u64>) -> Option<Vec<u64>> {
        on.then_some(shape)
    }
    /// The dense MLP's width: on dense layers, and beside the experts of
    /// a parallel dense + MoE block.
    fn dense_inter(&self) -> Option<u64> {
        match self.moe() {
            None => Some(self.spec.intermediate_size as u64),
            Some(m) => m
                .parallel_dense
                .then_some(self.spec.intermediate_size as u64),
        }
    }
    fn shared_inter(&self) -> Option<u64> {
        self.moe()?.shared_intermediate.map(|s| s as u64)
    }
    fn expert_inter(&self) -> Option<u64> {
        self.moe().map(|m| m.expert_intermediate as u64)
    }
    fn expert_bias(&self, len: impl Fn(&MoeSpec) -> u64) -> Option<Vec<u64>> {
        let m = self.moe()?;
        m.expert_biases.then(|| vec![len(m)])
    }
}

/// One row of the tensor table.
#[derive(Clone, Copy)]
pub struct TensorDef {
    pub role: Role,
    /// Canonical name (a layer tensor's after `blk.{L}.`; an expert part's
    /// part name).
    pub name: &'static str,
    pub placement: Placement,
    /// Row-major shape (outermost first) at `At`; `None` where the spec has
    /// no such tensor.
    pub shape: fn(&At) -> Option<Vec<u64>>,
}

const fn row(
    role: Role,
    name: &'static str,
    placement: Placement,
    shape: fn(&At) -> Option<Vec<u64>>,
) -> TensorDef {
    TensorDef {
        role,
        name,
        placement,
        shape,
    }
}

use Placement::{Global, Layer, RoutedExpert};

/// Every tensor of every family, in install order: globals before the
/// layers (`token_embd`) and after them (`output_norm`, `output`), each
/// layer's tensors in the order below, then the routed-expert parts.
pub const TENSORS: &[TensorDef] = &[
    row(Role::TokenEmbd, "token_embd.weight", Global, |a| {
        Some(vec![a.spec.vocab_size as u64, a.h()])
    }),
    row(Role::AttnNorm, "attn_norm.weight", Layer, |a| {
        a.norm(Some(a.spec.norms.attn_input), a.h())
    }),
    row(Role::AttnQ, "attn_q.weight", Layer, |a| match a.mla() {
        None if !a.attention() => None,
        None if a.spec.attention.gate_in_q => Some(vec![2 * a.q(), a.h()]),
        None => Some(vec![a.q(), a.h()]),
        Some(m) => m
            .q_lora_rank
            .is_none()
            .then(|| vec![a.nh() * m.qk_head_dim() as u64, a.h()]),
    }),
    row(Role::AttnK, "attn_k.weight", Layer, |a| {
        a.when(a.qkv(), vec![a.kv(), a.h()])
    }),
    row(Role::AttnV, "attn_v.weight", Layer, |a| {
        a.when(a.qkv() && a.has_v(), vec![a.kv(), a.h()])
    }),
    row(Role::AttnQA, "attn_q_a.weight", Layer, |a| {
        let r = a.mla()?.q_lora_rank?;
        Some(vec![r as u64, a.h()])
    }),
    row(Role::AttnQANorm, "attn_q_a_norm.weight", Layer, |a| {
        let r = a.mla()?.q_lora_rank?;
        Some(vec![r as u64])
    }),
    row(Role::AttnQB, "attn_q_b.weight", Layer, |a| {
        let m = a.mla()?;
        let r = m.q_lora_rank?;
        Some(vec![a.nh() * m.qk_head_dim() as u64, r as u64])
    }),
    row(Role::AttnKvAMqa, "attn_kv_a_mqa.weight", Layer, |a| {
        let m = a.mla()?;
        Some(vec![(m.kv_lora_rank + m.qk_rope_head_dim) as u64, a.h()])
    }),
    row(Role::AttnKvANorm, "attn_kv_a_norm.weight", Layer, |a| {
        Some(vec![a.mla()?.kv_lora_rank as u64])
    }),
    row(Role::AttnKvB, "attn_kv_b.weight", Layer, |a| {
        let m = a.mla().filter(|m| m.kv_b == KvBLayout::Fused)?;
        let per_head = (m.qk_nope_head_dim + m.v_head_dim) as u64;
        Some(vec![a.nh() * per_head, m.kv_lora_rank as u64])
    }),
    row(Role::AttnKB, "attn_k_b.weight", Layer, |a| {
        let m = a.mla().filter(|m| m.kv_b == KvBLayout::Split)?;
        Some(vec![
            a.nh() * m.kv_lora_rank as u64,
            m.qk_nope_head_dim as u64,
        ])
    }),
    row(Role::AttnVB, "attn_v_b.weight", Layer, |a| {
        let m = a.mla().filter(|m| m.kv_b == KvBLayout::Split)?;
        Some(vec![a.nh() * m.v_head_dim as u64, m.kv_lora_rank as u64])
    }),
    row(Role::AttnOutput, "attn_output.weight", Layer, |a| {
        match a.mla() {
            None if !a.attention() => None,
            None => Some(vec![a.h(), a.q()]),
            Some(m) => Some(vec![a.h(), a.nh() * m.v_head_dim as u64]),
        }
    }),
    row(Role::AttnQBias, "attn_q.bias", Layer, |a| {
        a.when(a.attention() && a.spec.attention.q_bias, vec![a.q()])
    }),
    row(Role::AttnKBias, "attn_k.bias", Layer, |a| {
        a.when(a.attention() && a.spec.attention.k_bias, vec![a.kv()])
    }),
    row(Role::AttnVBias, "attn_v.bias", Layer, |a| {
        a.when(
            a.attention() && a.spec.attention.v_bias && a.has_v(),
            vec![a.kv()],
        )
    }),
    row(Role::AttnOutputBias, "attn_output.bias", Layer, |a| {
        a.when(a.attention() && a.spec.attention.o_bias, vec![a.h()])
    }),
    row(Role::AttnQNorm, "attn_q_norm.weight", Layer, |a| {
        a.norm(a.spec.norms.q.filter(|_| a.attention()), a.head_dim())
    }),
    row(Role::AttnKNorm, "attn_k_norm.weight", Layer, |a| {
        a.norm(a.spec.norms.k.filter(|_| a.attention()), a.head_dim())
    }),
    row(Role::AttnVNorm, "attn_v_norm.weight", Layer, |a| {
        a.norm(a.spec.norms.v.filter(|_| a.attention()), a.head_dim())
    }),
    row(Role::AttnGate, "attn_gate.weight", Layer, |a| {
        match a.delta() {
            Some(d) => Some(vec![d.value_dim() as u64, a.h()]),
            None => a.when(
                a.attention() && a.spec.attention.output_gate,
                vec![a.q(), a.h()],
            ),
        }
    }),
    row(Role::AttnSinks, "attn_sinks.weight", Layer, |a| {
        a.when(
            a.attention() && a.spec.attention.sinks,
            vec![a.spec.num_heads as u64],
        )
    }),
    row(Role::AttnQkv, "attn_qkv.weight", Layer, |a| {
        a.delta().map(|d| vec![d.conv_dim() as u64, a.h()])
    }),
    row(Role::SsmConv1d, "ssm_conv1d.weight", Layer, |a| {
        a.delta()
            .map(|d| vec![d.conv_dim() as u64, d.conv_kernel as u64])
    }),
    row(Role::SsmDt, "ssm_dt.bias", Layer, |a| {
        a.delta().map(|d| vec![d.v_heads as u64])
    }),
    row(Role::SsmALog, "ssm_a_log", Layer, |a| {
        a.delta().map(|d| vec![d.v_heads as u64])
    }),
    row(Role::SsmBeta, "ssm_beta.weight", Layer, |a| {
        a.delta().map(|d| vec![d.v_heads as u64, a.h()])
    }),
    row(Role::SsmAlpha, "ssm_alpha.weight", Layer, |a| {
        a.delta().map(|d| vec![d.v_heads as u64, a.h()])
    }),
    row(Role::SsmNorm, "ssm_norm.weight", Layer, |a| {
        a.delta().map(|d| vec![d.v_head_dim as u64])
    }),
    row(Role::SsmOut, "ssm_out.weight", Layer, |a| {
        a.delta().map(|d| vec![a.h(), d.value_dim() as u64])
    }),
    row(
        Role::PostAttentionNorm,
        "post_attention_norm.weight",
        Layer,
        |a| a.norm(a.spec.norms.attn_post, a.h()),
    ),
    row(Role::FfnNorm, "ffn_norm.weight", Layer, |a| {
        a.norm(Some(a.spec.norms.ffn_input), a.h())
    }),
    row(Role::PostFfwNorm, "post_ffw_norm.weight", Layer, |a| {
        a.norm(a.spec.norms.ffn_post, a.h())
    }),
    row(Role::FfnGateInp, "ffn_gate_inp.weight", Layer, |a| {
        a.moe().map(|m| vec![m.num_experts as u64, a.h()])
    }),
    row(Role::FfnGateInpBias, "ffn_gate_inp.bias", Layer, |a| {
        let m = a.moe()?;
        m.router_bias.then(|| vec![m.num_experts as u64])
    }),
    row(Role::ExpProbsB, "exp_probs_b.bias", Layer, |a| {
        let m = a.moe()?;
        matches!(m.router, RouterKind::SigmoidGrouped { .. }).then(|| vec![m.num_experts as u64])
    }),
    row(Role::FfnGateInpScale, "ffn_gate_inp.scale", Layer, |a| {
        let m = a.moe()?;
        (m.router == RouterKind::Gemma4).then(|| vec![a.h()])
    }),
    row(
        Role::FfnGateInpExpertScale,
        "ffn_gate_inp.expert_scale",
        Layer,
        |a| {
            let m = a.moe()?;
            (m.router == RouterKind::Gemma4).then(|| vec![m.num_experts as u64])
        },
    ),
    row(
        Role::FfnGateInpShexp,
        "ffn_gate_inp_shexp.weight",
        Layer,
        |a| {
            let m = a.moe()?;
            (m.shared_gate && m.shared_intermediate.is_some()).then(|| vec![1, a.h()])
        },
    ),
    row(Role::FfnGateShexp, "ffn_gate_shexp.weight", Layer, |a| {
        a.shared_inter().map(|i| vec![i, a.h()])
    }),
    row(Role::FfnUpShexp, "ffn_up_shexp.weight", Layer, |a| {
        a.shared_inter().map(|i| vec![i, a.h()])
    }),
    row(Role::FfnDownShexp, "ffn_down_shexp.weight", Layer, |a| {
        a.shared_inter().map(|i| vec![a.h(), i])
    }),
    row(Role::FfnGate, "ffn_gate.weight", Layer, |a| {
        a.dense_inter().map(|i| vec![i, a.h()])
    }),
    row(Role::FfnUp, "ffn_up.weight", Layer, |a| {
        a.dense_inter().map(|i| vec![i, a.h()])
    }),
    row(Role::FfnDown, "ffn_down.weight", Layer, |a| {
        a.dense_inter().map(|i| vec![a.h(), i])
    }),
    row(Role::PostFfwNorm1, "post_ffw_norm_1.weight", Layer, |a| {
        a.norm(a.spec.norms.dense_branch_post, a.h())
    }),
    row(Role::PreFfwNorm2, "pre_ffw_norm_2.weight", Layer, |a| {
        a.norm(a.spec.norms.moe_input, a.h())
    }),
    row(Role::PostFfwNorm2, "post_ffw_norm_2.weight", Layer, |a| {
        a.norm(a.spec.norms.moe_post, a.h())
    }),
    row(
        Role::LayerOutputScale,
        "layer_output_scale.weight",
        Layer,
        |a| a.when(a.spec.layer_scalar, vec![1]),
    ),
    row(Role::OutputNorm, "output_norm.weight", Global, |a| {
        a.norm(Some(a.spec.norms.output), a.h())
    }),
    row(Role::Output, "output.weight", Global, |a| {
        a.when(!a.spec.head.tied, vec![a.spec.vocab_size as u64, a.h()])
    }),
    row(Role::ExpertGate, "gate", RoutedExpert, |a| {
        a.expert_inter().map(|i| vec![i, a.h()])
    }),
    row(Role::ExpertUp, "up", RoutedExpert, |a| {
        a.expert_inter().map(|i| vec![i, a.h()])
    }),
    row(Role::ExpertDown, "down", RoutedExpert, |a| {
        a.expert_inter().map(|i| vec![a.h(), i])
    }),
    row(Role::ExpertGateBias, "gate.bias", RoutedExpert, |a| {
        a.expert_bias(|m| m.expert_intermediate as u64)
    }),
    row(Role::ExpertUpBias, "up.bias", RoutedExpert, |a| {
        a.expert_bias(|m| m.expert_intermediate as u64)
    }),
    row(Role::ExpertDownBias, "down.bias", RoutedExpert, |a| {
        a.expert_bias(|_| a.h())
    }),
];

/// A tensor of one place (the globals, one layer, or one layer's experts)
/// that the spec has: its row, its full name and its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Present {
    pub role: Role,
    /// The full canonical name (`blk.3.attn_q.weight`; an expert part's
    /// part name, `gate`).
    pub name: String,
    pub shape: Vec<u64>,
}

/// The tensors of `placement` the spec has, in table order: for `Global`
/// `layer` is ignored; for `Layer` and `RoutedExpert` it is the layer index.
pub fn present(spec: &ArchSpec, placement: Placement, layer: usize) -> Vec<Present> {
    let at = At {
        spec,
        layer: match placement {
            Global => None,
            Layer | RoutedExpert => Some(&spec.layers[layer]),
        },
    };
    TENSORS
        .iter()
        .filter(|d| d.placement == placement)
        .filter_map(|d| {
            let shape = (d.shape)(&at)?;
            let name = match placement {
                Layer => format!("blk.{layer}.{}", d.name),
                Global | RoutedExpert => d.name.to_string(),
            };
            Some(Present {
                role: d.role,
                name,
                shape,
            })
        })
        .collect()
}

fn is_leading_global(role: Role) -> bool {
    role == Role::TokenEmbd
}

/// Every resident tensor the spec needs, in a stable order.
pub fn expected_resident(spec: &ArchSpec) -> Vec<ExpectedTensor> {
    let globals = present(spec, Global, 0);
    let as_expected = |p: Present| ExpectedTensor {
        name: p.name,
        shape: p.shape,
    };
    let (leading, trailing): (Vec<_>, Vec<_>) =
        globals.into_iter().partition(|p| is_leading_global(p.role));
    let mut out: Vec<ExpectedTensor> = leading.into_iter().map(as_expected).collect();
    for l in 0..spec.layers.len() {
        out.extend(present(spec, Layer, l).into_iter().map(as_expected));
    }
    out.extend(trailing.into_iter().map(as_expected));
    out
}

/// The routed-expert parts and the GGUF tensors that stack them over the
/// experts of a layer (`blk.{L}.` + suffix, shape `[n_expert, ...part]`),
/// as llama.cpp's converter writes them.
pub const GGUF_EXPERT_STACKS: [(&str, &str); 6] = [
    ("gate", "ffn_gate_exps.weight"),
    ("up", "ffn_up_exps.weight"),
    ("down", "ffn_down_exps.weight"),
    ("gate.bias", "ffn_gate_exps.bias"),
    ("up.bias", "ffn_up_exps.bias"),
    ("down.bias", "ffn_down_exps.bias"),
];

/// Every routed-expert part the spec needs.
pub fn expected_expert_parts(spec: &ArchSpec) -> Vec<ExpectedPart> {
    let mut out = Vec::new();
    for layer in spec.moe_layers() {
        for p in present(spec, RoutedExpert, layer) {
            let part = TENSORS
                .iter()
                .find(|d| d.role == p.role)
                .map_or("", |d| d.name);
            out.push(ExpectedPart {
                layer,
                part,
                shape: p.shape,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_drop_layer_and_weight_suffix() {
        assert_eq!(role_of("blk.12.attn_q.weight"), "attn_q");
        assert_eq!(role_of("blk.0.attn_q.bias"), "attn_q.bias");
        assert_eq!(role_of("token_embd.weight"), "token_embd");
    }

    #[test]
    fn each_role_and_name_has_one_row() {
        let mut roles = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for d in TENSORS {
            assert!(roles.insert(d.role), "{:?} listed twice", d.role);
            assert!(
                names.insert((d.placement, d.name)),
                "{} listed twice",
                d.name
            );
        }
    }
}
