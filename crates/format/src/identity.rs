//! The identity table: one row per family, naming it in every source format.
//!
//! HF checkpoints identify themselves by `config.json`'s `model_type`; GGUF
//! files by `general.architecture`. llama.cpp writes Mixtral as `llama` with
//! a non-zero `llama.expert_count`, so that row is resolved with the expert
//! count (see [`family_for_gguf`]).

use turbospark_core::arch::Family;

/// One family and its names.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    pub family: Family,
    /// HF `model_type` values (text model first).
    pub hf_model_types: &'static [&'static str],
    /// GGUF `general.architecture` values.
    pub gguf_architectures: &'static [&'static str],
    /// Layer tensors this family's GGUF files name differently from the
    /// canonical names: `(canonical, gguf)` suffixes after `blk.{L}.`.
    pub gguf_renames: &'static [(&'static str, &'static str)],
    /// The built-in chat template (`turbospark_text::builtin_templates`)
    /// used when a checkpoint carries none; `None` where the family's
    /// checkpoints disagree (llama: Llama 2, Llama 3 and ChatML models) or
    /// its format is not built in.
    pub default_chat_template: Option<&'static str>,
}

pub const IDENTITIES: [Identity; 9] = [
    Identity {
        family: Family::Llama,
        hf_model_types: &["llama", "mistral"],
        gguf_architectures: &["llama"],
        gguf_renames: &[],
        default_chat_template: None,
    },
    Identity {
        family: Family::Qwen2,
        hf_model_types: &["qwen2"],
        gguf_architectures: &["qwen2"],
        gguf_renames: &[],
        default_chat_template: Some("chatml"),
    },
    Identity {
        family: Family::Gemma3,
        hf_model_types: &["gemma3_text", "gemma3"],
        gguf_architectures: &["gemma3"],
        gguf_renames: &[],
        default_chat_template: Some("gemma"),
    },
    Identity {
        family: Family::MuseGlimmer,
        hf_model_types: &["muse_glimmer_text", "muse_glimmer"],
        gguf_architectures: &["muse-glimmer", "muse_glimmer"],
        gguf_renames: &[],
        default_chat_template: None,
    },
    Identity {
        family: Family::Mixtral,
        hf_model_types: &["mixtral"],
        gguf_architectures: &[],
        gguf_renames: &[],
        default_chat_template: Some("mistral"),
    },
    Identity {
        family: Family::Qwen3Moe,
        hf_model_types: &["qwen3_moe"],
        gguf_architectures: &["qwen3moe"],
        gguf_renames: &[],
        default_chat_template: Some("chatml"),
    },
    Identity {
        family: Family::GptOss,
        hf_model_types: &["gpt_oss"],
        gguf_architectures: &["gpt-oss"],
        // llama.cpp's gpt-oss names the pre-FFN norm ATTN_POST_NORM.
        gguf_renames: &[("ffn_norm.weight", "post_attention_norm.weight")],
        default_chat_template: None,
    },
    Identity {
        family: Family::Gemma4,
        hf_model_types: &["gemma4_text", "gemma4"],
        gguf_architectures: &["gemma4"],
        // llama.cpp applies the router's per-expert scale to the expert
        // outputs, so its converter files it with the down projections.
        gguf_renames: &[("ffn_gate_inp.expert_scale", "ffn_down_exps.scale")],
        default_chat_template: None,
    },
    Identity {
        family: Family::Glm4Moe,
        hf_model_types: &["glm4_moe"],
        gguf_architectures: &["glm4moe"],
        // llama.cpp's glm4moe, like its gpt-oss, names the pre-FFN norm
        // ATTN_POST_NORM.
        gguf_renames: &[("ffn_norm.weight", "post_attention_norm.weight")],
        default_chat_template: Some("glm4"),
    },
];

/// The family of an HF `model_type`.
pub fn family_for_hf(model_type: &str) -> Option<Family> {
    IDENTITIES
        .iter()
        .find(|i| i.hf_model_types.contains(&model_type))
        .map(|i| i.family)
}

/// The family of a GGUF `general.architecture`; `expert_count` is the
/// `<arch>.expert_count` value (0 when absent).
pub fn family_for_gguf(architecture: &str, expert_count: u64) -> Option<Family> {
    if architecture == "llama" && expert_count > 0 {
        return Some(Family::Mixtral);
    }
    IDENTITIES
        .iter()
        .find(|i| i.gguf_architectures.contains(&architecture))
        .map(|i| i.family)
}

