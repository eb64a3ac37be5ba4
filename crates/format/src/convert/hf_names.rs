//! HF checkpoint tensor names → canonical install names: the names every
//! family shares; a family's own names are in its module
//! ([`crate::families`]).
//!
//! Names are matched after stripping the model prefix (`model.` or
//! `model.language_model.` for multimodal wrappers). What the sandwich-norm
//! families call `post_attention_layernorm` is a post-attention norm; for the
//! pre-norm families it is the FFN input norm.

use crate::families::FamilyDef;

/// Where a source tensor goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// A resident tensor, copied as is.
    Resident(String),
    /// A resident tensor copied as is, whose source shape has extra
    /// dimensions of size 1 (a depthwise convolution's `[channels, 1,
    /// kernel]`); it is stored with the table's shape.
    ResidentSqueezed(String),
    /// A resident tensor copied as is, whose source stacks per-head
    /// matrices on extra leading dimensions (llama.cpp's `attn_k_b`
    /// `[heads, kv_lora, nope]`); it is stored with the table's shape, the
    /// leading dimensions merged into rows (`[heads · kv_lora, nope]`).
    ResidentRowsStacked(String),
    /// One expert's part (`gate`, `up`, `down`).
    ExpertOne {
        layer: usize,
        expert: usize,
        part: &'static str,
    },
    /// All experts of a part, stacked on the first dimension.
    ExpertStack { layer: usize, part: &'static str },
    /// Fused `[E, 2I, H]` gate/up (first half gate, second half up).
    ExpertGateUpHalves { layer: usize },
    /// gpt-oss MXFP4 gate_up (`blocks`; the `scales` tensor is its partner):
    /// rows interleave gate (even) and up (odd).
    Mxfp4GateUp { layer: usize },
    /// gpt-oss MXFP4 down projection (`blocks`).
    Mxfp4Down { layer: usize },
    /// The `scales` partner of an MXFP4 `blocks` tensor (consumed with it).
    Mxfp4Scales,
    /// gpt-oss gate_up bias `[E, 2I]`, interleaved.
    GateUpBiasInterleaved { layer: usize },
    /// gpt-oss down bias `[E, H]`.
    DownBiasStack { layer: usize },
    /// Not a weight (rotary caches).
    Ignored,
    /// A known part of the checkpoint beside the language model, which
    /// convert skips and reports.
    Skipped(SkippedPart),
}

/// A part of a checkpoint that is not the language model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SkippedPart {
    VisionTower,
    AudioTower,
    MultimodalProjector,
    /// Multi-token-prediction (speculative) layers.
    MultiTokenPrediction,
}

impl SkippedPart {
    /// The name the manifest and `convert`'s report use.
    pub const fn name(self) -> &'static str {
        match self {
            SkippedPart::VisionTower => "vision tower",
            SkippedPart::AudioTower => "audio tower",
            SkippedPart::MultimodalProjector => "multimodal projector",
            SkippedPart::MultiTokenPrediction => "multi-token prediction layers",
        }
    }
}

/// Tensor-name prefixes of the parts `*ForConditionalGeneration`
/// checkpoints carry beside the language model (HF transformers 5.24.0:
/// Gemma 3 `vision_tower` + `multi_modal_projector`, Gemma 4 `vision_tower`
/// / `audio_tower` + `embed_vision` / `embed_audio`, Qwen3.5 `visual` and
/// `mtp`, Muse Glimmer `vision_tower` + `vision_adapter` +
/// `vision_projection`).
const SKIPPED_PREFIXES: [(&str, SkippedPart); 12] = [
    ("vision_tower.", SkippedPart::VisionTower),
    ("visual.", SkippedPart::VisionTower),
    ("vision_model.", SkippedPart::VisionTower),
    ("audio_tower.", SkippedPart::AudioTower),
    ("audio_model.", SkippedPart::AudioTower),
    ("multi_modal_projector.", SkippedPart::MultimodalProjector),
    ("embed_vision.", SkippedPart::MultimodalProjector),
    ("embed_audio.", SkippedPart::MultimodalProjector),
    ("vision_adapter.", SkippedPart::MultimodalProjector),
    ("vision_projection.", SkippedPart::MultimodalProjector),
    ("mm_projector.", SkippedPart::MultimodalProjector),
    ("mtp.", SkippedPart::MultiTokenPrediction),
];

