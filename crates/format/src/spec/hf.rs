//! `ArchSpec` from an HF `config.json` (transformers 5.24.0 field names and
//! defaults; `save_pretrained` omits fields equal to the class default, so
//! every default below mirrors `configuration_<type>.py`).

use super::rope::rope_spec;
use super::SpecError;
use crate::identity::{family_for_hf, supported_hf_model_types};
use serde_json::Value;
use turbospark_core::arch::*;

/// Typed access to a config object with errors naming the field.
struct Cfg<'a> {
    v: &'a Value,
    family: Family,
}

impl<'a> Cfg<'a> {
    fn missing(&self, field: &str) -> SpecError {
        SpecError::MissingField {
            field: field.to_string(),
            family: self.family.to_string(),
            source_kind: "config.json",
        }
    }
    fn bad(&self, field: &str, expected: &str) -> SpecError {
        SpecError::BadField {
            field: field.to_string(),
            found: self.v.get(field).map(|v| v.to_string()).unwrap_or_default(),
            expected: expected.to_string(),
            source_kind: "config.json",
        }
    }
    fn present(&self, field: &str) -> Option<&'a Value> {
        self.v.get(field).filter(|v| !v.is_null())
    }
    fn usize(&self, field: &str) -> Result<usize, SpecError> {
        match self.present(field) {
            None => Err(self.missing(field)),
            Some(v) => v
                .as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| self.bad(field, "a non-negative integer")),
        }
    }
    fn usize_or(&self, field: &str, default: usize) -> Result<usize, SpecError> {
        match self.present(field) {
            None => Ok(default),
            Some(_) => self.usize(field),
        }
    }
    fn opt_usize(&self, field: &str) -> Result<Option<usize>, SpecError> {
        match self.present(field) {
            None => Ok(None),
            Some(_) => self.usize(field).map(Some),
        }
    }
    fn f64_or(&self, field: &str, default: f64) -> Result<f64, SpecError> {
        match self.present(field) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.bad(field, "a number")),
        }
    }
    fn opt_f64(&self, field: &str) -> Result<Option<f64>, SpecError> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(field, "a number")),
        }
    }
    fn bool_or(&self, field: &str, default: bool) -> Result<bool, SpecError> {
        match self.present(field) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.bad(field, "true or false")),
        }
    }
    fn str_or(&self, field: &str, default: &'a str) -> Result<&'a str, SpecError> {
        match self.present(field) {
            None => Ok(default),
            Some(v) => v.as_str().ok_or_else(|| self.bad(field, "a string")),
        }
    }
    fn usize_list(&self, field: &str) -> Result<Option<Vec<usize>>, SpecError> {
        match self.present(field) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|n| n as usize))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| self.bad(field, "a list of integers")),
            Some(_) => Err(self.bad(field, "a list of integers")),
        }
    }
    /// `layer_types` (`full_attention` / `sliding_attention` per layer).
    fn layer_types(&self, n_layers: usize) -> Result<Option<Vec<bool>>, SpecError> {
        let Some(v) = self.present("layer_types") else {
            return Ok(None);
        };
        let expected =
            format!("a list of {n_layers} of \"full_attention\" / \"sliding_attention\"");
        let arr = v
            .as_array()
            .ok_or_else(|| self.bad("layer_types", &expected))?;
        if arr.len() != n_layers {
            return Err(self.bad("layer_types", &expected));
        }
        arr.iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(self.bad("layer_types", &expected)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

/// The config object of the text model: the whole config, or its
/// `text_config` for multimodal wrappers.
pub fn text_config(config: &Value) -> &Value {
    match config.get("text_config") {
        Some(t) if t.is_object() => t,
        _ => config,
    }
}

/// Builds the spec from a parsed `config.json`.
pub fn spec_from_hf_config(config: &Value) -> Result<ArchSpec, SpecError> {
    let top_type = config.get("model_type").and_then(Value::as_str);
    let cfg_v = text_config(config);
    let model_type = cfg_v
        .get("model_type")
        .and_then(Value::as_str)
        .or(top_type)
        .ok_or_else(|| SpecError::MissingField {
            field: "model_type".into(),
            family: "any model".into(),
            source_kind: "config.json",
        })?;
    let family = family_for_hf(model_type).ok_or_else(|| SpecError::UnknownArchitecture {
        found: model_type.to_string(),
        source_kind: "HF config.json model_type",
        supported: supported_hf_model_types(),
    })?;
    let c = Cfg { v: cfg_v, family };
    let spec = match family {
        Family::Llama | Family::Qwen2 | Family::Mixtral | Family::Qwen3Moe | Family::Glm4Moe => {
            llama_like(&c)?
        }
        Family::Gemma3 => gemma3(&c)?,
        Family::MuseGlimmer => muse_glimmer(&c, config)?,
        Family::GptOss => gpt_oss(&c)?,
        Family::Gemma4 => gemma4(&c)?,
    };
    spec.validate().map_err(SpecError::Inconsistent)?;
    Ok(spec)
}

/// Dimensions every family names the same way.
struct Dims {
    vocab: usize,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    max_position: usize,
}

impl Dims {
    /// The fields every family fills the same way, with the defaults of a
    /// pre-norm decoder: `norm` on attention input, FFN input and output,
    /// no q/k/v norms, no biases, `head_dim^-0.5` attention scale, SwiGLU,
    /// dense FFN, untied head without multiplier or softcap. Each builder
    /// then overrides what its family does differently.
    fn base_spec(&self, family: Family, norm: NormSpec, layers: Vec<LayerSpec>) -> ArchSpec {
        ArchSpec {
            family,
            vocab_size: self.vocab,
            hidden_size: self.hidden,
            num_heads: self.heads,
            num_kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            intermediate_size: self.intermediate,
            max_position: self.max_position,
            embedding: EmbeddingSpec {
                scale: 1.0,
                norm: None,
            },
            norms: NormsSpec {
                attn_input: norm,
                attn_post: None,
                ffn_input: norm,
                ffn_post: None,
                q: None,
                k: None,
                v: None,
                output: norm,
                dense_branch_post: None,
                moe_input: None,
                moe_post: None,
            },
            attention: AttentionSpec {
                q_bias: false,
                k_bias: false,
                v_bias: false,
                o_bias: false,
                sinks: false,
                output_gate: false,
                scale: (self.head_dim as f32).powf(-0.5),
                softcap: None,
            },
            activation: Activation::Swiglu,
            moe: None,
            head: HeadSpec {
                tied: false,
                multiplier: 1.0,
                softcap: None,
            },
            layer_scalar: false,
            layers,
        }
    }
}

fn dims(c: &Cfg, default_max_position: usize) -> Result<Dims, SpecError> {
    let hidden = c.usize("hidden_size")?;
    let heads = c.usize("num_attention_heads")?;
    if heads == 0 {
        return Err(c.bad("num_attention_heads", "a positive integer"));
    }
    Ok(Dims {
        vocab: c.usize("vocab_size")?,
        hidden,
        layers: c.usize("num_hidden_layers")?,
        heads,
        kv_heads: c.usize_or("num_key_value_heads", heads)?,
        head_dim: c.usize_or("head_dim", hidden / heads)?,
        intermediate: c.usize_or("intermediate_size", 0)?,
        max_position: c.usize_or("max_position_embeddings", default_max_position)?,
    })
}

fn activation_for(c: &Cfg, field: &str, default: &str) -> Result<Activation, SpecError> {
    match c.str_or(field, default)? {
        "silu" | "swish" => Ok(Activation::Swiglu),
        "gelu_pytorch_tanh" | "gelu_tanh" => Ok(Activation::GeluTanh),
        _ => Err(c.bad(field, "silu or gelu_pytorch_tanh")),
    }
}

fn no_moe_layers(d: &Dims) -> Vec<FfnKind> {
    vec![FfnKind::Dense; d.layers]
}

fn build_layers(
    d: &Dims,
    sliding: &[bool],
    window: Option<usize>,
    ropes: &dyn Fn(usize, bool) -> Result<Option<RopeSpec>, SpecError>,
    ffn: &[FfnKind],
) -> Result<Vec<LayerSpec>, SpecError> {
    (0..d.layers)
        .map(|i| {
            let is_sliding = sliding[i];
            Ok(LayerSpec {
                head_dim: d.head_dim,
                num_kv_heads: d.kv_heads,
                window: if is_sliding { window } else { None },
                rope: ropes(i, is_sliding)?,
                ffn: ffn[i],
                value_from_key: false,
            })
        })
        .collect()
}

/// llama, qwen2, mixtral, qwen3_moe and glm4_moe: pre-norm RMS decoders with
/// plain norms, GQA, neox rope and SwiGLU.
fn llama_like(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let f = c.family;
    let default_eps = match f {
        Family::Qwen2 | Family::Qwen3Moe => 1e-6,
        _ => 1e-5,
    };
    let d = dims(c, 32768)?;
    let eps = c.f64_or("rms_norm_eps", default_eps)? as f32;
    let attention_bias = c.bool_or("attention_bias", false)?;
    let (qkv_bias, o_bias) = match f {
        Family::Qwen2 => (true, false),
        Family::Glm4Moe => (attention_bias, false),
        _ => (attention_bias, attention_bias),
    };
    let qk_norm = match f {
        Family::Qwen3Moe => Some(NormSpec::plain(eps)),
        Family::Glm4Moe if c.bool_or("use_qk_norm", false)? => Some(NormSpec::plain(eps)),
        _ => None,
    };
    let tied_default = matches!(f, Family::Qwen2);
    let moe = match f {
        Family::Mixtral => Some(MoeSpec {
            num_experts: c.usize_or("num_local_experts", 8)?,
            top_k: c.usize_or("num_experts_per_tok", 2)?,
            expert_intermediate: d.intermediate,
            router: RouterKind::SoftmaxTopK { renormalize: true },
            router_bias: false,
            expert_biases: false,
            shared_intermediate: None,
            parallel_dense: false,
        }),
        Family::Qwen3Moe => Some(MoeSpec {
            // transformers 5.x writes `num_local_experts`; released configs `num_experts`.
            num_experts: match c.opt_usize("num_experts")? {
                Some(n) => n,
                None => c.usize_or("num_local_experts", 128)?,
            },
            top_k: c.usize_or("num_experts_per_tok", 8)?,
            expert_intermediate: c.usize_or("moe_intermediate_size", 768)?,
            router: RouterKind::SoftmaxTopK {
                renormalize: c.bool_or("norm_topk_prob", false)?,
            },
            router_bias: false,
            expert_biases: false,
            shared_intermediate: None,
            parallel_dense: false,
        }),
        Family::Glm4Moe => {
            let moe_inter = c.usize_or("moe_intermediate_size", 1408)?;
            let shared = c.usize_or("n_shared_experts", 1)?;
            Some(MoeSpec {
                num_experts: c.usize_or("n_routed_experts", 128)?,
                top_k: c.usize_or("num_experts_per_tok", 8)?,
                expert_intermediate: moe_inter,
                router: RouterKind::SigmoidGrouped {
                    n_group: c.usize_or("n_group", 1)?,
                    topk_group: c.usize_or("topk_group", 1)?,
                    renormalize: c.bool_or("norm_topk_prob", true)?,
                    scaling: c.f64_or("routed_scaling_factor", 1.0)? as f32,
                },
                router_bias: false,
                expert_biases: false,
                shared_intermediate: (shared > 0).then_some(moe_inter * shared),
                parallel_dense: false,
            })
        }
        _ => None,
    };
    let ffn: Vec<FfnKind> = match f {
        Family::Mixtral => vec![FfnKind::Moe; d.layers],
        Family::Qwen3Moe => {
            let mlp_only = c.usize_list("mlp_only_layers")?.unwrap_or_default();
            let step = c.usize_or("decoder_sparse_step", 1)?.max(1);
            let has_experts = moe.as_ref().is_some_and(|m| m.num_experts > 0);
            (0..d.layers)
                .map(|i| {
                    if !mlp_only.contains(&i) && has_experts && (i + 1) % step == 0 {
                        FfnKind::Moe
                    } else {
                        FfnKind::Dense
                    }
                })
                .collect()
        }
        Family::Glm4Moe => {
            let first_dense = c.usize_or("first_k_dense_replace", 1)?;
            (0..d.layers)
                .map(|i| {
                    if i >= first_dense {
                        FfnKind::Moe
                    } else {
                        FfnKind::Dense
                    }
                })
                .collect()
        }
        _ => no_moe_layers(&d),
    };
    // Sliding windows: explicit `layer_types` win; otherwise Mixtral slides
    // every layer when `sliding_window` is set, Qwen models only when
    // `use_sliding_window` is true (layers from `max_window_layers` on).
    let window = c.opt_usize("sliding_window")?;
    let sliding: Vec<bool> = match c.layer_types(d.layers)? {
        Some(t) => t,
        None => match f {
            Family::Mixtral => vec![window.is_some(); d.layers],
            Family::Qwen2 | Family::Qwen3Moe if c.bool_or("use_sliding_window", false)? => {
                let from = c.usize_or("max_window_layers", 28)?;
                (0..d.layers).map(|i| i >= from).collect()
            }
            _ => vec![false; d.layers],
        },
    };
    let default_theta = match f {
        Family::Mixtral => 1e6,
        _ => 10000.0,
    };
    let rope = rope_spec(
        c.v,
        "full_attention",
        d.head_dim,
        default_theta,
        d.max_position,
    )?;
    let layers = build_layers(&d, &sliding, window, &|_, _| Ok(Some(rope)), &ffn)?;
    let norm = NormSpec::plain(eps);
    let mut spec = d.base_spec(f, norm, layers);
    spec.norms.q = qk_norm;
    spec.norms.k = qk_norm;
    spec.attention.q_bias = qkv_bias;
    spec.attention.k_bias = qkv_bias;
    spec.attention.v_bias = qkv_bias;
    spec.attention.o_bias = o_bias;
    spec.activation = activation_for(c, "hidden_act", "silu")?;
    spec.moe = moe;
    spec.head.tied = c.bool_or("tie_word_embeddings", tied_default)?;
    Ok(spec)
}

/// Gemma 3 text: centered norms everywhere, sandwich norms, q/k norms,
/// embedding × sqrt(hidden), GELU-tanh, 5 local : 1 global layers with
/// separate rope thetas.
fn gemma3(c: &Cfg) -> Result<ArchSpec, SpecError> {
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
    let mut spec = d.base_spec(c.family, norm, layers);
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

/// Muse Glimmer text (HF `modeling_muse_glimmer.py`): normed embedding,
/// centered sandwich norms (post norms with their own eps), scale-less q/k
/// norms with q × `qk_scale_factor`, a sigmoid output gate, NoPE on layers
/// whose `layer_rope_theta` is 0 (HF uses the global theta on all others),
/// logits × `output_multiplier` then softcap.
fn muse_glimmer(c: &Cfg, top: &Value) -> Result<ArchSpec, SpecError> {
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
    let tied = top
        .get("tie_word_embeddings")
        .and_then(Value::as_bool)
        .unwrap_or(c.bool_or("tie_word_embeddings", false)?);
    let mut spec = d.base_spec(c.family, centered, layers);
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

/// gpt-oss: biased attention with sinks, YaRN rope, alternating sliding
/// layers, every layer MoE with a biased router (top-k on raw logits, softmax
/// over the k) and biased clamped-SwiGLU experts.
fn gpt_oss(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let d = dims(c, 131072)?;
    let d = Dims {
        head_dim: c.usize_or("head_dim", 64)?,
        ..d
    };
    let eps = c.f64_or("rms_norm_eps", 1e-5)? as f32;
    let sliding = match c.layer_types(d.layers)? {
        Some(t) => t,
        None => (0..d.layers).map(|i| i % 2 == 0).collect(),
    };
    let window = c.opt_usize("sliding_window")?.or(Some(128));
    let rope = rope_spec(c.v, "full_attention", d.head_dim, 150000.0, d.max_position)?;
    let layers = build_layers(
        &d,
        &sliding,
        window,
        &|_, _| Ok(Some(rope)),
        &vec![FfnKind::Moe; d.layers],
    )?;
    let bias = c.bool_or("attention_bias", true)?;
    let norm = NormSpec::plain(eps);
    let mut spec = d.base_spec(c.family, norm, layers);
    spec.intermediate_size = 0;
    spec.attention.set_biases(bias);
    spec.attention.sinks = true;
    spec.activation = Activation::ClampedSwiglu {
        alpha: c.f64_or("swiglu_alpha", 1.702)? as f32,
        limit: c.f64_or("swiglu_limit", 7.0)? as f32,
    };
    spec.moe = Some(MoeSpec {
        num_experts: c.usize_or("num_local_experts", 128)?,
        top_k: c.usize_or("num_experts_per_tok", 4)?,
        expert_intermediate: c.usize_or("intermediate_size", 2880)?,
        router: RouterKind::TopKSoftmax,
        router_bias: true,
        expert_biases: true,
        shared_intermediate: None,
        parallel_dense: false,
    });
    spec.head.tied = c.bool_or("tie_word_embeddings", false)?;
    Ok(spec)
}

/// Gemma 4 text (HF `modeling_gemma4.py`): plain norms everywhere, q/k
/// norms with weights and a weightless v norm, attention scale 1, embedding
/// × sqrt(hidden), 5 sliding : 1 full layers where full layers have their
/// own head geometry (`per_layer_config`, or `global_head_dim` /
/// `num_global_key_value_heads`), K = V on full layers with
/// `attention_k_eq_v`, proportional rope on full layers, a dense GELU-tanh
/// MLP beside the routed experts, a learned per-layer output scalar, and a
/// final softcap. Per-layer inputs (on by default: HF's
/// `hidden_size_per_layer_input` is 256 unless set) and KV sharing are
/// refused; `use_bidirectional_attention: "vision"` only changes the mask
/// around image tokens, so text runs causally under it.
fn gemma4(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let d = dims(c, 131072)?;
    let d = Dims {
        kv_heads: c.usize_or("num_key_value_heads", 4)?,
        head_dim: c.usize_or("head_dim", 256)?,
        intermediate: c.usize_or("intermediate_size", 9216)?,
        ..d
    };
    if c.usize_or("hidden_size_per_layer_input", 256)? > 0 {
        return Err(SpecError::Unsupported {
            what: "gemma4 per-layer inputs".into(),
            detail: "hidden_size_per_layer_input > 0, or absent (HF default 256): the dense Gemma 4 variants".into(),
        });
    }
    if c.usize_or("num_kv_shared_layers", 0)? > 0 {
        return Err(SpecError::Unsupported {
            what: "gemma4 KV sharing".into(),
            detail: "num_kv_shared_layers > 0".into(),
        });
    }
    match c.present("use_bidirectional_attention") {
        None => {}
        Some(v) if v.as_str() == Some("vision") => {}
        Some(_) => {
            return Err(c.bad(
                "use_bidirectional_attention",
                "null or \"vision\" (causal text model)",
            ))
        }
    }
    if c.bool_or("use_double_wide_mlp", false)? {
        return Err(c.bad("use_double_wide_mlp", "false"));
    }
    let eps = c.f64_or("rms_norm_eps", 1e-6)? as f32;
    let norm = NormSpec::plain(eps);
    let n = d.layers;
    let mut sliding = match c.layer_types(n)? {
        Some(t) => t,
        None => (0..n).map(|i| (i + 1) % 6 != 0).collect(),
    };
    // HF forces the last layer to full attention, whatever `layer_types` says.
    if let Some(last) = sliding.last_mut() {
        *last = false;
    }
    // HF's rope when `rope_parameters` is absent.
    let default_rope = serde_json::json!({
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0
            }
        }
    });
    let rope_cfg = if c.present("rope_parameters").is_some() {
        c.v
    } else {
        &default_rope
    };
    let k_eq_v = c.bool_or("attention_k_eq_v", false)?;
    // Full-layer geometry: `per_layer_config` as save_pretrained writes it,
    // else the released config's `global_head_dim` / `num_global_key_value_heads`.
    let overrides = c.present("per_layer_config");
    let global_head_dim = c.usize_or("global_head_dim", 512)?;
    let global_kv = c.opt_usize("num_global_key_value_heads")?;
    let geometry = |i: usize| -> Result<(usize, usize), SpecError> {
        if let Some(o) = overrides.and_then(|o| o.get(i.to_string())) {
            let get = |k: &str, dflt: usize| {
                o.get(k)
                    .map(|v| {
                        v.as_u64()
                            .map(|x| x as usize)
                            .ok_or_else(|| c.bad("per_layer_config", "integers"))
                    })
                    .unwrap_or(Ok(dflt))
            };
            return Ok((
                get("head_dim", d.head_dim)?,
                get("num_key_value_heads", d.kv_heads)?,
            ));
        }
        if overrides.is_some() || sliding[i] {
            return Ok((d.head_dim, d.kv_heads));
        }
        let kv = if k_eq_v {
            global_kv.unwrap_or(d.kv_heads)
        } else {
            d.kv_heads
        };
        Ok((global_head_dim, kv))
    };
    let window = Some(c.usize_or("sliding_window", 512)?);
    let enable_moe = c.bool_or("enable_moe_block", false)?;
    let mut layers = Vec::with_capacity(n);
    for (i, &is_sliding) in sliding.iter().enumerate() {
        let (head_dim, num_kv_heads) = geometry(i)?;
        let layer_type = if is_sliding {
            "sliding_attention"
        } else {
            "full_attention"
        };
        let default_theta = if is_sliding { 10000.0 } else { 1e6 };
        layers.push(LayerSpec {
            head_dim,
            num_kv_heads,
            window: if is_sliding { window } else { None },
            rope: Some(rope_spec(
                rope_cfg,
                layer_type,
                head_dim,
                default_theta,
                d.max_position,
            )?),
            ffn: if enable_moe {
                FfnKind::Moe
            } else {
                FfnKind::Dense
            },
            value_from_key: k_eq_v && !is_sliding,
        });
    }
    let moe = if enable_moe {
        Some(MoeSpec {
            num_experts: c.usize("num_experts")?,
            top_k: c.usize("top_k_experts")?,
            expert_intermediate: c.usize("moe_intermediate_size")?,
            router: RouterKind::Gemma4,
            router_bias: false,
            expert_biases: false,
            shared_intermediate: None,
            parallel_dense: true,
        })
    } else {
        None
    };
    let bias = c.bool_or("attention_bias", false)?;
    let mut spec = d.base_spec(c.family, norm, layers);
    spec.embedding.scale = (d.hidden as f32).sqrt();
    spec.norms.attn_post = Some(norm);
    spec.norms.ffn_post = Some(norm);
    spec.norms.q = Some(norm);
    spec.norms.k = Some(norm);
    spec.norms.v = Some(NormSpec::no_scale(eps));
    spec.norms.dense_branch_post = enable_moe.then_some(norm);
    spec.norms.moe_input = enable_moe.then_some(norm);
    spec.norms.moe_post = enable_moe.then_some(norm);
    spec.attention.set_biases(bias);
    spec.attention.scale = 1.0;
    spec.activation = activation_for(c, "hidden_activation", "gelu_pytorch_tanh")?;
    spec.moe = moe;
    spec.head.tied = c.bool_or("tie_word_embeddings", true)?;
    spec.head.softcap = c.opt_f64("final_logit_softcapping")?.map(|v| v as f32);
    spec.layer_scalar = true;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A small Gemma 4 MoE text config as `save_pretrained` writes it.
    fn gemma4_config() -> Value {
        json!({
            "model_type": "gemma4_text",
            "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 6,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "intermediate_size": 64, "hidden_size_per_layer_input": 0,
            "attention_k_eq_v": true, "enable_moe_block": true,
            "num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": 16,
            "sliding_window": 7, "final_logit_softcapping": 30.0,
            "per_layer_config": {"5": {"head_dim": 32, "num_key_value_heads": 1}},
            "rope_parameters": {
                "full_attention": {
                    "partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                    "rope_type": "proportional"
                },
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
            }
        })
    }

    fn with(mut cfg: Value, key: &str, v: Value) -> Value {
        cfg[key] = v;
        cfg
    }

    #[test]
    fn gemma4_full_layers_have_their_own_geometry_and_proportional_rope() {
        let s = spec_from_hf_config(&gemma4_config()).unwrap();
        let (sl, full) = (&s.layers[0], &s.layers[5]);
        assert_eq!((sl.head_dim, sl.num_kv_heads, sl.window), (16, 2, Some(7)));
        assert_eq!(
            (full.head_dim, full.num_kv_heads, full.window),
            (32, 1, None)
        );
        assert!(full.value_from_key && !sl.value_from_key);
        let rope = full.rope.unwrap();
        assert_eq!(rope.rotary_dim, 32);
        assert_eq!(
            rope.scaling,
            RopeScaling::Proportional {
                factor: 1.0,
                rotated_pairs: 4
            }
        );
        assert_eq!(s.moe.unwrap().router, RouterKind::Gemma4);
        assert!(s.layer_scalar && s.moe.unwrap().parallel_dense);
    }

    #[test]
    fn gemma4_defaults_follow_the_hf_config_class() {
        // Without `rope_parameters`: default rope on sliding layers,
        // proportional (a quarter of the pairs, theta 1e6) on full ones.
        let mut cfg = gemma4_config();
        cfg.as_object_mut().unwrap().remove("rope_parameters");
        let s = spec_from_hf_config(&cfg).unwrap();
        let full = s.layers[5].rope.unwrap();
        assert_eq!(full.theta, 1e6);
        assert_eq!(
            full.scaling,
            RopeScaling::Proportional {
                factor: 1.0,
                rotated_pairs: 4
            }
        );
        let sliding = s.layers[0].rope.unwrap();
        assert_eq!((sliding.theta, sliding.scaling), (1e4, RopeScaling::None));

        // The last layer is always full attention.
        let types = Value::from(vec!["sliding_attention"; 6]);
        let s = spec_from_hf_config(&with(gemma4_config(), "layer_types", types)).unwrap();
        assert_eq!(s.layers[5].window, None);
        assert_eq!(s.layers[4].window, Some(7));

        // Per-layer inputs are on unless the config turns them off.
        let mut cfg = gemma4_config();
        cfg.as_object_mut()
            .unwrap()
            .remove("hidden_size_per_layer_input");
        assert!(matches!(
            spec_from_hf_config(&cfg),
            Err(SpecError::Unsupported { .. })
        ));
    }

    #[test]
    fn gemma4_vision_bidirectional_attention_is_causal_for_text() {
        let vision = with(
            gemma4_config(),
            "use_bidirectional_attention",
            json!("vision"),
        );
        assert!(spec_from_hf_config(&vision).is_ok());
        let all = with(gemma4_config(), "use_bidirectional_attention", json!("all"));
        assert!(matches!(
            spec_from_hf_config(&all),
            Err(SpecError::BadField { .. })
        ));
    }
}
