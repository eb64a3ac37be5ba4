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

/// Declares each family's module and lists its `FAMILY` in [`FAMILIES`]:
/// registering a family is one line here.
macro_rules! registry {
    ($($module:ident,)*) => {
        $(mod $module;)*

        /// Every family, in the order error messages list them.
        pub const FAMILIES: &[&FamilyDef] = &[$(&$module::FAMILY,)*];
    };
}

registry! {
    llama,
    qwen2,
    gemma3,
    muse_glimmer,
    mixtral,
    qwen3moe,
    gpt_oss,
    gemma4,
    glm4moe,
    deepseek_v3,
    qwen35moe,
}

/// One family: its names and its readers.
pub struct FamilyDef {
    /// The id an install's manifest stores ([`Family`]): snake_case, and
    /// never changed once installs of the family exist.
    pub id: &'static str,
    /// The name messages and `inspect` show.
    pub name: &'static str,
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

impl FamilyDef {
    /// The family's identity, as an [`ArchSpec`] holds it.
    pub const fn family(&self) -> Family {
        Family::new(self.id)
    }
}

/// The definition of `family`; `None` for an id no module of this build
/// declares.
pub fn get(family: &Family) -> Option<&'static FamilyDef> {
    FAMILIES.iter().find(|d| d.id == family.id()).copied()
}

/// The display name of `family` (its id where this build does not know it).
pub fn name(family: &Family) -> &str {
    get(family).map_or(family.id(), |d| d.name)
}

/// Comma-separated ids of every family, for error messages.
pub fn known_ids() -> String {
    FAMILIES.iter().map(|d| d.id).collect::<Vec<_>>().join(", ")
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
    for_hf(model_type).map(FamilyDef::family)
}

/// The family of a GGUF `general.architecture`; `expert_count` is the
/// `<arch>.expert_count` value (0 when absent).
pub fn family_for_gguf(architecture: &str, expert_count: u64) -> Option<Family> {
    for_gguf(architecture, expert_count).map(FamilyDef::family)
}

/// The canonical name of a tensor named `name` in a GGUF file of `family`
/// (unchanged for a family this build does not know, which has no renames).
pub fn canonical_from_gguf(family: &Family, name: &str) -> String {
    rename_layer_tensor(family, name, |(canonical, gguf)| (gguf, canonical))
}

/// The name llama.cpp's converter gives the canonical tensor `name` in a
/// GGUF file of `family`.
pub fn gguf_from_canonical(family: &Family, name: &str) -> String {
    rename_layer_tensor(family, name, |pair| pair)
}

