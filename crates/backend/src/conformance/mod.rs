//! The backend conformance suite: generic checks of every op of a
//! [`Device`] and its [`Stream`](crate::Stream) against plain f64
//! references written here ([`reference`]), on seeded random inputs of
//! awkward sizes (odd row counts, batches that are not a multiple of 4,
//! rings that wrap).
//!
//! A backend proves itself by calling [`check_all`] (or the single checks)
//! in a test, once per [`Numerics`] it supports, with
//! [`Tolerances::for_numerics`]: [`Numerics::Exact`] is held to f32
//! rounding; [`Numerics::LlamaCpp`] and [`Numerics::Fast`] to what 8-bit
//! activations and an f16 KV cache cost. Beyond the tolerances, every
//! backend must compute a row the same way whatever the batch (MoE rows
//! are compared bit for bit between a batch and a lone token, and between
//! one `moe` call and a `moe_experts` split).
//!
//! Checks return a [`ConformanceError`] naming the op, the case and the
//! first element out of tolerance.

mod attention;
pub mod data;
mod delta_net;
mod elementwise;
mod linear;
mod moe;
mod moe_k_quants;
pub mod reference;

use crate::{BackendError, DType, Device, Limits, Numerics, Stream};

pub use attention::{
    check_attention, check_attention_parts, check_attention_then_product, check_decode_attention,
    check_kv_write, check_long_decode_attention, check_long_prefill_attention,
    check_projections_then_rope, check_rope_then_decode_attention,
};
pub use delta_net::{
    check_causal_conv1d, check_delta_net, check_gated_delta_rule, check_gated_delta_rule_chunks,
    check_mul_sigmoid_rows,
};
pub use elementwise::{
    check_add, check_add_bias, check_adjust_projection, check_glu, check_mul_sigmoid,
    check_rms_norm, check_rope, check_scale, check_softcap,
};
pub use linear::{check_buffers, check_embed, check_head_matmul, check_matmul};
pub use moe::{
    check_moe, check_moe_intermediate, check_pinned_slot_fills, check_route,
    check_router_then_experts,
};
pub use moe_k_quants::check_moe_k_quants;

/// How far a backend's results may be from the f64 reference, per op
/// family, and whether a row's bits may depend on its batch. Each tolerance
/// is relative: to `Σ|terms|` for dot products, to `1 + |want|` for the
/// rest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerances {
    /// A row computes to the same bits whatever else shares its batch
    /// (llama.cpp picks float kernels by batch size, so its numerics do
    /// not promise it).
    pub batch_invariant: bool,
    pub matmul: f64,
    /// add, scale, bias, norms, rope, soft-cap, sigmoid gate, projection
    /// adjustment.
    pub elementwise: f64,
    /// The activations of `glu`.
    pub activation: f64,
    /// Values read back from the KV cache.
    pub kv: f64,
    pub attention: f64,
    pub moe: f64,
    /// Route weights (the chosen experts must match exactly).
    pub route: f64,
}

impl Tolerances {
    /// The tolerances a backend computing in `numerics` must meet.
    pub const fn for_numerics(numerics: Numerics) -> Tolerances {
        match numerics {
            Numerics::Exact => Tolerances {
                batch_invariant: true,
                matmul: 2e-5,
                elementwise: 2e-6,
                activation: 2e-6,
                kv: 0.0,
                attention: 2e-6,
                moe: 1e-4,
                route: 1e-6,
            },
            // 8-bit activations (|error| ≤ half a step of max|x|/127 per
            // block), an f16 cache and f16 attention operands, GELU from an
            // f16 table.
            Numerics::LlamaCpp | Numerics::Fast => Tolerances {
                batch_invariant: matches!(numerics, Numerics::Fast),
                matmul: 1e-2,
                elementwise: 2e-5,
                activation: 2e-3,
                kv: 1e-3,
                attention: 1e-2,
                moe: 3e-2,
                route: 1e-6,
            },
        }
    }
}

/// A failed check.
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    #[error("{op} ({case}): {source}")]
    Backend {
        op: &'static str,
        case: String,
        #[source]
        source: BackendError,
    },
    #[error(
        "{op} ({case}): element {index} is {got}, the reference {want} (allowed error {allowed:e})"
    )]
    Mismatch {
        op: &'static str,
        case: String,
        index: usize,
        got: f64,
        want: f64,
        allowed: f64,
    },
    #[error("{op} ({case}): {detail}")]
    Property {
        op: &'static str,
        case: String,
        detail: String,
    },
}

