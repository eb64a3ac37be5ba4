//! Model families, each in one module that holds everything the project
//! knows about it: its names in every source format (HF `model_type`, GGUF
//! `general.architecture`), how its HF `config.json` and its GGUF metadata
//! become an [`ArchSpec`], its tensor-name quirks in both formats, and its
//! built-in chat template. [`FAMILIES`] is the registry.
//!
//! What a family computes is data (the [`ArchSpec`] its readers build);
//! which tensors it has follows from that spec through the one tensor
//! table, [`crate::roles::TENSORS`]. `docs/ADDING_A_FAMILY.md` walks
//! through adding one.
//!
//! HF checkpoints identify themselves by `config.json`'s `model_type`; GGUF
//! files by `general.architecture`. llama.cpp writes Mixtral as `llama` with
//! a non-zero `llama.expert_count` ([`FamilyDef::gguf_experts_of`]).

use crate::convert::hf_names::Target;
use crate::spec::gguf::{Common, Meta};
use crate::spec::hf::Cfg;
use crate::spec::SpecError;
use turbospark_core::arch::{ArchSpec, Family, RopeKind};

mod deepseek_v3;
mod gemma3;
mod gemma4;
mod glm4moe;
mod gpt_oss;
mod llama;
mod mixtral;
mod muse_glimmer;
mod qwen2;
mod qwen35moe;
mod qwen3moe;

/// Every family, in the order error messages list them.
pub const FAMILIES: &[&FamilyDef] = &[
    &llama::FAMILY,
    &qwen2::FAMILY,
    &gemma3::FAMILY,
    &muse_glimmer::FAMILY,
    &mixtral::FAMILY,
    &qwen3moe::FAMILY,
    &gpt_oss::FAMILY,
    &gemma4::FAMILY,
    &glm4moe::FAMILY,
    &deepseek_v3::FAMILY,
    &qwen35moe::FAMILY,
];

/// One family: its names and its readers.
pub struct FamilyDef {
    pub family: Family,
    /// HF `model_type` values (text model first).
    pub hf_model_types: &'static [&'static str],
    /// GGUF `general.architecture` values.
    pub gguf_architectures: &'static [&'static str],
    /// The GGUF architecture llama.cpp writes this family as, with a
    /// non-zero `<arch>.expert_count` (Mixtral: `llama`).
    pub gguf_experts_of: Option<&'static str>,
    /// Layer tensors this family's GGUF files name differently from the
    /// canonical names: `(canonical, gguf)` suffixes after `blk.{L}.`.
    pub gguf_renames: &'static [(&'static str, &'static str)],
    /// The built-in chat template (`turbospark_text::builtin_templates`)
    /// used when a checkpoint carries none; `None` where the family's
    /// checkpoints disagree or its format is not built in.
    pub default_chat_template: Option<&'static str>,
    /// The rope layout of q/k rows in llama.cpp's GGUF files.
    pub gguf_rope: RopeKind,
    /// HF `post_attention_layernorm` is a post-attention norm and
    /// `pre_feedforward_layernorm` the FFN input norm (sandwich norms);
    /// otherwise `post_attention_layernorm` is the FFN input norm.
    pub sandwich_norms: bool,
    /// Layers past the decoder stack are multi-token-prediction layers,
    /// skipped (GLM-4.5).
    pub extra_layers_are_mtp: bool,
    /// The family's own HF layer tensor names, tried before the common ones.
    pub(crate) hf_layer_names: HfLayerNames,
    /// HF `config.json` (the text model's) → spec.
    pub(crate) from_hf: fn(&Cfg) -> Result<ArchSpec, SpecError>,
    /// GGUF metadata → spec: what differs from the common reading
    /// (`spec::gguf::spec_from_gguf`), applied to its result.
    pub(crate) from_gguf: fn(&Meta<'_>, &Common, &mut ArchSpec) -> Result<(), SpecError>,
}

/// A family's reading of an HF layer tensor name `rest` (after
/// `layers.{L}.`): `Some(target)` decides it (`Some(None)`: the name has no
/// meaning in the family); `None` leaves it to the common names.
pub(crate) type HfLayerNames = fn(rest: &str, layer: usize) -> Option<Option<Target>>;

/// For families whose HF layer tensors all have common names.
pub(crate) fn no_hf_layer_names(_: &str, _: usize) -> Option<Option<Target>> {
    None
}

/// The definition of `family`.
pub fn get(family: Family) -> &'static FamilyDef {
    FAMILIES
        .iter()
        .find(|d| d.family == family)
        .copied()
        .unwrap_or_else(|| unreachable!("every Family is registered (tested)"))
}

/// The family of an HF `model_type`.
pub fn for_hf(model_type: &str) -> Option<&'static FamilyDef> {
    FAMILIES
        .iter()
        .find(|d| d.hf_model_types.contains(&model_type))
        .copied()
}

/// The family of a GGUF `general.architecture`; `expert_count` is the
/// `<arch>.expert_count` value (0 when absent).
pub fn for_gguf(architecture: &str, expert_count: u64) -> Option<&'static FamilyDef> {
    if expert_count > 0 {
        if let Some(d) = FAMILIES
            .iter()
            .find(|d| d.gguf_experts_of == Some(architecture))
        {
            return Some(d);
        }
    }
    FAMILIES
        .iter()
        .find(|d| d.gguf_architectures.contains(&architecture))
        .copied()
}

/// The family of an HF `model_type`.
pub fn family_for_hf(model_type: &str) -> Option<Family> {
    for_hf(model_type).map(|d| d.family)
}

/// The family of a GGUF `general.architecture`; `expert_count` is the
/// `<arch>.expert_count` value (0 when absent).
pub fn family_for_gguf(architecture: &str, expert_count: u64) -> Option<Family> {
    for_gguf(architecture, expert_count).map(|d| d.family)
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
    let renames = get(family).gguf_renames;
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
    get(family).default_chat_template
}

/// Comma-separated list of accepted HF model types, for error messages.
pub fn supported_hf_model_types() -> String {
    FAMILIES
        .iter()
        .flat_map(|d| d.hf_model_types.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Comma-separated list of accepted GGUF architectures, for error messages.
pub fn supported_gguf_architectures() -> String {
    let mut names: Vec<String> = FAMILIES
        .iter()
        .flat_map(|d| d.gguf_architectures.iter().map(|a| a.to_string()))
        .collect();
    for d in FAMILIES {
        if let Some(arch) = d.gguf_experts_of {
            names.push(format!("{arch} (with experts: {})", d.family));
        }
    }
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
    fn manifests_name_families_as_before() {
        for (f, id) in [
            (Family::Llama, "llama"),
            (Family::Qwen2, "qwen2"),
            (Family::Gemma3, "gemma3"),
            (Family::MuseGlimmer, "muse_glimmer"),
            (Family::Mixtral, "mixtral"),
            (Family::Qwen3Moe, "qwen3_moe"),
            (Family::GptOss, "gpt_oss"),
            (Family::Gemma4, "gemma4"),
            (Family::Glm4Moe, "glm4_moe"),
        ] {
            assert_eq!(serde_json::to_string(&f).unwrap(), format!("\"{id}\""));
        }
        assert_eq!(Family::GptOss.to_string(), "gpt-oss");
    }

    #[test]
    fn every_family_has_an_hf_row_and_rows_do_not_overlap() {
        for &f in Family::ALL {
            assert!(FAMILIES.iter().any(|i| i.family == f), "{f} missing");
        }
        let mut seen = std::collections::HashSet::new();
        for i in FAMILIES {
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