/// The canonical name of a tensor named `name` in a GGUF file of `family`.
pub fn canonical_from_gguf(family: Family, name: &str) -> String {
    rename_layer_tensor(family, name, |(canonical, gguf)| (gguf, canonical))
}

/// The name llama.cpp's converter gives the canonical tensor `name` in a
/// GGUF file of `family`.
pub fn gguf_from_canonical(family: Family, name: &str) -> String {
    rename_layer_tensor(family, name, |pair| pair)
}

/// Applies the family's renames (`from` → `to`, as `direction` orders each
/// pair) to the suffix of a `blk.{L}.` name.
fn rename_layer_tensor(
    family: Family,
    name: &str,
    direction: impl Fn((&'static str, &'static str)) -> (&'static str, &'static str),
) -> String {
    let renames = IDENTITIES
        .iter()
        .find(|i| i.family == family)
        .map_or(&[][..], |i| i.gguf_renames);
    if let Some((layer, tail)) = name
        .strip_prefix("blk.")
        .and_then(|rest| rest.split_once('.'))
    {
        for &pair in renames {
            let (from, to) = direction(pair);
            if tail == from {
                return format!("blk.{layer}.{to}");
            }
        }
    }
    name.to_string()
}

/// The built-in chat template name of `family`, if it has one.
pub fn default_chat_template(family: Family) -> Option<&'static str> {
    IDENTITIES
        .iter()
        .find(|i| i.family == family)
        .and_then(|i| i.default_chat_template)
}

/// Comma-separated list of accepted HF model types, for error messages.
pub fn supported_hf_model_types() -> String {
    IDENTITIES
        .iter()
        .flat_map(|i| i.hf_model_types.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Comma-separated list of accepted GGUF architectures, for error messages.
pub fn supported_gguf_architectures() -> String {
    let mut names: Vec<&str> = IDENTITIES
        .iter()
        .flat_map(|i| i.gguf_architectures.iter().copied())
        .collect();
    names.push("llama (with experts: mixtral)");
    names.dedup();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt_oss_gguf_names_its_ffn_norm_post_attention_norm() {
        let gguf = gguf_from_canonical(Family::GptOss, "blk.3.ffn_norm.weight");
        assert_eq!(gguf, "blk.3.post_attention_norm.weight");
        assert_eq!(
            canonical_from_gguf(Family::GptOss, &gguf),
            "blk.3.ffn_norm.weight"
        );
        // Other families keep both names as they are.
        for name in ["blk.3.ffn_norm.weight", "blk.3.post_attention_norm.weight"] {
            assert_eq!(gguf_from_canonical(Family::Gemma3, name), name);
            assert_eq!(canonical_from_gguf(Family::Gemma3, name), name);
        }
        assert_eq!(
            gguf_from_canonical(Family::GptOss, "output.weight"),
            "output.weight"
        );
    }

    #[test]
    fn every_family_has_an_hf_row_and_rows_do_not_overlap() {
        for f in Family::ALL {
            assert!(IDENTITIES.iter().any(|i| i.family == f), "{f} missing");
        }
        let mut seen = std::collections::HashSet::new();
        for i in IDENTITIES {
            for t in i.hf_model_types {
                assert!(seen.insert(*t), "{t} listed twice");
            }
        }
    }

    #[test]
    fn llama_cpp_names_of_glm4moe_and_gemma4_tensors() {
        assert_eq!(
            canonical_from_gguf(Family::Glm4Moe, "blk.1.post_attention_norm.weight"),
            "blk.1.ffn_norm.weight"
        );
        assert_eq!(
            canonical_from_gguf(Family::Gemma4, "blk.1.ffn_down_exps.scale"),
            "blk.1.ffn_gate_inp.expert_scale"
        );
        assert_eq!(
            family_for_gguf("muse-glimmer", 0),
            Some(Family::MuseGlimmer)
        );
        assert_eq!(default_chat_template(Family::Gemma3), Some("gemma"));
        assert_eq!(default_chat_template(Family::Llama), None);
    }

    #[test]
    fn mixtral_is_llama_with_experts_in_gguf() {
        assert_eq!(family_for_gguf("llama", 0), Some(Family::Llama));
        assert_eq!(family_for_gguf("llama", 8), Some(Family::Mixtral));
        assert_eq!(family_for_gguf("gpt-oss", 32), Some(Family::GptOss));
        assert_eq!(family_for_gguf("mamba", 0), None);
        assert_eq!(family_for_hf("qwen3_moe"), Some(Family::Qwen3Moe));
        assert_eq!(family_for_hf("bert"), None);
    }
}
