//! Muse Glimmer text (HF `muse_glimmer_text`, the language model of
//! `muse_glimmer`; GGUF `muse-glimmer`).
//! Reference: HF `modeling_muse_glimmer.py` of transformers 5.24.0.

use super::FamilyDef;
use crate::convert::hf_names::Target;
use crate::spec::gguf::{Common, Meta};
use crate::spec::hf::{activation_for, build_layers, dims, no_moe_layers, rope_spec, Cfg, Dims};
use crate::spec::SpecError;
use serde_json::Value;
use turbospark_core::arch::*;

pub const FAMILY: FamilyDef = FamilyDef {
    id: "muse_glimmer",
    name: "muse_glimmer",
    hf_model_types: &["muse_glimmer_text", "muse_glimmer"],
    gguf_architectures: &["muse-glimmer", "muse_glimmer"],
    gguf_experts_of: None,
    gguf_renames: &[],
    default_chat_template: None,
    // llama.cpp's converter un-permutes Muse Glimmer's q/k rows (HF stores
    // them in rotate_half layout) for interleaved rope.
    gguf_rope: RopeKind::Interleaved,
    sandwich_norms: true,
    extra_layers_are_mtp: false,
    hf_layer_names,
    from_hf,
    from_gguf,
};

/// The attention output gate, `self_attn.gate_proj`.
fn hf_layer_names(rest: &str, layer: usize) -> Option<Option<Target>> {
    (rest == "self_attn.gate_proj.weight")
        .then(|| Some(Target::Resident(format!("blk.{layer}.attn_gate.weight"))))
}

/// Muse Glimmer text (HF `modeling_muse_glimmer.py`): normed embedding,
/// centered sandwich norms (post norms with their own eps), scale-less q/k
/// norms with q × `qk_scale_factor`, a sigmoid output gate, NoPE on layers
/// whose `layer_rope_theta` is 0 (HF uses the global theta on all others),
/// logits × `output_multiplier` then softcap.
pub(crate) fn from_hf(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let d = dims(c, 131072)?;
    let d = Dims {
        head_dim: c.usize_or("head_dim", 128)?,
        ..d
    };
    let eps = c.f64_or("rms_norm_eps", 1e-5)? as f32;
    let post_eps = c.f64_or("post_norm_eps", 1e-8)? as f32;
    let n = d.layers;
    let last_rule = |i: usize| (n - 1 - i) % 4 == 0;
    let sliding = match c.layer_types(n)? {
        Some(t) => t,
        None => (0..n).map(|i| !last_rule(i)).collect(),
    };
    let rope = rope_spec(c.v, "full_attention", d.head_dim, 10000.0, d.max_position)?;
    let rope_on: Vec<bool> = match c.present("layer_rope_theta") {
        None => (0..n).map(|i| !last_rule(i)).collect(),
        Some(Value::Array(a)) if a.len() == n => a
            .iter()
            .map(|t| t.as_f64().map(|x| x != 0.0))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| c.bad("layer_rope_theta", "a list of numbers"))?,
        Some(_) => return Err(c.bad("layer_rope_theta", &format!("a list of {n} numbers"))),
    };
    let window = c.opt_usize("sliding_window")?.or(Some(2048));
    let layers = build_layers(
        &d,
        &sliding,
        window,
        &|i, _| Ok(rope_on[i].then_some(rope)),
        &no_moe_layers(&d),
    )?;
    let bias = c.bool_or("attention_bias", false)?;
    let centered = NormSpec::centered(eps);
    let post = NormSpec::centered(post_eps);
    let qk_scale = c.f64_or("qk_scale_factor", 3.87)? as f32;
    let tied = c
        .top
        .get("tie_word_embeddings")
        .and_then(Value::as_bool)
        .unwrap_or(c.bool_or("tie_word_embeddings", false)?);
    let mut spec = d.base_spec(c.def.family(), centered, layers);
    spec.embedding.norm = Some(NormSpec::no_scale(eps));
    spec.norms.attn_post = Some(post);
    spec.norms.ffn_post = Some(post);
    spec.norms.q = Some(NormSpec::no_scale(eps));
    spec.norms.k = Some(NormSpec::no_scale(eps));
    spec.norms.output = NormSpec::plain(eps);
    spec.attention.set_biases(bias);
    spec.attention.output_gate = true;
    spec.attention.scale = qk_scale * (d.head_dim as f32).powf(-0.5);
    spec.activation = activation_for(c, "hidden_activation", "silu")?;
    spec.head.tied = tied;
    spec.head.multiplier = c.f64_or("output_multiplier", 0.196_116_135_138_184_04)? as f32;
    spec.head.softcap = Some(c.f64_or("final_logit_softcapping", 20.0)? as f32);
    Ok(spec)
}

/// Muse Glimmer as llama.cpp's converter writes it (`muse-glimmer`,
/// conversion/muse_glimmer.py; graph in src/models/muse-glimmer.cpp): the
/// four layer norms have the HF `+1` folded in (plain here), the two post
/// norms use eps 1e-8, the embedding is RMS-normed without a weight, q/k
/// rows are un-permuted for interleaved rope, the q/k norms carry weights
/// that absorb `qk_scale_factor` (so the attention scale is head_dim^-0.5),
/// rope runs on the sliding layers only (NoPE on full ones), and logits are
/// multiplied by `logit_scale` before the final softcap.
pub(crate) fn from_gguf(g: &Meta<'_>, c: &Common, spec: &mut ArchSpec) -> Result<(), SpecError> {
    let (window, eps) = (c.window, c.eps);
    const POST_NORM_EPS: f32 = 1e-8;
    let n = spec.layers.len();
    let pattern = g
        .swa_pattern(n)?
        .unwrap_or_else(|| (0..n).map(|i| (n - 1 - i) % 4 != 0).collect());
    for (l, sliding) in spec.layers.iter_mut().zip(pattern) {
        l.window = if sliding { window } else { None };
        if !sliding {
            l.rope = None;
        }
    }
    let plain = NormSpec::plain(eps);
    spec.embedding.norm = Some(NormSpec::no_scale(eps));
    spec.norms.attn_post = Some(NormSpec::plain(POST_NORM_EPS));
    spec.norms.ffn_post = Some(NormSpec::plain(POST_NORM_EPS));
    spec.norms.q = Some(plain);
    spec.norms.k = Some(plain);
    spec.attention.output_gate = true;
    spec.head.multiplier = g.f("logit_scale", 1.0) as f32;
    spec.head.softcap =
        g.m.meta_f64(&g.key("final_logit_softcapping"))
            .map(|v| v as f32);
    Ok(())
}