/// The skipped part an HF tensor belongs to, under the top level or
/// `model.`.
fn skipped_part(name: &str) -> Option<SkippedPart> {
    let rest = name.strip_prefix("model.").unwrap_or(name);
    SKIPPED_PREFIXES
        .iter()
        .find(|(p, _)| rest.starts_with(p))
        .map(|&(_, part)| part)
}

const PREFIXES: [&str; 3] = ["model.language_model.", "language_model.model.", "model."];

fn strip_prefix(name: &str) -> Option<&str> {
    PREFIXES.iter().find_map(|p| name.strip_prefix(p))
}

/// Maps one HF tensor name of a checkpoint of the family `def`. `None`: the
/// name has no meaning for the family (the converter reports it).
/// `num_layers` lets extra layers (GLM's MTP layers) be recognised as
/// ignorable.
pub fn map_hf_name(def: &FamilyDef, name: &str, num_layers: usize) -> Option<Target> {
    if name == "lm_head.weight" {
        return Some(Target::Resident("output.weight".into()));
    }
    if let Some(part) = skipped_part(name) {
        return Some(Target::Skipped(part));
    }
    if name.ends_with("rotary_emb.inv_freq") {
        return Some(Target::Ignored);
    }
    let rest = strip_prefix(name)?;
    match rest {
        "embed_tokens.weight" => return Some(Target::Resident("token_embd.weight".into())),
        "norm.weight" => return Some(Target::Resident("output_norm.weight".into())),
        _ => {}
    }
    let rest = rest.strip_prefix("layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if layer >= num_layers {
        // GLM-4.5 checkpoints carry multi-token-prediction layers past the
        // decoder stack; inference does not use them.
        return def
            .extra_layers_are_mtp
            .then_some(Target::Skipped(SkippedPart::MultiTokenPrediction));
    }
    if let Some(decided) = (def.hf_layer_names)(rest, layer) {
        return decided;
    }
    let res = |s: &str| Some(Target::Resident(format!("blk.{layer}.{s}")));
    let sandwich = def.sandwich_norms;
    match rest {
        "input_layernorm.weight" => return res("attn_norm.weight"),
        "post_attention_layernorm.weight" if sandwich => return res("post_attention_norm.weight"),
        "post_attention_layernorm.weight" => return res("ffn_norm.weight"),
        "pre_feedforward_layernorm.weight" if sandwich => return res("ffn_norm.weight"),
        "post_feedforward_layernorm.weight" if sandwich => return res("post_ffw_norm.weight"),
        "self_attn.sinks" => return res("attn_sinks.weight"),
        "layer_scalar" => return res("layer_output_scale.weight"),
        "post_feedforward_layernorm_1.weight" => return res("post_ffw_norm_1.weight"),
        "pre_feedforward_layernorm_2.weight" => return res("pre_ffw_norm_2.weight"),
        "post_feedforward_layernorm_2.weight" => return res("post_ffw_norm_2.weight"),
        "router.proj.weight" => return res("ffn_gate_inp.weight"),
        "router.scale" => return res("ffn_gate_inp.scale"),
        "router.per_expert_scale" => return res("ffn_gate_inp.expert_scale"),
        _ => {}
    }
    if let Some(r) = rest.strip_prefix("self_attn.") {
        let (proj, kind) = r.rsplit_once('.')?;
        let target = match proj {
            "q_proj" => "attn_q",
            "k_proj" => "attn_k",
            "v_proj" => "attn_v",
            "o_proj" => "attn_output",
            "q_norm" if kind == "weight" => "attn_q_norm",
            "k_norm" if kind == "weight" => "attn_k_norm",
            _ => return None,
        };
        return res(&format!("{target}.{kind}"));
    }
    // Dense MLP / shared expert.
    for (prefix, suffix) in [("mlp.shared_experts.", "_shexp"), ("mlp.", "")] {
        if let Some(r) = rest.strip_prefix(prefix) {
            match r {
                "gate_proj.weight" => return res(&format!("ffn_gate{suffix}.weight")),
                "up_proj.weight" => return res(&format!("ffn_up{suffix}.weight")),
                "down_proj.weight" => return res(&format!("ffn_down{suffix}.weight")),
                _ => {}
            }
        }
    }
    // Routers.
    match rest {
        "block_sparse_moe.gate.weight" | "mlp.gate.weight" | "mlp.router.weight" => {
            return res("ffn_gate_inp.weight")
        }
        "mlp.router.bias" => return res("ffn_gate_inp.bias"),
        "mlp.gate.e_score_correction_bias" => return res("exp_probs_b.bias"),
        _ => {}
    }
    // Routed experts.
    for prefix in ["mlp.experts.", "block_sparse_moe.experts.", "experts."] {
        let Some(r) = rest.strip_prefix(prefix) else {
            continue;
        };
        match r {
            "gate_up_proj" => return Some(Target::ExpertGateUpHalves { layer }),
            "down_proj" => {
                return Some(Target::ExpertStack {
                    layer,
                    part: "down",
                })
            }
            _ => {}
        }
        let (e, w) = r.split_once('.')?;
        let expert: usize = e.parse().ok()?;
        let part = match w {
            "w1.weight" | "gate_proj.weight" => "gate",
            "w3.weight" | "up_proj.weight" => "up",
            "w2.weight" | "down_proj.weight" => "down",
            _ => return None,
        };
        return Some(Target::ExpertOne {
            layer,
            expert,
            part,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::for_hf;

    /// The family whose HF `model_type` is `t`.
    fn hf(t: &str) -> &'static FamilyDef {
        for_hf(t).unwrap()
    }

    #[test]
    fn post_attention_norm_depends_on_family() {
        let n = "model.layers.3.post_attention_layernorm.weight";
        assert_eq!(
            map_hf_name(hf("llama"), n, 4),
            Some(Target::Resident("blk.3.ffn_norm.weight".into()))
        );
        assert_eq!(
            map_hf_name(hf("gemma3_text"), n, 4),
            Some(Target::Resident("blk.3.post_attention_norm.weight".into()))
        );
    }

    #[test]
    fn experts_and_unknown_names() {
        assert_eq!(
            map_hf_name(
                hf("mixtral"),
                "model.layers.1.block_sparse_moe.experts.5.w3.weight",
                2
            ),
            Some(Target::ExpertOne {
                layer: 1,
                expert: 5,
                part: "up"
            })
        );
        assert_eq!(
            map_hf_name(hf("llama"), "model.layers.0.self_attn.rope.weight", 2),
            None
        );
        assert_eq!(
            map_hf_name(hf("llama"), "model.layers.9.input_layernorm.weight", 2),
            None
        );
        assert_eq!(
            map_hf_name(hf("glm4_moe"), "model.layers.9.input_layernorm.weight", 2),
            Some(Target::Skipped(SkippedPart::MultiTokenPrediction))
        );
    }

    #[test]
    fn towers_and_projectors_are_named_parts() {
        let part = |name: &str| match map_hf_name(hf("gemma3_text"), name, 2) {
            Some(Target::Skipped(p)) => Some(p),
            _ => None,
        };
        assert_eq!(
            part("model.vision_tower.vision_model.embeddings.patch_embedding.weight"),
            Some(SkippedPart::VisionTower)
        );
        assert_eq!(
            part("model.visual.blocks.0.attn.qkv.weight"),
            Some(SkippedPart::VisionTower)
        );
        assert_eq!(
            part("model.audio_tower.layers.0.weight"),
            Some(SkippedPart::AudioTower)
        );
        assert_eq!(
            part("model.multi_modal_projector.mm_input_projection_weight"),
            Some(SkippedPart::MultimodalProjector)
        );
        assert_eq!(
            part("model.embed_vision.embedding_projection.weight"),
            Some(SkippedPart::MultimodalProjector)
        );
        assert_eq!(
            part("mtp.fc.weight"),
            Some(SkippedPart::MultiTokenPrediction)
        );
        // The language model of a conditional-generation checkpoint maps as usual.
        assert_eq!(
            map_hf_name(
                hf("gemma3_text"),
                "model.language_model.layers.1.input_layernorm.weight",
                2
            ),
            Some(Target::Resident("blk.1.attn_norm.weight".into()))
        );
        // Anything else stays unknown.
        assert_eq!(
            map_hf_name(hf("gemma3_text"), "model.mystery_tower.weight", 2),
            None
        );
    }
}