/// Applies the family's renames (`from` → `to`, as `direction` orders each
/// pair) to the suffix of a `blk.{L}.` name.
fn rename_layer_tensor(
    family: &Family,
    name: &str,
    direction: impl Fn((&'static str, &'static str)) -> (&'static str, &'static str),
) -> String {
    let renames = get(family).map_or(&[][..], |d| d.gguf_renames);
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
pub fn default_chat_template(family: &Family) -> Option<&'static str> {
    get(family)?.default_chat_template
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
            names.push(format!("{arch} (with experts: {})", d.name));
        }
    }
    names.dedup();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The family whose HF `model_type` is `t`.
    fn hf(t: &str) -> Family {
        family_for_hf(t).unwrap()
    }

    #[test]
    fn gpt_oss_gguf_names_its_ffn_norm_post_attention_norm() {
        let gpt_oss = hf("gpt_oss");
        let gguf = gguf_from_canonical(&gpt_oss, "blk.3.ffn_norm.weight");
        assert_eq!(gguf, "blk.3.post_attention_norm.weight");
        assert_eq!(
            canonical_from_gguf(&gpt_oss, &gguf),
            "blk.3.ffn_norm.weight"
        );
        // Other families keep both names as they are.
        for name in ["blk.3.ffn_norm.weight", "blk.3.post_attention_norm.weight"] {
            assert_eq!(gguf_from_canonical(&hf("gemma3_text"), name), name);
            assert_eq!(canonical_from_gguf(&hf("gemma3_text"), name), name);
        }
        assert_eq!(
            gguf_from_canonical(&gpt_oss, "output.weight"),
            "output.weight"
        );
    }

    /// Installs store the id; these are the ids every install written so
    /// far holds (the snake_case names of the enum that once listed the
    /// families), and the names messages show.
    #[test]
    fn manifests_name_families_as_before() {
        for (model_type, id, name) in [
            ("llama", "llama", "llama"),
            ("qwen2", "qwen2", "qwen2"),
            ("gemma3_text", "gemma3", "gemma3"),
            ("muse_glimmer", "muse_glimmer", "muse_glimmer"),
            ("mixtral", "mixtral", "mixtral"),
            ("qwen3_moe", "qwen3_moe", "qwen3moe"),
            ("gpt_oss", "gpt_oss", "gpt-oss"),
            ("gemma4_text", "gemma4", "gemma4"),
            ("glm4_moe", "glm4_moe", "glm4_moe"),
            ("deepseek_v3", "deepseek_v3", "deepseek_v3"),
            ("qwen3_5_moe_text", "qwen35_moe", "qwen3_5_moe"),
        ] {
            let f = hf(model_type);
            assert_eq!(serde_json::to_string(&f).unwrap(), format!("\"{id}\""));
            assert_eq!(
                serde_json::from_str::<Family>(&format!("\"{id}\"")).unwrap(),
                f
            );
            assert_eq!(super::name(&f), name);
        }
    }

    #[test]
    fn ids_and_model_types_are_unique() {
        let (mut ids, mut types) = (
            std::collections::HashSet::new(),
            std::collections::HashSet::new(),
        );
        for d in FAMILIES {
            assert!(ids.insert(d.id), "id {} declared twice", d.id);
            assert!(
                !d.id.is_empty()
                    && d.id
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "id {} is not snake_case",
                d.id
            );
            for t in d.hf_model_types {
                assert!(types.insert(*t), "{t} listed twice");
            }
            assert_eq!(get(&d.family()).map(|g| g.id), Some(d.id));
        }
        let unknown = Family::new("not_a_family");
        assert!(get(&unknown).is_none());
        assert_eq!(super::name(&unknown), "not_a_family");
        assert_eq!(
            canonical_from_gguf(&unknown, "blk.0.x.weight"),
            "blk.0.x.weight"
        );
    }

    #[test]
    fn llama_cpp_names_of_glm4moe_and_gemma4_tensors() {
        assert_eq!(
            canonical_from_gguf(&hf("glm4_moe"), "blk.1.post_attention_norm.weight"),
            "blk.1.ffn_norm.weight"
        );
        assert_eq!(
            canonical_from_gguf(&hf("gemma4_text"), "blk.1.ffn_down_exps.scale"),
            "blk.1.ffn_gate_inp.expert_scale"
        );
        assert_eq!(family_for_gguf("muse-glimmer", 0), Some(hf("muse_glimmer")));
        assert_eq!(default_chat_template(&hf("gemma3_text")), Some("gemma"));
        assert_eq!(default_chat_template(&hf("llama")), None);
    }

    #[test]
    fn mixtral_is_llama_with_experts_in_gguf() {
        assert_eq!(family_for_gguf("llama", 0), Some(hf("llama")));
        assert_eq!(family_for_gguf("llama", 8), Some(hf("mixtral")));
        assert_eq!(family_for_gguf("gpt-oss", 32), Some(hf("gpt_oss")));
        assert_eq!(family_for_gguf("mamba", 0), None);
        assert_eq!(family_for_hf("qwen3_moe"), Some(Family::new("qwen3_moe")));
        assert_eq!(family_for_hf("bert"), None);
    }
}
