//! `ArchSpec` from an HF `config.json` (transformers 5.24.0 field names and
//! defaults; `save_pretrained` omits fields equal to the class default, so
//! every default below mirrors `configuration_<type>.py`): the typed
//! config access, the builders families share (`llama_like`,
//! `Dims::base_spec`) and the dispatch to each family's own reader in
//! [`crate::families`].

pub(crate) use super::rope::rope_spec;
use super::SpecError;
use crate::families::{self, supported_hf_model_types, FamilyDef};
use serde_json::Value;
use turbospark_core::arch::*;

/// Typed access to a config object with errors naming the field.
pub(crate) struct Cfg<'a> {
    /// The text model's config (`text_config` of a multimodal wrapper).
    pub v: &'a Value,
    /// The whole `config.json`.
    pub top: &'a Value,
    /// The family whose reader reads it.
    pub def: &'static FamilyDef,
}

impl<'a> Cfg<'a> {
    pub(crate) fn missing(&self, field: &str) -> SpecError {
        SpecError::MissingField {
            field: field.to_string(),
            family: self.def.name.to_string(),
            source_kind: "config.json",
        }
    }
    pub(crate) fn bad(&self, field: &str, expected: &str) -> SpecError {
        SpecError::BadField {
            field: field.to_string(),
            found: self.v.get(field).map(|v| v.to_string()).unwrap_or_default(),
            expected: expected.to_string(),
            source_kind: "config.json",
        }
    }
    pub(crate) fn present(&self, field: &str) -> Option<&'a Value> {
        self.v.get(field).filter(|v| !v.is_null())
    }
    pub(crate) fn usize(&self, field: &str) -> Result<usize, SpecError> {
        match self.present(field) {
            None => Err(self.missing(field)),
            Some(v) => v
                .as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| self.bad(field, "a non-negative integer")),
        }
    }
    pub(crate) fn usize_or(&self, field: &str, default: usize) -> Result<usize, SpecError> {
        match self.present(field) {
            None => Ok(default),
            Some(_) => self.usize(field),
        }
    }
    pub(crate) fn opt_usize(&self, field: &str) -> Result<Option<usize>, SpecError> {
        match self.present(field) {
            None => Ok(None),
            Some(_) => self.usize(field).map(Some),
        }
    }
    pub(crate) fn f64_or(&self, field: &str, default: f64) -> Result<f64, SpecError> {
        match self.present(field) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.bad(field, "a number")),
        }
    }
    pub(crate) fn opt_f64(&self, field: &str) -> Result<Option<f64>, SpecError> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(field, "a number")),
        }
    }
    pub(crate) fn bool_or(&self, field: &str, default: bool) -> Result<bool, SpecError> {
        match self.present(field) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.bad(field, "true or false")),
        }
    }
    pub(crate) fn str_or(&self, field: &str, default: &'a str) -> Result<&'a str, SpecError> {
        match self.present(field) {
            None => Ok(default),
            Some(v) => v.as_str().ok_or_else(|| self.bad(field, "a string")),
        }
    }
    pub(crate) fn usize_list(&self, field: &str) -> Result<Option<Vec<usize>>, SpecError> {
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
    pub(crate) fn layer_types(&self, n_layers: usize) -> Result<Option<Vec<bool>>, SpecError> {
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
    let def = families::for_hf(model_type).ok_or_else(|| SpecError::UnknownArchitecture {
        found: model_type.to_string(),
        source_kind: "HF config.json model_type",
        supported: supported_hf_model_types(),
    })?;
    let c = Cfg {
        v: cfg_v,
        top: config,
        def,
    };
    let spec = (def.from_hf)(&c)?;
    spec.validate().map_err(SpecError::Inconsistent)?;
    Ok(spec)
}

/// Dimensions every family names the same way.
pub(crate) struct Dims {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub max_position: usize,
}

impl Dims {
    /// The fields every family fills the same way, with the defaults of a
    /// pre-norm decoder: `norm` on attention input, FFN input and output,
    /// no q/k/v norms, no biases, `head_dim^-0.5` attention scale, SwiGLU,
    /// dense FFN, untied head without multiplier or softcap. Each builder
    /// then overrides what its family does differently.
    pub(crate) fn base_spec(
        &self,
        family: Family,
        norm: NormSpec,
        layers: Vec<LayerSpec>,
    ) -> ArchSpec {
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
                gate_in_q: false,
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
            mla: None,
            delta_net: None,
            layers,
        }
    }
}

pub(crate) fn dims(c: &Cfg, default_max_position: usize) -> Result<Dims, SpecError> {
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

pub(crate) fn activation_for(c: &Cfg, field: &str, default: &str) -> Result<Activation, SpecError> {
    match c.str_or(field, default)? {
        "silu" | "swish" => Ok(Activation::Swiglu),
        "gelu_pytorch_tanh" | "gelu_tanh" => Ok(Activation::GeluTanh),
        _ => Err(c.bad(field, "silu or gelu_pytorch_tanh")),
    }
}

pub(crate) fn no_moe_layers(d: &Dims) -> Vec<FfnKind> {
    vec![FfnKind::Dense; d.layers]
}

pub(crate) fn build_layers(
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
                mixer: Mixer::Attention,
            })
        })
        .collect()
}

