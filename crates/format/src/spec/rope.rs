//! Rotary-embedding parameters from an HF `rope_parameters` dictionary
//! (transformers 5.x; the older top-level `rope_theta` / `rope_scaling` keys
//! are accepted too). Reference: `modeling_rope_utils.py` of 5.24.0.

use super::SpecError;
use serde_json::Value;
use turbospark_core::arch::{RopeKind, RopeScaling, RopeSpec};

/// The rope dictionary in effect for a layer type (`full_attention`,
/// `sliding_attention`), given the whole config object.
pub(crate) fn rope_dict<'a>(cfg: &'a Value, layer_type: &str) -> Option<&'a Value> {
    let params = cfg.get("rope_parameters").filter(|v| v.is_object());
    match params {
        Some(p) if p.get(layer_type).is_some_and(Value::is_object) => p.get(layer_type),
        Some(p) if p.get("rope_theta").is_some() || p.get("rope_type").is_some() => Some(p),
        _ => cfg.get("rope_scaling").filter(|v| v.is_object()),
    }
}

fn num(d: Option<&Value>, key: &str) -> Option<f64> {
    d.and_then(|d| d.get(key)).and_then(Value::as_f64)
}

fn bad(field: &str, found: &Value, expected: &str) -> SpecError {
    SpecError::BadField {
        field: field.to_string(),
        found: found.to_string(),
        expected: expected.to_string(),
        source_kind: "config.json",
    }
}

/// Builds the rope of a layer of type `layer_type` whose heads are
/// `head_dim` wide. `default_theta` applies when neither the dictionary nor
/// the top level names a theta.
pub(crate) fn rope_spec(
    cfg: &Value,
    layer_type: &str,
    head_dim: usize,
    default_theta: f64,
    max_position: usize,
) -> Result<RopeSpec, SpecError> {
    let d = rope_dict(cfg, layer_type);
    let theta = num(d, "rope_theta")
        .or_else(|| cfg.get("rope_theta").and_then(Value::as_f64))
        .unwrap_or(default_theta);
    let partial = num(d, "partial_rotary_factor")
        .or_else(|| cfg.get("partial_rotary_factor").and_then(Value::as_f64))
        .unwrap_or(1.0);
    let rope_type = d
        .and_then(|d| d.get("rope_type").or_else(|| d.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = num(d, "factor");
    let rotary_dim = (head_dim as f64 * partial) as usize;
    let require_factor = || {
        factor.ok_or_else(|| SpecError::MissingField {
            field: "rope_parameters.factor".into(),
            family: format!("rope type {rope_type}"),
            source_kind: "config.json",
        })
    };
    let (rotary_dim, scaling) = match rope_type {
        "default" => (rotary_dim, RopeScaling::None),
        "linear" => (
            rotary_dim,
            RopeScaling::Linear {
                factor: require_factor()? as f32,
            },
        ),
        "yarn" => {
            let original = num(d, "original_max_position_embeddings").ok_or_else(|| {
                SpecError::MissingField {
                    field: "rope_parameters.original_max_position_embeddings".into(),
                    family: "yarn rope".into(),
                    source_kind: "config.json",
                }
            })?;
            let factor = factor.unwrap_or(max_position as f64 / original);
            let get_mscale = |scale: f64, m: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let attention_factor = match (
                num(d, "attention_factor"),
                num(d, "mscale"),
                num(d, "mscale_all_dim"),
            ) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => {
                    get_mscale(factor, m) / get_mscale(factor, ma)
                }
                _ => get_mscale(factor, 1.0),
            };
            let beta = |k: &str, dflt: f64| num(d, k).filter(|v| *v != 0.0).unwrap_or(dflt);
            // HF reads `truncate` from the top of rope_parameters.
            let truncate = cfg
                .get("rope_parameters")
                .and_then(|p| p.get("truncate"))
                .or_else(|| d.and_then(|d| d.get("truncate")))
                .and_then(Value::as_bool)
                .unwrap_or(true);
            (
                rotary_dim,
                RopeScaling::Yarn {
                    factor: factor as f32,
                    original_max_position: original as usize,
                    beta_fast: beta("beta_fast", 32.0) as f32,
                    beta_slow: beta("beta_slow", 1.0) as f32,
                    attention_factor: attention_factor as f32,
                    truncate,
                },
            )
        }
        "llama3" => {
            let g = |k: &str| {
                num(d, k).ok_or_else(|| SpecError::MissingField {
                    field: format!("rope_parameters.{k}"),
                    family: "llama3 rope".into(),
                    source_kind: "config.json",
                })
            };
            (
                rotary_dim,
                RopeScaling::Llama3 {
                    factor: require_factor()? as f32,
                    low_freq_factor: g("low_freq_factor")? as f32,
                    high_freq_factor: g("high_freq_factor")? as f32,
                    original_max_position: g("original_max_position_embeddings")? as usize,
                },
            )
        }
        // Gemma 4: the whole head pairs up, but only the first
        // `partial * head_dim / 2` pairs rotate; frequencies use head_dim.
        "proportional" => (
            head_dim,
            RopeScaling::Proportional {
                factor: factor.unwrap_or(1.0) as f32,
                rotated_pairs: (partial * head_dim as f64 / 2.0) as usize,
            },
        ),
        other => {
            return Err(bad(
                "rope_parameters.rope_type",
                &Value::String(other.to_string()),
                "default, linear, yarn, llama3 or proportional",
            ))
        }
    };
    Ok(RopeSpec {
        kind: RopeKind::Neox,
        theta: theta as f32,
        rotary_dim,
        scaling,
    })
}