/// Runs every check of the suite on `device` but the optional gated
/// DeltaNet ops ([`check_delta_net`]), which a backend that runs the
/// linear-attention families must pass too.
pub fn check_all<D: Device>(device: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    check_buffers(device)?;
    check_embed(device)?;
    check_matmul(device, tol)?;
    check_head_matmul(device, tol)?;
    check_add_bias(device, tol)?;
    check_rms_norm(device, tol)?;
    check_rope(device, tol)?;
    check_kv_write(device, tol)?;
    check_attention(device, tol)?;
    check_decode_attention(device, tol)?;
    check_rope_then_decode_attention(device, tol)?;
    check_projections_then_rope(device, tol)?;
    check_attention_parts(device, tol)?;
    check_attention_then_product(device)?;
    check_glu(device, tol)?;
    check_add(device, tol)?;
    check_scale(device, tol)?;
    check_adjust_projection(device, tol)?;
    check_mul_sigmoid(device, tol)?;
    check_softcap(device, tol)?;
    check_route(device, tol)?;
    check_moe(device, tol)?;
    check_moe_k_quants(device, tol)?;
    check_moe_intermediate(device, tol)?;
    check_pinned_slot_fills(device)?;
    check_router_then_experts(device)?;
    Ok(())
}

/// Attaches an op and case to backend errors.
trait Context<T> {
    fn at(self, op: &'static str, case: &str) -> Result<T, ConformanceError>;
}

impl<T> Context<T> for Result<T, BackendError> {
    fn at(self, op: &'static str, case: &str) -> Result<T, ConformanceError> {
        self.map_err(|source| ConformanceError::Backend {
            op,
            case: case.to_string(),
            source,
        })
    }
}

/// A device and one stream on it, with shortcuts for f32 data.
struct Harness<'d, D: Device> {
    dev: &'d D,
    st: D::Stream,
}

impl<'d, D: Device> Harness<'d, D> {
    /// A stream over what `dev` holds now (upload weights first).
    fn new(dev: &'d D, limits: Limits) -> Result<Self, ConformanceError> {
        let st = dev.stream(&limits).at("stream", "create")?;
        Ok(Harness { dev, st })
    }

    fn zeros(&mut self, len: usize) -> Result<D::Buf, ConformanceError> {
        self.dev.alloc(DType::F32, len).at("alloc", "f32")
    }

    fn buf(&mut self, v: &[f32]) -> Result<D::Buf, ConformanceError> {
        let mut b = self.zeros(v.len())?;
        self.st.write(&mut b, v).at("write", "f32")?;
        Ok(b)
    }

    fn get(&mut self, b: &D::Buf, len: usize) -> Result<Vec<f32>, ConformanceError> {
        let mut out = vec![0f32; len];
        self.st.read(b, &mut out).at("read", "f32")?;
        Ok(out)
    }
}

/// Checks `got[i]` against `want[i]` within `tol · scale(i)` (plus the
/// smallest normal f32, for exact zeros).
fn compare(
    op: &'static str,
    case: &str,
    got: &[f32],
    want: &[f64],
    tol: f64,
    scale: impl Fn(usize) -> f64,
) -> Result<(), ConformanceError> {
    if got.len() != want.len() {
        return Err(ConformanceError::Property {
            op,
            case: case.to_string(),
            detail: format!("{} results for {} references", got.len(), want.len()),
        });
    }
    for (index, (&g, &w)) in got.iter().zip(want).enumerate() {
        let allowed = tol * scale(index) + f64::from(f32::MIN_POSITIVE);
        let g = f64::from(g);
        // A NaN result fails too.
        let within = (g - w).abs() <= allowed;
        if !within {
            return Err(ConformanceError::Mismatch {
                op,
                case: case.to_string(),
                index,
                got: g,
                want: w,
                allowed,
            });
        }
    }
    Ok(())
}

/// `compare` relative to `1 + |want|`.
fn compare_rel(
    op: &'static str,
    case: &str,
    got: &[f32],
    want: &[f64],
    tol: f64,
) -> Result<(), ConformanceError> {
    compare(op, case, got, want, tol, |i| 1.0 + want[i].abs())
}

fn property(op: &'static str, case: &str, detail: String) -> ConformanceError {
    ConformanceError::Property {
        op,
        case: case.to_string(),
        detail,
    }
}