/// How a llama-like family differs from llama, as data: the axes on which
/// llama, qwen2, mixtral, qwen3_moe and glm4_moe disagree. MoE families add
/// their [`MoeSpec`] and FFN layout on the spec [`llama_like`] returns.
pub(crate) struct LlamaLike {
    /// `rms_norm_eps` when the config omits it.
    pub default_eps: f64,
    pub biases: Biases,
    pub qk_norm: QkNorm,
    /// `tie_word_embeddings` when the config omits it.
    pub tied_default: bool,
    /// Rope theta when the config omits it.
    pub default_theta: f64,
    /// Which layers slide when the config has no `layer_types`.
    pub sliding: Sliding,
}

/// Which projections carry biases.
pub(crate) enum Biases {
    /// q, k, v and o, as `attention_bias` says.
    AttentionBias,
    /// q, k and v as `attention_bias` says; never o.
    QkvByAttentionBias,
    /// q, k and v always; never o (qwen2).
    QkvAlways,
}

/// Per-head q/k RMS norms (plain, the model's eps).
pub(crate) enum QkNorm {
    None,
    Always,
    /// When `use_qk_norm` is true.
    ByConfig,
}

/// Sliding-window layers when `layer_types` is absent.
pub(crate) enum Sliding {
    None,
    /// Every layer when `sliding_window` is set (Mixtral).
    AllWhenWindowSet,
    /// Layers from `max_window_layers` on, when `use_sliding_window` is
    /// true (Qwen).
    QwenMaxWindowLayers,
}

