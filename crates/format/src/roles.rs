//! Tensor roles: the canonical name of every tensor an install holds, its
//! expected shape (derived from the [`ArchSpec`]) and its placement.
//!
//! Canonical names follow llama.cpp's GGUF naming (`blk.{L}.attn_q.weight`),
//! so GGUF sources map onto them unchanged; HF names are mapped in
//! [`crate::convert::hf_names`]. Routed experts are not resident tensors:
//! they are the parts `gate`, `up`, `down` (+ `.bias`) of a layer's
//! expert file, each with a per-expert shape.

use turbospark_core::arch::{ArchSpec, FfnKind, NormSpec, RouterKind};

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

fn norm_tensor(out: &mut Vec<ExpectedTensor>, name: String, norm: Option<NormSpec>, dim: usize) {
    if let Some(n) = norm {
        if n.has_weight() {
            out.push(ExpectedTensor {
                name,
                shape: vec![dim as u64],
            });
        }
    }
}

/// Every resident tensor the spec needs, in a stable order.
pub fn expected_resident(spec: &ArchSpec) -> Vec<ExpectedTensor> {
    let h = spec.hidden_size as u64;
    let v = spec.vocab_size as u64;
    let mut out = Vec::new();
    let t = |out: &mut Vec<ExpectedTensor>, name: String, shape: Vec<u64>| {
        out.push(ExpectedTensor { name, shape })
    };
    t(&mut out, "token_embd.weight".into(), vec![v, h]);
    let a = &spec.attention;
    for (l, layer) in spec.layers.iter().enumerate() {
        let b = |s: &str| format!("blk.{l}.{s}");
        let q = (spec.num_heads * layer.head_dim) as u64;
        let kv = (layer.num_kv_heads * layer.head_dim) as u64;
        let hd = layer.head_dim;
        norm_tensor(
            &mut out,
            b("attn_norm.weight"),
            Some(spec.norms.attn_input),
            spec.hidden_size,
        );
        t(&mut out, b("attn_q.weight"), vec![q, h]);
        t(&mut out, b("attn_k.weight"), vec![kv, h]);
        if !layer.value_from_key {
            t(&mut out, b("attn_v.weight"), vec![kv, h]);
        }
        t(&mut out, b("attn_output.weight"), vec![h, q]);
        for (on, name, len) in [
            (a.q_bias, "attn_q.bias", q),
            (a.k_bias, "attn_k.bias", kv),
            (a.v_bias && !layer.value_from_key, "attn_v.bias", kv),
            (a.o_bias, "attn_output.bias", h),
        ] {
            if on {
                t(&mut out, b(name), vec![len]);
            }
        }
        norm_tensor(&mut out, b("attn_q_norm.weight"), spec.norms.q, hd);
        norm_tensor(&mut out, b("attn_k_norm.weight"), spec.norms.k, hd);
        norm_tensor(&mut out, b("attn_v_norm.weight"), spec.norms.v, hd);
        if a.output_gate {
            t(&mut out, b("attn_gate.weight"), vec![q, h]);
        }
        if a.sinks {
            t(
                &mut out,
                b("attn_sinks.weight"),
                vec![spec.num_heads as u64],
            );
        }
        norm_tensor(
            &mut out,
            b("post_attention_norm.weight"),
            spec.norms.attn_post,
            spec.hidden_size,
        );
        norm_tensor(
            &mut out,
            b("ffn_norm.weight"),
            Some(spec.norms.ffn_input),
            spec.hidden_size,
        );
        norm_tensor(
            &mut out,
            b("post_ffw_norm.weight"),
            spec.norms.ffn_post,
            spec.hidden_size,
        );
        let dense = |out: &mut Vec<ExpectedTensor>, suffix: &str, inter: u64| {
            t(out, b(&format!("ffn_gate{suffix}.weight")), vec![inter, h]);
            t(out, b(&format!("ffn_up{suffix}.weight")), vec![inter, h]);
            t(out, b(&format!("ffn_down{suffix}.weight")), vec![h, inter]);
        };
        match (layer.ffn, &spec.moe) {
            (FfnKind::Moe, Some(m)) => {
                let e = m.num_experts as u64;
                t(&mut out, b("ffn_gate_inp.weight"), vec![e, h]);
                if m.router_bias {
                    t(&mut out, b("ffn_gate_inp.bias"), vec![e]);
                }
                if matches!(m.router, RouterKind::SigmoidGrouped { .. }) {
                    t(&mut out, b("exp_probs_b.bias"), vec![e]);
                }
                if m.router == RouterKind::Gemma4 {
                    t(&mut out, b("ffn_gate_inp.scale"), vec![h]);
                    t(&mut out, b("ffn_gate_inp.expert_scale"), vec![e]);
                }
                if let Some(si) = m.shared_intermediate {
                    dense(&mut out, "_shexp", si as u64);
                }
                if m.parallel_dense {
                    dense(&mut out, "", spec.intermediate_size as u64);
                }
            }
            _ => dense(&mut out, "", spec.intermediate_size as u64),
        }
        let n = &spec.norms;
        norm_tensor(
            &mut out,
            b("post_ffw_norm_1.weight"),
            n.dense_branch_post,
            spec.hidden_size,
        );
        norm_tensor(
            &mut out,
            b("pre_ffw_norm_2.weight"),
            n.moe_input,
            spec.hidden_size,
        );
        norm_tensor(
            &mut out,
            b("post_ffw_norm_2.weight"),
            n.moe_post,
            spec.hidden_size,
        );
        if spec.layer_scalar {
            t(&mut out, b("layer_output_scale.weight"), vec![1]);
        }
    }
    norm_tensor(
        &mut out,
        "output_norm.weight".into(),
        Some(spec.norms.output),
        spec.hidden_size,
    );
    if !spec.head.tied {
        t(&mut out, "output.weight".into(), vec![v, h]);
    }
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
    let Some(m) = &spec.moe else {
        return Vec::new();
    };
    let h = spec.hidden_size as u64;
    let i = m.expert_intermediate as u64;
    let mut out = Vec::new();
    for layer in spec.moe_layers() {
        let mut p =
            |part: &'static str, shape: Vec<u64>| out.push(ExpectedPart { layer, part, shape });
        p("gate", vec![i, h]);
        p("up", vec![i, h]);
        p("down", vec![h, i]);
        if m.expert_biases {
            p("gate.bias", vec![i]);
            p("up.bias", vec![i]);
            p("down.bias", vec![h]);
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
}
