//! Qwen3.5 / Qwen3.6 MoE (HF `qwen3_5_moe_text`; released as
//! `Qwen3_5MoeForConditionalGeneration`, model type `qwen3_5_moe`, whose
//! `text_config` is read and whose vision tower `model.visual` is skipped).
//! Reference: HF `modeling_qwen3_5_moe.py` of transformers 5.24.0.
//!
//! What differs from llama:
//!
//! - Hybrid layers by `layer_types`: `linear_attention` layers are gated
//!   DeltaNet ([`DeltaNetSpec`], [`Mixer::DeltaNet`]; the recurrence is
//!   stated there), `full_attention` layers gated softmax attention. With no
//!   `layer_types`, every `full_attention_interval`-th layer (default 4) is
//!   full attention, as HF's config fills it.
//! - Full attention: `q_proj` gives, per head, `head_dim` query rows then
//!   `head_dim` output-gate rows (`AttentionSpec::gate_in_q`); the output is
//!   multiplied by `sigmoid(gate)` before `o_proj`; q/k RMS norms; partial
//!   rotary (`partial_rotary_factor`, default 0.25), neox halves; the
//!   M-RoPE sections give every section the same position for text, so plain
//!   rope.
//! - Every RMS norm is centred, `(1 + w)` (`Qwen3_5MoeRMSNorm`, zero-init),
//!   but the DeltaNet output norm, which has a plain weight
//!   (`Qwen3_5MoeRMSNormGated`).
//! - Every layer is MoE: softmax over all experts → top-k → always
//!   renormalised; a shared expert whose output is scaled by
//!   `sigmoid(shared_expert_gate · x)`.
//! - Checkpoints may carry multi-token-prediction weights (`mtp.*`), which
//!   `convert` skips.
//!
//! GGUF files (llama.cpp's `qwen35moe`) are not read yet.

use super::FamilyDef;
use crate::convert::hf_names::Target;
use crate::spec::gguf::{Common, Meta};
use crate::spec::hf::{build_layers, dims, rope_spec, set_moe_layers, Cfg};
use crate::spec::SpecError;
use serde_json::Value;
use turbospark_core::arch::{
    ArchSpec, DeltaNetSpec, FfnKind, Mixer, MoeSpec, NormSpec, RopeKind, RouterKind,
};

pub const FAMILY: FamilyDef = FamilyDef {
    id: "qwen35_moe",
    name: "qwen3_5_moe",
    hf_model_types: &["qwen3_5_moe_text", "qwen3_5_moe"],
    gguf_architectures: &[],
    gguf_experts_of: None,
    gguf_renames: &[],
    default_chat_template: Some("chatml"),
    gguf_rope: RopeKind::Neox,
    sandwich_norms: false,
    extra_layers_are_mtp: true,
    hf_layer_names,
    from_hf,
    from_gguf,
};

/// The DeltaNet and gated-shared-expert tensors, which only this family has.
fn hf_layer_names(rest: &str, layer: usize) -> Option<Option<Target>> {
    let canonical = match rest {
        "linear_attn.in_proj_qkv.weight" => "attn_qkv.weight",
        "linear_attn.in_proj_z.weight" => "attn_gate.weight",
        "linear_attn.in_proj_b.weight" => "ssm_beta.weight",
        "linear_attn.in_proj_a.weight" => "ssm_alpha.weight",
        "linear_attn.dt_bias" => "ssm_dt.bias",
        "linear_attn.A_log" => "ssm_a_log",
        "linear_attn.norm.weight" => "ssm_norm.weight",
        "linear_attn.out_proj.weight" => "ssm_out.weight",
        "mlp.shared_expert_gate.weight" => "ffn_gate_inp_shexp.weight",
        "mlp.shared_expert.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_expert.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_expert.down_proj.weight" => "ffn_down_shexp.weight",
        // HF keeps the depthwise kernel as `[channels, 1, kernel]`.
        "linear_attn.conv1d.weight" => {
            return Some(Some(Target::ResidentSqueezed(format!(
                "blk.{layer}.ssm_conv1d.weight"
            ))))
        }
        _ => return None,
    };
    Some(Some(Target::Resident(format!("blk.{layer}.{canonical}"))))
}

/// The mixer of each layer: `layer_types`, or HF's default pattern.
fn mixers(c: &Cfg, layers: usize) -> Result<Vec<Mixer>, SpecError> {
    let Some(v) = c.v.get("layer_types").filter(|v| !v.is_null()) else {
        let interval = c.usize_or("full_attention_interval", 4)?;
        if interval == 0 {
            return Err(c.bad("full_attention_interval", "a positive integer"));
        }
        return Ok((0..layers)
            .map(|i| {
                if (i + 1) % interval == 0 {
                    Mixer::Attention
                } else {
                    Mixer::DeltaNet
                }
            })
            .collect());
    };
    let expected = format!("a list of {layers} of \"linear_attention\" / \"full_attention\"");
    let arr = v
        .as_array()
        .filter(|a| a.len() == layers)
        .ok_or_else(|| c.bad("layer_types", &expected))?;
    arr.iter()
        .map(|t| match t.as_str() {
            Some("linear_attention") => Ok(Mixer::DeltaNet),
            Some("full_attention") => Ok(Mixer::Attention),
            _ => Err(c.bad("layer_types", &expected)),
        })
        .collect()
}

