//! Routed experts over a batch (HF `MixtralExperts`, `GptOssExperts`,
//! `Glm4MoeExperts` forward):
//!
//! ```text
//! for each expert slot e of the bank used by some route:
//!     X   = the rows x[t] of the routes (t, r) that chose e, gathered
//!     Y   = down(act(gate·X + bg) ⊙ (up·X + bu)) + bd
//!     y[t, r] = Y row of (t, r)
//! out[t] = Σ_r w[t, r] · y[t, r]      (r = 0, 1, … — router rank order)
//! ```
//!
//! Batching per expert reads each expert's weights once per call; the final
//! sum runs in rank order, so a token's output depends only on its route,
//! not on which other tokens share the batch.

use crate::stream::{add_bias_slice, CpuStream};
use crate::types::{CpuBuf, CpuRoutes};
use crate::{check_len, shape_err, CpuDevice};
use turbospark_backend::{routes_for, BackendError, MoeInput, MoeScratch, Route};

/// The first `n · k` routes of a batch, checked against the bank.
fn batch_routes(routes: &CpuRoutes, n: usize, slots: usize) -> Result<&[Route], BackendError> {
    let k = routes_for("moe", routes, n)?;
    let routes = &routes.routes[..n * k];
    if let Some(r) = routes.iter().find(|r| r.slot as usize >= slots) {
        return Err(BackendError::BadRoute {
            slot: r.slot as usize,
            available: slots,
        });
    }
    Ok(routes)
}

/// `y[i] = E_slot(x[t])` for every route `i = t·k + r` (whose slot `only`
/// marks, when given): each used expert once, over its gathered rows.
pub(crate) fn moe_experts(
    st: &mut CpuStream,
    input: MoeInput<'_, CpuDevice>,
    scratch: &mut MoeScratch<CpuBuf>,
    only: Option<&[bool]>,
) -> Result<(), BackendError> {
    run_experts(st, input, scratch, only, None)
}

/// `out[i] = act(gate·x[t] + bg) ⊙ (up·x[t] + bu)` of every route `i =
/// t·k + r` (`[n · k, intermediate]`): [`moe_experts`] stopped before the
/// down projection.
pub(crate) fn moe_intermediate(
    st: &mut CpuStream,
    input: MoeInput<'_, CpuDevice>,
    scratch: &mut MoeScratch<CpuBuf>,
    out: &mut CpuBuf,
) -> Result<(), BackendError> {
    let out = out.f32s_mut("moe_intermediate", "out")?;
    run_experts(st, input, scratch, None, Some(out))
}

/// [`moe_experts`], or with `inter` given, [`moe_intermediate`].
fn run_experts(
    st: &mut CpuStream,
    input: MoeInput<'_, CpuDevice>,
    scratch: &mut MoeScratch<CpuBuf>,
    only: Option<&[bool]>,
    mut inter_out: Option<&mut [f32]>,
) -> Result<(), BackendError> {
    let MoeInput {
        x,
        n_tokens: n,
        routes,
        bank,
        activation,
    } = input;
    if n == 0 {
        return Ok(());
    }
    let experts = &bank.experts;
    let (hidden, inter) = (bank.hidden, bank.intermediate);
    let k = routes.top_k;
    let routes = batch_routes(routes, n, experts.len())?;
    let x = x.f32s("moe", "x")?;
    check_len("moe", "x", x.len(), n * hidden)?;
    if let Some(only) = only {
        check_len("moe", "only", only.len(), experts.len())?;
    }
    let MoeScratch {
        x: sx,
        gate: sg,
        up: su,
        y,
    } = scratch;
    let sx = sx.f32s_mut("moe", "scratch.x")?;
    let sg = sg.f32s_mut("moe", "scratch.gate")?;
    let su = su.f32s_mut("moe", "scratch.up")?;
    let y = y.f32s_mut("moe", "scratch.y")?;
    check_len("moe", "scratch.y", y.len(), n * k * hidden)?;
    if let Some(o) = &inter_out {
        check_len("moe_intermediate", "out", o.len(), n * k * inter)?;
    }
    for (slot, e) in experts.iter().enumerate() {
        if only.is_some_and(|o| !o[slot]) {
            continue;
        }
        let m = routes.iter().filter(|r| r.slot as usize == slot).count();
        if m == 0 {
            continue;
        }
        check_len("moe", "scratch.x", sx.len(), m * hidden)?;
        check_len("moe", "scratch.gate", sg.len(), m * inter)?;
        check_len("moe", "scratch.up", su.len(), m * inter)?;
        let chosen = routes
            .iter()
            .enumerate()
            .filter(|(_, r)| r.slot as usize == slot)
            .map(|(i, _)| i);
        for (j, i) in chosen.clone().enumerate() {
            let t = i / k;
            sx[j * hidden..(j + 1) * hidden].copy_from_slice(&x[t * hidden..(t + 1) * hidden]);
        }
        st.matmul_slices(&e.gate, sx, m, sg)?;
        st.matmul_slices(&e.up, sx, m, su)?;
        if let Some(b) = &e.gate_bias {
            add_bias_slice(sg, b, m)?;
        }
        if let Some(b) = &e.up_bias {
            add_bias_slice(su, b, m)?;
        }
        st.glu_slices(sg, su, m * inter, activation)?;
        if let Some(o) = inter_out.as_deref_mut() {
            for (j, i) in chosen.enumerate() {
                o[i * inter..(i + 1) * inter].copy_from_slice(&sg[j * inter..(j + 1) * inter]);
            }
            continue;
        }
        st.matmul_slices(&e.down, sg, m, sx)?;
        if let Some(b) = &e.down_bias {
            add_bias_slice(sx, b, m)?;
        }
        for (j, i) in chosen.enumerate() {
            y[i * hidden..(i + 1) * hidden].copy_from_slice(&sx[j * hidden..(j + 1) * hidden]);
        }
    }
    Ok(())
}

/// `out[t] = Σ_r w[t, r] · y[t·k + r]`, in rank order, for rows of
/// `hidden`.
pub(crate) fn moe_combine(
    n: usize,
    hidden: usize,
    routes: &CpuRoutes,
    scratch: &MoeScratch<CpuBuf>,
    out: &mut CpuBuf,
) -> Result<(), BackendError> {
    if n == 0 || hidden == 0 {
        return Ok(());
    }
    let k = routes_for("moe", routes, n)?;
    if k == 0 {
        return Err(shape_err("moe", format!("no routes for {n} tokens")));
    }
    let routes = &routes.routes[..n * k];
    let y = scratch.y.f32s("moe", "scratch.y")?;
    let out = out.f32s_mut("moe", "out")?;
    check_len("moe", "out", out.len(), n * hidden)?;
    check_len("moe", "scratch.y", y.len(), n * k * hidden)?;
    let out = &mut out[..n * hidden];
    out.fill(0.0);
    for (t, row) in out.chunks_exact_mut(hidden).enumerate() {
        for r in 0..k {
            let i = t * k + r;
            let w = routes[i].weight;
            for (o, &v) in row.iter_mut().zip(&y[i * hidden..(i + 1) * hidden]) {
                *o += w * v;
            }
        }
    }
    Ok(())
}