/// A pre-norm RMS decoder with plain norms, GQA, neox rope and SwiGLU,
/// every layer dense.
pub(crate) fn llama_like(c: &Cfg, p: &LlamaLike) -> Result<ArchSpec, SpecError> {
    let d = dims(c, 32768)?;
    let eps = c.f64_or("rms_norm_eps", p.default_eps)? as f32;
    let attention_bias = c.bool_or("attention_bias", false)?;
    let (qkv_bias, o_bias) = match p.biases {
        Biases::AttentionBias => (attention_bias, attention_bias),
        Biases::QkvByAttentionBias => (attention_bias, false),
        Biases::QkvAlways => (true, false),
    };
    let qk_norm = match p.qk_norm {
        QkNorm::Always => Some(NormSpec::plain(eps)),
        QkNorm::ByConfig if c.bool_or("use_qk_norm", false)? => Some(NormSpec::plain(eps)),
        _ => None,
    };
    // Sliding windows: explicit `layer_types` win.
    let window = c.opt_usize("sliding_window")?;
    let sliding: Vec<bool> = match c.layer_types(d.layers)? {
        Some(t) => t,
        None => match p.sliding {
            Sliding::AllWhenWindowSet => vec![window.is_some(); d.layers],
            Sliding::QwenMaxWindowLayers if c.bool_or("use_sliding_window", false)? => {
                let from = c.usize_or("max_window_layers", 28)?;
                (0..d.layers).map(|i| i >= from).collect()
            }
            _ => vec![false; d.layers],
        },
    };
    let rope = rope_spec(
        c.v,
        "full_attention",
        d.head_dim,
        p.default_theta,
        d.max_position,
    )?;
    let layers = build_layers(
        &d,
        &sliding,
        window,
        &|_, _| Ok(Some(rope)),
        &no_moe_layers(&d),
    )?;
    let norm = NormSpec::plain(eps);
    let mut spec = d.base_spec(c.def.family(), norm, layers);
    spec.norms.q = qk_norm;
    spec.norms.k = qk_norm;
    spec.attention.q_bias = qkv_bias;
    spec.attention.k_bias = qkv_bias;
    spec.attention.v_bias = qkv_bias;
    spec.attention.o_bias = o_bias;
    spec.activation = activation_for(c, "hidden_act", "silu")?;
    spec.head.tied = c.bool_or("tie_word_embeddings", p.tied_default)?;
    Ok(spec)
}

/// Sets each layer's FFN kind: MoE where `moe(layer)` holds.
pub(crate) fn set_moe_layers(spec: &mut ArchSpec, moe: impl Fn(usize) -> bool) {
    for (i, l) in spec.layers.iter_mut().enumerate() {
        l.ffn = if moe(i) { FfnKind::Moe } else { FfnKind::Dense };
    }
}

/// HF config-class defaults of a DeepSeek-style MoE block (see
/// [`set_deepseek_moe`]); each family's own config class sets them.
pub(crate) struct DeepseekMoeDefaults {
    pub moe_intermediate: usize,
    pub routed_experts: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub scaling: f64,
    pub first_dense: usize,
}

/// The MoE block of the DeepSeek-V3 lineage (DeepSeek-V3, GLM-4.5):
/// `n_routed_experts` experts chosen by the sigmoid router with
/// group-limited top-k (`n_group`, `topk_group`, `norm_topk_prob`,
/// `routed_scaling_factor`), `n_shared_experts` shared experts of
/// `moe_intermediate_size` each, and dense FFNs in the first
/// `first_k_dense_replace` layers; absent keys take `d`.
pub(crate) fn set_deepseek_moe(
    c: &Cfg,
    spec: &mut ArchSpec,
    d: DeepseekMoeDefaults,
) -> Result<(), SpecError> {
    let moe_inter = c.usize_or("moe_intermediate_size", d.moe_intermediate)?;
    let shared = c.usize_or("n_shared_experts", 1)?;
    spec.moe = Some(MoeSpec {
        num_experts: c.usize_or("n_routed_experts", d.routed_experts)?,
        top_k: c.usize_or("num_experts_per_tok", 8)?,
        expert_intermediate: moe_inter,
        router: RouterKind::SigmoidGrouped {
            n_group: c.usize_or("n_group", d.n_group)?,
            topk_group: c.usize_or("topk_group", d.topk_group)?,
            renormalize: c.bool_or("norm_topk_prob", true)?,
            scaling: c.f64_or("routed_scaling_factor", d.scaling)? as f32,
        },
        router_bias: false,
        expert_biases: false,
        shared_intermediate: (shared > 0).then_some(moe_inter * shared),
        parallel_dense: false,
        shared_gate: false,
    });
    let first_dense = c.usize_or("first_k_dense_replace", d.first_dense)?;
    set_moe_layers(spec, |i| i >= first_dense);
    Ok(())
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
