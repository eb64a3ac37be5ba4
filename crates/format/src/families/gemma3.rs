//! Gemma 3 text (HF `gemma3_text`, the language model of `gemma3`; GGUF
//! `gemma3`). Reference: HF `modeling_gemma3.py` of transformers 5.24.0.

use super::FamilyDef;
use crate::spec::gguf::{Common, Meta};
use crate::spec::hf::{activation_for, build_layers, dims, no_moe_layers, rope_spec, Cfg, Dims};
use crate::spec::SpecError;
use turbospark_core::arch::*;

pub const FAMILY: FamilyDef = FamilyDef {
    id: "gemma3",
    name: "gemma3",
    hf_model_types: &["gemma3_text", "gemma3"],
    gguf_architectures: &["gemma3"],
    gguf_experts_of: None,
    gguf_renames: &[],
    default_chat_template: Some("gemma"),
    gguf_rope: RopeKind::Neox,
    sandwich_norms: true,
    extra_layers_are_mtp: false,
    hf_layer_names: super::no_hf_layer_names,
    from_hf,
    from_gguf,
};

/// Gemma 3 text: centered norms everywhere, sandwich norms, q/k norms,
/// embedding × sqrt(hidden), GELU-tanh, 5 local : 1 global layers with
/// separate rope thetas.
pub(crate) fn from_hf(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let d = dims(c, 131072)?;
    let d = Dims {
        head_dim: c.usize_or("head_dim", 256)?,
        ..d
    };
    let eps = c.f64_or("rms_norm_eps", 1e-6)? as f32;
    let norm = NormSpec::centered(eps);
    let sliding = match c.layer_types(d.layers)? {
        Some(t) => t,
        None => {
            let pattern = c.usize_or("sliding_window_pattern", 6)?.max(1);
            (0..d.layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    let window = Some(c.usize_or("sliding_window", 4096)?);
    let local = rope_spec(
        c.v,
        "sliding_attention",
        d.head_dim,
        10000.0,
        d.max_position,
    )?;
    let global = rope_spec(c.v, "full_attention", d.head_dim, 1e6, d.max_position)?;
    let layers = build_layers(
        &d,
        &sliding,
        window,
        &|_, s| Ok(Some(if s { local } else { global })),
        &no_moe_layers(&d),
    )?;
    let bias = c.bool_or("attention_bias", false)?;
    let mut spec = d.base_spec(c.def.family(), norm, layers);
    spec.embedding.scale = (d.hidden as f32).sqrt();
    spec.norms.attn_post = Some(norm);
    spec.norms.ffn_post = Some(norm);
    spec.norms.q = Some(norm);
    spec.norms.k = Some(norm);
    spec.attention.set_biases(bias);
    spec.attention.scale = (c.f64_or("query_pre_attn_scalar", 256.0)? as f32).powf(-0.5);
    spec.attention.softcap = c.opt_f64("attn_logit_softcapping")?.map(|v| v as f32);
    spec.activation = activation_for(c, "hidden_activation", "gelu_pytorch_tanh")?;
    spec.head.tied = c.bool_or("tie_word_embeddings", true)?;
    spec.head.softcap = c.opt_f64("final_logit_softcapping")?.map(|v| v as f32);
    Ok(spec)
}

/// llama.cpp: 5 sliding : 1 full unless the file has a pattern; local rope
/// base `rope.freq_base_swa`, else 10000; norms with HF's `+1` folded in.
fn from_gguf(g: &Meta<'_>, c: &Common, spec: &mut ArchSpec) -> Result<(), SpecError> {
    let plain = NormSpec::plain(c.eps);
    let n_layers = spec.layers.len();
    spec.embedding.scale = (spec.hidden_size as f32).sqrt();
    spec.norms.attn_post = Some(plain);
    spec.norms.ffn_post = Some(plain);
    spec.activation = Activation::GeluTanh;
    spec.head.softcap =
        g.m.meta_f64(&g.key("final_logit_softcapping"))
            .map(|v| v as f32);
    spec.attention.softcap =
        g.m.meta_f64(&g.key("attn_logit_softcapping"))
            .map(|v| v as f32);
    let local = RopeSpec {
        theta: g.f("rope.freq_base_swa", 10000.0) as f32,
        ..c.rope
    };
    let pattern = g
        .swa_pattern(n_layers)?
        .unwrap_or_else(|| (0..n_layers).map(|i| (i + 1) % 6 != 0).collect());
    for (l, sliding) in spec.layers.iter_mut().zip(pattern) {
        if sliding {
            l.window = c.window;
            l.rope = Some(local);
        }
    }
    Ok(())
}