/// Whether the config states a partial rotary factor (else HF's 0.25).
fn states_partial_rotary(v: &Value) -> bool {
    let in_params = ["rope_parameters", "rope_scaling"].iter().any(|k| {
        v.get(k)
            .and_then(|p| p.get("partial_rotary_factor"))
            .is_some()
    });
    in_params || v.get("partial_rotary_factor").is_some()
}

fn from_hf(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let d = dims(c, 32768)?;
    let eps = c.f64_or("rms_norm_eps", 1e-6)? as f32;
    if c.bool_or("attention_bias", false)? {
        return Err(c.bad("attention_bias", "false"));
    }
    match c.str_or("hidden_act", "silu")? {
        "silu" | "swish" => {}
        _ => return Err(c.bad("hidden_act", "silu")),
    }
    let mut rope = rope_spec(c.v, "full_attention", d.head_dim, 10000.0, d.max_position)?;
    if !states_partial_rotary(c.v) {
        rope.rotary_dim = d.head_dim / 4 / 2 * 2;
    }
    let mixer = mixers(c, d.layers)?;
    let mut layers = build_layers(
        &d,
        &vec![false; d.layers],
        None,
        &|_, _| Ok(Some(rope)),
        &vec![FfnKind::Dense; d.layers],
    )?;
    for (l, m) in layers.iter_mut().zip(&mixer) {
        l.mixer = *m;
        // DeltaNet layers have no positions to rotate.
        if *m == Mixer::DeltaNet {
            l.rope = None;
        }
    }
    let mut spec = d.base_spec(FAMILY.family(), NormSpec::centered(eps), layers);
    spec.norms.q = Some(NormSpec::centered(eps));
    spec.norms.k = Some(NormSpec::centered(eps));
    spec.attention.gate_in_q = true;
    spec.head.tied = c.bool_or("tie_word_embeddings", false)?;
    spec.delta_net = Some(DeltaNetSpec {
        k_heads: c.usize_or("linear_num_key_heads", 16)?,
        v_heads: c.usize_or("linear_num_value_heads", 32)?,
        k_head_dim: c.usize_or("linear_key_head_dim", 128)?,
        v_head_dim: c.usize_or("linear_value_head_dim", 128)?,
        conv_kernel: c.usize_or("linear_conv_kernel_dim", 4)?,
    });
    let shared = c.usize_or("shared_expert_intermediate_size", 512)?;
    spec.moe = Some(MoeSpec {
        num_experts: c.usize_or("num_experts", 256)?,
        top_k: c.usize_or("num_experts_per_tok", 8)?,
        expert_intermediate: c.usize_or("moe_intermediate_size", 512)?,
        router: RouterKind::SoftmaxTopK { renormalize: true },
        router_bias: false,
        expert_biases: false,
        shared_intermediate: (shared > 0).then_some(shared),
        parallel_dense: false,
        shared_gate: shared > 0,
    });
    set_moe_layers(&mut spec, |_| true);
    Ok(spec)
}

fn from_gguf(_: &Meta<'_>, _: &Common, _: &mut ArchSpec) -> Result<(), SpecError> {
    Err(SpecError::Unsupported {
        what: "GGUF source".into(),
        detail: "qwen3_5_moe converts from its HF checkpoint only".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec_of(v: &Value) -> Result<ArchSpec, SpecError> {
        from_hf(&Cfg {
            v,
            top: v,
            def: &FAMILY,
        })
    }

    /// HF's defaults where `save_pretrained` omits a field: every 4th
    /// layer full attention, a quarter of the head rotates.
    #[test]
    fn hf_defaults_for_layer_pattern_and_partial_rotary() {
        let v = json!({
            "model_type": "qwen3_5_moe_text", "vocab_size": 256, "hidden_size": 64,
            "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "rope_parameters": {"rope_type": "default", "rope_theta": 1e7},
            "num_experts": 8, "num_experts_per_tok": 2,
        });
        let spec = spec_of(&v).unwrap();
        spec.validate().unwrap();
        let kinds: Vec<Mixer> = spec.layers.iter().map(|l| l.mixer).collect();
        assert_eq!(kinds[3], Mixer::Attention);
        assert_eq!(kinds[7], Mixer::Attention);
        assert_eq!(kinds.iter().filter(|m| **m == Mixer::DeltaNet).count(), 6);
        assert_eq!(spec.layers[3].rope.unwrap().rotary_dim, 8);
        assert!(spec.layers[0].rope.is_none());
        let d = spec.delta_net.unwrap();
        assert_eq!((d.k_heads, d.v_heads, d.conv_kernel), (16, 32, 4));
        let m = spec.moe.unwrap();
        assert!(m.shared_gate);
        assert_eq!(m.shared_intermediate, Some(512));
    }

    #[test]
    fn bad_layer_types_are_refused() {
        let v = json!({
            "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "layer_types": ["linear_attention", "sliding_attention"],
        });
        let e = spec_of(&v).unwrap_err().to_string();
        assert!(e.contains("layer_types"), "{e}");
    }
}
